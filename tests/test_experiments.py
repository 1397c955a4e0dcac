"""The experiment scripts (experiments/): a smoke run writes its tables, figure and summary, and
the shared helpers aggregate and format as documented."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pandas as pd
import pytest

ROOT = Path(__file__).resolve().parents[1]
EXPERIMENTS = ROOT / "experiments"
sys.path.insert(0, str(EXPERIMENTS))

import common  # noqa: E402
import run_all  # noqa: E402


def run_smoke(script: str, out: Path) -> None:
    subprocess.run(
        [sys.executable, str(EXPERIMENTS / script), "--smoke", "--out", str(out)],
        check=True,
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=120,
    )


def test_coding_act_smoke_writes_outputs(tmp_path):
    run_smoke("coding_act.py", tmp_path)
    for name in (
        "coding_act.csv",
        "coding_act_runs.csv",
        "coding_act.png",
        "coding_act.md",
        "coding_act.claims.csv",
        "run_times.csv",
    ):
        assert (tmp_path / name).stat().st_size > 0, name
    agg = pd.read_csv(tmp_path / "coding_act.csv")
    assert set(agg.variant) == {"tangram", "k8s-static"}
    assert set(agg.batch) == {32}
    for col in (
        "act_mean_s_mean",
        "act_mean_s_std",
        "exec_mean_s_mean",
        "queue_mean_s_mean",
        "overhead_mean_s_mean",
        "env_act_mean_s_mean",
        "reward_act_mean_s_mean",
        "ratio_all_mean",
        "ratio_env_mean",
        "ratio_reward_mean",
        "seeds",
    ):
        assert col in agg.columns, col
    assert (agg.seeds == 1).all()
    # the breakdown adds up to the ACT
    parts = agg.exec_mean_s_mean + agg.queue_mean_s_mean + agg.overhead_mean_s_mean
    assert (abs(parts - agg.act_mean_s_mean) < 1e-4).all()  # CSV keeps 6 digits
    runs = pd.read_csv(tmp_path / "coding_act_runs.csv")
    for col in ("workload", "batch", "seed", "variant", "policy", *common.SUMMARY_COLUMNS):
        assert col in runs.columns, col
    assert len(runs) == 2 and (runs.rejected == 0).all()
    # the paper's claims are reproduced with the paper's policy unless --policy says otherwise
    assert set(runs[runs.variant == "tangram"].policy) == {"tangram-paper"}
    claims = pd.read_csv(tmp_path / "coding_act.claims.csv")
    assert list(claims.columns[:4]) == ["claim", "metric", "paper", "ours"]
    md = (tmp_path / "coding_act.md").read_text()
    assert "Paper vs ours" in md and "![coding_act](coding_act.png)" in md
    assert "4.3x" in md  # the paper's figure is beside ours
    # per-action and timeline Parquet for the notebook, small
    for policy in ("tangram", "k8s-static"):
        acts = pd.read_parquet(tmp_path / f"coding_b32_s0_{policy}.actions.parquet")
        assert {"kind", "queue_s", "overhead_s", "exec_s", "act_s", "units"} <= set(acts.columns)
        tl = pd.read_parquet(tmp_path / f"coding_b32_s0_{policy}.timeline.parquet")
        assert {"time", "held_cores", "busy_cores"} <= set(tl.columns)


def test_aggregate_and_paired_ratio():
    runs = pd.DataFrame(
        {
            "batch": [1, 1, 1, 1],
            "seed": [0, 0, 1, 1],
            "variant": ["a", "b", "a", "b"],
            "x": [2.0, 1.0, 6.0, 2.0],
        }
    )
    agg = common.aggregate(runs, ["batch", "variant"], ["x", "missing"])
    a = agg[agg.variant == "a"].iloc[0]
    assert a.x_mean == 4.0 and a.seeds == 2 and "missing_mean" not in agg.columns
    r = common.paired_ratio(runs, ["batch"], "x", "a", "b").iloc[0]
    assert r.ratio_mean == pytest.approx(2.5) and r.seeds == 2  # (2/1 + 6/2) / 2


def test_md_table_and_pm():
    text = common.md_table([{"a": 1.23456, "b": "x|y"}])
    assert text.splitlines()[0] == "| a | b |"
    assert "1.235" in text and "x\\|y" in text
    assert common.pm(1.0, 0.5, 2, "x") == "1.00 ± 0.50x"
    assert common.pm(1.0, float("nan"), 1) == "1.0"
    assert common.pm(float("nan")) == "n/a"


def test_run_all_updates_doc_table(tmp_path):
    pd.DataFrame(
        [
            {
                "claim": "c",
                "metric": "m",
                "paper": "4.3x",
                "ours": "1.5x",
                "ours_mean": 1.5,
                "ours_std": 0.1,
                "experiment": "coding_act",
                "command": "python experiments/coding_act.py",
            }
        ]
    ).to_csv(tmp_path / "coding_act.claims.csv", index=False)
    doc = tmp_path / "doc.md"
    doc.write_text(f"intro\n{run_all.BEGIN}\nold\n{run_all.END}\noutro\n")
    assert run_all.update_doc(tmp_path, doc)
    text = doc.read_text()
    assert "old" not in text and "| 1 | c (m) | 4.3x | 1.5x |" in text
    assert text.startswith("intro") and text.endswith("outro\n")


def test_run_all_table_shows_the_default_policy_beside_the_papers(tmp_path):
    def claims(folder: Path, ours: str, policy: str) -> None:
        folder.mkdir(exist_ok=True)
        row = {"claim": "c", "metric": "m", "paper": "4.3x", "ours": ours, "ours_mean": 1.0}
        row |= {"ours_std": 0.1, "default": "", "experiment": "coding_act", "policy": policy}
        row["command"] = "python experiments/coding_act.py"
        pd.DataFrame([row]).to_csv(folder / "coding_act.claims.csv", index=False)

    claims(tmp_path, "1.5x", "tangram-paper")
    claims(tmp_path / "default", "1.7x", "tangram")
    assert run_all.SIDE_BY_SIDE[0] == "coding_act"
    table = run_all.results_table(run_all.gather(tmp_path), None)
    assert "ours, `tangram-paper`" in table.splitlines()[0]
    assert "| 1 | c (m) | 4.3x | 1.5x | 1.7x |" in table


def test_side_by_side_plots_the_ratio_claims_under_both_policies(tmp_path):
    import side_by_side

    claims = pd.DataFrame(
        {
            "experiment": ["coding_act", "coding_act", "fixed_dop"],
            "claim": ["a", "b", "c"],
            "ours": ["1.58 ± 0.00x", "0.974 / 0.000 / 0.010", "yes"],
            "ours_mean": ["1.58", "0.98", ""],
            "default_mean": ["1.60", "0.97", ""],
        }
    )
    assert list(side_by_side.ratio_claims(claims).claim) == ["a"]  # only the ratios
    path = side_by_side.claims_figure(claims, tmp_path, {"coding_act": 1})
    assert path is not None and path.stat().st_size > 0


def test_bound_gap_smoke_reports_both_policies_over_both_bounds(tmp_path):
    run_smoke("bound_gap.py", tmp_path)
    ratios = pd.read_csv(tmp_path / "bound_gap.ratios.csv")
    # The default also unannounced: never told that a step's calls are all in.
    assert set(ratios.policy) == {"tangram-paper", "tangram", "tangram-unannounced"}
    runs = pd.read_csv(tmp_path / "bound_gap_runs.csv")
    unannounced = runs[runs.variant == "tangram-unannounced"]
    assert len(unannounced) and (unannounced["rollout.announce_step_end"] == False).all()  # noqa: E712
    assert set(ratios.workload) == {"coding", "mopd", "deepsearch"}
    # both are lower bounds on the mean ACT of any schedule (no execution noise by default)
    assert (ratios.over_lower_bound >= 1 - 1e-9).all()
    assert (ratios.over_capacity_bound >= 1 - 1e-9).all()
    claims = pd.read_csv(tmp_path / "bound_gap.claims.csv", keep_default_na=False)
    assert (claims.default != "").all() and (claims.ours != "").all()


def test_robustness_smoke_reports_both_policies_per_family(tmp_path):
    run_smoke("robustness.py", tmp_path)
    instances = pd.read_csv(tmp_path / "robustness_instances.csv")
    assert set(instances.policy) == {"tangram-paper", "tangram"}
    assert set(instances.family) == {"cpu", "gpu", "mixed"}
    # The same instances under both policies, each with the best baseline per figure named.
    per_policy = instances.groupby("policy").seed.apply(sorted)
    assert per_policy["tangram"] == per_policy["tangram-paper"]
    assert instances.best_act_mean_s.notna().all()
    # A policy never beats the capacity-aware bound.
    assert (instances.act_over_capacity_bound >= 1 - 1e-9).all()
    runs = pd.read_csv(tmp_path / "robustness_runs.csv")
    for key in ("act_mean_s", "step_s", "act_p99_s"):
        assert runs[f"{key}_over5"].between(0, 1).all()
        # At least as many instances are beaten by 5% as by 20%.
        assert (runs[f"{key}_over5"] >= runs[f"{key}_over20"]).all()
    # Every baseline in the default's place, per family and seed set, with its shares.
    in_place = pd.read_csv(tmp_path / "robustness_in_place.csv")
    assert set(in_place.family) == {"cpu", "gpu", "mixed"}
    assert in_place.groupby("family").baseline.nunique().min() == 18
    for key in ("act_mean_s", "step_s"):
        shares = in_place[f"{key}_over5"].dropna()
        assert shares.between(0, 1).all()
        assert (shares >= in_place.loc[shares.index, f"{key}_over20"]).all()
    assert "## Each baseline in the default's place" in (tmp_path / "robustness.md").read_text()
    assert "## The online limit" in (tmp_path / "robustness.md").read_text()
    claims = pd.read_csv(tmp_path / "robustness.claims.csv", keep_default_na=False)
    assert len(claims) == 3 * 2 * 2 and (claims.default != "").all()
    assert (tmp_path / "robustness.png").stat().st_size > 0


def test_sensitivity_smoke_varies_each_assumption_and_reports_ratios(tmp_path):
    run_smoke("sensitivity.py", tmp_path)
    ratios = pd.read_csv(tmp_path / "sensitivity.ratios.csv")
    assert set(ratios.section) == {"pods", "serial", "bursts", "popularity"}
    pods = ratios[ratios.section == "pods"].set_index("baseline").ratio_mean
    # A slower pod start can only make the static pods' ACT longer, tangram's being the same.
    starts = [pods[f"k8s-static:4 start {s:g}s"] for s in (0, 5, 10, 30, 60)]
    assert starts == sorted(starts) and starts[-1] > starts[0]
    runs = pd.read_csv(tmp_path / "sensitivity_runs.csv")
    assert (runs.rejected == 0).all()
    pop = runs[runs.section == "popularity"]
    assert pop.offered_load.between(0, 1).all()  # busy <= provisioned GPU-seconds
    md = (tmp_path / "sensitivity.md").read_text()
    assert "offered load" in md and "Pod startup and pod shape" in md


def test_slim_timeline_keeps_held_unknown_for_a_policy_that_ignores_capacity():
    """``lower-bound`` takes nothing from the pool, so the simulator's timeline has its held
    units NaN (unknown); the experiments' trimmed timeline filled them with 0, so its Parquet
    showed lower-bound holding nothing while its busy units were above 0."""
    from tangram.sim.config import SimConfig
    from tangram.sim.driver import Simulation
    from tangram.sim.workloads import generate

    trace = generate("coding", batch=4, steps=1, seed=0)
    from tangram.core import load_cluster

    cluster = load_cluster("paper")
    floor = common._slim_timeline(Simulation(trace, cluster, SimConfig(policy="lower-bound")).run())
    assert floor["busy_cores"].max() > 0
    assert floor[["held_cores", "held_gpus", "api_in_flight"]].isna().all().all()
    held = common._slim_timeline(Simulation(trace, cluster, SimConfig(policy="tangram")).run())
    assert held[["held_cores", "held_gpus", "busy_cores"]].notna().all().all()
    assert held["held_cores"].iloc[0] == 0 and held["held_cores"].max() > 0


def test_an_unknown_policy_is_refused_before_any_run(capsys):
    """``--policy nosuch`` was taken as given: the script generated its first trace and failed
    inside the run with a ValueError traceback; it is refused at once, naming the flag."""
    with pytest.raises(SystemExit) as exit_:
        common.parse_args("d", ["--policy", "nosuch"])
    err = capsys.readouterr().err
    assert exit_.value.code == 2 and "--policy nosuch" in err and "unknown policy" in err
    assert common.parse_args("d", ["--policy", "tangram"]).policy == "tangram"
    common.parse_args("d", [])  # (the paper's, by default; parse_args sets it as ELASTIC)


@pytest.mark.parametrize("value", ["abc", "0", "-2"])
def test_a_bad_tangram_workers_is_refused_naming_it(monkeypatch, capsys, value):
    """``TANGRAM_WORKERS=abc`` ended the script in a ValueError traceback before parsing (an
    int() of the default), and 0 or -2 were taken as given, bypassing --workers' check."""
    monkeypatch.setenv("TANGRAM_WORKERS", value)
    with pytest.raises(SystemExit) as exit_:
        common.parse_args("d", [])
    err = capsys.readouterr().err
    assert exit_.value.code == 2 and f"TANGRAM_WORKERS={value!r}" in err, err
    assert common.parse_args("d", ["--workers", "3"]).workers == 3  # the flag wins
    monkeypatch.setenv("TANGRAM_WORKERS", "4")
    assert common.parse_args("d", []).workers == 4


