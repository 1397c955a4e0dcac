"""Resize a cluster: N GPUs in nodes of its GPU node's shape, N CPU nodes of its CPU node's shape.

``tangram sim --gpus N --cpu-nodes N`` uses it to vary a bundled cluster without writing a file.
GPUs come in whole nodes of the cluster's shape (e.g. 8 GPUs); a remainder that is not a whole
node becomes smaller nodes of the same model, one per power of two of the remainder (a node's
GPU count must be 1, 2, 4 or 8 for aligned cells), each with host memory in proportion to its
GPUs: 36 GPUs of 8-GPU nodes are 4 nodes of 8 and one of 4; 7 are nodes of 4, 2 and 1.
Nodes are renamed ``<prefix>0..`` after the first node's name without its trailing digits.
A cluster whose nodes of a kind differ in shape cannot be resized in that kind (an error).
"""

from __future__ import annotations

import dataclasses

from tangram.core.cluster_file import MAX_NODES
from tangram.core.resources import ClusterSpec, SpecError


def _shape(nodes: tuple, kind: str, cluster: str):
    """The one node shape of ``nodes`` (names aside); an error if they differ or are none."""
    if not nodes:
        raise ValueError(f"cluster {cluster!r} has no {kind} node whose shape could be copied")
    shapes = {dataclasses.replace(n, name="_") for n in nodes}
    if len(shapes) > 1:
        raise ValueError(
            f"cluster {cluster!r} has {kind} nodes of {len(shapes)} shapes; "
            f"resizing copies one shape (write a cluster file instead)"
        )
    return nodes[0]


def _prefix(name: str) -> str:
    return name.rstrip("0123456789") or name


def gpu_node_sizes(gpus: int, per_node: int) -> list[int]:
    """GPUs per node for ``gpus`` in total: whole nodes, then the remainder in powers of two."""
    if gpus < 0:
        raise ValueError(f"--gpus must be >= 0, got {gpus}")
    full, rest = divmod(gpus, per_node)
    parts = [per_node] * full
    size = per_node
    while rest:
        size //= 2
        if rest >= size:
            parts.append(size)
            rest -= size
    return parts


def resize(
    cluster: ClusterSpec, *, gpus: int | None = None, cpu_nodes: int | None = None
) -> ClusterSpec:
    """``cluster`` with ``gpus`` GPUs and/or ``cpu_nodes`` CPU nodes (None: unchanged)."""
    changes: dict = {}
    tags = []
    if gpus is not None:
        template = _shape(cluster.gpu_nodes, "GPU", cluster.name) if gpus else None
        most = MAX_NODES * (template.gpus if template else 1)
        if gpus > most:  # (checked before the nodes are built: a huge count ran for hours)
            raise ValueError(f"--gpus must be at most {most} ({MAX_NODES} nodes), got {gpus}")
        nodes = []
        for i, size in enumerate(gpu_node_sizes(gpus, template.gpus if template else 1)):
            share = size / template.gpus
            nodes.append(
                dataclasses.replace(
                    template,
                    name=f"{_prefix(template.name)}{i}",
                    gpus=size,
                    host_memory_gb=template.host_memory_gb * share,
                )
            )
        changes["gpu_nodes"] = tuple(nodes)
        tags.append(f"gpus={gpus}")
    if cpu_nodes is not None:
        if not 0 <= cpu_nodes <= MAX_NODES:
            raise ValueError(f"--cpu-nodes must be from 0 to {MAX_NODES}, got {cpu_nodes}")
        template = _shape(cluster.cpu_nodes, "CPU", cluster.name) if cpu_nodes else None
        changes["cpu_nodes"] = tuple(
            dataclasses.replace(template, name=f"{_prefix(template.name)}{i}")
            for i in range(cpu_nodes)
        )
        tags.append(f"cpu_nodes={cpu_nodes}")
    if not changes:
        return cluster
    try:
        return dataclasses.replace(cluster, name=f"{cluster.name}[{','.join(tags)}]", **changes)
    except SpecError as exc:
        raise ValueError(f"resized cluster: {exc}") from None
