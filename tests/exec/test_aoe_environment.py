"""Issue 16, defect 5 (AOE's side): an action's environment cannot break the rule of
``tangram.exec.aoe.environment`` (malformed keys never reach a shell, Tangram's variables cannot
be overridden), and a time-out kills every process the action started, whatever it did to hide
(``setsid``, a cleared environment, a double fork), and nothing else."""

from __future__ import annotations

import time
from typing import Any

import pytest

from tangram.exec.aoe import AoeError
from tangram.exec.aoe.execution import action_env
from tangram.exec.aoe.transport import shell_script

pytestmark = pytest.mark.docker


def test_an_env_key_that_is_not_a_variable_name_is_refused_before_anything_runs(
    any_manager: Any, trajectory: Any
) -> None:
    traj = trajectory(any_manager)
    with pytest.raises(AoeError, match="not a shell variable name"):
        any_manager.run_action(traj, "true", 1, env={"A;touch /work/pwned;B": "1"})
    after = any_manager.run_action(traj, "ls /work; echo end", 1)
    assert after.text.split() == ["end"], "the key's shell code ran"
    assert any_manager.free_cores() == any_manager.topology.cores


@pytest.mark.parametrize("key", ["TANGRAM_ACTION_ID", "TANGRAM_CORES", "OMP_NUM_THREADS"])
def test_tangrams_own_variables_cannot_be_set_by_the_caller(
    manager: Any, trajectory: Any, key: str
) -> None:
    traj = trajectory(manager)
    with pytest.raises(AoeError, match="reserved"):
        manager.run_action(traj, "true", 1, env={key: "x"})


def test_the_grant_wins_over_the_callers_variables_even_past_the_check() -> None:
    seen = action_env((0, 1), 2.0, {"TANGRAM_CORES": "64", "OMP_NUM_THREADS": "64", "A": "b"})
    assert seen["TANGRAM_CORES"] == seen["OMP_NUM_THREADS"] == "2" and seen["A"] == "b"


def test_a_script_is_never_built_from_a_malformed_key() -> None:
    assert shell_script({"A": "x y'z"}, "echo") == "export A='x y'\"'\"'z'\necho"
    with pytest.raises(AoeError, match="not a shell variable name"):
        shell_script({"A;touch x;B": "1"}, "echo")


#: An action whose processes try every way to leave it: a new session, a cleared environment,
#: a double fork (reparented to the container's init), all three at once; then it waits.
ESCAPES = (
    "setsid sleep 301 >/dev/null 2>&1 & "
    "env -i sleep 302 >/dev/null 2>&1 & "
    "(sleep 303 >/dev/null 2>&1 &) ; "
    "(setsid env -i sh -c 'sleep 304 >/dev/null 2>&1 &' &) ; "
    "sleep 0.3; echo started; sleep 60"
)


def test_a_timeout_kills_every_process_of_the_action_and_only_those(
    any_manager: Any, trajectory: Any
) -> None:
    traj = trajectory(any_manager)
    keep = any_manager.run_action(traj, "sleep 600 >/dev/null 2>&1 & echo $! > /work/keeper", 1)
    assert keep.ok, keep
    t0 = time.monotonic()
    out = any_manager.run_action(traj, ESCAPES, 1, timeout_s=1.5)
    assert out.status == "timeout" and out.text == "started\n", out
    assert "the action's processes were killed" in out.error
    assert time.monotonic() - t0 < 30  # at the time-out, not at the command's end (60 s)
    after = any_manager.run_action(
        traj,
        "ps -o args | grep '^sleep 30[1-4]' || echo no-escapees; "
        "kill -0 $(cat /work/keeper) && echo keeper-alive",
        1,
    )
    assert after.ok, after
    assert after.text.split() == ["no-escapees", "keeper-alive"]
    assert any_manager.free_cores() == any_manager.topology.cores


def test_background_processes_of_an_action_that_ended_are_not_killed_later(
    any_manager: Any, trajectory: Any
) -> None:
    traj = trajectory(any_manager)
    bg = any_manager.run_action(traj, "setsid sleep 600 >/dev/null 2>&1 & echo $! > /work/bg", 1)
    assert bg.ok, bg
    late = any_manager.run_action(traj, "sleep 60", 1, timeout_s=0.5)
    assert late.status == "timeout"
    alive = any_manager.run_action(traj, "kill -0 $(cat /work/bg) && echo bg-alive", 1)
    assert alive.text.strip() == "bg-alive"
