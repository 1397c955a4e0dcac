"""Trace format v1: one row per action, stored as JSONL (optionally gzipped) or Parquet.

A trace is what the simulator replays and what a live run records: for every action, which
trajectory and RL step it belongs to, its place in the trajectory, the LLM generation time
around it, its key elastic resource, its time on one unit and how it scales, the service it
calls and its memory. ``docs/trace-format.md`` is the reference for the schema; this module
is its only reader and writer, and it validates every row on load so that a bad file fails
with a message naming the file, the line (JSONL) or row index (Parquet), the field and why.
"""

from __future__ import annotations

import gzip
import json
import math
import numbers
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import MISSING, dataclass, field, fields
from pathlib import Path
from typing import Any

from tangram.core.curves import (
    Amdahl,
    CurveError,
    ElasticityCurve,
    Inelastic,
    curve_from_dict,
)
from tangram.core.resources import GPU_CELL_SIZES

#: The schema version this code reads and writes (the ``tangram_trace`` header key).
TRACE_VERSION = 1

#: Key of the header object (JSONL), of the Arrow schema metadata (Parquet) and of ``df.attrs``.
HEADER_KEY = "tangram_trace"

RESOURCES = ("cpu", "gpu", "api")
OUTCOMES = ("result", "error", "timeout")

#: Relative tolerance when checking that a curve's one-unit time agrees with ``t1_s``.
_CURVE_T1_RTOL = 1e-6


class TraceError(ValueError):
    """A trace that does not follow format v1.

    ``path`` is the file, ``where`` the location inside it ("line 7" for JSONL, "row 3" for
    Parquet and data frames, "header"), ``field`` the offending field (``None`` for a problem
    with the row as a whole) and ``reason`` what is wrong with it.
    """

    def __init__(
        self,
        reason: str,
        *,
        field: str | None = None,
        where: str | None = None,
        path: str | Path | None = None,
    ) -> None:
        self.reason = reason
        self.field = field
        self.where = where
        self.path = None if path is None else str(path)
        location = ", ".join(p for p in (self.path, where) if p)
        subject = f"field {field!r}: " if field else ""
        super().__init__(f"{location}: {subject}{reason}" if location else f"{subject}{reason}")

    def located(self, *, where: str | None = None, path: str | Path | None = None) -> TraceError:
        """The same error with its location filled in (keeps what is already known)."""
        return TraceError(
            self.reason,
            field=self.field,
            where=self.where or where,
            path=self.path or path,
        )


# ---------------------------------------------------------------------------------------------
# Field checks: each returns the normalised value or raises TraceError(field=...).


def _fail(name: str, reason: str) -> TraceError:
    return TraceError(reason, field=name)


def _as_str(name: str, value: Any, *, optional: bool = False) -> str | None:
    if value is None and optional:
        return None
    if not isinstance(value, str):
        raise _fail(name, f"expected a string, got {type(value).__name__} {value!r}")
    if not value:
        raise _fail(name, "must be a non-empty string")
    return value


def _as_int(name: str, value: Any, *, minimum: int, optional: bool = False) -> int | None:
    if value is None and optional:
        return None
    if isinstance(value, bool) or not isinstance(value, numbers.Integral):
        raise _fail(name, f"expected an integer, got {type(value).__name__} {value!r}")
    value = int(value)
    if value < minimum:
        raise _fail(name, f"must be >= {minimum}, got {value}")
    return value


def _as_float(
    name: str, value: Any, *, positive: bool = False, optional: bool = False
) -> float | None:
    if value is None and optional:
        return None
    if isinstance(value, bool) or not isinstance(value, numbers.Real):
        raise _fail(name, f"expected a number, got {type(value).__name__} {value!r}")
    value = float(value)
    if not math.isfinite(value):
        raise _fail(name, f"must be a finite number, got {value!r}")
    if positive and value <= 0:
        raise _fail(name, f"must be > 0 seconds, got {value!r}")
    if value < 0:
        what = "a time" if name.endswith("_s") else "a size"
        raise _fail(name, f"must be >= 0 ({what} cannot be negative), got {value!r}")
    return value


