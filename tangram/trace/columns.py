"""The flat, one-column-per-field layout of Parquet files and data frames (curve as JSON text).

A row becomes a flat record with :func:`to_flat`; a cell read back from pandas or Arrow
becomes a plain Python value for the row constructor with :func:`from_cell`.
"""

from __future__ import annotations

import json
import math
from typing import Any

from tangram.trace.errors import TraceError, loads_unique
from tangram.trace.row import FIELDS, REQUIRED, TraceRow, row_to_mapping

_FLOAT_FIELDS = (
    "gen_before_s",
    "t1_s",
    "serial_fraction",
    "service_size_gb",
    "memory_gb",
    "arrival_s",
    "gen_after_s",
    "obs_arrival_s",
    "obs_queue_s",
    "obs_overhead_s",
    "obs_exec_s",
)
_TYPED = {
    "step": "int64",
    "position": "int64",
    "max_units": "int64",
    "obs_units": "Int64",
    "malleable": "bool",
    "service_replicas": "bool",
    **dict.fromkeys(_FLOAT_FIELDS, "float64"),
}

#: The pandas dtype of each field's column (``Int64`` is pandas' nullable integer).
DTYPES: dict[str, str] = {name: _TYPED.get(name, "object") for name in FIELDS}


def to_flat(row: TraceRow) -> dict[str, Any]:
    """The row as a flat record in schema order, ``curve`` as JSON text (sorted keys)."""
    out = row_to_mapping(row)
    if out["curve"] is not None:
        out["curve"] = json.dumps(out["curve"], sort_keys=True)
    return out


def from_cell(name: str, value: Any) -> Any:
    """A data-frame cell back to a plain Python value for the row constructor."""
    if value is None:
        return None
    try:
        import pandas as pd

        if value is pd.NA or value is pd.NaT:
            return None
    except ImportError:  # pragma: no cover - pandas is a dependency
        pass
    if hasattr(value, "item") and not isinstance(value, str | bytes):
        value = value.item()  # numpy scalar -> Python
    if isinstance(value, float) and math.isnan(value) and name not in REQUIRED:
        return None
    if name == "obs_units" and isinstance(value, float) and value.is_integer():
        return int(value)  # int column promoted to float by missing values
    if name == "curve" and isinstance(value, str):
        try:
            return loads_unique(value)
        except json.JSONDecodeError as exc:
            raise TraceError(f"not valid JSON: {exc.msg}", field="curve") from None
        except TraceError as exc:  # a repeated key inside the curve object, or too deep
            if exc.field is None:
                raise TraceError(exc.reason, field="curve") from None
            raise TraceError(f"key {exc.field!r} appears more than once", field="curve") from None
    return value
