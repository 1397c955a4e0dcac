"""The journal: the ids a service accepted, each with its submission's fingerprint and, once it
ended, its outcome, on disk (SQLite, WAL), so that a restarted service never runs an id twice.

Why a journal: clients resend ``POST /v1/actions`` with the same id after a lost connection.
A service that forgot the id (it was killed and restarted) would run the action again. With
the journal it answers instead: a finished id with its recorded outcome, an id accepted
before the stop and never finished with an explicit ``unknown`` outcome (it may have run,
so it must not run again), marked so when the journal opens.

- **Write-ahead, cheaply.** An accepted action must be on disk before it can start, and that
  write is on the path of every start, so it is one ``write`` of a line per action to an
  append-only log beside the database: the host's start gate calls ``write_ahead``, one
  write for a scheduling pass's acceptances (a few microseconds). Why not a SQLite commit
  per start: it cost ~25 us on the path of each start (single-client latency +0.15 ms and
  throughput -30% in ``tangram bench service``). A failed write keeps the action from
  starting (its entries stay buffered and the error is raised).
- **SQLite off the loop.** ``flush`` (the runtime calls it every ``LINGER_S``) encodes the
  buffered entries and hands them to the writer thread (``journal_writer.py``), which
  commits them and then truncates their log. There are two logs, used in turn: acceptances
  logged after a hand-over go to the other one, so a log is truncated only once everything
  in it is committed. Opening the journal replays both logs first, so an id accepted just
  before a kill is known after it.
- **Durability.** Both writes return once the kernel holds the data (the log's ``write``,
  SQLite's WAL with ``synchronous=NORMAL``), which survives the process being killed (what
  the journal is for); a power loss or kernel crash may lose the last ones (never the
  database's consistency), and an action lost that way could run again after the reboot.
  ``fsync=True`` syncs the log at every ``write_ahead`` and every commit
  (``synchronous=FULL``) to close that too, at the disk's sync cost on the path of starts.
  An outcome lost with the process before its commit (within ``LINGER_S`` plus a commit) is
  answered ``unknown``; its action never runs again.
- **Bounded.** Finished entries accepted more than ``keep_s`` ago, or older than the newest
  ``keep``, are deleted by the writer, oldest first; unfinished ones never (they are in
  flight). A resend after its entry expired is a new action.
- **One service per journal**: an exclusive lock on ``PATH.lock`` is held while it is open
  (the kernel drops it when the process dies, so a restart after a kill -9 gets it).

Everything but the writer runs on the event loop's thread.
"""

from __future__ import annotations

import fcntl
import json
import logging
import os
import sqlite3
import time
from collections.abc import Callable
from dataclasses import dataclass, replace
from pathlib import Path
from typing import IO, Any

from tangram.exec.runtime import journal_store as store
from tangram.exec.runtime.journal_codec import outcome_from_json, outcome_to_json
from tangram.exec.runtime.journal_writer import Batch, Writer
from tangram.exec.runtime.outcomes import unknown_outcome
from tangram.exec.runtime.records import Outcome

log = logging.getLogger(__name__)

#: How often buffered entries are handed to the writer: the acceptances and outcomes of one
#: such span share a commit.
LINGER_S = 0.01
#: How long ``commit`` (tests, shutdown) waits for the writer.
COMMIT_WAIT_S = 60.0


class JournalBusy(ValueError):
    """Another process holds the journal (two services must not share one)."""


@dataclass(frozen=True)
class Entry:
    """What the journal holds of one id: its fingerprint and its outcome (None: not ended)."""

    fingerprint: str
    outcome: Outcome | None


