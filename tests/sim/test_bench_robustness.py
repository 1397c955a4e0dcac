"""``tangram bench robustness``: its JSON document and the worst instances it writes out."""

from __future__ import annotations

import contextlib
import io
import json
import math

import pytest

from tangram.bench.robustness import BASELINES, METRICS, dominated, figures, in_place_shares
from tangram.cli import main
from tangram.core.resources import ClusterSpec, CpuNodeSpec
from tangram.trace import Trace, TraceRow


@pytest.fixture(scope="module")
def bench(tmp_path_factory):
    out = tmp_path_factory.mktemp("worst")
    buf = io.StringIO()
    with contextlib.redirect_stdout(buf):
        code = main(["bench", "robustness", "--instances", "2", "--seed", "0", "--json",
                     "--out", str(out), "--worst", "1"])  # fmt: skip
    assert code == 0
    return json.loads(buf.getvalue()), out


def test_the_document_reports_each_family_and_figure(bench):
    doc, _ = bench
    assert doc["benchmark"] == "robustness" and doc["default"] == "tangram"
    assert doc["baselines"] == list(BASELINES) and len(doc["instances"]) == 6
    assert set(doc["families"]) == {"cpu", "gpu", "mixed"}
    for s in doc["families"].values():
        assert s["instances"] == 2 and s["compared"] + s["default_rejected"] == 2
        assert set(s["beaten"]) == set(METRICS)
        for shares in s["beaten"].values():
            assert set(shares) == {">5%", ">20%"}
            assert 0 <= shares[">20%"] <= shares[">5%"] <= 1
        # One baseline beating it on both figures is rarer than the best per figure.
        assert 0 <= s["dominated"][">20%"] <= s["dominated"][">5%"]
        assert s["dominated"][">5%"] <= min(s["beaten"][k][">5%"] for k in ("act_mean_s", "step_s"))
        for name, q in s["ratios"].items():
            assert q["p50"] <= q["p90"] <= q["max"]
            assert q["p50"] >= 1 - 1e-9, name  # the default never beats a floor


def test_each_instance_carries_every_policys_figures_and_its_best_baseline(bench):
    doc, _ = bench
    for r in doc["instances"]:
        assert set(r["runs"]) == {"tangram", "lower-bound", *BASELINES}
        for key, best in r["best"].items():
            ran = [p for p in BASELINES if not r["runs"][p]["rejected"]]
            top = min(r["runs"][p][key] for p in ran)
            assert best["margin"] == pytest.approx(r["runs"]["tangram"][key] / top - 1)
        assert r["bound"]["act_mean_s"] <= r["runs"]["tangram"]["act_mean_s"] * (1 + 1e-9)


def _run(mean: float, step: float, rejected: int = 0) -> dict:
    return {"act_mean_s": mean, "act_p99_s": mean, "step_s": step, "rejected": rejected}


def test_a_baseline_in_the_defaults_place_is_beaten_by_the_others_best():
    # Instance 1: a's mean 1.10 over b's 1.00 (+10%, beaten >5%, not >20%); a's step 1.0 is the
    # best. Instance 2: a's mean 1.30 over c's 1.00 (+30%, beaten >20%); b, rejected, is no
    # rival. Instance 3: a rejected, so a compares on two instances; b's rivals there are a
    # (rejected) and c: b's 2.0 over c's 1.0 is +100%.
    records = [
        {"runs": {"a": _run(1.10, 1.0), "b": _run(1.00, 2.0), "c": _run(1.20, 1.5)}},
        {"runs": {"a": _run(1.30, 1.0), "b": _run(0.50, 1.0, rejected=1), "c": _run(1.0, 1.0)}},
        {"runs": {"a": _run(9.00, 9.0, rejected=2), "b": _run(2.0, 1.0), "c": _run(1.0, 1.0)}},
    ]
    shares = in_place_shares(records, ["a", "b", "c"])
    assert shares["a"]["compared"] == 2
    assert shares["a"]["beaten"]["act_mean_s"] == {">5%": 1.0, ">20%": 0.5}
    assert shares["a"]["beaten"]["step_s"] == {">5%": 0.0, ">20%": 0.0}
    assert shares["b"]["compared"] == 2  # instance 1: +0% on mean (best); instance 3: +100%
    assert shares["b"]["beaten"]["act_mean_s"] == {">5%": 0.5, ">20%": 0.5}
    # c: instance 1 mean 1.20 / 1.00 = +20% (not above 20%), step 1.5 / 1.0; 2 and 3 the best.
    assert shares["c"]["beaten"]["act_mean_s"] == {">5%": pytest.approx(1 / 3), ">20%": 0.0}
    assert shares["c"]["beaten"]["step_s"][">20%"] == pytest.approx(1 / 3)


