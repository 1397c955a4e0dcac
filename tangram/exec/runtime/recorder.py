"""Recording a live run as a trace (format v1, ``docs/trace-format.md``) with observed timings,
streamed to disk as it grows.

Every action that ends is turned into its trace row with what the client declared (resource,
units, curve, service, memory) and what was observed (arrival, units granted, queue, overhead
and execution times, outcome, node), and appended to a JSONL file: the configured trace path
when it is ``.jsonl``, else a spool file. Why on disk: a service runs for days, and keeping
every finished action until the trace was written made its memory grow with the count of
actions (issue 16). What stays in memory is the rows of the current event-loop iteration and,
per trajectory label, its next position and the end of its last action: every open
trajectory's, and those of the ``MAX_CLOSED_TRAJECTORIES`` labels of no open trajectory used
last (closed ones, GPU/API labels never opened); older ones go (see that constant).

- **Always a valid trace.** The header is written first and rows are appended whole, so the
  file is a valid v1 trace at every moment (after a kill -9 too; at most a row being written
  then is torn). Rows are in the order actions ended; positions number a trajectory's actions
  in that order too (an agent's actions run one after another, so it is their arrival order),
  so the positions in any prefix are contiguous. ``gen_before_s`` is the gap between an
  action's arrival and the end of its trajectory's previous action (or the trajectory's open).
- **Written on demand.** ``write`` copies the rows under a header of that moment (the EOE
  figures change during a run), or rewrites the stream in place when it is the target;
  ``trace`` reads them back through the format's reader.
- **``unknown`` outcomes are not recorded.** A trace records what this run observed, and the
  trace format's outcomes are ``result``, ``error`` and ``timeout``. An ``unknown`` outcome is
  given by the journal to an action of a previous run (which this run never saw arrive); the
  previous run's streamed trace ends without it. Any that reaches the recorder is counted in
  ``skipped_unknown`` and left out.
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import tempfile
import threading
from collections import OrderedDict
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from tangram.exec.runtime.records import ActionSpec, Outcome
from tangram.trace import (
    HEADER_KEY,
    TRACE_VERSION,
    LiveObservation,
    Trace,
    load_trace,
    row_from_observation,
    row_to_mapping,
    write_trace,
)

log = logging.getLogger(__name__)

#: Bytes copied at a time when a trace is written from the stream.
_CHUNK = 1 << 20
#: The most rows kept for the next append while the stream's appends fail (a full disk):
#: beyond, the oldest are dropped (``TraceRecorder.dropped``). Each holds its action's
#: outcome, output included: kept all, a disk full for hours held every action that ended
#: meanwhile. (As many as the outcomes kept for polling by default.)
MAX_PENDING_ROWS = 10_000
#: The most entries (next position, last end) kept for labels of no open trajectory (closed
#: ones, GPU/API labels never opened), the least recently used going first. Kept, a reopened
#: id's positions go on from its last; kept all, the recorder grew with every trajectory ever
#: closed (verl's tool opens one per rollout). A label used again after its entry went starts
#: its positions at 0 again, so its rows repeat positions in the trace: reuse ids within the
#: window (about 200 bytes an entry: some 20 MB at most).
MAX_CLOSED_TRAJECTORIES = 100_000


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
    #: The core action's ``malleable`` and ``service_replicas`` (recorded in the trace, v3).
    malleable: bool = False
    service_replicas: bool = False
    #: The mean cores it held, when its grant was resized while it ran (None: its start's).
    held_units: float | None = None


class TraceRecorder:
    """Streams finished actions' rows to a JSONL file; thread-safe, so a writer may copy the
    trace from another thread while the event loop records.

    ``path``: the stream (a ``.jsonl`` file); None: a temporary spool file, removed by
    ``close``. ``start(meta)`` writes the header; rows buffered by ``add`` are appended by
    ``flush`` (the runtime calls it once per event-loop iteration).
    """

    def __init__(self, path: str | Path | None = None) -> None:
        self._given = Path(path) if path is not None else None
        self._spool: tempfile.TemporaryDirectory[str] | None = None
        self.path: Path | None = None
        self._fd: int | None = None
        self._header_end = 0
        self._size = 0
        self._pending: list[RecordedAction] = []
        #: Per trajectory label: [its next position, the end of its last action (or open)].
        self._trajs: dict[str, list[Any]] = {}
        self._rows = 0
        #: Trajectories open now (their entries never age out).
        self._open: set[str] = set()
        #: Labels in ``_trajs`` of no open trajectory, least recently used first: beyond
        #: ``MAX_CLOSED_TRAJECTORIES`` the first go (``_age``).
        self._idle: OrderedDict[str, None] = OrderedDict()
        #: Labels whose entry in ``_trajs`` goes once the rows buffered now are written.
        self._forget: set[str] = set()
        self.skipped_unknown = 0
        #: Rows dropped, oldest first, while the stream's appends failed (``MAX_PENDING_ROWS``).
        self.dropped = 0
        #: The last append failed: the buffer is bounded until one succeeds.
        self._failing = False
        self._lock = threading.Lock()
        #: One ``write`` at a time: a rewrite of the stream moves the rows another would copy.
        self._writing = threading.Lock()

    # ------------------------------------------------------------------ life
    def start(self, meta: Mapping[str, Any]) -> Path:
        """Create (or truncate) the stream and write its header; returns its path."""
        with self._lock:
            if self.path is None:
                if self._given is None:
                    self._spool = tempfile.TemporaryDirectory(prefix="tangram-trace-")
                    self.path = Path(self._spool.name) / "live.jsonl"
                else:
                    self.path = self._given
                    self.path.parent.mkdir(parents=True, exist_ok=True)
            self._reopen(_header(meta), truncate=True)
            self._flush_locked()
            return self.path

    def close(self) -> None:
        """Append what is buffered and close the stream (a temporary spool is removed)."""
        with self._lock:
            try:
                self._flush_locked()
            except Exception:  # noqa: BLE001 - the stream is closed all the same
                log.exception("the trace's last %d rows could not be appended", len(self._pending))
            if self._fd is not None:
                os.close(self._fd)
                self._fd = None
            if self._spool is not None:
                self._spool.cleanup()
                self._spool = None
                self.path = None

    def clear(self, meta: Mapping[str, Any], opened: Mapping[str, float]) -> None:
        """Forget what was recorded (e.g. a warm-up): the stream starts over with ``meta``,
        positions from 0; ``opened`` are the trajectories open now and when they opened."""
        with self._lock:
            self._pending.clear()
            self._trajs = {traj: [0, at] for traj, at in opened.items()}
            self._open, self._idle = set(opened), OrderedDict()
            self._rows = 0
            if self._fd is not None:
                self._reopen(_header(meta), truncate=True)

    # ------------------------------------------------------------------ recording
    def trajectory_opened(self, trajectory: str, at_s: float) -> None:
        """Its first action's generation gap counts from ``at_s`` (a reopened one keeps its
        positions and last end)."""
        with self._lock:
            self._trajs.setdefault(trajectory, [0, at_s])
            self._open.add(trajectory)
            self._idle.pop(trajectory, None)

    def trajectory_closed(self, trajectory: str) -> None:
        """``trajectory`` is closed: its entry stays while it is among the
        ``MAX_CLOSED_TRAJECTORIES`` labels of no open trajectory used last (a reopen goes on
        from its positions), then goes. Aged only with no rows buffered: a buffered row's
        label must keep its entry until the row takes its position."""
        with self._lock:
            self._open.discard(trajectory)
            if trajectory in self._trajs:
                self._idle[trajectory] = None
                self._idle.move_to_end(trajectory)
            if not self._pending:
                self._age()

    def forget(self, trajectory: str) -> None:
        """``trajectory`` will have no more actions (an ephemeral one, closed: its id is never
        opened again): its entry goes once its buffered rows are written. Why: each
        ``/run_code`` request is a trajectory of its own, and keeping every label's entry made
        the service's memory grow with the count of requests."""
        with self._lock:
            self._forget.add(trajectory)
            if not self._pending:
                self._drop_forgotten()

    def add(self, entry: RecordedAction) -> None:
        """Buffer a finished action (``flush`` appends its row)."""
        if entry.outcome.status == "unknown":
            self.skipped_unknown += 1
            return
        with self._lock:
            self._pending.append(entry)
            if self._failing:
                self._bound_pending()

    def _bound_pending(self) -> None:
        """Drop the oldest buffered rows beyond ``MAX_PENDING_ROWS`` (the stream's appends
        fail). Only then: a burst that ends more actions in one event-loop iteration (a
        shutdown's) loses none while the stream takes rows. Dropped rows took no position,
        so the stream stays a valid trace, without them."""
        over = len(self._pending) - MAX_PENDING_ROWS
        if over <= 0:
            return
        if not self.dropped:
            log.error(
                "the trace stream %s takes no rows: beyond %d waiting rows, the oldest are "
                "dropped (status: trace.rows_dropped)",
                self.path,
                MAX_PENDING_ROWS,
            )
        del self._pending[:over]
        self.dropped += over

    def flush(self) -> None:
        """Append the rows of the buffered actions to the stream (one write)."""
        with self._lock:
            self._flush_locked()

    def __len__(self) -> int:
        """Actions recorded (appended or buffered)."""
        return self._rows + len(self._pending)

    # ------------------------------------------------------------------ reading
    def write(self, path: str | Path, meta: Mapping[str, Any] | None = None) -> Path:
        """Write the trace so far to ``path`` under a header of ``meta`` (``.jsonl`` by a
        copy of the stream's rows; ``.jsonl.gz`` and ``.parquet`` through the format's
        writer); returns ``path``."""
        with self._writing:
            return self._write(Path(path), meta)

    def _write(self, path: Path, meta: Mapping[str, Any] | None) -> Path:
        header = _header(meta or {})
        with self._lock:
            self._flush_locked()
            stream, start, stop = self.path, self._header_end, self._size
        if stream is None:
            raise RuntimeError("the recorder is not started")
        if not path.name.endswith(".jsonl"):
            with tempfile.TemporaryDirectory(prefix="tangram-trace-") as tmp:
                plain = self._write(Path(tmp) / "trace.jsonl", meta)
                write_trace(load_trace(plain), path)
            return path
        tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
        with open(tmp, "wb") as out:
            out.write(header)
            _copy(stream, start, stop, out)
            if _same_file(path, stream):
                with self._lock:  # rows appended meanwhile, then the swap: no row lost
                    _copy(stream, stop, self._size, out)
                    out.flush()
                    os.replace(tmp, path)
                    self._reopen(header, truncate=False)
                return path
        os.replace(tmp, path)
        return path

    def trace(self, meta: Mapping[str, Any] | None = None) -> Trace:
        """The actions recorded so far, read back from the stream as a ``Trace``."""
        with tempfile.TemporaryDirectory(prefix="tangram-trace-") as tmp:
            return load_trace(self.write(Path(tmp) / "trace.jsonl", meta))

    # ------------------------------------------------------------------ inside
    def _reopen(self, header: bytes, *, truncate: bool) -> None:
        """(Re)open the stream for appending; ``truncate`` starts it over with ``header``
        (else ``header`` is already the file's first line). Lock held."""
        assert self.path is not None
        if self._fd is not None:
            os.close(self._fd)
        flags = os.O_WRONLY | os.O_CREAT | os.O_APPEND | (os.O_TRUNC if truncate else 0)
        self._fd = os.open(self.path, flags, 0o644)
        if truncate:
            _write_all(self._fd, header)
        self._header_end = len(header)
        self._size = os.fstat(self._fd).st_size

    def _flush_locked(self) -> None:
        """Append the buffered rows in one write. One that fails (a full disk) is undone: the
        bytes it wrote part-way are cut off the stream, the positions it took are given back
        and its rows stay buffered for the next flush; the error is raised."""
        if not self._pending or self._fd is None:
            return
        entries, self._pending = self._pending, []
        taken: dict[str, list[Any] | None] = {}
        lines = []
        for entry in entries:
            line = self._line(entry, taken)
            if line is not None:
                lines.append(line)
        data = "".join(lines).encode()
        try:
            _write_all(self._fd, data)
        except BaseException:
            with contextlib.suppress(OSError):  # (the stream is appended to: cut the torn part)
                os.ftruncate(self._fd, self._size)
            for label, state in taken.items():
                if state is None:
                    self._trajs.pop(label, None)
                else:
                    self._trajs[label] = state
            self._pending = entries + self._pending
            self._failing = True
            self._bound_pending()
            raise
        self._failing = False
        self._size += len(data)
        self._rows += len(lines)
        self._drop_forgotten()
        self._age()

    def _drop_forgotten(self) -> None:
        for label in self._forget:
            self._trajs.pop(label, None)
            self._open.discard(label)
            self._idle.pop(label, None)
        self._forget.clear()

    def _age(self) -> None:
        """Drop the entries of the least recently used labels of no open trajectory beyond
        ``MAX_CLOSED_TRAJECTORIES`` (no rows buffered: none of them waits for a position)."""
        while len(self._idle) > MAX_CLOSED_TRAJECTORIES:
            label, _ = self._idle.popitem(last=False)
            self._trajs.pop(label, None)

    def _line(self, e: RecordedAction, taken: dict[str, list[Any] | None]) -> str | None:
        """The JSONL line of ``e``, its trajectory's position taken (None: left out);
        ``taken`` gets each trajectory's state before its first position was taken."""
        label = e.trajectory
        single = label == "~" + e.outcome.action_id  # GPU/API work without a trajectory
        state = None if single else self._trajs.get(label)
        position, prev_end = (0, None) if state is None else state
        try:
            row = row_from_observation(_observation(e), position, prev_end)
        except Exception:  # noqa: BLE001 - a bad row must not stop the loop; it is left out
            log.exception("action %s could not be recorded in the trace", e.outcome.action_id)
            return None
        if not single:
            if label not in taken:
                taken[label] = state
            self._trajs[label] = [position + 1, e.outcome.end_s]
            if label not in self._open:  # (a closed or never-opened label: it may age out)
                self._idle[label] = None
                self._idle.move_to_end(label)
        return json.dumps(row_to_mapping(row, drop_defaults=True), separators=(",", ":")) + "\n"