@pytest.mark.parametrize("script", ["fidelity", "ray_fidelity"])
@pytest.mark.parametrize("flag", ["--seeds", "--trajectories", "--actions"])
@pytest.mark.parametrize("value", ["0", "-1"])
def test_the_live_fidelity_counts_must_be_positive(capsys, script, flag, value):
    """``--seeds 0`` (or -1) ran no seed and then summarised nothing; ``--trajectories 0`` or
    ``--actions -1`` started a live run of an empty workload. Each is refused naming the flag
    (parsed before anything starts: ``--recalibrate`` alone would be refused after it)."""
    import importlib

    module = importlib.import_module(script)
    with pytest.raises(SystemExit) as exit_:
        module.main([flag, value, "--recalibrate", "--out", "/nonexistent-dir"])
    err = capsys.readouterr().err
    assert exit_.value.code == 2 and f"argument {flag}: must be >= 1" in err, err


def test_run_all_only_without_names_is_refused_not_every_experiment(monkeypatch, capsys, tmp_path):
    """``run_all.py --only`` with no name gave an empty list, read as "not given", so it ran
    every experiment (hours); it is refused naming --only. The runs are recorded, not made."""
    made: list[list[str]] = []
    monkeypatch.setattr(run_all.subprocess, "run", lambda cmd, **kw: made.append(cmd))
    with pytest.raises(SystemExit) as exit_:
        run_all.main(["--only", "--smoke", "--out", str(tmp_path)])
    assert exit_.value.code == 2 and "--only" in capsys.readouterr().err
    assert made == []
    run_all.main(["--only", "coding_act", "--smoke", "--out", str(tmp_path)])
    assert made and {Path(cmd[1]).name for cmd in made} == {"coding_act.py"}


