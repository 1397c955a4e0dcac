"""The AOE parts below the manager, without Docker: how an action is checked (``plan_action``),
carried through cores, grant, run and revoke (``ActionRunner``, on a fake container), and how a
trajectory's container is named, labelled and described (``lifecycle``)."""

from __future__ import annotations

import os
import re
import subprocess
import time
from collections.abc import Callable
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest

from tangram.exec.aoe.cgroups import CgroupGone
from tangram.exec.aoe.config import AoeConfig, SandboxConfig
from tangram.exec.aoe.containers import LABEL, LABEL_OWNER, LABEL_SESSION, LABEL_TRAJ
from tangram.exec.aoe.errors import AoeError
from tangram.exec.aoe.execution import ActionRunner, action_env, plan_action
from tangram.exec.aoe.ledger import CoreLedger
from tangram.exec.aoe.lifecycle import (
    Blueprint,
    Container,
    Lifecycle,
    container_name,
    id_digest,
    labels,
    park,
)
from tangram.exec.aoe.records import TIMING_KEYS, ContainerHandle
from tangram.exec.aoe.topology import NumaTopology
from tangram.exec.aoe.transport import ActionRequest, RawResult
from tests.interrupts import interrupted_at, interruptible_lines

TOPOLOGY = NumaTopology(((0, 1), (2, 3)))
DIED = "container cccccccccccc died: status exited, exit code 137"


class FakeControl:
    """A cgroup that records what was written; ``grant_error`` makes the grant raise."""

    def __init__(self, log: list[str], grant_error: Exception | None = None) -> None:
        self.log, self.grant_error = log, grant_error
        self.oom = 0

    def grant(self, cores: tuple[int, ...], quota: float) -> None:
        self.log.append(f"grant {cores} {quota:g}")
        if self.grant_error is not None:
            raise self.grant_error

    def park(self) -> None:
        self.log.append("park")

    def oom_kills(self) -> int | None:
        self.log.append("oom?")
        return self.oom

    def pids(self) -> list[int] | None:
        return []


class FakeTransport:
    """Answers each action with ``answer(request)``, which may raise."""

    def __init__(self, log: list[str], answer: Callable[[ActionRequest], RawResult]) -> None:
        self.log, self.answer = log, answer
        self.requests: list[ActionRequest] = []

    def run(self, request: ActionRequest, kill: Callable[[str], None]) -> RawResult:
        self.log.append("run")
        self.requests.append(request)
        return self.answer(request)

    def close(self) -> None:
        self.log.append("close")


class FakeLifecycle:
    """``mark_dead`` as the lifecycle's: records the look, reports ``death``."""

    def __init__(self, log: list[str], death: str | None = None) -> None:
        self.log, self.death = log, death

    def mark_dead(self, container: Container, suspect: bool = False) -> str | None:
        self.log.append(f"look suspect={suspect}")
        if self.death is not None:
            container.dead = self.death
        return self.death


def exited(code: int | None, ended: str = "exit") -> Callable[[ActionRequest], RawResult]:
    return lambda request: RawResult(code, b"out", b"", ended, 3, 0)


def setup(
    answer: Callable[[ActionRequest], RawResult] | None = None,
    *,
    grant_error: Exception | None = None,
    death: str | None = None,
) -> tuple[ActionRunner, Container, CoreLedger, list[str]]:
    log: list[str] = []
    ledger = CoreLedger(TOPOLOGY)
    blueprint = Blueprint("t", "img", 2.0, SandboxConfig())
    handle = ContainerHandle("t", "c" * 64, "name", "img", 2.0)
    control = FakeControl(log, grant_error)
    transport = FakeTransport(log, answer or exited(0))
    container = Container(blueprint, handle, control, transport, None, None)  # type: ignore[arg-type]
    runner = ActionRunner(None, ledger, FakeLifecycle(log, death))  # type: ignore[arg-type]
    return runner, container, ledger, log


def plan(cores: tuple[int, ...] | int = (0, 1), **kw: Any) -> Any:
    args = {"quota_cores": None, "timeout_s": 5.0, "max_output_bytes": 100, **kw}
    return plan_action(AoeConfig(), "echo hi", cores, **args)


# --- checking an action ------------------------------------------------------------------------


def test_a_plan_fills_in_the_defaults_and_joins_an_argv() -> None:
    config = AoeConfig()
    p = plan_action(config, ["echo", "a b"], 2, None, None, None)
    assert (p.script, p.cores, p.quota) == ("echo 'a b'", 2, 2.0)
    assert (p.timeout_s, p.max_output_bytes) == (config.default_timeout_s, config.max_output_bytes)


@pytest.mark.parametrize(
    ("kw", "message"),
    [
        ({"quota_cores": 3}, r"quota_cores must be in \(0, 2\]"),
        ({"quota_cores": 0}, r"quota_cores must be in \(0, 2\]"),
        ({"timeout_s": 0}, "timeout_s must be positive"),
        ({"max_output_bytes": 0}, "max_output_bytes must be a positive"),
    ],
)
def test_a_bad_argument_raises_naming_it(kw: dict[str, Any], message: str) -> None:
    with pytest.raises(AoeError, match=message):
        plan((0, 1), **kw)


@pytest.mark.parametrize("timeout_s", [float("nan"), float("inf"), 1e300, 31 * 86400.0])
def test_a_time_out_that_is_no_finite_time_is_refused_naming_it(timeout_s: float) -> None:
    """NaN passed '<= 0' and inf had no end: the action went to the runner, whose socket
    refused the time-out (ValueError / OverflowError), and it came back as a 'container
    failure' after its runner was closed, naming neither the argument nor the caller."""
    with pytest.raises(AoeError, match="timeout_s must be"):
        plan((0, 1), timeout_s=timeout_s)
    assert plan((0, 1), timeout_s=30 * 86400.0).timeout_s == 30 * 86400.0


