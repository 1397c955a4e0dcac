"""Invariants every policy keeps, on random clusters, queues and event orders (hypothesis).

The harness runs the core with exact durations and checks, after every event: no node's cores,
memory, GPU cells or API slots over-committed; GPU placements aligned and disjoint; CPU actions
on their container's node. Then: every action started or rejected (no starvation), each once;
the same events give the same decisions.
"""

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
)
from tangram.core.fastpaths import FULL
from tangram.core.policies import POLICIES
from tests.core.harness import run

POLICY_NAMES = [p if p not in ("fixed",) else "fixed:4" for p in POLICIES] + [
    "fixed:1",
    "k8s-static:2",
]


@st.composite
def clusters(draw) -> ClusterSpec:
    cpu = tuple(
        CpuNodeSpec(f"c{i}", cores, numa, float(draw(st.sampled_from([4, 8, 64]))))
        for i, (cores, numa) in enumerate(
            draw(
                st.lists(st.sampled_from([(2, 1), (4, 2), (8, 2), (16, 4)]), min_size=1, max_size=3)
            )
        )
    )
    gpu = tuple(
        GpuNodeSpec(f"g{i}", gpus, float(mem), 100.0)
        for i, (gpus, mem) in enumerate(
            draw(
                st.lists(
                    st.tuples(st.sampled_from([1, 2, 4, 8]), st.sampled_from([10, 40])), max_size=2
                )
            )
        )
    )
    apis = tuple(
        ApiEndpointSpec(f"api{i}", c, r, b)
        for i, (c, r, b) in enumerate(
            draw(
                st.lists(
                    st.tuples(st.integers(1, 3), st.sampled_from([None, 2.0]), st.integers(1, 2)),
                    max_size=1,
                )
            )
        )
    )
    return ClusterSpec("random", cpu, gpu, apis)


@st.composite
def workloads(draw, cluster: ClusterSpec) -> list[Action]:
    kinds = [ResourceKind.CPU]
    if cluster.gpu_nodes:
        kinds.append(ResourceKind.GPU)
    if cluster.apis:
        kinds.append(ResourceKind.API)
    n = draw(st.integers(1, 14))
    actions = []
    for i in range(n):
        kind = draw(st.sampled_from(kinds))
        traj = f"t{draw(st.integers(0, 4))}"
        arrival = float(draw(st.integers(0, 6))) / 2
        t1 = draw(st.floats(0.1, 5.0))
        if kind is ResourceKind.CPU:
            curve = Amdahl(t1, draw(st.floats(0.0, 1.0)))
            actions.append(
                Action(
                    f"a{i}",
                    traj,
                    kind,
                    curve,
                    arrival=arrival,
                    max_units=draw(st.integers(1, 12)),
                    memory_gb=float(draw(st.sampled_from([0, 1, 3, 200]))),
                    # Live CPU actions name their container's node; some name another, or none.
                    node=draw(st.sampled_from([None, *(c.name for c in cluster.cpu_nodes)])),
                    # Some may be resized while they run (the default policy grows and
                    # shrinks them; the harness integrates their progress grant by grant).
                    malleable=draw(st.booleans()),
                )
            )
        elif kind is ResourceKind.GPU:
            curve = Amdahl(t1, draw(st.floats(0.0, 1.0)))
            actions.append(
                Action(
                    f"a{i}",
                    traj,
                    kind,
                    curve,
                    arrival=arrival,
                    max_units=draw(st.sampled_from([1, 2, 4, 8])),
                    service=f"m{(m := draw(st.integers(0, 3)))}",
                    service_size_gb=float((5, 30, 70, 500)[m]),
                )
            )
        else:
            actions.append(
                Action(
                    f"a{i}",
                    traj,
                    kind,
                    Inelastic(t1),
                    arrival=arrival,
                    service=draw(st.sampled_from([a.name for a in cluster.apis] + ["nope"])),
                )
            )
    return actions


