"""The default's grants as CFS weights (``ElasticTuning.lend_idle_cycles``), in the simulator.

Each CPU action runs in its node's CFS split (``tangram.sim.cfs``) weighted by its grant, with
its told thread count; a resize changes its weight. Random instances with serial phases and a
mix of malleable and fixed-thread programs: at every re-split the node's cores in use never
exceed the node, the busy core-seconds are exactly the one-core times (every core-second a
job receives is work), the core's grants never exceed the node, every action ends, and the
replay is deterministic.
"""

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from tangram.sim.cfs import Job, SharedNode, StaticJob
from tangram.sim.config import SimConfig
from tangram.sim.driver import Simulation
from tangram.sim.instances import trace_cluster
from tangram.sim.metrics import actions_frame, summary
from tangram.sim.workloads import WORKLOADS
from tangram.sim.workloads.random_instances import RandomParams
from tangram.trace.trace import Trace


@st.composite
def instances(draw):
    params = RandomParams(
        family="cpu",
        actions_max=draw(st.integers(1, 5)),
        sigma_max=draw(st.sampled_from([0.0, 1.0, 2.0])),
        sync_share=draw(st.sampled_from([0.0, 1.0])),
        serial_max=draw(st.sampled_from([0.3, 0.6, 0.9])),
        malleable_share=draw(st.sampled_from([0.0, 0.5, 1.0])),
    )
    trace = WORKLOADS["random"](
        params, batch=draw(st.integers(2, 24)), seed=draw(st.integers(0, 999))
    )
    return trace, trace_cluster(trace)


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(instances())
def test_weighted_grants_never_overcommit_and_conserve_work(instance):
    trace, cluster = instance
    sim = Simulation(trace, cluster, SimConfig(policy="tangram"))
    result = sim.run()
    acts = actions_frame(result)
    assert set(acts["outcome"]) == {"result"}
    assert sim._shared is not None
    for node in cluster.cpu_nodes:
        assert sim._shared[node.name].peak <= node.cores + 1e-6
    assert summary(result)["busy_core_s"] == pytest.approx(sum(r.t1_s for r in trace.rows))
    assert max(result.timeline.held_cores, default=0) <= sum(n.cores for n in cluster.cpu_nodes)
    again = actions_frame(Simulation(trace, cluster, SimConfig(policy="tangram")).run())
    assert acts.equals(again)


@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(instances())
def test_a_lone_trajectory_runs_as_on_exclusive_cores(instance):
    # One trajectory's actions run one at a time: each is alone on its node, so its weighted
    # grant runs its curve's time at its thread count (serial phase on one core, parallel
    # phase on its threads), exactly what its exclusive grant of its fastest option gives.
    trace, cluster = instance
    first = trace.rows[0].trajectory
    lone = Trace(tuple(r for r in trace.rows if r.trajectory == first), meta=trace.meta)
    weighted = actions_frame(Simulation(lone, cluster, SimConfig(policy="tangram")).run())
    exclusive = actions_frame(
        Simulation(lone, cluster, SimConfig(policy="tangram-exclusive")).run()
    )
    assert weighted["exec_s"].to_numpy() == pytest.approx(exclusive["exec_s"].to_numpy())


def test_a_static_jobs_serial_phase_lends_its_idle_core_as_a_split_job_would():
    # 4 cores. S: weight 2, 2 threads, serial phase 0-10 s (one core), parallel 10-15 s (two).
    # F: weight 2, 4 threads, 40 core-s of parallel work. While S is serial F gets 3 cores
    # (30 core-s by 10 s); then 2 cores for the last 10 core-s: F ends at 15 s. The same two
    # jobs both in the CFS split give the same end.
    static = SharedNode(4)
    static.add_static(0.0, "S", StaticJob(2.0, 2.0, begin=0.0, serial_end=10.0, end=15.0))
    static.add(0.0, "F", Job(40.0, 4.0, 2.0))
    assert static.next_finish() == pytest.approx(10.0)
    assert static.finish_due(10.0) == []  # S's phase change re-splits: F now on 2 cores
    assert static.next_finish() == pytest.approx(15.0)
    assert [k for k, _ in static.finish_due(15.0)] == ["F"]
    assert static.peak == pytest.approx(4.0)

    split = SharedNode(4)
    split.add(0.0, "S", Job(20.0, 2.0, 2.0, serial=10.0))
    split.add(0.0, "F", Job(40.0, 4.0, 2.0))
    ends = {}
    for _ in range(4):
        t = split.next_finish()
        for k, _ in split.finish_due(t):
            ends[k] = t
    assert ends == pytest.approx({"S": 15.0, "F": 15.0})


def test_weights_past_the_node_are_refused_by_name():
    node = SharedNode(2)
    node.add(0.0, "a", Job(1.0, 1.0, 2.0))
    with pytest.raises(ValueError, match="'b'.*exceed the node's 2 cores"):
        node.add(0.0, "b", Job(1.0, 1.0, 1.0))
