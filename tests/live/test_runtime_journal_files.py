"""The journal's files as found at open: write-ahead log lines that parse as JSON but hold
fields of the wrong kind (a damaged disk, an edit by hand), and a SQLite database of another
application given as ``--journal``. No Docker, no runtime."""

from __future__ import annotations

import sqlite3
import time
from pathlib import Path

import pytest

from tangram.exec.runtime.journal import Journal


def logged(tmp_path: Path, line: str) -> Journal:
    """A journal whose first log holds ``line`` (as a run killed after logging it leaves)."""
    path = tmp_path / "j.sqlite"
    j = Journal(path)
    j.open()
    j.close()
    j.log_paths[0].write_text(line.replace("NOW", repr(time.time())) + "\n")
    return Journal(path)


@pytest.mark.parametrize(
    "line",
    [
        '["a1", "fp", "api", null, "x"]',  # a time that is no number: TypeError at open
        '["a1", "fp", "api", null, 1e400]',  # a time out of range: OverflowError at open
        '["a1", "fp", "api", ["t"], NOW]',  # a trajectory that is no string: sqlite3 error
        '["a1", "fp", "api", null, NaN]',  # no time SQLite keeps: the id dropped silently
        '["a1", "fp", "api", null, null]',  # the same
    ],
    ids=["text-time", "huge-time", "list-trajectory", "nan-time", "null-time"],
)
def test_a_logged_acceptance_with_a_damaged_field_keeps_its_id(tmp_path: Path, line: str) -> None:
    """A log line that parses but holds a field of the wrong kind either kept the journal
    (and so the service) from opening at all, with an error naming neither the file nor
    the line, or was dropped by SQLite's ``INSERT OR IGNORE`` without a word: its id
    forgotten, a resend of it ran the action a second time. The id is kept, marked unknown
    (it may have run), its damaged fields replaced."""
    j = logged(tmp_path, line)
    assert j.open() == 1
    entry = j.lookup("a1")
    assert entry is not None and entry.outcome is not None, entry
    assert entry.outcome.status == "unknown" and entry.outcome.trajectory is None
    assert "a1" in entry.outcome.error.message  # type: ignore[union-attr]
    j.close()


def test_lines_without_a_readable_id_are_skipped_and_the_rest_kept(tmp_path: Path) -> None:
    j = logged(tmp_path, '[7, "fp", "api", null, NOW]\n["ok", "fp", "api", null, NOW]\n[1, 2')
    assert j.open() == 1
    assert j.lookup("ok") is not None and j.lookup("7") is None
    j.close()


def test_a_sqlite_database_of_another_application_is_refused_and_left_as_it_was(
    tmp_path: Path,
) -> None:
    """A ``--journal`` naming another application's SQLite database (user_version 0, tables
    of its own) was taken for a new journal: its file was switched to WAL mode and given
    the journal's table and format number, written for good."""
    path = tmp_path / "app.db"
    db = sqlite3.connect(path)
    db.execute("CREATE TABLE users (name TEXT)")
    db.execute("INSERT INTO users VALUES ('ada')")
    db.commit()
    db.close()
    with pytest.raises(ValueError, match=r"app\.db.*not a journal.*users.*--journal"):
        Journal(path).open()
    db = sqlite3.connect(path)
    tables = [r[0] for r in db.execute("SELECT name FROM sqlite_master WHERE type = 'table'")]
    assert tables == ["users"]
    assert db.execute("PRAGMA journal_mode").fetchone()[0] == "delete"
    assert db.execute("PRAGMA user_version").fetchone()[0] == 0
    db.close()


def test_an_empty_file_and_a_journal_made_before_its_format_was_set_open(tmp_path: Path) -> None:
    """What is not another application's: an empty file (a new journal), and a journal
    whose table was made by a run killed before it set the format number."""
    empty = tmp_path / "empty.sqlite"
    empty.touch()
    j = Journal(empty)
    j.open()
    j.close()
    half = tmp_path / "half.sqlite"
    db = sqlite3.connect(half)
    from tangram.exec.runtime.journal_store import SCHEMA

    db.execute(SCHEMA)
    db.commit()
    db.close()
    j = Journal(half)
    assert j.open() == 0
    j.close()