def test_the_document_says_how_each_baseline_fares_in_the_defaults_place(bench):
    doc, _ = bench
    for family, s in doc["families"].items():
        assert set(s["baselines_in_place"]) == set(BASELINES), family
        for p, v in s["baselines_in_place"].items():
            ran = [
                r
                for r in doc["instances"]
                if r["family"] == family and not r["runs"][p]["rejected"]
            ]
            assert v["compared"] == len(ran)
            for shares in v["beaten"].values():
                # None: no instance with a rival (JSON writes NaN as null).
                assert shares[">5%"] is None or 0 <= shares[">20%"] <= shares[">5%"] <= 1


def test_the_worst_instances_are_written_and_replay_to_the_same_figures(bench, capsys):
    doc, out = bench
    assert doc["worst"], "two instances per family: at least one baseline wins somewhere"
    for w in doc["worst"]:
        assert w["margin"] > 0
        record = next(
            r for r in doc["instances"] if (r["family"], r["seed"]) == (w["family"], w["seed"])
        )
        assert main(["sim", "--trace", w["trace"], "--cluster", w["cluster"], "--json",
                     "--policy", "tangram", "--policy", w["baseline"]]) == 0  # fmt: skip
        rows = json.loads(capsys.readouterr().out)["results"]
        assert rows[0]["act_mean_s"] == pytest.approx(record["runs"]["tangram"]["act_mean_s"])
        assert rows[1]["act_mean_s"] == pytest.approx(record["runs"][w["baseline"]]["act_mean_s"])
    assert len(list(out.glob("*.jsonl"))) == len(list(out.glob("*.toml"))) == len(doc["worst"])


def test_an_unknown_family_is_refused_naming_it(capsys):
    assert main(["bench", "robustness", "--families", "cpu,tpu", "--instances", "1"]) == 2
    assert "unknown family 'tpu'" in capsys.readouterr().err


def test_another_default_policy_is_set_against_the_baselines(capsys):
    assert main(["bench", "robustness", "--instances", "1", "--families", "cpu", "--json",
                 "--default", "tangram:128"]) == 0  # fmt: skip
    doc = json.loads(capsys.readouterr().out)
    assert doc["default"] == "tangram:128"
    record = doc["instances"][0]
    assert record["default"] == "tangram:128" and "tangram" not in record["runs"]
    with pytest.raises(SystemExit) as exit_:  # refused by the parser, naming --default
        main(["bench", "robustness", "--instances", "1", "--default", "nope"])
    err = capsys.readouterr().err
    assert exit_.value.code == 2 and "--default" in err and "unknown policy 'nope'" in err


def test_a_process_pool_gives_the_same_figures(bench, capsys):
    doc, _ = bench
    assert main(["bench", "robustness", "--instances", "2", "--json", "--jobs", "2"]) == 0
    pooled = json.loads(capsys.readouterr().out)
    assert pooled["instances"] == doc["instances"] and pooled["families"] == doc["families"]


def test_a_stalled_replay_counts_as_not_comparable():
    # Two trajectories whose last action waits for the whole step, one core, pods of one core
    # per trajectory: the first trajectory's pod is held at the barrier, the second never gets
    # one. The bench records every action as not run instead of failing.
    rows = tuple(
        TraceRow(f"{t}{p}", t, 0, p, "hand", "env", 0.0, "cpu", 1.0, 1,
                 serial_fraction=0.0, sync="step" if p == 1 else None)
        for t in ("a", "b") for p in (0, 1)
    )  # fmt: skip
    cluster = ClusterSpec("one", cpu_nodes=(CpuNodeSpec("cpu0", 1, 1, 64.0),))
    stalled = figures(Trace(rows, {}), cluster, "k8s-static:1")
    assert stalled.rejected == 4 and math.isnan(stalled.act_mean_s)
    assert figures(Trace(rows, {}), cluster, "tangram").rejected == 0


