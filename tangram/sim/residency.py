"""Which services are resident on which GPUs, with least-recently-used eviction.

The simulator's stand-in for EOE's memory: a layer-sharded service restored to a cell occupies
``size / cell size`` GB on each of its GPUs, a copy that serves that cell only; a service of
whole replicas (``Action.service_replicas``) occupies ``size`` on each GPU, one copy per GPU.
Copies stay after use; when a restore needs room, the least recently used services on those
GPUs are evicted. The scheduler is told of every change (``report_residency``, a copy at a
time) so the ``tangram`` policy can prefer resident cells.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Callable

from tangram.core.cells import copy_serves


class ResidencyModel:
    def __init__(
        self,
        gpu_memory_gb: dict[str, float],
        report: Callable[[str, tuple[int, ...], str, bool, float | None], None],
    ) -> None:
        self.capacity = gpu_memory_gb
        self.report = report
        #: (node, gpu) -> service -> (GB on this GPU, the cell it was restored as); LRU order.
        self.resident: dict[tuple[str, int], OrderedDict[str, tuple[float, tuple[int, ...]]]] = {}

    def touch(self, node: str, cell: tuple[int, ...], service: str) -> None:
        """A call used the service on this cell: most recently used now."""
        for g in cell:
            slot = self.resident.get((node, g))
            if slot is not None and service in slot:
                slot.move_to_end(service)

    def holds(self, node: str, cell: tuple[int, ...], service: str) -> bool:
        """Whether a call on ``cell`` finds ``service`` there: each GPU holds a copy that
        serves it (``cells.copy_serves``, the core's rule, on what is here)."""
        for g in cell:
            slot = self.resident.get((node, g))
            if slot is None or service not in slot:
                return False
            if not copy_serves(slot[service][1], cell):
                return False
        return True

    def restore(
        self,
        node: str,
        cell: tuple[int, ...],
        service: str,
        size_gb: float,
        replicas: bool = False,
    ) -> int:
        """Make ``service`` resident on ``cell`` (a whole replica on each GPU, or one copy
        sharded over the cell), evicting LRU services; returns evictions done."""
        copies = tuple((g,) for g in cell) if replicas else (cell,)
        per_gpu = size_gb if replicas else size_gb / len(cell)
        evicted = 0
        for copy in copies:
            for g in copy:
                slot = self.resident.setdefault((node, g), OrderedDict())
                if service in slot:  # resident as part of another cell shape: drop that copy
                    self._evict(node, g, service)
                used = sum(gb for gb, _ in slot.values())
                while slot and used + per_gpu > self.capacity[node] + 1e-9:
                    victim = next(iter(slot))
                    used -= slot[victim][0]
                    self._evict(node, g, victim)
                    evicted += 1
                slot[service] = (per_gpu, copy)
            self.report(node, copy, service, True, size_gb)
        return evicted

    def _evict(self, node: str, gpu: int, service: str) -> None:
        _, cell = self.resident[(node, gpu)][service]
        # A service restored as a cell is evicted from the whole cell (its shards go together).
        for g in cell:
            self.resident.get((node, g), OrderedDict()).pop(service, None)
        self.report(node, cell, service, False, None)

    def used_gb(self, node: str, gpu: int) -> float:
        return sum(gb for gb, _ in self.resident.get((node, gpu), {}).values())
