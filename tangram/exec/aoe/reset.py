"""Making a container that served a trajectory clean enough for the next one, or saying why not.

A warm pool hands a container to a new trajectory only after this succeeds; any failure
retires it. The reset, in order, with the container frozen (parked) when it starts:

1. every process but the container's init and keeper is SIGKILLed from the host (each held
   by a pidfd, seen the container's after the open), and the runner too unless it runs from the exec-only shell (``guarded.py``: no action can alter
   such a runner; any other could have been altered by an action of its uid); then the
   container is thawed at a low CPU weight (``CpuControl.background``) and holds no core in
   the ledger, so it never makes an action wait for its cores; a survivor after
   ``GONE_WAIT_S`` fails the reset. A pooled container's init and keeper run as
   ``KEEPER_USER``, another uid than the actions', so no action could signal or ptrace them
   (the actions have no capabilities and no way to change uid: ``no-new-privileges``);
2. the writable places (the work dir, ``/tmp``, ``/dev/shm``) are emptied from the host
   through ``/proc/<init>/root``, opened once and init checked to be the container's after
   the open (no process is left to race it; ``shutil.rmtree``'s fd-based walk follows no
   symlink, so nothing outside the container can be reached), and checked empty; then the runner (kept, or a fresh one) must answer, alone with init and the keeper;
3. the container is parked again (the grant's cpuset and quota put back to the parking ones).

Nothing else is writable in a sandboxed container (read-only root), the environment is the
runner's (each action's exports die with its shell), and the memory and pids limits cannot be
changed from inside (no capabilities), so these three steps leave nothing of the last user.
"""

from __future__ import annotations

import contextlib
import functools
import itertools
import logging
import os
import shutil
import signal
import subprocess
import time
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING

from tangram.exec.aoe import containers
from tangram.exec.aoe.cgroups import CgroupGone
from tangram.exec.aoe.errors import AoeError
from tangram.exec.aoe.kill import CgroupGroup
from tangram.exec.aoe.transport import ActionRequest, RunnerTransport

if TYPE_CHECKING:
    from tangram.exec.aoe.lifecycle import Container

#: The uid:gid of a pooled container's init and keeper (``nobody``): not the actions'.
KEEPER_USER = "65534:65534"
KEEPER_UID = 65534
#: How long the killed processes get to be gone.
GONE_WAIT_S = 2.0
#: How long the fresh runner has to answer.
START_TIMEOUT_S = 10.0
#: Writable places a sandboxed container has besides its work dir (``/dev/mqueue``: POSIX
#: message queues, mode 1777, which outlive their creator).
SCRATCH_DIRS = ("/tmp", "/dev/shm", "/dev/mqueue")
#: SysV IPC objects live in the container's IPC namespace, not in any directory: they outlive
#: the processes that made them (a shared-memory segment keeps its pages, charged to the
#: container's memory) and must be removed from inside that namespace.
SYSVIPC = ("shm", "msg", "sem")

log = logging.getLogger(__name__)
_seq = itertools.count(1)


def empty_dir(directory: Path) -> list[str]:
    """Remove everything inside ``directory`` without following any symlink (``rmtree``'s
    fd-based walk, as root: no permission bits stop it); the names still there after."""
    for entry in os.scandir(directory):
        if entry.is_dir(follow_symlinks=False):
            shutil.rmtree(entry.path, ignore_errors=True)
        else:
            with contextlib.suppress(FileNotFoundError):
                os.unlink(entry.path)
    return sorted(os.listdir(directory))[:10]


def processes(container: Container) -> set[int]:
    """Host pids of every process of the container (its action cgroup's too, which cgroup v2
    lists apart)."""
    pids = set(container.control.pids() or ())
    group = container.group
    if isinstance(group, CgroupGroup):
        with contextlib.suppress(CgroupGone, OSError):
            pids |= {int(p) for p in (group.dir / "cgroup.procs").read_text().split()}
    return pids


def keepers(pids: set[int]) -> set[int]:
    """Those of ``pids`` that run as the keeper's uid (real uid, from /proc)."""
    found = set()
    for pid in pids:
        with contextlib.suppress(OSError, ValueError, IndexError):
            status = Path(f"/proc/{pid}/status").read_text()
            uid = next(ln for ln in status.splitlines() if ln.startswith("Uid:")).split()[1]
            if int(uid) == KEEPER_UID:
                found.add(pid)
    return found


