"""scripts/profile_coding_actions.py: the fitting and aggregation of profiles (not the measured
values, which depend on the machine): two-point fits, pooling without disturbed runs, the
seeded bootstrap, Beta suggestions, and re-aggregating a saved document without Docker."""

from __future__ import annotations

import argparse
import importlib.util
import json
import math
import sys
from pathlib import Path

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

ROOT = Path(__file__).resolve().parent.parent
_spec = importlib.util.spec_from_file_location(
    "profile_coding_actions", ROOT / "scripts/profile_coding_actions.py"
)
pca = importlib.util.module_from_spec(_spec)
sys.modules["profile_coding_actions"] = pca
_spec.loader.exec_module(pca)


def amdahl(t1: float, s: float, m: int) -> float:
    return t1 * (s + (1 - s) / m)


@given(
    t1=st.floats(0.01, 1000),
    s=st.floats(0, 1),
    top=st.integers(2, 16),
)
def test_the_fit_recovers_the_serial_fraction_of_exact_amdahl_points(t1, s, top):
    fit = pca.fit_points({m: [amdahl(t1, s, m)] for m in range(1, top + 1)})
    assert fit["serial_fraction"] == pytest.approx(s, abs=1e-6)
    assert fit["t1_s"] == pytest.approx(t1, rel=1e-6)
    assert fit["rel_rms_error"] < 1e-6


@given(t1=st.floats(0.01, 1000), speedup=st.floats(1.0, 2.0))
def test_two_core_counts_determine_the_fit_exactly(t1, speedup):
    t2 = t1 / speedup
    fit = pca.fit_points({1: [t1], 2: [t2]})
    assert fit["serial_fraction"] == pytest.approx(2 * t2 / t1 - 1, abs=1e-6)
    assert fit["serial_fraction"] == pytest.approx(pca.two_point_serial_fraction(t1, t2), abs=1e-6)
    assert fit["rel_rms_error"] < 1e-6  # zero by construction: the error says nothing here


def test_a_two_core_speedup_beyond_two_is_clipped_to_a_serial_fraction_of_zero():
    fit = pca.fit_points({1: [10.0], 2: [4.0]})  # speedup 2.5: noise, or a cache effect
    assert fit["serial_fraction"] == 0.0
    assert fit["rel_rms_error"] > 0.05  # the clip shows up as an error
    assert pca.two_point_serial_fraction(10.0, 4.0) == 0.0
    assert pca.two_point_serial_fraction(10.0, 12.0) == 1.0


def test_the_fit_takes_the_median_run_so_one_slow_run_does_not_move_it():
    quiet = pca.fit_points({1: [10.0, 10.0, 10.0], 2: [6.0, 6.0, 6.0]})
    burst = pca.fit_points({1: [10.0, 10.0, 10.0], 2: [6.0, 6.0, 30.0]})
    assert burst["serial_fraction"] == pytest.approx(quiet["serial_fraction"])
    assert quiet["serial_fraction"] == pytest.approx(0.2)


def test_pooling_leaves_out_disturbed_runs_when_each_core_count_keeps_three():
    rounds = [
        {1: [(10.0, False), (30.0, True)], 2: [(6.0, False), (6.1, False)]},
        {1: [(10.2, False), (9.9, False)], 2: [(20.0, True), (5.9, False)]},
    ]
    pooled, clean = pca.pool_runs(rounds)
    assert clean
    assert pooled == {1: [10.0, 10.2, 9.9], 2: [6.0, 6.1, 5.9]}


def test_pooling_falls_back_to_every_run_when_too_few_are_undisturbed():
    rounds = [{1: [(10.0, True), (11.0, False)], 2: [(6.0, False), (6.5, False)]}]
    pooled, clean = pca.pool_runs(rounds, min_clean=2)
    assert not clean
    assert pooled == {1: [10.0, 11.0], 2: [6.0, 6.5]}
    with pytest.raises(ValueError, match="no rounds"):
        pca.pool_runs([])


