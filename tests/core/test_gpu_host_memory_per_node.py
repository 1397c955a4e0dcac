"""GPU nodes of different host memory: a call runs only on a node whose host memory holds it.

A GPU call's ``memory_gb`` (host memory) was checked against the largest GPU node only, and
placement took any free cell: on a cluster of a 64-GB-host node and a 512-GB-host node, a
call needing 100 GB of host memory started on the 64-GB node (the first in order, best fit
alike), and a call whose model only the small-host node's GPUs hold was queued (the
large-host node has the memory) instead of rejected. Host memory is not reserved per call
(``Action``): a node whose host memory is smaller than the call's is simply not used.
"""

import pytest

from tangram.core import Action, Amdahl, ClusterSpec, CpuNodeSpec, GpuNodeSpec, ResourceKind
from tests.core.harness import run

CLUSTER = ClusterSpec(
    "mixed-host-memory",
    (CpuNodeSpec("c0", 4, 1, 64.0),),
    (GpuNodeSpec("lean", 4, 80.0, 64.0), GpuNodeSpec("roomy", 4, 80.0, 512.0)),
)

POLICIES = ["tangram", "tangram-paper", "fixed:1", "fixed:4", "sglang-static", "sglang-sized"]


def call(i: int, host_gb: float, *, arrival: float = 0.0, size_gb: float = 10.0) -> Action:
    return Action(
        f"a{i}",
        f"t{i}",
        ResourceKind.GPU,
        Amdahl(2.0, 0.2),
        arrival=arrival,
        max_units=4,
        memory_gb=host_gb,
        service=f"m{host_gb:g}",
        service_size_gb=size_gb,
    )


@pytest.mark.parametrize("policy", POLICIES)
def test_a_call_runs_only_where_the_host_memory_holds_it(policy):
    actions = [call(i, 100.0, arrival=0.3 * i) for i in range(4)]
    actions += [call(10 + i, 8.0, arrival=0.2 * i) for i in range(6)]
    out = run(CLUSTER, policy, actions)
    host = {n.name: n.host_memory_gb for n in CLUSTER.gpu_nodes}
    for a in actions:
        assert a.id in out.started and a.id not in out.rejected, a.id
        node = out.started[a.id].node
        assert a.memory_gb <= host[node], f"{a.id}: {a.memory_gb} GB of host memory on {node}"


@pytest.mark.parametrize("policy", POLICIES)
def test_a_lone_call_goes_to_the_node_with_the_host_memory(policy):
    out = run(CLUSTER, policy, [call(0, 100.0)])
    assert out.started["a0"].node == "roomy"


def test_no_node_with_both_the_gpus_and_the_host_memory_is_a_rejection():
    """The model needs the 4 x 80-GB GPUs of ``big-gpus`` (64 GB of host memory); the host
    memory only ``big-host`` (4 x 16 GB) has: no node can run it."""
    cluster = ClusterSpec(
        "split",
        (CpuNodeSpec("c0", 4, 1, 64.0),),
        (GpuNodeSpec("big-gpus", 4, 80.0, 64.0), GpuNodeSpec("big-host", 4, 16.0, 512.0)),
    )
    out = run(cluster, "tangram", [call(0, 100.0, size_gb=200.0)])
    assert "a0" in out.rejected
    reason = out.rejected["a0"].reason
    assert "100.0 GB of host memory" in reason and "64.0 GB" in reason, reason


def test_more_host_memory_than_any_node_is_still_rejected_naming_it():
    out = run(CLUSTER, "tangram", [call(0, 600.0)])
    assert "600.0 GB of host memory" in out.rejected["a0"].reason


def test_a_policy_starting_a_call_where_the_host_memory_is_short_is_refused():
    """The one start path refuses a GPU start on a node whose host memory is smaller than the
    call's (a policy's placement bug), as it refuses capacity that is not free."""
    from tangram.core import Scheduler
    from tangram.core.capabilities import Capabilities
    from tangram.core.policies.base import BasePolicy
    from tangram.core.state import CapacityError

    class OnLean(BasePolicy):
        name = "on-lean"
        capabilities = Capabilities()

        def schedule(self, ctx) -> None:
            for domain in list(ctx.dirty):
                for action in ctx.queue(domain):
                    ctx.start(action, "lean", 1, "the first node", gpus=(0,))

    sched = Scheduler(CLUSTER, OnLean())
    with pytest.raises(CapacityError, match="100.0 GB of host memory, lean has 64.0 GB"):
        sched.submit(call(0, 100.0), 0.0)
    assert sched.state.gpu["lean"].free_gpus == 4  # nothing taken


def test_a_dedicated_service_rejects_a_call_its_replicas_nodes_cannot_hold():
    """sglang-static deploys a service's replicas for its first call (8 GB of host memory:
    the lean node, best fit); a later call needing 100 GB has no replica on a node with that
    host memory and is rejected naming it, not started on the lean node."""
    first = call(0, 8.0)
    later = Action(
        "a1", "t1", ResourceKind.GPU, Amdahl(2.0, 0.2), arrival=0.5, max_units=4,
        memory_gb=100.0, service=first.service, service_size_gb=10.0,
    )  # fmt: skip
    out = run(CLUSTER, "sglang-static:4", [first, later])
    assert out.started["a0"].node == "lean"
    reason = out.rejected["a1"].reason
    assert "replicas are on lean" in reason and "needs 100.0 GB" in reason, reason


def test_sglang_sized_places_a_declared_services_replicas_where_its_host_memory_is():
    """A demand declaring the host memory the service's calls need (``ServiceDemand.host_gb``)
    puts its replicas on a node with it: its calls then start there, not on the lean node."""
    from tangram.core import Scheduler, Start, make_policy
    from tangram.core.demand import ServiceDemand

    sched = Scheduler(CLUSTER, make_policy("sglang-sized:1"))
    first = call(0, 100.0)
    sched.expect((ServiceDemand(first.service, 1, 10.0, 10.0, host_gb=100.0),))
    [start] = sched.submit(first, 0.0)
    assert isinstance(start, Start) and start.node == "roomy", start


def test_a_service_demand_refuses_host_memory_that_is_no_amount():
    from tangram.core.demand import ServiceDemand

    with pytest.raises(ValueError, match="host_gb must be a finite number >= 0"):
        ServiceDemand("m", 1, 1.0, host_gb=-1.0)
