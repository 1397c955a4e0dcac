"""The default's GPU order (``gpu_cost.robust_order``) and its restore amortisation."""

import math

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from tangram.core import Action, Amdahl, ResourceKind
from tangram.core.options import Options
from tangram.core.policies.gpu_cost import AGING_CAP_S, ROOM_SHARE, ServiceLoad, robust_order


class _Queues:
    """The three Context reads ``robust_order`` makes, over plain lists."""

    def __init__(self, calls: list[tuple[str, float, float]]) -> None:
        self.by_service: dict[str, list[Action]] = {}
        self.opts: dict[str, Options] = {}
        for i, (service, arrival, duration) in enumerate(sorted(calls, key=lambda c: c[1])):
            action = Action(
                f"a{i}", f"t{i}", ResourceKind.GPU, Amdahl(duration, 0.0), service=service,
                arrival=arrival,
            )  # fmt: skip
            self.by_service.setdefault(service, []).append(action)
            self.opts[action.id] = Options((1,), (duration,), True)

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


def test_restores_are_amortised_over_recent_calls_only_while_the_pool_has_room():
    load = ServiceLoad()
    load.size_gb["m"] = 60.0
    load.count["m"], load.seen_at["m"] = 5.0, 0.0
    roomy = 60.0 / ROOM_SHARE + 1.0
    assert load.expected_calls("m", 0.0, queued=2, pool_gb=roomy) == 7.0
    # Crowded: a new copy is likely evicted before the recent rate's calls come.
    assert load.expected_calls("m", 0.0, queued=2, pool_gb=roomy / 2) == 2.0
    assert load.expected_calls("m", 0.0, queued=0, pool_gb=roomy / 2) == 1.0


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
