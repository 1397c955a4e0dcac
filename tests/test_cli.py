"""The tangram command: help, the main job, a benchmark, and clear errors on bad input."""

import json
import subprocess
import sys

import pytest

from tangram.cli import main


def run(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "tangram.cli", *args], capture_output=True, text=True, timeout=300
    )


def test_help_lists_the_commands():
    out = run("--help")
    assert out.returncode == 0
    for command in ("sim", "bench"):
        assert command in out.stdout


def test_sim_prints_a_comparison_and_writes_results(tmp_path, capsys):
    code = main(
        [
            "sim",
            "--workload",
            "coding",
            "--batch",
            "12",
            "--seed",
            "3",
            "--policy",
            "tangram",
            "--policy",
            "k8s-static",
            "--out",
            str(tmp_path),
            "--json",
        ]
    )
    assert code == 0
    doc = json.loads(capsys.readouterr().out)
    assert [r["policy"] for r in doc["results"]] == ["tangram", "k8s-static"]
    for r in doc["results"]:
        assert r["actions"] > 12 and r["act_mean_s"] > 0
    assert (tmp_path / "comparison.png").stat().st_size > 10_000
    assert (tmp_path / "tangram.actions.parquet").exists()


def test_default_sim_replays_the_bundled_coding_trace():
    out = run("sim", "--quiet")
    assert out.returncode == 0, out.stderr
    assert "coding.jsonl.gz on paper" in out.stdout
    assert "tangram vs k8s-static" in out.stdout


def test_bench_scheduler_json(capsys):
    assert (
        main(
            ["bench", "scheduler", "--queued", "64", "--events", "40", "--running", "64", "--json"]
        )
        == 0
    )
    doc = json.loads(capsys.readouterr().out)
    [row] = doc["results"]
    assert row["queued"] == 64 and 0 < row["p50_us"] <= row["p99_us"]
    assert 0 < row["cpu_p50_us"] <= row["cpu_p99_us"]  # (CPU time: the call's own cost)
    # (The collector's time is taken from each call's, so the p99 without it is no larger.)
    assert isinstance(row["gc_calls"], int) and 0 <= row["gc_calls"] <= row["events"]
    assert 0 < row["p99_without_gc_us"] <= row["p99_us"]
    if row["gc_calls"] == 0:  # (nothing taken off any call: the same percentile)
        assert row["p99_without_gc_us"] == row["p99_us"]


def test_the_scheduler_bench_clocks_the_collector_only_while_it_runs():
    import gc

    from tangram.bench.scheduler import _CollectorClock

    clock = _CollectorClock()
    gc.callbacks.append(clock)
    try:
        garbage = [[] for _ in range(10_000)]
        for a, b in zip(garbage, garbage[1:], strict=False):
            a.append(b)
            b.append(a)
        del garbage
        gc.collect()
    finally:
        gc.callbacks.remove(clock)
    spent = clock.spent_ns
    assert spent > 0
    gc.collect()  # (no longer registered: nothing more is counted)
    assert clock.spent_ns == spent


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["sim", "--cluster", "nowhere.toml"], "nowhere.toml: (file): no such file"),
        (["sim", "--policy", "sjf"], "unknown policy 'sjf'"),
        (["sim", "--workload", "chess"], "unknown workload 'chess'"),
    ],
)
def test_bad_input_gets_a_clear_error_not_a_traceback(args, message, capsys):
    try:
        code = main([*args, "--quiet"])
    except SystemExit as exit_:  # argparse's own refusal of a flag's value (--policy)
        code = exit_.code
    assert code == 2
    err = capsys.readouterr().err
    assert message in err and "Traceback" not in err


def test_json_output_writes_null_for_figures_that_are_not_finite():
    """--json is strict JSON: NaN/Infinity (undefined figures) are written as null."""
    import io

    import numpy as np

    from tangram.report import emit

    out = io.StringIO()
    doc = {"a": float("nan"), "b": [np.float64("inf"), 1.5], "c": (np.float32("nan"), "x")}
    emit(True, doc, {}, out=out)
    text = out.getvalue()
    assert "NaN" not in text and "Infinity" not in text
    assert json.loads(text) == {"a": None, "b": [None, 1.5], "c": [None, "x"]}