@dataclass(frozen=True)
class TraceRow:
    """One action of a trace (format v1). Construction validates every field.

    Times are seconds. ``t1_s`` is the action's execution time on one unit of its key elastic
    ``resource``; how it scales with more units is ``serial_fraction`` (Amdahl) or ``curve``
    (a dict from ``ElasticityCurve.to_dict()``); with neither the action is inelastic.
    ``gen_before_s`` is the LLM generation that precedes the action on the training cluster
    (not managed by Tangram); ``gen_after_s`` the generation after a trajectory's last action.
    ``arrival_s`` set means an open-loop trace (absolute submission times); ``None`` means the
    rollout model decides arrivals. ``obs_*`` fields are what a live run observed (``None`` in
    generated traces).
    """

    action_id: str
    trajectory: str
    step: int
    position: int
    task: str
    kind: str
    gen_before_s: float
    resource: str
    t1_s: float
    max_units: int
    serial_fraction: float | None = None
    curve: dict[str, Any] | None = None
    service: str | None = None
    service_size_gb: float = 0.0
    memory_gb: float = 0.0
    arrival_s: float | None = None
    gen_after_s: float = 0.0
    obs_arrival_s: float | None = None
    obs_units: int | None = None
    obs_queue_s: float | None = None
    obs_overhead_s: float | None = None
    obs_exec_s: float | None = None
    obs_outcome: str | None = None
    obs_node: str | None = None

    def __post_init__(self) -> None:
        put = object.__setattr__
        for name in ("action_id", "trajectory", "task", "kind"):
            put(self, name, _as_str(name, getattr(self, name)))
        put(self, "step", _as_int("step", self.step, minimum=0))
        put(self, "position", _as_int("position", self.position, minimum=0))
        put(self, "gen_before_s", _as_float("gen_before_s", self.gen_before_s))
        if self.resource not in RESOURCES:
            raise _fail("resource", f"must be one of {list(RESOURCES)}, got {self.resource!r}")
        put(self, "resource", str(self.resource))  # a ResourceKind becomes its plain value
        put(self, "t1_s", _as_float("t1_s", self.t1_s, positive=True))
        put(self, "max_units", _as_int("max_units", self.max_units, minimum=1))
        if self.resource == "gpu" and self.max_units not in GPU_CELL_SIZES:
            raise _fail(
                "max_units",
                f"a gpu action's max_units must be a power of two <= 8 {list(GPU_CELL_SIZES)}, "
                f"got {self.max_units}",
            )
        if self.resource == "api" and self.max_units != 1:
            raise _fail("max_units", f"an api action takes one call slot (1), got {self.max_units}")
        self._check_elasticity()
        put(self, "service", _as_str("service", self.service, optional=True))
        if self.resource in ("gpu", "api") and self.service is None:
            raise _fail(
                "service", f"a {self.resource} action must name its service (model or endpoint)"
            )
        for name in ("service_size_gb", "memory_gb", "gen_after_s"):
            put(self, name, _as_float(name, getattr(self, name)))
        for name in ("arrival_s", "obs_arrival_s", "obs_queue_s", "obs_overhead_s", "obs_exec_s"):
            put(self, name, _as_float(name, getattr(self, name), optional=True))
        put(self, "obs_units", _as_int("obs_units", self.obs_units, minimum=1, optional=True))
        if self.obs_outcome is not None and self.obs_outcome not in OUTCOMES:
            raise _fail(
                "obs_outcome", f"must be one of {list(OUTCOMES)} or null, got {self.obs_outcome!r}"
            )
        put(self, "obs_node", _as_str("obs_node", self.obs_node, optional=True))

    def _check_elasticity(self) -> None:
        s, curve = self.serial_fraction, self.curve
        if s is not None:
            s = _as_float("serial_fraction", s)
            if s > 1:
                raise _fail("serial_fraction", f"must lie in [0, 1], got {s!r}")
            object.__setattr__(self, "serial_fraction", s)
        if curve is not None:
            if not isinstance(curve, Mapping):
                raise _fail(
                    "curve", f"expected an object (a curve dict), got {type(curve).__name__}"
                )
            if s is not None:
                raise _fail("curve", "give serial_fraction or curve, not both")
            try:
                built = curve_from_dict(curve)
            except CurveError as exc:
                raise _fail("curve", str(exc)) from None
            if abs(built.t1 - self.t1_s) > _CURVE_T1_RTOL * self.t1_s:
                raise _fail(
                    "curve",
                    f"the curve's time on one unit ({built.t1:g} s) differs from t1_s ({self.t1_s:g} s)",
                )
            try:  # JSON-native (lists, not tuples) so a written and re-read row compares equal
                object.__setattr__(self, "curve", json.loads(json.dumps(dict(curve))))
            except (TypeError, ValueError) as exc:
                raise _fail("curve", f"must be JSON-serialisable: {exc}") from None
        if self.resource == "api" and (
            s is not None or (curve is not None and curve.get("kind") != "inelastic")
        ):
            raise _fail(
                "serial_fraction" if s is not None else "curve",
                "an api action is inelastic; leave serial_fraction and curve empty",
            )

    def curve_object(self) -> ElasticityCurve:
        """The elasticity curve: Amdahl(t1, s) if ``serial_fraction`` is set, the ``curve`` dict
        rebuilt if given, else Inelastic(t1)."""
        if self.serial_fraction is not None:  # both checked when the row was built
            return Amdahl.prevalidated(self.t1_s, self.serial_fraction)
        if self.curve is not None:
            return curve_from_dict(self.curve)
        return Inelastic(self.t1_s)


