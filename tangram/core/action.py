"""Actions: the unit Tangram schedules (one tool call, test run, reward or teacher call)."""

from __future__ import annotations

import math
import numbers
from dataclasses import dataclass, field

from tangram.core.cells import CELL_SIZES
from tangram.core.curves import ElasticityCurve, Inelastic
from tangram.core.resources import ResourceKind


class ActionError(ValueError):
    """An action record that cannot be scheduled as written; the message names the field."""


def _finite_at_least_zero(value: object) -> bool:
    """A real number, finite and >= 0, not a bool (True is no amount of memory)."""
    return (
        isinstance(value, numbers.Real)
        and not isinstance(value, bool)
        and math.isfinite(value)
        and value >= 0
    )


@dataclass(frozen=True)
class Action:
    """An immutable request for external resources.

    ``resource`` is the key elastic resource; ``max_units`` the most units it can use (CPU: cores;
    GPU: GPUs, rounded to aligned cells of 1/2/4/8; API: always one call). ``memory_gb`` is the
    inelastic memory a CPU container needs (reserved for the trajectory's life, as AOE keeps the
    container) or host memory for GPU actions (not reserved per call: the call runs only on a
    GPU node whose host memory holds it, and one no node can run is rejected). ``service``
    names the GPU model or API endpoint. ``node`` is the CPU container's node when the driver
    already placed it; otherwise the core binds the trajectory to a node on its first CPU
    action.
    """

    id: str
    trajectory: str
    resource: ResourceKind
    curve: ElasticityCurve
    arrival: float = 0.0
    max_units: int = 1
    task: str = "default"
    kind: str = "tool"
    memory_gb: float = 0.0
    service: str | None = None
    service_size_gb: float = 0.0
    node: str | None = None
    #: The GPU service runs as whole data-parallel replicas, one per GPU of its cell (each GPU
    #: holds and restores all ``service_size_gb``); False: split in k shards of size/k, as EOE's
    #: layer-sharded services and the simulator's model are.
    service_replicas: bool = False
    #: A CPU program whose parallelism follows the cores it is given while it runs (a
    #: work-stealing pool sized ``max_units``, ``make -j max_units`` under a cpuset): the core
    #: may grow and shrink its grant, up to ``max_units``. False: its thread count is fixed at
    #: its start DoP (it reads ``nproc``), so it keeps that DoP (docs/core.md, "Malleable grants").
    malleable: bool = False
    #: Free-form label the driver uses to find the work (a command, a payload key); never read by the core.
    payload: str | None = field(default=None, compare=False)

    def __post_init__(self) -> None:
        if not isinstance(self.id, str) or not self.id:
            raise ActionError(f"action id must be a non-empty string, got {self.id!r}")
        where = f"action {self.id!r}"
        if not isinstance(self.trajectory, str) or not self.trajectory:
            raise ActionError(f"{where}: trajectory must be a non-empty string")
        try:
            object.__setattr__(self, "resource", ResourceKind(self.resource))
        except ValueError:
            raise ActionError(
                f"{where}: resource must be one of {[k.value for k in ResourceKind]}, got {self.resource!r}"
            ) from None
        if not isinstance(self.curve, ElasticityCurve):
            raise ActionError(
                f"{where}: curve must be an ElasticityCurve, got {type(self.curve).__name__}"
            )
        if not _finite_at_least_zero(self.arrival):
            raise ActionError(f"{where}: arrival must be a finite time >= 0, got {self.arrival!r}")
        if (
            not isinstance(self.max_units, int)
            or isinstance(self.max_units, bool)
            or self.max_units < 1
        ):
            raise ActionError(f"{where}: max_units must be an integer >= 1, got {self.max_units!r}")
        for key in ("memory_gb", "service_size_gb"):
            value = getattr(self, key)
            if not _finite_at_least_zero(value):
                raise ActionError(f"{where}: {key} must be a finite number >= 0, got {value!r}")
        for key in ("task", "kind"):
            if not isinstance(getattr(self, key), str):
                raise ActionError(f"{where}: {key} must be a string, got {getattr(self, key)!r}")
        # Names the core keys its queues and nodes by: a list there raised 'unhashable' out
        # of the queueing, the action half queued.
        for key in ("service", "node"):
            value = getattr(self, key)
            if value is not None and (not isinstance(value, str) or not value):
                raise ActionError(f"{where}: {key} must be a non-empty name or None, got {value!r}")
        if self.resource in (ResourceKind.GPU, ResourceKind.API) and not self.service:
            raise ActionError(f"{where}: a {self.resource.value} action must name its service")
        if self.resource is ResourceKind.API and self.max_units != 1:
            raise ActionError(f"{where}: an API action takes exactly one call slot (max_units=1)")
        if self.malleable and self.resource is not ResourceKind.CPU:
            raise ActionError(f"{where}: only a cpu action can be malleable (its cores resized)")
        if self.resource is ResourceKind.API and not isinstance(self.curve, Inelastic):
            raise ActionError(f"{where}: an API action is inelastic; give it an Inelastic curve")

    @classmethod
    def prevalidated(
        cls,
        id: str,
        trajectory: str,
        resource: ResourceKind,
        curve: ElasticityCurve,
        arrival: float,
        max_units: int,
        task: str,
        kind: str,
        memory_gb: float,
        service: str | None,
        service_size_gb: float,
        malleable: bool = False,
        service_replicas: bool = False,
    ) -> Action:
        """An action from fields a validating record already checked (a ``TraceRow``).

        Skips ``__post_init__``: the simulator builds one action per replayed row, whose
        constructor enforced the same rules, and checking twice was a tenth of its time.
        """
        action = object.__new__(cls)
        object.__setattr__(
            action,
            "__dict__",
            {
                "id": id,
                "trajectory": trajectory,
                "resource": resource,
                "curve": curve,
                "arrival": arrival,
                "max_units": max_units,
                "task": task,
                "kind": kind,
                "memory_gb": memory_gb,
                "service": service,
                "service_size_gb": service_size_gb,
                "node": None,
                "service_replicas": service_replicas,
                "malleable": malleable,
                "payload": None,
            },
        )
        return action

    def allowed_units(self, cap: int | None = None) -> tuple[int, ...]:
        """Unit counts this action may run with, ascending, at most ``cap`` (a node's size)."""
        top = self.max_units if cap is None else min(self.max_units, cap)
        if self.resource is ResourceKind.GPU:
            return tuple(k for k in CELL_SIZES if k <= top)
        if self.resource is ResourceKind.API:
            return (1,)
        return tuple(range(1, top + 1))

    def duration(self, units: int) -> float:
        """Execution time on ``units`` units, from the elasticity curve."""
        return self.curve.duration(units)