@pytest.mark.parametrize("limit", [2.5, float("nan"), 100.0, True, "100"])
def test_an_output_limit_that_is_no_whole_number_of_bytes_is_refused_naming_it(
    limit: Any,
) -> None:
    """A float (NaN included) passed '< 1' and the action ran: its output was cut with a
    float slice index (TypeError), reported as a 'container failure' with the runner
    closed and the output lost."""
    with pytest.raises(AoeError, match="max_output_bytes must be"):
        plan((0, 1), max_output_bytes=limit)


def test_an_output_limit_past_the_maximum_is_refused_naming_it() -> None:
    """max_output_bytes had no upper bound: 10**12 let a chatty action grow the manager's
    memory without limit (its output is held there). At most MAX_OUTPUT_BYTES (1 GiB)."""
    from tangram.exec.aoe.config import MAX_OUTPUT_BYTES

    assert MAX_OUTPUT_BYTES == 1 << 30
    for limit in (MAX_OUTPUT_BYTES + 1, 10**12):
        with pytest.raises(AoeError, match="max_output_bytes must be at most"):
            plan((0, 1), max_output_bytes=limit)
    assert plan((0, 1), max_output_bytes=MAX_OUTPUT_BYTES).max_output_bytes == MAX_OUTPUT_BYTES


@pytest.mark.parametrize("threads", [2.5, True, float("nan"), "4"])
def test_a_thread_count_that_is_no_whole_number_is_refused_naming_it(threads: Any) -> None:
    """threads=2.5 ran with OMP_NUM_THREADS=2.5 and threads=True with TANGRAM_CORES=True
    (str of what was given), which no program reads as a count."""
    with pytest.raises(AoeError, match="threads must be"):
        plan((0, 1), threads=threads)
    assert plan((0, 1), threads=4).threads == 4


@pytest.mark.parametrize("command", ["echo one\x00echo two", ["echo", "x\x00y"]])
def test_a_command_with_a_nul_byte_is_refused_naming_it(command: Any) -> None:
    """No shell text or argument can hold NUL: the runner's shell dropped it and ran another
    command than the one given ('echo one\\0echo two' printed 'oneecho two', the argv
    ['echo', 'x\\0y'] printed 'xy'), where an env value with NUL was refused."""
    with pytest.raises(AoeError, match="command contains a NUL byte"):
        plan_action(AoeConfig(), command, 1, None, None, None)


@pytest.mark.parametrize("command", [["echo", 1], None, b"echo hi", 42, ("echo", None)])
def test_a_command_that_is_no_text_or_list_of_texts_is_refused_naming_it(command: Any) -> None:
    """A command of bytes, a number, None or an argv with a non-string in it raised
    AttributeError or TypeError out of run_action ('int' object has no attribute 'encode'),
    naming neither the argument nor what is wrong with it."""
    with pytest.raises(AoeError, match="command must be a string or a list of strings"):
        plan_action(AoeConfig(), command, 1, None, None, None)


@pytest.mark.parametrize("env", [[("A", "b")], "A=b", 3])
def test_an_env_that_is_no_mapping_is_refused_naming_it(env: Any) -> None:
    with pytest.raises(AoeError, match="env must be a mapping of strings"):
        plan_action(AoeConfig(), "true", 1, None, None, None, env=env)


def test_an_empty_command_raises() -> None:
    with pytest.raises(AoeError, match="command is empty"):
        plan_action(AoeConfig(), "  ", 1, None, None, None)


def test_the_action_sees_its_grant_and_may_add_its_own_variables() -> None:
    assert action_env((2, 3), 1.5, {"X": "1"}) == {
        "TANGRAM_CORES": "2",
        "OMP_NUM_THREADS": "2",
        "TANGRAM_CPUSET": "2-3",
        "TANGRAM_CPU_QUOTA": "1.5",
        "X": "1",
    }


# --- carrying an action out --------------------------------------------------------------------


def test_an_action_is_granted_run_revoked_then_its_cores_are_free() -> None:
    runner, container, ledger, log = setup()
    out = runner.run(container, "a1", plan((2, 3)), {"X": "1"}, 0.0)
    assert out.ok and (out.traj_id, out.action_id, out.cores, out.quota_cores) == (
        "t",
        "a1",
        (2, 3),
        2.0,
    )
    assert log == ["oom?", "grant (2, 3) 2", "run", "park"]
    assert ledger.free_cores() == TOPOLOGY.cores
    assert [(g.action_id, g.cores) for g in ledger.log()] == [("a1", (2, 3))]
    request = container.transport.requests[0]  # type: ignore[attr-defined]
    assert (request.action_id, request.script, request.env["X"]) == ("a1", "echo hi", "1")
    assert tuple(out.timings) == TIMING_KEYS
    assert out.timings["overhead_s"] == pytest.approx(
        out.timings["total_s"] - out.timings["queue_s"] - out.timings["exec_s"]
    )


def test_an_action_whose_deadline_passed_while_it_waited_ends_with_a_time_out_unrun() -> None:
    """The time-out counted from the command's start, whatever the call had waited for its
    trajectory's previous action (the lock) or its cores: the live runtime's action, ended
    with a time-out at its deadline, then ran in full after it, up to its whole time-out,
    its cores held. With a ``deadline`` (monotonic), one that passed runs nothing."""
    runner, container, ledger, log = setup()
    past = time.monotonic() - 1.0
    out = runner.run(container, "a1", plan((2, 3), timeout_s=5.0), None, 0.0, deadline=past)
    assert out.status == "timeout" and "before it started" in (out.error or ""), out
    assert "run" not in log and not any(e.startswith("grant") for e in log)
    assert ledger.free_cores() == TOPOLOGY.cores and out.cores == ()


