"""Trace format v1: rows, traces, and lossless round trips between JSONL, Parquet and pandas."""

from __future__ import annotations

import json

import pytest
from hypothesis import given
from hypothesis import strategies as st

from tangram.core.curves import Amdahl, Inelastic, Tabulated
from tangram.trace import (
    FIELDS,
    REQUIRED,
    TRACE_VERSION,
    Trace,
    TraceError,
    TraceRow,
    load_trace,
    write_trace,
)
from tangram.trace.row import row_to_mapping
from tests.trace.rows import row

# --- the schema ------------------------------------------------------------------------------


def test_the_fields_are_the_v1_contract_in_order():
    assert FIELDS == (
        "action_id", "trajectory", "step", "position", "task", "kind", "gen_before_s",
        "resource", "t1_s", "max_units", "serial_fraction", "curve", "service",
        "service_size_gb", "memory_gb", "arrival_s", "gen_after_s", "sync", "malleable", "service_replicas",
        "obs_arrival_s",
        "obs_units", "obs_queue_s", "obs_overhead_s", "obs_exec_s", "obs_outcome", "obs_node",
    )  # fmt: skip
    assert {
        "action_id", "trajectory", "step", "position", "task", "kind", "gen_before_s",
        "resource", "t1_s", "max_units",
    } == REQUIRED  # fmt: skip


def test_a_row_is_frozen_and_numbers_are_normalised():
    r = row(memory_gb=2, service_size_gb=0)
    assert isinstance(r.memory_gb, float) and r.memory_gb == 2.0
    with pytest.raises(AttributeError):
        r.t1_s = 3.0  # type: ignore[misc]


def test_curve_object_follows_serial_fraction_then_curve_then_inelastic():
    assert row(serial_fraction=0.25).curve_object() == Amdahl(2.0, 0.25)
    tab = Tabulated(((1, 2.0), (4, 0.8)))
    assert row(curve=tab.to_dict()).curve_object() == tab
    assert row().curve_object() == Inelastic(2.0)
    assert row(
        curve=Inelastic(2.0).to_dict(), resource="api", max_units=1, service="s"
    ).curve_object() == Inelastic(2.0)


def test_trajectories_groups_by_step_and_trajectory_in_position_order():
    rows = (
        row(action_id="b1", trajectory="b", position=1),
        row(action_id="a0", trajectory="a", position=0),
        row(action_id="b0", trajectory="b", position=0),
        row(action_id="s1a0", trajectory="a", step=1, position=0),
    )
    trace = Trace(rows, {"workload": "test"})
    groups = trace.trajectories()
    assert list(groups) == [(0, "b"), (0, "a"), (1, "a")]
    assert [r.action_id for r in groups[(0, "b")]] == ["b0", "b1"]
    assert trace.steps() == [0, 1]
    assert len(trace) == 4


def test_the_jsonl_header_carries_the_version_and_meta(tmp_path):
    trace = Trace((row(),), {"workload": "w", "seed": 3})
    path = write_trace(trace, tmp_path / "t.jsonl")
    first = json.loads(path.read_text().splitlines()[0])
    # The lowest version that holds the rows: version 1 while no row uses a newer field.
    assert first == {"tangram_trace": 1, "workload": "w", "seed": 3}
    synced = Trace((row(sync="step"),), {"workload": "w"})
    first = json.loads(write_trace(synced, tmp_path / "s.jsonl").read_text().splitlines()[0])
    assert first == {"tangram_trace": 2, "workload": "w"}
    malleable = Trace((row(malleable=True),), {"workload": "w"})
    first = json.loads(write_trace(malleable, tmp_path / "m.jsonl").read_text().splitlines()[0])
    assert first == {"tangram_trace": TRACE_VERSION, "workload": "w"}


@pytest.mark.parametrize("suffix", [".jsonl", ".parquet"])
def test_a_malleable_row_round_trips_and_only_a_cpu_row_may_be_malleable(tmp_path, suffix):
    both = Trace((row(malleable=True), row(action_id="t0-a1", position=1)), {})
    assert load_trace(write_trace(both, tmp_path / f"m{suffix}")) == both
    with pytest.raises(TraceError, match="malleable"):
        row(resource="api", service="s", serial_fraction=None, max_units=1, malleable=True)
    with pytest.raises(TraceError, match="malleable"):
        row(malleable="yes")
    with pytest.raises(TraceError, match="service_replicas"):
        row(service_replicas=True)  # a cpu row


@pytest.mark.parametrize("suffix", [".jsonl", ".parquet"])
def test_a_sync_row_round_trips_and_a_v1_file_is_written_without_it(tmp_path, suffix):
    synced = Trace((row(sync="step"),), {})
    assert load_trace(write_trace(synced, tmp_path / f"s{suffix}")) == synced
    plain = Trace((row(),), {})
    assert load_trace(write_trace(plain, tmp_path / f"p{suffix}")) == plain


def test_a_v1_file_with_a_field_of_version_2_is_refused_naming_it(tmp_path):
    path = tmp_path / "t.jsonl"
    record = row_to_mapping(row(sync="step"), drop_defaults=True)
    path.write_text(json.dumps({"tangram_trace": 1}) + "\n" + json.dumps(record) + "\n")
    with pytest.raises(TraceError, match="field 'sync'.*version 2.*declares version 1"):
        load_trace(path)


def test_jsonl_omits_optional_fields_at_their_defaults(tmp_path):
    path = write_trace(Trace((row(),), {}), tmp_path / "t.jsonl")
    assert set(json.loads(path.read_text().splitlines()[1])) == REQUIRED


