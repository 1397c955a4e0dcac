"""``tangram serve`` as a child process on a free loopback port, for the benchmarks that load
the service from outside (``bench service``, ``bench soak``)."""

from __future__ import annotations

import json
import subprocess
import sys
from collections.abc import Sequence
from pathlib import Path


def start_serve(
    args: Sequence[str], log: Path, executors: Sequence[str] = ("--no-cpu", "--no-gpu")
) -> tuple[subprocess.Popen[str], str]:
    """``tangram serve --no-cpu --no-gpu --port 0 --json ARGS`` (``executors``: the flags
    that leave executors out), its log in ``log`` (a file: an unread pipe would stall the
    server once it filled); returns the process and its URL."""
    cmd = [sys.executable, "-m", "tangram.cli", "serve", *executors]
    cmd += ["--port", "0", "--json", *args]
    with log.open("w") as err:
        proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=err, text=True)
    assert proc.stdout is not None
    line = proc.stdout.readline()
    if not line:
        proc.wait(10)
        raise RuntimeError(f"tangram serve did not start: {log.read_text()[-2000:]}")
    return proc, json.loads(line)["url"]
