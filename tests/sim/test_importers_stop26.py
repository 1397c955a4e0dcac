"""Importer input found by stop 26's hunt: a malformed file is refused naming the file, the
record or event and the key; merging never makes two trajectories one; tiling refuses an
offset range it cannot draw from or that no trace can hold."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from tangram.sim.importers import TraceImportError, import_openhands, import_swe_agent
from tangram.sim.importers.tile import merge, tile
from tangram.trace.row import TIME_MAX_S


def events(**changes: Any) -> list[dict[str, Any]]:
    """A user message, one agent ``run`` and its observation; ``changes`` maps an event index
    to the keys to set on it."""
    evs: list[dict[str, Any]] = [
        {"id": 0, "timestamp": "2024-01-01T00:00:00", "source": "user", "action": "message"},
        {"id": 1, "timestamp": "2024-01-01T00:00:01", "source": "agent", "action": "run"},
        {
            "id": 2,
            "timestamp": "2024-01-01T00:00:03",
            "source": "environment",
            "observation": "run",
            "cause": 1,
            "extras": {"metadata": {"exit_code": 0}},
        },
    ]
    for key, value in changes.items():
        index, name = key.split("_", 1)
        evs[int(index[1:])][name] = value
    return evs


def write(path: Path, doc: Any) -> Path:
    path.write_text(json.dumps(doc))
    return path


def write_jsonl(path: Path, records: list[dict[str, Any]]) -> Path:
    path.write_text("".join(json.dumps(r) + "\n" for r in records))
    return path


def write_traj(path: Path, **extra: Any) -> Path:
    return write(path, {"trajectory": [{"action": "ls", "execution_time": 0.5}], **extra})


@pytest.mark.parametrize("info", [[1], "x", 3])
def test_a_swe_agent_info_that_is_not_an_object_is_refused_naming_it(tmp_path, info) -> None:
    path = write_traj(tmp_path / "r.traj", info=info)
    with pytest.raises(TraceImportError, match=r"r\.traj: 'info' must be an object"):
        import_swe_agent(path)


def test_a_swe_agent_file_without_info_imports_with_no_exit_status(tmp_path) -> None:
    trace = import_swe_agent(write_traj(tmp_path / "r.traj"))
    assert trace.meta["exit_status"] == {"r": None}


@pytest.mark.parametrize(
    ("changes", "named"),
    [
        ({"e2_timestamp": "2024-01-01T00:00:03Z"}, "event 2: timestamp '2024-01-01T00:00:03Z'"),
        ({"e2_extras": [1]}, "event 2: 'extras' must be an object"),
        ({"e2_extras": {"metadata": "x"}}, "event 2: 'extras.metadata' must be an object"),
        ({"e1_id": [1]}, "event 1: 'id' must be an integer or a string"),
        ({"e2_cause": [1]}, "event 2: 'cause' must be an integer or a string"),
        ({"e1_action": {"a": 1}}, "event 1: 'action' must be a string"),
        ({"e1_tool_call_metadata": "bad"}, "event 1: 'tool_call_metadata' must be an object"),
        ({"e2_id": 1}, "event 2: id 1 repeats event 1's"),
    ],
)
def test_a_malformed_openhands_event_is_refused_naming_file_event_and_key(
    tmp_path, changes, named
) -> None:
    path = write(tmp_path / "run.json", events(**changes))
    with pytest.raises(TraceImportError) as info:
        import_openhands(path)
    assert str(info.value).startswith(f"{path}: events, ") and named in str(info.value)


def test_timestamps_all_with_a_zone_import_like_naive_ones(tmp_path) -> None:
    zoned = events(
        e0_timestamp="2024-01-01T00:00:00Z",
        e1_timestamp="2024-01-01T00:00:01+00:00",
        e2_timestamp="2024-01-01T00:00:03Z",
    )
    naive = import_openhands(write(tmp_path / "a.json", events()))
    assert import_openhands(write(tmp_path / "b.json", zoned)).rows[0].t1_s == naive.rows[0].t1_s


def record(instance_id: Any = "x", latency: Any = 2.0, **changes: Any) -> dict[str, Any]:
    """An ``output.jsonl`` record whose one action came from LLM response ``r``."""
    history = events(**{"e1_tool_call_metadata": {"model_response": {"id": "r"}}, **changes})
    metrics = {"response_latencies": [{"response_id": "r", "latency": latency}]}
    return {"instance_id": instance_id, "history": history, "metrics": metrics}


@pytest.mark.parametrize("latency", ["abc", -5, None, True])
def test_a_bad_llm_latency_is_refused_naming_file_line_and_entry(tmp_path, latency) -> None:
    path = write_jsonl(tmp_path / "output.jsonl", [record(latency=latency)])
    with pytest.raises(TraceImportError) as info:
        import_openhands(path, gen="latency")
    assert str(info.value).startswith(f"{path}: line 1: metrics.response_latencies[0].latency")


def test_a_bad_tool_call_metadata_is_refused_when_latencies_are_summed(tmp_path) -> None:
    path = write_jsonl(tmp_path / "output.jsonl", [record(e1_tool_call_metadata="bad")])
    with pytest.raises(TraceImportError, match=r"line 1, event 1: 'tool_call_metadata'"):
        import_openhands(path, gen="latency")


def test_llm_latencies_still_give_the_generation_before_an_action(tmp_path) -> None:
    path = write_jsonl(tmp_path / "output.jsonl", [record()])
    assert import_openhands(path, gen="latency").rows[0].gen_before_s == 2.0


def test_a_repeated_instance_id_in_one_output_is_refused_naming_both_lines(tmp_path) -> None:
    path = write_jsonl(tmp_path / "output.jsonl", [record(), record()])
    with pytest.raises(TraceImportError, match=r"output\.jsonl: line 2: .*'x' repeats line 1"):
        import_openhands(path)


def test_an_instance_id_that_is_not_a_string_is_refused(tmp_path) -> None:
    path = write_jsonl(tmp_path / "output.jsonl", [record(instance_id=["x"])])
    with pytest.raises(TraceImportError, match=r"line 1: 'instance_id' must be a string"):
        import_openhands(path)


@pytest.mark.parametrize("gen", [float("inf"), float("nan")])
def test_a_constant_generation_must_be_finite(tmp_path, gen) -> None:
    with pytest.raises(ValueError, match="gen must be"):
        import_openhands(write(tmp_path / "run.json", events()), gen=gen)


def test_a_renamed_trajectory_never_takes_a_name_its_own_file_has(tmp_path) -> None:
    first = import_openhands(write(tmp_path / "ok.json", events()))
    second = import_openhands(
        write_jsonl(tmp_path / "o.jsonl", [record("ok"), record("ok~1"), record("ok~1-2")])
    )
    merged = merge([first, second], ["ok.json", "o.jsonl"])
    names = [t for _, t in merged.trajectories()]
    assert names == ["ok", "ok~1-3", "ok~1", "ok~1-2"]
    assert len({r.action_id for r in merged.rows}) == len(merged.rows) == 4


@pytest.mark.parametrize("offset", [float("inf"), 1e308, float("nan"), -1.0, TIME_MAX_S * 2])
def test_an_offset_range_out_of_the_formats_times_is_refused_naming_the_flag(
    tmp_path, offset
) -> None:
    trace = import_openhands(write(tmp_path / "ok.json", events()))
    with pytest.raises(ValueError, match=r"--max-offset-s must be seconds in \[0, 1e\+09\]"):
        tile(trace, 3, 0, offset)


def test_an_openhands_file_that_is_not_utf8_names_the_file_and_line(tmp_path) -> None:
    # It was a bare UnicodeDecodeError: "'utf-8' codec can't decode byte 0xff", no file named.
    path = tmp_path / "output.jsonl"
    path.write_bytes(b'{"instance_id": "a"}\n\xff\n')
    with pytest.raises(TraceImportError, match=r"output\.jsonl: line 2 is not UTF-8 text"):
        import_openhands(path)


@pytest.mark.parametrize("importer", [import_openhands, import_swe_agent])
def test_a_directory_given_as_a_file_is_refused_naming_it(tmp_path, importer) -> None:
    # OpenHands: an IsADirectoryError traceback; SWE-agent reads the *.traj files inside.
    folder = tmp_path / "run.json"
    (folder / "sub.traj").mkdir(parents=True)
    with pytest.raises(TraceImportError, match=r"sub\.traj: a directory, not a file"):
        importer(folder if importer is import_swe_agent else folder / "sub.traj")


def test_a_row_the_format_refuses_names_the_file_and_step(tmp_path):
    """A SWE-agent step of 0 s with ``min_t1_s=0`` (or a generation past the format's longest
    time) failed as a bare "field 't1_s': must be > 0", naming neither file nor step."""
    traj = tmp_path / "run.traj"
    traj.write_text(
        '{"trajectory": [{"action": "ls", "execution_time": 0.5},'
        ' {"action": "submit", "execution_time": 0.0}]}'
    )
    with pytest.raises(TraceImportError, match=r"run\.traj: trajectory step 1: field 't1_s'"):
        import_swe_agent(traj, min_t1_s=0.0)
    with pytest.raises(TraceImportError, match=r"run\.traj: trajectory step 0: field 'gen_bef"):
        import_swe_agent(traj, gen_before_s=2e9)


def test_an_openhands_row_the_format_refuses_names_the_file_and_event(tmp_path):
    """The same for OpenHands: the event whose row the format refuses is named."""
    events = tmp_path / "run.json"
    events.write_text(
        '[{"id": 0, "timestamp": "2024-06-01T10:00:00", "source": "user", "action": "message"},'
        ' {"id": 1, "timestamp": "2024-06-01T10:00:03", "source": "agent", "action": "run"},'
        ' {"id": 2, "timestamp": "2024-06-01T10:00:03", "source": "agent",'
        ' "observation": "run", "cause": 1}]'
    )
    with pytest.raises(TraceImportError, match=r"run\.json: events, event 1: field 't1_s'"):
        import_openhands(events, min_t1_s=0.0)


def test_a_byte_order_mark_opening_an_imported_file_is_accepted(tmp_path) -> None:
    """A .traj or output.jsonl saved by an editor on Windows opens with a UTF-8 byte-order
    mark; the importers refused it as "not JSON (line 1, column 1: Unexpected UTF-8 BOM)"."""
    traj = write_traj(tmp_path / "r.traj")
    plain = import_swe_agent(traj)
    traj.write_bytes(b"\xef\xbb\xbf" + traj.read_bytes())
    assert import_swe_agent(traj).rows == plain.rows
    out = write_jsonl(tmp_path / "output.jsonl", [record()])
    plain = import_openhands(out)
    out.write_bytes(b"\xef\xbb\xbf" + out.read_bytes())
    assert import_openhands(out).rows == plain.rows


@pytest.mark.parametrize("name", ["output.jsonl", "output.json"])
def test_an_openhands_file_in_utf16_names_the_encoding(tmp_path, name) -> None:
    # "line 1 is not UTF-8 text" (.jsonl) or "not a text file" (.json): no hint it is UTF-16.
    path = tmp_path / name
    path.write_bytes('{"instance_id": "a"}\n'.encode("utf-16"))
    with pytest.raises(TraceImportError, match=r"output\.jsonl?: UTF-16 text \(the file opens"):
        import_openhands(path)