@functools.cache
def _warn_once(message: str) -> None:
    log.warning("%s", message)


def _clear_sysv_ipc(init: int, container: Container) -> str | None:
    """Remove every SysV shared-memory segment, message queue and semaphore set of the
    container's IPC namespace (``nsenter``/``ipcrm`` on the host, as root); why not, or None."""
    # The namespace is opened once and handed to nsenter by descriptor: were init gone and
    # its pid reused by a host process meanwhile, ``ipcrm --all`` would empty the host's.
    try:
        fd = os.open(f"/proc/{init}/ns/ipc", os.O_RDONLY | os.O_CLOEXEC)
    except OSError as exc:
        return f"its IPC namespace cannot be opened: {exc}"
    try:
        if os.fstat(fd).st_ino == os.stat("/proc/self/ns/ipc").st_ino:
            return "its IPC namespace is this host's (its init gone, the pid reused?)"
        if init not in processes(container):  # checked after the open: the fd is this one's
            return "its init is gone (the pid may be another container's now)"
        ns = f"--ipc=/proc/self/fd/{fd}"
        subprocess.run(
            ["nsenter", ns, "ipcrm", "--all"], capture_output=True, timeout=10, pass_fds=(fd,)
        )
        listed = subprocess.run(
            ["nsenter", ns, "cat", *(f"/proc/sysvipc/{k}" for k in SYSVIPC)],
            capture_output=True,
            timeout=10,
            check=True,
            pass_fds=(fd,),
        ).stdout.decode(errors="replace")
    except FileNotFoundError as exc:  # no nsenter or ipcrm: every reset fails, said once
        _warn_once(f"warm pool: every reset fails: {exc} (util-linux's nsenter and ipcrm)")
        return f"its SysV IPC objects could not be removed: {exc}"
    except (OSError, subprocess.SubprocessError) as exc:
        return f"its SysV IPC objects could not be removed: {exc}"
    finally:
        os.close(fd)
    # Each file is one header line then one line per object.
    objects = [
        ln for ln in listed.splitlines() if ln.split() and ln.split()[0].lstrip("-").isdigit()
    ]
    if objects:
        return f"{len(objects)} SysV IPC object(s) survived ipcrm: {objects[:3]}"
    return None


def _signal_held(container: Container, pids: set[int], sig: int) -> None:
    """Send ``sig`` to ``pids``, each held by a pidfd and seen the container's after the
    open: by pid, one that ended after it was listed had its pid's next holder (another
    container's or a host process) killed (or, for a SIGCONT, continued)."""
    held: dict[int, int] = {}
    try:
        for pid in pids:
            with contextlib.suppress(OSError):  # gone already
                held[pid] = os.pidfd_open(pid)
        still = processes(container)  # after the opens: each fd is the listed process's
        for pid, fd in held.items():
            if pid in still:
                with contextlib.suppress(ProcessLookupError):
                    signal.pidfd_send_signal(fd, sig)
    finally:
        for fd in held.values():
            os.close(fd)


