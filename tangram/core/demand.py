"""Expected demand per GPU service, and how an operator sizes static replicas from it.

An operator who deploys one static serving group per model sizes each group to the load it
expects: the share of calls the model receives (its popularity) times what a call costs.
``ServiceDemand.gpu_seconds`` is that product summed over the expected calls, in GPU-seconds
at the replica shape the model needs. ``size_replicas`` turns demands and a GPU budget into
replica counts. (The simulator declares demand from the trace it replays: the operator's
knowledge of the workload; ``tangram.sim.demand``.)
"""

from __future__ import annotations

import math
import numbers
from collections.abc import Iterable
from dataclasses import dataclass

from tangram.core.cells import CELL_SIZES


@dataclass(frozen=True)
class ServiceDemand:
    """One service's expected load: GPU-seconds of calls, and the GPUs one replica needs."""

    service: str
    #: GPUs of one replica: the smallest cell the model's memory fits (its tensor-parallel size).
    replica_gpus: int
    #: Expected calls x GPU-seconds per call at ``replica_gpus``.
    gpu_seconds: float
    #: The model's size and whether it runs as whole replicas (``Action``'s fields): a replica
    #: goes only on a node whose GPUs hold it (0: not told, any node).
    size_gb: float = 0.0
    replicas: bool = False
    #: The most host memory one of its calls needs (``Action.memory_gb``): a replica goes
    #: only on a node whose host memory holds it (0: not told, any node).
    host_gb: float = 0.0

    def __post_init__(self) -> None:
        if not isinstance(self.service, str) or not self.service:
            raise ValueError("ServiceDemand.service must be a non-empty name")
        # A replica is one aligned cell: 3 GPUs (or 1.5) passed here and raised out of the
        # policy's pass at the first call, a CapacityError or a TypeError.
        if isinstance(self.replica_gpus, bool) or self.replica_gpus not in CELL_SIZES:
            raise ValueError(
                f"{self.service}: replica_gpus must be a cell size {CELL_SIZES}, "
                f"got {self.replica_gpus!r}"
            )
        for key in ("gpu_seconds", "size_gb", "host_gb"):
            value = getattr(self, key)
            if (
                isinstance(value, bool)
                or not isinstance(value, numbers.Real)
                or not 0 <= value < math.inf
            ):
                raise ValueError(
                    f"{self.service}: {key} must be a finite number >= 0, got {value!r}"
                )


def size_replicas(demands: Iterable[ServiceDemand], total_gpus: int) -> dict[str, int]:
    """Replicas per service, sized to load, within ``total_gpus``.

    Every service first gets one replica (the most loaded first, while GPUs last: a service
    that gets none cannot be served at all); each remaining replica then goes to the service
    whose replicas would otherwise carry the most load per GPU (its GPU-seconds over the GPUs
    it holds), among those whose replica still fits. The GPUs left over are fewer than the
    smallest replica, so the replicas use all ``total_gpus`` whenever the shapes allow it.
    Ties break by name, so the sizing is deterministic.
    """
    ds = sorted(demands, key=lambda d: (-d.gpu_seconds, d.service))
    names = [d.service for d in ds]
    if len(set(names)) != len(names):
        raise ValueError(f"size_replicas: a service is declared twice in {names}")
    by_name = sorted(ds, key=lambda d: d.service)
    replicas = {d.service: 0 for d in ds}
    left = total_gpus
    for d in ds:
        if d.replica_gpus <= left:
            replicas[d.service] = 1
            left -= d.replica_gpus
    while True:
        fits = [d for d in by_name if replicas[d.service] and d.replica_gpus <= left]
        if not fits:
            return replicas
        # max() keeps the first of equals: the name first in sorted order.
        best = max(fits, key=lambda d: d.gpu_seconds / (replicas[d.service] * d.replica_gpus))
        replicas[best.service] += 1
        left -= best.replica_gpus
