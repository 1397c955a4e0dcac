"""``start_serve`` (the benchmarks' ``tangram serve`` child) stops a child that never says
where it listens: one that printed something else or nothing was left running (a server
nobody would stop), or waited for without end. Stand-in children: a script run in place of
the interpreter (``sys.executable``)."""

from __future__ import annotations

import os
import sys
from pathlib import Path

import pytest

from tangram.exec import serve_process


def child(tmp_path: Path, first_line: str, monkeypatch: pytest.MonkeyPatch) -> Path:
    """A child that prints ``first_line`` (none if empty), writes its pid, then sleeps."""
    pid_file = tmp_path / "pid"
    script = tmp_path / "fake-python"
    say = f"echo '{first_line}'\n" if first_line else ""
    script.write_text(f"#!/bin/sh\necho $$ > {pid_file}\n{say}exec sleep 120\n")
    script.chmod(0o755)
    monkeypatch.setattr(sys, "executable", str(script))
    return pid_file


def gone(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return True
    return False


@pytest.mark.parametrize("first_line", ["not json", '{"no": "url"}', ""])
def test_a_child_that_does_not_say_its_url_is_stopped(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, first_line: str
) -> None:
    pid_file = child(tmp_path, first_line, monkeypatch)
    with pytest.raises(RuntimeError, match="did not start"):
        serve_process.start_serve([], tmp_path / "serve.log", timeout_s=3.0)
    assert gone(int(pid_file.read_text())), "the child was left running"


def test_a_child_that_says_its_url_is_returned_running(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    child(tmp_path, '{"url": "http://127.0.0.1:1"}', monkeypatch)
    proc, url = serve_process.start_serve([], tmp_path / "serve.log", timeout_s=60.0)
    try:
        assert url == "http://127.0.0.1:1" and proc.poll() is None
    finally:
        serve_process.stop(proc)
    assert proc.returncode is not None
