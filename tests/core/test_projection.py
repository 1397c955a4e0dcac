"""The eviction test's projection: merging the sorted running list with its own starts."""

import heapq

from hypothesis import given
from hypothesis import strategies as st

from tangram.core import Amdahl
from tangram.core.projection import projected_total
from tangram.core.scheduler import Options


def one_heap_reference(now, chosen, busy, free_left, queued):
    """The projection as the paper describes it: every finish in one heap."""
    total = sum(d for _, d in chosen)
    heap = [(max(t, now), u) for t, u in busy] + [(now + d, u) for u, d in chosen]
    heapq.heapify(heap)
    clock, avail = now, free_left
    for opt in queued:
        need = opt.units[0]
        while avail < need and heap:
            t, u = heapq.heappop(heap)
            clock, avail = max(clock, t), avail + u
        if avail < need:
            total += clock - now + opt.durations[0]
            continue
        k = opt.best_within(avail)
        total += clock - now + opt.durations[k]
        heapq.heappush(heap, (clock + opt.durations[k], opt.units[k]))
        avail -= opt.units[k]
    return total


def options(t1: float, s: float, lo: int, hi: int) -> Options:
    units = tuple(range(lo, max(lo, hi) + 1))
    curve = Amdahl(t1, s)
    return Options(units, curve.durations(units), True)


opts = st.builds(
    options, st.floats(0.1, 5.0), st.floats(0.0, 1.0), st.integers(1, 4), st.integers(1, 8)
)


@given(
    st.floats(0.0, 10.0),
    st.lists(st.tuples(st.integers(1, 4), st.floats(0.01, 5.0)), max_size=4),
    st.lists(st.tuples(st.floats(0.0, 20.0), st.integers(1, 6)), max_size=12),
    st.integers(0, 6),
    st.lists(opts, max_size=10),
)
def test_merged_projection_equals_the_one_heap_projection(now, chosen, busy, free_left, queued):
    prepared = sorted((max(t, now), u) for t, u in busy)  # what the elastic rule passes
    assert projected_total(now, chosen, prepared, free_left, queued) == one_heap_reference(
        now, chosen, busy, free_left, queued
    )
