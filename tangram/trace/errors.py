"""The error a trace that breaks format v1 raises, naming the file, the place and the field."""

from __future__ import annotations

from pathlib import Path


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