def stream_path(trace_path: Path | None) -> Path | None:
    """Where a run with ``trace_path`` streams its rows: that file when it is ``.jsonl``, else
    ``PATH.partial.jsonl`` beside it (the ``.jsonl.gz`` or Parquet file is written from it at
    the end); None (no trace path): a temporary spool."""
    if trace_path is None or trace_path.name.endswith(".jsonl"):
        return trace_path
    return trace_path.with_name(trace_path.name + ".partial.jsonl")


def _header(meta: Mapping[str, Any]) -> bytes:
    """The trace's first line (as ``tangram.trace`` writes it)."""
    # The header is written before any row, so it declares the newest version: a live row may
    # carry any field (``malleable`` and ``service_replicas`` came with version 3).
    head = {HEADER_KEY: TRACE_VERSION, **meta}
    return (json.dumps(head, separators=(",", ":")) + "\n").encode()


def _write_all(fd: int, data: bytes) -> None:
    view = memoryview(data)
    while view:
        view = view[os.write(fd, view) :]


def _copy(src: Path, start: int, stop: int, out: Any) -> None:
    """Bytes ``start..stop`` of ``src`` to ``out``."""
    with open(src, "rb") as fh:
        fh.seek(start)
        left = stop - start
        while left > 0:
            chunk = fh.read(min(_CHUNK, left))
            if not chunk:
                break
            out.write(chunk)
            left -= len(chunk)


def _same_file(a: Path, b: Path) -> bool:
    try:
        return a.exists() and os.path.samefile(a, b)
    except OSError:
        return False


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
        t1_s=spec.elasticity().t1 if spec.curve is not None else spec.t1_s,  # (the same)
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
        # A resized action's observed units are the cores it held on average (rounded: the
        # trace's units are whole), so a replay rescales its curve at about the grant it ran
        # on, not at its start's.
        units=out.units if e.held_units is None else max(1, round(e.held_units)),
        node=out.node,
        malleable=e.malleable,
        service_replicas=e.service_replicas,
    )
