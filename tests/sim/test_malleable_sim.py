"""The simulator's malleable grants (issue 11): progress integrated grant by grant.

Random instances whose CPU actions are all malleable and perfectly parallel (serial fraction
0, so d(k) = t1 / k and every core-second is work): whatever the resizes, the busy
core-seconds are exactly the one-core times (work conserved), the held cores never exceed the
cluster's at any sample, every action ends, and the replay is deterministic.
"""

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from tangram.sim.config import SimConfig
from tangram.sim.driver import simulate
from tangram.sim.instances import trace_cluster
from tangram.sim.metrics import actions_frame, summary
from tangram.sim.workloads import WORKLOADS
from tangram.sim.workloads.random_instances import RandomParams


@st.composite
def instances(draw):
    params = RandomParams(
        family="cpu",
        serial_max=0.0,
        malleable_share=1.0,
        actions_max=draw(st.integers(1, 5)),
        sigma_max=draw(st.sampled_from([0.0, 1.0, 2.0])),
        sync_share=draw(st.sampled_from([0.0, 1.0])),
    )
    trace = WORKLOADS["random"](
        params, batch=draw(st.integers(2, 16)), seed=draw(st.integers(0, 999))
    )
    return trace, trace_cluster(trace)


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(instances(), st.sampled_from(["tangram", "tangram-exclusive"]))
def test_resized_actions_conserve_work_and_never_overcommit(instance, policy):
    # ``tangram``'s grants are CFS weights (tests/sim/test_weighted_grants.py), the exclusive
    # variant's progress is integrated at the curve's rate grant by grant.
    trace, cluster = instance
    result = simulate(trace, cluster, SimConfig(policy=policy))
    acts = actions_frame(result)
    assert set(acts["outcome"]) == {"result"}
    figures = summary(result)
    assert abs(figures["busy_core_s"] - sum(r.t1_s for r in trace.rows)) < 1e-6 * max(
        1.0, figures["busy_core_s"]
    )
    cores = sum(n.cores for n in cluster.cpu_nodes)
    assert max(result.timeline.held_cores, default=0) <= cores
    again = actions_frame(simulate(trace, cluster, SimConfig(policy=policy)))
    assert acts.equals(again)
