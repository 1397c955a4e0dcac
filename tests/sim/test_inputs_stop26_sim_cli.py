"""`tangram sim` / `tangram replay` on bad or awkward input (stop 26's hunt): one clear line,
never a traceback, never a silently wrong result."""

import json
import math

import pytest

from tangram.cli import main
from tangram.sim.config import Overheads, RolloutConfig
from tests.sim.test_inputs_hc2_replay import ROW as LIVE_ROW

STALLING = [
    "sim",
    "--workload",
    "coding",
    "--batch",
    "6",
    "--cluster",
    "local",
    "--set",
    "reward_sync=step",
    "--quiet",
]


def header_only_trace(tmp_path):
    path = tmp_path / "empty.jsonl"
    path.write_text('{"tangram_trace":1}\n')
    return path


@pytest.mark.parametrize(
    ("field", "value"),
    [
        ("aoe_grant_s", math.inf),
        ("exec_noise_sigma", math.inf),
        ("gpu_restore_fixed_s", math.inf),
        ("gpu_exec_noise_sigma", math.inf),
        ("gpu_h2d_gbps", math.inf),
    ],
)
def test_overheads_refuse_non_finite_numbers_naming_the_field(field, value):
    with pytest.raises(ValueError, match=f"overheads.{field} must be .*finite"):
        Overheads(**{field: value})


def test_rollout_refuses_an_infinite_training_phase():
    with pytest.raises(ValueError, match="rollout.train_s must be .*finite"):
        RolloutConfig(train_s=math.inf)


def test_rollout_refuses_a_step_end_announcement_that_is_not_a_bool():
    with pytest.raises(ValueError, match="rollout.announce_step_end must be true or false"):
        RolloutConfig(announce_step_end="yes")  # type: ignore[arg-type]


def test_an_infinite_setting_is_a_clear_error(capsys):
    args = ["sim", "--workload", "coding", "--batch", "2", "--quiet"]
    assert main([*args, "--set", "overheads.aoe_grant_s=inf"]) == 2
    assert main([*args, "--exec-noise", "inf"]) == 2
    err = capsys.readouterr().err
    assert "overheads.aoe_grant_s must be" in err and "overheads.exec_noise_sigma" in err
    assert "Traceback" not in err


def test_a_stalled_policy_is_named_and_the_others_are_still_reported(capsys):
    code = main([*STALLING, "--json", "--policy", "tangram", "--policy", "k8s-static:1"])
    out, err = capsys.readouterr()
    assert code == 1  # the comparison is incomplete; 2 is kept for bad input
    doc = json.loads(out)
    assert [r["policy"] for r in doc["results"]] == ["tangram"]
    assert "simulation stalled" in doc["stalled"]["k8s-static:1"]
    (line,) = [x for x in err.splitlines() if x]
    assert line.startswith("tangram sim: k8s-static:1 could not finish: simulation stalled")


def test_a_trace_with_no_actions_is_refused_naming_the_file(tmp_path, capsys):
    path = header_only_trace(tmp_path)
    assert main(["sim", "--trace", str(path), "--quiet"]) == 2
    err = capsys.readouterr().err
    assert f"{path}: the trace has no actions" in err


@pytest.mark.parametrize("below", ["", "sub"])
def test_an_output_path_that_cannot_be_a_directory_is_refused_before_the_run(
    tmp_path, capsys, below
):
    afile = tmp_path / "afile"
    afile.write_text("x")
    out = afile / below if below else afile
    args = ["sim", "--workload", "coding", "--batch", "2", "--quiet", "--out", str(out)]
    assert main(args) == 2
    err = capsys.readouterr().err
    assert f"{afile} exists and is not a directory" in err and "Traceback" not in err


@pytest.mark.parametrize("flag", ["--batch", "--steps"])
def test_generator_flags_are_refused_with_a_trace(tmp_path, capsys, flag):
    path = header_only_trace(tmp_path)
    assert main(["sim", "--trace", str(path), flag, "3", "--quiet"]) == 2
    assert f"{flag} needs --workload" in capsys.readouterr().err


