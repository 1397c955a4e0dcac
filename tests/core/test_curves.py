"""Elasticity curves: shapes, refusals, interpolation and fitting."""

import math

import pytest
from hypothesis import given
from hypothesis import strategies as st

from tangram.core import Amdahl, CurveError, Inelastic, Tabulated, curve_from_dict, fit_amdahl


def test_amdahl_follows_its_formula():
    c = Amdahl(10.0, 0.2)
    assert c.duration(1) == 10.0
    assert c.duration(4) == pytest.approx(10.0 * (0.2 + 0.8 / 4))
    assert c.speedup(4) == pytest.approx(1 / 0.4)


def test_inelastic_ignores_units():
    assert Inelastic(3.0).duration(1) == Inelastic(3.0).duration(64) == 3.0


@pytest.mark.parametrize(
    ("build", "message"),
    [
        (lambda: Amdahl(-1.0, 0.1), "positive"),
        (lambda: Amdahl(1.0, 1.5), r"serial_fraction must lie in \[0, 1\]"),
        (lambda: Inelastic(float("nan")), "positive finite"),
        (lambda: Tabulated(((1, 4.0), (2, 5.0))), "more units would make the action slower"),
        (lambda: Tabulated(((2, 4.0), (4, 3.0))), "must include units=1"),
        (lambda: Tabulated(((1, 4.0), (1, 3.0))), "repeated units"),
    ],
)
def test_construction_refuses_bad_curves(build, message):
    with pytest.raises(CurveError, match=message):
        build()


def test_tabulated_hits_its_points_and_stays_flat_beyond():
    c = Tabulated(((1, 8.0), (2, 4.5), (4, 2.6), (8, 2.0)))
    for u, t in c.points:
        assert c.duration(u) == pytest.approx(t)
    assert c.duration(16) == 2.0


@given(st.lists(st.floats(0.0, 0.9), min_size=1, max_size=5), st.floats(0.1, 100.0))
def test_tabulated_interpolation_is_monotone(drops, t1):
    times, t = [t1], t1
    for d in drops:
        t = t * (1 - d)
        times.append(max(t, 1e-6))
    pts = tuple((2**i, times[i]) for i in range(len(times)))
    c = Tabulated(pts)
    durations = [c.duration(m) for m in range(1, 2 ** len(drops) + 1)]
    assert all(b <= a * (1 + 1e-9) for a, b in zip(durations, durations[1:], strict=False))


@given(st.floats(0.05, 50.0), st.floats(0.0, 1.0))
def test_fit_recovers_exact_amdahl(t1, s):
    truth = Amdahl(t1, s)
    report = fit_amdahl([(m, truth.duration(m)) for m in (1, 2, 4, 8, 16)])
    assert report.curve.t1_seconds == pytest.approx(t1, rel=1e-6)
    assert report.curve.serial_fraction == pytest.approx(s, abs=1e-6)
    assert report.rel_rms_error < 1e-6


def test_fit_never_makes_more_units_slower_on_noisy_data():
    # Measurements that get slower with cores (contention): the fit must stay non-increasing.
    report = fit_amdahl([(1, 1.0), (2, 1.1), (4, 1.3)])
    c = report.curve
    assert c.duration(4) <= c.duration(1)
    assert report.rel_rms_error > 0.05


def test_fit_needs_two_distinct_unit_counts():
    with pytest.raises(CurveError, match="two or more distinct"):
        fit_amdahl([(2, 1.0), (2, 1.1)])


@pytest.mark.parametrize(
    "curve", [Amdahl(3.0, 0.25), Inelastic(2.0), Tabulated(((1, 5.0), (4, 2.0)))]
)
def test_dict_round_trip(curve):
    again = curve_from_dict(curve.to_dict())
    assert all(math.isclose(again.duration(m), curve.duration(m)) for m in (1, 2, 3, 4, 7))


def test_curve_from_dict_names_the_problem():
    with pytest.raises(CurveError, match="unknown curve kind 'cubic'"):
        curve_from_dict({"kind": "cubic"})
    with pytest.raises(CurveError, match="missing key 't1'"):
        curve_from_dict({"kind": "amdahl"})


def test_convexity_check():
    assert Amdahl(4.0, 0.3).is_convex_on(range(1, 9))
    # A table with a late jump in speedup is not convex: marginal gain rises.
    assert not Tabulated(((1, 10.0), (2, 9.5), (4, 3.0))).is_convex_on(range(1, 5))


@pytest.mark.parametrize(
    "build",
    [
        # t1 / t overflows a float: the interpolation gave NaN, even on one unit, and an action
        # on it started with est_duration NaN (the trace row's t1 check compared NaN, passed).
        lambda: Tabulated(((1, 1.0), (2, 1e-320))),
        lambda: Tabulated(((1, 1e300), (4, 1e-300))),
        # A subnormal time: 5e-324 s on one unit is 0.0 on two (Amdahl's t1 (1 - s) / m
        # underflows), and T1 / T(2) divides by zero.
        lambda: Amdahl(5e-324, 0.0),
        lambda: Inelastic(1e-320),
    ],
)
def test_curves_whose_times_leave_the_float_range_are_refused(build):
    """Found fuzzing odd tabulated shapes: a curve the constructor accepted gave durations of
    NaN or 0, which every policy then started (``est_duration`` must be positive, finite)."""
    with pytest.raises(CurveError):
        build()
