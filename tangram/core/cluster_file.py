"""Load cluster descriptions from TOML files (bundled by name, or a path).

A file looks like::

    name = "paper"
    [[cpu_node_group]]            # N identical nodes named prefix0..prefixN-1
    count = 15
    prefix = "cpu"
    cores = 256
    numa_domains = 8
    memory_gb = 2400
    [[gpu_node_group]]
    count = 5
    gpus = 8
    gpu_memory_gb = 141
    host_memory_gb = 3000
    [[api]]
    name = "search"
    concurrency = 256
    rate_per_s = 100
    [prices]
    cpu_core_hour = 0.04

Single nodes may be written as ``[[cpu_node]]`` / ``[[gpu_node]]`` with a ``name``. Any error
names the file, the key path (e.g. ``cpu_node_group[0].cores``) and the problem. Names (the
cluster's, a node's, an API's, and the names a group's ``prefix`` makes) are non-empty, with no
whitespace around them and no control characters.

Sizes are bounded so that a typo fails at once instead of exhausting memory or running for
hours: at most ``MAX_CORES_PER_NODE`` cores per CPU node and ``MAX_NODES`` nodes of each
kind (CPU, GPU) per cluster, groups included; a GPU node copies at least ``H2D_GBPS_MIN`` GB/s
and has at most ``GPU_MEMORY_GB_MAX`` GB per GPU, an API's ``rate_per_s`` is at least
``RATE_PER_S_MIN`` (``tangram.core.resources``: a restore estimate and the wait for a start
token stay finite).
"""

from __future__ import annotations

import tomllib
from collections.abc import Callable, Mapping
from dataclasses import MISSING, fields
from importlib import resources
from pathlib import Path
from typing import Any

from tangram.core.resources import (
    ApiEndpointSpec,
    ClusterSpec,
    CpuNodeSpec,
    GpuNodeSpec,
    Prices,
    SpecError,
)

#: Cores of one CPU node: far above any server today (a few hundred), far below a typo.
MAX_CORES_PER_NODE = 4096
#: CPU nodes, and GPU nodes, of one cluster file (each kind on its own, groups included).
MAX_NODES = 4096


class ClusterFileError(ValueError):
    """A cluster file that cannot be loaded; names the file, the key and the problem."""

    def __init__(self, source: str, key: str, problem: str) -> None:
        super().__init__(f"{source}: {key}: {problem}")
        self.source, self.key, self.problem = source, key, problem


def bundled_clusters() -> list[str]:
    """Names of the cluster files shipped in ``tangram/clusters``."""
    return sorted(
        p.name[:-5]
        for p in resources.files("tangram.clusters").iterdir()
        if p.name.endswith(".toml")
    )


def load_cluster(name_or_path: str | Path) -> ClusterSpec:
    """Load a bundled cluster by name (``paper``, ``local``...) or a TOML file by path."""
    text, source = _read(name_or_path)
    try:
        data = tomllib.loads(text)
    except tomllib.TOMLDecodeError as exc:
        raise ClusterFileError(source, "(syntax)", str(exc)) from None
    except RecursionError:  # (arrays nested past tomllib's recursion: a traceback)
        raise ClusterFileError(
            source, "(syntax)", "arrays or tables nested too deeply to parse"
        ) from None
    if not data:  # (an empty file, or only comments: say so, not "describes no node")
        raise ClusterFileError(
            source, "(file)", "empty: no cluster description (name, cpu_node, gpu_node, api...)"
        )
    return parse_cluster(data, source)


def _read(name_or_path: str | Path) -> tuple[str, str]:
    """The text of a cluster file and the source its errors name (the path, or the bundled
    name); an empty name is refused as such (``Path("")`` is ``.``: "a directory")."""
    if isinstance(name_or_path, str) and not name_or_path.strip():
        raise ClusterFileError(
            repr(name_or_path),
            "(name)",
            f"empty; give a path or a bundled cluster: {bundled_clusters()}",
        )
    path = Path(name_or_path)
    if path.suffix == ".toml" or path.exists():
        if path.is_dir():  # it exists: "no such file" would send the user looking for it
            raise ClusterFileError(str(path), "(file)", "a directory, not a cluster file")
        if not path.exists():
            raise ClusterFileError(str(path), "(file)", "no such file")
        # A path that exists but is no regular file (a pipe, as ``--cluster <(...)`` gives,
        # or /dev/null) is read as a trace file is: "no such file" named a file that is there.
        return _text(path), str(path)
    bundled = resources.files("tangram.clusters") / f"{name_or_path}.toml"
    if not bundled.is_file():
        raise ClusterFileError(
            str(name_or_path),
            "(name)",
            f"not a file and not a bundled cluster; bundled: {bundled_clusters()}",
        )
    source = f"<bundled {name_or_path}.toml>"
    return _decoded(bundled.read_bytes(), source), source


