"""The trace header: the format version and the free-form meta, checked on read.

JSONL stores the header object as line 1, Parquet as JSON text in the Arrow schema metadata,
a data frame in ``df.attrs``; all under the key ``HEADER_KEY``.
"""

from __future__ import annotations

import math
from collections.abc import Collection, Mapping
from pathlib import Path
from typing import Any

from tangram.trace.errors import TraceError

#: The newest schema version this code reads and writes (the ``tangram_trace`` header key).
#: It reads every version from 1; it writes the lowest version that holds a trace's rows, so a
#: trace that uses no newer field stays readable by older readers.
TRACE_VERSION = 3

#: Fields added after version 1, with the version that added them (a reader of an older
#: version refuses them as unknown fields).
FIELD_SINCE: dict[str, int] = {"sync": 2, "malleable": 3, "service_replicas": 3}

#: Key of the header object (JSONL), of the Arrow schema metadata (Parquet) and of ``df.attrs``.
HEADER_KEY = "tangram_trace"


def meta_from_header(header: Any, path: str | Path, where: str) -> dict[str, Any]:
    """The meta of a header read at ``where`` in ``path``; refuses a missing or newer version."""
    if not isinstance(header, Mapping) or HEADER_KEY not in header:
        keys = sorted(header)[:6] if isinstance(header, Mapping) else type(header).__name__
        raise TraceError(
            f"not a Tangram trace header: expected an object with key {HEADER_KEY!r} "
            f"(got {keys}); the first line of a v1 JSONL trace is "
            f'{{"{HEADER_KEY}": {TRACE_VERSION}, ...}}',
            field=HEADER_KEY,
            where=where,
            path=path,
        )
    version = header[HEADER_KEY]
    if isinstance(version, bool) or not isinstance(version, int):
        raise TraceError(
            f"version must be an integer, got {version!r}", field=HEADER_KEY, where=where, path=path
        )
    if version > TRACE_VERSION:
        raise TraceError(
            f"trace format version {version} is newer than this Tangram reads "
            f"(version {TRACE_VERSION}); upgrade Tangram or re-export the trace as version "
            f"{TRACE_VERSION}",
            field=HEADER_KEY,
            where=where,
            path=path,
        )
    if version < 1:
        raise TraceError(
            f"unknown trace format version {version} (known: 1..{TRACE_VERSION})",
            field=HEADER_KEY,
            where=where,
            path=path,
        )
    meta = {k: v for k, v in header.items() if k != HEADER_KEY}
    check_meta(meta, path, where)
    return meta


#: Deepest nesting of the header's meta (the service's JSON bodies have the same bound): far
#: past any real meta (a cluster is 3 levels), far below where walking it, writing it or
#: printing it (``--json``) would exhaust Python's recursion.
META_DEPTH_MAX = 64


def check_meta(meta: Mapping[str, Any], path: str | Path | None, where: str = "header") -> None:
    """Refuse a number in the meta that is not finite (``NaN``, ``Infinity``: not JSON, though
    Python's json reads and writes them), naming its key path (``params.sigma``): it was
    carried silently, and ``tangram sim --json`` printed it as null. Refuse a meta nested
    deeper than ``META_DEPTH_MAX``, naming the key path where it passes the bound."""
    stack: list[tuple[str, Any, int]] = [("", meta, 0)]
    while stack:
        key, value, depth = stack.pop()
        if isinstance(value, float) and not math.isfinite(value):
            raise TraceError(
                f"must be a finite number, got {value!r}", field=key, where=where, path=path
            )
        if isinstance(value, Mapping):
            items: list[tuple[str, Any]] = [
                (f"{key}.{k}" if key else str(k), v) for k, v in value.items()
            ]
        elif isinstance(value, list | tuple):
            items = [(f"{key}[{i}]", v) for i, v in enumerate(value)]
        else:
            continue
        if depth >= META_DEPTH_MAX and items:
            raise TraceError(
                f"nested more than {META_DEPTH_MAX} levels deep", field=key, where=where, path=path
            )
        stack += [(k, v, depth + 1) for k, v in reversed(items)]


def header_object(meta: Mapping[str, Any], version: int = 1) -> dict[str, Any]:
    """The header a writer stores: the version first, then the meta."""
    return {HEADER_KEY: version, **meta}


def fields_of_version(fields: tuple[str, ...], version: int) -> tuple[str, ...]:
    """The fields a file of ``version`` may carry (columns of a Parquet file of it)."""
    return tuple(f for f in fields if FIELD_SINCE.get(f, 1) <= version)


def check_fields_of_version(
    used: Collection[str], version: int, path: str | Path, where: str
) -> None:
    """Refuse a field newer than the file's declared version (``used``: a row's keys or a
    file's columns; only the few newer fields are looked up, once per row)."""
    for name, since in FIELD_SINCE.items():
        if since > version and name in used:
            raise TraceError(
                f"field added in format version {since}, but the file declares version {version}",
                field=name,
                where=where,
                path=path,
            )
