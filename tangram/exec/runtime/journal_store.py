"""The journal's SQLite file: its schema and every statement it runs, on a connection.

No threads and no buffers here (``journal.py`` has the buffers, ``journal_writer.py`` the
thread), so each statement is written once and tested on its own.
"""

from __future__ import annotations

import functools
import json
import math
import sqlite3
from collections.abc import Iterable, Sequence
from pathlib import Path
from typing import Any

#: The file's format (SQLite ``user_version``); a newer file is refused, not misread.
FORMAT = 1
#: Age expiry deletes at most this many entries per chunk, and this many chunks per commit
#: (bounded work per commit; what is left goes at the next expiry).
EXPIRE_CHUNK = 1000
EXPIRE_CHUNKS = 8
#: The WAL file is truncated to this after a checkpoint if it grew beyond it (a burst).
WAL_LIMIT_BYTES = 64 << 20

SCHEMA = """
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
INSERT = (
    "INSERT OR REPLACE INTO actions "
    "(id, fingerprint, resource, trajectory, accepted_unix, ended_unix, outcome) "
    "VALUES (?, ?, ?, ?, ?, ?, ?)"
)
UPDATE = "UPDATE actions SET ended_unix = ?, outcome = ? WHERE id = ?"
REPLAY = (
    "INSERT OR IGNORE INTO actions (id, fingerprint, resource, trajectory, accepted_unix) "
    "VALUES (?, ?, ?, ?, ?)"
)


def connect(path: Path, *, fsync: bool) -> sqlite3.Connection:
    """Open (or create) the journal at ``path``: WAL, synchronous NORMAL (FULL with ``fsync``),
    no automatic checkpoints (the writer thread runs them), the schema."""
    db = sqlite3.connect(path, isolation_level=None, check_same_thread=False)
    try:
        try:
            version = db.execute("PRAGMA user_version").fetchone()[0]
            _check_not_foreign(db, path, version)
        except sqlite3.DatabaseError as exc:  # (sqlite3's own words name neither)
            raise ValueError(
                f"journal {path} is not a journal ({exc}): it holds another file; give "
                "another --journal path"
            ) from None
        if version > FORMAT:
            raise ValueError(
                f"journal {path} is format {version}, newer than this Tangram reads "
                f"({FORMAT}); give another --journal path"
            )
        db.execute("PRAGMA journal_mode = WAL")
        db.execute(f"PRAGMA synchronous = {'FULL' if fsync else 'NORMAL'}")
        db.execute("PRAGMA wal_autocheckpoint = 0")
        db.execute(f"PRAGMA journal_size_limit = {WAL_LIMIT_BYTES}")
        db.execute(SCHEMA)
        db.execute(f"PRAGMA user_version = {FORMAT}")
    except BaseException:
        db.close()
        raise
    return db


def _check_not_foreign(db: sqlite3.Connection, path: Path, version: int) -> None:
    """``ValueError`` when ``path`` is another application's SQLite database: no format
    number and tables besides the journal's own. Taken for a new journal, such a file was
    switched to WAL mode and given the journal's table and format, written for good. (No
    format number with the journal's table alone is a journal whose first run was killed
    before it set the number.)"""
    if version != 0:
        return
    tables = {
        name
        for (name,) in db.execute(
            "SELECT name FROM sqlite_master WHERE type IN ('table', 'view')"
            " AND name NOT LIKE 'sqlite_%'"
        )
    }
    others = sorted(tables - {"actions"})
    if others:
        raise ValueError(
            f"journal {path} is not a journal: it is another application's SQLite database "
            f"(tables {', '.join(others[:5])}); give another --journal path"
        )


def reader(path: Path) -> sqlite3.Connection:
    """A second connection for lookups (WAL lets it read while the writer writes)."""
    return sqlite3.connect(path, isolation_level=None, check_same_thread=False)


def transaction(db: sqlite3.Connection, *steps: tuple[str, Sequence[Any]]) -> None:
    """Run ``executemany`` steps in one transaction (rolled back on any failure)."""
    db.execute("BEGIN")
    try:
        for sql, rows in steps:
            if rows:
                db.executemany(sql, rows)
        db.execute("COMMIT")
    except BaseException:
        if db.in_transaction:
            db.execute("ROLLBACK")
        raise


def write(db: sqlite3.Connection, inserts: Sequence[Sequence[Any]], updates: Sequence[Any]) -> None:
    """Insert rows (``INSERT`` order) and set outcomes (``(ended_unix, outcome, id)``) in one
    transaction, in statements of a power-of-two number of rows up to ``ROWS_PER_STATEMENT``.

    Why not ``executemany``: it steps once per row, and the writer thread takes the GIL back
    after each step; on a busy event loop each of those is a forced switch (the convoy
    effect). One statement per chunk steps once."""
    db.execute("BEGIN")
    try:
        for chunk in _chunks(inserts):
            db.execute(_insert_sql(len(chunk)), [v for row in chunk for v in row])
        for chunk in _chunks(updates):
            db.execute(_update_sql(len(chunk)), [v for row in chunk for v in row])
        db.execute("COMMIT")
    except BaseException:
        if db.in_transaction:
            db.execute("ROLLBACK")
        raise


#: Most rows per statement in ``write`` (7 parameters each, well under SQLite's 32,766).
ROWS_PER_STATEMENT = 256


def _chunks(rows: Sequence[Any]) -> list[Sequence[Any]]:
    """``rows`` in chunks of 256, 128, ... 1 rows: nine statement shapes in all. Why powers of
    two: each shape is a statement SQLite prepares and caches (up to 128 per connection, tens
    of KB each for long ones); one per batch size made the service's memory creep."""
    out, i = [], 0
    while i < len(rows):
        n = min(ROWS_PER_STATEMENT, 1 << ((len(rows) - i).bit_length() - 1))
        out.append(rows[i : i + n])
        i += n
    return out


