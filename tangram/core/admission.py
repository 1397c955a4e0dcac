"""Whether and where an action may wait: feasibility and the container memory it reserves.

An action no state of the cluster could ever run is refused at once, with the reason (never
queued forever). A CPU action needs its trajectory's container placed on a node with its memory
reserved; the container is placed when the trajectory opens (or with its first CPU action) on
the given node or the roomiest, and grows when a later action asks for more memory.
"""

from __future__ import annotations

from dataclasses import dataclass

from tangram.core.action import Action
from tangram.core.options import OptionsBuilder
from tangram.core.resources import ClusterSpec, ResourceKind
from tangram.core.state import ClusterState


@dataclass
class TrajectoryState:
    """A trajectory's container binding: its CPU node and the memory reserved there."""

    id: str
    node: str | None = None
    memory_gb: float = 0.0
    #: The memory an open asked for while no node had room (``Scheduler.open_trajectory``):
    #: the container is placed with it later, at the trajectory's first CPU action. Placed
    #: with that action's memory only, a later action needing more was rejected when the node
    #: could not grow the container then, though the open had asked for its largest.
    asked_gb: float = 0.0


class Admission:
    """Feasibility checks, container placement and memory, and the actions waiting for memory."""

    __slots__ = ("cluster", "state", "options", "respects_capacity", "trajectories", "seen")
    __slots__ += ("waiting_for_memory", "fenced", "_max_node_gpus", "_max_gpu_mem", "_max_host_mem")

    def __init__(
        self,
        cluster: ClusterSpec,
        state: ClusterState,
        options: OptionsBuilder,
        *,
        respects_capacity: bool = True,
    ) -> None:
        self.cluster, self.state, self.options = cluster, state, options
        self.respects_capacity = respects_capacity
        self.trajectories: dict[str, TrajectoryState] = {}
        #: Every action id ever admitted (an id may be used once).
        self.seen: set[str] = set()
        #: CPU actions whose new container finds no node with room yet, in arrival order.
        self.waiting_for_memory: dict[str, Action] = {}
        #: Fenced nodes (``Scheduler.fence_node``; node -> holder): no container goes there.
        self.fenced: dict[str, str] = {}
        self._read(cluster)

    def add_node(self, cluster: ClusterSpec) -> None:
        """A node joined (``cluster`` has it, the state too): containers may be placed there
        and calls are checked against the largest GPU node."""
        self._read(cluster)

    def _read(self, cluster: ClusterSpec) -> None:
        """The cluster's nodes as feasibility reads them (the largest GPU node's shape)."""
        self.cluster = cluster
        self._max_node_gpus = max((n.gpus for n in cluster.gpu_nodes), default=0)
        self._max_gpu_mem = max((n.gpu_memory_gb for n in cluster.gpu_nodes), default=0.0)
        self._max_host_mem = max((n.host_memory_gb for n in cluster.gpu_nodes), default=0.0)

    def trajectory(self, trajectory: str) -> TrajectoryState:
        """The trajectory's state, created unbound on first use."""
        traj = self.trajectories.get(trajectory)
        if traj is None:
            traj = self.trajectories[trajectory] = TrajectoryState(trajectory)
        return traj

    def placed_node(self, action: Action) -> str | None:
        """The node of a CPU arrival whose container is placed and large enough, and which
        names no node or that one (nothing to check or reserve: ``infeasible`` and
        ``admit_memory`` could only agree), or None when it needs the full admission."""
        if action.resource is not ResourceKind.CPU:
            return None
        traj = self.trajectories.get(action.trajectory)
        if (
            traj is not None
            and traj.node is not None
            and (action.node is None or action.node == traj.node)
            and action.memory_gb <= traj.memory_gb
            and action.id not in self.seen
            and self.respects_capacity
            and not (self.waiting_for_memory and self.waits(action.trajectory))
        ):
            return traj.node
        return None

    def waits(self, trajectory: str) -> bool:
        """Whether an action of the trajectory waits for its container's memory: a later one
        waits behind it (FCFS within the trajectory), never placing or using the container
        ahead of it."""
        return any(a.trajectory == trajectory for a in self.waiting_for_memory.values())

    def infeasible(self, action: Action) -> str | None:
        """Why no cluster state could ever run this action (None if some state could)."""
        if action.id in self.seen:
            return f"duplicate action id {action.id!r}: every action needs its own id"
        if not self.respects_capacity:
            return None
        kind = action.resource
        if kind is ResourceKind.CPU:
            if not self.cluster.cpu_nodes:
                return "CPU action but the cluster has no CPU node"
            traj = self.trajectories.get(action.trajectory)
            node = action.node or (traj.node if traj else None)
            if action.node and action.node not in self.state.cpu:
                return f"CPU action bound to unknown node {action.node!r}"
            if traj and traj.node and action.node and action.node != traj.node:
                return (
                    f"CPU action names node {action.node!r} but its container is on {traj.node!r}"
                )
            limit = (
                self.state.cpu[node].spec.memory_gb
                if node
                else max(n.memory_gb for n in self.cluster.cpu_nodes)
            )
            if action.memory_gb > limit:
                return f"needs {action.memory_gb} GB of container memory; a node has at most {limit} GB"
        elif kind is ResourceKind.GPU:
            if not self.cluster.gpu_nodes:
                return "GPU action but the cluster has no GPU node"
            if not self.options.gpu_units(action):  # (no node's cell and host memory hold it)
                return self._no_gpu_node(action)
        elif action.service not in self.state.api:
            return f"unknown API endpoint {action.service!r}; known: {sorted(self.state.api)}"
        return None

    def _no_gpu_node(self, action: Action) -> str:
        """Why no GPU node can run the call: no cell holds its model, no node has its host
        memory (checked per node, not reserved per call), or the nodes whose GPUs hold the
        model lack the host memory that another node has."""
        host_gb = self.options.gpu_host_gb(action)
        if not host_gb:
            return (
                f"service {action.service!r} of {action.service_size_gb} GB does not fit any cell: "
                f"at most {self._max_node_gpus} GPUs x {self._max_gpu_mem} GB on one node"
            )
        if action.memory_gb > self._max_host_mem:
            return (
                f"needs {action.memory_gb} GB of host memory; a GPU node has at most "
                f"{self._max_host_mem} GB"
            )
        return (
            f"needs {action.memory_gb} GB of host memory; the GPU nodes whose GPUs hold "
            f"service {action.service!r} of {action.service_size_gb} GB have at most "
            f"{host_gb} GB"
        )

    def bind(self, traj: TrajectoryState, memory_gb: float, node: str | None) -> bool:
        """Reserve the container's memory on a node: the given one, else the roomiest; never
        a fenced one (``Scheduler.fence_node``; its memory is held, yet a container asking
        for none fitted there)."""
        fenced = self.fenced
        if node is None:
            candidates = sorted(
                [n for n in self.state.cpu.values() if n.spec.name not in fenced]
                if fenced
                else self.state.cpu.values(),
                key=lambda n: (-n.memory_free_gb, n.containers, n.spec.name),
            )
            fitting = [n for n in candidates if n.memory_free_gb + 1e-9 >= memory_gb]
            if not fitting:
                return False
            chosen = fitting[0]
        else:
            chosen = self.state.cpu[node]
            if node in fenced or chosen.memory_free_gb + 1e-9 < memory_gb:
                return False
        chosen.take_memory(memory_gb)
        chosen.containers += 1
        traj.node, traj.memory_gb = chosen.spec.name, memory_gb
        return True

    def admit_memory(self, action: Action) -> bool | str:
        """Bind the action's trajectory (or grow its container) so its memory is reserved.

        False: no node has room for a new container now (it waits; it holds nothing, so it
        cannot deadlock anyone). A container that must grow but cannot is an error instead:
        waiting would hold the container's memory while asking for more (hold-and-wait).
        """
        traj = self.trajectories.get(action.trajectory)
        if traj is None:
            traj = self.trajectories[action.trajectory] = TrajectoryState(action.trajectory)
        if traj.node is None:
            return self.bind(traj, self._container_gb(traj, action), action.node)
        extra = action.memory_gb - traj.memory_gb
        if extra > 0:
            node = self.state.cpu[traj.node]
            if node.memory_free_gb + 1e-9 < extra:
                return (
                    f"needs {action.memory_gb} GB but its container on {traj.node} has {traj.memory_gb} GB "
                    f"and the node cannot grow it now; open the trajectory with its largest memory"
                )
            node.take_memory(extra)
            traj.memory_gb = action.memory_gb
        return True

    def _container_gb(self, traj: TrajectoryState, action: Action) -> float:
        """The memory a new container for ``action`` reserves: what its trajectory's open
        asked for when that is more and some node (the action's, if it names one) could ever
        hold it; else the action's own (an ask no node holds would make the action wait
        forever, where it runs now and the larger action is refused as before)."""
        if traj.asked_gb <= action.memory_gb:
            return action.memory_gb
        nodes = (
            [self.state.cpu[action.node]]
            if action.node in self.state.cpu
            else self.state.cpu.values()
        )
        fits = any(n.spec.memory_gb + 1e-9 >= traj.asked_gb for n in nodes)
        return traj.asked_gb if fits else action.memory_gb

    def release(self, trajectory: str) -> str | None:
        """The trajectory ended: forget it and free its container's memory; returns its node."""
        traj = self.trajectories.pop(trajectory, None)
        if traj is None or traj.node is None:
            return None
        node = self.state.cpu[traj.node]
        node.give_memory(traj.memory_gb)
        node.containers -= 1
        return traj.node