def test_time_slicing_can_be_charged_to_pods_and_told_threads_alike(bench, capsys):
    doc, _ = bench
    assert doc["oversubscription_slowdown"] == 0.0
    assert main(["bench", "robustness", "--instances", "2", "--families", "cpu", "--json",
                 "--oversubscription", "0.5"]) == 0  # fmt: skip
    slow = json.loads(capsys.readouterr().out)
    assert slow["oversubscription_slowdown"] == 0.5
    free = {r["seed"]: r["runs"] for r in doc["instances"] if r["family"] == "cpu"}
    for record in slow["instances"]:
        runs = record["runs"]
        # Burstable pods time-slice threads on their share: never faster when that costs.
        assert (
            runs["k8s-burstable:1"]["step_s"] >= free[record["seed"]]["k8s-burstable:1"]["step_s"]
        )
        # Pods that never oversubscribe are unchanged.
        assert runs["k8s-static:1"] == free[record["seed"]]["k8s-static:1"]
    assert any(
        r["runs"]["k8s-burstable:1"] != free[r["seed"]]["k8s-burstable:1"]
        for r in slow["instances"]
    )
    with pytest.raises(SystemExit) as exit_:  # refused as the flag is read, naming it
        main(["bench", "robustness", "--instances", "1", "--oversubscription", "1.5"])
    assert exit_.value.code == 2
    assert "argument --oversubscription: must be a share in [0, 1)" in capsys.readouterr().err


def test_dominated_means_one_baseline_better_on_both_mean_act_and_step():
    run = {"act_mean_s": 10.0, "act_p99_s": 1.0, "step_s": 100.0, "rejected": 0}

    def record(**baselines):
        return {"default": "tangram", "runs": {"tangram": run, **baselines}}

    narrow = {**run, "act_mean_s": 8.0}  # better mean only
    wide = {**run, "step_s": 80.0}  # better step only
    both = {**run, "act_mean_s": 9.0, "step_s": 90.0}
    assert not dominated(record(a=narrow, b=wide), ["a", "b"], 0.05)
    assert dominated(record(a=narrow, c=both), ["a", "c"], 0.05)
    assert not dominated(record(c=both), ["c"], 0.2)
    assert not dominated(record(c={**both, "rejected": 1}), ["c"], 0.05)


def test_every_policy_can_start_from_the_sized_replicas(bench, capsys, tmp_path):
    """``--warm-gpus plan``: the start ``sglang-sized`` alone had, given to every policy;
    the static replicas' own runs do not change, the residency-driven ones may."""
    doc, _ = bench
    assert doc["warm_gpus"] == "once"
    assert main(["bench", "robustness", "--instances", "2", "--families", "gpu", "--json",
                 "--warm-gpus", "plan", "--out", str(tmp_path), "--worst", "1"]) == 0  # fmt: skip
    planned = json.loads(capsys.readouterr().out)
    # The worst instance's command replays it from the same start, to the same figures.
    (worst,) = planned["worst"]
    assert worst["replay"].endswith("--warm-gpus plan")
    assert main([*worst["replay"].split()[1:], "--json"]) == 0
    rows = json.loads(capsys.readouterr().out)["results"]
    record = next(r for r in planned["instances"] if r["seed"] == worst["seed"])
    assert rows[0]["act_mean_s"] == pytest.approx(record["runs"]["tangram"]["act_mean_s"])
    assert planned["warm_gpus"] == "plan"
    once = {r["seed"]: r["runs"] for r in doc["instances"] if r["family"] == "gpu"}
    for record in planned["instances"]:
        assert record["runs"]["sglang-sized"] == once[record["seed"]]["sglang-sized"]
    assert any(r["runs"]["fixed:1"] != once[r["seed"]]["fixed:1"] for r in planned["instances"])
    with pytest.raises(SystemExit):
        main(["bench", "robustness", "--instances", "1", "--warm-gpus", "twice"])
    assert "--warm-gpus" in capsys.readouterr().err


