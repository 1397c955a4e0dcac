"""Trace files: read and write JSONL (optionally gzipped) and Parquet, chosen by suffix.

These are the format's only readers and writers. Reading validates every row and the rules
across rows, so a bad file fails naming the file, the line (JSONL) or row index (Parquet),
the field and why.
"""

from __future__ import annotations

import gzip
import json
import zlib
from collections.abc import Callable, Iterable, Iterator, Mapping
from pathlib import Path
from typing import Any

from tangram.trace.columns import DTYPES, from_cell, to_flat
from tangram.trace.errors import TraceError, loads_unique, other_encoding
from tangram.trace.header import (
    HEADER_KEY,
    check_fields_of_version,
    check_meta,
    fields_of_version,
    header_object,
    meta_from_header,
)
from tangram.trace.row import FIELDS, REQUIRED, TraceRow, parse_record, row_to_mapping
from tangram.trace.trace import Trace, checked_trace

# ---------------------------------------------------------------------------------------------
# JSONL.


def read_jsonl(path: str | Path) -> Trace:
    """Read a JSONL trace (``.jsonl`` or ``.jsonl.gz``); see :func:`load_trace`."""
    path = Path(path)
    rows: list[TraceRow] = []
    lines: list[int] = []
    meta: dict[str, Any] | None = None
    version = 1
    for lineno, text in _numbered_lines(path):
        if not text.strip():
            continue
        try:
            obj = loads_unique(text)
        except json.JSONDecodeError as exc:
            raise TraceError(
                f"not valid JSON ({exc.msg} at column {exc.colno})" + _stray_hint(text, exc.pos),
                where=f"line {lineno}",
                path=path,
            ) from None
        except TraceError as exc:  # a repeated key
            raise exc.located(where=f"line {lineno}", path=path) from None
        if meta is None:
            meta = meta_from_header(obj, path, f"line {lineno}")
            version = obj[HEADER_KEY]
            continue
        if isinstance(obj, Mapping):
            check_fields_of_version(obj, version, path, f"line {lineno}")
        rows.append(parse_record(obj, f"line {lineno}", path))
        lines.append(lineno)
    if meta is None:
        raise TraceError("empty file: no header line", where="line 1", path=path)
    return checked_trace(rows, meta, lambda i: f"line {lines[i]}", path)


_BOM = b"\xef\xbb\xbf"  # the UTF-8 byte-order mark


def _stray_hint(text: str, pos: int) -> str:
    """Why a line that is not JSON may be so, where it holds what a JSON parser reports only
    as "Extra data" or "Unexpected UTF-8 BOM": carriage returns with no newline (old-Mac line
    endings: the whole file reads as one line) or a byte-order mark past the file's opening
    (``cat a.jsonl b.jsonl`` of files that each open with one). "" when neither comes at or
    before where the parser stopped."""
    cr = text.find("\r")
    if 0 <= cr <= pos and cr < len(text.rstrip("\r\n")):
        return (
            f"; the line holds a carriage return ('\\r') at column {cr + 1} with no newline "
            "after it: old-Mac line endings ('\\r' only) run the lines together; JSONL lines "
            "end with '\\n' or '\\r\\n', so convert them, e.g. tr '\\r' '\\n' < IN > OUT"
        )
    bom = text.find("\ufeff")
    if 0 <= bom <= pos:
        return (
            f"; a UTF-8 byte-order mark (U+FEFF) at column {bom + 1} of the line, where only "
            "the file's first line may open with one (joining files that each open with one, "
            "as cat a.jsonl b.jsonl does, leaves it there); remove it, e.g. "
            "sed 's/\\xEF\\xBB\\xBF//g' IN > OUT"
        )
    return ""


