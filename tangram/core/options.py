"""An action's unit options on its domain: which unit counts it may use and how long each takes.

Built once per action when it is queued (the scheduler reads them on every pass): CPU actions
may use 1..max cores, capped by their node; GPU calls the aligned cell sizes that hold their
model, up to max_units; API calls one slot.
"""

from __future__ import annotations

from typing import NamedTuple

from tangram.core.action import Action
from tangram.core.cells import unit_options_on
from tangram.core.cluster_file import MAX_CORES_PER_NODE
from tangram.core.resources import ClusterSpec, CpuNodeSpec, GpuNodeSpec, ResourceKind
from tangram.core.state import CapacityError


class _OptionFields(NamedTuple):
    units: tuple[int, ...]
    durations: tuple[float, ...]
    convex: bool
    fastest: int
    consecutive: bool


def _options(
    cls: type[Options], units: tuple[int, ...], durations: tuple[float, ...], convex: bool
) -> Options:
    """An ``Options`` with its derived fields (built directly: the scheduler makes one per action)."""
    return tuple.__new__(
        cls,
        (
            units,
            durations,
            convex,
            durations.index(min(durations)),
            units[-1] - units[0] == len(units) - 1,
        ),
    )


class Options(_OptionFields):
    """The unit counts an action may use on its domain, ascending, with their durations.

    Built as ``Options(units, durations, convex)``; ``fastest`` (index of the shortest duration,
    the fewest units among equals, so no unit is wasted) and ``consecutive`` (1-unit steps like
    CPU cores, not cells like GPUs' 1/2/4/8) are derived once, since every pass reads them.
    A NamedTuple: immutable, and cheap to build once per action.
    """

    __slots__ = ()

    def __new__(cls, units: tuple[int, ...], durations: tuple[float, ...], convex: bool) -> Options:
        return _options(cls, units, durations, convex)

    def __getnewargs__(self) -> tuple[tuple[int, ...], tuple[float, ...], bool]:
        """What copy and pickle pass to ``__new__`` (the derived fields are derived again)."""
        return (self.units, self.durations, self.convex)

    def _replace(self, **changes: object) -> Options:
        """A copy with some of units, durations, convex changed; the derived fields follow."""
        derived = {"fastest", "consecutive"} & set(changes)
        if derived:
            raise ValueError(f"Options.{sorted(derived)[0]} is derived, not set")
        fields = {"units": self.units, "durations": self.durations, "convex": self.convex}
        fields.update(changes)
        return Options(**fields)  # type: ignore[arg-type]

    def best_within(self, limit: int) -> int:
        """Index of the largest option not above ``limit`` (-1 when even the smallest exceeds it)."""
        units = self.units
        if self.consecutive:  # units[i] = units[0] + i
            return min(limit - units[0], len(units) - 1) if limit >= units[0] else -1
        idx = -1
        for i, u in enumerate(units):
            if u > limit:
                break
            idx = i
        return idx


def option_index(action: Action, opts: Options, units: int) -> int:
    """Which of the action's options ``units`` is; a policy asking for another is a bug."""
    try:
        return opts.units.index(units)
    except ValueError:
        raise CapacityError(
            f"{action.id}: {units} units is not one of its options {opts.units}"
        ) from None


class OptionsBuilder:
    """Builds each action's ``Options`` on a cluster (the unit ranges shared between actions).

    ``respects_capacity=False`` (the lower bound) caps nothing by a node: an action may use
    every unit it asks for.
    """

    __slots__ = ("respects_capacity", "_node_cores", "_max_node_cores")
    __slots__ += ("_unit_ranges", "_gpu_shapes")

    def __init__(self, cluster: ClusterSpec, *, respects_capacity: bool = True) -> None:
        self.respects_capacity = respects_capacity
        self._node_cores: dict[str | None, int] = {n.name: n.cores for n in cluster.cpu_nodes}
        self._max_node_cores = max((n.cores for n in cluster.cpu_nodes), default=0)
        #: The GPU nodes' distinct (GPUs, GB per GPU, GB of host memory): a cell is one
        #: node's, and runs only the calls whose host memory that node has.
        self._gpu_shapes = tuple(
            sorted({(n.gpus, n.gpu_memory_gb, n.host_memory_gb) for n in cluster.gpu_nodes})
        )
        self._unit_ranges: dict[int, tuple[int, ...]] = {}  # top -> (1, ..., top), shared

    def gpu_units(self, action: Action) -> tuple[int, ...]:
        """The cell sizes a GPU call may use on this cluster (empty: no node whose host memory
        holds the call has a cell that holds its model)."""
        host_gb = action.memory_gb
        return unit_options_on(
            action.service_size_gb,
            [(gpus, mem) for gpus, mem, host in self._gpu_shapes if host_gb <= host],
            action.max_units,
            replicas=action.service_replicas,
        )

    def for_action(self, action: Action, node: str | None) -> Options:
        """Unit options after binding: a CPU action's node caps its cores."""
        kind = action.resource
        if kind is ResourceKind.CPU:
            top = action.max_units
            # A policy that ignores capacity (``lower-bound``) ignores the node's size too, but
            # not the largest node a cluster file may declare: unbounded, a trace's max_units
            # of 10**11 listed every core count up to it (a MemoryError).
            cap = (
                self._node_cores.get(node, self._max_node_cores)
                if self.respects_capacity
                else MAX_CORES_PER_NODE
            )
            if cap < top:
                top = cap
            units = self._unit_ranges.get(top)
            if units is None:
                units = self._unit_ranges[top] = tuple(range(1, top + 1))
        elif kind is ResourceKind.GPU:
            units = self.gpu_units(action) if self.respects_capacity else action.allowed_units(8)
        else:
            units = (1,)
        return _on_units(action, units)

    def gpu_host_gb(self, action: Action) -> float:
        """The most host memory of a GPU node with a cell that holds the call's model (0.0:
        none does), whatever the call's own host memory: to say why ``gpu_units`` is empty."""
        return max(
            (
                host
                for gpus, mem, host in self._gpu_shapes
                if unit_options_on(
                    action.service_size_gb,
                    ((gpus, mem),),
                    action.max_units,
                    replicas=action.service_replicas,
                )
            ),
            default=0.0,
        )

    def add_node(self, node: CpuNodeSpec | GpuNodeSpec) -> None:
        """A node joined: its cores cap its actions; the largest node may be larger now."""
        if isinstance(node, CpuNodeSpec):
            self._node_cores[node.name] = node.cores
            self._max_node_cores = max(self._max_node_cores, node.cores)
        else:
            shape = (node.gpus, node.gpu_memory_gb, node.host_memory_gb)
            self._gpu_shapes = tuple(sorted({*self._gpu_shapes, shape}))

    def widened(self, action: Action, opts: Options) -> Options:
        """A queued GPU call's options after a GPU node joined: the cells it had and those it
        may use now (a node with more GPUs adds wider cells, one with more memory per GPU
        narrower ones); ``opts`` itself when nothing changed."""
        if not self.respects_capacity:
            return opts
        units = tuple(sorted(set(opts.units).union(self.gpu_units(action))))
        return opts if units == opts.units else _on_units(action, units)


def _on_units(action: Action, units: tuple[int, ...]) -> Options:
    """The action's ``Options`` on these unit counts (its curve's durations there)."""
    curve = action.curve
    durations = curve.durations(units)
    convex = curve.always_convex or curve.is_convex_on(units)  # ElasticityCurve.convex_on
    return _options(Options, units, durations, convex)
