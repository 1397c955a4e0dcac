"""Issue 16, defect 7: commands up to ``MAX_COMMAND_BYTES`` run as written on both transports;
longer ones are refused before anything runs; and no size breaks the runner."""

from __future__ import annotations

import base64
from typing import Any

import pytest

from tangram.exec.aoe import AoeError
from tangram.exec.aoe.environment import MAX_COMMAND_BYTES
from tangram.exec.aoe.transport import INLINE_MAX_BYTES, ActionRequest, frame

pytestmark = pytest.mark.docker


def _command(size: int) -> str:
    """A shell command of exactly ``size`` bytes that prints the length of its payload."""
    head, tail = "x=", "; echo ${#x}"
    return head + "a" * (size - len(head) - len(tail)) + tail


@pytest.mark.parametrize("size", [200 << 10, MAX_COMMAND_BYTES - 1024], ids=["200KiB", "1MiB-1KiB"])
def test_a_long_command_runs_as_written(any_manager: Any, trajectory: Any, size: int) -> None:
    traj = trajectory(any_manager)
    command = _command(size)
    assert len(command) == size
    out = any_manager.run_action(traj, command, 1, timeout_s=60, env={"GREETING": "hi"})
    assert out.ok, (out.status, out.error, out.stderr[-300:])
    assert out.text == f"{size - len('x=') - len('; echo ${#x}')}\n"
    # The runner (or the next exec) serves the next action as before, and leaves no file.
    again = any_manager.run_action(traj, 'echo "$GREETING"; ls -A /tmp', 1, env={"GREETING": "hi"})
    assert again.ok and again.text == "hi\n", again


def test_an_over_long_command_is_refused_and_the_runner_is_untouched(
    any_manager: Any, trajectory: Any
) -> None:
    traj = trajectory(any_manager)
    before = any_manager.run_action(traj, "echo $PPID", 1)
    with pytest.raises(AoeError, match=f"limit is {MAX_COMMAND_BYTES}"):
        any_manager.run_action(traj, _command(MAX_COMMAND_BYTES + 1), 1)
    with pytest.raises(AoeError, match=f"limit is {MAX_COMMAND_BYTES}"):
        any_manager.run_action(traj, ["printf", "a" * MAX_COMMAND_BYTES], 1)
    after = any_manager.run_action(traj, "echo $PPID", 1)
    assert after.ok, after
    if any_manager.config.transport == "runner":
        assert after.text == before.text, "the runner was restarted"
    assert any_manager.free_cores() == any_manager.topology.cores


def test_a_short_script_travels_inline_and_a_long_one_as_raw_bytes_after_its_length() -> None:
    short = ActionRequest("a1", "echo hi", {"A": "b"}, 1.0, 10)
    line = frame("TOK a1", short)
    prefix, arg = line.rstrip(b"\n").rsplit(b" ", 1)
    assert prefix == b"TOK a1" and base64.b64decode(arg) == b"export A=b\necho hi"
    long = ActionRequest("a1", "x" * (INLINE_MAX_BYTES + 1), {}, 1.0, 10)
    sent = frame("a1", long)
    assert sent == f"a1 @{INLINE_MAX_BYTES + 1}\n".encode() + b"x" * (INLINE_MAX_BYTES + 1)
