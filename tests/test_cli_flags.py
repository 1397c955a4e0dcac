"""Flags of the tool commands that were accepted and failed later, or failed with a traceback
(stop 26's hunt): each is now refused at once, naming the flag (exit status 2)."""

from __future__ import annotations

from pathlib import Path

import pytest

from tangram.cli import main as cli_main

CASES = [
    (["profile-cpu", "--memory-gb", "nan", "--", "true"], "--memory-gb"),
    (["profile-cpu", "--memory-gb", "inf", "--", "true"], "--memory-gb"),
    (["profile-cpu", "--memory-gb", "1e6", "--", "true"], "--memory-gb"),
    (["profile-cpu", "--memory-gb", "0.001", "--", "true"], "--memory-gb"),
    (["profile-cpu", "--out", "/nonexistent-dir/o.json", "--", "true"], "--out"),
    (["profile-cpu", "--out", "/tmp", "--", "true"], "--out"),  # a directory: a traceback then
    # Counts and times past any use ran silently for hours (or overflowed in the container's
    # time-out, naming no flag); each is now refused naming its bound (stop 31).
    (["profile-cpu", "--repeat", "1000000", "--", "true"], "--repeat"),
    (["profile-cpu", "--warmup", "1000000", "--", "true"], "--warmup"),
    (["profile-cpu", "--timeout", "nan", "--", "true"], "--timeout"),
    (["profile-cpu", "--timeout", "1e300", "--", "true"], "--timeout"),
    (["profile-cpu", "--max-cores", "0", "--", "true"], "--max-cores"),
    (["calibrate", "gpu", "--example", "tiny", "--batch", "1000000000", "-o", "c.json"], "--batch"),
    (["calibrate", "gpu", "--example", "tiny", "--reps", "1000000000", "-o", "c.json"], "--reps"),
    (["calibrate", "gpu", "--example", "tiny", "--devices", "100000", "-o", "c.json"], "--devices"),
    (
        ["calibrate", "gpu", "--example", "tiny", "--seq-len", "10000000", "-o", "c.json"],
        "--seq-len",
    ),
    (["calibrate", "gpu", "--example", "tiny", "--batch", "0", "-o", "c.json"], "--batch"),
    (["calibrate", "gpu", "--example", "tiny", "--seq-len", "-1", "-o", "c.json"], "--seq-len"),
    (["calibrate", "gpu", "--example", "tiny", "--reps", "0", "-o", "c.json"], "--reps"),
    (["calibrate", "gpu", "--example", "tiny", "--busy", "9999", "-o", "c.json"], "--busy"),
    (["bench", "scheduler", "--events", "0"], "--events"),
    (["bench", "scheduler", "--seed", "-1"], "--seed"),
    (["bench", "sim", "--seed", "-1", "--batch", "1", "--repeats", "1"], "--seed"),
    # A size given twice was measured twice (two rows of one figure, twice the time).
    (["bench", "scheduler", "--queued", "64", "64", "--events", "1", "--running", "1"], "--queued"),
    (["bench", "service", "--requests", "10", "--clients", "1", "--warmup", "-1"], "--warmup"),
    (["bench", "eoe", "--batch", "0", "--sizes", "tiny", "--models", "none"], "--batch"),
    (["bench", "eoe", "--models", "bogus", "--sizes", "tiny", "--reps", "1"], "--models"),
    (["sim", "--workload", "mopd", "--batch", "4", "--warm-gpus", "twice"], "--warm-gpus"),
    (["serve", "--tenant-max-pending", "2"], "--tenant-max-pending"),
    (["serve", "--client", "a=token-of-a", "--tenant-max-pending", "0"], "--tenant-max-pending"),
    (["serve", "--tenant-max-trajectories", "2"], "--tenant-max-trajectories"),
    (
        ["serve", "--client", "a=token-of-a", "--tenant-max-trajectories", "0"],
        "--tenant-max-trajectories",
    ),
    (["serve", "--tenant-max-connections", "2"], "--tenant-max-connections"),
    (
        ["serve", "--client", "a=token-of-a", "--tenant-max-connections", "0"],
        "--tenant-max-connections",
    ),
    # (Named the setting, max_connections_per_client, not the flag.)
    (["serve", "--max-connections-per-client", "0"], "--max-connections-per-client"),
    (["bench", "robustness", "--instances", "1", "--warm-gpus", "hot"], "--warm-gpus"),
    # Refused after the progress bar started, naming no flag ("oversubscription must lie...").
    (
        ["bench", "robustness", "--instances", "1", "--oversubscription", "nan"],
        "--oversubscription",
    ),
    (["bench", "robustness", "--instances", "1", "--oversubscription", "1"], "--oversubscription"),
    # The scheduler actor's agents run what their nodes report: with --ray these were
    # accepted and silently dropped (a model never served, an executor kept).
    (["serve", "--ray", "auto", "--model", "judge=reward:/models/rm"], "--model"),
    (["serve", "--ray", "auto", "--no-gpu"], "--no-gpu"),
    (["serve", "--ray", "auto", "--no-cpu"], "--no-cpu"),
    (["serve", "--ray", "auto", "--gpu-backend", "cpu"], "--gpu-backend"),
    # An unknown policy was refused naming no flag ("unknown policy 'bogus'"), under
    # robustness after its progress bar had started.
    (["bench", "robustness", "--instances", "1", "--default", "bogus"], "--default"),
    (["bench", "robustness", "--instances", "1", "--default", "tangram:0"], "--default"),
    (["bench", "sim", "--batch", "1", "--repeats", "1", "--policy", "bogus"], "--policy"),
    (["sim", "--workload", "coding", "--batch", "1", "--policy", "bogus"], "--policy"),
    (["sim", "--workload", "coding", "--batch", "1", "--policy", "fixed:"], "--policy"),
    (["bench", "sim", "--batch", "1", "--repeats", "1", "--workload", "chess"], "--workload"),
    (["sim", "--workload", "chess", "--batch", "1"], "--workload"),
    (["replay", "live.jsonl", "--policy", "bogus"], "--policy"),
    (
        ["bench", "scheduler", "--events", "1", "--running", "1", "--queued", "1", "--policy", "x"],
        "--policy",
    ),
]


