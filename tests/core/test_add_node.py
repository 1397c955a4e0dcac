"""A node that joins a running cluster (``Scheduler.add_node``): its capacity is the core's at
once, work that waited for room starts there, nothing is granted twice, and a bad node is
refused with nothing changed.

The property runs the core harness's host with one join at a random instant of a random
workload (every policy): invariants after every event, every action started xor rejected,
the same events (and the same join) give the same decisions.
"""

from __future__ import annotations

import dataclasses

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from tangram.core import (
    Action,
    Amdahl,
    ApiEndpointSpec,
    ClusterSpec,
    CpuNodeSpec,
    GpuNodeSpec,
    Inelastic,
    ResourceKind,
    Scheduler,
    Start,
    make_policy,
)
from tangram.core.state import CapacityError
from tests.core.harness import Outcome, run
from tests.core.test_policy_properties import POLICY_NAMES, clusters, workloads


def run_joining(
    cluster: ClusterSpec,
    policy: str,
    actions: list[Action],
    node: CpuNodeSpec | GpuNodeSpec,
    at: float,
) -> Outcome:
    """The harness's run with ``node`` joining at time ``at``, after that instant's events;
    the invariants are checked after every event."""
    return run(cluster, policy, actions, join=(at, node))


@st.composite
def joining_nodes(draw, cluster: ClusterSpec) -> CpuNodeSpec | GpuNodeSpec:
    """A new CPU or GPU node, under a name the cluster does not have."""
    if draw(st.booleans()):
        cores, numa = draw(st.sampled_from([(1, 1), (4, 2), (8, 2), (32, 4)]))
        return CpuNodeSpec("new", cores, numa, float(draw(st.sampled_from([2, 8, 400]))))
    gpus = draw(st.sampled_from([1, 2, 4, 8]))
    return GpuNodeSpec("new", gpus, float(draw(st.sampled_from([10, 40, 80]))), 100.0)


@st.composite
def joins(draw):
    cluster = draw(clusters())
    return cluster, draw(workloads(cluster)), draw(joining_nodes(cluster)), draw(st.integers(0, 4))


@pytest.mark.parametrize("policy", POLICY_NAMES)
@settings(max_examples=80, deadline=None)
@given(instance=joins())
def test_a_node_joining_mid_run_grants_nothing_twice_and_every_action_ends(policy, instance):
    cluster, actions, node, at = instance
    out = run_joining(cluster, policy, actions, node, at / 2)  # invariants after every event
    for a in actions:
        assert (a.id in out.started) != (a.id in out.rejected), f"{a.id}: started xor rejected"
        if a.id in out.started:
            assert a.id in out.finished
    for start in out.started.values():
        if start.node == "new":  # only work of the node's kind runs there, after it joined
            assert start.time >= at / 2
            assert start.action.resource is (
                ResourceKind.CPU if isinstance(node, CpuNodeSpec) else ResourceKind.GPU
            )


@pytest.mark.parametrize("policy", ["tangram", "tangram-paper", "k8s-static:2", "sglang-static"])
@settings(max_examples=20, deadline=None)
@given(instance=joins())
def test_the_same_events_and_join_give_the_same_decisions(policy, instance):
    cluster, actions, node, at = instance
    first = run_joining(cluster, policy, actions, node, at / 2)
    assert first.log == run_joining(cluster, policy, actions, node, at / 2).log


# ---------------------------------------------------------------- the cases, one by one


def cpu_node(name: str, cores: int = 4, memory_gb: float = 8.0) -> CpuNodeSpec:
    return CpuNodeSpec(name, cores, 1, memory_gb)


def gpu_node(name: str, gpus: int = 1, memory_gb: float = 40.0) -> GpuNodeSpec:
    return GpuNodeSpec(name, gpus, memory_gb, 100.0)


def _forced_name(node: CpuNodeSpec, name: str) -> CpuNodeSpec:
    """A frozen spec forced to a name its construction refuses."""
    object.__setattr__(node, "name", name)
    return node


def cpu_action(aid: str, traj: str, *, memory_gb: float = 8.0, arrival: float = 0.0) -> Action:
    return Action(
        aid,
        traj,
        ResourceKind.CPU,
        Amdahl(1.0, 0.1),
        arrival=arrival,
        max_units=4,
        memory_gb=memory_gb,
    )