def test_the_bootstrap_is_seeded_and_has_no_spread_when_every_run_agrees():
    noisy = {1: [10.0, 10.5, 9.5, 11.0], 2: [6.0, 6.6, 5.7, 7.0]}
    a = pca.bootstrap_serial_fraction(noisy, samples=200, seed=3)
    assert a == pca.bootstrap_serial_fraction(noisy, samples=200, seed=3)
    assert a != pca.bootstrap_serial_fraction(noisy, samples=200, seed=4)
    assert pca.percentile(a, 5) < pca.fit_points(noisy)["serial_fraction"] < pca.percentile(a, 95)
    flat = pca.bootstrap_serial_fraction({1: [8.0] * 3, 2: [5.0] * 3}, samples=50, seed=0)
    assert flat == [pytest.approx(0.25)] * 50


@given(st.lists(st.floats(-1e6, 1e6), min_size=1, max_size=40), st.floats(0, 100))
def test_percentile_agrees_with_numpy(values, q):
    assert pca.percentile(values, q) == pytest.approx(
        float(np.percentile(values, q)), rel=1e-9, abs=1e-6
    )


@given(alpha=st.floats(0.05, 50), beta=st.floats(0.05, 50))
def test_beta_from_moments_inverts_a_betas_mean_and_variance(alpha, beta):
    mean = alpha / (alpha + beta)
    var = alpha * beta / ((alpha + beta) ** 2 * (alpha + beta + 1))
    a, b = pca.beta_from_moments(mean, var)
    assert a == pytest.approx(alpha, rel=1e-6)
    assert b == pytest.approx(beta, rel=1e-6)


def test_beta_from_moments_refuses_what_no_beta_has():
    with pytest.raises(ValueError, match="mean"):
        pca.beta_from_moments(1.0, 0.01)
    with pytest.raises(ValueError, match="variance"):
        pca.beta_from_moments(0.5, 0.25)


def test_mixture_moments_of_a_hand_checked_case():
    # Half point mass at 0.1, half a component of mean 0.9 and variance 0.01:
    # mean 0.5; E[x^2] = (0.01 + 0.01 + 0.81) / 2 = 0.415; variance 0.415 - 0.25 = 0.165.
    mean, var = pca.mixture_moments([(1, 0.1, 0.0), (1, 0.9, 0.01)])
    assert mean == pytest.approx(0.5)
    assert var == pytest.approx(0.165)
    with pytest.raises(ValueError, match="weights"):
        pca.mixture_moments([(0, 0.5, 0.0)])


def kind_summary(name, role, s, sd):
    return {
        "name": name,
        "role": role,
        "serial_fraction": {"fit": 1.0, "bootstrap_sd": sd},
        "fit_of_minima": {"serial_fraction": s},
    }


def test_suggested_betas_match_the_measured_means():
    kinds = {
        "grep": kind_summary("grep", "env", 0.95, 0.02),
        "make": kind_summary("make", "env", 0.15, 0.05),
        "pip-install": kind_summary("pip-install", "env", 0.9, 0.03),
        "pytest": kind_summary("pytest", "reward", 0.3, 0.02),
    }
    out = pca.suggest_betas(kinds, {"grep": 3.0, "make": 1.0, "compileall": 1.0}, 10.0)
    env, reward = out["env"], out["reward"]
    assert env["weights"] == {"grep": 3.0, "make": 1.0}  # compileall was not measured
    assert env["fractions"] == {"grep": 0.95, "make": 0.15}
    assert env["mean"] == pytest.approx((3 * 0.95 + 0.15) / 4)
    # Variance: each kind spread by kind_sd (0.05) around its fraction, mixed.
    second = (3 * (0.05**2 + 0.95**2) + (0.05**2 + 0.15**2)) / 4
    assert env["sd"] == pytest.approx(math.sqrt(second - env["mean"] ** 2))
    assert env["alpha"] / (env["alpha"] + env["beta"]) == pytest.approx(env["mean"])
    var = (
        env["alpha"]
        * env["beta"]
        / ((env["alpha"] + env["beta"]) ** 2 * (env["alpha"] + env["beta"] + 1))
    )
    assert math.sqrt(var) == pytest.approx(env["sd"])
    assert (reward["alpha"], reward["beta"]) == (pytest.approx(3.0), pytest.approx(7.0))