def test_bench_scheduler_refuses_a_policy_that_never_queues(capsys):
    """``lower-bound`` starts every arrival at once: the refill loop, waiting for a queue of
    Q, submitted actions forever (the command hung). It is refused, naming the policy."""
    argv = ["bench", "scheduler", "--queued", "4", "--running", "4", "--events", "4"]
    assert main([*argv, "--policy", "lower-bound"]) == 2
    err = capsys.readouterr().err
    assert "--policy lower-bound" in err and "nothing ever queues" in err


def test_bench_scheduler_refuses_a_cluster_without_cpu_nodes(tmp_path, capsys):
    """The benchmark pins its CPU actions to the cluster's CPU nodes round-robin: a GPU-only
    cluster file was a ZeroDivisionError traceback. It is refused, naming the cluster."""
    path = tmp_path / "gpus.toml"
    path.write_text(
        'name = "gpus"\n[[gpu_node]]\nname = "g0"\ngpus = 8\ngpu_memory_gb = 80\n'
        "host_memory_gb = 512\n"
    )
    argv = ["bench", "scheduler", "--queued", "4", "--running", "4", "--events", "4"]
    assert main([*argv, "--cluster", str(path)]) == 2
    assert "cluster 'gpus' has no CPU node" in capsys.readouterr().err


def test_a_reader_that_goes_away_ends_the_command_quietly():
    """``tangram sim --list-params | head -1``: once the pipe's reader is gone, the write
    raised BrokenPipeError, printed as a traceback. The command now stops quietly with 141
    (what a shell reports for a process SIGPIPE ends)."""
    proc = subprocess.Popen(
        [sys.executable, "-m", "tangram.cli", "sim", "--workload", "mopd", "--list-params"],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
    )
    proc.stdout.close()  # the reader goes away before the command writes anything
    err = proc.stderr.read().decode()
    assert proc.wait(timeout=300) == 141
    assert "Traceback" not in err and "BrokenPipeError" not in err, err


def test_bench_scheduler_refuses_a_cluster_where_nothing_runs(capsys):
    """On the bundled 2-core 'local' cluster no background action (3 cores) fits, so nothing
    runs and no completion can be replayed: popping the empty heap was an IndexError
    traceback. It is refused, naming the cluster and the policy."""
    argv = ["bench", "scheduler", "--cluster", "local", "--queued", "2", "--running", "4"]
    assert main([*argv, "--events", "50"]) == 2
    err = capsys.readouterr().err
    assert "no action is running on cluster 'local' under --policy tangram" in err


def test_a_broken_pipe_other_than_stdout_is_not_hidden(monkeypatch):
    """Only stdout's reader going away ends the command quietly: a BrokenPipeError from
    another pipe (a subprocess, a socket) is a real failure and still propagates."""
    import tangram.sim.cli as sim_cli

    def broken(args):
        raise BrokenPipeError("a subprocess went away")

    monkeypatch.setattr(sim_cli, "main", broken)
    with pytest.raises(BrokenPipeError, match="a subprocess went away"):
        main(["sim", "--quiet"])


@pytest.mark.parametrize("share", ["2", "-0.5", "nan"])
def test_bench_scheduler_refuses_a_bad_malleable_share_as_bad_input(capsys, share):
    """A share outside [0, 1] ended with exit status 1 (a failed run) and a bare message;
    bad input is exit status 2 with the command's "error:" prefix, as everywhere else."""
    assert main(["bench", "scheduler", "--queued", "4", "--malleable", share]) == 2
    assert "tangram bench: error: --malleable must be a share in [0, 1]" in capsys.readouterr().err


def test_bench_scheduler_reports_the_queue_its_decisions_ran_over():
    """``--running 2000`` on the paper cluster: about 1,290 background actions run, the other
    ~710 wait for ever, so the decisions ran over ~714 queued while the figures said only
    ``queued: 4``. Each result also gives ``queued_mean``, the queue actually timed."""
    from tangram.bench.scheduler import run_bench

    over = run_bench(4, running=2000, events=3)
    assert over["queued"] == 4 and over["queued_mean"] > 700
    assert run_bench(4, running=64, events=3)["queued_mean"] == 4.0


