"""A row's ``t1_s`` below the smallest normal float (a subnormal, e.g. 1e-320 s) is refused
as the row's field, as the core's curves refuse it.

It passed the row's ``> 0`` check: with a ``serial_fraction`` the row built its Amdahl curve
past the core's checks (``Amdahl.prevalidated``) and the simulator ran an action whose
parallel part underflows to 0 s, which the core refuses in an ``Amdahl`` it builds itself;
without one, ``tangram sim --trace`` and ``tangram replay`` failed at the first such action
as "inelastic duration must be at least 2.22507e-308 s, got 1e-320", naming no file, line
or field.
"""

from __future__ import annotations

import json

import pytest

from tangram.trace import TraceError, load_trace
from tests.trace.rows import BASE, row


@pytest.mark.parametrize("serial_fraction", [None, 0.5])
def test_a_subnormal_t1_is_refused_as_the_rows_field(serial_fraction) -> None:
    with pytest.raises(TraceError, match=r"t1_s.*at least 2\.22507e-308") as info:
        row(t1_s=1e-320, serial_fraction=serial_fraction)
    assert info.value.field == "t1_s"


def test_a_file_names_the_line(tmp_path) -> None:
    path = tmp_path / "t.jsonl"
    record = {**BASE, "t1_s": 1e-320}
    path.write_text(json.dumps({"tangram_trace": 1}) + "\n" + json.dumps(record) + "\n")
    with pytest.raises(TraceError, match=r"line 2: field 't1_s'"):
        load_trace(path)


def test_the_smallest_normal_t1_is_taken() -> None:
    assert row(t1_s=2.0**-1022).t1_s == 2.0**-1022
