"""Input checks found by stop 26's hunt: each bad value is refused naming its field.

Integers fit the Parquet layout's int64, times stay below ``TIME_MAX_S`` (where float seconds
still resolve microseconds), and a curve dict has exactly its kind's keys with values of their
types.
"""

from __future__ import annotations

import json

import pytest

from tangram.trace import Trace, TraceError, load_trace, write_trace
from tangram.trace.row import INT_MAX, TIME_MAX_S
from tests.trace.rows import BASE, row


def error_of(**fields) -> TraceError:
    with pytest.raises(TraceError) as info:
        row(**fields)
    return info.value


@pytest.mark.parametrize("field", ["step", "position", "max_units", "obs_units"])
def test_an_integer_beyond_int64_is_refused_naming_its_field(field) -> None:
    err = error_of(**{field: 10**30})
    assert err.field == field and "int64" in err.reason


def test_the_largest_int64_is_still_a_valid_step(tmp_path) -> None:
    path = write_trace(Trace((row(step=INT_MAX),), {}), tmp_path / "t.parquet")
    assert load_trace(path).rows[0].step == INT_MAX


@pytest.mark.parametrize(
    "field", ["gen_before_s", "t1_s", "arrival_s", "gen_after_s", "obs_exec_s", "obs_queue_s"]
)
def test_a_time_beyond_the_formats_longest_is_refused_naming_its_field(field) -> None:
    err = error_of(**{field: 1e300})
    assert err.field == field and f"{TIME_MAX_S:g}" in err.reason


def test_a_time_at_the_formats_longest_is_valid() -> None:
    assert row(gen_before_s=TIME_MAX_S).gen_before_s == TIME_MAX_S


def test_a_huge_time_in_a_file_names_the_file_line_and_field(tmp_path) -> None:
    path = tmp_path / "t.jsonl"
    path.write_text(json.dumps({"tangram_trace": 1}) + "\n" + json.dumps({**BASE, "t1_s": 1e300}))
    with pytest.raises(TraceError, match=r"t\.jsonl, line 2: field 't1_s': must be <= 1e\+09"):
        load_trace(path)


@pytest.mark.parametrize(
    ("curve", "names"),
    [
        ({"kind": [1], "t1": 2.0}, "unknown curve kind [1]"),
        ({"kind": "inelastic", "t1": "2.0"}, "'t1' must be a number, got str"),
        ({"kind": "inelastic", "t1": True}, "'t1' must be a number, got bool"),
        ({"kind": "amdahl", "t1": 2.0}, "missing key 'serial_fraction'"),
        ({"kind": "amdahl", "t1": 2.0, "serial_fraction": "0.5"}, "'serial_fraction' must be"),
        ({"kind": "inelastic", "t1": 2.0, "x": 3}, "unknown key 'x'"),
        ({"kind": "tabulated", "points": [[True, 2.0], [2, 1.0]]}, "points[0] units must be"),
        ({"kind": "tabulated", "points": [[1, 2.0], [1.5, 1.0]]}, "points[1] units must be"),
        ({"kind": "tabulated", "points": [[1, 2.0], [2, "1"]]}, "'points[1] seconds' must be"),
        ({"kind": "tabulated", "points": [[1, 2.0, 3]]}, "points[0] must be a [units, seconds]"),
        ({"kind": "tabulated", "points": "x"}, "'points' must be a list"),
    ],
)
def test_a_malformed_curve_is_refused_naming_the_curve_and_what_is_wrong(curve, names) -> None:
    err = error_of(curve=curve)
    assert err.field == "curve" and names in err.reason


@pytest.mark.parametrize(
    "curve",
    [
        {"kind": "inelastic", "t1": 2},
        {"kind": "amdahl", "t1": 2.0, "serial_fraction": 0},
        {"kind": "tabulated", "points": [[1, 2.0], [4, 1.0]]},
    ],
)
def test_every_curve_kind_written_by_to_dict_still_reads(curve) -> None:
    assert row(curve=curve).curve_object().t1 == 2.0


def test_observed_units_past_max_units_are_refused_naming_both() -> None:
    err = error_of(max_units=1, obs_units=1000)
    assert err.field == "obs_units" and "1000" in err.reason and "max_units is 1" in err.reason


def test_observed_gpu_cells_may_be_wider_than_max_units_but_must_be_cells() -> None:
    # A layer-sharded model too large for one GPU runs a max_units=1 call on a 4-GPU cell.
    gpu = {"resource": "gpu", "service": "big", "max_units": 1, "serial_fraction": None}
    assert row(**gpu, obs_units=4).obs_units == 4
    err = error_of(**gpu, obs_units=3)
    assert err.field == "obs_units" and "cell" in err.reason


@pytest.mark.parametrize(
    "field", ["gen_before_s", "t1_s", "serial_fraction", "memory_gb", "arrival_s", "obs_exec_s"]
)
def test_an_integer_past_floats_range_is_refused_naming_its_field(tmp_path, field) -> None:
    # JSON reads 10**400 as a Python int: float() of it raised OverflowError, a traceback.
    path = tmp_path / "t.jsonl"
    path.write_text(json.dumps({"tangram_trace": 1}) + "\n" + json.dumps({**BASE, field: 10**400}))
    with pytest.raises(TraceError, match=rf"line 2: field '{field}': must be a finite number"):
        load_trace(path)
