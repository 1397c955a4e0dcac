"""The capacity-aware bound: tight where the arithmetic says so, never above any policy's result."""

from __future__ import annotations

import dataclasses

import numpy as np
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from tangram.bench.robustness import BASELINES
from tangram.core.cluster_file import MAX_CORES_PER_NODE
from tangram.core.resources import ClusterSpec, CpuNodeSpec, GpuNodeSpec
from tangram.sim.bounds import ActionNeed, capacity_bound, group_flow_bound, srpt_completions
from tangram.sim.config import Overheads, RolloutConfig, SimConfig
from tangram.sim.driver import SimulationStalled, simulate
from tangram.sim.instances import trace_cluster
from tangram.sim.workloads import WORKLOADS
from tangram.sim.workloads.random_instances import FAMILIES, RandomParams
from tangram.trace import Trace, TraceRow

FREE = Overheads(aoe_grant_s=0.0, container_start_s=0.0)


def cpu_trace(n: int, *, t1: float, max_units: int, gen: float = 0.0) -> Trace:
    rows = tuple(
        TraceRow(f"a{i}", f"t{i}", 0, 0, "hand", "env", gen, "cpu", t1, max_units,
                 serial_fraction=0.0)
        for i in range(n)
    )  # fmt: skip
    return Trace(rows, {})


def two_cores() -> ClusterSpec:
    return ClusterSpec("two", cpu_nodes=(CpuNodeSpec("cpu0", 2, 1, 64.0),))


def run(trace: Trace, cluster: ClusterSpec, policy: str, overheads: Overheads = FREE):
    result = simulate(trace, cluster, SimConfig(policy=policy, overheads=overheads))
    ran = [r for r in result.actions if r.outcome == "result"]
    act = float(np.mean([r.finish - r.arrival for r in ran]))
    step = float(np.mean([s.end - s.start for s in result.steps]))
    return act, step, len(result.actions) - len(ran)


def test_four_synchronised_actions_on_two_cores_queue_and_the_bound_is_tight():
    # Four actions of 4 core-s each (no serial part, up to 2 cores) arrive at once on 2 cores.
    # Alone each takes 2 s; together the pool finishes 4 core-s per 2 s: completions 2, 4, 6,
    # 8, mean ACT 5 s, step 8 s. lower-bound says 2 s and 2 s; fixed:2 achieves 5 s and 8 s.
    trace, cluster = cpu_trace(4, t1=4.0, max_units=2), two_cores()
    bound = capacity_bound(trace, cluster)
    assert bound.act_mean_s == 5.0 and bound.step_mean_s == 8.0 and bound.act_floor_s == 2.0
    assert run(trace, cluster, "lower-bound")[:2] == (2.0, 2.0)
    assert run(trace, cluster, "fixed:2")[:2] == (5.0, 8.0)


def test_a_lone_action_and_spread_arrivals_are_bounded_by_their_fastest_option_only():
    # Arrivals 10 s apart (gen_before 0, 10, 20...): nothing overlaps, the bound is the floor.
    rows = tuple(
        dataclasses.replace(r, gen_before_s=10.0 * i)
        for i, r in enumerate(cpu_trace(3, t1=4.0, max_units=2).rows)
    )
    bound = capacity_bound(Trace(rows, {}), two_cores())
    assert bound.act_mean_s == bound.act_floor_s == 2.0
    assert bound.step_mean_s == 22.0  # the last arrives at 20 and runs 2 s


def test_the_node_caps_an_actions_cores_where_lower_bound_does_not():
    # One action of up to 16 cores (no serial part, 16 s on one) on a 2-core node: 8 s at best.
    trace, cluster = cpu_trace(1, t1=16.0, max_units=16), two_cores()
    assert capacity_bound(trace, cluster).act_mean_s == 8.0
    assert run(trace, cluster, "lower-bound")[0] == 1.0  # it ignores the node's size


def test_whole_trajectories_compete_for_the_pool_beyond_their_first_actions():
    # Two trajectories of two 2-s single-core actions each, no generation, on one core. The
    # best schedule finishes one trajectory first: A1 0-2, A2 2-4, B1 4-6 (ACT 6), B2 6-8, so
    # sum ACT 2+2+6+2 = 12, mean 3. Trajectory ends are at least SRPT's 4 and 8, generations
    # are 0: the bound is 3 (the first actions alone would give only (2+4+2+2)/4 = 2.5).
    rows = tuple(
        TraceRow(f"{t}{p}", t, 0, p, "hand", "env", 0.0, "cpu", 2.0, 1, serial_fraction=0.0)
        for t in ("a", "b")
        for p in (0, 1)
    )
    one_core = ClusterSpec("one", cpu_nodes=(CpuNodeSpec("cpu0", 1, 1, 64.0),))
    bound = capacity_bound(Trace(rows, {}), one_core)
    assert bound.act_mean_s == 3.0 and bound.step_mean_s == 8.0
    act, step, _ = run(Trace(rows, {}), one_core, "fixed:1")
    assert act >= 3.0 and step >= 8.0


