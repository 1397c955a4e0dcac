"""``tangram import swe-agent|openhands FILES... -o TRACE``: real runs as a valid trace, and
``--batch N --seed S`` tiling them into one RL step of N (round-robin over a seeded
permutation, each slot after a seeded start offset), deterministic by seed."""

from __future__ import annotations

import json
from collections import Counter
from pathlib import Path

import pytest

from tangram.cli import main
from tangram.sim.importers import import_swe_agent
from tangram.sim.importers.tile import mean_cycle_s, tile
from tangram.trace import load_trace

DATA = Path(__file__).parent / "data"
OPENHANDS_SAMPLE = DATA / "openhands-output-sample.jsonl"


def write_traj(path: Path, steps: list[tuple[str, float]]) -> Path:
    """A SWE-agent 1.x ``.traj``: each step's command and its ``execution_time``."""
    doc = {
        "trajectory": [{"action": a, "observation": "", "execution_time": t} for a, t in steps],
        "info": {"exit_status": "submitted"},
    }
    path.write_text(json.dumps(doc))
    return path


@pytest.fixture
def trajs(tmp_path: Path) -> list[Path]:
    return [
        write_traj(tmp_path / "task-a.traj", [("ls", 0.1), ("python3 t.py", 2.0), ("submit", 0.2)]),
        write_traj(tmp_path / "task-b.traj", [("open f.py", 0.3), ("submit", 0.1)]),
        write_traj(tmp_path / "task-c.traj", [("pytest -q", 5.0)]),
    ]


def run(capsys, *args: str) -> tuple[int, str, str]:
    try:
        code = main(["import", *args])
    except SystemExit as exc:
        code = int(exc.code)
    out = capsys.readouterr()
    return code, out.out, out.err


def test_files_are_merged_into_one_valid_trace(tmp_path, trajs, capsys):
    out = tmp_path / "merged.jsonl"
    code, printed, err = run(capsys, "swe-agent", *map(str, trajs), "-o", str(out))
    assert code == 0, err
    trace = load_trace(out)  # reading validates every row and the rules across rows
    assert [t for _, t in trace.trajectories()] == ["task-a", "task-b", "task-c"]
    assert [r.t1_s for r in trace.rows] == [0.1, 2.0, 0.2, 0.3, 0.1, 5.0]
    assert trace.meta["files"] == [str(p) for p in trajs]
    assert f"wrote {out}: 3 trajectories, 6 actions" in printed


def test_importer_parameters_are_set_by_name_and_type(tmp_path, trajs, capsys):
    out = tmp_path / "t.jsonl"
    code, _, err = run(
        capsys, "swe-agent", str(trajs[0]), "-o", str(out),
        "--set", "gen_before_s=2.9", "--set", "max_units=4", "--set", "serial_fraction=0.2",
    )  # fmt: skip
    assert code == 0, err
    rows = load_trace(out).rows
    assert all(r.gen_before_s == 2.9 and r.max_units == 4 for r in rows)
    assert all(r.serial_fraction == 0.2 for r in rows)


@pytest.mark.parametrize(
    ("setting", "named"),
    [
        ("gen_before=1", "importer 'swe-agent' has no parameter 'gen_before'"),
        ("max_units=many", "--set max_units=many: expected an integer, got 'many'"),
    ],
)
def test_a_bad_importer_setting_is_refused_naming_it(tmp_path, trajs, capsys, setting, named):
    code, _, err = run(capsys, "swe-agent", str(trajs[0]), "-o", str(tmp_path / "x.jsonl"),
                       "--set", setting)  # fmt: skip
    assert code == 2 and named in err and "Traceback" not in err
    assert not (tmp_path / "x.jsonl").exists()


def test_a_trajectory_name_taken_by_an_earlier_file_is_kept_apart(tmp_path, capsys):
    (tmp_path / "a").mkdir()
    (tmp_path / "b").mkdir()
    first = write_traj(tmp_path / "a" / "same.traj", [("ls", 0.1)])
    second = write_traj(tmp_path / "b" / "same.traj", [("ls", 0.4)])
    out = tmp_path / "m.jsonl"
    code, _, err = run(capsys, "swe-agent", str(first), str(second), "-o", str(out))
    assert code == 0, err
    names = [t for _, t in load_trace(out).trajectories()]
    assert names == ["same", "same~1"]