class Journal:
    """Accepted ids, fingerprints and outcomes in a SQLite file, with a write-ahead log."""

    def __init__(
        self,
        path: str | Path,
        *,
        fsync: bool = False,
        keep: int = 1_000_000,
        keep_s: float = 86_400.0,
        clock: Callable[[], float] = time.time,
    ) -> None:
        if keep < 1 or not keep_s > 0:
            raise ValueError(f"journal bounds must be positive, got keep={keep}, keep_s={keep_s}")
        self.path = Path(path)
        self.fsync, self.keep, self.keep_s = fsync, keep, keep_s
        #: Wall-clock seconds (entries' ages; a test passes its own).
        self.clock = clock
        #: The two write-ahead logs, used in turn (``PATH.accepts.0``, ``.1``).
        self.log_paths = tuple(self.path.with_name(self.path.name + s) for s in LOG_SUFFIXES)
        self._lock: IO[str] | None = None
        self._reader: sqlite3.Connection | None = None
        self._writer: Writer | None = None
        self._logs: list[int] = []
        self._active = 0
        #: The active log's last write failed part-way: the next one starts a fresh line.
        self._torn = False
        #: Buffered acceptances (id -> insert row, then the outcome: an outcome that comes
        #: before the hand-over fills in the row's ended_unix and JSON, and the Outcome).
        self._new: dict[str, list[Any]] = {}
        #: Acceptances not yet written to the log.
        self._unlogged: list[list[Any]] = []
        #: Buffered outcomes of ids handed over earlier (id -> [ended_unix, JSON, outcome]).
        self._ends: dict[str, list[Any]] = {}
        #: Buffered rows whose outcome is not yet encoded, with the index of its JSON.
        self._unencoded: list[tuple[list[Any], int]] = []
        #: The last batch handed to the writer, for lookups while it commits it: its
        #: acceptances (id -> entry) and its outcomes of earlier acceptances (id -> outcome).
        #: Only this thread changes them (a committed batch's are stale but still right).
        self._handed_new: dict[str, Entry] = {}
        self._handed_ends: dict[str, Outcome] = {}

    # ------------------------------------------------------------------ open, close
    def open(self) -> int:
        """Lock and open the file (created if missing), replay the logs of a previous run,
        mark every entry it left unfinished ``unknown``; returns how many were."""
        db = None
        try:
            self.path.parent.mkdir(parents=True, exist_ok=True)
            self._lock = _lock(self.path)
            db = store.connect(self.path, fsync=self.fsync)
            for path in self.log_paths:
                store.transaction(db, (store.REPLAY, _logged(path, self.clock())))
            marked = self._mark_unknown(db, self.clock())
            store.expire(db, self.clock(), self.keep, self.keep_s)
            flags = os.O_WRONLY | os.O_APPEND | os.O_CREAT | os.O_TRUNC  # replayed: emptied
            self._logs = [os.open(path, flags, 0o644) for path in self.log_paths]
            self._reader = store.reader(self.path)
            self._writer = Writer(db, keep=self.keep, keep_s=self.keep_s, clock=self.clock)
        except BaseException as exc:
            if db is not None and self._writer is None:
                db.close()
            self.close()
            if isinstance(exc, OSError | sqlite3.OperationalError):
                # (An OSError reached tangram serve as 'cannot listen on HOST:PORT: File
                # exists', blaming the address for a journal path below a file.)
                why = exc.strerror if isinstance(exc, OSError) and exc.strerror else exc
                raise ValueError(
                    f"journal {self.path}: cannot open it ({why}); give another --journal path"
                ) from exc
            raise
        return marked

    def close(self) -> None:
        """Commit what is buffered (best effort), stop the writer, release the lock."""
        if self._writer is not None:
            try:
                self.commit()
            except Exception:  # noqa: BLE001 - its acceptances stay in the logs
                log.exception("the journal's last commit failed; %d entries lost", self.buffered)
            self._writer.stop()
            self._writer.db.close()
            self._writer = None
        if self._reader is not None:
            self._reader.close()
            self._reader = None
        for fd in self._logs:
            os.close(fd)
        self._logs = []
        if self._lock is not None:
            self._lock.close()  # closing the descriptor releases the flock
            self._lock = None

    @property
    def is_open(self) -> bool:
        return self._writer is not None

    # ------------------------------------------------------------------ writes
    def accept(
        self,
        action_id: str,
        fingerprint: str,
        resource: str,
        trajectory: str | None,
        at_unix: float,
    ) -> None:
        """Buffer an accepted action (``write_ahead`` logs it before it can start)."""
        row = [action_id, fingerprint, resource, trajectory, at_unix, None, None, None]
        self._new[action_id] = row
        self._unlogged.append(row)

    def write_ahead(self) -> None:
        """Append the acceptances not yet on disk to the active log, in one write (the start
        gate). On a failure they stay buffered and the error is raised."""
        if not self._unlogged:
            return
        if not self._logs:
            raise RuntimeError(f"the journal {self.path} is not open")
        fd = self._logs[self._active]
        lines = "".join(_log_line(row) for row in self._unlogged)
        data = ("\n" if self._torn else "") + lines
        self._torn = True  # until the whole write is done
        _write_all(fd, data.encode())
        if self.fsync:
            os.fdatasync(fd)
        self._torn = False
        self._unlogged.clear()

    def ended(self, outcome: Outcome, at_unix: float) -> None:
        """Buffer an action's outcome (``encode`` encodes it soon after)."""
        row = self._new.get(outcome.action_id)
        if row is not None:  # accepted and ended within one span: one insert
            row[5], row[7] = at_unix, outcome
            self._unencoded.append((row, 6))
        else:
            end = [at_unix, None, outcome]
            self._ends[outcome.action_id] = end
            self._unencoded.append((end, 1))

    def encode(self) -> None:
        """Encode the outcomes buffered since the last call. The runtime calls it once per
        event-loop iteration, after the answers (a few microseconds per outcome there, not a
        whole span's at once in ``flush``: that was a stall of the event loop)."""
        for row, at in self._unencoded:
            row[at] = _encode(row[at + 1])
        self._unencoded.clear()

    @property
    def error(self) -> BaseException | None:
        """The writer's last commit error (None after a success, or when closed)."""
        return self._writer.error if self._writer is not None else None

    @property
    def buffered(self) -> int:
        """Entries not yet handed to the writer."""
        return len(self._new) + len(self._ends)

    def flush(self) -> bool:
        """Hand the buffered entries to the writer (encoded), and switch logs: False when
        the writer still has the previous ones (they wait for the next flush)."""
        writer = self._require()
        if not self._new and not self._ends:
            return True
        if writer.busy:
            return False
        self.encode()
        new, ends = self._new, self._ends
        inserts = [row[:7] for row in new.values()]
        updates = [(at, text, i) for i, (at, text, _) in ends.items()]
        self._handed_new = {i: Entry(row[1], row[7]) for i, row in new.items()}
        self._handed_ends = {i: outcome for i, (_, _, outcome) in ends.items()}
        batch = Batch(inserts, updates, self._logs[self._active])
        self._active ^= 1  # later acceptances go to the other log (emptied with its batch)
        self._torn = False
        self._new, self._ends = {}, {}
        writer.submit(batch)
        return True

    def commit(self) -> None:
        """Hand everything buffered to the writer and wait until it is committed (tests,
        shutdown); raises the writer's error if it could not commit."""
        writer = self._require()
        for _ in range(3):  # what was in hand, then what is buffered
            if not writer.wait(COMMIT_WAIT_S):
                raise TimeoutError(f"the journal's writer did not commit within {COMMIT_WAIT_S} s")
            if writer.busy and writer.error is not None:
                raise writer.error
            if not self._new and not self._ends:
                self._handed_new, self._handed_ends = {}, {}  # all on disk now
                return
            self.flush()
        raise RuntimeError("the journal could not commit")  # pragma: no cover

    # ------------------------------------------------------------------ reads
    def lookup(self, action_id: str) -> Entry | None:
        """The journal's entry for ``action_id`` (buffered, in hand, or on disk), or None."""
        row = self._new.get(action_id)
        if row is not None:
            return Entry(row[1], row[7])
        entry = self._entry(action_id)
        pending = self._ends.get(action_id)
        if entry is not None and pending is not None:
            return Entry(entry.fingerprint, pending[2])
        return entry

    def __len__(self) -> int:
        """Entries on disk (a full count: for tests and reports, not the hot path)."""
        return store.count(self._reader_db())

    # ------------------------------------------------------------------ inside
    def _entry(self, action_id: str) -> Entry | None:
        """In the writer's hand, else on disk (with an outcome in its hand, if any)."""
        handed = self._handed_new.get(action_id)
        if handed is not None:
            return handed
        found = store.find(self._reader_db(), action_id)
        if found is None:
            return None
        outcome = self._handed_ends.get(action_id)
        return Entry(found[0], outcome if outcome is not None else _decode(found[1]))

    def _require(self) -> Writer:
        if self._writer is None:
            raise RuntimeError(f"the journal {self.path} is not open")
        return self._writer

    def _reader_db(self) -> sqlite3.Connection:
        if self._reader is None:
            raise RuntimeError(f"the journal {self.path} is not open")
        return self._reader

    def _mark_unknown(self, db: sqlite3.Connection, now: float) -> int:
        left = store.unfinished(db)
        if left:
            rows = [
                (now, _encode(unknown_outcome(i, res, traj, at)), i) for i, res, traj, at in left
            ]
            store.transaction(db, (store.UPDATE, rows))
            log.warning(
                "journal %s: %d actions accepted before the service stopped have no outcome; "
                "they are answered 'unknown' and will not run",
                self.path,
                len(left),
            )
        return len(left)