def test_parse_weights_names_what_is_wrong():
    assert pca.parse_weights("grep=2, make=0.5") == {"grep": 2.0, "make": 0.5}
    for bad, word in (("grp=1", "grp"), ("grep", "grep"), ("make=x", "make"), ("make=-1", "make")):
        with pytest.raises(argparse.ArgumentTypeError, match=word):
            pca.parse_weights(bad)


def raw_round(rnd, t1_runs, t2_runs, disturbed_2=()):
    points = []
    for m, runs in ((1, t1_runs), (2, t2_runs)):
        flags = [m == 2 and i in disturbed_2 for i in range(len(runs))]
        points.append({"cores": m, "runs": runs, "disturbed": flags})
    fit = pca.fit_points({p["cores"]: p["runs"] for p in points})
    return {"round": rnd, "points": points, "fit": fit}


def test_re_aggregating_a_saved_document_needs_no_docker(tmp_path, capsys):
    raw = {
        "make": [
            raw_round(0, [10.0, 10.2, 9.8], [6.0, 6.1, 19.0], disturbed_2=(2,)),
            raw_round(1, [10.1, 9.9, 10.0], [5.9, 6.0, 6.2]),
        ],
        "pytest": [
            raw_round(0, [20.0, 20.0, 20.0], [13.0, 13.0, 13.0]),
            {"round": 1, "error": "the command failed at 2 core(s): exit code 1"},
        ],
        "pip-install": [{"round": 0, "error": "No space left on device"}],
    }
    saved = tmp_path / "doc.json"
    saved.write_text(json.dumps({"date_utc": "2026-11-30T15:00:00+00:00", "raw": raw}))
    assert pca.main(["--from-raw", str(saved), "--json", "--bootstrap", "100"]) == 0
    doc = json.loads(capsys.readouterr().out)
    make = doc["kinds"]["make"]
    assert make["pooled_clean_only"]
    assert make["runs_disturbed"] == 1 and make["runs_total"] == 12
    assert [p["runs"] for p in make["points"]] == [6, 5]  # the 19 s run is left out
    assert make["serial_fraction"]["fit"] == pytest.approx(2 * 6.0 / 10.0 - 1)
    assert doc["kinds"]["pytest"]["serial_fraction"]["fit"] == pytest.approx(0.3)
    assert doc["kinds"]["pytest"]["rounds_failed"] == 1  # counted, left out of the fit
    assert doc["failed_kinds"] == ["pip-install"]
    assert "pip-install" not in doc["kinds"]
    assert doc["suggested_beta"]["reward"]["mean"] == pytest.approx(0.3)
    assert doc["date_utc"] == "2026-11-30T15:00:00+00:00"
    report = pca.markdown(doc)
    assert "| make | 2 | 5 | 6.000 |" in report  # cores, runs pooled, median
    assert "undisturbed runs" in report and "pip-install" in report  # named as failed


def test_an_unknown_action_kind_is_refused_by_name(capsys):
    assert pca.main(["--actions", "grep,cargo"]) == 2
    assert "cargo" in capsys.readouterr().err