def test_tiling_draws_each_imported_trajectory_round_robin_with_seeded_offsets(trajs):
    imported = import_swe_agent(trajs[0].parent)
    batch = tile(imported, 8, seed=5, max_offset_s=10.0)
    groups = batch.trajectories()
    assert len(groups) == 8 and batch.steps() == [0]
    sources = [t.split("-", 1)[1] for _, t in groups]
    # 8 slots over 3 trajectories: each appears 2 or 3 times, in a repeating order.
    assert sorted(Counter(sources).values()) == [2, 3, 3]
    assert sources[3:6] == sources[:3] and sources[6:] == sources[:2]
    originals = {t: rows for (_, t), rows in imported.trajectories().items()}
    offsets = []
    for (_, name), rows in groups.items():
        source = originals[name.split("-", 1)[1]]
        assert [r.t1_s for r in rows] == [r.t1_s for r in source]
        assert [r.gen_before_s for r in rows[1:]] == [r.gen_before_s for r in source[1:]]
        offsets.append(rows[0].gen_before_s - source[0].gen_before_s)
    assert all(0 <= o < 10.0 for o in offsets) and len(set(offsets)) == 8


def test_tiling_is_deterministic_by_seed(tmp_path, trajs, capsys):
    files = [str(p) for p in trajs]
    paths = {}
    for name, seed in (("a", "7"), ("b", "7"), ("c", "8")):
        paths[name] = tmp_path / f"{name}.jsonl"
        code, _, err = run(capsys, "swe-agent", *files, "-o", str(paths[name]), "--batch", "16",
                           "--seed", seed)  # fmt: skip
        assert code == 0, err
    assert paths["a"].read_bytes() == paths["b"].read_bytes()
    assert load_trace(paths["c"]).rows != load_trace(paths["a"]).rows
    assert len(load_trace(paths["a"]).trajectories()) == 16


def test_the_default_offset_range_is_the_mean_action_cycle_and_zero_is_lockstep(trajs):
    imported = import_swe_agent(trajs[0].parent, gen_before_s=1.0)
    assert mean_cycle_s(imported) == pytest.approx(1.0 + (0.1 + 2 + 0.2 + 0.3 + 0.1 + 5) / 6)
    tiled = tile(imported, 6, seed=0)
    assert tiled.meta["tiling"]["max_offset_s"] == pytest.approx(mean_cycle_s(imported))
    lockstep = tile(imported, 6, seed=0, max_offset_s=0.0)
    assert all(r.gen_before_s == 1.0 for r in lockstep.rows)


def test_openhands_output_is_imported_tiled_and_simulated(tmp_path, capsys):
    out = tmp_path / "oh.parquet"
    code, printed, err = run(capsys, "openhands", str(OPENHANDS_SAMPLE), "-o", str(out),
                             "--batch", "6", "--seed", "1")  # fmt: skip
    assert code == 0, err
    trace = load_trace(out)
    assert len(trace.trajectories()) == 6
    assert trace.meta["tiling"]["imported_trajectories"] == 2
    assert "tiled from 2 imported trajectories, seed 1" in printed
    code = main(["sim", "--trace", str(out), "--cluster", "local", "--quiet", "--json"])
    doc = json.loads(capsys.readouterr().out)
    assert code == 0 and all(r["rejected"] == 0 for r in doc["results"])


def test_an_offset_range_without_a_batch_is_refused(tmp_path, trajs, capsys):
    code, _, err = run(capsys, "swe-agent", str(trajs[0]), "-o", str(tmp_path / "x.jsonl"),
                       "--max-offset-s", "3")  # fmt: skip
    assert code == 2 and "--max-offset-s applies to tiling" in err


def test_a_union_typed_parameter_reads_a_number_as_a_number(tmp_path, capsys):
    # OpenHands' gen is "gap", "latency" or seconds (str | float): 2.5 is seconds.
    out = tmp_path / "oh.jsonl"
    code, _, err = run(capsys, "openhands", str(OPENHANDS_SAMPLE), "-o", str(out),
                       "--set", "gen=2.5", "--set", "skip_kinds=message,system,think,finish")  # fmt: skip
    assert code == 0, err
    rows = load_trace(out).rows
    assert rows and all(r.gen_before_s == 2.5 for r in rows)
    assert load_trace(out).meta["params"]["skip_kinds"] == ["finish", "message", "system", "think"]


@pytest.mark.parametrize("where", ["a directory", "below a file"])
def test_an_output_that_cannot_be_a_trace_file_is_refused_naming_it(tmp_path, capsys, where):
    # Both were tracebacks (IsADirectoryError from the writer, FileExistsError from mkdir).
    (tmp_path / "taken.jsonl").write_text("")
    (tmp_path / "dir.jsonl").mkdir()
    out = tmp_path / ("dir.jsonl" if where == "a directory" else "taken.jsonl/t.jsonl")
    assert main(["import", "openhands", str(OPENHANDS_SAMPLE), "-o", str(out)]) == 2
    err = capsys.readouterr().err
    assert f"tangram import: error: -o {out}: " in err and "Traceback" not in err


