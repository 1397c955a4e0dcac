"""The default's GPU order (``gpu_cost.robust_order``) and its restore amortisation."""

import math
from types import SimpleNamespace

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from tangram.core import Action, Amdahl, ClusterSpec, GpuNodeSpec, ResourceKind
from tangram.core.options import Options
from tangram.core.policies.gpu_cost import AGING_CAP_S, ROOM_SHARE, ServiceLoad, robust_order
from tangram.sim.config import SimConfig
from tangram.sim.driver import simulate
from tangram.sim.workloads.random_instances import RandomParams, random_instance
from tests.core.harness import run


class _Queues:
    """The four Context reads ``robust_order`` makes, over plain lists."""

    def __init__(self, calls: list[tuple[str, float, float]]) -> None:
        self.fcfs: list[Action] = []
        self.by_service: dict[str, list[Action]] = {}
        self.opts: dict[str, Options] = {}
        for i, (service, arrival, duration) in enumerate(sorted(calls, key=lambda c: c[1])):
            action = Action(
                f"a{i}", f"t{i}", ResourceKind.GPU, Amdahl(duration, 0.0), service=service,
                arrival=arrival,
            )  # fmt: skip
            self.fcfs.append(action)
            self.by_service.setdefault(service, []).append(action)
            self.opts[action.id] = Options((1,), (duration,), True)

    def queue(self, domain):
        return iter(self.fcfs)

    def services_waiting(self) -> list[str]:
        return list(self.by_service)

    def queued_of_service(self, service: str):
        return iter(self.by_service[service])

    def options(self, action: Action) -> Options:
        return self.opts[action.id]


calls = st.lists(
    st.tuples(
        st.sampled_from(["7b", "14b", "72b"]),
        st.floats(0, 20, allow_nan=False),
        st.floats(0.01, 100, allow_nan=False),
    ),
    min_size=1,
    max_size=40,
)


@settings(max_examples=200, deadline=None)
@given(calls)
def test_order_is_fcfs_per_service_and_never_starves_a_call(calls):
    queues = _Queues(calls)
    order = list(robust_order(queues, {}))  # type: ignore[arg-type]
    # Every queued call exactly once; each service's calls keep their arrival order.
    assert sorted(a.id for a in order) == sorted(queues.opts)
    for service, queued in queues.by_service.items():
        assert [a for a in order if a.service == service] == queued
    # No starvation: no call goes before one that arrived more than AGING_CAP_S earlier.
    for i, later in enumerate(order):
        for earlier in order[i + 1 :]:
            assert later.arrival <= earlier.arrival + AGING_CAP_S + 1e-9


def test_a_short_call_passes_a_long_one_of_another_service_in_a_burst():
    queues = _Queues([("72b", 0.0, 20.0), ("7b", 0.0, 0.2), ("7b", 0.1, 0.2)])
    assert [a.service for a in robust_order(queues, {})] == ["7b", "7b", "72b"]  # type: ignore[arg-type]


def test_calls_with_equal_keys_keep_the_queue_order_across_services():
    # A burst of calls all longer than AGING_CAP_S / AGING: every key is arrival + 2 s. They go
    # in the GPU queue's order, not the whole first-listed service first (which let a 72B
    # model's calls take the pool while a 15B model's queued behind them).
    burst = [("72b", 0.0, 3.0), ("72b", 0.0, 2.0), ("14b", 0.0, 1.0), ("72b", 0.0, 4.0),
             ("14b", 0.0, 0.9)]  # fmt: skip
    queues = _Queues(burst)
    assert [a.id for a in robust_order(queues, {})] == ["a0", "a1", "a2", "a3", "a4"]  # type: ignore[arg-type]


def test_restores_are_amortised_over_recent_calls_only_while_the_pool_has_room():
    load = ServiceLoad()
    load.size_gb["m"] = 60.0
    load.count["m"], load.seen_at["m"] = 5.0, 0.0
    roomy = 60.0 / ROOM_SHARE + 1.0
    assert load.expected_calls("m", 0.0, queued=2, pool_gb=roomy) == 7.0
    # Crowded: a new copy is likely evicted before the recent rate's calls come.
    assert load.expected_calls("m", 0.0, queued=2, pool_gb=roomy / 2) == 2.0
    assert load.expected_calls("m", 0.0, queued=0, pool_gb=roomy / 2) == 1.0