def gpu_call(aid: str, *, max_units: int = 1, size_gb: float = 10.0, service: str = "rm") -> Action:
    return Action(
        aid,
        f"t-{aid}",
        ResourceKind.GPU,
        Amdahl(1.0, 0.1),
        max_units=max_units,
        service=service,
        service_size_gb=size_gb,
    )


def started(decisions: list, aid: str) -> Start:
    return next(d for d in decisions if isinstance(d, Start) and d.action.id == aid)


def test_a_container_waiting_for_memory_starts_its_action_on_the_new_cpu_node() -> None:
    sched = Scheduler(ClusterSpec("c", cpu_nodes=(cpu_node("a"),)), make_policy("tangram"))
    assert sched.open_trajectory("t0", 0.0, memory_gb=8.0) == "a"  # the node's memory is full
    assert sched.submit(cpu_action("x", "t1"), 1.0) == []  # no room for t1's container: waits
    assert sched.queued == 1
    decisions = sched.add_node(cpu_node("b"), 2.0)
    start = started(decisions, "x")
    assert (start.node, start.time) == ("b", 2.0)
    assert sched.trajectories["t1"].node == "b" and sched.queued == 0
    assert [n.name for n in sched.cluster.cpu_nodes] == ["a", "b"]


def test_a_trajectory_opened_after_the_join_is_placed_on_the_new_node() -> None:
    sched = Scheduler(ClusterSpec("c", cpu_nodes=(cpu_node("a"),)), make_policy("tangram"))
    sched.open_trajectory("t0", 0.0, memory_gb=6.0)
    assert sched.open_trajectory("t1", 0.5, memory_gb=6.0) is None  # full: no node has room
    assert sched.add_node(cpu_node("b", cores=16, memory_gb=64.0), 1.0) == []
    assert sched.open_trajectory("t1", 1.5, memory_gb=6.0) == "b"
    # Its actions run there, on the new node's cores (all 16 of them are options now).
    start = started(sched.submit(cpu_action("y", "t1", memory_gb=6.0, arrival=2.0), 2.0), "y")
    assert start.node == "b" and set(start.cores) <= set(range(16))
    assert sched.options.get("y") is None  # started: no longer queued
    wide = dataclasses.replace(cpu_action("z", "t1", memory_gb=6.0), max_units=16)
    assert sched.option_builder.for_action(wide, "b").units[-1] == 16


def test_a_queued_gpu_call_starts_on_the_new_gpu_node() -> None:
    sched = Scheduler(ClusterSpec("g", gpu_nodes=(gpu_node("g0"),)), make_policy("tangram"))
    first = sched.submit_many([gpu_call("a"), gpu_call("b")], 0.0)
    assert [d.action.id for d in first if isinstance(d, Start)] == ["a"]  # b waits for the GPU
    start = started(sched.add_node(gpu_node("g1"), 0.5), "b")
    assert (start.node, start.gpus, start.time) == ("g1", (0,), 0.5)
    assert sched.state.free_gpus == 0 and sched.state.spec.total_gpus == 2


def test_a_node_no_service_was_ever_resident_on_serves_calls_with_a_restore() -> None:
    sched = Scheduler(ClusterSpec("g", apis=(ApiEndpointSpec("echo", 1),)), make_policy("tangram"))
    refused = sched.submit(gpu_call("before"), 0.0)  # no GPU node yet: refused, never queued
    assert "no GPU node" in refused[0].reason
    sched.add_node(gpu_node("g0", gpus=2), 1.0)
    start = started(sched.submit(gpu_call("after", service="unseen"), 2.0), "after")
    assert start.node == "g0" and start.restore and start.est_overhead > 0