def _logged(path: Path, now: float) -> list[tuple[str, str, str, Any, float]]:
    """The acceptances a previous run logged to ``path`` (missing file: none); damaged
    lines are logged (``store.rows_of`` says what becomes of them)."""
    try:
        text = path.read_text(encoding="utf-8", errors="replace")
    except FileNotFoundError:
        return []
    rows, damaged = store.rows_of(text.splitlines(), now)
    if damaged:
        log.warning(
            "journal log %s: %d damaged lines (a torn last one is a kill's); the ids read "
            "from them are kept",
            path,
            damaged,
        )
    return rows


def _log_line(row: list[Any]) -> str:
    """An acceptance as a line of the log: id, fingerprint, resource, trajectory, when."""
    return json.dumps(row[:5], separators=(",", ":")) + "\n"


def _write_all(fd: int, data: bytes) -> None:
    view = memoryview(data)
    while view:
        view = view[os.write(fd, view) :]


def _encode(outcome: Outcome) -> str:
    try:
        return outcome_to_json(outcome)
    except Exception as exc:  # noqa: BLE001 - a value JSON cannot hold: keep the rest
        # (Any error: one raised here is raised again at every later flush, and nothing after
        # it would be committed; a value nested too deep is a RecursionError, in its repr too.)
        log.warning("outcome of %s kept without its value: %r", outcome.action_id, exc)
        try:
            shown = repr(outcome.value)[:1000]
        except Exception:  # noqa: BLE001
            shown = f"<a {type(outcome.value).__name__} that could not be stored>"
        return outcome_to_json(replace(outcome, value=shown))