def test_a_copys_restore_counts_only_the_calls_that_may_run_on_its_shape():
    """Three calls that may use 1 GPU at most and one that may use 4: a copy sharded over 4
    GPUs serves a quarter of them (a sharded copy serves its own cell only), one on 1 GPU all.
    The counts decay together, so the share is of recent calls."""
    load = ServiceLoad()
    opts = {1: Options((1,), (1.0,), True), 4: Options((1, 2, 4), (1.0, 0.6, 0.4), True)}
    calls = [(0.0, 1), (1.0, 1), (2.0, 4), (3.0, 1)]
    for i, (now, widest) in enumerate(calls):
        action = Action(
            f"a{i}", f"t{i}", ResourceKind.GPU, Amdahl(1.0, 0.1), service="m", max_units=widest
        )
        ctx = SimpleNamespace(arrived=[action], now=now, options=lambda a, w=widest: opts[w])
        load.observe(ctx)  # type: ignore[arg-type]
    assert load.share_at("m", 1) == 1.0
    assert load.share_at("m", 4) == pytest.approx(0.25, abs=0.01)
    assert load.share_at("m", 2) == load.share_at("m", 4)
    assert load.share_at("never-called", 4) == 1.0
    # Whole replicas: a copy on each GPU of the cell serves any call.
    wide = Action("r", "tr", ResourceKind.GPU, Amdahl(1.0, 0.1), service="rep", max_units=1,
                  service_replicas=True)  # fmt: skip
    load.observe(SimpleNamespace(arrived=[wide], now=4.0, options=lambda a: opts[1]))  # type: ignore[arg-type]
    assert load.share_at("rep", 4) == 1.0


def test_a_service_load_reads_as_the_gpus_its_recent_calls_keep_busy():
    # Calls worth 10 GPU-seconds over the first 10 s: about one GPU busy (the window is
    # 60 x (1 - e^(-10/60)) = 9.21 s); a minute without calls later, e^-1 of that.
    load = ServiceLoad()
    load.work["m"], load.first_seen["m"], load.seen_at["m"] = 10.0, 0.0, 10.0
    assert load.busy_gpus("m", 10.0) == pytest.approx(10.0 / 9.21, rel=1e-3)
    assert load.busy_gpus("m", 70.0) == pytest.approx(
        10.0 / (60 * (1 - math.exp(-70 / 60))) / math.e, rel=1e-3
    )
    assert load.busy_gpus("never-called", 10.0) == 0.0


@st.composite
def gpu_pools(draw):
    """Small GPU pools shared by services of several sizes (one needs two 80-GB GPUs), calls
    in bursts with heavy-tailed times: where the default reserves cells (``gpu_waits``)."""
    nodes = draw(st.lists(st.sampled_from([2, 4, 8]), min_size=1, max_size=2))
    cluster = ClusterSpec(
        "pool", gpu_nodes=tuple(GpuNodeSpec(f"g{i}", n, 80.0, 1024.0) for i, n in enumerate(nodes))
    )
    sizes = (15.2, 29.6, 65.6, 145.4)
    calls = []
    for i in range(draw(st.integers(1, 24))):
        m = draw(st.integers(0, 3))
        calls.append(
            Action(
                f"a{i}",
                f"t{draw(st.integers(0, 5))}",
                ResourceKind.GPU,
                Amdahl(10 ** draw(st.floats(-1.5, 2.3)), draw(st.floats(0.0, 0.5))),
                arrival=float(draw(st.integers(0, 12))) / 4,
                max_units=draw(st.sampled_from([1, 2, 4, 8])),
                service=f"m{m}",
                service_size_gb=sizes[m],
            )
        )
    return cluster, calls


@settings(max_examples=150, deadline=None)
@given(instance=gpu_pools())
def test_reservations_keep_every_invariant_and_every_call_ends(instance):
    cluster, calls = instance
    out = run(cluster, "tangram", calls)  # capacity and cell invariants after every event
    for a in calls:
        assert (a.id in out.started) != (a.id in out.rejected)
        if a.id in out.started:
            assert a.id in out.finished and out.started[a.id].time >= a.arrival
    assert run(cluster, "tangram", calls).log == out.log


@settings(max_examples=20, deadline=None)
@given(seed=st.integers(0, 10_000))
def test_every_call_of_a_random_gpu_instance_ends_under_the_default(seed):
    # The simulator adds restores, evictions and residency, which the core harness does not.
    trace, cluster = random_instance(RandomParams(family="gpu"), seed=seed)
    result = simulate(trace, cluster, SimConfig(policy="tangram", timeline=False))
    assert len(result.actions) == len(trace)
    assert all(r.outcome == "result" and r.start >= r.arrival for r in result.actions)