def _numbered_lines(path: Path) -> Iterator[tuple[int, str]]:
    """The file's lines (gunzipped for ``.gz``) with their 1-based numbers, each decoded as
    UTF-8 on its own, so a bad byte is reported at its line; a byte-order mark opening the
    file is dropped. A file that cannot be opened or decompressed (a directory, not gzip, truncated or corrupt) raises TraceError naming it."""
    gz = path.name.endswith(".gz")
    reached = 0
    try:
        with gzip.open(path, "rb") if gz else open(path, "rb") as fh:
            for reached, raw in enumerate(fh, start=1):
                if reached == 1 and raw.startswith(_BOM):
                    raw = raw[len(_BOM) :]  # as editors on Windows write it
                elif reached == 1 and (why := other_encoding(raw)):
                    raise TraceError(why, where="line 1", path=path)
                yield reached, _decoded(raw, path, reached)
    except (OSError, EOFError, zlib.error) as exc:
        why = exc.strerror if isinstance(exc, OSError) and exc.strerror else str(exc)
        after = f" after line {reached}" if reached else ""
        kind = "gzip file" if gz else "file"
        raise TraceError(f"cannot read the {kind}{after}: {why}", path=path) from None


def _decoded(raw: bytes, path: Path, lineno: int) -> str:
    """One line as text; invalid UTF-8 is a TraceError at that line and byte."""
    try:
        return raw.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise TraceError(
            f"not valid UTF-8 (byte {exc.start + 1} of the line)", where=f"line {lineno}", path=path
        ) from None


def write_jsonl(trace: Trace, path: str | Path) -> None:
    """Write the header then one compact object per row (fields at their defaults omitted)."""
    path = Path(path)
    check_meta(trace.meta, path)  # (a NaN there would write a file no reader takes)
    lines = [json.dumps(header_object(trace.meta, trace.format_version()), separators=(",", ":"))]
    lines += [
        json.dumps(row_to_mapping(row, drop_defaults=True), separators=(",", ":"))
        for row in trace.rows
    ]
    data = ("\n".join(lines) + "\n").encode("utf-8")
    if path.name.endswith(".gz"):
        # mtime=0 and no file name in the gzip header: the same trace always gives the same bytes.
        data = gzip.compress(data, compresslevel=9, mtime=0)
    path.write_bytes(data)


# ---------------------------------------------------------------------------------------------
# Parquet.


def _arrow_schema(meta: Mapping[str, Any], version: int) -> Any:
    import pyarrow as pa

    types = {
        "int64": pa.int64(),
        "Int64": pa.int64(),
        "float64": pa.float64(),
        "bool": pa.bool_(),
        "object": pa.string(),
    }
    return pa.schema(
        [
            pa.field(name, types[DTYPES[name]], nullable=name not in REQUIRED)
            for name in fields_of_version(FIELDS, version)
        ],
        metadata={HEADER_KEY: json.dumps(header_object(meta, version))},
    )