def test_an_open_loop_trace_is_one_group_per_domain_with_its_arrivals():
    # Open loop: 4 s of work at 0, 1 s at 1, one core, single-core actions. SRPT ends them at
    # 5 and 2 (the short one preempts); ACTs 5 and 1: mean 3. Without steps the step is NaN.
    rows = tuple(
        TraceRow(f"a{i}", f"t{i}", 0, 0, "hand", "env", 0.0, "cpu", t1, 1,
                 serial_fraction=0.0, arrival_s=arrival)
        for i, (t1, arrival) in enumerate([(4.0, 0.0), (1.0, 1.0)])
    )  # fmt: skip
    one_core = ClusterSpec("one", cpu_nodes=(CpuNodeSpec("cpu0", 1, 1, 64.0),))
    bound = capacity_bound(Trace(rows, {}), one_core, RolloutConfig(mode="open"))
    assert bound.act_mean_s == 3.0 and np.isnan(bound.step_mean_s)
    result = simulate(
        Trace(rows, {}),
        one_core,
        SimConfig(policy="fixed:1", overheads=FREE, rollout=RolloutConfig(mode="open")),
    )
    assert np.mean([r.finish - r.arrival for r in result.actions]) >= 3.0


def test_srpt_preempts_a_long_job_for_a_short_arrival():
    # A (4 s) from 0, B (1 s) at 1: B runs 1-2, A resumes and ends at 5.
    assert srpt_completions([(0.0, 4.0), (1.0, 1.0)], 1.0) == [2.0, 5.0]
    # Two units: 4 unit-s at rate 2 -> A done at 2 unless B (1 unit-s at 1) preempts: 1.5, 2.5.
    assert srpt_completions([(0.0, 4.0), (1.0, 1.0)], 2.0) == [1.5, 2.5]


def test_a_groups_flow_is_at_least_each_actions_fastest_time():
    # Areas small, durations long (no contention): the flow is the durations' sum.
    needs = [(0.0, ActionNeed(("cpu", ""), 1.0, 10.0)), (0.0, ActionNeed(("cpu", ""), 1.0, 3.0))]
    assert group_flow_bound(needs, 100.0) == 13.0


POLICIES = ("tangram", *BASELINES)


@st.composite
def instances(draw):
    family = draw(st.sampled_from(FAMILIES))
    params = RandomParams(
        family=family,
        actions_max=draw(st.integers(1, 4)),
        sigma_max=draw(st.sampled_from([0.0, 1.0, 2.0])),
        sync_share=draw(st.sampled_from([0.0, 1.0])),
        long_factor=draw(st.sampled_from([1.0, 20.0])),
        cpu_nodes_max=draw(st.integers(1, 2)),
    )
    seed = draw(st.integers(0, 10_000))
    trace = WORKLOADS["random"](params, batch=draw(st.integers(1, 12)), seed=seed)
    if draw(st.booleans()):  # a batch-synchronous last action (a reward held for the batch)
        last = {}
        for r in trace.rows:
            last[r.trajectory] = max(last.get(r.trajectory, 0), r.position)
        rows = tuple(
            dataclasses.replace(r, sync="step") if r.position == last[r.trajectory] else r
            for r in trace.rows
        )
        trace = Trace(rows, trace.meta)
    overheads = draw(st.sampled_from([FREE, Overheads()]))
    return trace, trace_cluster(trace), overheads


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(instances())
def test_no_policy_that_respects_capacity_is_ever_below_the_bound(instance):
    trace, cluster, overheads = instance
    bound = capacity_bound(trace, cluster, RolloutConfig())
    lb_act, lb_step, _ = run(trace, cluster, "lower-bound", overheads)
    assert bound.act_mean_s >= lb_act * (1 - 1e-9)
    assert bound.step_mean_s >= lb_step * (1 - 1e-9)
    assert bound.act_mean_s >= bound.act_floor_s * (1 - 1e-12)
    compared = 0
    for policy in POLICIES:
        try:
            act, step, rejected = run(trace, cluster, policy, overheads)
        except SimulationStalled:
            # Static pods held by trajectories waiting at a batch-synchronous barrier starve
            # the trajectories that have no pod yet: the replay stalls (nothing to compare).
            assert any(r.sync for r in trace.rows), policy
            continue
        if rejected:
            continue  # it ran fewer actions: its mean is over another set
        compared += 1
        assert act >= bound.act_mean_s * (1 - 1e-9) - 1e-9, policy
        assert step >= bound.step_mean_s * (1 - 1e-9) - 1e-9, policy
    assert compared >= 1  # the default at least runs every action