def _text(path: Path) -> str:
    """The file as UTF-8 text (what TOML requires); a file that cannot be read or decoded is
    a ClusterFileError naming it, not a bare OSError or UnicodeDecodeError."""
    try:
        data = path.read_bytes()
    except OSError as exc:
        raise ClusterFileError(str(path), "(file)", f"cannot read: {exc.strerror}") from None
    return _decoded(data, str(path))


def _decoded(data: bytes, source: str) -> str:
    """UTF-8 whatever the locale (a bundled file read as locale text failed under LANG=C
    with PYTHONUTF8=0 on its first non-ASCII byte, a UnicodeDecodeError traceback); a
    byte-order mark opening the file is dropped, as editors on Windows write it and as trace
    files and calibration records take it (tomllib refused it as "Invalid statement (at line
    1, column 1)", a line that reads right)."""
    if why := other_encoding(data[:4]):  # (it said "not valid UTF-8 (line 1)", no more)
        raise ClusterFileError(source, "(file)", why)
    try:
        return data.decode("utf-8-sig")
    except UnicodeDecodeError as exc:
        line = data.count(b"\n", 0, exc.start) + 1
        raise ClusterFileError(
            source, "(file)", f"not valid UTF-8 (line {line}); TOML files are UTF-8"
        ) from None


#: Byte-order marks of the encodings a file is often saved in by mistake (PowerShell's ``>``
#: and ``Out-File`` write UTF-16): longest first, UTF-32's opening with UTF-16's.
_OTHER_BOMS = (
    (b"\xff\xfe\x00\x00", "UTF-32"),
    (b"\x00\x00\xfe\xff", "UTF-32"),
    (b"\xff\xfe", "UTF-16"),
    (b"\xfe\xff", "UTF-16"),
)


def other_encoding(head: bytes) -> str | None:
    """Why a file that opens with ``head`` is not UTF-8, where its byte-order mark says
    (UTF-16 or UTF-32, with the way to convert it), else None. It was reported as "not
    valid UTF-8" at byte 1, no hint of the encoding the file is in. (Cluster files, trace
    files and calibration records share it; ``tangram.trace.errors`` re-exports it.)"""
    for bom, encoding in _OTHER_BOMS:
        if head.startswith(bom):
            return (
                f"{encoding} text (the file opens with a {encoding} byte-order mark, as "
                f"PowerShell's '>' writes it), not UTF-8; convert it, e.g. "
                f"iconv -f {encoding} -t UTF-8 IN > OUT (or Out-File -Encoding utf8)"
            )
    return None


_KNOWN_TOP = {
    "name",
    "cpu_node",
    "cpu_node_group",
    "gpu_node",
    "gpu_node_group",
    "api",
    "prices",
    "description",
}


def parse_cluster(data: Mapping[str, Any], source: str = "<memory>") -> ClusterSpec:
    """Build a ClusterSpec from parsed TOML, validating every key."""
    if not isinstance(data, Mapping):
        # A trace header's "cluster" is parsed here too: a name or a number there is not a
        # cluster description (a string would otherwise read as unknown keys, one per letter).
        raise ClusterFileError(
            source,
            "(cluster)",
            f"must be a table of cluster keys (name, cpu_node, ...), got {data!r}",
        )
    unknown = sorted(set(data) - _KNOWN_TOP)
    if unknown:
        raise ClusterFileError(
            source, unknown[0], f"unknown key; expected one of {sorted(_KNOWN_TOP)}"
        )
    name = data.get("name", Path(source).stem)
    for key in ("name", "description"):
        if not isinstance(data.get(key, ""), str):
            raise ClusterFileError(source, key, f"must be a string, got {data[key]!r}")
    _check_name(name, source, "name")
    cpu = _nodes(data, source, "cpu", CpuNodeSpec)
    gpu = _nodes(data, source, "gpu", GpuNodeSpec)
    apis = tuple(
        _build(ApiEndpointSpec, entry, source, f"api[{i}]")
        for i, entry in enumerate(_tables(data, "api", source))
    )
    prices = _build(Prices, data.get("prices", {}), source, "prices")
    try:
        return ClusterSpec(name=name, cpu_nodes=cpu, gpu_nodes=gpu, apis=apis, prices=prices)
    except SpecError as exc:
        raise ClusterFileError(source, exc.key, exc.problem) from None