def write_parquet(trace: Trace, path: str | Path) -> None:
    """Write one column per field of the trace's version (``curve`` as JSON text), meta in the
    schema metadata."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    check_meta(trace.meta, path)  # (a NaN there would write a file no reader takes)
    version = trace.format_version()
    schema = _arrow_schema(trace.meta, version)
    columns = schema.names
    flat = [{k: v for k, v in to_flat(row).items() if k in columns} for row in trace.rows]
    table = pa.Table.from_pylist(flat, schema=schema)
    with open(path, "wb") as fh:  # (pyarrow refuses a path with a surrogate escape in it)
        pq.write_table(table, fh)


def read_parquet(path: str | Path) -> Trace:
    """Read a Parquet trace; errors name the row index (0-based) and the field."""
    import pyarrow.parquet as pq

    path = Path(path)
    try:
        with open(path, "rb") as fh:  # (pyarrow refuses a path with a surrogate escape in it)
            table = pq.read_table(fh)
    except Exception as exc:  # pyarrow raises several types for a corrupt file
        raise TraceError(f"cannot read as Parquet: {exc}", path=path) from None
    raw = (table.schema.metadata or {}).get(HEADER_KEY.encode())
    if raw is None:
        raise TraceError(
            f"no {HEADER_KEY!r} key in the Parquet schema metadata (not a Tangram trace)"
            + _written_by_pandas(table.schema.metadata or {}),
            field=HEADER_KEY,
            where="header",
            path=path,
        )
    try:
        header = loads_unique(raw)
    except json.JSONDecodeError as exc:
        raise TraceError(
            f"header is not valid JSON: {exc.msg}", field=HEADER_KEY, where="header", path=path
        ) from None
    except TraceError as exc:  # a repeated key
        raise exc.located(where="header", path=path) from None
    meta = meta_from_header(header, path, "header")
    unknown = [c for c in table.column_names if c not in FIELDS]
    if unknown:
        raise TraceError("unknown column", field=unknown[0], where="columns", path=path)
    check_fields_of_version(table.column_names, header[HEADER_KEY], path, "columns")
    rows = []
    for i, record in enumerate(table.to_pylist()):
        record = {k: v for k, v in record.items() if not (v is None and k not in REQUIRED)}
        try:
            if isinstance(record.get("curve"), str):
                record["curve"] = from_cell("curve", record["curve"])
        except TraceError as exc:
            raise exc.located(where=f"row {i}", path=path) from None
        rows.append(parse_record(record, f"row {i}", path))
    return checked_trace(rows, meta, lambda i: f"row {i}", path)


def _written_by_pandas(metadata: Mapping[bytes, bytes]) -> str:
    """A hint for a file pandas wrote from ``Trace.to_dataframe()`` (``df.to_parquet``): its
    meta sits in pandas' ``PANDAS_ATTRS``, not in a trace header, and the bare "not a Tangram
    trace" left the user no way forward. Empty for any other file."""
    try:
        attrs = json.loads(metadata.get(b"PANDAS_ATTRS", b"{}"))
    except (json.JSONDecodeError, UnicodeDecodeError, RecursionError):
        return ""
    if not isinstance(attrs, Mapping) or HEADER_KEY not in attrs:
        return ""
    return (
        "; it looks like a data frame of Trace.to_dataframe() written by pandas "
        "(df.to_parquet): write it as a trace with "
        "write_trace(Trace.from_dataframe(pandas.read_parquet(path)), path)"
    )


# ---------------------------------------------------------------------------------------------
# Dispatch on suffix.

_READERS: dict[str, Callable[[Path], Trace]] = {
    ".jsonl": read_jsonl,
    ".jsonl.gz": read_jsonl,
    ".parquet": read_parquet,
}
_WRITERS: dict[str, Callable[[Trace, Path], None]] = {
    ".jsonl": write_jsonl,
    ".jsonl.gz": write_jsonl,
    ".parquet": write_parquet,
}


def _suffix(path: Path, known: Iterable[str]) -> str:
    for suffix in sorted(known, key=len, reverse=True):
        if path.name.endswith(suffix):
            return suffix
    raise TraceError(
        f"unknown trace file type {path.name!r}; expected one of {sorted(known)}", path=path
    )


def load_trace(path: str | Path) -> Trace:
    """Load and validate a trace; the format follows the suffix (.jsonl, .jsonl.gz, .parquet)."""
    path = Path(path)
    reader = _READERS[_suffix(path, _READERS)]
    if not path.exists():
        raise TraceError("no such file", path=path)
    return reader(path)


def check_trace_suffix(path: str | Path) -> None:
    """Refuse a path whose suffix names no trace format (TraceError naming it), so that a
    writer can be refused before its work rather than after it."""
    _suffix(Path(path), _WRITERS)


def write_trace(trace: Trace, path: str | Path) -> Path:
    """Write a trace; the format follows the suffix. Returns the path written."""
    path = Path(path)
    _WRITERS[_suffix(path, _WRITERS)](trace, path)
    return path
