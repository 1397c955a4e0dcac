"""An open that finds no room keeps the memory it asked for: the trajectory's container is
placed with it at its first CPU action.

``open_trajectory(memory_gb=largest)`` on a node without room returned None and forgot the
ask: the first CPU action then placed the container with its own (smaller) memory, and a
later action needing the largest was rejected ("the node cannot grow it now") while another
container held the node's memory, though the open had asked for the largest up front (a
closed-loop replay rejected it; it would have run had the container waited for room).
"""

from __future__ import annotations

from tangram.core import (
    Action,
    ClusterSpec,
    CpuNodeSpec,
    Inelastic,
    Reject,
    ResourceKind,
    Scheduler,
    make_policy,
)

TEN_GB = ClusterSpec("ten", (CpuNodeSpec("n", 4, 1, 10.0),))


def cpu(aid: str, traj: str, memory_gb: float) -> Action:
    return Action(aid, traj, ResourceKind.CPU, Inelastic(1.0), max_units=1, memory_gb=memory_gb)


def test_the_first_action_waits_for_room_for_the_asked_memory():
    sched = Scheduler(TEN_GB, make_policy("tangram"))
    assert sched.open_trajectory("A", 0.0, memory_gb=8.0) == "n"
    assert sched.open_trajectory("B", 0.0, memory_gb=8.0) is None  # 2 GB free
    assert sched.submit(cpu("a0", "A", 8.0), 0.0)
    # b0 needs 1 GB, but B asked for 8: its container waits for A's to close.
    assert [d for d in sched.submit(cpu("b0", "B", 1.0), 0.0)] == []
    assert sched.state.cpu["n"].memory_free_gb == 2.0


def test_a_closed_loop_replay_under_memory_pressure_rejects_nothing():
    from tangram.sim.config import Overheads, SimConfig
    from tangram.sim.driver import simulate
    from tangram.trace import Trace, TraceRow

    free = Overheads(
        aoe_grant_s=0.0, container_start_s=0.0, eviction_s=0.0, api_call_s=0.0,
        exec_noise_sigma=0.0,
    )  # fmt: skip

    def row(aid: str, traj: str, pos: int, memory_gb: float, t1: float = 1.0) -> TraceRow:
        return TraceRow(aid, traj, 0, pos, "hand", "env", 0.0, "cpu", t1, 1, memory_gb=memory_gb)

    # a opens first and holds 8 of 10 GB for 5 s; b opens with 8 (no room), its b0 needs 1.
    trace = Trace((row("a0", "a", 0, 8.0, 5.0), row("b0", "b", 0, 1.0), row("b1", "b", 1, 8.0)), {})
    for policy in ("tangram", "fixed:1"):
        result = simulate(trace, TEN_GB, SimConfig(policy=policy, overheads=free))
        assert {r.row.action_id: r.outcome for r in result.actions} == dict.fromkeys(
            ("a0", "b0", "b1"), "result"
        ), policy


def test_an_ask_no_node_can_hold_is_not_kept():
    """An open asking more than any node has: the first action still runs with its own
    memory (waiting for the ask would wait forever); the larger one is refused, as before."""
    sched = Scheduler(TEN_GB, make_policy("tangram"))
    assert sched.open_trajectory("A", 0.0, memory_gb=50.0) is None
    [start] = sched.submit(cpu("a0", "A", 1.0), 0.0)
    assert not isinstance(start, Reject)
    [reject] = sched.submit(cpu("a1", "A", 50.0), 0.0)
    assert isinstance(reject, Reject)
