"""Trace format v1, the vocabulary both drivers share: rows, traces, their files, and the
conversions to the core's actions and from live observations (``docs/trace-format.md``).

It imports only ``tangram.core`` (never ``tangram.sim`` or ``tangram.exec``), so the simulator
and the live runtime both stand on it. Replay calibration is in ``tangram.trace.calibrate``.
"""

from __future__ import annotations

from tangram.trace.convert import LiveObservation, row_from_observation, row_to_action
from tangram.trace.errors import TraceError
from tangram.trace.files import (
    load_trace,
    read_jsonl,
    read_parquet,
    write_jsonl,
    write_parquet,
    write_trace,
)
from tangram.trace.header import HEADER_KEY, TRACE_VERSION
from tangram.trace.row import (
    FIELDS,
    OUTCOMES,
    REQUIRED,
    RESOURCES,
    TraceRow,
    is_nonnegative_number,
    row_from_mapping,
    row_to_mapping,
)
from tangram.trace.trace import Trace, check_rows

__all__ = [
    "FIELDS",
    "HEADER_KEY",
    "OUTCOMES",
    "REQUIRED",
    "RESOURCES",
    "TRACE_VERSION",
    "LiveObservation",
    "Trace",
    "TraceError",
    "TraceRow",
    "is_nonnegative_number",
    "check_rows",
    "load_trace",
    "read_jsonl",
    "read_parquet",
    "row_from_mapping",
    "row_from_observation",
    "row_to_action",
    "row_to_mapping",
    "write_jsonl",
    "write_parquet",
    "write_trace",
]
