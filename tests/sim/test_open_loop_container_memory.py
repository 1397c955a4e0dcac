"""An open-loop replay reserves a trajectory's largest CPU memory, as a closed-loop run does.

Before, an open-loop trajectory's container was sized by its first CPU action to arrive: a
later action of the same trajectory needing more memory had to grow the container, and was
rejected ("the node cannot grow it now") when another trajectory's container had taken the
node's free memory in between. The closed loop opens every trajectory with its largest CPU
memory up front, so the same trace ran to the end there.
"""

from __future__ import annotations

from tangram.core.resources import ClusterSpec, CpuNodeSpec
from tangram.sim.config import Overheads, RolloutConfig, SimConfig
from tangram.sim.driver import simulate
from tangram.trace import Trace, TraceRow

FREE = Overheads(
    aoe_grant_s=0.0, container_start_s=0.0, eviction_s=0.0, api_call_s=0.0, exec_noise_sigma=0.0
)


def _row(
    action: str, traj: str, position: int, memory_gb: float, arrival: float, t1: float = 1.0
) -> TraceRow:
    return TraceRow(
        action, traj, 0, position, "hand", "env", 0.0, "cpu", t1, 1,
        memory_gb=memory_gb, arrival_s=arrival,
    )  # fmt: skip


def _trace() -> Trace:
    # a0 (1 GB, 1 s) opens a's container at 0; b0 (8 GB, 5 s) arrives at 0.5 and still holds
    # its container when a1 (8 GB) arrives at 1.5.
    return Trace(
        (
            _row("a0", "a", 0, 1.0, 0.0),
            _row("a1", "a", 1, 8.0, 1.5),
            _row("b0", "b", 0, 8.0, 0.5, t1=5.0),
        ),
        {},
    )


def _cluster() -> ClusterSpec:
    return ClusterSpec("ten-gb", cpu_nodes=(CpuNodeSpec("cpu0", 4, 1, 10.0),))


def test_a_later_larger_action_is_not_rejected_in_open_loop():
    config = SimConfig(policy="fixed:1", overheads=FREE, rollout=RolloutConfig(mode="open"))
    result = simulate(_trace(), _cluster(), config)
    outcomes = {r.row.action_id: r.outcome for r in result.actions}
    assert outcomes == {"a0": "result", "a1": "result", "b0": "result"}


def test_each_action_ends_once_and_memory_never_exceeds_the_node():
    config = SimConfig(policy="tangram", overheads=FREE, rollout=RolloutConfig(mode="open"))
    result = simulate(_trace(), _cluster(), config)
    assert sorted(r.row.action_id for r in result.actions) == ["a0", "a1", "b0"]
    assert all(r.outcome == "result" for r in result.actions)
    # b0 waits for a's container (8 GB reserved from 0) to close: it starts after a1 ends,
    # and never do two 8-GB containers share the 10-GB node.
    finish = {r.row.action_id: r.finish for r in result.actions}
    start = {r.row.action_id: r.start for r in result.actions}
    assert start["b0"] >= finish["a1"] - 1e-9
