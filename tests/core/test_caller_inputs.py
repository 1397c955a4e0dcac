"""The scheduler's callers' inputs and call orders: a refused input raises naming what is
wrong and leaves the scheduler as it was; nothing malformed is accepted silently."""

import pytest

from tangram.core import (
    Action,
    ClusterSpec,
    CpuNodeSpec,
    Inelastic,
    Reject,
    ResourceKind,
    Scheduler,
    Start,
    make_policy,
)

ONE = ClusterSpec("one", (CpuNodeSpec("n", 4, 1, 16.0),))


def cpu(aid, traj, memory_gb=1.0, units=1):
    return Action(aid, traj, ResourceKind.CPU, Inelastic(1.0), max_units=units, memory_gb=memory_gb)


def test_an_id_waiting_for_its_containers_memory_is_not_forgotten():
    """forget kept the ids of queued and running actions but not of one whose container
    waited for memory: a new action under that id was admitted beside it, and when the first
    one's container found room it started over the second's running record (whose cores were
    then never returned)."""
    sched = Scheduler(ONE, make_policy("tangram"))
    sched.submit(cpu("a", "A", memory_gb=10.0), 0.0)
    assert sched.submit(cpu("b", "B", memory_gb=10.0), 0.0) == []  # its container waits
    sched.forget("b")
    (again,) = sched.submit(cpu("b", "C"), 1.0)
    assert isinstance(again, Reject) and "duplicate" in again.reason
    sched.finish("a", 2.0)
    (start,) = sched.close_trajectory("A", 2.0)
    assert isinstance(start, Start) and start.action.trajectory == "B"
    sched.finish("b", 3.0)
    assert sched.state.cpu["n"].free_cores == 4 and not sched.running


def _snapshot(sched):
    """What a refused call must leave as it was: the running set, queues, free units."""
    node = sched.state.cpu["n"]
    return (
        {aid: r.start for aid, r in sched.running.items()},
        {d: list(q) for d, q in sched.queues.items()},
        [list(d) for d in node.free_by_numa],
        node.free_cores,
        node.memory_free_gb,
        sched.state.held_cores,
        sched.now,
    )


@pytest.mark.parametrize("policy", ["tangram", "fixed:1"])
def test_a_finish_given_twice_at_one_instant_is_refused_and_changes_nothing(policy):
    """finish_many with an id twice passed the check (each was running) and popped it twice:
    its cores were returned, then a bare KeyError left the pass undone (the action queued
    behind it never started, its id not running, whatever the caller then did)."""
    sched = Scheduler(ONE, make_policy(policy))
    sched.submit_many([cpu(f"a{i}", f"T{i}") for i in range(5)], 0.0)  # a4 waits
    before = _snapshot(sched)
    with pytest.raises(ValueError, match="'a0' given twice"):
        sched.finish_many(["a1", "a0", "a0"], 1.0)
    assert _snapshot(sched) == before
    (start,) = sched.finish_many(["a0"], 1.0)
    assert start.action.id == "a4"
