"""Resizing a running grant (malleable CPU actions), as a specification: a running program's
cpuset grows and shrinks when the grant is resized, the cores it gives up are free for others
at once, a core another action holds is never taken, a resize after the end is a no-op, and a
failed write leaves the action on its old cores. The resize's cost is printed (-s), never
asserted."""

from __future__ import annotations

import os
import queue
import threading
import time
from collections.abc import Callable
from types import SimpleNamespace
from typing import Any

import pytest

from tangram.core.resources import CpuNodeSpec
from tangram.exec.aoe.config import PYTHON_IMAGE
from tangram.exec.aoe.errors import AoeError, GrantError
from tangram.exec.aoe.ledger import CoreLedger
from tangram.exec.aoe.resize import RunningGrant
from tangram.exec.aoe.topology import as_topology

#: Prints its affinity, then each new one it sees (polling every 2 ms), until it has seen
#: argv[1] distinct sets or 20 s passed; /tmp/seen-N marks that the N-th was printed.
WATCH = r"""
import os, sys, time
def now(): return ",".join(map(str, sorted(os.sched_getaffinity(0))))
seen = [now()]
print(seen[-1], flush=True)
open("/tmp/seen-1", "w").close()
deadline = time.monotonic() + 20
while len(seen) < int(sys.argv[1]) and time.monotonic() < deadline:
    if now() != seen[-1]:
        seen.append(now())
        print(seen[-1], flush=True)
        open(f"/tmp/seen-{len(seen)}", "w").close()
    time.sleep(0.002)
"""


def watch(changes: int) -> list[str]:
    """The command: see ``changes`` + 1 affinities."""
    return ["python3", "-c", WATCH, str(changes + 1)]


def marker_waiter(manager: Any, traj: str) -> Callable[[int], None]:
    """``wait(n)``: until the program in ``traj``'s container has printed its n-th affinity
    (read through the container's init's root, from the host)."""
    api = manager.client.api
    pid = api.inspect_container(manager.handle(traj).container_id)["State"]["Pid"]

    def wait(n: int) -> None:
        path = f"/proc/{pid}/root/tmp/seen-{n}"
        deadline = time.monotonic() + 20
        while not os.path.exists(path):
            assert time.monotonic() < deadline, f"the program never printed affinity {n}"
            time.sleep(0.002)

    return wait


def in_thread(call: Callable[[], Any]) -> tuple[threading.Thread, dict[str, Any]]:
    box: dict[str, Any] = {}
    thread = threading.Thread(target=lambda: box.setdefault("out", call()))
    thread.start()
    return thread, box


def cpus(cores: tuple[int, ...]) -> str:
    return ",".join(map(str, cores))


# --- with Docker --------------------------------------------------------------------------


def test_a_running_program_sees_its_cpuset_grow_then_shrink(manager: Any, trajectory: Any) -> None:
    c0, c1 = manager.topology.cores[:2]
    traj = trajectory(manager, image=PYTHON_IMAGE)
    wait = marker_waiter(manager, traj)
    grants: queue.Queue[RunningGrant] = queue.Queue()
    thread, box = in_thread(
        lambda: manager.run_action(traj, watch(2), (c0,), timeout_s=30, on_grant=grants.put)
    )
    grant = grants.get(timeout=30)
    wait(1)
    grown = grant.resize((c0, c1))
    assert grown.status == "applied" and grown.cores == (c0, c1)
    assert manager.free_cores() == ()
    wait(2)
    shrunk = grant.resize((c1,))
    assert shrunk.status == "applied" and shrunk.cores == (c1,)
    assert manager.free_cores() == (c0,)  # given back as soon as the cpuset no longer has it
    thread.join(30)
    out = box["out"]
    assert out.ok, out
    assert out.text.split() == [cpus((c0,)), cpus((c0, c1)), cpus((c1,))]
    assert manager.free_cores() == manager.topology.cores
    print(
        f"\nresize of a running program ({manager.control(traj).kind}): grow "
        f"{grown.write_s * 1e6:.0f} us of writes ({grown.total_s * 1e6:.0f} us with the "
        f"ledger), shrink {shrunk.write_s * 1e6:.0f} us ({shrunk.total_s * 1e6:.0f} us)"
    )


def test_a_resize_after_the_action_ended_is_a_no_op(manager: Any, trajectory: Any) -> None:
    c0, c1 = manager.topology.cores[:2]
    traj = trajectory(manager)
    grants: list[RunningGrant] = []
    out = manager.run_action(traj, "true", (c0,), on_grant=grants.append)
    assert out.ok
    late = grants[0].resize((c0, c1))
    assert late.status == "ended" and late.cores == (c0,)
    assert manager.free_cores() == manager.topology.cores  # nothing taken for it
    again = manager.run_action(traj, "grep Cpus_allowed_list /proc/self/status | cut -f2", (c1,))
    assert again.ok and again.text.strip() == str(c1)  # the container parked and re-granted


