"""Loading validates every row: a bad file fails naming the file, the line (or row) and field."""

from __future__ import annotations

import gzip
import json

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from tangram.trace import Trace, TraceError, TraceRow, load_trace, write_trace

HEADER = {"tangram_trace": 1, "workload": "test"}


def good(position: int = 0, **kw) -> dict:
    """A valid row as it appears in a file."""
    return {
        "action_id": f"t0-a{position}",
        "trajectory": "t0",
        "step": 0,
        "position": position,
        "task": "coding",
        "kind": "env",
        "gen_before_s": 1.0,
        "resource": "cpu",
        "t1_s": 0.5,
        "max_units": 8,
        **kw,
    }


GPU_CALL = {"resource": "gpu", "max_units": 1, "service": "judge"}


def write_lines(path, objects) -> None:
    path.write_text("".join(json.dumps(o) + "\n" for o in objects))


def load_error(tmp_path, rows, header=HEADER) -> TraceError:
    path = tmp_path / "bad.jsonl"
    write_lines(path, [header, *rows])
    with pytest.raises(TraceError) as info:
        load_trace(path)
    return info.value


# Each case: the rows after the header; the bad one is on file line 3 (line 1 is the header).
CASES = {
    "wrong type": ([good(0), good(1, t1_s="fast")], "t1_s", "expected a number, got str 'fast'"),
    "missing required field": (
        [good(0), {k: v for k, v in good(1).items() if k != "t1_s"}],
        "t1_s",
        "missing required field",
    ),
    "unknown field": ([good(0), good(1, colour="red")], "colour", "unknown field"),
    "negative time": ([good(0), good(1, gen_before_s=-2.0)], "gen_before_s", "cannot be negative"),
    "zero t1": ([good(0), good(1, t1_s=0)], "t1_s", "must be > 0"),
    "bad resource": (
        [good(0), good(1, resource="tpu")],
        "resource",
        "must be one of ['cpu', 'gpu', 'api']",
    ),
    "gpu units not a power of two": (
        [good(0), good(1, resource="gpu", max_units=3, service="m")],
        "max_units",
        "power of two",
    ),
    "api without service": (
        [good(0), good(1, resource="api", max_units=1)],
        "service",
        "must name its service",
    ),
    "api with elasticity": (
        [good(0), good(1, resource="api", max_units=1, service="s", serial_fraction=0.5)],
        "serial_fraction",
        "inelastic",
    ),
    "integer field given a float": ([good(0), good(1, step=0.5)], "step", "expected an integer"),
    "bool is not a number": ([good(0), good(1, t1_s=True)], "t1_s", "expected a number"),
    "serial fraction above one": (
        [good(0), good(1, serial_fraction=1.5)],
        "serial_fraction",
        "[0, 1]",
    ),
    "curve and serial fraction both": (
        [
            good(0),
            good(
                1, serial_fraction=0.5, curve={"kind": "amdahl", "t1": 0.5, "serial_fraction": 0.5}
            ),
        ],
        "curve",
        "not both",
    ),
    "curve of unknown kind": (
        [good(0), good(1, curve={"kind": "magic"})],
        "curve",
        "unknown curve kind",
    ),
    "curve slower with more units": (
        [good(0), good(1, curve={"kind": "tabulated", "points": [[1, 0.5], [2, 0.9]]})],
        "curve",
        "slower",
    ),
    "curve t1 disagrees": (
        [good(0), good(1, curve={"kind": "inelastic", "t1": 3.0})],
        "curve",
        "differs from t1_s",
    ),
    "bad outcome": ([good(0), good(1, obs_outcome="crashed")], "obs_outcome", "must be one of"),
    "zero observed units": ([good(0), good(1, obs_units=0)], "obs_units", "must be >= 1"),
    "empty trajectory id": ([good(0), good(1, trajectory="")], "trajectory", "non-empty"),
    "positions not contiguous": ([good(0), good(2)], "position", "position 1 is missing"),
    "position repeated": (
        [good(0), good(0, action_id="other")],
        "position",
        "two actions at position 0",
    ),
    "duplicate action_id": (
        [good(0), good(0, trajectory="t1")],
        "action_id",
        "duplicate action_id 't0-a0' (first at line 2)",
    ),
    "generation after a non-last action": (
        [good(1), good(0, gen_after_s=3.0)],
        "gen_after_s",
        "only the last action",
    ),
    "open and closed loop mixed": ([good(0, arrival_s=1.0), good(1)], "arrival_s", "on every row"),
    # The core finds a service resident by name: the 70-GB call ran as a hit on the 10-GB copy.
    "one service, two sizes": (
        [good(0, **GPU_CALL, service_size_gb=10.0), good(1, **GPU_CALL, service_size_gb=70.0)],
        "service_size_gb",
        "service 'judge' has service_size_gb 10.0 at line 2 but 70.0 here",
    ),
}