def test_an_action_waiting_for_busy_cores_ends_at_its_deadline_not_when_they_free() -> None:
    """The wait for cores had no end but their release: an action whose deadline passed
    while another action held its cores went on waiting (its caller's thread, and its
    trajectory's lock, with it), for as long as that action ran, then came back "late". It
    now ends at its deadline, unrun, granted nothing."""
    import threading

    runner, container, ledger, log = setup()
    ledger.acquire("holder", (0, 1))
    outcomes: list[Any] = []
    soon = time.monotonic() + 0.2
    waiter = threading.Thread(
        target=lambda: outcomes.append(
            runner.run(container, "a1", plan((0, 1)), None, 0.0, deadline=soon)
        )
    )
    waiter.start()
    try:
        waiter.join(30)
        assert not waiter.is_alive(), "the action waited past its deadline for its cores"
        assert outcomes[0].status == "timeout" and "before it started" in outcomes[0].error
        assert outcomes[0].cores == () and "run" not in log
        assert ledger.busy() == {0: "holder", 1: "holder"} and not ledger._waiting
    finally:
        ledger.release("holder", "t", 2.0)
        waiter.join(10)


def test_an_action_runs_no_longer_than_its_deadline_leaves_it() -> None:
    runner, container, ledger, log = setup()
    soon = time.monotonic() + 2.0
    out = runner.run(container, "a1", plan((2, 3), timeout_s=5.0), None, 0.0, deadline=soon)
    assert out.ok
    request = container.transport.requests[0]  # type: ignore[attr-defined]
    assert 0 < request.timeout_s <= 2.0


def test_a_dead_container_runs_nothing_and_takes_no_cores() -> None:
    runner, container, ledger, log = setup()
    container.dead = DIED
    out = runner.run(container, "a1", plan(), None, 0.0)
    assert (
        out.status == "error"
        and out.error == f"container cccccccccccc is dead ({DIED}); call recreate()"
    )
    assert out.cores == () and log == [] and ledger.log() == ()
    assert tuple(out.timings) == ("queue_s", "total_s", "overhead_s")


def test_a_vanished_cgroup_looks_at_the_container_while_the_cores_are_held() -> None:
    runner, container, ledger, log = setup(grant_error=CgroupGone("gone"), death=DIED)
    out = runner.run(container, "a1", plan(), None, 0.0)
    assert out.error == f"container failure: {DIED}" and out.exit_code is None
    assert log == ["oom?", "grant (0, 1) 2", "look suspect=True", "park"]  # never ran
    assert ledger.free_cores() == TOPOLOGY.cores and container.dead == DIED
    assert "exec_s" not in out.timings


def test_a_grant_that_cannot_be_written_fails_the_action_without_a_look() -> None:
    runner, container, ledger, log = setup(grant_error=AoeError("EBUSY"))
    out = runner.run(container, "a1", plan(), None, 0.0)
    assert out.error == "container failure: the grant could not be written: EBUSY"
    assert log == ["oom?", "grant (0, 1) 2", "park"]
    assert ledger.free_cores() == TOPOLOGY.cores


@pytest.mark.parametrize(
    "error",
    [
        AoeError("docker pause of cccccccccccc failed: 500 Server Error"),
        PermissionError(13, "Permission denied"),  # a cgroup file's open, not its write
    ],
)
def test_a_park_that_fails_still_frees_the_cores_and_gives_the_outcome(error: Exception) -> None:
    """The revoke's park raised (a docker pause or cgroup write refused: AoeError) in the
    same ``finally`` that releases the cores: the ledger kept them for ever (every later
    action asking for them waited without end, in any trajectory) and the action got no
    outcome (the AoeError instead). Now the cores go back, the action has its outcome, and
    the container, left running unparked, takes no more actions (recreate or close it)."""
    runner, container, ledger, log = setup()

    def refuse() -> None:
        log.append("park")
        raise error

    container.control.park = refuse  # type: ignore[method-assign]
    out = runner.run(container, "a1", plan(), None, 0.0)
    assert out.status == "ok" and out.stdout == b"out", out
    assert ledger.free_cores() == TOPOLOGY.cores
    assert container.dead is not None and "could not be parked" in container.dead
    again = runner.run(container, "a2", plan(), None, 0.0)
    assert again.status == "error" and "could not be parked" in (again.error or "")
    assert ledger.free_cores() == TOPOLOGY.cores


def test_an_oom_counter_that_cannot_be_read_costs_neither_the_cores_nor_the_outcome() -> None:
    """Reading the OOM-kill counter raised anything but CgroupGone (an OSError such as
    ENODEV from a cgroup being removed) between the cores' grant and the ``try`` that frees
    them: the ledger kept them for ever and the action got no outcome. The counter is now
    unknown then (None), as without a memory controller."""
    runner, container, ledger, log = setup()

    def unreadable() -> int | None:
        raise OSError(19, "No such device")

    container.control.oom_kills = unreadable  # type: ignore[method-assign]
    out = runner.run(container, "a1", plan(), None, 0.0)
    assert out.status == "ok", out
    assert ledger.free_cores() == TOPOLOGY.cores


def test_a_grant_whose_cgroup_file_cannot_be_opened_fails_the_action_with_its_outcome() -> None:
    """Only a cgroup write's error became AoeError; one opening the file (EACCES, ENODEV) came
    out of run_action as a bare OSError instead of the action's outcome."""
    runner, container, ledger, log = setup(grant_error=PermissionError(13, "Permission denied"))
    out = runner.run(container, "a1", plan(), None, 0.0)
    assert out.status == "error" and "Permission denied" in (out.error or ""), out
    assert ledger.free_cores() == TOPOLOGY.cores


def test_a_transport_error_closes_the_transport_and_names_the_error() -> None:
    def broken(request: ActionRequest) -> RawResult:
        raise ConnectionError("socket closed")

    runner, container, ledger, log = setup(broken)
    out = runner.run(container, "a1", plan(), None, 0.0)
    assert out.error == "container failure: ConnectionError: socket closed"
    assert log == ["oom?", "grant (0, 1) 2", "run", "close", "look suspect=True", "park"]
    assert ledger.free_cores() == TOPOLOGY.cores


