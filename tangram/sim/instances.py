"""Instances: a trace that carries its own cluster, and writing one out as trace + cluster files.

A generated instance (the ``random`` workload) puts its cluster in the trace's meta under
``cluster``, in the cluster-file layout (``tangram.core.cluster_file``), so the trace alone
says where it runs; ``tangram sim`` uses it when no ``--cluster`` is given. The cluster is also
written as a TOML file beside the trace, so ``tangram sim --trace T --cluster C`` replays it.
"""

from __future__ import annotations

import dataclasses
from pathlib import Path
from typing import Any

from tangram.core.cluster_file import parse_cluster
from tangram.core.resources import ClusterSpec
from tangram.trace import Trace, write_trace

#: The trace meta key that holds a cluster (a dict in the cluster-file layout).
CLUSTER_KEY = "cluster"


def trace_cluster(trace: Trace, path: str | Path | None = None) -> ClusterSpec | None:
    """The cluster the trace's meta carries, or None when it carries none; ``path``: the
    trace's file, named in the error of a malformed one (a bare "trace meta 'cluster'" left
    the user to guess which file)."""
    data = trace.meta.get(CLUSTER_KEY)
    if data is None:
        return None
    where = f"trace meta '{CLUSTER_KEY}'" if path is None else f"{path}: header '{CLUSTER_KEY}'"
    return parse_cluster(data, source=where)


def cluster_data(cluster: ClusterSpec) -> dict[str, Any]:
    """The cluster in the cluster-file layout (one table per node, None fields left out)."""

    def table(spec: Any) -> dict[str, Any]:
        return {k: v for k, v in dataclasses.asdict(spec).items() if v is not None}

    out: dict[str, Any] = {"name": cluster.name}
    for key, nodes in (
        ("cpu_node", cluster.cpu_nodes),
        ("gpu_node", cluster.gpu_nodes),
        ("api", cluster.apis),
    ):
        if nodes:
            out[key] = [table(n) for n in nodes]
    out["prices"] = table(cluster.prices)
    return out


def _toml_value(value: Any) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, int | float):
        return repr(value)
    if isinstance(value, str):
        return '"' + value.replace("\\", "\\\\").replace('"', '\\"') + '"'
    raise TypeError(f"cannot write {value!r} to a cluster file")


def cluster_toml(cluster: ClusterSpec) -> str:
    """The cluster as a cluster file's TOML text (``load_cluster`` reads it back equal)."""
    data = cluster_data(cluster)
    lines = [f"name = {_toml_value(data.pop('name'))}"]
    prices = data.pop("prices")
    for key, tables in data.items():
        for t in tables:
            lines += ["", f"[[{key}]]"] + [f"{k} = {_toml_value(v)}" for k, v in t.items()]
    lines += ["", "[prices]"] + [f"{k} = {_toml_value(v)}" for k, v in prices.items()]
    return "\n".join(lines) + "\n"


def write_instance(trace: Trace, cluster: ClusterSpec, directory: Path, name: str) -> dict:
    """Write ``name.jsonl`` and ``name.toml`` under ``directory``; returns both paths."""
    directory.mkdir(parents=True, exist_ok=True)
    trace_path, cluster_path = directory / f"{name}.jsonl", directory / f"{name}.toml"
    write_trace(trace, trace_path)
    cluster_path.write_text(cluster_toml(cluster), encoding="utf-8")  # (TOML is UTF-8)
    return {"trace": str(trace_path), "cluster": str(cluster_path)}