def _empty_writable(init: int, container: Container) -> str | None:
    """Empty the work dir and the scratch dirs through the container's root, seen from here;
    why not, or None. The root is opened once and init checked to be the container's after
    the open (as ``_clear_sysv_ipc`` does): were init gone and its pid given to another
    process meanwhile (the container killed during its reset), ``/proc/<init>/root`` was that
    process's root, a host process's ``/``, and its /tmp and /dev/shm were emptied."""
    try:
        fd = os.open(f"/proc/{init}/root", os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
    except OSError as exc:
        return f"its root cannot be opened: {exc}"
    try:
        if init not in processes(container):  # checked after the open: the fd is this one's
            return "its init is gone (the pid may be another container's now)"
        root = Path(f"/proc/self/fd/{fd}")  # the container's own mounts, seen from here
        for d in (container.blueprint.sandbox.work_dir, *SCRATCH_DIRS):
            where = root / d.lstrip("/")
            if where.is_dir() and (left := empty_dir(where)):
                return f"{d} still holds {left} after emptying"
    finally:
        os.close(fd)
    return None


def _no_kill(why: str) -> None:
    """The runner's check needs no kill: at its time-out the reset fails."""


def _wait(done: Callable[[], bool], timeout_s: float) -> bool:
    """Poll ``done`` until it holds (True) or ``timeout_s`` passes (False)."""
    deadline = time.monotonic() + timeout_s
    while True:
        if done():
            return True
        if time.monotonic() >= deadline:
            return False
        time.sleep(0.002)


def reset(container: Container, cores: tuple[int, ...]) -> str | None:
    """Reset ``container`` (parked, not in use) for its next trajectory, on ``cores`` at the
    lowest weight; None when it is clean and parked again, else why it must be removed."""
    if container.dead:
        return container.dead
    init = container.init_pid
    if init is None or not containers.pid_running(init):
        return "its init process is gone or not visible from here"
    if not isinstance(container.transport, RunnerTransport):
        return "only containers with a runner transport are reset"
    if container.control.pids() is None:
        return "its processes cannot be listed from here (no cgroup access)"
    runner = _keepable_runner(container)
    if runner is None:
        container.transport.close()  # its shell dies with the others; a new one is started
    try:
        container.control.background(True)
        why = _reset_on(container, init, cores, runner)
    except (AoeError, OSError) as exc:
        why = f"{type(exc).__name__}: {exc}"
    except BaseException:
        _park_after_reset(container)
        raise
    unparked = _park_after_reset(container)
    return why or unparked


def _park_after_reset(container: Container) -> str | None:
    """Park the container again (the reset thawed it and granted it the node's cores) and put
    its weight back; why it could not be, or None. A clean reset whose park failed said
    "clean" all the same (the error suppressed), and the pool kept the container unparked."""
    try:
        container.control.park()
        container.control.background(False)
    except (AoeError, OSError) as exc:
        return f"the container could not be parked after its reset: {exc}"
    return None


def _keepable_runner(container: Container) -> int | None:
    """The runner's host pid when it may be kept: it runs from the exec-only shell (no action
    could have altered it, ``guarded.py``) and is alive; else None (a new one is started)."""
    transport = container.transport
    if not container.guarded_runner or not isinstance(transport, RunnerTransport):
        return None
    pid = transport.pid
    if pid is None or not transport.alive() or not containers.pid_running(pid):
        return None
    return pid


def _reset_on(
    container: Container, init: int, cores: tuple[int, ...], runner: int | None
) -> str | None:
    spared = keepers(processes(container))
    if init not in spared:
        return f"its init does not run as the keeper's uid {KEEPER_UID}: not a pool container"
    if runner is not None:
        spared.add(runner)
    _signal_held(container, processes(container) - spared, signal.SIGKILL)
    container.control.grant(cores, float(len(cores)))
    if runner is not None:
        # An action may have stopped it. Held by a pidfd and seen the container's, as the
        # kill's: a runner gone meanwhile (the container killed from outside) may have its
        # pid given to another process, and a stopped one (a host's, another container's)
        # was continued.
        _signal_held(container, {runner}, signal.SIGCONT)
    if not _wait(lambda: processes(container) <= spared, GONE_WAIT_S):
        left = sorted(processes(container) - spared)
        return f"{len(left)} process(es) survived SIGKILL: {left[:8]}"
    if left := _empty_writable(init, container):
        return left
    if left := _clear_sysv_ipc(init, container):
        return left
    transport = container.transport
    assert isinstance(transport, RunnerTransport)
    if runner is None:
        transport.start()
    raw = transport.run(
        ActionRequest(f"reset{next(_seq)}", "true", {}, START_TIMEOUT_S, 4096), _no_kill
    )
    if raw.ended != "exit" or raw.exit_code != 0:
        return f"the runner did not answer ({raw.ended}, exit {raw.exit_code})"
    alone = spared | ({transport.pid} if transport.pid is not None else set())
    if not _wait(lambda: processes(container) <= alone, GONE_WAIT_S):
        return f"processes other than init and the runner remain: {sorted(processes(container))}"
    return None