@pytest.mark.parametrize("case", sorted(CASES))
def test_a_bad_row_names_file_line_and_field(tmp_path, case):
    rows, field, reason = CASES[case]
    err = load_error(tmp_path, rows)
    assert err.field == field
    assert err.where == "line 3"
    assert reason in err.reason
    assert str(err).startswith(f"{tmp_path / 'bad.jsonl'}, line 3: field {field!r}: ")


def test_a_future_version_is_refused_clearly(tmp_path):
    err = load_error(tmp_path, [good(0)], header={"tangram_trace": 4})
    assert (err.where, err.field) == ("line 1", "tangram_trace")
    assert "version 4 is newer than this Tangram reads (version 3)" in str(err)


def test_a_file_without_a_header_is_not_a_trace(tmp_path):
    err = load_error(tmp_path, [good(1)], header=good(0))
    assert (err.where, err.field) == ("line 1", "tangram_trace")
    assert "not a Tangram trace header" in str(err)


def test_a_line_that_is_not_json_is_named(tmp_path):
    path = tmp_path / "bad.jsonl"
    path.write_text(json.dumps(HEADER) + "\n" + json.dumps(good(0)) + "\n{oops\n")
    with pytest.raises(TraceError, match=r"bad\.jsonl, line 3: not valid JSON"):
        load_trace(path)


def test_gzipped_jsonl_reports_the_uncompressed_line(tmp_path):
    path = tmp_path / "bad.jsonl.gz"
    text = "".join(json.dumps(o) + "\n" for o in [HEADER, good(0), good(1, resource="tpu")])
    path.write_bytes(gzip.compress(text.encode()))
    with pytest.raises(TraceError, match=r"bad\.jsonl\.gz, line 3: field 'resource'"):
        load_trace(path)


def test_a_missing_file_is_named(tmp_path):
    with pytest.raises(TraceError, match=r"nope\.jsonl: no such file"):
        load_trace(tmp_path / "nope.jsonl")


def parquet_with(tmp_path, t1_values, version=1):
    rows = [good(i, t1_s=t) for i, t in enumerate(t1_values)]
    table = pa.Table.from_pylist(rows)
    table = table.replace_schema_metadata({"tangram_trace": json.dumps({"tangram_trace": version})})
    path = tmp_path / "bad.parquet"
    pq.write_table(table, path)
    return path


def test_a_bad_parquet_row_names_its_row_index_and_field(tmp_path):
    path = parquet_with(tmp_path, [0.5, 0.5, -1.0])
    with pytest.raises(TraceError) as info:
        load_trace(path)
    assert (info.value.where, info.value.field) == ("row 2", "t1_s")
    assert "bad.parquet, row 2: field 't1_s': must be > 0" in str(info.value)


def test_a_parquet_of_a_future_version_is_refused(tmp_path):
    with pytest.raises(TraceError, match="version 4 is newer"):
        load_trace(parquet_with(tmp_path, [0.5], version=4))


def test_a_parquet_without_tangram_metadata_is_not_a_trace(tmp_path):
    path = tmp_path / "plain.parquet"
    pq.write_table(pa.Table.from_pylist([good(0)]), path)
    with pytest.raises(TraceError, match="no 'tangram_trace' key in the Parquet schema metadata"):
        load_trace(path)


def test_a_bad_dataframe_row_names_its_index(tmp_path):
    trace = Trace((TraceRow(**good(0)), TraceRow(**good(1))), {})
    df = trace.to_dataframe()
    df.loc[1, "resource"] = "tpu"
    with pytest.raises(TraceError, match=r"row 1: field 'resource'"):
        Trace.from_dataframe(df)


def test_a_dataframe_curve_that_is_not_json_names_its_row():
    """A curve cell that is not JSON failed before the row was built: the error named the
    field but no row, unlike every other bad cell of a frame."""
    trace = Trace((TraceRow(**good(0)), TraceRow(**good(1))), {})
    df = trace.to_dataframe()
    df.loc[1, "curve"] = "{bad"
    with pytest.raises(TraceError, match=r"^row 1: field 'curve': not valid JSON"):
        Trace.from_dataframe(df)