def test_a_gpu_call_no_node_holds_is_unrunnable_in_the_bound():
    """The bound took a model as shards over the most GPUs of any node at the most memory of
    any node: a replicated 60-GB model on 40-GB GPUs, and an 8-GPU cell of 80-GB GPUs where
    the 80-GB node has 2, counted as runnable while every policy rejects them."""
    from tangram.core.resources import GpuNodeSpec
    from tangram.sim.bounds import action_need

    cluster = ClusterSpec(
        "mixed",
        cpu_nodes=(CpuNodeSpec("cpu0", 2, 1, 64.0),),
        gpu_nodes=(GpuNodeSpec("small", 8, 16.0, 500.0), GpuNodeSpec("large", 2, 40.0, 500.0)),
    )

    def gpu(size: float, replicas: bool = False) -> TraceRow:
        return TraceRow("g", "t", 0, 0, "hand", "judge", 0.0, "gpu", 1.0, 8, serial_fraction=0.2,
                        service="m", service_size_gb=size, service_replicas=replicas)  # fmt: skip

    assert action_need(gpu(60.0, replicas=True), cluster) is None
    assert action_need(gpu(200.0), cluster) is None
    assert action_need(gpu(60.0), cluster) is not None  # 2 x 40 GB on "large", 4 x 16 on "small"


def test_lower_bound_copes_with_any_max_units_a_trace_may_hold() -> None:
    # max_units 10**11, no serial part: the bound ignores the node's size (as above) but not
    # the largest node a cluster file may declare (MAX_CORES_PER_NODE cores): t1 / 4096 s.
    # (Unbounded, the core listed every count up to 10**11 before choosing: a MemoryError.)
    trace = cpu_trace(1, t1=4096.0, max_units=10**11)
    result = simulate(trace, two_cores(), SimConfig("lower-bound"))
    (record,) = result.actions
    assert record.units == MAX_CORES_PER_NODE
    assert record.finish - record.start == 1.0


def test_lower_bound_rejects_what_the_cluster_cannot_serve() -> None:
    # A GPU call on a cluster with no GPU node and a call to an API endpoint the cluster lacks
    # "ran" under lower-bound (0 rejected, a finite ACT) though no policy can run them: the
    # floor compared against was one of actions no real schedule has. Both are rejected now,
    # as under every capacity-respecting policy; the CPU action still runs.
    rows = (
        *cpu_trace(1, t1=2.0, max_units=1).rows,
        TraceRow("g0", "tg", 0, 0, "hand", "llm", 0.0, "gpu", 3.0, 1,
                 serial_fraction=0.0, service="m", service_size_gb=1.0),
        TraceRow("p0", "tp", 0, 0, "hand", "search", 0.0, "api", 1.0, 1, service="web"),
    )  # fmt: skip
    result = simulate(Trace(rows, {}), two_cores(), SimConfig("lower-bound"))
    outcomes = {r.row.action_id: r.outcome for r in result.actions}
    assert outcomes == {"a0": "result", "g0": "rejected", "p0": "rejected"}, outcomes
    for policy in ("fixed:1",):  # (the same actions a capacity-respecting policy rejects)
        other = simulate(Trace(rows, {}), two_cores(), SimConfig(policy))
        assert {r.row.action_id: r.outcome for r in other.actions} == outcomes


def test_lower_bound_rejects_a_gpu_call_no_cell_can_hold() -> None:
    # A model larger than every cell of the cluster's GPU nodes (2 x 16 GB) ran under
    # lower-bound on a cell of its max_units, which no schedule can use.
    cluster = dataclasses.replace(
        two_cores(),
        gpu_nodes=(GpuNodeSpec("gpu0", gpus=2, gpu_memory_gb=16.0, host_memory_gb=64.0),),
    )
    row = TraceRow("g0", "tg", 0, 0, "hand", "llm", 0.0, "gpu", 3.0, 2,
                   serial_fraction=0.0, service="m", service_size_gb=100.0)  # fmt: skip
    for policy in ("lower-bound", "fixed:1"):
        (record,) = simulate(Trace((row,), {}), cluster, SimConfig(policy)).actions
        assert record.outcome == "rejected", (policy, record)