def test_the_quiet_gate_waits_for_low_cpu_pressure_and_gives_up_at_its_limit(monkeypatch):
    readings = iter([(95.0, 0), (60.0, 0), (12.0, 0), (5.0, 0)])
    monkeypatch.setattr(pca, "cpu_pressure", lambda: next(readings))
    monkeypatch.setattr(pca.time, "sleep", lambda s: None)
    waited, pressure = pca.wait_for_quiet(20.0, 60.0)
    assert pressure == 12.0  # the first reading at or under the limit
    monkeypatch.setattr(pca, "cpu_pressure", lambda: (99.0, 0))
    clock = iter(range(0, 1000, 10))
    monkeypatch.setattr(pca.time, "monotonic", lambda: float(next(clock)))
    waited, pressure = pca.wait_for_quiet(20.0, 30.0)
    assert (waited, pressure) == (30.0, 99.0)  # gave up: the run goes on, its load recorded
    monkeypatch.setattr(pca, "cpu_pressure", lambda: None)
    assert pca.wait_for_quiet(20.0, 30.0)[1] is None  # no PSI: no wait


def test_rounds_of_several_documents_pool_as_one():
    a = {"make": [raw_round(0, [10.0], [6.0])]}
    b = {"make": [raw_round(0, [10.0], [7.0]), raw_round(1, [10.0], [8.0])], "grep": []}
    c = {"make-link": [raw_round(0, [1.0], [1.0])], "make": [raw_round(0, [10.0], [6.5])]}
    merged = pca.merge_raw([a, b, c])
    # A round number names one sitting for every kind: c's round 0 is round 3 for both.
    assert [r["round"] for r in merged["make"]] == [0, 1, 2, 3]
    assert [r["round"] for r in merged["make-link"]] == [3]
    assert [r["points"][1]["runs"] for r in merged["make"]] == [[6.0], [7.0], [8.0], [6.5]]
    assert merged["grep"] == []
    doc = pca.aggregate(pca.build_parser().parse_args(["--bootstrap", "10"]), merged)
    assert doc["unmeasured_kinds"] == ["grep"] and doc["failed_kinds"] == []


def test_decomposition_is_the_serial_parts_share_of_the_one_core_time_per_round():
    whole = [raw_round(0, [10.0, 10.4], [6.0, 6.0]), raw_round(1, [20.0, 20.0], [30.0, 30.0])]
    part = [raw_round(0, [1.0, 1.04], [1.0, 1.0]), raw_round(1, [2.2, 2.2], [2.0, 2.0])]
    dec = pca.decomposition(whole, part, part_name="make-link")
    # Round 1 ran twice as slow (contention) at both: the ratio is unchanged by it.
    assert dec["rounds"] == [pytest.approx(0.1), pytest.approx(0.11)]
    assert dec["serial_fraction"] == pytest.approx(0.105)
    assert (dec["min"], dec["max"]) == (pytest.approx(0.1), pytest.approx(0.11))
    assert dec["of_minima"] == pytest.approx(1.0 / 10.0)  # fastest part / fastest whole
    assert pca.decomposition(whole, [{"round": 5, "error": "x"}], part_name="p") is None


def test_each_part_kind_runs_right_after_its_whole_kind_in_every_round():
    kinds = [pca.ACTIONS[n] for n in ("make", "make-link", "grep", "pytest", "pytest-startup")]
    for seed in range(20):
        order = [k.name for k in pca.round_order(kinds, pca.random.Random(seed))]
        assert sorted(order) == sorted(k.name for k in kinds)
        assert order[order.index("make") + 1] == "make-link"
        assert order[order.index("pytest") + 1] == "pytest-startup"
    alone = [k.name for k in pca.round_order([pca.ACTIONS["make-link"]], pca.random.Random(0))]
    assert alone == ["make-link"]
    for kind in pca.ACTIONS.values():
        assert kind.part_of is None or kind.part_of in pca.ACTIONS


def test_betas_take_the_decomposition_where_a_kind_has_one():
    fitted = {
        "role": "env",
        "serial_fraction": {"fit": 1.0, "bootstrap_sd": 0.3},
        "fit_of_minima": {"serial_fraction": 0.9},
    }
    assert pca.serial_fraction_used(fitted) == 0.9  # the fastest runs' fit
    decomposed = {
        **fitted,
        "decomposition": {"serial_fraction": 0.04, "of_minima": 0.05, "sd": 0.001},
    }
    assert pca.serial_fraction_used(decomposed) == 0.05  # of minima
