"""GPU nodes of different memory per GPU: a cell is one node's, and its GPUs must hold the model.

The core sized a call's cells from the cluster's most GPUs on a node and most memory per GPU
taken from different nodes, and placed calls on any free cell of that size: found fuzzing
heterogeneous GPU nodes in the simulator, a 100-GB model ran on a 4-GPU cell of 16-GB GPUs
(25 GB resident per GPU) while a node of 80-GB GPUs held it on 2; a 200-GB model no node can
hold (8 x 16 GB on one node, 2 x 80 GB on the other) was queued and placed instead of rejected.
"""

import pytest

from tangram.core import Action, Amdahl, ClusterSpec, CpuNodeSpec, GpuNodeSpec, ResourceKind
from tests.core.harness import run

CLUSTER = ClusterSpec(
    "mixed-memory",
    (CpuNodeSpec("c0", 4, 1, 64.0),),
    (GpuNodeSpec("small", 8, 16.0, 500.0), GpuNodeSpec("large", 2, 80.0, 500.0)),
)

POLICIES = ["tangram", "tangram-paper", "fixed:1", "fixed:8", "sglang-static", "sglang-sized"]


def call(i: int, size_gb: float, *, replicas: bool = False, arrival: float = 0.0) -> Action:
    return Action(
        f"a{i}",
        f"t{i}",
        ResourceKind.GPU,
        Amdahl(2.0, 0.2),
        arrival=arrival,
        max_units=8,
        service=f"m{size_gb:g}{'r' if replicas else ''}",
        service_size_gb=size_gb,
        service_replicas=replicas,
    )


@pytest.mark.parametrize("policy", POLICIES)
def test_every_cell_a_call_runs_on_holds_its_model(policy):
    actions = [call(i, 100.0, arrival=0.5 * (i % 3)) for i in range(6)]
    actions += [call(10 + i, 40.0, replicas=True, arrival=0.25 * i) for i in range(4)]
    actions += [call(20 + i, 10.0, arrival=0.1 * i) for i in range(6)]
    out = run(CLUSTER, policy, actions)
    specs = {n.name: n for n in CLUSTER.gpu_nodes}
    for a in actions:
        assert (a.id in out.started) != (a.id in out.rejected), a.id
        s = out.started.get(a.id)
        if s is None:
            continue
        per_gpu = a.service_size_gb if a.service_replicas else a.service_size_gb / len(s.gpus)
        assert per_gpu <= specs[s.node].gpu_memory_gb, (
            f"{a.id}: {a.service_size_gb} GB on {len(s.gpus)} GPUs of {s.node} "
            f"({specs[s.node].gpu_memory_gb} GB each)"
        )


@pytest.mark.parametrize("policy", POLICIES)
def test_a_model_no_node_holds_is_rejected(policy):
    out = run(CLUSTER, policy, [call(0, 200.0), call(1, 90.0, replicas=True)])
    assert set(out.rejected) == {"a0", "a1"}
    assert "does not fit any cell" in out.rejected["a0"].reason


def test_a_call_only_the_large_memory_node_holds_is_not_passed_forever():
    """The default's head reservation (a call wider than every free cell reserves one after
    waiting) compared the call's smallest size with the widest free cell of the pool: free
    8-GPU cells of 16-GB GPUs, which a 150-GB model cannot use, kept it from reserving, and
    1-GPU calls (best fit: the 2-GPU node first) took the 80-GB node's GPUs in turn while it
    waited for the whole 100-s stream (found with the per-node placement above)."""
    actions = [
        Action(
            "big",
            "tb",
            ResourceKind.GPU,
            Amdahl(1.0, 1.0),
            arrival=0.3,
            max_units=2,
            service="huge",
            service_size_gb=150.0,
        )
    ]
    actions += [
        Action(
            f"s{i}",
            f"t{i}",
            ResourceKind.GPU,
            Amdahl(1.0, 1.0),
            arrival=0.25 * i,
            max_units=1,
            service="tiny",
            service_size_gb=5.0,
        )
        for i in range(400)
    ]
    out = run(CLUSTER, "tangram", actions)
    assert out.started["big"].node == "large"
    assert out.started["big"].time < 10.0
