"""sglang-sized in the simulator: replicas deployed up front, sized by the trace's load."""

import itertools

from tangram.core import load_cluster
from tangram.core.demand import size_replicas
from tangram.sim.config import SimConfig
from tangram.sim.demand import expected_demand
from tangram.sim.driver import Simulation
from tangram.sim.metrics import actions_frame
from tangram.sim.workloads import generate


def test_replicas_follow_the_load_and_sum_to_the_gpus_given():
    trace = generate("mopd", batch=256, seed=1)
    cluster = load_cluster("paper")
    demands = expected_demand(trace, cluster)
    sim = Simulation(trace, cluster, SimConfig(policy="sglang-sized:24"))
    acts = actions_frame(sim.run())
    rule = sim.scheduler.policy.rules["gpu"]
    replicas = {s: len(cells) for s, cells in rule.replicas.items()}
    # The plan was carried out in full: every replica placed, 24 GPUs held in all (MOPD's
    # teachers need 1, 2 or 4 GPUs per replica, so 24 can be used exactly).
    assert replicas == size_replicas(demands, 24)
    shape = {d.service: d.replica_gpus for d in demands}
    assert sum(n * shape[s] for s, n in replicas.items()) == 24
    # Sized by load: among teachers of one shape, more GPU-seconds never gets fewer replicas.
    by_load = sorted(demands, key=lambda d: d.gpu_seconds)
    for lo, hi in itertools.pairwise(by_load):
        if lo.replica_gpus == hi.replica_gpus:
            assert replicas[lo.service] <= replicas[hi.service]
    assert set(acts["outcome"]) == {"result"}


def test_a_replicated_model_no_gpu_holds_gets_no_replicas_and_no_warm_copy():
    """A service run as whole replicas (``service_replicas``) needs one GPU to hold all of it.
    The declared demand sized it as shards (60 GB on 40-GB GPUs: 2-GPU replicas), so
    ``sglang-sized`` held half the pool for a service whose calls the core rejects, and
    ``--warm-gpus plan`` restored it as replicas: 60 GB resident on each 40-GB GPU."""
    from tangram.core import ClusterSpec, CpuNodeSpec, GpuNodeSpec
    from tangram.trace import Trace, TraceRow

    def row(i: int, service: str, size: float, replicas: bool) -> TraceRow:
        return TraceRow(
            action_id=f"{service}{i}",
            trajectory=f"{service}{i}",
            step=0,
            position=0,
            task="t",
            kind="k",
            gen_before_s=0.0,
            resource="gpu",
            t1_s=1.0,
            serial_fraction=0.3,
            max_units=4,
            service=service,
            service_size_gb=size,
            service_replicas=replicas,
        )

    trace = Trace(
        [row(i, "big", 60.0, True) for i in range(3)]
        + [row(i, "small", 10.0, False) for i in range(3)]
    )
    cluster = ClusterSpec(
        "c", (CpuNodeSpec("c0", 4, 1, 64.0),), (GpuNodeSpec("g0", 4, 40.0, 500.0),)
    )
    assert [d.service for d in expected_demand(trace, cluster)] == ["small"]
    for policy in ("sglang-sized", "tangram"):
        sim = Simulation(trace, cluster, SimConfig(policy=policy, warm_gpus="plan"))
        acts = actions_frame(sim.run()).set_index("action_id")
        assert all(sim.residency.used_gb(node, gpu) <= 40.0 for node, gpu in sim.residency.resident)
        assert set(acts.loc[["big0", "big1", "big2"], "outcome"]) == {"rejected"}
        assert set(acts.loc[["small0", "small1", "small2"], "outcome"]) == {"result"}
    assert "big" not in sim_rule_replicas(trace, cluster)


def sim_rule_replicas(trace, cluster) -> dict:
    sim = Simulation(trace, cluster, SimConfig(policy="sglang-sized"))
    sim.run()
    return sim.scheduler.policy.rules["gpu"].replicas


def test_replicas_go_only_on_nodes_whose_gpus_hold_the_model():
    """GPU nodes of different memory: the plan's 1-GPU replicas of a 30-GB model were placed
    (``--warm-gpus plan``, and ``sglang-sized``'s deployment) on the first node's 16-GB GPUs."""
    from tangram.core import ClusterSpec, CpuNodeSpec, GpuNodeSpec
    from tangram.trace import Trace, TraceRow

    rows = [
        TraceRow(
            f"a{i}",
            f"t{i}",
            0,
            0,
            "t",
            "k",
            0.0,
            "gpu",
            1.0,
            4,
            serial_fraction=0.3,
            service="m",
            service_size_gb=30.0,
        )  # fmt: skip
        for i in range(4)
    ]
    cluster = ClusterSpec(
        "mixed",
        (CpuNodeSpec("c0", 4, 1, 64.0),),
        (GpuNodeSpec("small", 4, 16.0, 500.0), GpuNodeSpec("large", 2, 80.0, 500.0)),
    )
    for policy in ("sglang-sized", "tangram", "fixed:1"):
        sim = Simulation(
            Trace(tuple(rows), {}), cluster, SimConfig(policy=policy, warm_gpus="plan")
        )
        acts = actions_frame(sim.run())
        cap = {"small": 16.0, "large": 80.0}
        assert all(sim.residency.used_gb(n, g) <= cap[n] for n, g in sim.residency.resident)
        assert set(acts["outcome"]) == {"result"}
        # (2 of the 16-GB GPUs hold it too: a call may run there, never on one)
        assert all(30.0 / u <= cap[n] for n, u in zip(acts["node"], acts["units"], strict=True))