def test_a_tiling_batch_past_the_trajectory_cap_is_refused(tmp_path, capsys):
    out = tmp_path / "t.jsonl"
    args = ["import", "openhands", str(OPENHANDS_SAMPLE), "-o", str(out), "--batch", "100000001"]
    assert main(args) == 2
    assert "--batch must be at most 100,000 trajectories" in capsys.readouterr().err
    assert not out.exists()


@pytest.mark.parametrize("overlap", ["same file", "file in directory"])
def test_runs_named_twice_are_refused_not_imported_twice(tmp_path, trajs, capsys, overlap):
    """``tangram import swe-agent runs/*.traj runs/task-a.traj``: the file named twice was
    imported twice, its copy silently renamed ``task-a~3``. It is refused, naming both."""
    first = trajs[0].parent if overlap == "file in directory" else trajs[0]
    out = tmp_path / "m.jsonl"
    code, _, err = run(capsys, "swe-agent", str(first), str(trajs[0]), "-o", str(out))
    assert code == 2 and f"{trajs[0]} and {first} name the same runs" in err
    assert not out.exists()


def test_an_output_that_is_an_imported_file_is_refused(tmp_path, capsys):
    """``tangram import openhands output.jsonl -o output.jsonl`` wrote the trace over the run
    it was imported from. It is refused, and the run is left as it was."""
    source = tmp_path / "output.jsonl"
    source.write_text(OPENHANDS_SAMPLE.read_text())
    before = source.read_bytes()
    code, _, err = run(capsys, "openhands", str(source), "-o", str(source))
    assert code == 2 and "is the file imported" in err
    assert source.read_bytes() == before


def test_actions_no_observation_answered_are_reported_not_dropped_silently(tmp_path, capsys):
    """An OpenHands run cut short leaves its last action unanswered: the importer leaves it
    out and only the trace's meta counted it; the command said nothing. It says how many."""
    events = [
        {"id": 0, "timestamp": "2024-06-01T10:00:00", "source": "user", "action": "message"},
        {"id": 1, "timestamp": "2024-06-01T10:00:03", "source": "agent", "action": "run"},
        {"id": 2, "timestamp": "2024-06-01T10:00:04", "source": "agent", "observation": "run",
         "cause": 1},
        {"id": 3, "timestamp": "2024-06-01T10:00:09", "source": "agent", "action": "run"},
    ]  # fmt: skip
    source = tmp_path / "cut.json"
    source.write_text(json.dumps(events))
    out = tmp_path / "t.jsonl"
    code, printed, err = run(capsys, "openhands", str(source), "-o", str(out))
    assert code == 0, err
    assert (
        "1 actions" in printed and "left out 1 agent action that no observation answered" in printed
    )
    code, printed, _ = run(capsys, "openhands", str(source), "-o", str(out), "--json")
    assert json.loads(printed)["unanswered_actions"] == 1


def test_an_output_of_no_trace_format_is_refused_before_importing(tmp_path, trajs, capsys):
    """``-o new/dir/out.json``: the suffix names no trace format, found only once every file
    was imported and tiled, and after ``new/dir`` had been created for nothing."""
    out = tmp_path / "new" / "dir" / "out.json"
    code, _, err = run(capsys, "swe-agent", str(trajs[0]), "-o", str(out))
    assert code == 2 and "unknown trace file type 'out.json'" in err
    assert not (tmp_path / "new").exists()


@pytest.mark.parametrize(
    ("setting", "named"),
    [
        ("step=-1", "--set step=-1: must be >= 0, got -1 (the trace field 'step'"),
        ("max_units=0", "--set max_units=0: must be >= 1, got 0"),
        ("serial_fraction=1.5", "--set serial_fraction=1.5: must lie in [0, 1], got 1.5"),
        ("gen_before_s=-2", "--set gen_before_s=-2: must be >= 0"),
        ("memory_gb=-1", "--set memory_gb=-1: must be >= 0"),
    ],
)
def test_a_setting_the_trace_refuses_is_named_as_the_set(tmp_path, trajs, capsys, setting, named):
    """It failed as "FILE: trajectory step 0: field 'step': ...", as if the file held it."""
    code, _, err = run(capsys, "swe-agent", str(trajs[0]), "-o", str(tmp_path / "x.jsonl"),
                       "--set", setting)  # fmt: skip
    assert code == 2 and named in err and "Traceback" not in err, err
    assert "trajectory step" not in err
    assert not (tmp_path / "x.jsonl").exists()


def test_openhands_step_setting_is_named_as_the_set(tmp_path, capsys):
    code, _, err = run(capsys, "openhands", str(OPENHANDS_SAMPLE), "-o", str(tmp_path / "x.jsonl"),
                       "--set", "step=-3")  # fmt: skip
    assert code == 2 and "--set step=-3: must be >= 0" in err, err
