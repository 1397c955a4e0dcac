"""Trace format v1, kept importable here: the format now lives in ``tangram.trace``.

The simulator and the live runtime share the format, so it moved below both drivers
(``tangram/trace/``). Every name this module had is re-exported unchanged.
"""

from __future__ import annotations

from tangram.trace import (
    FIELDS,
    HEADER_KEY,
    OUTCOMES,
    REQUIRED,
    RESOURCES,
    TRACE_VERSION,
    Trace,
    TraceError,
    TraceRow,
    check_rows,
    load_trace,
    read_jsonl,
    read_parquet,
    row_from_mapping,
    row_to_mapping,
    write_jsonl,
    write_parquet,
    write_trace,
)

__all__ = [
    "FIELDS",
    "HEADER_KEY",
    "OUTCOMES",
    "REQUIRED",
    "RESOURCES",
    "TRACE_VERSION",
    "Trace",
    "TraceError",
    "TraceRow",
    "check_rows",
    "load_trace",
    "read_jsonl",
    "read_parquet",
    "row_from_mapping",
    "row_to_mapping",
    "write_jsonl",
    "write_parquet",
    "write_trace",
]