@st.composite
def instances(draw):
    cluster = draw(clusters())
    return cluster, draw(workloads(cluster))


@pytest.mark.parametrize("policy", POLICY_NAMES)
@settings(max_examples=60)
@given(instance=instances())
def test_invariants_and_every_action_ends(policy, instance):
    cluster, actions = instance
    out = run(cluster, policy, actions)  # invariants are asserted inside, after every event
    for a in actions:
        assert (a.id in out.started) != (a.id in out.rejected), (
            f"{a.id} must be started xor rejected"
        )
        if a.id in out.started:
            assert a.id in out.finished
            assert out.started[a.id].time >= a.arrival
    for r in out.rejected.values():
        assert r.reason


@pytest.mark.parametrize("policy", POLICY_NAMES)
@settings(max_examples=25)
@given(instance=instances())
def test_same_events_give_same_decisions(policy, instance):
    cluster, actions = instance
    assert run(cluster, policy, actions).log == run(cluster, policy, actions).log


@st.composite
def one_shot(draw):
    """All actions arrive at t=0 on one node and all fit at one unit (n <= cores, n <= window)."""
    cores = draw(st.sampled_from([2, 4, 8, 16]))
    cluster = ClusterSpec("one", cpu_nodes=(CpuNodeSpec("n", cores, 1, 1000.0),))
    n = draw(st.integers(1, cores))
    actions = [
        Action(
            f"a{i}",
            f"t{i}",
            ResourceKind.CPU,
            Amdahl(draw(st.floats(0.1, 10.0)), draw(st.floats(0.0, 1.0))),
            max_units=draw(st.integers(1, 16)),
        )
        for i in range(n)
    ]
    return cluster, actions


@settings(max_examples=200)
@given(instance=one_shot())
def test_tangram_total_act_no_worse_than_fixed_1_on_one_shot(instance):
    cluster, actions = instance
    tangram = run(cluster, "tangram", actions).total_act(actions)
    fixed = run(cluster, "fixed:1", actions).total_act(actions)
    assert tangram <= fixed * (1 + 1e-9) + 1e-9


@st.composite
def lone_arrivals(draw):
    """CPU actions arriving one at a time (distinct times) into containers placed beforehand."""
    cluster = ClusterSpec(
        "cpu",
        tuple(
            CpuNodeSpec(f"c{i}", cores, numa, 64.0)
            for i, (cores, numa) in enumerate(
                draw(st.lists(st.sampled_from([(4, 2), (8, 2), (16, 4)]), min_size=1, max_size=2))
            )
        ),
    )
    n = draw(st.integers(1, 30))
    times = sorted(draw(st.lists(st.floats(0.0, 10.0), min_size=n, max_size=n, unique=True)))
    actions = [
        Action(
            f"a{i}",
            f"t{draw(st.integers(0, 5))}",
            ResourceKind.CPU,
            Amdahl(draw(st.floats(0.1, 5.0)), draw(st.floats(0.0, 1.0))),
            arrival=t,
            max_units=draw(st.integers(1, 16)),
            memory_gb=1.0,
            node=draw(st.sampled_from([None, None, *(c.name for c in cluster.cpu_nodes)])),
        )
        for i, t in enumerate(times)
    ]
    return cluster, actions


@pytest.mark.parametrize(
    "policy", ["tangram", "tangram:2", "fixed:2", "k8s-static:2", "lower-bound"]
)
@settings(max_examples=60)
@given(instance=st.one_of(instances(), lone_arrivals()), open_first=st.booleans())
def test_the_speed_shortcuts_decide_what_the_full_pass_decides(policy, instance, open_first):
    """Every shortcut of ``tangram.core.fastpaths`` on (the default) or off: same decisions."""
    cluster, actions = instance
    short = run(cluster, policy, actions, open_first=open_first)
    full = run(cluster, policy, actions, open_first=open_first, fast=FULL)
    assert short.log == full.log
    assert short.started == full.started  # the same cores, reasons and estimates
