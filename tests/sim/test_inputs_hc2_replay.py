"""`tangram replay` on bad recorded input (a second hunt): refused naming the file and the
header key or flag, never replayed silently wrong."""

from __future__ import annotations

import json

import pytest

from tangram.cli import main

ROW = {
    "action_id": "a0",
    "trajectory": "t0",
    "step": 0,
    "position": 0,
    "task": "live",
    "kind": "command",
    "gen_before_s": 0.0,
    "resource": "cpu",
    "t1_s": 1.0,
    "max_units": 1,
    "arrival_s": 0.0,
    "obs_units": 1,
    "obs_exec_s": 1.0,
    "obs_outcome": "result",
}


def live_trace(tmp_path, **header) -> str:
    """A one-action live trace on the bundled 'local' cluster, with these header keys."""
    path = tmp_path / "live.jsonl"
    head = {"tangram_trace": 1, "policy": "tangram", **header}
    path.write_text(json.dumps(head) + "\n" + json.dumps(ROW) + "\n")
    return str(path)


def test_a_residency_header_that_is_not_an_object_is_refused(tmp_path, capsys) -> None:
    # The string "false" is truthy: the replay started warm without a word.
    path = live_trace(tmp_path, gpu_residency_at_start="false")
    assert main(["replay", path, "--cluster", "local"]) == 2
    err = capsys.readouterr().err
    assert "field 'gpu_residency_at_start'" in err and "Traceback" not in err


@pytest.mark.parametrize(
    ("header", "field"),
    [
        ({"eoe": {"evictions": "x"}}, "eoe.evictions"),
        ({"gpu_residency_at_start": 1}, "gpu_residency_at_start"),
    ],
)
def test_a_bad_header_key_is_refused_naming_the_file(tmp_path, capsys, header, field) -> None:
    # It read "header: field 'eoe.evictions': ..." with no file, unlike every other trace error.
    path = live_trace(tmp_path, **header)
    assert main(["replay", path, "--cluster", "local"]) == 2
    err = capsys.readouterr().err
    assert f"{path}, header: field '{field}'" in err


def test_runs_past_the_bound_are_refused_naming_the_flag(capsys) -> None:
    # --runs 1000000000 simulated the trace that many times (days), without a word.
    from tangram.sim.replay_cli import RUNS_MAX, replay

    with pytest.raises(SystemExit) as info:
        main(["replay", "any.jsonl", "--runs", str(RUNS_MAX + 1)])
    assert info.value.code == 2
    assert f"argument --runs: must be an integer in [1, {RUNS_MAX:,}]" in capsys.readouterr().err
    for runs in (0, RUNS_MAX + 1, 2.5, True):
        with pytest.raises(ValueError, match="runs must be an integer in"):
            replay("any.jsonl", runs=runs)


@pytest.mark.parametrize("field", ["exec_noise_sigma", "gpu_exec_noise_sigma"])
def test_a_noise_that_degenerates_is_refused_with_the_reason(field) -> None:
    # At 50 the log-normal factor's median is exp(-1250) = 0: every duration ran in no time.
    from tangram.sim.config import EXEC_NOISE_SIGMA_MAX, Overheads

    assert getattr(Overheads(**{field: EXEC_NOISE_SIGMA_MAX}), field) == EXEC_NOISE_SIGMA_MAX
    with pytest.raises(ValueError, match=rf"overheads.{field} must be <= 3, .*median"):
        Overheads(**{field: 50.0})


def test_sim_refuses_a_degenerate_exec_noise(capsys) -> None:
    args = ["sim", "--workload", "coding", "--batch", "2", "--quiet", "--exec-noise", "50"]
    assert main(args) == 2
    err = capsys.readouterr().err
    assert "overheads.exec_noise_sigma must be <= 3" in err and "Traceback" not in err


def test_replay_refuses_a_measured_spread_past_the_bound_naming_the_trace(tmp_path) -> None:
    # Two actions declared 1 s that took 1 s and 1 us: sigma 6.9, drawn as the replay's noise.
    from tangram.sim.replay_cli import replay

    path = tmp_path / "spread.jsonl"
    fast = {**ROW, "action_id": "a1", "trajectory": "t1", "obs_exec_s": 1e-6}
    head = {"tangram_trace": 1, "policy": "tangram"}
    path.write_text("\n".join(json.dumps(x) for x in (head, ROW, fast)) + "\n")
    with pytest.raises(ValueError, match=rf"{path}: the observed execution times of all"):
        replay(path, cluster="local", durations="curve")
    assert replay(path, cluster="local", durations="curve", exec_noise=0.5).sim_runs == 10


def test_an_empty_policy_flag_is_refused_not_replaced_by_the_headers(tmp_path, capsys) -> None:
    # `--policy ''` replayed the header's policy without a word.
    path = live_trace(tmp_path)
    with pytest.raises(SystemExit) as exit_:  # the parser's refusal (no such policy)
        main(["replay", path, "--cluster", "local", "--policy", ""])
    err = capsys.readouterr().err
    assert exit_.value.code == 2 and "argument --policy: unknown policy ''" in err


