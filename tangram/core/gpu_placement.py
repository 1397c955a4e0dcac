"""Choose an aligned GPU cell for a service: resident first, then least eviction, best fit.

Resident cells skip the EOE restore. Among the others, the cell whose GPUs hold the fewest
other services evicts the least (those services would have to be restored again later). Then
best fit (the node with the fewest free GPUs that still has a free cell of the size) keeps
whole nodes free for large DoPs, the buddy allocator's rule; then node and cell order.
"""

from __future__ import annotations

from tangram.core.cells import holds
from tangram.core.state import ClusterState


def place_cell(
    state: ClusterState, size: int, service: str, size_gb: float = 0.0, replicas: bool = False
) -> tuple[str, tuple[int, ...]] | None:
    """The best free aligned cell of ``size`` GPUs for ``service`` (a model of ``size_gb``,
    which the cell's GPUs must hold: ``cells.holds``), or None if there is none."""
    best: tuple[tuple[int, ...], str, tuple[int, ...]] | None = None
    for order, (name, node) in enumerate(state.gpu.items()):
        if size > node.spec.gpus or not holds(
            size_gb, node.spec.gpu_memory_gb, size, replicas=replicas
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
