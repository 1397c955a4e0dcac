"""What the importers share: the error type and small readers that fail with clear messages."""

from __future__ import annotations

import json
from collections.abc import Iterator
from contextlib import contextmanager
from datetime import datetime
from pathlib import Path
from typing import Any

from tangram.trace import TraceError
from tangram.trace.errors import TOO_DEEP, other_encoding


class TraceImportError(ValueError):
    """A file an importer cannot turn into a trace: wrong, older or foreign schema.

    ``path`` is the file and ``reason`` says what is missing or wrong, e.g. a SWE-agent
    ``.traj`` whose steps carry no ``execution_time`` (an older format), or a TraceLab file
    given to the OpenHands importer.
    """

    def __init__(self, path: str | Path, reason: str) -> None:
        self.path = str(path)
        self.reason = reason
        super().__init__(f"{self.path}: {reason}")


@contextmanager
def located(path: Path, where: str) -> Iterator[None]:
    """Name the file and the record of a row the trace format refuses: a field built from the
    file (a step's ``execution_time`` of 2e9 s) or from a parameter (``min_t1_s=0`` with a
    step of 0 s, ``gen_before_s=2e9``) failed as a bare TraceError naming the field alone."""
    try:
        yield
    except TraceError as exc:
        raise TraceImportError(path, f"{where}: {exc}") from None


def read_json(path: Path, what: str) -> Any:
    """Parse a whole file as one JSON document, or fail naming the file and the position."""
    try:
        text = path.read_text(encoding="utf-8-sig")  # (a byte-order mark may open it)
    except UnicodeDecodeError:
        raise TraceImportError(
            path, f"{_not_utf8(path) or 'not a text file'}; expected {what}"
        ) from None
    except OSError as exc:
        raise unreadable(path, exc) from None
    try:
        return json.loads(text)
    except json.JSONDecodeError as exc:
        raise TraceImportError(
            path, f"not JSON (line {exc.lineno}, column {exc.colno}: {exc.msg}); expected {what}"
        ) from None
    except RecursionError:  # ([[[[... past the parser's recursion: a traceback)
        raise TraceImportError(path, f"{TOO_DEEP}; expected {what}") from None


def _not_utf8(path: Path) -> str | None:
    """The encoding a file's byte-order mark names (UTF-16 from a PowerShell redirect), for
    the error: it said "not a text file" or "line 1 is not UTF-8 text", no hint why."""
    try:
        with path.open("rb") as fh:
            return other_encoding(fh.read(4))
    except OSError:
        return None


def read_jsonl(path: Path, what: str) -> list[tuple[int, Any]]:
    """Parse a JSON-lines file into (line number, object) pairs, skipping blank lines."""
    out = []
    try:
        with path.open(encoding="utf-8-sig") as fh:  # (idem)
            for lineno, line in enumerate(fh, start=1):
                if not line.strip():
                    continue
                try:
                    out.append((lineno, json.loads(line)))
                except json.JSONDecodeError as exc:
                    raise TraceImportError(
                        path, f"line {lineno} is not JSON ({exc.msg}); expected {what}"
                    ) from None
                except RecursionError:  # (idem)
                    raise TraceImportError(
                        path, f"line {lineno}: {TOO_DEEP}; expected {what}"
                    ) from None
    except UnicodeDecodeError:
        if why := _not_utf8(path):
            raise TraceImportError(path, f"{why}; expected {what}") from None
        # The decoder reads ahead of the lines: the line is where the bad byte sits.
        data = path.read_bytes()
        start = len(data)
        try:
            data.decode("utf-8")
        except UnicodeDecodeError as exc:
            start = exc.start
        line = data.count(b"\n", 0, start) + 1
        raise TraceImportError(path, f"line {line} is not UTF-8 text; expected {what}") from None
    except OSError as exc:
        raise unreadable(path, exc) from None
    return out


def unreadable(path: Path, exc: OSError) -> TraceImportError:
    """The error for a file that cannot be opened (missing, a directory, no permission): a
    bare IsADirectoryError was a traceback."""
    if isinstance(exc, FileNotFoundError):
        return TraceImportError(path, "no such file")
    if isinstance(exc, IsADirectoryError):
        return TraceImportError(path, "a directory, not a file")
    return TraceImportError(path, f"cannot read: {exc.strerror}")


def parse_timestamp(value: Any, path: Path, where: str) -> datetime:
    """An ISO-8601 timestamp (with or without zone) as a datetime."""
    if not isinstance(value, str):
        raise TraceImportError(
            path, f"{where}: 'timestamp' must be an ISO-8601 string, got {value!r}"
        )
    try:
        return datetime.fromisoformat(value.replace("Z", "+00:00"))
    except ValueError:
        raise TraceImportError(path, f"{where}: unreadable timestamp {value!r}") from None


def seconds(delta_end: datetime, delta_start: datetime) -> float:
    """end - start in seconds, rounded to microseconds."""
    return round((delta_end - delta_start).total_seconds(), 6)