def test_aggregate_counts_only_the_seeds_that_gave_figures():
    """A run that stalled has NaN figures and its reason in ``stalled``: the mean left it out
    but ``seeds`` counted it, so a table read "mean over 2 seeds" of one seed's figure. It
    counts the seeds that ran, and ``stalled`` those that did not."""
    runs = pd.DataFrame(
        {
            "batch": [1, 1, 1, 1],
            "seed": [0, 0, 1, 1],
            "variant": ["a", "b", "a", "b"],
            "x": [2.0, 1.0, float("nan"), 2.0],
            "stalled": [None, None, "pods held at a barrier", None],
        }
    )
    agg = common.aggregate(runs, ["batch", "variant"], ["x"]).set_index("variant")
    assert agg.loc["a", "x_mean"] == 2.0 and agg.loc["a", "seeds"] == 1
    assert agg.loc["a", "stalled"] == 1 and agg.loc["b", "stalled"] == 0
    assert agg.loc["b", "seeds"] == 2 and agg.loc["b", "x_mean"] == 1.5


def test_reports_and_the_results_doc_are_utf8_under_a_non_utf8_locale(tmp_path):
    """Every report writes "mean ± std" (and µs): under LC_ALL=C without UTF-8 mode the
    locale's encoding is ASCII, so Report.write failed with a UnicodeEncodeError at the end
    of the run, and run_all's update of the results doc could not read or write it."""
    import os
    import textwrap

    script = textwrap.dedent(
        f"""
        import locale, sys
        from pathlib import Path
        assert locale.getpreferredencoding(False).lower() not in ("utf-8", "utf8")
        sys.path.insert(0, {str(EXPERIMENTS)!r})
        import common, run_all
        out = Path(sys.argv[1])
        common.Report(
            name="coding_act", title="t", claim="c", command="python x.py",
            claims=[common.Claim("c", "m", "4.3x", "1.5 \\u00b1 0.1x", 1.5, 0.1)],
            sections=[("mean \\u00b1 std", "2 \\u00b5s")],
        ).write(out)
        doc = out / "doc.md"
        doc.write_bytes(("\\u00b1 intro\\n" + run_all.BEGIN + "\\nold\\n" + run_all.END + "\\n").encode())
        assert run_all.update_doc(out, doc)
        print("ok")
        """
    )
    env = {**os.environ, "LC_ALL": "C", "LANG": "C", "PYTHONUTF8": "0",
           "PYTHONCOERCECLOCALE": "0", "MPLBACKEND": "Agg"}  # fmt: skip
    done = subprocess.run(
        [sys.executable, "-c", script, str(tmp_path)],
        capture_output=True, text=True, encoding="utf-8", env=env, cwd=ROOT, timeout=300,
    )  # fmt: skip
    assert done.returncode == 0 and done.stdout.strip() == "ok", done.stderr[-3000:]
    text = (tmp_path / "coding_act.md").read_text(encoding="utf-8")
    assert "mean ± std" in text and "2 µs" in text
    assert "| 1.5 ± 0.1x |" in (tmp_path / "doc.md").read_text(encoding="utf-8")


@pytest.mark.parametrize("script", ["common", "run_all"])
def test_an_empty_out_is_refused_not_the_current_directory(capsys, monkeypatch, script):
    """``--out ""`` (an unset ``$OUT``) is ``Path("")``, that is ``.``: the results were written
    into the current directory without a word."""

    def no_run(*args, **kwargs):  # (before the fix run_all ran every experiment, for hours)
        raise AssertionError(f"an experiment was started: {args}")

    monkeypatch.setattr(run_all.subprocess, "run", no_run)
    monkeypatch.setattr(run_all, "update_doc", no_run)
    with pytest.raises(SystemExit) as exit_:
        if script == "common":
            common.parse_args("d", ["--out", ""])
        else:
            run_all.main(["--out", ""])
    err = capsys.readouterr().err
    assert exit_.value.code == 2 and "argument --out: an empty path" in err
