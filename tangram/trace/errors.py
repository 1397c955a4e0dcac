"""The error a trace that breaks format v1 raises, naming the file, the place and the field."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from tangram.core.cluster_file import other_encoding

__all__ = ["TOO_DEEP", "TraceError", "loads_unique", "other_encoding"]


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


#: The reason given for JSON nested past what the parser can recurse into.
TOO_DEEP = "JSON nested too deeply (arrays or objects past Python's recursion limit)"


def loads_unique(text: str | bytes) -> Any:
    """``json.loads`` that refuses an object with a repeated key (TraceError naming the key):
    plain ``json.loads`` keeps the last value and drops the others without a word. JSON
    nested past the recursion limit (``[[[[...``) is a TraceError too (``TOO_DEEP``, no
    field), not a RecursionError traceback."""
    try:
        return json.loads(text, object_pairs_hook=_unique_keys)
    except RecursionError:
        raise TraceError(TOO_DEEP) from None


def _unique_keys(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
    obj: dict[str, Any] = {}
    for key, value in pairs:
        if key in obj:
            raise TraceError("the key appears more than once in one JSON object", field=key)
        obj[key] = value
    return obj