def test_a_larger_gpu_node_widens_the_cells_a_queued_call_may_use() -> None:
    sched = Scheduler(ClusterSpec("g", gpu_nodes=(gpu_node("g0", gpus=2),)), make_policy("tangram"))
    hog = dataclasses.replace(gpu_call("hog", max_units=2), curve=Inelastic(100.0))
    sched.submit(hog, 0.0)
    sched.submit(gpu_call("wide", max_units=4), 0.1)
    assert sched.options["wide"].units == (1, 2)  # the cluster's largest node has 2 GPUs
    decisions = sched.add_node(gpu_node("g1", gpus=4), 1.0)
    start = started(decisions, "wide")
    assert start.node == "g1" and start.units in (1, 2, 4)
    # A call arriving now may use the 4-GPU cells too.
    sched.submit(dataclasses.replace(gpu_call("hog2", max_units=4), curve=Inelastic(100.0)), 1.0)
    queued = gpu_call("later", max_units=4)
    sched.submit(queued, 1.1)
    if "later" in sched.options:
        assert sched.options["later"].units == (1, 2, 4)


def test_a_node_that_holds_a_model_no_other_could_admits_its_calls() -> None:
    sched = Scheduler(
        ClusterSpec("g", gpu_nodes=(gpu_node("g0", memory_gb=10.0),)), make_policy("tangram")
    )
    big = gpu_call("big", size_gb=60.0)
    assert "does not fit any cell" in sched.submit(big, 0.0)[0].reason
    sched.add_node(gpu_node("g1", gpus=8, memory_gb=10.0), 1.0)  # 8 x 10 GB hold its shards
    start = started(sched.submit(dataclasses.replace(big, id="big2"), 2.0), "big2")
    assert (start.node, start.gpus) == ("g1", tuple(range(8)))


@pytest.mark.parametrize(
    "node, names",
    [
        (cpu_node("a"), "'a' is already in cluster"),
        (gpu_node("g0"), "'g0' is already in cluster"),
        (ApiEndpointSpec("api", 1), "must be a CpuNodeSpec or a GpuNodeSpec"),
        (_forced_name(cpu_node("x"), ""), "non-empty name"),  # (the spec refuses it now)
    ],
)
def test_a_duplicate_or_foreign_node_is_refused_naming_it_and_nothing_changes(
    node: object, names: str
) -> None:
    cluster = ClusterSpec("c", cpu_nodes=(cpu_node("a"),), gpu_nodes=(gpu_node("g0"),))
    sched = Scheduler(cluster, make_policy("tangram"))
    with pytest.raises(ValueError, match=names):
        sched.add_node(node, 1.0)  # type: ignore[arg-type]
    assert sched.cluster is cluster and list(sched.state.cpu) == ["a"]
    assert list(sched.state.gpu) == ["g0"] and sched.now == 0.0


def test_a_node_of_an_invalid_shape_is_refused_naming_the_field() -> None:
    sched = Scheduler(ClusterSpec("c", cpu_nodes=(cpu_node("a"),)), make_policy("tangram"))
    bad = gpu_node("g9")
    object.__setattr__(bad, "gpus", 3)  # (a frozen spec forced out of shape)
    with pytest.raises(ValueError, match="gpus"):
        sched.add_node(bad, 1.0)
    assert not sched.state.gpu


def test_a_cpu_and_a_gpu_node_may_share_a_name_as_one_machine_does() -> None:
    sched = Scheduler(ClusterSpec("c", cpu_nodes=(cpu_node("a"),)), make_policy("tangram"))
    sched.add_node(cpu_node("m"), 1.0)
    sched.add_node(gpu_node("m", gpus=2), 1.0)
    assert list(sched.state.cpu) == ["a", "m"] and list(sched.state.gpu) == ["m"]
    with pytest.raises(ValueError, match="'m' is already"):
        sched.add_node(gpu_node("m"), 2.0)


def test_a_join_never_moves_time_backwards() -> None:
    sched = Scheduler(ClusterSpec("c", cpu_nodes=(cpu_node("a"),)), make_policy("tangram"))
    sched.submit(cpu_action("x", "t", memory_gb=1.0, arrival=5.0), 5.0)
    with pytest.raises(ValueError, match="time went backwards"):
        sched.add_node(cpu_node("b"), 1.0)


def test_capacity_of_the_new_node_is_checked_like_any_other() -> None:
    sched = Scheduler(ClusterSpec("g", gpu_nodes=(gpu_node("g0"),)), make_policy("tangram"))
    sched.add_node(gpu_node("g1", gpus=2), 0.0)
    sched.state.gpu["g1"].take((0, 1), "someone")
    with pytest.raises(CapacityError, match="held by someone"):
        sched.state.gpu["g1"].take((0,), "other")
