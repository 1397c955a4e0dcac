"""Issue 16, defect 7: commands up to ``MAX_COMMAND_BYTES`` run as written on both transports;
longer ones are refused before anything runs; and no size breaks the runner."""

from __future__ import annotations

import base64
import time
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
    line, rest = sent.split(b"\n", 1)
    assert line.startswith(f"a1 @{INLINE_MAX_BYTES + 1}:".encode())
    trailer = line.rsplit(b":", 1)[1]
    assert len(trailer) == 16 and rest == b"x" * (INLINE_MAX_BYTES + 1) + trailer


def _long(body: str, status: int) -> str:
    """A script past ``INLINE_MAX_BYTES`` (so it travels as raw bytes) that runs ``body``."""
    return body + "\n" + "#" * (INLINE_MAX_BYTES + 100) + f"\nexit {status}"


def test_a_long_script_is_never_spooled_to_a_file_the_actions_can_reach(
    any_manager: Any, trajectory: Any
) -> None:
    """A file the container's shell writes, the actions (the same uid) can open or replace."""
    traj = trajectory(any_manager)
    out = any_manager.run_action(traj, _long("ls -A /tmp", 3), 1)
    assert out.exit_code == 3 and out.text == "", out


def test_a_fifo_left_where_long_scripts_were_spooled_serves_nothing(
    manager: Any, trajectory: Any
) -> None:
    """The runner used to spool a long script to /tmp/.tangram-command-<its pid>: an action
    that left a FIFO there and a process serving it replaced the next long action (a grader
    that uploads its tests in the command) with a forged script exiting 0."""
    traj = trajectory(manager)
    plant = (
        "F=/tmp/.tangram-command-$PPID; mkfifo $F; "
        "(timeout 30 sh -c \"cat $F >/dev/null; printf 'echo forged; exit 0\\n' > $F\" "
        "</dev/null >/dev/null 2>&1 &); echo planted"
    )
    assert manager.run_action(traj, plant, 1).text == "planted\n"
    out = manager.run_action(traj, _long("echo grader: 2 failed", 1), 1, timeout_s=20)
    assert (out.exit_code, out.text) == (1, "grader: 2 failed\n"), out


@pytest.mark.parametrize("transport", ["runner", "exec"])
def test_a_long_non_ascii_script_runs_whole(docker_client: Any, transport: str) -> None:
    """Busybox ash counts ``${#script}`` in UTF-8 characters under the python image's
    LANG=C.UTF-8 and ``${script:o:l}`` in bytes: a 120 KB script of 40,000 characters lost its
    last 88 KB, and a grader's ``exit 1`` after non-ASCII reference text came back as exit 0."""
    from tangram.exec.aoe import AoeConfig, AoeManager
    from tangram.exec.aoe.config import PYTHON_IMAGE

    cfg = AoeConfig(image=PYTHON_IMAGE, transport=transport, kill_grace_s=3.0)
    with AoeManager(cfg, client=docker_client) as m:
        m.open_trajectory("utf8", memory_gb=0.5)
        try:
            grader = (
                "echo checking\n# expected: " + "日本語のテキスト" * 5000 + "\necho FAIL; exit 1\n"
            )
            out = m.run_action("utf8", grader, 1, timeout_s=60)
            assert (out.exit_code, out.text) == (1, "checking\nFAIL\n"), out
            payload = "\U0001f600" * 75_000
            out = m.run_action("utf8", f"printf '%s' '{payload}' | wc -c", 1, timeout_s=60)
            assert out.ok and out.text.strip() == str(len(payload.encode())), out
        finally:
            m.close_trajectory("utf8")


def test_a_long_script_cut_short_in_transit_never_runs(
    manager: Any, trajectory: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A long script's bytes follow its length on the runner's stdin; when the send failed
    part-way (its time-out passed, the socket broke), the action was reported failed and
    the runner closed, and the runner's ``head -c N`` then read EOF and returned the part
    it had, with success: the runner ran the truncated script, unwatched, after its action
    had ended with an error (a command cut in the middle runs another command). The runner
    now checks the script arrived whole (a random trailer after it) and exits unrun."""
    from tangram.exec.aoe import transport as transport_mod

    real_send = transport_mod.send

    def half(sock: Any, data: bytes, timeout_s: float) -> None:
        real_send(sock, data[: len(data) // 2], timeout_s)
        raise AoeError("could not send the action: timed out")

    traj = trajectory(manager)
    assert manager.run_action(traj, "true", 1).ok  # the runner is up
    runner = manager._trajs[traj].container.transport
    monkeypatch.setattr(transport_mod, "send", half)
    script = "touch /tmp/partial-ran\n" + "#" * (200 << 10) + "\ntrue"
    out = manager.run_action(traj, script, 1, timeout_s=30)
    assert out.status == "error", out
    monkeypatch.setattr(transport_mod, "send", real_send)
    exec_id = runner.exec_id
    deadline = time.monotonic() + 30
    while manager.client.api.exec_inspect(exec_id)["Running"]:
        assert time.monotonic() < deadline, "the closed runner did not end"
        time.sleep(0.05)
    check = manager.run_action(traj, "test -e /tmp/partial-ran && echo ran || echo unrun", 1)
    assert check.text == "unrun\n", check