def test_an_action_told_more_threads_than_cores_sees_them_and_its_one_core(
    manager: Any, trajectory: Any
) -> None:
    # A non-malleable program the scheduler told 2 threads on 1 core (``Start.threads``):
    # TANGRAM_CORES and OMP_NUM_THREADS say 2, its cpuset has the one core it was granted.
    (c0,) = manager.topology.cores[:1]
    traj = trajectory(manager)
    script = (
        'echo "$TANGRAM_CORES $OMP_NUM_THREADS"; grep Cpus_allowed_list /proc/self/status | cut -f2'
    )
    out = manager.run_action(traj, script, (c0,), threads=2)
    assert out.ok, out
    assert out.text.split() == ["2", "2", str(c0)]
    with pytest.raises(AoeError, match="threads must be 0 or at least"):
        manager.run_action(traj, "true", manager.topology.cores[:2], threads=1)


# --- without Docker: the ledger and a grant on a stand-in container ----------------------


def ledger_of(cores: int = 4) -> CoreLedger:
    return CoreLedger(as_topology(CpuNodeSpec("n", cores=cores, numa_domains=1, memory_gb=1.0)))


def test_the_ledger_grows_an_action_only_onto_free_cores() -> None:
    ledger = ledger_of()
    ledger.acquire("a", (0,))
    ledger.acquire("b", (3,))
    assert ledger.take("a", (0, 1, 2)) == (1, 2)
    assert ledger.busy() == {0: "a", 1: "a", 2: "a", 3: "b"}
    with pytest.raises(GrantError, match=r"core 3: b"):
        ledger.take("a", (0, 3))
    assert ledger.busy() == {0: "a", 1: "a", 2: "a", 3: "b"}  # nothing changed
    ledger.give_back("a", (1, 2, 3))  # (3 is b's: ignored)
    assert ledger.busy() == {0: "a", 3: "b"}
    ledger.release("a", "t", 1.0)
    with pytest.raises(AoeError, match="holds no cores"):
        ledger.take("a", (0, 1))  # it ended: never re-granted by a late resize


def test_cores_given_back_wake_an_action_waiting_for_them() -> None:
    ledger = ledger_of(2)
    ledger.acquire("a", (0, 1))
    thread, box = in_thread(lambda: ledger.acquire("b", (1,)))
    time.sleep(0.05)
    assert "out" not in box  # waits: a holds core 1
    ledger.give_back("a", (1,))
    thread.join(5)
    assert box["out"] == (1,) and ledger.busy() == {0: "a", 1: "b"}


class Control:
    """A stand-in cgroup: records writes; ``fail`` makes the next resize raise."""

    def __init__(self) -> None:
        self.writes: list[tuple[tuple[int, ...], float]] = []
        self.fail: str | None = None

    def resize(self, cores: tuple[int, ...], quota: float) -> None:
        if self.fail:
            why, self.fail = self.fail, None
            raise AoeError(why)
        self.writes.append((cores, quota))


def grant_on(ledger: CoreLedger, cores: tuple[int, ...], quota: float) -> RunningGrant:
    ledger.acquire("a", cores)
    container = SimpleNamespace(control=Control())
    return RunningGrant(container, ledger, "a", cores, quota)  # type: ignore[arg-type]


def test_a_resize_keeps_the_quota_per_core() -> None:
    ledger = ledger_of()
    grant = grant_on(ledger, (0, 1), 1.0)  # half a core per core
    assert grant.resize((0, 1, 2, 3)).status == "applied"
    assert grant.resize((2,)).status == "applied"
    assert grant.container.control.writes == [((0, 1, 2, 3), 2.0), ((2,), 0.5)]
    assert ledger.busy() == {2: "a"}
    assert grant.resize((2,)).status == "unchanged"


def test_a_failed_write_leaves_the_action_on_its_old_cores() -> None:
    ledger = ledger_of()
    grant = grant_on(ledger, (0,), 1.0)
    control = grant.container.control
    control.fail = "cpu.max: device busy"
    failed = grant.resize((0, 1, 2))
    assert failed.status == "failed" and "device busy" in (failed.error or "")
    assert failed.cores == grant.cores == (0,)
    assert ledger.busy() == {0: "a"}  # the cores it would have gained are free again
    assert control.writes == [((0,), 1.0)]  # the old grant written back (best effort)
    grant.end()
    assert grant.resize((0, 1)).status == "ended" and ledger.busy() == {0: "a"}