def _tables(data: Mapping[str, Any], key: str, source: str) -> list[Mapping[str, Any]]:
    value = data.get(key, [])
    if not isinstance(value, list) or not all(isinstance(v, dict) for v in value):
        raise ClusterFileError(source, key, f"must be an array of tables ([[{key}]])")
    return value


def _nodes(data: Mapping[str, Any], source: str, kind: str, cls: type) -> tuple:
    nodes = [
        _build(cls, entry, source, f"{kind}_node[{i}]")
        for i, entry in enumerate(_tables(data, f"{kind}_node", source))
    ]
    for i, group in enumerate(_tables(data, f"{kind}_node_group", source)):
        where = f"{kind}_node_group[{i}]"
        group = dict(group)
        count = group.pop("count", None)
        prefix = group.pop("prefix", kind)
        _check_count(count, len(nodes), source, f"{where}.count")
        if not isinstance(prefix, str):
            raise ClusterFileError(source, f"{where}.prefix", f"must be a string, got {prefix!r}")
        _check_name(f"{prefix}0", source, f"{where}.prefix")  # what it makes: prefix + index
        if "name" in group:
            raise ClusterFileError(
                source, f"{where}.name", "a group names its nodes with 'prefix', not 'name'"
            )
        start = len(nodes)
        nodes += [
            _build(cls, {**group, "name": f"{prefix}{start + j}"}, source, where)
            for j in range(count)
        ]
    if len(nodes) > MAX_NODES:
        raise ClusterFileError(
            source, f"{kind}_node", f"{len(nodes)} nodes; at most {MAX_NODES} per cluster"
        )
    return tuple(nodes)


def _check_name(name: str, source: str, key: str) -> None:
    """A name (of the cluster, a node, an API): not empty, no whitespace around it, no control
    characters. Traces and reports find nodes and APIs by name (``obs_node``, an API row's
    ``service``): an empty name can never be called, and ``"gpu0 "`` prints as ``"gpu0"``
    while matching nothing that says ``gpu0``; a second node may even be called that."""
    if not name.strip():
        problem = "must be a non-empty name"
    elif name != name.strip():
        problem = "must not begin or end with whitespace"
    elif not name.isprintable():
        problem = "must not hold control characters"
    else:
        return
    raise ClusterFileError(source, key, f"{problem}, got {name!r}")


def _check_count(count: object, before: int, source: str, key: str) -> None:
    """A group's ``count``: a positive integer (``true`` is not 1) that keeps its kind within
    ``MAX_NODES`` (checked before the nodes are built: a huge count would run for hours)."""
    if not isinstance(count, int) or isinstance(count, bool) or count < 1:
        raise ClusterFileError(source, key, f"must be a positive integer, got {count!r}")
    if before + count > MAX_NODES:
        raise ClusterFileError(
            source,
            key,
            f"must be at most {MAX_NODES - before} ({MAX_NODES} nodes of a kind per cluster), "
            f"got {count}",
        )


def _build(cls: Callable[..., Any], entry: Mapping[str, Any], source: str, where: str) -> Any:
    if not isinstance(entry, Mapping):
        raise ClusterFileError(source, where, "must be a table")
    allowed = {f.name: f for f in fields(cls)}  # type: ignore[arg-type]
    for key, value in entry.items():
        if key not in allowed:
            raise ClusterFileError(
                source, f"{where}.{key}", f"unknown key; expected one of {sorted(allowed)}"
            )
        expected = allowed[key].type
        is_number = isinstance(value, int | float) and not isinstance(value, bool)
        optional_none = value is None and "None" in str(expected)
        if "float" in str(expected) and not (is_number or optional_none):
            raise ClusterFileError(source, f"{where}.{key}", f"must be a number, got {value!r}")
        if str(expected) == "int" and (not isinstance(value, int) or isinstance(value, bool)):
            raise ClusterFileError(source, f"{where}.{key}", f"must be an integer, got {value!r}")
        if str(expected) == "str" and not isinstance(value, str):
            raise ClusterFileError(source, f"{where}.{key}", f"must be a string, got {value!r}")
        if key == "name":
            _check_name(value, source, f"{where}.{key}")
        if key == "cores" and isinstance(value, int) and value > MAX_CORES_PER_NODE:
            raise ClusterFileError(
                source, f"{where}.{key}", f"at most {MAX_CORES_PER_NODE} per node, got {value}"
            )
    missing = [
        f.name
        for f in allowed.values()
        if f.name not in entry and f.default is MISSING and f.default_factory is MISSING
    ]
    if missing:
        raise ClusterFileError(source, f"{where}.{missing[0]}", "is required")
    try:
        return cls(**entry)
    except SpecError as exc:
        raise ClusterFileError(source, f"{where}.{exc.key}", exc.problem) from None