def test_parquet_stores_curve_as_json_and_meta_in_the_schema(tmp_path):
    import pyarrow.parquet as pq

    trace = Trace((row(curve=Amdahl(2.0, 0.5).to_dict()),), {"workload": "w"})
    path = write_trace(trace, tmp_path / "t.parquet")
    table = pq.read_table(path)
    v1 = [f for f in FIELDS if f not in ("sync", "malleable", "service_replicas")]
    assert table.column_names == v1
    assert json.loads(table.column("curve")[0].as_py()) == {
        "kind": "amdahl",
        "t1": 2.0,
        "serial_fraction": 0.5,
    }
    assert json.loads(table.schema.metadata[b"tangram_trace"]) == {
        "tangram_trace": 1,
        "workload": "w",
    }


def test_gzipped_jsonl_is_byte_for_byte_reproducible(tmp_path):
    trace = Trace((row(),), {"workload": "w"})
    a = write_trace(trace, tmp_path / "a.jsonl.gz").read_bytes()
    b = write_trace(trace, tmp_path / "b.jsonl.gz").read_bytes()
    assert a == b


def test_an_unknown_suffix_is_refused(tmp_path):
    with pytest.raises(TraceError, match=r"unknown trace file type 't\.csv'"):
        write_trace(Trace((row(),), {}), tmp_path / "t.csv")


# --- property: every row survives every representation ----------------------------------------

times = st.floats(min_value=0, max_value=1e6, allow_nan=False, allow_infinity=False)
positive = st.floats(min_value=1e-6, max_value=1e6, allow_nan=False, allow_infinity=False)
names = st.text(st.characters(codec="utf-8", exclude_categories=("Cs",)), min_size=1, max_size=8)


@st.composite
def action_fields(draw, open_loop: bool) -> dict:
    resource = draw(st.sampled_from(["cpu", "gpu", "api"]))
    t1 = draw(positive)
    out: dict = {"resource": resource, "t1_s": t1, "task": draw(names), "kind": draw(names)}
    out["gen_before_s"] = draw(times)
    if resource == "cpu":
        out["max_units"] = draw(st.integers(1, 64))
        out["memory_gb"] = draw(times)
    elif resource == "gpu":
        out["max_units"] = draw(st.sampled_from([1, 2, 4, 8]))
    else:
        out["max_units"] = 1
    if resource != "cpu":
        out["service"] = draw(names)
        out["service_size_gb"] = draw(times)
    if resource != "api":
        elastic = draw(st.sampled_from(["none", "serial", "amdahl", "tabulated"]))
        if elastic == "serial":
            out["serial_fraction"] = draw(st.floats(0, 1))
        elif elastic == "amdahl":
            out["curve"] = Amdahl(t1, draw(st.floats(0, 1))).to_dict()
        elif elastic == "tabulated":
            out["curve"] = Tabulated(((1, t1), (2, t1 * draw(st.floats(0.5, 1))))).to_dict()
    if open_loop:
        out["arrival_s"] = draw(times)
    for name in ("obs_arrival_s", "obs_queue_s", "obs_overhead_s", "obs_exec_s"):
        out[name] = draw(st.none() | times)
    # Observed units a grant can have: up to max_units on CPU/API, any cell on a GPU (a
    # sharded model may need a wider cell than max_units).
    granted = (
        st.sampled_from([1, 2, 4, 8]) if resource == "gpu" else st.integers(1, out["max_units"])
    )
    out["obs_units"] = draw(st.none() | granted)
    out["obs_outcome"] = draw(st.none() | st.sampled_from(["result", "error", "timeout"]))
    out["obs_node"] = draw(st.none() | names)
    return out


@st.composite
def traces(draw) -> Trace:
    open_loop = draw(st.booleans())
    rows = []
    sizes: dict[str, float] = {}  # a GPU service has one size (the first drawn)
    for step in range(draw(st.integers(1, 2))):
        for t in range(draw(st.integers(1, 3))):
            n = draw(st.integers(1, 4))
            for pos in range(n):
                fields = draw(action_fields(open_loop))
                if pos == n - 1:
                    fields["gen_after_s"] = draw(times)
                if fields["resource"] == "gpu":
                    size = sizes.setdefault(fields["service"], fields["service_size_gb"])
                    fields["service_size_gb"] = size
                rows.append(
                    TraceRow(
                        action_id=f"{step}-{t}-{pos}",
                        trajectory=f"traj{t}",
                        step=step,
                        position=pos,
                        **fields,
                    )
                )
    rows = draw(st.permutations(rows))  # file order need not be position order
    meta = {"workload": draw(names), "seed": draw(st.integers(0, 2**31)), "params": {"x": [1.5, 2]}}
    return Trace(tuple(rows), meta)


@given(traces())
def test_round_trip_jsonl_parquet_dataframe_preserves_every_row(tmp_path_factory, trace):
    tmp = tmp_path_factory.mktemp("rt")
    via_jsonl = load_trace(write_trace(trace, tmp / "t.jsonl"))
    via_gzip = load_trace(write_trace(via_jsonl, tmp / "t.jsonl.gz"))
    via_parquet = load_trace(write_trace(via_gzip, tmp / "t.parquet"))
    via_frame = Trace.from_dataframe(via_parquet.to_dataframe())
    for copy in (via_jsonl, via_gzip, via_parquet, via_frame):
        assert copy.rows == trace.rows
        assert copy.meta == trace.meta