#: Field names in schema order, and which of them a row must carry.
FIELDS: tuple[str, ...] = tuple(f.name for f in fields(TraceRow))
REQUIRED: frozenset[str] = frozenset(f.name for f in fields(TraceRow) if f.default is MISSING)
_DEFAULTS: dict[str, Any] = {f.name: f.default for f in fields(TraceRow) if f.name not in REQUIRED}


def row_from_mapping(record: Mapping[str, Any]) -> TraceRow:
    """Build a row from a mapping of field -> value, naming any missing or unknown field."""
    if not isinstance(record, Mapping):
        raise TraceError(f"a row must be a JSON object, got {type(record).__name__}")
    unknown = [k for k in record if k not in _DEFAULTS and k not in REQUIRED]
    if unknown:
        raise TraceError(
            f"unknown field (format v1 fields: {', '.join(FIELDS)})", field=str(unknown[0])
        )
    for name in FIELDS:
        if name in REQUIRED and name not in record:
            raise TraceError("missing required field", field=name)
    return TraceRow(**record)


def row_to_mapping(row: TraceRow, *, drop_defaults: bool = False) -> dict[str, Any]:
    """The row as a plain dict in schema order; optionally without fields at their defaults."""
    out = {name: getattr(row, name) for name in FIELDS}
    if drop_defaults:
        out = {k: v for k, v in out.items() if k in REQUIRED or v != _DEFAULTS[k]}
    return out


# ---------------------------------------------------------------------------------------------
# Whole-trace checks (things no single row can know).


def check_rows(rows: Sequence[TraceRow], locate: Callable[[int], str]) -> None:
    """Cross-row rules: unique action ids, contiguous positions per (step, trajectory),
    ``gen_after_s`` only on a trajectory's last row, open- and closed-loop rows not mixed.
    ``locate(i)`` names row ``i`` in error messages ("line 7", "row 3")."""
    seen: dict[str, int] = {}
    groups: dict[tuple[int, str], list[int]] = {}
    for i, row in enumerate(rows):
        if row.action_id in seen:
            raise TraceError(
                f"duplicate action_id {row.action_id!r} (first at {locate(seen[row.action_id])})",
                field="action_id",
                where=locate(i),
            )
        seen[row.action_id] = i
        groups.setdefault((row.step, row.trajectory), []).append(i)
    if rows:
        open_loop = rows[0].arrival_s is not None
        for i, row in enumerate(rows):
            if (row.arrival_s is not None) != open_loop:
                raise TraceError(
                    "arrival_s must be set on every row (open-loop trace) or on none (closed-loop); "
                    f"{locate(0)} {'has' if open_loop else 'has none'}",
                    field="arrival_s",
                    where=locate(i),
                )
    for (step, traj), idx in groups.items():
        by_pos: dict[int, int] = {}
        for i in idx:
            pos = rows[i].position
            if pos in by_pos:
                raise TraceError(
                    f"trajectory {traj!r} of step {step} has two actions at position {pos} "
                    f"(the other at {locate(by_pos[pos])})",
                    field="position",
                    where=locate(i),
                )
            by_pos[pos] = i
        last = len(idx) - 1
        if max(by_pos) != last:
            missing = min(set(range(len(idx))) - set(by_pos))
            offender = min(p for p in by_pos if p > missing)
            raise TraceError(
                f"trajectory {traj!r} of step {step}: positions must be contiguous from 0; "
                f"position {missing} is missing",
                field="position",
                where=locate(by_pos[offender]),
            )
        for pos, i in by_pos.items():
            if pos != last and rows[i].gen_after_s != 0:
                raise TraceError(
                    f"only the last action of a trajectory may carry generation after it "
                    f"(trajectory {traj!r} has {len(idx)} actions; this is position {pos})",
                    field="gen_after_s",
                    where=locate(i),
                )


