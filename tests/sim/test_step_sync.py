"""Batch-synchronous actions: a step's ``sync`` actions arrive together, once all reached them."""

import pytest

from tangram.core import ClusterSpec, CpuNodeSpec
from tangram.sim.config import Overheads, SimConfig
from tangram.sim.driver import simulate
from tangram.sim.metrics import actions_frame
from tangram.trace import Trace, TraceError, TraceRow

NODE = ClusterSpec("big", cpu_nodes=(CpuNodeSpec("n", 64, 1, 1e3),))


def row(traj: str, position: int, gen: float, t1: float, sync: str | None = None, **kw) -> TraceRow:
    return TraceRow(
        action_id=f"{traj}-a{position}",
        trajectory=traj,
        step=0,
        position=position,
        task="t",
        kind="reward" if sync else "env",
        gen_before_s=gen,
        resource="cpu",
        t1_s=t1,
        max_units=1,
        serial_fraction=1.0,
        sync=sync,
        **kw,
    )


def run(rows) -> dict[str, dict]:
    ov = Overheads(aoe_grant_s=0.0, container_start_s=0.0)
    result = simulate(Trace(tuple(rows), {}), NODE, SimConfig(policy="tangram", overheads=ov))
    return actions_frame(result).set_index("action_id").to_dict("index")


def test_sync_rewards_arrive_when_the_last_trajectory_reaches_its_reward():
    # A reaches its reward at 1 + 1 + 0.5 = 2.5, B at 2 + 3 + 0.5 = 5.5, C (no env action)
    # at 0.5: all three arrive at 5.5, the instant the last one reaches it.
    acts = run(
        [
            row("A", 0, 1.0, 1.0),
            row("A", 1, 0.5, 1.0, "step"),
            row("B", 0, 2.0, 3.0),
            row("B", 1, 0.5, 1.0, "step"),
            row("C", 0, 0.5, 1.0, "step"),
        ]
    )
    assert [acts[a]["arrival"] for a in ("A-a1", "B-a1", "C-a0")] == pytest.approx([5.5] * 3)
    assert acts["A-a0"]["arrival"] == pytest.approx(1.0)  # unsynchronised actions are not held


def test_a_trajectory_without_a_sync_action_does_not_hold_the_others_once_it_ends():
    # D has no reward: it ends at 10 + 1 = 11; A's reward, reached at 2.5, waits for that.
    acts = run([row("A", 0, 1.0, 1.0), row("A", 1, 0.5, 1.0, "step"), row("D", 0, 10.0, 1.0)])
    assert acts["A-a1"]["arrival"] == pytest.approx(11.0)


def test_without_sync_each_reward_arrives_on_its_own():
    acts = run(
        [row("A", 0, 1.0, 1.0), row("A", 1, 0.5, 1.0), row("B", 0, 2.0, 3.0), row("B", 1, 0.5, 1.0)]
    )
    assert acts["A-a1"]["arrival"] == pytest.approx(2.5)
    assert acts["B-a1"]["arrival"] == pytest.approx(5.5)


def test_sync_is_refused_with_an_unknown_value_or_in_an_open_loop_trace():
    with pytest.raises(TraceError, match="sync"):
        row("A", 0, 1.0, 1.0, "batch")
    with pytest.raises(TraceError, match="sync"):
        Trace((row("A", 0, 1.0, 1.0, "step", arrival_s=0.0),), {})


def test_a_sync_reward_with_fewer_pods_than_trajectories_stalls_with_a_clear_error():
    # One 4-core pod fits; A holds it and waits at the barrier for B, whose pod never comes.
    from tangram.sim.driver import SimulationStalled

    rows = [
        row("A", 0, 1.0, 1.0),
        row("A", 1, 0.5, 1.0, "step"),
        row("B", 0, 1.0, 1.0),
        row("B", 1, 0.5, 1.0, "step"),
    ]
    small = ClusterSpec("one-pod", cpu_nodes=(CpuNodeSpec("n", 4, 1, 64.0),))
    ov = Overheads(aoe_grant_s=0.0, container_start_s=0.0, pod_start_s=0.0)
    rows = [r.__class__(**{**r.__dict__, "max_units": 4}) for r in rows]
    with pytest.raises(SimulationStalled, match="1 trajectories waited at a step barrier"):
        simulate(Trace(tuple(rows), {}), small, SimConfig(policy="k8s-static:4", overheads=ov))
    # AOE holds no cores between actions: the same trace runs under tangram.
    simulate(Trace(tuple(rows), {}), small, SimConfig(policy="tangram", overheads=ov))


def test_a_sync_reward_whose_containers_fill_the_node_stalls_naming_memory_not_pods():
    # 64 GB of node memory, containers of 40 GB: A's container holds 40 GB while A waits at
    # the barrier for B, whose container waits for memory that never frees (any policy).
    from tangram.sim.driver import SimulationStalled

    rows = [
        row("A", 0, 1.0, 1.0, memory_gb=40.0),
        row("A", 1, 0.5, 1.0, "step", memory_gb=40.0),
        row("B", 0, 1.0, 1.0, memory_gb=40.0),
        row("B", 1, 0.5, 1.0, "step", memory_gb=40.0),
    ]
    small = ClusterSpec("one-node", cpu_nodes=(CpuNodeSpec("n", 4, 1, 64.0),))
    ov = Overheads(aoe_grant_s=0.0, container_start_s=0.0, pod_start_s=0.0)
    with pytest.raises(
        SimulationStalled, match="hold the node memory that 1 actions' containers"
    ) as stalled:
        simulate(Trace(tuple(rows), {}), small, SimConfig(policy="tangram", overheads=ov))
    assert "pod" not in str(stalled.value)
