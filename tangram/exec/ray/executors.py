"""The runtime's CPU and GPU executors on a Ray cluster: each start goes to the node agent of
the node the core chose (``Start.node``), through ``Fleet.call``.

They are ``multi_node`` executors of ``tangram.exec.runtime``: the runtime lets the core place
containers (the roomiest node, ``Admission.bind``) and cells on any GPU node. Admission is the
single-node adapters' own (``CpuExecutor.admit``, ``GpuExecutor``'s rule for cells). An
action whose node is lost ends with a retryable ``node_lost`` error; EOE's residency after
each GPU call is reported to the core per node.
"""

from __future__ import annotations

import time
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, ClassVar

from tangram.core.cells import copies_on
from tangram.core.decision import Start
from tangram.core.resources import ClusterSpec, CpuNodeSpec, GpuNodeSpec
from tangram.core.scheduler import Scheduler
from tangram.exec.ray.fleet import Fleet, NodeLost, lost_result
from tangram.exec.ray.nodes import ServiceEntry
from tangram.exec.runtime.cpu import CpuExecutor
from tangram.exec.runtime.errors import NodeLostError, UnknownTrajectory
from tangram.exec.runtime.executor import OnDeadline
from tangram.exec.runtime.gpu import GpuExecutor
from tangram.exec.runtime.records import CpuWork, ErrorInfo, GpuWork
from tangram.exec.runtime.result import ExecResult

#: The clock an action's time on an agent is read with (a node lost mid-call: how long it ran).
clock = time.monotonic


@dataclass(frozen=True)
class Handle:
    """A container as the runtime's trajectories see it (``container_id``)."""

    container_id: str | None


def largest_cpu(cluster: ClusterSpec) -> CpuNodeSpec:
    """The node a container's memory is checked against (none larger could hold it)."""
    return max(cluster.cpu_nodes, key=lambda n: (n.memory_gb, n.cores, n.name))


class RayCpuExecutor:
    """CPU work in containers on the agents' nodes; a trajectory's container on its node."""

    work: ClassVar[type] = CpuWork
    on_deadline: ClassVar[OnDeadline] = OnDeadline.AWAIT_KILL
    deadline_note: ClassVar[str] = "; the node's executor did not report the kill"
    cancellable: ClassVar[bool] = False
    multi_node: ClassVar[bool] = True
    #: No resizes: a node agent runs an action in one blocking call and has no way yet to
    #: take a resize to it while it runs, so the runtime's core keeps every grant fixed here.
    resizes: ClassVar[bool] = False

    def __init__(self, fleet: Fleet, cluster: ClusterSpec) -> None:
        self.fleet = fleet
        #: Grants are CFS weights over each node's cores (set once by the runtime, as for
        #: ``CpuExecutor``); each agent's executor applies it to the actions it runs.
        self.weighted = False
        #: The runtime's core (set once the runtime is made): where containers were placed.
        self.scheduler: Scheduler | None = None
        #: The largest node (the runtime checks a container's memory against it).
        self.node = largest_cpu(cluster)
        #: Trajectory -> the node its container is on.
        self.placed: dict[str, str] = {}
        self.containers: dict[str, str | None] = {}

    admit = CpuExecutor.admit

    def add_node(self, cluster: ClusterSpec) -> None:
        """A CPU node joined (``cluster`` has it): containers are checked against the
        largest node, which may be the new one."""
        self.node = largest_cpu(cluster)

    async def open(self, traj: str, memory_gb: float, image: str | None) -> Handle:
        assert self.scheduler is not None
        node = self.scheduler.trajectories[traj].node
        assert node is not None, "the core places a container before it is created"
        self.placed[traj] = node
        try:
            cid = await self.fleet.call(node, "open", traj, memory_gb, image)
        except BaseException as exc:
            if self.placed.get(traj) == node:  # (nothing made: the runtime forgets the id)
                del self.placed[traj]
            if isinstance(exc, NodeLost):  # (retryable: sent again, placed on a node alive)
                raise NodeLostError(
                    f"{exc}: the container was not made there; open it again (another node)"
                ) from exc
            raise
        self.containers[traj] = cid
        self.fleet.opened(node, traj)
        return Handle(cid)

    async def close(self, traj: str) -> None:
        node = self.placed.pop(traj, None)
        self.containers.pop(traj, None)
        if node is not None and self.fleet.alive(node):  # (a lost node's memory, given
            await self.fleet.call(node, "close", traj)  # back, went to its fence in the core)

    async def recreate(self, traj: str) -> Handle:
        try:
            cid = await self.fleet.call(self.placed[traj], "recreate", traj)
        except NodeLost as exc:  # (the trajectory is lost with its node: its loss closes it)
            raise UnknownTrajectory(
                f"trajectory {traj!r} is not open: it was lost with node {exc.node}: "
                f"{exc.why}; open it again (it is placed on another node) and resend its actions"
            ) from exc
        self.containers[traj] = cid
        return Handle(cid)

    def container_of(self, traj: str) -> str | None:
        return self.containers.get(traj)

    async def execute(
        self, work: CpuWork, start: Start, *, trajectory: str, time_left_s: float
    ) -> ExecResult:
        if time_left_s <= 0:
            return ExecResult(
                "timeout", error=ErrorInfo("timeout", "the time-out passed at its start"), ran=False
            )
        t0 = clock()
        try:
            return await self.fleet.call(
                start.node,
                "run_cpu",
                trajectory,
                work.command,
                start.cores,
                time_left_s,
                dict(work.env) if work.env else None,
                work.max_output_bytes,
                self.weighted,
            )
        except NodeLost as err:
            return lost_result(err, clock() - t0)

    def shutdown(self) -> None:
        """Nothing here: the scheduler actor shuts its agents down."""