@pytest.mark.parametrize("answer", ["transport error", "signal"])
def test_a_look_at_the_container_that_fails_still_gives_the_outcome(answer: str) -> None:
    """After a transport error or a SIGKILL the runner asks the engine whether the container
    died; an engine error there (docker's APIError: a 500, the socket gone) came out of
    run_action instead of the action's outcome. The death is then unknown, as when the
    engine says the container runs."""

    def broken(request: ActionRequest) -> RawResult:
        raise ConnectionError("socket closed")

    runner, container, ledger, log = setup(broken if answer == "transport error" else exited(137))

    def engine_down(container: Container, suspect: bool = False) -> str | None:
        raise RuntimeError("500 Server Error: Internal Server Error")

    runner.lifecycle.mark_dead = engine_down  # type: ignore[method-assign]
    out = runner.run(container, "a1", plan(), None, 0.0)
    assert out.status == "error", out
    assert ledger.free_cores() == TOPOLOGY.cores


def test_a_signal_looks_at_the_container_once_after_the_revoke_then_reads_the_oom_counter() -> None:
    runner, container, _, log = setup(exited(137))
    container.control.oom = 0  # type: ignore[attr-defined]

    def oom_kill(request: ActionRequest) -> RawResult:
        container.control.oom = 1  # type: ignore[attr-defined]
        return RawResult(137, b"", b"Killed\n", "exit", 0, 7)

    container.transport.answer = oom_kill  # type: ignore[attr-defined]
    out = runner.run(container, "a1", plan(), None, 0.0)
    assert out.error == "killed by the out-of-memory killer (memory limit 2 GB)"
    assert log == ["oom?", "grant (0, 1) 2", "run", "park", "look suspect=False", "oom?"]


def test_a_clean_failure_neither_looks_at_the_container_nor_rereads_the_oom_counter() -> None:
    runner, container, _, log = setup(exited(3))
    out = runner.run(container, "a1", plan(), None, 0.0)
    assert out.status == "error" and out.error == "exit code 3"
    assert log == ["oom?", "grant (0, 1) 2", "run", "park"]


def test_a_container_found_dead_after_a_lost_stream_fails_the_action_with_its_output() -> None:
    runner, container, ledger, log = setup(exited(None, "eof"), death=DIED)
    out = runner.run(container, "a1", plan(), None, 0.0)
    assert (out.status, out.exit_code, out.stdout) == ("error", None, b"out")
    assert out.error == f"container failure: {DIED}"
    assert log == ["oom?", "grant (0, 1) 2", "run", "park", "look suspect=True"]


class FailingGroup:
    """An action group whose kill fails for another reason than the cgroup being gone."""

    by = "cgroup"
    stuck = None

    def __init__(self, error: Exception) -> None:
        self.error = error

    def kill(self) -> Any:
        raise self.error


@pytest.mark.parametrize(
    "error",
    [AoeError("writing 'FROZEN' to freezer.state failed: EBUSY"), PermissionError(13, "denied")],
)
def test_a_kill_that_fails_still_ends_the_action_timed_out_with_its_output(
    error: Exception,
) -> None:
    """The kill at the time-out raised (a freezer write refused: AoeError, or a cgroup file's
    open: OSError) through the transport: the action came back as a "container failure"
    naming the freezer, its output lost, its runner closed. Now it is a time-out with what
    it printed, saying the kill could not be confirmed."""
    runner, container, ledger, log = setup()
    container.group = FailingGroup(error)  # type: ignore[assignment]

    def timed_out(request: ActionRequest, kill: Callable[[str], None]) -> RawResult:
        log.append("run")
        kill("timeout")
        return RawResult(None, b"partial", b"", "timeout", 7, 0)

    container.transport.run = timed_out  # type: ignore[method-assign]
    out = runner.run(container, "a1", plan(), None, 0.0)
    assert (out.status, out.stdout) == ("timeout", b"partial"), out
    assert "not known" in (out.error or "") and "container failure" not in (out.error or "")
    assert "close" not in log and ledger.free_cores() == TOPOLOGY.cores


def test_a_count_of_cores_is_chosen_numa_locally_by_the_ledger() -> None:
    runner, container, _, _ = setup()
    assert runner.run(container, "a1", plan(2), None, 0.0).cores == (0, 1)


# --- a container's identity --------------------------------------------------------------------


def test_a_container_is_named_by_session_trajectory_and_generation() -> None:
    blueprint = Blueprint("traj/7 x", "img", 1.0, SandboxConfig())
    digest = id_digest("traj/7 x")
    assert len(digest) == 16
    name = container_name("0123456789abcdef", blueprint)
    assert name == f"tangram-aoe-01234567-traj-7-x-{digest}-1"
    again = blueprint.next_generation()
    assert again.generation == 2 and again.traj_id == blueprint.traj_id
    assert container_name("0123456789abcdef", again) == name[:-1] + "2"


@pytest.mark.parametrize(
    "ids",
    [
        ("a!", "a?"),
        (".", ".."),
        ("траектория", "проба"),
        ("数据", "模型"),
        ("x" * 49 + "1", "x" * 49 + "2"),
    ],
)
def test_ids_that_read_alike_get_distinct_docker_legal_names(ids: tuple[str, str]) -> None:
    names = {container_name("s", Blueprint(t, "img", 1.0, SandboxConfig())) for t in ids}
    assert len(names) == 2
    for name in names:
        assert re.fullmatch(r"[a-zA-Z0-9][a-zA-Z0-9_.-]+", name) and len(name) <= 80


def test_a_container_is_labelled_with_its_session_owner_and_trajectory() -> None:
    found = labels("s1", Blueprint("traj/7", "img", 1.0, SandboxConfig()))
    assert found[LABEL] == "1" and found[LABEL_SESSION] == "s1" and found[LABEL_TRAJ] == "traj/7"
    assert found[LABEL_OWNER].count("/") == 3  # host/pid/start time/PID namespace


def test_a_blueprint_takes_the_managers_defaults_and_refuses_no_memory() -> None:
    config = AoeConfig()
    lifecycle = Lifecycle(config, None, TOPOLOGY, "s1")
    made = lifecycle.blueprint("t", None, None, None)
    assert made == Blueprint("t", config.image, config.memory_gb, config.sandbox, 1)
    own = SandboxConfig(network=True)
    assert lifecycle.blueprint("t", 0.5, "other", own) == Blueprint("t", "other", 0.5, own, 1)
    with pytest.raises(AoeError, match="memory_gb of trajectory 't' must be a positive.*, got 0"):
        lifecycle.blueprint("t", 0, None, None)


