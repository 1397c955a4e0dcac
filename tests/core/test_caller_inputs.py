"""The scheduler's callers' inputs and call orders: a refused input raises naming what is
wrong and leaves the scheduler as it was; nothing malformed is accepted silently."""

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
