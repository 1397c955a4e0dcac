"""A watchdog that removes one manager session's containers when the manager's process dies.

The manager starts ``python -m tangram.exec.aoe.reaper SESSION`` (``spawn``) with a pipe on
its stdin and keeps the write end. Whatever way the manager ends (return, exception, SIGKILL,
OOM), the kernel closes that pipe; the reaper reads EOF and removes every container labelled
with the session. A clean shutdown has already removed them, so the reaper finds nothing to do.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import threading
from pathlib import Path
from typing import Any

#: How long ``release`` waits for the watchdog to find nothing left and exit (it lists the
#: session's containers once: well under a second on a local engine).
EXIT_WAIT_S = 10.0

#: The directory holding the ``tangram`` package, so the watchdog imports this same code.
_ROOT = str(Path(__file__).resolve().parents[3])


def spawn(session: str, base_url: str | None) -> subprocess.Popen[bytes]:
    """Start the watchdog of ``session``; the manager keeps the returned process's stdin open."""
    return subprocess.Popen(
        [sys.executable, "-m", "tangram.exec.aoe.reaper", session, base_url or ""],
        stdin=subprocess.PIPE,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
        start_new_session=True,  # Ctrl-C and the manager's own death spare it
        env={
            **os.environ,
            "PYTHONPATH": os.pathsep.join(filter(None, (_ROOT, os.environ.get("PYTHONPATH")))),
        },
    )


def release(watchdog: subprocess.Popen[bytes] | None) -> None:
    """Let the watchdog go after a clean shutdown: it finds nothing left and exits, and is
    waited for here (up to ``EXIT_WAIT_S``, then by a daemon thread): left unwaited it stayed
    a zombie and its dropped ``Popen`` warned that it was still running."""
    if watchdog is None:
        return
    if watchdog.stdin is not None:
        watchdog.stdin.close()
    try:
        watchdog.wait(EXIT_WAIT_S)
    except subprocess.TimeoutExpired:  # a slow engine: it goes on removing, we go on
        threading.Thread(target=watchdog.wait, name="tangram-reaper-wait", daemon=True).start()


def main(argv: list[str]) -> int:
    if not argv:
        print("usage: python -m tangram.exec.aoe.reaper SESSION [BASE_URL]", file=sys.stderr)
        return 2
    session = argv[0]
    base_url = argv[1] if len(argv) > 1 and argv[1] else None
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # Ctrl-C is for the manager, not for us
    while sys.stdin.buffer.read(65536):
        pass  # nothing is ever written; read until the manager's end closes the pipe
    import docker

    from tangram.exec.aoe import containers

    client = docker.DockerClient(base_url=base_url) if base_url else docker.from_env()
    return sweep(client, session, containers)


def sweep(client: Any, session: str, containers: Any) -> int:
    """Remove every container of ``session``; 0 when all went, 1 when some would not (each
    reported on stderr). One failure stopped the sweep there, and nothing else removes the
    later ones once their manager is dead."""
    failed = 0
    for container in containers.session_containers(client, session):
        try:
            containers.remove(client, container.id)
        except Exception as exc:  # noqa: BLE001 - AoeError or the engine's own errors
            print(f"could not remove container {container.id[:12]}: {exc}", file=sys.stderr)
            failed += 1
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
