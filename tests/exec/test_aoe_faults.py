"""Faults give the action a clear error, never a hang, and free its cores: a container that
dies mid-action, a command that does not exist, a time-out, too much output, out of memory."""

from __future__ import annotations

import threading
import time
from typing import Any

import pytest

from tangram.exec.aoe import AoeError, GrantError, UnknownTrajectory

pytestmark = pytest.mark.docker


def test_container_dying_mid_action_errors_frees_cores_and_can_be_recreated(
    any_manager: Any, trajectory: Any, docker_client: Any
) -> None:
    mgr = any_manager
    traj = trajectory(mgr)
    first = mgr.handle(traj)
    box: dict[str, Any] = {}
    worker = threading.Thread(
        target=lambda: box.setdefault("out", mgr.run_action(traj, "sleep 60", (0,), timeout_s=60))
    )
    t0 = time.monotonic()
    worker.start()
    time.sleep(0.5)
    docker_client.api.kill(first.container_id)
    worker.join(15)
    assert not worker.is_alive(), "the action hung after its container died"
    out = box["out"]
    assert time.monotonic() - t0 < 10
    assert out.status == "error" and "died" in out.error, out
    assert mgr.free_cores() == mgr.topology.cores
    again = mgr.run_action(traj, "echo hi", (0,))
    assert again.status == "error" and "recreate" in again.error
    fresh = mgr.recreate(traj)
    assert fresh.generation == 2 and fresh.container_id != first.container_id
    ok = mgr.run_action(traj, "echo back", (0,))
    assert ok.ok and ok.text == "back\n"


def test_missing_command_is_a_clear_error(any_manager: Any, trajectory: Any) -> None:
    traj = trajectory(any_manager)
    for command in ("no-such-tool --flag", ["no-such-tool", "--flag"]):
        out = any_manager.run_action(traj, command, 1)
        assert out.status == "error" and out.exit_code == 127
        assert "command not found" in out.error and "no-such-tool" in out.error


def test_timeout_kills_the_action_but_keeps_the_container(
    any_manager: Any, trajectory: Any
) -> None:
    traj = trajectory(any_manager)
    keep = any_manager.run_action(traj, "sleep 600 >/dev/null 2>&1 & echo $! > /work/keeper", 1)
    assert keep.ok
    t0 = time.monotonic()
    out = any_manager.run_action(
        traj,
        "echo started; echo mark > /work/mark; sleep 31 & sleep 32; echo never",
        1,
        timeout_s=0.7,
    )
    took = time.monotonic() - t0
    assert out.status == "timeout" and "timed out after 0.7 s" in out.error
    # Killed at the time-out, not when the command would have ended (32 s); the slack is for
    # a loaded machine (docker exec and the kill take longer there).
    assert out.text == "started\n" and 0.7 <= took < 20
    after = any_manager.run_action(
        traj,
        "cat /work/mark; ps -o args | grep '^sleep 3[12]' || echo no-sleepers; "
        "kill -0 $(cat /work/keeper) && echo keeper-alive",
        1,
    )
    assert after.ok, after
    assert after.text.split() == ["mark", "no-sleepers", "keeper-alive"]
    assert any_manager.free_cores() == any_manager.topology.cores


@pytest.mark.parametrize("stream", ["stdout", "stderr"])
def test_oversize_output_is_cut_and_the_action_killed(
    any_manager: Any, trajectory: Any, stream: str
) -> None:
    traj = trajectory(any_manager)
    redirect = "" if stream == "stdout" else " >&2"
    t0 = time.monotonic()
    out = any_manager.run_action(traj, f"yes{redirect}", 1, max_output_bytes=4096, timeout_s=60)
    assert time.monotonic() - t0 < 30, "killed for its output, not at the time-out"
    assert out.status == "error" and "output too large" in out.error and stream in out.error
    assert len(getattr(out, stream)) == 4096 and getattr(out, stream).startswith(b"y\ny\n")
    fine = any_manager.run_action(traj, "printf 1234", 1, max_output_bytes=4)
    assert fine.ok and fine.stdout == b"1234"


def test_non_zero_exit_and_stderr_are_reported(manager: Any, trajectory: Any) -> None:
    traj = trajectory(manager)
    out = manager.run_action(traj, "echo partial; echo 'bad input' >&2; exit 3", 1)
    assert out.status == "error" and out.exit_code == 3
    assert out.error == "exit code 3: bad input" and out.stdout == b"partial\n"


def test_out_of_memory_is_named(manager: Any, trajectory: Any) -> None:
    traj = trajectory(manager, memory_gb=0.0625)
    out = manager.run_action(traj, "dd if=/dev/zero of=/dev/null bs=256M count=1", 1, timeout_s=30)
    assert out.status == "error" and out.exit_code == 137
    assert "out-of-memory" in out.error
    assert manager.run_action(traj, "echo alive", 1).ok  # the container itself survived


def test_bad_requests_raise_naming_the_problem(manager: Any, trajectory: Any) -> None:
    traj = trajectory(manager)
    with pytest.raises(UnknownTrajectory, match="no-such-trajectory"):
        manager.run_action("no-such-trajectory", "true", 1)
    with pytest.raises(GrantError, match="not on this node"):
        manager.run_action(traj, "true", (999,))
    with pytest.raises(AoeError, match="quota_cores must be in"):
        manager.run_action(traj, "true", (0,), quota_cores=2)
    with pytest.raises(AoeError, match="already has a container"):
        manager.open_trajectory(traj)
    with pytest.raises(AoeError, match="not in the local Docker engine"):
        manager.open_trajectory("img", image="tangram-no-such-image")
    assert manager.free_cores() == manager.topology.cores