def test_sim_reads_a_cluster_file_that_is_no_regular_file(tmp_path, capsys):
    """A path that exists but is no regular file was refused as "no such file": /dev/null,
    and a pipe (``--cluster <(...)``), which is read as trace files are. An empty file (or
    /dev/null) is refused as empty, not as a cluster that "describes no CPU node"."""
    import os
    import threading
    from pathlib import Path

    assert main(["sim", "--cluster", os.devnull, "--quiet"]) == 2
    err = capsys.readouterr().err
    assert f"{os.devnull}: (file): empty" in err and "no such file" not in err
    (tmp_path / "empty.toml").write_text("# nothing yet\n")
    assert main(["sim", "--cluster", str(tmp_path / "empty.toml"), "--quiet"]) == 2
    assert "empty.toml: (file): empty" in capsys.readouterr().err
    fifo = tmp_path / "cluster-pipe"
    os.mkfifo(fifo)
    text = (Path(__file__).parents[1] / "tangram" / "clusters" / "local.toml").read_text()
    writer = threading.Thread(target=lambda: fifo.write_text(text, encoding="utf-8"))
    writer.start()
    try:
        argv = ["sim", "--workload", "coding", "--batch", "2", "--policy", "tangram"]
        assert main([*argv, "--cluster", str(fifo), "--quiet", "--json"]) == 0
    finally:
        writer.join(timeout=60)
    assert json.loads(capsys.readouterr().out)["cluster"] == "local"


