"""Allocation: the marginal-gain greedy and the DP agree where both apply; the DP is exact."""

import itertools

import pytest
from hypothesis import assume, given
from hypothesis import strategies as st

from tangram.core import Amdahl, Tabulated
from tangram.core.allocation import (
    allocate,
    allocate_dp,
    allocate_greedy,
    greedy_applies,
    total_duration,
)
from tangram.core.cells import CELL_SIZES
from tangram.core.scheduler import Options


def opts(curve, top, gpu=False):
    units = tuple(k for k in CELL_SIZES if k <= top) if gpu else tuple(range(1, top + 1))
    return Options(units, tuple(curve.duration(u) for u in units), curve.is_convex_on(units))


def brute_force(options, free):
    best = float("inf")
    for combo in itertools.product(*(range(len(o.units)) for o in options)):
        if sum(o.units[k] for o, k in zip(options, combo, strict=True)) <= free:
            best = min(best, total_duration(options, combo))
    return best


amdahl = st.builds(Amdahl, st.floats(0.1, 20.0), st.floats(0.0, 1.0))


@given(st.lists(st.tuples(amdahl, st.integers(1, 12)), min_size=1, max_size=6), st.integers(0, 30))
def test_greedy_equals_dp_on_concave_speedups(cands, extra):
    options = [opts(c, top) for c, top in cands]
    free = len(options) + extra
    assert greedy_applies(options)
    g = total_duration(options, allocate_greedy(options, free))
    d = total_duration(options, allocate_dp(options, free))
    assert g == pytest.approx(d, rel=1e-9, abs=1e-9)


@given(st.lists(st.tuples(amdahl, st.integers(1, 5)), min_size=1, max_size=4), st.integers(0, 6))
def test_dp_matches_brute_force(cands, extra):
    options = [opts(c, top) for c, top in cands]
    free = len(options) + extra
    chosen = allocate_dp(options, free)
    assert sum(o.units[k] for o, k in zip(options, chosen, strict=True)) <= free
    assert total_duration(options, chosen) == pytest.approx(brute_force(options, free))


def test_dp_is_used_and_beats_greedy_where_greedy_is_not_exact():
    # Non-convex: the second unit barely helps, the fourth helps a lot.
    lumpy = Tabulated(((1, 10.0), (2, 9.9), (3, 9.8), (4, 2.0)))
    smooth = Amdahl(6.0, 0.0)
    options = [opts(lumpy, 4), opts(smooth, 4)]
    assert not greedy_applies(options)
    chosen, method = allocate(options, 5)
    assert method == "dp"
    assert total_duration(options, chosen) == pytest.approx(2.0 + 6.0)  # lumpy 4 units, smooth 1
    assert total_duration(options, allocate_greedy(options, 5)) > 8.0


def test_gpu_cells_use_the_dp():
    options = [opts(Amdahl(8.0, 0.0), 8, gpu=True), opts(Amdahl(8.0, 0.0), 8, gpu=True)]
    chosen, method = allocate(options, 6)
    assert method == "dp"
    assert sorted(options[i].units[k] for i, k in enumerate(chosen)) == [2, 4]


def test_refuses_candidates_that_do_not_fit():
    with pytest.raises(ValueError, match="need 3 units at least; 2 free"):
        allocate([opts(Amdahl(1.0, 0.0), 2)] * 3, 2)


curves = st.one_of(
    amdahl,
    st.lists(st.floats(0.1, 10.0), min_size=1, max_size=6).map(
        lambda gains: Tabulated(
            tuple((u, 60.0 - sum(gains[:i])) for i, u in enumerate(range(1, len(gains) + 1)))
        )
    ),
)


@given(curves, st.integers(1, 12), st.booleans(), st.integers(0, 14))
def test_one_candidate_shortcut_picks_what_the_full_methods_pick(curve, top, gpu, extra):
    # allocate() skips the heap and the DP table for a single candidate; same index either way.
    options = [opts(curve, top, gpu=gpu)]
    free = options[0].units[0] + extra
    chosen, method = allocate(options, free)
    full = allocate_greedy(options, free) if method == "greedy" else allocate_dp(options, free)
    assert chosen == full


@given(
    st.lists(st.tuples(curves, st.integers(1, 12)), min_size=2, max_size=6),
    st.integers(0, 40),
)
def test_greedy_resumed_after_dropping_the_last_candidate_equals_greedy_from_scratch(cands, extra):
    # The eviction test drops the latest candidate and re-allocates by resuming the greedy.
    options = [opts(c, top) for c, top in cands]
    assume(greedy_applies(options))
    free = sum(o.units[0] for o in options) + extra
    with_all = allocate_greedy(options, free)
    fewer = options[:-1]
    assert allocate_greedy(fewer, free, resume=with_all[:-1]) == allocate_greedy(fewer, free)
