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