@dataclass(frozen=True)
class Trace:
    """An ordered collection of rows plus metadata (workload, generator params, seed, source).

    Construction checks the cross-row rules (see :func:`check_rows`), so a ``Trace`` in memory
    is always valid. ``meta`` must be JSON-serialisable; it is written to the file header.
    """

    rows: tuple[TraceRow, ...]
    meta: dict[str, Any] = field(default_factory=dict)

    def __post_init__(self) -> None:
        object.__setattr__(self, "rows", tuple(self.rows))
        for i, row in enumerate(self.rows):
            if not isinstance(row, TraceRow):
                raise TraceError(f"expected a TraceRow, got {type(row).__name__}", where=f"row {i}")
        if HEADER_KEY in self.meta:
            raise TraceError(
                f"meta must not contain the reserved key {HEADER_KEY!r}", where="header"
            )
        check_rows(self.rows, lambda i: f"row {i}")

    def __len__(self) -> int:
        return len(self.rows)

    def steps(self) -> list[int]:
        """The RL steps present, ascending."""
        return sorted({row.step for row in self.rows})

    def trajectories(self) -> dict[tuple[int, str], tuple[TraceRow, ...]]:
        """Rows grouped by (step, trajectory), each group in position order.

        Groups are ordered by step, then by where the trajectory first appears in the trace
        (the order a rollout launches them).
        """
        groups: dict[tuple[int, str], list[TraceRow]] = {}
        for row in sorted(self.rows, key=lambda r: r.step):  # stable: keeps file order per step
            groups.setdefault((row.step, row.trajectory), []).append(row)
        return {key: tuple(sorted(g, key=lambda r: r.position)) for key, g in groups.items()}

    def to_dataframe(self) -> Any:
        """One row per action, columns = the v1 fields (``curve`` as a JSON string);
        ``df.attrs['tangram_trace']`` holds the meta."""
        import pandas as pd

        records = [_to_flat(row) for row in self.rows]
        df = pd.DataFrame.from_records(records, columns=list(FIELDS))
        for name in FIELDS:
            df[name] = df[name].astype(_PANDAS_DTYPES[name])
        df.attrs[HEADER_KEY] = dict(self.meta)
        return df

    @classmethod
    def from_dataframe(cls, df: Any, meta: Mapping[str, Any] | None = None) -> Trace:
        """Rebuild a trace from :meth:`to_dataframe` output (or any frame with v1 columns).

        Missing values (``NaN``/``None``/``<NA>``) of optional columns become ``None``; errors
        name the frame's row index. ``meta`` defaults to ``df.attrs['tangram_trace']``.
        """
        meta = dict(df.attrs.get(HEADER_KEY, {}) if meta is None else meta)
        unknown = [c for c in df.columns if c not in FIELDS]
        if unknown:
            raise TraceError("unknown column", field=str(unknown[0]), where="columns")
        columns = {name: df[name].tolist() for name in df.columns}
        rows = []
        for i in range(len(df)):
            record = {name: _from_cell(name, values[i]) for name, values in columns.items()}
            record = {k: v for k, v in record.items() if not (v is None and k not in REQUIRED)}
            rows.append(_parse_record(record, f"row {i}", None))
        return _make_trace(rows, meta, lambda i: f"row {i}", None)


# ---------------------------------------------------------------------------------------------
# Flat (Parquet / data-frame) representation: curve as a JSON string.

