"""A runner no action can tamper with: a shell binary the sandbox user may run but not read.

Linux makes a process non-dumpable when it executes a file its user cannot read, and a
non-dumpable process cannot be ``ptrace``d, nor its ``/proc/PID/mem``, ``environ`` or ``fd``
opened, by processes of the same uid without ``CAP_SYS_PTRACE``, which sandboxed actions never
have. A warm pool's containers get a root-owned, mode-0711 copy of a static busybox bind-mounted
read-only at ``MOUNT`` and run their runner from it (``busybox sh``); the actions the runner
starts exec the image's ``/bin/sh`` and are ordinary processes. A reset can then keep the runner
(it only has to be alive and answering) instead of starting a new one through the engine.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import tempfile
from pathlib import Path

#: Where the shell is mounted in a container, and where the host keeps its copy.
MOUNT = "/.tangram/busybox"
HOST_COPY = Path("/run/tangram/runner-busybox")
#: Static busybox binaries on the host (``busybox-static``, installed by ensure-docker.sh).
SOURCES = (Path("/bin/busybox"), Path("/usr/bin/busybox"))


def _static(path: Path) -> bool:
    """An ELF executable without a program interpreter (a dynamic one would need the
    container's libraries)."""
    try:
        data = path.read_bytes()[: 1 << 16]
    except OSError:
        return False
    return data[:4] == b"\x7fELF" and b"/lib64/ld-linux" not in data and b"/lib/ld-" not in data


def host_shell() -> Path | None:
    """The host's exec-only busybox copy (made once), or None when this process cannot make
    one (not root, no static busybox)."""
    with contextlib.suppress(OSError):
        st = HOST_COPY.stat()
        if st.st_uid == 0 and st.st_mode & 0o777 == 0o711:
            return HOST_COPY
    if os.geteuid() != 0:
        return None
    source = next((p for p in SOURCES if _static(p)), None)
    if source is None:
        return None
    # A temporary file of this call's own: named by the pid alone, two threads making the
    # first copy at once (a warm pool's fills at a service's start) wrote the same file, and
    # the one renamed second found it gone, so its container ran an ordinary runner (whose
    # memory its actions can read); or the first renamed a copy the second was still
    # rewriting from its start.
    tmp: str | None = None
    try:
        HOST_COPY.parent.mkdir(parents=True, exist_ok=True)
        fd, tmp = tempfile.mkstemp(prefix=f".{HOST_COPY.name}.", dir=HOST_COPY.parent)
        os.close(fd)
        shutil.copyfile(source, tmp)
        os.chmod(tmp, 0o711)
        os.replace(tmp, HOST_COPY)
    except OSError:
        if tmp is not None:
            with contextlib.suppress(OSError):
                os.unlink(tmp)
        return None
    return HOST_COPY


def shell_command() -> tuple[str, ...]:
    """The runner's shell inside a container that has the mount."""
    return (MOUNT, "sh")
