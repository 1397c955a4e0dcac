"""The journal: the ids a service accepted, each with its submission's fingerprint and, once it
ended, its outcome, on disk (SQLite, WAL), so that a restarted service never runs an id twice.

Why a journal: clients resend ``POST /v1/actions`` with the same id after a lost connection.
A service that forgot the id (it was killed and restarted) would run the action again. With
the journal it answers instead: a finished id with its recorded outcome, an id accepted
before the stop and never finished with an explicit ``unknown`` outcome (it may have run,
so it must not run again), marked so when the journal opens.

- **Write-ahead.** ``accept`` and ``ended`` only buffer; ``commit`` writes the buffer in one
  transaction (outcomes are encoded there, off the path of the answer). The runtime commits
  before any action starts (the host's start gate: one commit covers every submission of a
  scheduling pass) and otherwise at most ``LINGER_S`` after an entry is buffered, so an
  action that may have started is always on disk and outcomes share commits. A commit that
  fails keeps its entries buffered and raises: the runtime then starts nothing (each start
  retries it).
- **Durability.** WAL with ``synchronous=NORMAL`` by default: a commit returns once the WAL
  holds it, which survives the process being killed (what the journal is for); a power loss
  or kernel crash may lose the last commits (never the file's consistency), and an action
  lost that way could run again. ``fsync=True`` (``synchronous=FULL``) syncs every commit to
  close that too, at the disk's sync cost on each event-loop iteration that commits.
- **Bounded.** Finished entries accepted more than ``keep_s`` ago, or older than the newest
  ``keep``, are deleted, in chunks inside a commit (every ``EXPIRE_EVERY`` acceptances or
  ``EXPIRE_PERIOD_S``), oldest first. Unfinished ones are never deleted: they are in flight.
  A resend after its entry expired is a new action.
- **One service per journal**: an exclusive lock on ``PATH.lock`` is held while it is open
  (the kernel drops it when the process dies, so a restart after a kill -9 gets it).
"""

from __future__ import annotations

import fcntl
import logging
import os
import sqlite3
import time
from collections.abc import Callable
from dataclasses import dataclass, replace
from pathlib import Path
from typing import IO, Any

from tangram.exec.runtime.journal_codec import outcome_from_json, outcome_to_json
from tangram.exec.runtime.outcomes import unknown_outcome
from tangram.exec.runtime.records import Outcome

log = logging.getLogger(__name__)

#: The journal's format (SQLite ``user_version``); a newer file is refused, not misread.
FORMAT = 1
#: The longest an entry waits in the buffer for a commit when no start forces one: outcomes
#: of one such span share a commit (~20 us each on this machine's disk), and an outcome lost
#: with the process within it is answered ``unknown``, never run again.
LINGER_S = 0.01
#: Expiry runs inside a commit after this many acceptances, or this long, since the last.
EXPIRE_EVERY = 1000
EXPIRE_PERIOD_S = 60.0
#: Age expiry deletes at most this many entries per chunk, and this many chunks per commit
#: (bounded work on the event loop; what is left goes at the next expiry).
EXPIRE_CHUNK = 1000
EXPIRE_CHUNKS = 8

_SCHEMA = """
CREATE TABLE IF NOT EXISTS actions (
    seq INTEGER PRIMARY KEY,      -- acceptance order: expiry goes oldest first
    id TEXT NOT NULL UNIQUE,
    fingerprint TEXT NOT NULL,    -- ActionSpec.fingerprint: a resend must match it
    resource TEXT NOT NULL,
    trajectory TEXT,
    accepted_unix REAL NOT NULL,
    ended_unix REAL,
    outcome TEXT                  -- journal_codec JSON; NULL while it may still run
)
"""
_INSERT = (
    "INSERT OR REPLACE INTO actions "
    "(id, fingerprint, resource, trajectory, accepted_unix, ended_unix, outcome) "
    "VALUES (?, ?, ?, ?, ?, ?, ?)"
)
_UPDATE = "UPDATE actions SET ended_unix = ?, outcome = ? WHERE id = ?"


class JournalBusy(ValueError):
    """Another process holds the journal (two services must not share one)."""


@dataclass(frozen=True)
class Entry:
    """What the journal holds of one id: its fingerprint and its outcome (None: not ended)."""

    fingerprint: str
    outcome: Outcome | None