def _decode(text: str | None) -> Outcome | None:
    return None if text is None else outcome_from_json(text)


#: The files a journal at PATH writes besides PATH: its two write-ahead logs, used in turn,
#: its lock, and SQLite's own (WAL mode; ``-journal`` while it recovers).
LOG_SUFFIXES = (".accepts.0", ".accepts.1")
LOCK_SUFFIX = ".lock"
SQLITE_SUFFIXES = ("-wal", "-shm", "-journal")


def journal_files(path: Path) -> tuple[Path, ...]:
    """Every file a journal at ``path`` may write (the database first)."""
    suffixes = ("", *LOG_SUFFIXES, LOCK_SUFFIX, *SQLITE_SUFFIXES)
    return tuple(path.with_name(path.name + suffix) for suffix in suffixes)


def _lock(path: Path) -> IO[str]:
    """Hold ``PATH.lock`` exclusively (``JournalBusy`` if another process does)."""
    handle = open(path.with_name(path.name + LOCK_SUFFIX), "a+")  # noqa: SIM115 - held while open
    try:
        fcntl.flock(handle.fileno(), fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        handle.seek(0)
        holder = handle.read().strip() or "another process"
        handle.close()
        raise JournalBusy(
            f"journal {path} is in use by {holder}: two services must not share a journal; "
            "give this one another --journal path"
        ) from None
    handle.seek(0)
    handle.truncate()
    handle.write(f"pid {os.getpid()}\n")
    handle.flush()
    return handle
