"""Recording a live run as a trace (format v1, ``docs/trace-format.md``) with observed timings.

Every action that ends is remembered with what the client declared (resource, units, curve,
service, memory) and what was observed (arrival, units granted, queue, overhead and
execution times, outcome, node). ``trace()`` turns them into an open-loop ``Trace``: each row's
``arrival_s`` is its observed submission time, so ``tangram replay`` can feed the simulator the
same arrivals. Positions are numbered per trajectory in arrival order at write time, so a
trace written while actions are still running is valid too (they are left out).
"""

from __future__ import annotations

import threading
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from tangram.exec.runtime.records import ActionSpec, Outcome
from tangram.trace import LiveObservation, Trace, TraceRow, row_from_observation, write_trace


@dataclass(frozen=True)
class RecordedAction:
    """One finished action: the declared spec fields and the outcome."""

    spec: ActionSpec
    trajectory: str
    outcome: Outcome
    max_units: int
    service_size_gb: float
    memory_gb: float
    seq: int


class TraceRecorder:
    """Collects finished actions; thread-safe so a writer may snapshot while the loop runs."""

    def __init__(self) -> None:
        self._rows: list[RecordedAction] = []
        self._opened: dict[str, float] = {}
        self._lock = threading.Lock()

    def trajectory_opened(self, trajectory: str, at_s: float) -> None:
        with self._lock:
            self._opened.setdefault(trajectory, at_s)

    def add(self, entry: RecordedAction) -> None:
        with self._lock:
            self._rows.append(entry)

    def __len__(self) -> int:
        return len(self._rows)

    def trace(self, meta: Mapping[str, Any] | None = None) -> Trace:
        """The recorded actions as an open-loop trace (``arrival_s`` = observed arrival)."""
        with self._lock:
            entries = list(self._rows)
            opened = dict(self._opened)
        by_traj: dict[str, list[RecordedAction]] = {}
        for e in sorted(entries, key=lambda e: (e.outcome.arrival_s, e.seq)):
            by_traj.setdefault(e.trajectory, []).append(e)
        rows: list[TraceRow] = []
        for traj, items in by_traj.items():
            prev_end = opened.get(traj)
            for position, e in enumerate(items):
                rows.append(_row(e, position, prev_end))
                prev_end = e.outcome.end_s
        rows.sort(key=lambda r: (r.arrival_s or 0.0, r.action_id))
        return Trace(tuple(rows), dict(meta or {}))

    def write(self, path: str | Path, meta: Mapping[str, Any] | None = None) -> Path:
        return write_trace(self.trace(meta), Path(path))


def _row(e: RecordedAction, position: int, prev_end: float | None) -> TraceRow:
    """The trace row of a finished action (``tangram.trace.convert`` does the conversion)."""
    return row_from_observation(_observation(e), position, prev_end)


def _observation(e: RecordedAction) -> LiveObservation:
    """The trace package's view of a finished action: its declared and observed fields."""
    spec, out = e.spec, e.outcome
    t = out.timings
    return LiveObservation(
        action_id=out.action_id,
        trajectory=e.trajectory,
        task=spec.task,
        kind=spec.label(),
        resource=spec.resource,
        t1_s=spec.elasticity().t1,
        max_units=e.max_units,
        serial_fraction=spec.serial_fraction,
        curve=spec.curve,
        service=spec.service,
        service_size_gb=e.service_size_gb,
        memory_gb=e.memory_gb,
        outcome=out.status,
        arrival_s=out.arrival_s,
        queue_s=t.queue_s,
        overhead_s=t.overhead_s,
        exec_s=t.exec_s,
        start_s=out.start_s,
        units=out.units,
        node=out.node,
    )