@functools.cache
def _insert_sql(n: int) -> str:
    return INSERT.replace("(?, ?, ?, ?, ?, ?, ?)", ", ".join(["(?,?,?,?,?,?,?)"] * n))


@functools.cache
def _update_sql(n: int) -> str:
    values = ", ".join(["(?,?,?)"] * n)
    return (
        "UPDATE actions SET ended_unix = v.column1, outcome = v.column2 "
        f"FROM (VALUES {values}) AS v WHERE actions.id = v.column3"
    )


def unfinished(db: sqlite3.Connection) -> list[tuple[str, str, str | None, float]]:
    """(id, resource, trajectory, accepted_unix) of every entry without an outcome."""
    return db.execute(
        "SELECT id, resource, trajectory, accepted_unix FROM actions WHERE outcome IS NULL"
    ).fetchall()


def find(db: sqlite3.Connection, action_id: str) -> tuple[str, str | None] | None:
    """(fingerprint, outcome JSON or None) of ``action_id``, or None."""
    return db.execute(
        "SELECT fingerprint, outcome FROM actions WHERE id = ?", (action_id,)
    ).fetchone()


def count(db: sqlite3.Connection) -> int:
    return db.execute("SELECT count(*) FROM actions").fetchone()[0]


def expire(db: sqlite3.Connection, now: float, keep: int, keep_s: float) -> None:
    """Delete finished entries beyond the newest ``keep`` or accepted over ``keep_s`` ago
    (oldest first; unfinished ones never: they are in flight)."""
    top = db.execute("SELECT max(seq) FROM actions").fetchone()[0]
    if top is not None and top > keep:
        db.execute("DELETE FROM actions WHERE seq <= ? AND outcome IS NOT NULL", (top - keep,))
    for _ in range(EXPIRE_CHUNKS):  # stops at the first chunk with nothing old enough
        gone = db.execute(
            "DELETE FROM actions WHERE seq IN (SELECT seq FROM actions ORDER BY seq LIMIT ?)"
            " AND accepted_unix < ? AND outcome IS NOT NULL",
            (EXPIRE_CHUNK, now - keep_s),
        ).rowcount
        if gone == 0:
            break


def checkpoint(db: sqlite3.Connection) -> None:
    """Copy the WAL into the database without blocking the writer (``PASSIVE``)."""
    db.execute("PRAGMA wal_checkpoint(PASSIVE)").fetchone()


#: The latest acceptance time a log line may give (9999-12-31 UTC): any later one is damage.
MAX_UNIX = 253_402_300_799.0


def rows_of(lines: Iterable[str], now: float) -> tuple[list[tuple[str, str, str, Any, float]], int]:
    """The acceptances of log lines (``journal._log_line``) and how many lines were damaged.

    A line with no string id (torn by a kill, or damaged) is skipped: an action whose log
    write did not finish never started. A line with a string id and other fields of the
    wrong kind (a damaged disk, an edit by hand) keeps its id, so it never runs again: a
    time that is no date becomes ``now``, a trajectory that is no string none, a fingerprint
    or resource that is no string empty. Taken as they were, such fields kept the journal
    from opening (a TypeError from the date of its unknown outcome, sqlite3's binding error)
    or had SQLite's ``INSERT OR IGNORE`` drop the row for a NULL time, the id forgotten."""
    rows, damaged = [], 0
    for line in lines:
        try:
            action_id, fingerprint, resource, trajectory, at = json.loads(line)
        except (ValueError, TypeError):
            damaged += 1
            continue
        if not isinstance(action_id, str) or not action_id:
            damaged += 1
            continue
        fields = (
            fingerprint if isinstance(fingerprint, str) else "",
            resource if isinstance(resource, str) else "",
            trajectory if trajectory is None or isinstance(trajectory, str) else None,
            at if _is_date(at) else now,
        )
        damaged += fields != (fingerprint, resource, trajectory, at)
        rows.append((action_id, *fields))
    return rows, damaged


def _is_date(value: Any) -> bool:
    """Whether ``value`` is a Unix time the journal could have written (a finite number
    from 1970 to 9999: ``time.gmtime`` takes it)."""
    return (
        isinstance(value, int | float)
        and not isinstance(value, bool)
        and math.isfinite(value)
        and 0 <= value <= MAX_UNIX
    )