def test_undefined_shares_print_as_a_dash():
    """Where the default rejected an action of every instance no instance is compared and
    every share is NaN: the tables printed "nan%" where they print every other NaN as "-"."""
    from tangram.bench.robustness import run_bench, tables
    from tangram.report import format_table

    doc = run_bench(
        instances=1, families=("gpu",), policies=("fixed:1",), default_policy="sglang-static:4"
    )
    assert doc["families"]["gpu"]["compared"] == 0
    printed = "\n".join(format_table(rows) for rows in tables(doc).values())
    assert "nan" not in printed and " - " in printed


def test_a_default_that_is_a_baseline_is_counted_once(capsys):
    """``--default fixed:1`` replays fixed:1 once (the runs are keyed by policy), yet the
    closing line counted 20 policies; it counts the 19 replayed."""
    assert main(["bench", "robustness", "--instances", "1", "--families", "cpu",
                 "--default", "fixed:1", "--quiet"]) == 0  # fmt: skip
    assert "1 families x 1 instances, 19 policies each" in capsys.readouterr().out


def test_a_worst_instances_command_runs_from_an_out_with_a_space(tmp_path, capsys):
    """The replay command of a worst instance put --out's paths in unquoted: under a folder
    with a space a shell split them and the command failed."""
    import shlex

    from tangram.bench.robustness import write_worst
    from tangram.sim.workloads.random_instances import RandomParams, random_instance

    trace, cluster = random_instance(RandomParams(family="cpu"), seed=0)
    best = {"act_mean_s": {"policy": "fixed:1", "margin": 0.5}}
    best |= {k: {"policy": None, "margin": math.nan} for k in ("act_p99_s", "step_s")}
    record = {"family": "cpu", "seed": 0, "default": "tangram", "best": best,
              "_instance": (trace, cluster)}  # fmt: skip
    [written] = write_worst([record], tmp_path / "worst runs", 1)
    argv = shlex.split(written["replay"])
    assert argv[:2] == ["tangram", "sim"] and main([*argv[1:], "--quiet"]) == 0


def test_a_worst_instances_command_charges_the_benchs_time_slicing(tmp_path, capsys):
    """With ``--oversubscription`` the worst instances' replay command left the slowdown
    out, so it replayed them to other figures than the benchmark reported."""
    import shlex

    from tangram.bench.robustness import run_bench

    doc = run_bench(instances=1, seed=1, families=("cpu",), policies=("k8s-burstable:1",),
                    out=tmp_path, worst=1, oversubscription=0.5)  # fmt: skip
    [written] = doc["worst"]
    [record] = doc["instances"]
    assert main([*shlex.split(written["replay"])[1:], "--json"]) == 0
    rows = json.loads(capsys.readouterr().out)["results"]
    assert [r["policy"] for r in rows] == ["tangram", "k8s-burstable:1"]
    for row in rows:
        reported = record["runs"][row["policy"]]
        assert row["act_mean_s"] == pytest.approx(reported["act_mean_s"], rel=1e-9)
        assert row["step_mean_s"] == pytest.approx(reported["step_s"], rel=1e-9)


def test_a_default_that_is_a_baseline_spelled_otherwise_is_replayed_once():
    # --default fixed:01 with the baseline fixed:1: both replayed on every instance (the same
    # figures twice), and the report counted one policy more than it replayed.
    from tangram.bench.robustness import replayed, run_bench

    doc = run_bench(
        instances=1, seed=1, families=("cpu",), policies=("fixed:1", "fixed:2"),
        default_policy="fixed:01",
    )  # fmt: skip
    assert doc["default"] == "fixed:1"
    assert set(doc["instances"][0]["runs"]) == {"fixed:1", "fixed:2", "lower-bound"}
    assert replayed(doc) == {"fixed:1", "fixed:2", "lower-bound"}