@pytest.mark.parametrize("memory_gb", [float("nan"), float("inf"), True, "1"])
def test_a_memory_size_that_is_no_finite_number_is_refused_naming_it(memory_gb: Any) -> None:
    """NaN and inf passed '<= 0' and failed at the container's create as a bare ValueError
    or OverflowError (int() of them); True opened a trajectory of 'True' GB; a string raised a
    bare TypeError."""
    lifecycle = Lifecycle(AoeConfig(), None, TOPOLOGY, "s1")
    with pytest.raises(AoeError, match="memory_gb of trajectory 't' must be a positive"):
        lifecycle.blueprint("t", memory_gb, None, None)


@pytest.mark.parametrize("memory_gb", [2**20 + 1, 1e15])
def test_a_memory_size_past_a_pebibyte_is_refused_naming_it(memory_gb: float) -> None:
    """A trajectory's or the config's memory_gb took any finite number: 1e15 passed, and the
    open failed at the engine ('json: cannot unmarshal number ... into Go struct field'),
    naming no setting."""
    lifecycle = Lifecycle(AoeConfig(), None, TOPOLOGY, "s1")
    with pytest.raises(AoeError, match="memory_gb of trajectory 't' must be .* at most 1048576"):
        lifecycle.blueprint("t", memory_gb, None, None)
    with pytest.raises(AoeError, match="AoeConfig.memory_gb must be at most 1048576"):
        AoeConfig(memory_gb=memory_gb)
    assert lifecycle.blueprint("t", 2**20, None, None).memory_gb == 2**20