_PANDAS_DTYPES = {
    "step": "int64",
    "position": "int64",
    "max_units": "int64",
    "obs_units": "Int64",
    **{
        name: "float64"
        for name in (
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
    },
}
for _name in FIELDS:
    _PANDAS_DTYPES.setdefault(_name, "object")


def _to_flat(row: TraceRow) -> dict[str, Any]:
    out = row_to_mapping(row)
    if out["curve"] is not None:
        out["curve"] = json.dumps(out["curve"], sort_keys=True)
    return out


def _from_cell(name: str, value: Any) -> Any:
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
            return json.loads(value)
        except json.JSONDecodeError as exc:
            raise TraceError(f"not valid JSON: {exc.msg}", field="curve") from None
    return value


def _parse_record(record: Any, where: str, path: str | Path | None) -> TraceRow:
    try:
        return row_from_mapping(record)
    except TraceError as exc:
        raise exc.located(where=where, path=path) from None
    except TypeError as exc:  # pragma: no cover - row_from_mapping checks names first
        raise TraceError(str(exc), where=where, path=path) from None


def _make_trace(
    rows: list[TraceRow],
    meta: dict[str, Any],
    locate: Callable[[int], str],
    path: str | Path | None,
) -> Trace:
    try:
        check_rows(rows, locate)
    except TraceError as exc:
        raise exc.located(path=path) from None
    return Trace(tuple(rows), meta)


# ---------------------------------------------------------------------------------------------
# Header (version) handling.


def _meta_from_header(header: Any, path: str | Path, where: str) -> dict[str, Any]:
    if not isinstance(header, Mapping) or HEADER_KEY not in header:
        keys = sorted(header)[:6] if isinstance(header, Mapping) else type(header).__name__
        raise TraceError(
            f"not a Tangram trace header: expected an object with key {HEADER_KEY!r} "
            f"(got {keys}); the first line of a v1 JSONL trace is "
            f'{{"{HEADER_KEY}": {TRACE_VERSION}, ...}}',
            field=HEADER_KEY,
            where=where,
            path=path,
        )
    version = header[HEADER_KEY]
    if isinstance(version, bool) or not isinstance(version, int):
        raise TraceError(
            f"version must be an integer, got {version!r}", field=HEADER_KEY, where=where, path=path
        )
    if version > TRACE_VERSION:
        raise TraceError(
            f"trace format version {version} is newer than this Tangram reads "
            f"(version {TRACE_VERSION}); upgrade Tangram or re-export the trace as version "
            f"{TRACE_VERSION}",
            field=HEADER_KEY,
            where=where,
            path=path,
        )
    if version < 1:
        raise TraceError(
            f"unknown trace format version {version} (known: 1..{TRACE_VERSION})",
            field=HEADER_KEY,
            where=where,
            path=path,
        )
    return {k: v for k, v in header.items() if k != HEADER_KEY}


# ---------------------------------------------------------------------------------------------
# JSONL.


def read_jsonl(path: str | Path) -> Trace:
    """Read a JSONL trace (``.jsonl`` or ``.jsonl.gz``); see :func:`load_trace`."""
    path = Path(path)
    rows: list[TraceRow] = []
    lines: list[int] = []
    meta: dict[str, Any] | None = None
    opener = gzip.open if path.name.endswith(".gz") else open
    with opener(path, "rt", encoding="utf-8") as fh:
        for lineno, text in enumerate(fh, start=1):
            if not text.strip():
                continue
            try:
                obj = json.loads(text)
            except json.JSONDecodeError as exc:
                raise TraceError(
                    f"not valid JSON ({exc.msg} at column {exc.colno})",
                    where=f"line {lineno}",
                    path=path,
                ) from None
            if meta is None:
                meta = _meta_from_header(obj, path, f"line {lineno}")
                continue
            rows.append(_parse_record(obj, f"line {lineno}", path))
            lines.append(lineno)
    if meta is None:
        raise TraceError("empty file: no header line", where="line 1", path=path)
    return _make_trace(rows, meta, lambda i: f"line {lines[i]}", path)


def write_jsonl(trace: Trace, path: str | Path) -> None:
    """Write the header then one compact object per row (fields at their defaults omitted)."""
    path = Path(path)
    lines = [json.dumps({HEADER_KEY: TRACE_VERSION, **trace.meta}, separators=(",", ":"))]
    lines += [
        json.dumps(row_to_mapping(row, drop_defaults=True), separators=(",", ":"))
        for row in trace.rows
    ]
    data = ("\n".join(lines) + "\n").encode("utf-8")
    if path.name.endswith(".gz"):
        # mtime=0 and no file name in the gzip header: the same trace always gives the same bytes.
        data = gzip.compress(data, compresslevel=9, mtime=0)
    path.write_bytes(data)


# ---------------------------------------------------------------------------------------------
# Parquet.


def _arrow_schema(meta: Mapping[str, Any]) -> Any:
    import pyarrow as pa

    types = {
        "int64": pa.int64(),
        "Int64": pa.int64(),
        "float64": pa.float64(),
        "object": pa.string(),
    }
    return pa.schema(
        [
            pa.field(name, types[_PANDAS_DTYPES[name]], nullable=name not in REQUIRED)
            for name in FIELDS
        ],
        metadata={HEADER_KEY: json.dumps({HEADER_KEY: TRACE_VERSION, **meta})},
    )


def write_parquet(trace: Trace, path: str | Path) -> None:
    """Write one column per v1 field (``curve`` as JSON text), meta in the schema metadata."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    schema = _arrow_schema(trace.meta)
    flat = [_to_flat(row) for row in trace.rows]
    table = pa.Table.from_pylist(flat, schema=schema)
    pq.write_table(table, Path(path))


def read_parquet(path: str | Path) -> Trace:
    """Read a Parquet trace; errors name the row index (0-based) and the field."""
    import pyarrow.parquet as pq

    path = Path(path)
    try:
        table = pq.read_table(path)
    except Exception as exc:  # pyarrow raises several types for a corrupt file
        raise TraceError(f"cannot read as Parquet: {exc}", path=path) from None
    raw = (table.schema.metadata or {}).get(HEADER_KEY.encode())
    if raw is None:
        raise TraceError(
            f"no {HEADER_KEY!r} key in the Parquet schema metadata (not a Tangram trace)",
            field=HEADER_KEY,
            where="header",
            path=path,
        )
    try:
        header = json.loads(raw)
    except json.JSONDecodeError as exc:
        raise TraceError(
            f"header is not valid JSON: {exc.msg}", field=HEADER_KEY, where="header", path=path
        ) from None
    meta = _meta_from_header(header, path, "header")
    unknown = [c for c in table.column_names if c not in FIELDS]
    if unknown:
        raise TraceError("unknown column", field=unknown[0], where="columns", path=path)
    rows = []
    for i, record in enumerate(table.to_pylist()):
        record = {k: v for k, v in record.items() if not (v is None and k not in REQUIRED)}
        try:
            if isinstance(record.get("curve"), str):
                record["curve"] = _from_cell("curve", record["curve"])
        except TraceError as exc:
            raise exc.located(where=f"row {i}", path=path) from None
        rows.append(_parse_record(record, f"row {i}", path))
    return _make_trace(rows, meta, lambda i: f"row {i}", path)


# ---------------------------------------------------------------------------------------------
# Dispatch on suffix.

_READERS: dict[str, Callable[[Path], Trace]] = {
    ".jsonl": read_jsonl,
    ".jsonl.gz": read_jsonl,
    ".parquet": read_parquet,
}
_WRITERS: dict[str, Callable[[Trace, Path], None]] = {
    ".jsonl": write_jsonl,
    ".jsonl.gz": write_jsonl,
    ".parquet": write_parquet,
}


def _suffix(path: Path, known: Iterable[str]) -> str:
    for suffix in sorted(known, key=len, reverse=True):
        if path.name.endswith(suffix):
            return suffix
    raise TraceError(
        f"unknown trace file type {path.name!r}; expected one of {sorted(known)}", path=path
    )


def load_trace(path: str | Path) -> Trace:
    """Load and validate a trace; the format follows the suffix (.jsonl, .jsonl.gz, .parquet)."""
    path = Path(path)
    reader = _READERS[_suffix(path, _READERS)]
    if not path.exists():
        raise TraceError("no such file", path=path)
    return reader(path)


def write_trace(trace: Trace, path: str | Path) -> Path:
    """Write a trace; the format follows the suffix. Returns the path written."""
    path = Path(path)
    _WRITERS[_suffix(path, _WRITERS)](trace, path)
    return path