def test_rows_built_in_code_are_validated_too():
    with pytest.raises(TraceError, match=r"field 'max_units': .*power of two"):
        TraceRow(**good(0, resource="gpu", max_units=6, service="m"))
    with pytest.raises(TraceError, match=r"row 1: field 'position'"):
        Trace((TraceRow(**good(0)), TraceRow(**good(2))), {})


def test_a_valid_file_loads(tmp_path):
    path = tmp_path / "ok.jsonl"
    write_lines(path, [HEADER, good(0), good(1, gen_after_s=2.0)])
    trace = load_trace(path)
    assert [r.position for r in trace.rows] == [0, 1]
    assert trace.meta == {"workload": "test"}
    assert load_trace(write_trace(trace, tmp_path / "ok.parquet")) == trace


def test_one_service_has_one_layout_and_other_kinds_may_share_its_name(tmp_path):
    rows = [good(0, **GPU_CALL), good(1, **GPU_CALL, service_replicas=True)]
    err = load_error(tmp_path, rows, {"tangram_trace": 3})
    assert err.field == "service_replicas" and err.where == "line 3"
    # An API endpoint named like a GPU model is another service (the core keys them apart).
    api = good(1, resource="api", max_units=1, service="judge")
    trace = Trace((TraceRow(**good(0, **GPU_CALL, service_size_gb=10.0)), TraceRow(**api)), {})
    assert len(trace) == 2


@pytest.mark.parametrize(
    "field",
    ["service_size_gb", "memory_gb", "gen_after_s", "malleable", "service_replicas", "sync"],
)
def test_an_optional_field_given_as_null_reads_as_its_default(tmp_path, field):
    """The format says an optional field "may be omitted (or null), which means its default";
    a JSONL row with "memory_gb": null (or a null malleable...) was refused."""
    path = tmp_path / "nulls.jsonl"
    write_lines(path, [{"tangram_trace": 3}, good(0, **{field: None})])
    row = load_trace(path).rows[0]
    assert getattr(row, field) == getattr(TraceRow(**good(0)), field)
    with pytest.raises(TraceError, match=r"line 2: field 't1_s': expected a number"):
        write_lines(path, [{"tangram_trace": 3}, good(0, t1_s=None)])  # required: refused
        load_trace(path)


def test_a_data_frame_written_by_pandas_is_refused_with_the_way_to_convert_it(tmp_path):
    """``Trace.to_dataframe().to_parquet(path)`` keeps the meta in pandas' attributes, not in
    a trace header: refused as "not a Tangram trace" with no way forward. The error says how
    to write it as a trace, and that way reads back."""
    import pandas as pd

    trace = Trace((TraceRow(**good(0)), TraceRow(**good(1))), {"workload": "test"})
    path = tmp_path / "frame.parquet"
    trace.to_dataframe().to_parquet(path)
    with pytest.raises(TraceError, match=r"\(not a Tangram trace\); it looks like a data frame"):
        load_trace(path)
    write_trace(Trace.from_dataframe(pd.read_parquet(path)), path)
    assert load_trace(path).rows == trace.rows


def test_a_repeated_key_in_a_jsonl_row_is_refused_naming_key_and_line(tmp_path):
    """JSON keeps the last of a repeated key, so a row reading ``"t1_s": 0.5, ..., "t1_s": 50``
    loaded as 50 without a word; it is refused, naming the key and the line."""
    path = tmp_path / "dup.jsonl"
    row = json.dumps(good(1))[:-1] + ', "t1_s": 50.0}'
    path.write_text(json.dumps(HEADER) + "\n" + json.dumps(good(0)) + "\n" + row + "\n")
    with pytest.raises(TraceError) as info:
        load_trace(path)
    assert (info.value.where, info.value.field) == ("line 3", "t1_s")
    assert "more than once" in str(info.value) and "dup.jsonl" in str(info.value)
    head = tmp_path / "head.jsonl"
    head.write_text('{"tangram_trace": 1, "tangram_trace": 2}\n' + json.dumps(good(0)) + "\n")
    with pytest.raises(TraceError, match=r"line 1: field 'tangram_trace': .*more than once"):
        load_trace(head)


def test_a_repeated_key_in_a_parquet_header_or_curve_is_refused(tmp_path):
    path = parquet_with(tmp_path, [0.5])
    table = pq.read_table(path).replace_schema_metadata(
        {"tangram_trace": '{"tangram_trace": 1, "workload": "a", "workload": "b"}'}
    )
    pq.write_table(table, path)
    with pytest.raises(TraceError, match=r"header: field 'workload': .*more than once"):
        load_trace(path)
    trace = Trace((TraceRow(**good(0)),), {})
    df = trace.to_dataframe()
    df["curve"] = '{"serial_fraction": 0.1, "serial_fraction": 0.9}'
    with pytest.raises(TraceError, match=r"row 0: field 'curve': key 'serial_fraction'"):
        Trace.from_dataframe(df)


