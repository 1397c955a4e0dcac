"""The Kubernetes baselines as operators run them: when a pod starts, warm pools, image pulls."""

import pytest

from tangram.core import ClusterSpec, CpuNodeSpec
from tangram.sim.config import Overheads, SimConfig
from tangram.sim.driver import simulate
from tangram.sim.metrics import actions_frame
from tangram.trace import Trace, TraceRow

#: One node of 4 cores: exactly one 4-core pod fits.
ONE_POD = ClusterSpec("one-pod", cpu_nodes=(CpuNodeSpec("n", 4, 1, 64.0),))


def cpu_row(traj: str, position: int = 0, gen: float = 1.0, t1: float = 2.0) -> TraceRow:
    return TraceRow(
        action_id=f"{traj}-a{position}",
        trajectory=traj,
        step=0,
        position=position,
        task="t",
        kind="env",
        gen_before_s=gen,
        resource="cpu",
        t1_s=t1,
        max_units=4,
        serial_fraction=1.0,  # 2 s on any number of cores
        memory_gb=1.0,
    )


def run(trace: Trace, **overheads) -> dict[str, dict]:
    ov = Overheads(aoe_grant_s=0.0, container_start_s=1.0, **overheads)
    result = simulate(trace, ONE_POD, SimConfig(policy="k8s-static:4", overheads=ov))
    return actions_frame(result).set_index("action_id").to_dict("index")


def test_a_pending_pod_pays_its_startup_when_it_is_granted_cores():
    # Both trajectories open at 0; only A's pod fits. A's pod starts at 0 and is ready at 5;
    # A's action arrives at 1 (after 1 s of generation), waits 4 s for the pod, runs 2 s and
    # ends at 7, closing A and freeing its cores. B's pod is granted at 7 and is ready at 12:
    # B's action (arrived at 1) queues 6 s, pays 5 s of startup, runs 2 s, ends at 14.
    # (The old code counted B's pod from the open: it paid 0 s at 7.)
    acts = run(Trace((cpu_row("A"), cpu_row("B")), {}), pod_start_s=5.0)
    a, b = acts["A-a0"], acts["B-a0"]
    assert (a["start"], a["overhead_s"], a["finish"]) == pytest.approx((1.0, 4.0, 7.0))
    assert (b["start"], b["overhead_s"], b["finish"]) == pytest.approx((7.0, 5.0, 14.0))


def test_a_pod_pays_its_startup_once_not_per_action():
    # A's second action arrives 1 s after its first ends (at 7 + 1 = 8) and runs at once.
    acts = run(Trace((cpu_row("A", 0), cpu_row("A", 1)), {}), pod_start_s=5.0)
    assert acts["A-a1"]["overhead_s"] == pytest.approx(0.0)
    assert acts["A-a1"]["finish"] == pytest.approx(10.0)


def test_a_warm_pod_hides_the_startup_and_its_replacement_takes_pod_start():
    # One warm pod: A takes it at 0 (ready at once; its action starts at 1 with no overhead,
    # ends at 3); the replacement is ready at 0 + 5 = 5. B's pod is granted at 3 and takes the
    # replacement at 5 (sooner than a cold start at 8): B starts at 3, 2 s overhead, ends at 7.
    acts = run(Trace((cpu_row("A"), cpu_row("B")), {}), pod_start_s=5.0, warm_pods=1)
    assert acts["A-a0"]["overhead_s"] == pytest.approx(0.0)
    assert acts["A-a0"]["finish"] == pytest.approx(3.0)
    assert (acts["B-a0"]["overhead_s"], acts["B-a0"]["finish"]) == pytest.approx((2.0, 7.0))


def test_the_first_container_on_a_node_pulls_the_image_for_aoe_and_pods_alike():
    trace = Trace((cpu_row("A", gen=0.5), cpu_row("A", 1, gen=0.5)), {})
    pods = run(trace, pod_start_s=5.0, image_pull_s=3.0)
    assert pods["A-a0"]["overhead_s"] == pytest.approx(0.0 + 3.0 + 5.0 - 0.5)
    ov = Overheads(aoe_grant_s=0.0, container_start_s=1.0, image_pull_s=3.0)
    aoe = actions_frame(simulate(trace, ONE_POD, SimConfig(policy="fixed:4", overheads=ov)))
    first = aoe.set_index("action_id").loc["A-a0"]
    assert first["overhead_s"] == pytest.approx(3.0 + 1.0 - 0.5)


@pytest.mark.parametrize(
    "field, value",
    [("pod_start_s", -1.0), ("image_pull_s", float("nan")), ("warm_pods", -1), ("warm_pods", 1.5)],
)
def test_overheads_refuse_bad_values_naming_the_field(field, value):
    with pytest.raises(ValueError, match=field):
        Overheads(**{field: value})


def test_observed_placement_puts_containers_where_the_live_run_did():
    # Two 4-core nodes; the core would put both trajectories on the roomiest node at each
    # first CPU action ("a" then "b"); the live run had put both on "b".
    two = ClusterSpec("two", cpu_nodes=(CpuNodeSpec("a", 4, 1, 64.0), CpuNodeSpec("b", 4, 1, 64.0)))
    rows = tuple(
        TraceRow(**{**cpu_row(t).__dict__, "arrival_s": 1.0, "obs_node": "b"}) for t in ("A", "B")
    )
    for placement, nodes in (("policy", {"a", "b"}), ("observed", {"b"})):
        config = SimConfig(policy="fixed:4", placement=placement)
        acts = actions_frame(simulate(Trace(rows, {}), two, config))
        assert set(acts["node"]) == nodes, placement
    with pytest.raises(ValueError, match="placement"):
        SimConfig(placement="random")
