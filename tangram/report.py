"""Printing figures for people (aligned tables) or machines (``--json``), one way for every command."""

from __future__ import annotations

import argparse
import json
import math
import os
import sys
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any, TextIO


def _int_at_least(text: str, minimum: int) -> int:
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not an integer") from None
    if value < minimum:
        raise argparse.ArgumentTypeError(f"must be >= {minimum}, got {value}")
    return value


def int_in(low: int, high: int, why: str) -> Callable[[str], int]:
    """An argparse type: an integer in [low, high], refused naming the range and ``why`` the
    bound (a count past it runs for hours or exhausts memory without a word)."""

    def parse(text: str) -> int:
        value = _int_at_least(text, low)
        if value > high:
            raise argparse.ArgumentTypeError(f"must be at most {high:,} ({why}), got {value:,}")
        return value

    return parse


def seconds_in(low: float, high: float) -> Callable[[str], float]:
    """An argparse type: a finite number of seconds, above ``low`` and at most ``high``."""

    def parse(text: str) -> float:
        try:
            value = float(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"{text!r} is not a number") from None
        if not (math.isfinite(value) and low < value <= high):
            raise argparse.ArgumentTypeError(
                f"must be a finite number of seconds above {low:g} and at most {high:g}, got {text}"
            )
        return value

    return parse


def path_arg(text: str) -> Path:
    """An argparse type for a file or directory path: not empty. ``Path("")`` is ``.``, so an
    empty argument (an unset shell variable: ``--out "$OUT"``) wrote results into the current
    directory, or imported every run under it, without a word."""
    if not text.strip():
        raise argparse.ArgumentTypeError(
            f"an empty path ({text!r}: an unset shell variable?); give a file or directory"
        )
    return Path(text)


def check_out_file(flag: str, path: Path) -> None:
    """Refuse an output file the run could not write, before the run: a directory that is
    not there or not writable, a directory given as the file, or a file not writable. Found
    after a whole profile or calibration, the work was lost (an IsADirectoryError traceback,
    or an error naming no flag); ``tangram sim --out`` checks its directory so too
    (``tangram.sim.metrics.check_out_dir``)."""
    if not path.parent.is_dir():
        raise ValueError(f"{flag} {str(path)!r}: no directory {str(path.parent)!r}")
    if path.is_dir():
        raise ValueError(f"{flag} {str(path)!r}: a directory, not a file to write")
    if not os.access(path.parent, os.W_OK | os.X_OK):
        raise ValueError(f"{flag} {str(path)!r}: directory {str(path.parent)!r} is not writable")
    if path.exists() and not os.access(path, os.W_OK):
        raise ValueError(f"{flag} {str(path)!r}: the file is not writable")


def write_out_file(flag: str, path: Path, text: str) -> None:
    """Write ``text`` to the output file ``path`` (UTF-8), an OSError (no permission, a full
    disk, a read-only file system) an error naming the flag and the path, not a traceback."""
    try:
        path.write_text(text, encoding="utf-8")
    except OSError as exc:
        raise ValueError(f"{flag} {str(path)!r}: cannot write it: {exc.strerror or exc}") from None


def positive_int(text: str) -> int:
    """An argparse type: an integer >= 1, refused with a message naming the value."""
    return _int_at_least(text, 1)


def non_negative_int(text: str) -> int:
    """An argparse type: an integer >= 0, refused with a message naming the value."""
    return _int_at_least(text, 0)


def add_json_flag(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--json", action="store_true", help="print the figures as one JSON document"
    )


def format_number(value: Any) -> str:
    """A figure as the tables print it: NaN as ``-``, 3 decimals, 1 above 100, 3 digits beyond."""
    if isinstance(value, float):
        if math.isnan(value):
            return "-"
        if value != 0 and (abs(value) >= 1e5 or abs(value) < 1e-3):
            return f"{value:.3g}"
        return f"{value:.3f}" if abs(value) < 100 else f"{value:.1f}"
    return str(value)


def format_table(rows: Sequence[Mapping[str, Any]], columns: Sequence[str] | None = None) -> str:
    """An aligned plain-text table of ``rows`` (dicts), columns in the given or first-seen order."""
    if not rows:
        return "(no rows)"
    cols = list(columns or dict.fromkeys(k for row in rows for k in row))
    cells = [[format_number(row.get(c, "")) for c in cols] for row in rows]
    widths = [max(len(c), *(len(r[i]) for r in cells)) for i, c in enumerate(cols)]
    lines = ["  ".join(c.ljust(w) for c, w in zip(cols, widths, strict=True))]
    lines.append("  ".join("-" * w for w in widths))
    lines += ["  ".join(v.rjust(w) for v, w in zip(r, widths, strict=True)) for r in cells]
    return "\n".join(lines)


def table_width(rows: Sequence[Mapping[str, Any]], columns: Sequence[str]) -> int:
    """Characters per line of ``format_table(rows, columns)``."""
    return max(len(line) for line in format_table(rows, columns).splitlines())


def fit_columns(rows: Sequence[Mapping[str, Any]], columns: Sequence[str], width: int) -> list[str]:
    """``columns`` (most important first), less the last ones, so the table fits ``width``.

    The first column is always kept.
    """
    kept = list(columns)
    while len(kept) > 1 and table_width(rows, kept) > width:
        kept.pop()
    return kept


def emit(
    as_json: bool,
    document: Mapping[str, Any],
    tables: Mapping[str, Sequence[Mapping[str, Any]]],
    out: TextIO | None = None,
) -> None:
    """Print ``document`` as JSON, or each of ``tables`` under its title for a person.

    JSON has no NaN or infinity (Python's ``NaN``/``Infinity`` tokens make a document other
    parsers reject): a non-finite float is written as ``null``, the figure being undefined
    (e.g. the mean ACT of a policy whose every action was rejected). Nothing else changes.
    """
    out = out or sys.stdout
    if as_json:
        json.dump(_finite_or_null(document), out, indent=2, default=_json_default, allow_nan=False)
        out.write("\n")
        return
    for title, rows in tables.items():
        out.write(f"\n{title}\n{format_table(rows)}\n")


def _finite_or_null(value: Any) -> Any:
    """``value`` with every non-finite float (NumPy's included) inside dicts, lists and
    tuples replaced by None; tuples become lists, as ``json`` writes them anyway."""
    if isinstance(value, float):
        return value if math.isfinite(value) else None
    if isinstance(value, Mapping):
        return {k: _finite_or_null(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [_finite_or_null(v) for v in value]
    return value


def _json_default(value: Any) -> Any:
    """What ``json`` cannot encode itself: NumPy scalars, sets, else the text of the value."""
    if hasattr(value, "item"):
        return _finite_or_null(value.item())
    if isinstance(value, set | tuple):
        return _finite_or_null(list(value))
    return str(value)