@pytest.mark.parametrize("suffix", [".jsonl", ".jsonl.gz"])
def test_a_utf8_byte_order_mark_opening_a_jsonl_trace_is_accepted(tmp_path, suffix):
    """Editors on Windows open a UTF-8 file with a byte-order mark; the trace was refused as
    "line 1: not valid JSON (Unexpected UTF-8 BOM)"."""
    text = "".join(json.dumps(o) + "\n" for o in [HEADER, good(0)])
    data = b"\xef\xbb\xbf" + text.encode()
    path = tmp_path / f"bom{suffix}"
    path.write_bytes(gzip.compress(data) if suffix.endswith(".gz") else data)
    trace = load_trace(path)
    assert trace.meta == {"workload": "test"} and trace.rows == (TraceRow(**good(0)),)
    # Only at the very start: a mark inside the file is still not JSON.
    path.write_bytes(text.encode() + b"\xef\xbb\xbf" + json.dumps(good(1)).encode() + b"\n")
    with pytest.raises(TraceError, match="line 3: not valid JSON"):
        load_trace(path if suffix == ".jsonl" else path.rename(tmp_path / "plain.jsonl"))


def test_a_dataframe_with_a_repeated_column_is_refused_naming_it():
    """Two ``t1_s`` columns (a concat along the wrong axis) crashed with AttributeError
    ("'DataFrame' object has no attribute 'tolist'"): ``df[name]`` is then a frame."""
    import pandas as pd

    df = Trace((TraceRow(**good(0)),), {}).to_dataframe()
    df = pd.concat([df, df[["t1_s"]] * 100], axis=1)
    with pytest.raises(TraceError, match=r"^columns: field 't1_s': .*more than once"):
        Trace.from_dataframe(df)


@pytest.mark.parametrize("value", ["NaN", "Infinity", "-Infinity"])
def test_a_header_number_that_is_not_finite_is_refused_naming_its_key(tmp_path, value):
    """A header holding NaN or Infinity (not JSON, though Python's json reads it) was taken,
    and ``tangram sim --json`` printed the value as null: a silently changed meta. It is
    refused naming the file, the place and the key's path, in JSONL and Parquet headers; a
    writer refuses such a meta rather than write a file no reader takes."""
    text = '{"tangram_trace": 1, "params": {"sigmas": [0.5, ' + value + "]}}\n"
    path = tmp_path / "nan.jsonl"
    path.write_text(text + json.dumps(good(0)) + "\n")
    with pytest.raises(TraceError, match=r"nan.jsonl, line 1: field 'params.sigmas\[1\]': "):
        load_trace(path)
    table = pq.read_table(parquet_with(tmp_path, [0.5]))
    table = table.replace_schema_metadata({"tangram_trace": text})
    pq.write_table(table, tmp_path / "nan.parquet")
    with pytest.raises(TraceError, match=r"header: field 'params.sigmas\[1\]': .*finite"):
        load_trace(tmp_path / "nan.parquet")
    trace = Trace((TraceRow(**good(0)),), {"seed": float(value)})
    for name in ("out.jsonl", "out.parquet"):
        with pytest.raises(TraceError, match=r"header: field 'seed': must be a finite number"):
            write_trace(trace, tmp_path / name)
        assert not (tmp_path / name).exists()


def test_json_nested_past_the_parsers_recursion_is_refused_in_parquet_and_frames(tmp_path):
    """A Parquet header or a ``curve`` cell nested past the JSON parser's recursion ended in
    a RecursionError traceback; it is a TraceError naming the place and the field."""
    deep = "[" * 100_000 + "]" * 100_000
    path = parquet_with(tmp_path, [0.5])
    table = pq.read_table(path).replace_schema_metadata({"tangram_trace": deep})
    pq.write_table(table, path)
    with pytest.raises(TraceError, match=r"bad\.parquet, header: JSON nested too deeply"):
        load_trace(path)
    df = Trace((TraceRow(**good(0)),), {}).to_dataframe()
    df["curve"] = deep
    with pytest.raises(TraceError, match=r"^row 0: field 'curve': JSON nested too deeply"):
        Trace.from_dataframe(df)