@pytest.mark.parametrize("runs", ["0", "-2"])
def test_replay_needs_at_least_one_run(capsys, runs):
    with pytest.raises(SystemExit) as exit_:
        main(["replay", "any.jsonl", "--durations", "curve", "--runs", runs])
    assert exit_.value.code == 2
    assert "argument --runs: must be >= 1" in capsys.readouterr().err


def test_warm_pods_past_any_cluster_are_refused_before_the_run(tmp_path, capsys):
    # --set overheads.warm_pods=1000000000 built a list of 10**9 ready times before the first
    # event (minutes, gigabytes, no word); more pods than the largest cluster file has cores.
    from tangram.sim.config import WARM_PODS_MAX

    assert Overheads(warm_pods=WARM_PODS_MAX).warm_pods == WARM_PODS_MAX
    with pytest.raises(ValueError, match=r"overheads.warm_pods must be an integer in \[0, "):
        Overheads(warm_pods=WARM_PODS_MAX + 1)
    args = ["sim", "--workload", "coding", "--batch", "2", "--quiet"]
    assert main([*args, "--set", "overheads.warm_pods=1000000000"]) == 2
    assert "overheads.warm_pods must be" in capsys.readouterr().err


@pytest.mark.parametrize("setting", ["overheads.container_start_s", "rollout.train_s"])
def test_a_time_past_a_traces_longest_is_refused_naming_the_setting(capsys, setting):
    # 1e300 s swallowed every duration added to it: busy core-s 0, ratios of 1e300 in words.
    from tangram.trace.row import TIME_MAX_S

    group, field = setting.split(".")
    built = {"overheads": Overheads, "rollout": RolloutConfig}[group]
    assert getattr(built(**{field: TIME_MAX_S}), field) == TIME_MAX_S
    args = ["sim", "--workload", "coding", "--batch", "2", "--quiet"]
    assert main([*args, "--set", f"{setting}=1e300"]) == 2
    assert f"{setting} must be <= 1e+09 seconds" in capsys.readouterr().err


@pytest.mark.parametrize("policy", [5, ["tangram"], {"name": "tangram"}])
def test_a_header_policy_that_is_not_a_name_is_refused_naming_it(tmp_path, capsys, policy):
    # The policy parser called .partition on it: an AttributeError traceback.
    row = LIVE_ROW  # one recorded command, as the replay tests'
    path = tmp_path / "live.jsonl"
    header = {"tangram_trace": 1, "policy": policy}
    path.write_text(json.dumps(header) + "\n" + json.dumps(row) + "\n")
    assert main(["replay", str(path), "--cluster", "local"]) == 2
    err = capsys.readouterr().err
    assert "the header's 'policy' must be a policy name" in err and "Traceback" not in err


def test_a_negative_seed_with_a_trace_is_refused_naming_the_flag(capsys):
    # It reached numpy's SeedSequence: 'error: expected non-negative integer', no flag named.
    with pytest.raises(SystemExit) as info:
        main(["sim", "--seed", "-1", "--quiet"])
    assert info.value.code == 2
    assert "argument --seed: must be >= 0, got -1" in capsys.readouterr().err


def test_a_policy_given_twice_is_refused_naming_it(capsys):
    # It ran twice: two identical rows, 'tangram vs tangram: ... the same', --out overwritten.
    assert main(["sim", "--policy", "tangram", "--policy", "tangram", "--quiet"]) == 2
    assert "--policy tangram given more than once" in capsys.readouterr().err


@pytest.mark.parametrize(
    ("args", "named"),
    [
        (["--batch", "100000000"], "batch x steps must be at most 100,000 trajectories"),
        (["--batch", "1000", "--steps", "1000"], "got 1000 x 1000 = 1,000,000"),
    ],
)
def test_a_workload_past_the_trajectory_cap_is_refused_before_generating(capsys, args, named):
    # A batch of 10**8 generated for hours (1.4 ms a trajectory) without a word.
    assert main(["sim", "--workload", "coding", *args, "--quiet"]) == 2
    assert named in capsys.readouterr().err


