"""Choose an aligned GPU cell for a service: resident first, then best fit, then name order.

Resident cells skip the EOE restore. Best fit (the node with the fewest free GPUs that still
has a free cell of the size) keeps whole nodes free for large DoPs, the buddy allocator's rule.
"""

from __future__ import annotations

from tangram.core.state import ClusterState


def place_cell(state: ClusterState, size: int, service: str) -> tuple[str, tuple[int, ...]] | None:
    """The best free aligned cell of ``size`` GPUs for ``service``, or None if there is none."""
    best: tuple[tuple[int, int, int, int], str, tuple[int, ...]] | None = None
    for order, (name, node) in enumerate(state.gpu.items()):
        if size > node.spec.gpus:
            continue
        free = node.free_gpus
        if free < size:
            continue
        for cell in node.free_cells(size):
            key = (0 if node.is_resident(service, cell) else 1, free, order, cell[0])
            if best is None or key < best[0]:
                best = (key, name, cell)
    return None if best is None else (best[1], best[2])
