"""Choose an aligned GPU cell for a service: resident first, then least eviction, best fit.

Resident cells skip the EOE restore. Among the others, the cell whose GPUs hold the fewest
other services evicts the least (those services would have to be restored again later). Then
best fit (the node with the fewest free GPUs that still has a free cell of the size) keeps
whole nodes free for large DoPs, the buddy allocator's rule; then node and cell order.
"""

from __future__ import annotations

from tangram.core.action import Action
from tangram.core.cells import holds
from tangram.core.resources import GpuNodeSpec
from tangram.core.state import ClusterState


def host_holds(host_gb: float, spec: GpuNodeSpec) -> bool:
    """Whether the GPU node's host memory holds a call's ``memory_gb``. Not reserved per call
    (``Action``): the node's whole host memory is the bound, so a call needing more than a
    node has never runs there (it was checked against the largest node only, and started on
    a smaller one)."""
    return host_gb <= spec.host_memory_gb


def runs_on(action: Action, spec: GpuNodeSpec, size: int) -> bool:
    """Whether a cell of ``size`` GPUs on the node ``spec`` can run the GPU call: the node has
    that many GPUs, they hold its model (``cells.holds``) and its host memory holds the call
    (``host_holds``)."""
    return (
        size <= spec.gpus
        and holds(
            action.service_size_gb, spec.gpu_memory_gb, size, replicas=action.service_replicas
        )
        and host_holds(action.memory_gb, spec)
    )


def place_cell(
    state: ClusterState,
    size: int,
    service: str,
    size_gb: float = 0.0,
    replicas: bool = False,
    host_gb: float = 0.0,
) -> tuple[str, tuple[int, ...]] | None:
    """The best free aligned cell of ``size`` GPUs for ``service`` (a model of ``size_gb``,
    which the cell's GPUs must hold: ``cells.holds``; calls needing ``host_gb`` of host
    memory, which the node must have: ``host_holds``), or None if there is none."""
    best: tuple[tuple[int, ...], str, tuple[int, ...]] | None = None
    for order, (name, node) in enumerate(state.gpu.items()):
        if (
            size > node.spec.gpus
            or not holds(size_gb, node.spec.gpu_memory_gb, size, replicas=replicas)
            or not host_holds(host_gb, node.spec)
        ):
            continue
        free = node.free_gpus
        if free < size:
            continue
        for cell in node.free_cells(size):
            resident = node.is_resident(service, cell)
            others = (
                0 if resident else len(set().union(*(node.resident[g] for g in cell)) - {service})
            )
            key = (0 if resident else 1, others, free, order, cell[0])
            if best is None or key < best[0]:
                best = (key, name, cell)
    return None if best is None else (best[1], best[2])