def test_per_resource_noise_is_not_refused_for_the_pooled_spread(tmp_path) -> None:
    # GPU calls ran 50x their curves and commands 1/50x, each group without spread: the pooled
    # sigma is 3.9 (the two groups' offsets), each group's 0. --noise per-resource draws only
    # the groups' spreads; the pooled one, which it never draws, was refused as
    # 'overheads.exec_noise_sigma must be <= 3', a setting the user never gave.
    from tangram.sim.replay_cli import replay

    gpu = {"resource": "gpu", "service": "m", "service_size_gb": 1.0, "kind": "m"}
    rows = []
    for i in range(4):
        rows.append({**ROW, "action_id": f"c{i}", "trajectory": f"c{i}", "obs_exec_s": 0.02})
        rows.append({**ROW, **gpu, "action_id": f"g{i}", "trajectory": f"g{i}", "obs_exec_s": 50.0})
    path = tmp_path / "groups.jsonl"
    head = {"tangram_trace": 1, "policy": "tangram"}
    path.write_text("\n".join(json.dumps(x) for x in (head, *rows)) + "\n")
    with pytest.raises(ValueError, match=rf"{path}: the observed execution times of all"):
        replay(path, cluster="local", durations="curve")
    replay(path, cluster="local", durations="curve", noise="per-resource", runs=1)


def test_an_undefined_relative_error_prints_as_a_dash(tmp_path, capsys) -> None:
    """A live run whose actions took no time has a live ACT of 0, so (sim - live) / live is
    undefined: the table printed "+nan%" where every table prints NaN as "-"."""
    path = tmp_path / "zero.jsonl"
    head = {"tangram_trace": 1, "policy": "tangram"}
    row = {**ROW, "obs_exec_s": 0.0}
    path.write_text(json.dumps(head) + "\n" + json.dumps(row) + "\n")
    assert main(["replay", str(path), "--cluster", "local"]) == 0
    out = capsys.readouterr().out
    line = next(x for x in out.splitlines() if x.split()[:2] == ["all", "error"])
    assert "nan" not in line and line.split()[-5:] == ["-"] * 5


def test_live_results_the_simulation_rejects_are_named_not_dropped(tmp_path, capsys) -> None:
    """A live result the simulation rejects (a service no cell of the cluster holds) was left
    out of the comparison without a word: the title counted the others only. The report
    names how many and why."""
    path = tmp_path / "live.jsonl"
    gpu = {
        **ROW, "action_id": "g0", "trajectory": "t1", "resource": "gpu", "service": "huge",
        "service_size_gb": 50.0, "obs_node": "local-gpu",
    }  # fmt: skip
    head = {"tangram_trace": 1, "policy": "tangram"}
    path.write_text("\n".join(json.dumps(x) for x in (head, ROW, gpu)) + "\n")
    assert main(["replay", str(path), "--cluster", "local", "--json"]) == 0
    doc = json.loads(capsys.readouterr().out)
    assert doc["actions"] == 1
    [(why, n)] = doc["left_out"].items()
    assert n == 1 and "'huge'" in why
    assert main(["replay", str(path), "--cluster", "local"]) == 0
    out = " ".join(capsys.readouterr().out.split())
    assert "1 of 2 actions that ended with a result live are left out" in out


@pytest.mark.parametrize(
    ("flag", "value", "setting"),
    [
        ("--grant-s", "-1", "overheads.aoe_grant_s"),
        ("--api-call-s", "nan", "overheads.api_call_s"),
        ("--exec-noise", "100", "overheads.exec_noise_sigma"),
    ],
)
def test_a_bad_overhead_flag_is_refused_naming_the_flag(tmp_path, capsys, flag, value, setting):
    # It named only overheads.aoe_grant_s (a setting the user never gave), and only once the
    # trace had been read: a missing trace was reported instead of the bad flag.
    path = live_trace(tmp_path)
    assert main(["replay", path, "--cluster", "local", flag, value]) == 2
    err = capsys.readouterr().err
    assert f"error: {flag} {float(value)!r}: {setting}" in err
    assert main(["replay", str(tmp_path / "absent.jsonl"), flag, value]) == 2
    assert f"error: {flag} " in capsys.readouterr().err


def test_runs_without_noise_say_the_simulation_ran_once(tmp_path, capsys) -> None:
    """--runs 5 on observed durations (no execution noise) ran one simulation without a word:
    only "sim_runs": 1 in --json showed the five asked for were one."""
    path = live_trace(tmp_path)
    assert main(["replay", path, "--cluster", "local", "--runs", "5"]) == 0
    err = capsys.readouterr().err
    assert "--runs 5: the simulation ran once; it has no execution noise" in err, err
    assert main(["replay", path, "--cluster", "local"]) == 0  # the default asks for nothing
    assert capsys.readouterr().err == ""