def test_a_write_whose_cgroup_file_cannot_be_opened_fails_the_resize_as_a_write_error() -> None:
    """Only a cgroup write's error became AoeError: one opening the file (EACCES, ENODEV)
    came out of resize as a bare OSError, with the cores it would have gained kept."""
    ledger = ledger_of()
    grant = grant_on(ledger, (0,), 1.0)
    control = grant.container.control

    def unopenable(cores: tuple[int, ...], quota: float) -> None:
        control.resize = Control.resize.__get__(control)  # the write back works
        raise PermissionError(13, "Permission denied")

    control.resize = unopenable
    failed = grant.resize((0, 1, 2))
    assert failed.status == "failed" and "Permission denied" in (failed.error or "")
    assert failed.cores == grant.cores == (0,) and ledger.busy() == {0: "a"}


@pytest.mark.parametrize("cores", [None, 3, (1, "2"), "01"])
def test_a_resize_to_something_that_is_no_core_list_fails_naming_it(cores: Any) -> None:
    """``resize(None)`` or ``resize(3)`` raised a bare TypeError out of ``sorted`` (and a
    mixed list one from comparing its items), where every other bad core list is a
    ``failed`` result naming the problem (as a string's is already)."""
    ledger = ledger_of()
    grant = grant_on(ledger, (0,), 1.0)
    failed = grant.resize(cores)
    assert failed.status == "failed" and "core" in (failed.error or ""), failed
    assert failed.cores == grant.cores == (0,) and ledger.busy() == {0: "a"}


def test_resizes_in_any_order_never_put_two_actions_on_one_core() -> None:
    from hypothesis import given, settings
    from hypothesis import strategies as st

    core_sets = st.sets(st.integers(0, 3), min_size=1).map(lambda s: tuple(sorted(s)))

    @given(st.lists(st.tuples(st.sampled_from("ab"), core_sets), max_size=30))
    @settings(max_examples=200, deadline=None)
    def check(moves: list[tuple[str, tuple[int, ...]]]) -> None:
        ledger = ledger_of()
        grants = {}
        for name, cores in (("a", (0,)), ("b", (3,))):
            ledger.acquire(name, cores)
            container = SimpleNamespace(control=Control())
            grants[name] = RunningGrant(container, ledger, name, cores, float(len(cores)))
        for name, cores in moves:
            grant, other = grants[name], grants["b" if name == "a" else "a"]
            before = grant.cores
            result = grant.resize(cores)
            clash = set(cores) & set(other.cores)
            assert result.status == (
                "failed" if clash else "applied" if cores != before else "unchanged"
            )
            assert grant.cores == (before if clash else cores)
            owned = ledger.busy()
            for g in grants.values():  # the ledger and the cpusets agree, and are disjoint
                assert tuple(sorted(c for c, a in owned.items() if a == g.action_id)) == g.cores
                assert g.container.control.writes[-1:] in ([], [(g.cores, float(len(g.cores)))])

    check()


def test_the_mean_cores_an_action_held_weighs_each_grant_by_its_time() -> None:
    # Granted 1 core at t=0, grown to 3 at t=1, ended at t=3: (1 x 1 + 3 x 2) / 3 = 2.33 cores;
    # a grant that never changed says nothing (its start's units are the record).
    from tangram.exec.runtime.cpu import held_units

    assert held_units([(0.0, 1), (1.0, 3)], 3.0) == pytest.approx(7 / 3)
    assert held_units([(0.0, 2)], 5.0) is None
    assert held_units([(0.0, 2), (1.0, 2)], 5.0) is None


def test_a_failed_grow_whose_write_back_fails_too_keeps_the_cores_it_may_run_on() -> None:
    """A grow whose write failed was written back to the old cores and the cores it had taken
    were given back, even when the write back failed too: the container could then run on a
    cpuset holding cores the ledger had freed, which the next action (another trajectory's)
    was granted, two actions on one core. Those cores now stay the action's until a later
    resize is written or the action ends."""
    ledger = ledger_of()
    grant = grant_on(ledger, (0,), 1.0)
    control = grant.container.control

    def refused(cores: tuple[int, ...], quota: float) -> None:
        raise AoeError("writing cpuset.cpus failed: Device or resource busy")

    control.resize = refused
    failed = grant.resize((0, 1, 2))
    assert failed.status == "failed" and failed.cores == (0,)
    assert ledger.busy() == {0: "a", 1: "a", 2: "a"}  # it may run there: nobody else may
    control.resize = Control.resize.__get__(control)  # writes work again
    assert grant.resize((0, 3)).status == "applied"
    assert ledger.busy() == {0: "a", 3: "a"}  # written: the others are free
