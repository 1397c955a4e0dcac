"""Importers of real agent trajectories (SWE-agent ``.traj``, OpenHands events) into trace v1.

The real files live in ``shared/real-traces/`` beside the checkout (see its README for their
provenance); the expected values below were read from those files.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from tangram.sim.importers import (
    IMPORTERS,
    TraceImportError,
    import_openhands,
    import_swe_agent,
    import_trace,
)
from tangram.trace import load_trace, write_trace

REAL = Path(__file__).parents[2].parent / "shared" / "real-traces"
DATA = Path(__file__).parent / "data"

if not REAL.is_dir():
    pytest.skip(f"real traces not found at {REAL}", allow_module_level=True)

TEST_REPO = (
    REAL / "swe-agent" / "gpt4__swe-agent-test-repo__default_from_url__t-0.00__p-0.95__c-3.00__install-1"
    / "6e44b9__sweagenttestrepo-1c2844.traj"
)  # fmt: skip
MARSHMALLOW = (
    REAL / "swe-agent" / "replay__marshmallow-code__marshmallow-1867__function_calling__install-1"
    / "marshmallow-code__marshmallow-1867.traj"
)  # fmt: skip
RUNTIME = REAL / "openhands" / "runtime-trajs"


def test_the_registry_names_both_importers():
    assert {"swe-agent": import_swe_agent, "openhands": import_openhands} == IMPORTERS
    assert import_trace("swe-agent", TEST_REPO) == import_swe_agent(TEST_REPO)
    with pytest.raises(ValueError, match="unknown importer 'aider'"):
        import_trace("aider", TEST_REPO)


# --- SWE-agent -------------------------------------------------------------------------------


def test_swe_agent_test_repo_run_has_its_five_timed_steps():
    trace = import_swe_agent(TEST_REPO)
    rows = trace.rows
    assert [r.kind for r in rows] == ["find_file", "open", "edit", "python3", "submit"]
    assert [r.t1_s for r in rows] == pytest.approx(
        [
            0.2814128329991945,
            0.29675291599960474,
            0.4935787079994043,
            0.2925790000008419,
            0.2691650420001679,
        ]
    )
    assert [r.obs_exec_s for r in rows] == [r.t1_s for r in rows]
    assert {r.trajectory for r in rows} == {"6e44b9__sweagenttestrepo-1c2844"}
    assert [r.position for r in rows] == [0, 1, 2, 3, 4]
    assert all(r.resource == "cpu" and r.max_units == 1 and r.gen_before_s == 0 for r in rows)
    assert trace.meta["exit_status"] == {"6e44b9__sweagenttestrepo-1c2844": "submitted"}


def test_swe_agent_marshmallow_replay_has_eleven_steps():
    rows = import_swe_agent(MARSHMALLOW).rows
    assert [r.kind for r in rows] == [
        "create", "edit", "python", "ls", "find_file", "open", "edit", "edit", "python", "rm", "submit",
    ]  # fmt: skip
    assert max(r.t1_s for r in rows) == pytest.approx(0.9784686559942202)  # the second edit
    assert sum(r.t1_s for r in rows) == pytest.approx(4.339, abs=1e-3)


def test_swe_agent_directory_import_gives_one_trajectory_per_file():
    trace = import_swe_agent(
        REAL / "swe-agent", step=3, gen_before_s=2.9, max_units=4, serial_fraction=0.8
    )
    groups = trace.trajectories()
    assert len(groups) == 2 and trace.steps() == [3]
    assert sorted(len(g) for g in groups.values()) == [5, 11]
    assert all(r.gen_before_s == 2.9 and r.max_units == 4 for r in trace.rows)
    assert trace.rows[0].curve_object().duration(4) == pytest.approx(trace.rows[0].t1_s * 0.85)


def test_an_older_traj_without_execution_time_is_refused_clearly():
    old = DATA / "swe-agent-old-format.traj"
    with pytest.raises(TraceImportError) as info:
        import_swe_agent(old)
    assert info.value.path == str(old)
    assert "step 0 ('find_file') has no 'execution_time'" in str(info.value)
    assert "older SWE-agent" in str(info.value)


def test_a_foreign_file_given_to_the_swe_agent_importer_is_refused():
    with pytest.raises(
        TraceImportError, match=r"basic\.json: not a SWE-agent \.traj: no 'trajectory' list"
    ):
        import_swe_agent(RUNTIME / "basic.json")
    with pytest.raises(TraceImportError, match=r"trace\.json: not JSON \(line 1, column 1"):
        import_swe_agent(REAL / "tracelab" / "claude" / "trace.json")


# --- OpenHands -------------------------------------------------------------------------------


def test_openhands_basic_run_is_one_edit_between_two_llm_turns():
    (row,) = import_openhands(RUNTIME / "basic.json").rows
    assert (row.trajectory, row.kind, row.resource) == ("basic", "edit", "cpu")
    assert row.t1_s == pytest.approx(0.036897)  # 22:45:13.764487 -> 22:45:13.801384
    assert row.gen_before_s == pytest.approx(16.863633)  # user message -> the edit
    assert row.gen_after_s == pytest.approx(4.604301)  # observation -> finish
    assert row.obs_outcome == "result"


def test_openhands_gui_session_keeps_sandbox_actions_and_flags_the_timeout():
    rows = import_openhands(RUNTIME / "basic_gui_mode.json").rows
    assert [r.kind for r in rows] == ["run", "edit", "edit", "run"]
    assert [r.t1_s for r in rows] == pytest.approx([0.658357, 0.042276, 0.034103, 30.58023])
    assert [r.obs_outcome for r in rows] == ["result", "result", "result", "timeout"]
    assert rows[0].gen_before_s == pytest.approx(2.777833)  # 20:29:32.262843 -> 20:29:35.040676
    assert rows[-1].gen_after_s == pytest.approx(5.552622)  # final agent message
    assert rows[-1].obs_arrival_s == pytest.approx(27.019191)


def test_openhands_wrong_initial_state_has_read_run_read():
    rows = import_openhands(RUNTIME / "wrong_initial_state.json").rows
    assert [(r.kind, r.t1_s) for r in rows] == [
        ("read", pytest.approx(0.035473)),
        ("run", pytest.approx(0.648763)),
        ("read", pytest.approx(0.020823)),
    ]


def test_openhands_output_jsonl_gives_gaps_or_llm_latencies():
    sample = DATA / "openhands-output-sample.jsonl"
    gap = import_openhands(sample)
    lat = import_openhands(sample, gen="latency")
    first, second = (g for g in gap.trajectories().values())
    assert [r.trajectory for r in first] == ["demo__repo-1"] * 3
    assert [r.kind for r in first] == ["run", "edit", "run"]  # 'think' is not sandbox work
    assert [r.t1_s for r in first] == pytest.approx([0.61, 0.005, 30.0])
    assert [r.gen_before_s for r in first] == pytest.approx([3.0, 5.002, 2.883])
    assert first[-1].gen_after_s == pytest.approx(2.0)
    assert [r.obs_outcome for r in first] == ["result", "result", "timeout"]
    assert [r.obs_outcome for r in second] == ["result", "error"]
    lat_first = lat.trajectories()[(0, "demo__repo-1")]
    assert [r.gen_before_s for r in lat_first] == pytest.approx([2.5, 4.0, 2.5])  # think + edit
    assert lat_first[-1].gen_after_s == pytest.approx(1.5)
    assert import_openhands(sample, gen=1.25).rows[0].gen_before_s == 1.25


def test_llm_latencies_need_an_output_jsonl():
    with pytest.raises(TraceImportError, match="gen='latency' needs metrics.response_latencies"):
        import_openhands(RUNTIME / "basic.json", gen="latency")


@pytest.mark.parametrize(
    ("relative", "message"),
    [
        (
            "tracelab/sanitized/round_trace.jsonl",
            "line 1: no 'history' event list .*TraceLab round trace",
        ),
        ("tracelab/claude/trace.json", r"not JSON \(line 1, column 1"),
        ("tracelab/codex/trace.json", r"not JSON \(line 1, column 1"),
    ],
)
def test_tracelab_files_are_refused_by_the_openhands_importer(relative, message):
    with pytest.raises(TraceImportError, match=message) as info:
        import_openhands(REAL / relative)
    assert info.value.path == str(REAL / relative)


def test_a_swe_agent_traj_is_refused_by_the_openhands_importer():
    with pytest.raises(TraceImportError, match="an OpenHands event needs 'id' and 'timestamp'"):
        import_openhands(TEST_REPO)


MULTI_SWE = REAL / "openhands" / "multi_swe_bench" / "output.jsonl"


@pytest.mark.skipif(not MULTI_SWE.exists(), reason="kept aside from this copy of real-traces")
def test_openhands_multi_swe_bench_output_matches_its_published_counts():
    trace = import_openhands(MULTI_SWE)
    assert [traj for _, traj in trace.trajectories()] == [
        "ponylang__ponyc-4595",
        "ponylang__ponyc-4593",
        "ponylang__ponyc-4588",
    ]
    kinds = [r.kind for r in trace.rows]
    assert (kinds.count("run"), kinds.count("read"), kinds.count("edit")) == (49, 23, 29)
    assert max(r.t1_s for r in trace.rows) == pytest.approx(265, abs=1)  # apt-get install
    assert len(import_openhands(MULTI_SWE, gen="latency")) == len(trace)


# --- imported traces are ordinary traces -----------------------------------------------------


def test_imported_traces_round_trip_through_files(tmp_path):
    for trace in (
        import_swe_agent(REAL / "swe-agent"),
        import_openhands(RUNTIME / "basic_gui_mode.json"),
    ):
        assert load_trace(write_trace(trace, tmp_path / "t.parquet")) == trace
        assert load_trace(write_trace(trace, tmp_path / "t.jsonl")) == trace
