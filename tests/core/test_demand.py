"""Static replicas sized as an operator sizes them: by expected load, within the GPUs given."""

import pytest
from hypothesis import given
from hypothesis import strategies as st

from tangram.core.demand import ServiceDemand, size_replicas

demand_lists = st.lists(
    st.builds(
        ServiceDemand,
        service=st.text("abcdefgh", min_size=1, max_size=3),
        replica_gpus=st.sampled_from([1, 2, 4, 8]),
        gpu_seconds=st.floats(0, 1e4, allow_nan=False),
    ),
    max_size=8,
    unique_by=lambda d: d.service,
)


@given(demand_lists, st.integers(0, 64))
def test_replicas_fit_the_budget_and_leave_less_than_one_more_replica(demands, total):
    replicas = size_replicas(demands, total)
    shape = {d.service: d.replica_gpus for d in demands}
    used = sum(n * shape[s] for s, n in replicas.items())
    assert used <= total
    served = [d for d in demands if replicas[d.service]]
    if served:  # no served service's replica fits in what is left
        assert total - used < min(d.replica_gpus for d in served)
    # Every service gets its first replica before any gets a second, while they fit.
    if any(n > 1 for n in replicas.values()):
        assert all(replicas[d.service] >= 1 or d.replica_gpus > total - used for d in demands)


@given(demand_lists, st.integers(0, 64))
def test_the_sizing_is_deterministic_whatever_the_order(demands, total):
    assert size_replicas(demands, total) == size_replicas(list(reversed(demands)), total)


def test_one_gpu_replicas_use_every_gpu_in_proportion_to_load():
    demands = [ServiceDemand("a", 1, 300.0), ServiceDemand("b", 1, 100.0)]
    assert size_replicas(demands, 8) == {"a": 6, "b": 2}
    assert sum(size_replicas(demands, 7).values()) == 7


def test_a_service_too_large_for_what_is_left_is_served_once_and_others_take_the_rest():
    demands = [ServiceDemand("big", 4, 100.0), ServiceDemand("small", 1, 100.0)]
    # big: 1 replica of 4 (load 25/GPU); small: its first, then all 3 left (100, 50, 33, 25).
    assert size_replicas(demands, 8) == {"big": 1, "small": 4}


def test_a_service_declared_twice_is_refused():
    with pytest.raises(ValueError, match="twice"):
        size_replicas([ServiceDemand("a", 1, 1.0), ServiceDemand("a", 2, 1.0)], 4)


@pytest.mark.parametrize(
    "kwargs, field",
    [
        ({"service": ""}, "service"),
        ({"replica_gpus": 0}, "replica_gpus"),
        ({"gpu_seconds": -1.0}, "gpu_seconds"),
    ],
)
def test_a_malformed_demand_is_refused_naming_the_field(kwargs, field):
    args = {"service": "a", "replica_gpus": 1, "gpu_seconds": 1.0} | kwargs
    with pytest.raises(ValueError, match=field):
        ServiceDemand(**args)
