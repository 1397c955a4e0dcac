"""A trace: the rows of one or more RL steps plus their meta, valid as a whole.

The cross-row rules (unique ids, contiguous positions, generation after only on a trajectory's
last row, open and closed loop not mixed) are checked here; a row's own fields in ``row.py``.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from tangram.trace.columns import DTYPES, from_cell, to_flat
from tangram.trace.errors import TraceError
from tangram.trace.header import FIELD_SINCE, HEADER_KEY
from tangram.trace.row import FIELD_DEFAULTS, FIELDS, REQUIRED, TraceRow, parse_record


def check_rows(rows: Sequence[TraceRow], locate: Callable[[int], str]) -> None:
    """Cross-row rules: unique action ids, contiguous positions per (step, trajectory),
    ``gen_after_s`` only on a trajectory's last row, open- and closed-loop rows not mixed,
    ``sync`` only in closed-loop traces, one size and layout per GPU service.
    ``locate(i)`` names row ``i`` in error messages ("line 7", "row 3")."""
    _check_services(rows, locate)
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
            if open_loop and row.sync is not None:
                raise TraceError(
                    "sync is for closed-loop traces (the rollout model holds the action); "
                    "an open-loop row arrives at its arrival_s",
                    field="sync",
                    where=locate(i),
                )
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


#: What a GPU service is, the same on every call to it (the core keys residency by name).
SERVICE_FIELDS = ("service_size_gb", "service_replicas")


def _check_services(rows: Sequence[TraceRow], locate: Callable[[int], str]) -> None:
    """Every ``gpu`` row naming a service gives it the same size and layout: a service is one
    model, and the core finds it resident by name. A call declaring 70 GB to a service
    restored at 10 GB ran as a hit, its restore and 60 GB of GPU memory never counted."""
    first: dict[str, int] = {}
    for i, row in enumerate(rows):
        if row.resource != "gpu":
            continue
        j = first.setdefault(row.service or "", i)
        for name in SERVICE_FIELDS:
            ours, theirs = getattr(row, name), getattr(rows[j], name)
            if ours != theirs:
                raise TraceError(
                    f"service {row.service!r} has {name} {theirs!r} at {locate(j)} but {ours!r} "
                    "here; a service is one model, the same on every call",
                    field=name,
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

    def format_version(self) -> int:
        """The lowest format version that holds these rows (``header.FIELD_SINCE``)."""
        version = 1
        for name, since in FIELD_SINCE.items():
            default = FIELD_DEFAULTS[name]
            if since > version and any(getattr(r, name) != default for r in self.rows):
                version = since
        return version

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

        records = [to_flat(row) for row in self.rows]
        df = pd.DataFrame.from_records(records, columns=list(FIELDS))
        for name in FIELDS:
            df[name] = df[name].astype(DTYPES[name])
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
        repeated = [c for c in dict.fromkeys(df.columns) if list(df.columns).count(c) > 1]
        if repeated:  # (``df[name]`` is then a frame: an AttributeError below)
            raise TraceError(
                "the column appears more than once", field=repeated[0], where="columns"
            )
        columns = {name: df[name].tolist() for name in df.columns}
        rows = []
        for i in range(len(df)):
            try:  # (a curve cell that is not JSON fails here, before the row is built)
                record = {name: from_cell(name, values[i]) for name, values in columns.items()}
            except TraceError as exc:
                raise exc.located(where=f"row {i}") from None
            record = {k: v for k, v in record.items() if not (v is None and k not in REQUIRED)}
            rows.append(parse_record(record, f"row {i}", None))
        return checked_trace(rows, meta, lambda i: f"row {i}", None)


def checked_trace(
    rows: list[TraceRow],
    meta: dict[str, Any],
    locate: Callable[[int], str],
    path: str | Path | None,
) -> Trace:
    """A trace of rows read from ``path``; cross-row errors name ``locate(i)`` in ``path``."""
    try:
        check_rows(rows, locate)
    except TraceError as exc:
        raise exc.located(path=path) from None
    return Trace(tuple(rows), meta)