class RayGpuExecutor:
    """GPU calls on the agents' nodes, on the cell the core granted there."""

    work: ClassVar[type] = GpuWork
    on_deadline: ClassVar[OnDeadline] = OnDeadline.END_NOW
    deadline_note: ClassVar[str] = "; the GPU call runs on and its result is discarded"
    cancellable: ClassVar[bool] = False
    multi_node: ClassVar[bool] = True

    def __init__(
        self,
        fleet: Fleet,
        cluster: ClusterSpec,
        catalog: Mapping[str, ServiceEntry],
    ) -> None:
        self.fleet = fleet
        #: The runtime's core (set once the runtime is made): residency is reported to it.
        self.scheduler: Scheduler | None = None
        self.catalog = dict(catalog)
        #: The node with the most GPUs (cells are planned up to its size).
        self.node: GpuNodeSpec = max(cluster.gpu_nodes, key=lambda n: (n.gpus, n.name))
        #: Each node's residency as its agent last reported it.
        self.residency: dict[str, dict[str, tuple[int, ...]]] = {
            n.name: {} for n in cluster.gpu_nodes
        }
        #: Each node's stamp of that reading (0: none from its agent yet).
        self.stamps: dict[str, int] = {n.name: 0 for n in cluster.gpu_nodes}
        self.eoe = EoeView(self)

    def add_node(self, cluster: ClusterSpec, name: str) -> None:
        """GPU node ``name`` joined (``cluster`` has it): cells are planned up to the largest
        node, and nothing is resident on its new agent yet."""
        self.node = max(cluster.gpu_nodes, key=lambda n: (n.gpus, n.name))
        self.report(name, {})

    def services(self) -> tuple[str, ...]:
        return tuple(self.catalog)

    def size_gb(self, service: str) -> float:
        return self.catalog[service].size_gb

    def replicas(self, service: str) -> bool:
        return self.catalog[service].replicas

    def dops(self, service: str) -> tuple[int, ...]:
        return tuple(self.catalog[service].dops)

    def splits_by_batch(self, service: str) -> bool:
        return self.catalog[service].batch_split

    #: The single-node rule, over the agents' catalog: a registered service on cells from 1
    #: GPU up to its DoPs (``Admission.replicas`` passed on), a layer-sharded one on its k.
    admit = GpuExecutor.admit
    _admit_shards = GpuExecutor._admit_shards

    async def execute(
        self, work: GpuWork, start: Start, *, trajectory: str, time_left_s: float
    ) -> ExecResult:
        if time_left_s <= 0:  # (as the CPU executor's: never sent, never started late)
            return ExecResult(
                "timeout", error=ErrorInfo("timeout", "the time-out passed at its start"), ran=False
            )
        t0 = clock()
        try:
            result, residency, stamp = await self.fleet.call(
                start.node, "call_gpu", work.service, work.inputs, start.gpus, time_left_s
            )
        except NodeLost as err:
            return lost_result(err, clock() - t0)
        self.report(start.node, residency, stamp)
        return result

    def report(
        self, node: str, residency: Mapping[str, tuple[int, ...]], stamp: int | None = None
    ) -> None:
        """Tell the core what changed in ``node``'s residency since its last report.

        ``stamp``: the agent's stamp of the reading; one no later than the last taken in is
        older news (its call's answer came in after a later one's) and is dropped. None: a
        new agent (or none): taken as is, and its agent's stamps count afresh."""
        assert self.scheduler is not None
        if stamp is not None and stamp <= self.stamps.get(node, 0):
            return
        self.stamps[node] = 0 if stamp is None else stamp
        before = self.residency.get(node, {})
        for service, gpus in before.items():
            if residency.get(service) != gpus:
                self.scheduler.report_residency(node, tuple(gpus), service, False)
        for service, gpus in residency.items():
            if before.get(service) != gpus:
                entry = self.catalog.get(service)
                shards = entry.shards if entry is not None else 1
                size_gb = entry.size_gb if entry is not None else None
                for copy in copies_on(gpus, shards, complete=True):
                    self.scheduler.report_residency(node, copy, service, True, size_gb)
        self.residency[node] = dict(residency)

    def shutdown(self) -> None:
        """Nothing here: the scheduler actor shuts its agents down."""


class EoeView:
    """What the runtime's reports read of ``gpu.eoe``, for many nodes: residency keyed
    ``service@node``, and EOE's counters summed over the nodes (refreshed by the actor)."""

    backend = "ray"

    def __init__(self, gpu: RayGpuExecutor) -> None:
        self.gpu = gpu
        self.counters: dict[str, dict[str, Any]] = {}

    def info(self, service: str) -> ServiceEntry:
        """The service as the agents registered it (``GpuExecutor``'s rule reads its shards)."""
        return self.gpu.catalog[service]

    def residency(self) -> dict[str, tuple[int, ...]]:
        return {
            f"{service}@{node}": gpus
            for node, held in sorted(self.gpu.residency.items())
            for service, gpus in sorted(held.items())
        }

    def stats(self) -> Any:
        keys = ("restores", "bytes_restored", "restore_s", "evictions", "evict_s", "calls")
        total = {k: sum(c.get(k, 0) for c in self.counters.values()) for k in keys}
        return _Stats(**total)


@dataclass(frozen=True)
class _Stats:
    restores: int
    bytes_restored: int
    restore_s: float
    evictions: int
    evict_s: float
    calls: int
