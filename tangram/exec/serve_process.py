"""``tangram serve`` as a child process on a free loopback port, for the benchmarks that load
the service from outside (``bench service``, ``bench soak``)."""

from __future__ import annotations

import json
import selectors
import subprocess
import sys
from collections.abc import Sequence
from pathlib import Path

#: How long the child may take to say where it listens (its first line): a start makes its
#: executors (Docker's warm containers, EOE's devices), seconds to a minute.
START_TIMEOUT_S = 300.0


def start_serve(
    args: Sequence[str],
    log: Path,
    executors: Sequence[str] = ("--no-cpu", "--no-gpu"),
    *,
    timeout_s: float = START_TIMEOUT_S,
) -> tuple[subprocess.Popen[str], str]:
    """``tangram serve --no-cpu --no-gpu --port 0 --json ARGS`` (``executors``: the flags
    that leave executors out), its log in ``log`` (a file: an unread pipe would stall the
    server once it filled); returns the process and its URL. A child that does not say its
    URL within ``timeout_s`` (or says something else) is stopped and ``RuntimeError`` says
    why: it was left running (a server nobody would stop) or waited for without end."""
    cmd = [sys.executable, "-m", "tangram.cli", "serve", *executors]
    cmd += ["--port", "0", "--json", *args]
    with log.open("w") as err:
        proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=err, text=True)
    try:
        return proc, _url(proc, log, timeout_s)
    except BaseException:
        stop(proc)
        raise


def _url(proc: subprocess.Popen[str], log: Path, timeout_s: float) -> str:
    """The URL of the child's first line (``--json``'s ready line), waited for up to
    ``timeout_s``; ``RuntimeError`` with its log's end when it ends, stalls or says else."""
    assert proc.stdout is not None
    with selectors.DefaultSelector() as sel:
        sel.register(proc.stdout, selectors.EVENT_READ)
        ready = sel.select(timeout_s)
    line = proc.stdout.readline() if ready else ""
    try:
        url = json.loads(line)["url"] if line else None
    except (ValueError, TypeError, KeyError):
        url = None
    if not isinstance(url, str):
        why = "said " + repr(line[:200]) if line else f"said nothing in {timeout_s:g} s"
        raise RuntimeError(f"tangram serve did not start ({why}): {_tail(log)}")
    return url


def stop(proc: subprocess.Popen[str], grace_s: float = 30.0) -> None:
    """Terminate the child, kill it after ``grace_s``, and reap it."""
    if proc.poll() is None:
        proc.terminate()
        try:
            proc.wait(grace_s)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
    if proc.stdout is not None:
        proc.stdout.close()


def _tail(log: Path) -> str:
    try:
        return log.read_text(errors="replace")[-2000:]
    except OSError as exc:
        return f"(its log {log} could not be read: {exc})"