def test_a_live_container_is_parked_and_a_dead_one_thawed_instead(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A frozen dead container is taken by runc for a paused one and never deleted: ``park``
    freezes only a container whose init is neither gone, a zombie nor exiting."""

    class Control(FakeControl):
        def unthrottle(self) -> None:
            self.log.append("thaw")

    def parked_with(init_pid: int | None) -> list[str]:
        log: list[str] = []
        blueprint = Blueprint("t", "img", 1.0, SandboxConfig())
        handle = ContainerHandle("t", "c" * 64, "name", "img", 1.0)
        container = Container(blueprint, handle, Control(log), None, None, init_pid)  # type: ignore[arg-type]
        park(container)
        return log

    zombie = subprocess.Popen(["true"])
    try:
        deadline = time.monotonic() + 5
        while Path(f"/proc/{zombie.pid}/stat").read_text().rsplit(")", 1)[1].split()[0] != "Z":
            assert time.monotonic() < deadline, "the child did not exit"
            time.sleep(0.01)
        assert parked_with(zombie.pid) == ["thaw"]
    finally:
        zombie.wait()
    assert parked_with(zombie.pid) == ["thaw"]  # gone altogether
    from tangram.exec.aoe import containers

    # This process stands for a live init: its pid taken for the container's (in its cgroup).
    monkeypatch.setattr(containers, "local_pid", lambda pid, container_id: pid)
    assert parked_with(os.getpid()) == ["park"]
    assert parked_with(None) == ["park"]  # a remote engine: nothing to look at


def test_a_container_whose_cgroup_file_cannot_be_opened_is_still_removed(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A cgroup file whose open failed for another reason than ENOENT (EACCES, ENODEV; here
    EISDIR) raised a bare OSError where every caller suppresses ``AoeError``: the unthrottle
    before a container's removal raised out of ``Lifecycle._remove``, the container was never
    removed, and the shutdown (which logs ``AoeError`` only) stopped there, every later
    trajectory's container left running. Such an error is now an ``AoeError`` naming the
    file."""
    from tangram.exec.aoe import lifecycle as lifecycle_mod
    from tangram.exec.aoe.cgroups import CgroupV2

    (tmp_path / "cgroup.freeze").mkdir()  # opening it for writing: IsADirectoryError
    control = CgroupV2(tmp_path, 100_000, 1_000, (0, 1))
    log: list[str] = []
    removed: list[str] = []
    monkeypatch.setattr(lifecycle_mod.containers, "remove", lambda client, cid: removed.append(cid))
    blueprint = Blueprint("t", "img", 1.0, SandboxConfig())
    handle = ContainerHandle("t", "c" * 64, "name", "img", 1.0)
    group = type("Group", (), {"close": lambda self: log.append("group closed")})()
    transport = FakeTransport(log, exited(0))
    container = Container(blueprint, handle, control, transport, group, None)  # type: ignore[arg-type]
    Lifecycle(AoeConfig(), None, TOPOLOGY, "s1").retire(container)
    assert removed == ["c" * 64] and log == ["close", "group closed"]
    with pytest.raises(AoeError, match="cgroup.freeze"):
        control.unthrottle()


@pytest.mark.parametrize(
    ("kw", "message"),
    [
        ({"quota_cores": "1"}, "quota_cores must be"),
        ({"quota_cores": True}, "quota_cores must be"),
        ({"timeout_s": "5"}, "timeout_s must be"),
        ({"timeout_s": True}, "timeout_s must be"),
        ({"timeout_s": [5]}, "timeout_s must be"),
    ],
)
def test_a_limit_that_is_no_number_is_refused_naming_it(kw: dict[str, Any], message: str) -> None:
    """quota_cores="x" raised a bare ValueError (float() of it) and timeout_s="5" a bare
    TypeError (comparing it with 0), naming neither argument; True passed as 1."""
    with pytest.raises(AoeError, match=message):
        plan((0, 1), **kw)


@pytest.mark.parametrize("deadline", [float("nan"), "12.5", True])
def test_a_deadline_that_is_no_time_is_refused_naming_it(deadline: Any) -> None:
    """A NaN deadline compared false with every time: the action ran its whole time-out, the
    deadline silently ignored; a string raised a bare TypeError."""
    from tangram.exec.aoe.execution import check_deadline

    with pytest.raises(AoeError, match="deadline must be"):
        check_deadline(deadline)
    check_deadline(None)
    check_deadline(time.monotonic() + 5)


@pytest.mark.parametrize(
    ("image", "sandbox", "message"),
    [
        (123, None, "image of trajectory 't' must be"),
        (b"busybox", None, "image of trajectory 't' must be"),
        ("", None, "image of trajectory 't' must be an image name"),
        (None, {"user": "root"}, "sandbox of trajectory 't' must be a SandboxConfig"),
    ],
)
def test_an_image_or_sandbox_of_the_wrong_kind_is_refused_naming_it(
    image: Any, sandbox: Any, message: str
) -> None:
    """A sandbox given as a dict raised a bare AttributeError ('dict' object has no attribute
    'relaxations'); an image that is no name (a number, bytes) went to the engine, whose
    answer named neither the argument nor the fault; an empty name was taken for none, and
    the trajectory got the manager's default image without a word."""
    lifecycle = Lifecycle(AoeConfig(), None, TOPOLOGY, "s1")
    with pytest.raises(AoeError, match=message):
        lifecycle.blueprint("t", None, image, sandbox)


def test_an_action_id_one_trajectory_chose_never_refuses_another_trajectorys_action() -> None:
    """The ledger knew an action by the id its caller chose, across trajectories: while
    trajectory u's action "step1" ran, trajectory t's own action "step1" raised "action id
    'step1' already holds cores" out of run_action (and a resize of one could grow the
    other's grant). Each action is now known to the ledger by its id and its trajectory's."""
    runner, t_container, ledger, log = setup()
    u_handle = ContainerHandle("u", "d" * 64, "name-u", "img", 2.0)
    u_container = Container(
        Blueprint("u", "img", 2.0, SandboxConfig()),
        u_handle,
        FakeControl(log),
        FakeTransport(log, exited(0)),
        None,  # type: ignore[arg-type]
        None,
    )
    inner: list[Any] = []

    def while_u_runs(request: ActionRequest) -> RawResult:
        inner.append(runner.run(t_container, "step1", plan((2, 3)), None, 0.0))
        return RawResult(0, b"u", b"", "exit", 1, 0)

    u_container.transport.answer = while_u_runs  # type: ignore[attr-defined]
    outer = runner.run(u_container, "step1", plan((0, 1)), None, 0.0)
    assert outer.ok and outer.cores == (0, 1)
    assert inner[0].ok and inner[0].cores == (2, 3) and inner[0].action_id == "step1"
    assert ledger.free_cores() == TOPOLOGY.cores
    assert sorted((g.traj_id, g.action_id) for g in ledger.log()) == [
        ("t", "step1"),
        ("u", "step1"),
    ]


def test_a_container_that_could_not_be_parked_is_stopped() -> None:
    """A container whose park failed after an action was marked dead and its cores given
    back, but it went on running unfrozen: what its actions left in the background ran on
    cores the ledger then granted to other actions (other trajectories'), until the
    trajectory's close or recreate. The engine is now asked to stop it at once."""
    runner, container, ledger, log = setup()
    stopped: list[str] = []
    runner.client = SimpleNamespace(api=SimpleNamespace(kill=stopped.append))

    def refuse() -> None:
        raise AoeError("writing 'FROZEN' to freezer.state failed: EBUSY")

    container.control.park = refuse  # type: ignore[method-assign]
    out = runner.run(container, "a1", plan(), None, 0.0)
    assert out.status == "ok" and ledger.free_cores() == TOPOLOGY.cores
    assert stopped == [container.handle.container_id]
    assert container.dead is not None and "stopped" in container.dead


def test_a_container_whose_init_pid_now_names_another_process_is_not_alive() -> None:
    """A container's init was taken for alive while its host pid ran: once the init had died
    and the kernel gave its pid to another process (this test's own, here), the warm pool
    handed the dead container out (its first action failed, blamed on a client that had
    only opened it), and an action's park froze it instead of thawing it. The pid must now
    also be in the container's cgroup."""
    _, container, _, _ = setup()
    container.init_pid = os.getpid()  # a live process, but not the container's
    lifecycle = Lifecycle(AoeConfig(), None, TOPOLOGY, "s1")
    assert not lifecycle._alive(container)
    writes: list[str] = []
    container.control.unthrottle = lambda: writes.append("thaw")  # type: ignore[attr-defined]
    container.control.park = lambda: writes.append("park")  # type: ignore[method-assign]
    park(container)
    assert writes == ["thaw"]


@pytest.mark.parametrize("action_id", [5, b"step1", ["step1"], 1.5])
def test_an_action_id_that_is_no_text_is_refused_naming_it(action_id: Any) -> None:
    """An action id that was no string (a number, bytes, a list) raised a bare TypeError
    from the id's pattern ('expected string or bytes-like object'), naming neither the
    argument nor the fault; it is now an ``AoeError`` naming the action id."""
    with pytest.raises(AoeError, match="action id"):
        plan_action(AoeConfig(), "true", 1, None, None, None, action_id=action_id)


def test_an_interrupt_anywhere_running_an_action_gives_its_cores_back() -> None:
    """``ActionRunner.run`` took the action's cores from the ledger before the ``try`` whose
    ``finally`` gives them back: an interrupt (a KeyboardInterrupt: a notebook's, a CLI's)
    once they were taken kept them for good, so every later action on those cores waited
    until its deadline (for ever without one) and the action's id stayed "already holds
    cores". An interrupt at any line of ``run`` (but the release's own, in the finally)
    now leaves the ledger as it was."""
    import inspect

    function = ActionRunner.run
    source, first = inspect.getsourcelines(function)
    releases = [first + i for i, text in enumerate(source) if "self.ledger.release(" in text]
    code = function.__code__
    lines = [ln for ln in interruptible_lines(code) if ln not in releases]
    assert lines
    for line in lines:
        runner, container, ledger, _ = setup()
        with interrupted_at(code, line):
            runner.run(container, "a1", plan(), None, time.perf_counter())
        assert ledger.free_cores() == TOPOLOGY.cores, line
        assert (
            runner.run(
                container, "a1", plan(), None, time.perf_counter(), deadline=time.monotonic() + 5
            ).status
            == "ok"
        ), line


@pytest.mark.parametrize("method", ["acquire", "_wait_for"])
def test_an_interrupt_anywhere_taking_cores_in_the_ledger_keeps_none(method: str) -> None:
    """``CoreLedger.acquire`` granted the cores (``_assign``) and then returned them: an
    interrupt in between (at the line returning them) left them owned by an action whose
    caller never had them, nobody to release them: kept for good. An interrupt at any line
    of the wait (but its own handlers') now takes the grant back."""
    import inspect

    from tangram.exec.aoe.ledger import CoreLedger as Ledger

    function = getattr(Ledger, method)
    source, first = inspect.getsourcelines(function)
    handlers = set()
    for i, text in enumerate(source):  # the except/finally clauses' own lines
        if text.strip() in ("except BaseException:", "finally:"):
            handlers.update(range(first + i, first + i + 5))
    code = function.__code__
    lines = [ln for ln in interruptible_lines(code) if ln not in handlers]
    assert lines
    for line in lines:
        ledger = Ledger(TOPOLOGY)
        got = None
        with interrupted_at(code, line):
            got = ledger.acquire("a1", (0, 1))
        if got is not None:
            ledger.release("a1", "t", 2.0)
        assert ledger.free_cores() == TOPOLOGY.cores, line
        assert not ledger._waiting and not ledger.holds("a1"), line


class _NamedStarts:
    """A lifecycle whose containers hold their names as the engine's do: a start asking for
    a name a live container holds is refused 'already taken'."""

    def __init__(self) -> None:
        self.live: set[tuple[str, int]] = set()

    def blueprint(self, traj_id: str, memory_gb: Any, image: Any, sandbox: Any) -> Blueprint:
        return Blueprint(traj_id, "img", 1.0, SandboxConfig())

    def start(self, blueprint: Blueprint) -> Any:
        name = (blueprint.traj_id, blueprint.generation)
        if name in self.live:
            raise AoeError(f"container name {name} is already taken")
        self.live.add(name)
        handle = SimpleNamespace(name=name, short_id=f"{name}")
        return SimpleNamespace(blueprint=blueprint, handle=handle, name=name)

    def discard(self, container: Any) -> None:
        self.live.discard(container.name)

    retire = discard


def test_an_interrupt_anywhere_opening_a_trajectory_leaves_no_container_holding_its_name() -> None:
    """``open_trajectory`` put the container it started in the books after the start: an
    interrupt in between (a KeyboardInterrupt) left it running, unknown to the manager,
    its name (the trajectory's generation 1) taken, so every later open of the id in the
    session was refused 'already taken'. An interrupt at any line of the open (but its
    handler's) now discards it or leaves it the trajectory's, and the id opens again."""
    import inspect
    import threading

    from tangram.exec.aoe.manager import AoeManager

    function = AoeManager.open_trajectory
    source, first = inspect.getsourcelines(function)
    handlers = {  # the handlers' own lines (an interrupt there is covered by nothing)
        ln
        for i, t in enumerate(source)
        if t.strip() == "except BaseException:"
        for ln in range(first + i, first + i + 8)
    }
    code = function.__code__
    lines = [ln for ln in interruptible_lines(code) if ln not in handlers]
    assert lines
    for line in lines:
        m = AoeManager.__new__(AoeManager)
        m._lock, m._closed = threading.Lock(), False
        m._trajs, m._stale_volumes, m._left_generation = {}, {}, {}
        starts = _NamedStarts()
        m._containers = starts  # type: ignore[assignment]
        with interrupted_at(code, line):
            m.open_trajectory("t")
        held = {t.container.name for t in m._trajs.values()}
        assert starts.live == held, line  # nothing running unknown to the manager
        if "t" in m._trajs:
            starts.discard(m._trajs.pop("t").container)  # (closed)
        m.open_trajectory("t")  # the id opens again
        assert "t" in m._trajs, line


def test_an_interrupt_anywhere_counting_a_start_in_flight_leaves_no_count() -> None:
    """``_start_in_flight`` counted a start before the ``try`` whose ``finally`` uncounts it:
    an interrupt in between (a KeyboardInterrupt as the lock was let go) kept the count up
    for good, so a shutdown left its watchdog's release to a start that would never come.
    An interrupt at any line of it (but its handler's) now leaves nothing counted."""
    import inspect
    import threading

    from tangram.exec.aoe.manager import AoeManager

    function = AoeManager._start_in_flight.__wrapped__
    source, first = inspect.getsourcelines(function)
    handlers = {
        ln
        for i, t in enumerate(source)
        if t.strip() == "finally:"
        for ln in range(first + i, first + i + 9)
    }
    code = function.__code__
    lines = [ln for ln in interruptible_lines(code) if ln not in handlers]
    assert lines
    for line in lines:
        m = AoeManager.__new__(AoeManager)
        m._lock, m._closed = threading.Lock(), False
        with interrupted_at(code, line), m._start_in_flight():
            pass
        assert not m._in_flight, line

    class InterruptedRelease:
        """A lock whose first release is followed by an interrupt: where the count's gap
        was, between letting the lock go and entering the ``try``."""

        def __init__(self) -> None:
            self.lock, self.fired = threading.Lock(), False

        def __enter__(self) -> None:
            self.lock.acquire()

        def __exit__(self, *exc: object) -> None:
            self.lock.release()
            if not self.fired:
                self.fired = True
                raise KeyboardInterrupt

    m = AoeManager.__new__(AoeManager)
    m._lock, m._closed = InterruptedRelease(), False  # type: ignore[assignment]
    with pytest.raises(KeyboardInterrupt), m._start_in_flight():
        pass
    assert not m._in_flight


@pytest.mark.parametrize("method", ["recreate", "_put_in_place"])
def test_an_interrupt_anywhere_recreating_leaves_no_container_nobodys(method: str) -> None:
    """``recreate`` retired the old container and then said so (``traj.retired``): an
    interrupt in between (a KeyboardInterrupt) left the trajectory running its actions in a
    container retired under it (a pooled one reset and handed to another trajectory). And it
    started the fresh container and then put it in place: an interrupt in between left it
    running, nobody's, until the shutdown's sweep (a pooled one counted busy for good). An
    interrupt at any line of the recreate (but its handlers') now leaves the trajectory no
    retired container and nothing running nobody's, and a recreate works."""
    import inspect
    import threading

    from tangram.exec.aoe.manager import AoeManager, Trajectory

    function = getattr(AoeManager, method)
    source, first = inspect.getsourcelines(function)
    handlers = {
        ln
        for i, t in enumerate(source)
        if t.strip() == "except BaseException:"
        for ln in range(first + i, first + i + 9)
    }
    code = function.__code__
    lines = [ln for ln in interruptible_lines(code) if ln not in handlers]
    assert lines
    for line in lines:
        m = AoeManager.__new__(AoeManager)
        m._lock, m._closed = threading.Lock(), False
        m._trajs, m._stale_volumes, m._left_generation = {}, {}, {}
        starts = _NamedStarts()
        m._containers = starts  # type: ignore[assignment]
        traj = m._trajs["t"] = Trajectory(starts.start(Blueprint("t", "img", 1.0, SandboxConfig())))
        with interrupted_at(code, line):
            m.recreate("t")
        if traj.retired is None:  # its container is its own, never a retired one
            assert traj.container.name in starts.live, line
        assert starts.live <= {traj.container.name}, line  # nothing running nobody's
        starts.discard(traj.container)  # (an old one left by an interrupt before its retire)
        m.recreate("t")
        assert traj.retired is None and starts.live == {traj.container.name}, line


@pytest.mark.parametrize("weighted", ["no", "false", 0, None, 1])
def test_a_weighted_flag_that_is_no_bool_is_refused_naming_it(weighted: Any) -> None:
    """``run_action(weighted=...)`` took any value for its truth: 'no' or 'false' (strings,
    truthy) gave the action a weighted grant (the whole pool, no quota, a CPU weight)
    instead of its exclusive cores, and None or 0 an exclusive one, without a word. A flag
    that is no bool is now an AoeError naming it, before anything runs."""
    import threading

    from tangram.exec.aoe.manager import AoeManager, Trajectory

    runner, container, ledger, log = setup()
    m = AoeManager.__new__(AoeManager)
    m._lock, m._closed, m._action_seq = threading.Lock(), False, 0
    m._trajs = {"t": Trajectory(container)}
    m.ledger, m.topology, m.config, m._actions = ledger, TOPOLOGY, AoeConfig(), runner
    with pytest.raises(AoeError, match="weighted"):
        m.run_action("t", "true", (0,), weighted=weighted)
    assert log == [] and ledger.free_cores() == TOPOLOGY.cores


class _CountingPool:
    """A warm pool that counts what is busy: taken, less what came back or was untaken."""

    def __init__(self, parked: int) -> None:
        self.parked, self.busy, self.back = parked, 0, 0

    def take(self, key: Any) -> Any:
        self.busy += 1
        if not self.parked:
            return None
        self.parked -= 1
        return _pooled(key)

    def untake(self, key: Any) -> None:
        self.busy -= 1

    def give_back(self, key: Any, container: Any) -> None:
        self.busy -= 1
        self.back += 1


def _pooled(key: Any) -> Container:
    handle = ContainerHandle("(warm pool)", "c" * 64, "pool1", "img", 1.0)
    made = Container(
        Blueprint("(warm pool)", "img", 1.0, SandboxConfig()),
        handle,
        None,  # type: ignore[arg-type]
        None,  # type: ignore[arg-type]
        None,  # type: ignore[arg-type]
        None,
    )
    made.pool_key = key
    return made


@pytest.mark.parametrize("parked", [0, 1], ids=["cold", "warm"])
def test_an_interrupt_anywhere_taking_a_pooled_container_loses_none(parked: int) -> None:
    """``Lifecycle.start`` took a container from the warm pool (counted busy) and then made
    it the trajectory's: an interrupt in between (a KeyboardInterrupt) lost it, running, and
    kept it counted busy for good (the key's target one too high: a container more parked
    for ever). An interrupt at any line of the start (but its handler's) now gives it back."""
    import inspect

    from tangram.exec.aoe.config import WarmPoolConfig

    function = Lifecycle.start
    source, first = inspect.getsourcelines(function)
    handlers = {
        ln
        for i, t in enumerate(source)
        if t.strip() == "except BaseException:"
        for ln in range(first + i, first + i + 6)
    }
    code = function.__code__
    lines = [ln for ln in interruptible_lines(code) if ln not in handlers]
    assert lines
    for line in lines:
        lifecycle = Lifecycle(AoeConfig(warm_pool=WarmPoolConfig(2)), None, TOPOLOGY, "s1")
        assert lifecycle.pool is not None
        lifecycle.pool.close()
        pool = _CountingPool(parked)
        lifecycle.pool = pool  # type: ignore[assignment]
        lifecycle._create_pooled = _pooled  # type: ignore[method-assign]
        got = None
        with interrupted_at(code, line):
            got = lifecycle.start(Blueprint("t", "img", 1.0, SandboxConfig()))
        if got is not None:
            lifecycle.retire(got)  # (the trajectory closed)
        assert pool.busy == 0, line


def test_a_call_after_the_shutdown_says_the_manager_is_shut_down() -> None:
    """After the shutdown (its trajectories closed) an action, close, recreate or handle of
    a trajectory was refused 'no open container ...; call open_trajectory first', which the
    caller then did, to be refused again for another reason: the manager was shut down.
    The refusal now says so."""
    import threading

    from tangram.exec.aoe.errors import UnknownTrajectory
    from tangram.exec.aoe.manager import AoeManager

    m = AoeManager.__new__(AoeManager)
    m._lock, m._closed, m._trajs = threading.Lock(), True, {}
    for call in (
        lambda: m.run_action("t", "true"),
        lambda: m.close_trajectory("t"),
        lambda: m.recreate("t"),
        lambda: m.handle("t"),
    ):
        with pytest.raises(UnknownTrajectory, match="shut down"):
            call()
