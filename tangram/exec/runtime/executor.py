"""The one executor interface: what the runtime asks of the CPU, GPU and API adapters.

Each adapter runs one kind of work (``CpuWork``, ``GpuWork``, ``ApiWork``). The runtime finds
it in a registry keyed by that kind (``executors_by_work``, ``executor_for``) and asks it:

- ``admit``: turn a submission into the core action's resource fields, or refuse it
  (``BadRequest``, ``UnknownTrajectory``, ``ExecutorMissing``) before anything is accepted;
- ``execute``: run a started action on the units the core granted; an ``ExecResult``;
- ``on_deadline`` / ``deadline_note``: what a deadline does to a running action;
- ``cancellable``: whether a running action can be cancelled by its client;
- ``shutdown``: stop (blocking: the runtime calls it on a worker thread).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from enum import Enum
from typing import Any, ClassVar, Protocol

from tangram.core.decision import Start
from tangram.core.resources import ClusterSpec, ResourceKind
from tangram.exec.runtime.errors import ExecutorMissing
from tangram.exec.runtime.records import ActionSpec, ApiWork, CpuWork, GpuWork
from tangram.exec.runtime.result import ExecResult
from tangram.exec.runtime.trajectories import Trajectory


class OnDeadline(Enum):
    """What the runtime does when a running action reaches its deadline."""

    #: Cancel the executor's task; the action ends as it unwinds (API calls).
    CANCEL = "cancel"
    #: End the action now; the executor runs on and its result is discarded (EOE calls,
    #: which are never interrupted: the cell stays held until the call returns).
    END_NOW = "end_now"
    #: The executor kills the action at the deadline itself (AOE); the runtime ends it only
    #: if that has not been reported within ``RuntimeConfig.timeout_grace_s``.
    AWAIT_KILL = "await_kill"


@dataclass(frozen=True)
class Admission:
    """A submission as its executor admits it: the fields of the core's ``Action``."""

    resource: ResourceKind
    #: The most units the core may grant (capped to what the executor can run).
    max_units: int
    #: The model's size (GPU work), for the core's restore estimate and cell choice.
    size_gb: float = 0.0
    #: GPU work: the service runs as whole data-parallel replicas (``Action.service_replicas``).
    replicas: bool = False
    #: The trajectory container's memory (CPU work), for the trace.
    memory_gb: float = 0.0
    #: The node it must run on (CPU work: its container's), None when any will do.
    node: str | None = None


class Executor(Protocol):
    """An adapter that carries out one kind of work for the runtime."""

    #: The kind of work it runs (its key in the registry).
    work: ClassVar[type]
    on_deadline: ClassVar[OnDeadline]
    #: What the time-out message of a running action adds (what happened to the work).
    deadline_note: ClassVar[str]
    #: A running action can be cancelled by its client.
    cancellable: ClassVar[bool]

    def admit(
        self, spec: ActionSpec, trajectory: Trajectory | None, cluster: ClusterSpec
    ) -> Admission:
        """The core action's resource fields for ``spec``, or the error refusing it."""
        ...

    async def execute(
        self, work: Any, start: Start, *, trajectory: str, time_left_s: float
    ) -> ExecResult:
        """Run a started action on ``start``'s units until it ends (``time_left_s`` to its
        deadline); failures of the work are results or errors in the ``ExecResult``."""
        ...

    def shutdown(self) -> None:
        """Release threads, containers and devices (blocking)."""
        ...


#: Why a kind of work cannot run when its executor is missing.
MISSING: dict[type, str] = {
    CpuWork: "this runtime has no CPU executor (started without Docker): CPU work cannot run",
    GpuWork: "this runtime has no GPU executor: GPU work cannot run",
    ApiWork: "this runtime has no API executor: API work cannot run",
}


def executors_by_work(*executors: Executor | None) -> dict[type, Executor]:
    """The registry: each given executor under the kind of work it runs (None: left out)."""
    registry: dict[type, Executor] = {}
    for executor in executors:
        if executor is None:
            continue
        if executor.work in registry:
            raise ValueError(f"two executors for {executor.work.__name__}")
        registry[executor.work] = executor
    return registry


def executor_for(registry: Mapping[type, Executor], work: object) -> Executor:
    """The executor of ``work``'s kind, or ``ExecutorMissing`` saying why it cannot run."""
    executor = registry.get(type(work))
    if executor is None:
        raise ExecutorMissing(MISSING.get(type(work), f"no executor for {type(work).__name__}"))
    return executor