@pytest.mark.parametrize(
    ("argv", "flag"), CASES, ids=lambda v: " ".join(v) if isinstance(v, list) else v
)
def test_a_bad_flag_is_refused_at_once_naming_it(
    capsys: pytest.CaptureFixture[str], argv: list[str], flag: str
) -> None:
    try:
        code = cli_main(argv)
    except SystemExit as exit_:  # argparse's own refusal of a flag's value
        code = exit_.code
    err = capsys.readouterr().err
    assert code == 2, err
    assert flag in err and "Traceback" not in err, err
    last = err.strip().splitlines()[-1]
    assert last.startswith(f"tangram {argv[0]}"), last  # the command, not the profiled program


#: Counts that ran for hours or exhausted memory without a word: ``--queued 10000000`` built ten
#: million actions before the first timed event, ``--jobs 100000`` forked every worker at once.
#: Parsed only (before the bounds they were accepted, and running them is what hung).
COUNT_CASES = [
    (["bench", "scheduler", "--queued", "256", "10000000"], "--queued", "65,536"),
    (["bench", "scheduler", "--running", "10000000"], "--running", "65,536"),
    (["bench", "scheduler", "--events", "100000000"], "--events", "100,000"),
    (["bench", "sim", "--repeats", "100000"], "--repeats", "100"),
    (["bench", "robustness", "--instances", "100000000"], "--instances", "100,000"),
    (["bench", "robustness", "--jobs", "100000"], "--jobs", "256"),
    # (AOE's pool bound: refused before at start naming WarmPoolConfig.max_per_key, not the flag.)
    (["serve", "--warm-pool", "5000"], "--warm-pool", "1,024"),
    (["serve", "--warm-pool-total", "5000"], "--warm-pool-total", "1,024"),
    (["serve", "--prewarm", "5000"], "--prewarm", "1,024"),
]


@pytest.mark.parametrize(("argv", "flag", "bound"), COUNT_CASES, ids=lambda v: str(v))
def test_a_count_past_any_use_is_refused_naming_its_bound(
    capsys: pytest.CaptureFixture[str], argv: list[str], flag: str, bound: str
) -> None:
    from tangram.cli import build_parser

    with pytest.raises(SystemExit) as exit_:
        build_parser().parse_args(argv)
    err = capsys.readouterr().err
    assert exit_.value.code == 2 and flag in err and f"at most {bound}" in err, err


def test_the_documented_count_defaults_still_parse() -> None:
    from tangram.cli import build_parser

    parser = build_parser()
    args = parser.parse_args(["bench", "scheduler"])
    assert (args.queued, args.running, args.events) == ([256, 1024, 2048, 8192], 1024, 2000)
    assert parser.parse_args(["bench", "sim"]).repeats == 3
    args = parser.parse_args(["bench", "robustness", "--instances", "50", "--jobs", "8"])
    assert (args.instances, args.jobs) == (50, 8)
    assert parser.parse_args(["bench", "robustness"]).instances == 200


#: An empty path is ``Path("")``, which is ``.``: ``--out ""`` (an unset ``$OUT``) wrote the
#: results into the current directory, and ``tangram import swe-agent ""`` imported every run
#: under it, without a word; the others were refused naming '.' and a file type ''.
EMPTY_PATH_CASES = [
    (["sim", "--trace", "", "--quiet"], "argument --trace"),
    (["sim", "--workload", "coding", "--batch", "1", "--out", ""], "argument --out"),
    (["bench", "robustness", "--instances", "1", "--out", " "], "argument --out"),
    (["import", "swe-agent", "", "-o", "t.jsonl"], "argument files"),
    (["import", "swe-agent", "r.traj", "-o", ""], "argument -o/--out"),
    (["replay", ""], "argument trace"),
    (["replay", "t.jsonl", "--gpu-calibration", ""], "argument --gpu-calibration"),
]


@pytest.mark.parametrize(("argv", "flag"), EMPTY_PATH_CASES, ids=lambda v: str(v))
def test_an_empty_path_is_refused_naming_the_argument(
    capsys: pytest.CaptureFixture[str],
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    argv: list[str],
    flag: str,
) -> None:
    monkeypatch.chdir(tmp_path)
    (tmp_path / "r.traj").write_text('{"trajectory": [{"action": "ls", "execution_time": 1}]}')
    try:
        code = cli_main(argv)
    except SystemExit as exit_:
        code = exit_.code
    err = capsys.readouterr().err
    assert code == 2 and f"{flag}: an empty path" in err, err
    assert sorted(p.name for p in tmp_path.iterdir()) == ["r.traj"]  # nothing written here
