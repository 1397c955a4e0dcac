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
names the file, the key path (e.g. ``cpu_node_group[0].cores``) and the problem.
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
    return parse_cluster(data, source)


def _read(name_or_path: str | Path) -> tuple[str, str]:
    path = Path(name_or_path)
    if path.suffix == ".toml" or path.exists():
        if not path.is_file():
            raise ClusterFileError(str(path), "(file)", "no such file")
        return path.read_text(), str(path)
    bundled = resources.files("tangram.clusters") / f"{name_or_path}.toml"
    if not bundled.is_file():
        raise ClusterFileError(
            str(name_or_path),
            "(name)",
            f"not a file and not a bundled cluster; bundled: {bundled_clusters()}",
        )
    return bundled.read_text(), f"<bundled {name_or_path}.toml>"


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
    unknown = sorted(set(data) - _KNOWN_TOP)
    if unknown:
        raise ClusterFileError(
            source, unknown[0], f"unknown key; expected one of {sorted(_KNOWN_TOP)}"
        )
    name = data.get("name", Path(source).stem)
    if not isinstance(name, str):
        raise ClusterFileError(source, "name", f"must be a string, got {name!r}")
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
        if not isinstance(count, int) or count < 1:
            raise ClusterFileError(
                source, f"{where}.count", f"must be a positive integer, got {count!r}"
            )
        if "name" in group:
            raise ClusterFileError(
                source, f"{where}.name", "a group names its nodes with 'prefix', not 'name'"
            )
        start = len(nodes)
        nodes += [
            _build(cls, {**group, "name": f"{prefix}{start + j}"}, source, where)
            for j in range(count)
        ]
    return tuple(nodes)


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