class Journal:
    """Accepted ids, fingerprints and outcomes in a SQLite file (event-loop thread only)."""

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
        self._db: sqlite3.Connection | None = None
        self._lock: IO[str] | None = None
        #: Buffered acceptances (id -> insert row; an outcome that came first fills it in).
        self._new: dict[str, list[Any]] = {}
        #: Buffered outcomes of ids already committed (id -> (ended_unix, outcome)).
        self._ends: dict[str, tuple[float, Outcome]] = {}
        self._since_expire = 0
        self._last_expire = 0.0

    # ------------------------------------------------------------------ open, close
    def open(self) -> int:
        """Lock and open the file (created if missing), then mark every entry a previous run
        left unfinished ``unknown``; returns how many were."""
        self.path.parent.mkdir(parents=True, exist_ok=True)
        self._lock = _lock(self.path)
        try:
            db = sqlite3.connect(self.path, isolation_level=None, check_same_thread=False)
            self._db = db
            version = db.execute("PRAGMA user_version").fetchone()[0]
            if version > FORMAT:
                raise ValueError(
                    f"journal {self.path} is format {version}, newer than this Tangram reads "
                    f"({FORMAT}); give another --journal path"
                )
            db.execute("PRAGMA journal_mode = WAL")
            db.execute(f"PRAGMA synchronous = {'FULL' if self.fsync else 'NORMAL'}")
            db.execute(_SCHEMA)
            db.execute(f"PRAGMA user_version = {FORMAT}")
            now = self.clock()
            marked = self._mark_unknown(now)
            self._expire(now)
            self._last_expire = now
        except BaseException:
            self.close()
            raise
        return marked

    def close(self) -> None:
        """Commit what is buffered (best effort), close the file, release the lock."""
        if self._db is not None:
            try:
                self.commit()
            except sqlite3.Error:
                log.exception("the journal's last commit failed; %d entries lost", self.buffered)
            self._db.close()
            self._db = None
        if self._lock is not None:
            self._lock.close()  # closing the descriptor releases the flock
            self._lock = None

    @property
    def is_open(self) -> bool:
        return self._db is not None

    # ------------------------------------------------------------------ writes
    def accept(
        self,
        action_id: str,
        fingerprint: str,
        resource: str,
        trajectory: str | None,
        at_unix: float,
    ) -> None:
        """Buffer an accepted action (written by the next ``commit``, before it can start)."""
        self._new[action_id] = [action_id, fingerprint, resource, trajectory, at_unix, None, None]

    def ended(self, outcome: Outcome, at_unix: float) -> None:
        """Buffer an action's outcome (encoded and written by the next ``commit``)."""
        row = self._new.get(outcome.action_id)
        if row is not None:  # accepted and ended within one batch: one insert
            row[5], row[6] = at_unix, outcome
        else:
            self._ends[outcome.action_id] = (at_unix, outcome)

    @property
    def buffered(self) -> int:
        """Entries waiting for the next commit."""
        return len(self._new) + len(self._ends)

    def commit(self) -> None:
        """Write the buffered entries in one transaction (expiring old ones when due). On a
        failure the entries stay buffered for the next commit and the error is raised."""
        if not self._new and not self._ends:
            return
        db = self._require()
        new, ends = self._new, self._ends
        self._new, self._ends = {}, {}
        now = self.clock()
        try:
            inserts = [[*row[:6], _encode(row[6]) if row[6] else None] for row in new.values()]
            updates = [(at, _encode(outcome), i) for i, (at, outcome) in ends.items()]
            db.execute("BEGIN")
            db.executemany(_INSERT, inserts)
            db.executemany(_UPDATE, updates)
            self._since_expire += len(new)
            if self._since_expire >= EXPIRE_EVERY or now - self._last_expire >= EXPIRE_PERIOD_S:
                self._expire(now)
            db.execute("COMMIT")
        except BaseException:
            if db.in_transaction:
                db.execute("ROLLBACK")
            self._new, self._ends = {**new, **self._new}, {**ends, **self._ends}
            raise

    # ------------------------------------------------------------------ reads
    def lookup(self, action_id: str) -> Entry | None:
        """The journal's entry for ``action_id`` (buffered or on disk), or None."""
        row = self._new.get(action_id)
        if row is not None:
            return Entry(row[1], row[6])
        found = (
            self._require()
            .execute("SELECT fingerprint, outcome FROM actions WHERE id = ?", (action_id,))
            .fetchone()
        )
        if found is None:
            return None
        pending = self._ends.get(action_id)
        return Entry(found[0], pending[1] if pending else _decode(found[1]))

    def __len__(self) -> int:
        """Entries on disk (a full count: for tests and reports, not the hot path)."""
        return self._require().execute("SELECT count(*) FROM actions").fetchone()[0]

    # ------------------------------------------------------------------ inside
    def _require(self) -> sqlite3.Connection:
        if self._db is None:
            raise RuntimeError(f"the journal {self.path} is not open")
        return self._db

    def _mark_unknown(self, now: float) -> int:
        db = self._require()
        left = db.execute(
            "SELECT id, resource, trajectory, accepted_unix FROM actions WHERE outcome IS NULL"
        ).fetchall()
        if left:
            rows = [
                (now, _encode(unknown_outcome(i, res, traj, at)), i) for i, res, traj, at in left
            ]
            db.execute("BEGIN")
            db.executemany(_UPDATE, rows)
            db.execute("COMMIT")
            log.warning(
                "journal %s: %d actions accepted before the service stopped have no outcome; "
                "they are answered 'unknown' and will not run",
                self.path,
                len(left),
            )
        return len(left)

    def _expire(self, now: float) -> None:
        """Delete finished entries beyond the newest ``keep`` or accepted over ``keep_s`` ago."""
        db = self._require()
        self._since_expire, self._last_expire = 0, now
        top = db.execute("SELECT max(seq) FROM actions").fetchone()[0]
        if top is not None and top > self.keep:
            db.execute(
                "DELETE FROM actions WHERE seq <= ? AND outcome IS NOT NULL", (top - self.keep,)
            )
        for _ in range(EXPIRE_CHUNKS):  # oldest first; stops at the first young chunk
            gone = db.execute(
                "DELETE FROM actions WHERE seq IN (SELECT seq FROM actions ORDER BY seq LIMIT ?)"
                " AND accepted_unix < ? AND outcome IS NOT NULL",
                (EXPIRE_CHUNK, now - self.keep_s),
            ).rowcount
            if gone == 0:
                break


def _encode(outcome: Outcome) -> str:
    try:
        return outcome_to_json(outcome)
    except (TypeError, ValueError) as exc:  # a value JSON cannot hold: keep the rest
        log.warning("outcome of %s kept without its value: %s", outcome.action_id, exc)
        return outcome_to_json(replace(outcome, value=repr(outcome.value)[:1000]))


def _decode(text: str | None) -> Outcome | None:
    return None if text is None else outcome_from_json(text)


def _lock(path: Path) -> IO[str]:
    """Hold ``PATH.lock`` exclusively (``JournalBusy`` if another process does)."""
    handle = open(path.with_name(path.name + ".lock"), "a+")  # noqa: SIM115 - held while open
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