def test_a_run_whose_every_action_was_rejected_draws_its_figure_without_warnings(tmp_path):
    # matplotlib warned 'No artists with labels found to put in legend' on stderr.
    import warnings

    import pandas as pd

    from tangram.sim.plots import comparison_figure

    rejected = pd.DataFrame(
        {"outcome": ["rejected"], "act_s": [float("nan")], "queue_s": [0.0]}
        | {"overhead_s": [0.0], "exec_s": [0.0]}
    )
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        path = comparison_figure(
            {"tangram": rejected}, {"tangram": pd.DataFrame()}, tmp_path / "c.png"
        )
    assert path.exists()


def test_a_training_phase_with_open_loop_is_refused(tmp_path, capsys):
    # Open loop has no steps: --train-s 100 with --open-loop gave the same figures as without.
    with pytest.raises(ValueError, match=r"rollout.train_s \(--train-s\) is the training after"):
        RolloutConfig(mode="open", train_s=100.0)
    assert RolloutConfig(mode="open", train_s=0.0).train_s == 0.0
    row = {
        "action_id": "a0",
        "trajectory": "t0",
        "step": 0,
        "position": 0,
        "task": "t",
        "kind": "env",
        "gen_before_s": 0.0,
        "resource": "cpu",
        "t1_s": 1.0,
        "max_units": 1,
        "arrival_s": 0.0,
    }
    path = tmp_path / "open.jsonl"
    path.write_text(json.dumps({"tangram_trace": 1}) + "\n" + json.dumps(row) + "\n")
    args = ["sim", "--trace", str(path), "--open-loop", "--train-s", "100", "--quiet"]
    assert main(args) == 2
    assert "rollout.train_s (--train-s)" in capsys.readouterr().err


def test_an_empty_cluster_flag_is_refused_not_taken_as_absent(capsys):
    # `tangram sim --cluster ''` read the empty flag as no flag: it ran on the trace's (or the
    # paper) cluster without a word, while `tangram replay --cluster ''` was refused.
    args = ["sim", "--workload", "coding", "--batch", "2", "--quiet", "--cluster", ""]
    assert main(args) == 2
    assert "empty; give a path or a bundled cluster" in capsys.readouterr().err


@pytest.mark.parametrize(
    "given", [["--container-start-s", "30"], ["--set", "overheads.container_start_s=30"]]
)
def test_a_container_start_with_open_loop_is_refused(tmp_path, capsys, given):
    """An open-loop replay never starts an AOE container (its trajectories' opens are not in
    the trace): --open-loop --container-start-s 30 gave the figures of 0, silently."""
    path = tmp_path / "open.jsonl"
    path.write_text(json.dumps({"tangram_trace": 1}) + "\n" + json.dumps(LIVE_ROW) + "\n")
    args = ["sim", "--trace", str(path), "--cluster", "local", "--open-loop", "--quiet"]
    assert main([*args, *given]) == 2
    assert "overheads.container_start_s (--container-start-s)" in capsys.readouterr().err
    assert main([*args, "--container-start-s", "0"]) == 0  # what open loop does: accepted


def test_a_malformed_header_cluster_names_the_trace_file(tmp_path, capsys):
    """A header whose 'cluster' is a bundled name, not a table, was refused as "trace meta
    'cluster': ..." without saying which file; the file is named."""
    path = tmp_path / "named.jsonl"
    head = {"tangram_trace": 1, "cluster": "local"}
    path.write_text(json.dumps(head) + "\n" + json.dumps(LIVE_ROW) + "\n")
    assert main(["sim", "--trace", str(path), "--quiet"]) == 2
    assert f"{path}: header 'cluster'" in capsys.readouterr().err


@pytest.mark.parametrize(
    ("policies", "named"),
    [
        (["fixed:4", "fixed:04"], "--policy fixed:4 and --policy fixed:04 are the same policy"),
        (["k8s-static", "k8s-static:4"], "the same policy (k8s-static:4)"),
    ],
)
def test_one_policy_spelled_two_ways_is_refused_naming_both(capsys, policies, named):
    # It ran twice under two labels: two identical rows, 'fixed:4 vs fixed:04: the same'.
    args = [a for p in policies for a in ("--policy", p)]
    assert main(["sim", *args, "--workload", "random", "--seed", "1", "--quiet"]) == 2
    assert named in capsys.readouterr().err