def test_sim_reads_a_cluster_file_opened_by_a_byte_order_mark(tmp_path, capsys):
    """Editors on Windows open a UTF-8 file with a byte-order mark: a cluster file holding one
    was refused as "(syntax): Invalid statement (at line 1, column 1)", a line that reads
    right, where trace files and calibration records take it. A mark inside stays an error."""
    from pathlib import Path

    text = (Path(__file__).parents[1] / "tangram" / "clusters" / "local.toml").read_bytes()
    path = tmp_path / "windows.toml"
    path.write_bytes(b"\xef\xbb\xbf" + text)
    argv = ["sim", "--workload", "coding", "--batch", "2", "--policy", "tangram", "--quiet"]
    assert main([*argv, "--cluster", str(path), "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["cluster"] == "local"
    path.write_bytes(text + b"\xef\xbb\xbf")
    assert main([*argv, "--cluster", str(path)]) == 2
    assert "windows.toml: (syntax)" in capsys.readouterr().err


@pytest.mark.parametrize("command", ["sim", "import", "robustness"])
def test_a_file_that_cannot_be_written_is_an_error_naming_the_flag(
    command, tmp_path, monkeypatch, capsys
):
    """An OSError writing the output (no permission, a full disk, a read-only file system:
    the checks before the run cannot see them all, root passing os.access) ended `tangram
    sim --out`, `tangram import -o` and `tangram bench robustness --out` in a traceback."""
    import errno

    def full(*args, **kwargs):
        raise OSError(errno.ENOSPC, "No space left on device", str(tmp_path / "out" / "x"))

    if command == "sim":
        monkeypatch.setattr("tangram.sim.metrics.write_results", full)
        argv = ["sim", "--workload", "coding", "--batch", "2", "--policy", "tangram"]
        argv += ["--quiet", "--out", str(tmp_path / "out")]
        flag = "--out"
    elif command == "import":
        monkeypatch.setattr("tangram.trace.write_trace", full)
        traj = tmp_path / "run.traj"
        traj.write_text(json.dumps({"trajectory": [{"action": "ls", "execution_time": 1.0}]}))
        argv = ["import", "swe-agent", str(traj), "-o", str(tmp_path / "out" / "t.jsonl")]
        flag = "-o"
    else:
        monkeypatch.setattr("tangram.sim.instances.write_instance", full)
        argv = ["bench", "robustness", "--instances", "1", "--seed", "1", "--families", "cpu"]
        argv += ["--quiet", "--out", str(tmp_path / "out")]
        flag = "--out"
    assert main(argv) == 2
    err = capsys.readouterr().err
    assert f"error: {flag} {tmp_path / 'out'}" in err and "No space left on device" in err


DEEP = "[" * 100_000 + "]" * 100_000  # (past the JSON and TOML parsers' recursion)


@pytest.mark.parametrize(
    ("name", "text", "argv", "message"),
    [
        ("t.jsonl", '{"tangram_trace": 1}\n' + DEEP + "\n", ["sim", "--trace"],
         "t.jsonl, line 2: JSON nested too deeply"),
        ("t.jsonl", '{"tangram_trace": 1, "x": ' + DEEP + "}\n", ["sim", "--trace"],
         "t.jsonl, line 1: JSON nested too deeply"),
        # Within the parser's reach, past what the header may hold (the walk, the writer and
        # --json's printing recurse through it).
        ("t.jsonl", '{"tangram_trace": 1, "x": ' + "[" * 500 + "]" * 500 + "}\n",
         ["sim", "--trace"], "t.jsonl, line 1: field 'x" + "[0]" * 63 + "': nested more than 64"),
        ("r.traj", '{"trajectory": ' + DEEP + "}", ["import", "swe-agent"],
         "r.traj: JSON nested too deeply"),
        ("output.jsonl", DEEP + "\n", ["import", "openhands"],
         "output.jsonl: line 1: JSON nested too deeply"),
        ("c.toml", "a = " + DEEP + "\n", ["sim", "--cluster"],
         "c.toml: (syntax): arrays or tables nested too deeply"),
        ("g.json", DEEP, ["replay", "any.jsonl", "--gpu-calibration"],
         "g.json: JSON nested too deeply"),
    ],
)  # fmt: skip
def test_input_nested_past_the_parsers_recursion_is_an_error_not_a_traceback(
    name, text, argv, message, tmp_path, capsys
):
    """JSON (a trace line or header, an imported run, a calibration record) or TOML (a
    cluster file) nested tens of thousands of levels deep ended in a RecursionError
    traceback; it is an error naming the file and the line."""
    path = tmp_path / name
    path.write_text(text)
    tail = ["-o", str(tmp_path / "out.jsonl")] if argv[0] == "import" else ["--quiet"]
    assert main([*argv, str(path), *tail] if argv[0] != "replay" else [*argv, str(path)]) == 2
    err = capsys.readouterr().err
    assert message in err and "Traceback" not in err


def test_a_setting_nested_past_the_parsers_recursion_is_an_error(capsys):
    deep = "[" * 50_000 + "]" * 50_000
    argv = ["sim", "--workload", "mopd", "--batch", "1", "--quiet"]
    assert main([*argv, "--set", f"teachers={deep}"]) == 2
    err = capsys.readouterr().err
    assert "--set teachers=" in err and "JSON nested too deeply" in err


def test_an_internal_key_error_is_a_traceback_not_an_input_error(monkeypatch, capsys):
    """A KeyError of a bare key is a lookup gone wrong inside (the empty action table's
    'outcome' column once): main printed it as "tangram sim: error: outcome", exit 2, a bug
    shown as bad input; it propagates with its traceback. A KeyError with a message (the
    core's "unknown CPU node 'x'") is still an error line."""
    import tangram.sim.cli as sim_cli

    def bare(args):
        raise KeyError("outcome")

    monkeypatch.setattr(sim_cli, "main", bare)
    with pytest.raises(KeyError, match="outcome"):
        main(["sim", "--quiet"])
    assert "error: outcome" not in capsys.readouterr().err

    def refusal(args):
        raise KeyError("unknown CPU node 'x'")

    monkeypatch.setattr(sim_cli, "main", refusal)
    assert main(["sim", "--quiet"]) == 2
    assert "tangram sim: error: unknown CPU node 'x'" in capsys.readouterr().err


def test_bench_online_limit_prints_the_least_ratio_any_online_policy_is_beaten_by(capsys):
    """``tangram bench online-limit --json``: per figure, the twins' best baselines, every
    start of the long call, and a least ratio above issue 11's 1.2 (tangram.bench.online_limit)."""
    assert main(["bench", "online-limit", "--json"]) == 0
    doc = json.loads(capsys.readouterr().out)
    assert set(doc["pairs"]) == {"mean ACT", "step"}
    assert all(p["least_ratio"] > doc["target_ratio"] == 1.2 for p in doc["pairs"].values())
    assert doc["target_reachable_online"] is False
    assert doc["pairs"]["step"]["starts"][-1]["start"] == "after a call ends"
    assert main(["bench", "online-limit", "--default", "nope"]) == 2
    assert "unknown policy 'nope'" in capsys.readouterr().err
