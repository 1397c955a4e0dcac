"""Mutable cluster state owned by the scheduler: free cores, GPU cells, API quotas, residency.

Every change goes through ``take_*`` / ``give_*`` methods that check capacity, so a policy bug
surfaces as a ``CapacityError`` at the decision that caused it instead of silent over-commit.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from numbers import Integral, Real

from tangram.core.cells import cell_problem, copy_serves, free_cells
from tangram.core.numa import numa_picks
from tangram.core.resources import ApiEndpointSpec, ClusterSpec, CpuNodeSpec, GpuNodeSpec


class CapacityError(RuntimeError):
    """A decision asked for capacity that is not free (a policy bug, never user input)."""


class Usage:
    """Units held across the cluster, kept up to date by every take/give.

    Shared by all node states of one ``ClusterState``, so a driver can sample utilisation after
    every event in O(1) instead of summing over nodes.
    """

    __slots__ = ("cores", "gpus", "api_calls")

    def __init__(self) -> None:
        self.cores = 0
        self.gpus = 0
        self.api_calls = 0


@dataclass
class CpuNodeState:
    """Free cores per NUMA domain, free memory, and per-trajectory static slots (k8s-static).

    Each NUMA domain's free cores are a sorted list: the lowest free cores are a slice, a grant
    deletes it and a return merges back (one sort of two runs), cheaper than sets on the
    replay's hot path. Checked takes and returns (``take_cores``, ``give_cores``) refuse any
    core not free, returned twice or repeated, and change nothing when they refuse.
    """

    spec: CpuNodeSpec
    free_by_numa: list[list[int]] = field(init=False)
    memory_free_gb: float = field(init=False)
    free_cores: int = field(init=False)
    containers: int = 0
    usage: Usage = field(default_factory=Usage, repr=False, compare=False)

    def __post_init__(self) -> None:
        self._per_numa = per = self.spec.cores // self.spec.numa_domains
        self.free_by_numa = [
            list(range(d * per, (d + 1) * per)) for d in range(self.spec.numa_domains)
        ]
        self.memory_free_gb = self.spec.memory_gb
        self.free_cores = self.spec.cores

    def choose_cores(self, n: int) -> tuple[int, ...]:
        """Pick n free cores NUMA-locally, without taking them.

        The rule is ``tangram.core.numa.numa_picks`` (one domain by best fit, else the fewest
        domains); within a domain, its lowest free cores.
        """
        free_by_numa = self._check_free(n)
        return tuple([c for d, k in numa_picks(free_by_numa, n) for c in free_by_numa[d][:k]])

    def _check_free(self, n: int) -> list[list[int]]:
        if n > self.free_cores:
            raise CapacityError(f"{self.spec.name}: {n} cores asked, {self.free_cores} free")
        return self.free_by_numa

    def grant_cores(self, n: int) -> tuple[int, ...]:
        """``choose_cores`` and take them: chosen from the free lists, they need no re-check."""
        if n > self.free_cores:
            raise CapacityError(f"{self.spec.name}: {n} cores asked, {self.free_cores} free")
        free_by_numa = self.free_by_numa
        picks = numa_picks(free_by_numa, n)
        self.free_cores -= n
        self.usage.cores += n
        if len(picks) == 1:
            d, k = picks[0]
            domain = free_by_numa[d]
            cores = tuple(domain[:k])
            del domain[:k]
            return cores
        chosen: list[int] = []
        for d, k in picks:
            domain = free_by_numa[d]
            chosen += domain[:k]
            del domain[:k]
        return tuple(chosen)

    def take_cores(self, cores: tuple[int, ...]) -> None:
        """Take these cores (a policy's choice or a static reservation), checking each is free."""
        if len(set(cores)) != len(cores):
            raise CapacityError(f"{self.spec.name}: cores {cores} repeat")
        self._check_exist(cores)
        per = self._per_numa
        by_domain: dict[int, set[int]] = {}
        for c in cores:
            by_domain.setdefault(c // per, set()).add(c)
        for d, wanted in by_domain.items():
            missing = wanted.difference(self.free_by_numa[d])
            if missing:
                raise CapacityError(f"{self.spec.name}: cores {sorted(missing)} are not free")
        for d, wanted in by_domain.items():
            domain = self.free_by_numa[d]
            if domain[: len(wanted)] == sorted(wanted):  # the lowest ones: choose_cores' pick
                del domain[: len(wanted)]
            else:
                domain[:] = [c for c in domain if c not in wanted]
        self.free_cores -= len(cores)
        self.usage.cores += len(cores)

    def _check_exist(self, cores: tuple[int, ...]) -> None:
        for c in cores:
            if not 0 <= c < self.spec.cores:
                raise CapacityError(f"{self.spec.name}: core {c} does not exist")

    def grow_cores(self, held: tuple[int, ...], n: int) -> tuple[int, ...]:
        """Take ``n`` more free cores for an action holding ``held``: from its own NUMA domains
        first (most free first), then the others; returns only the new cores."""
        if n > self.free_cores:
            raise CapacityError(f"{self.spec.name}: {n} cores asked, {self.free_cores} free")
        per = self._per_numa
        own = {c // per for c in held}
        order = sorted(
            range(len(self.free_by_numa)),
            key=lambda d: (d not in own, -len(self.free_by_numa[d]), d),
        )
        chosen: list[int] = []
        for d in order:
            if len(chosen) == n:
                break
            domain = self.free_by_numa[d]
            k = min(n - len(chosen), len(domain))
            chosen += domain[:k]
            del domain[:k]
        self.free_cores -= n
        self.usage.cores += n
        return tuple(chosen)

    def release_granted(self, cores: tuple[int, ...]) -> None:
        """Return cores a running action was granted (by ``take_cores`` or ``grant_cores``).

        The scheduler calls it once per action, for cores it checked when it took them, so
        only the cheap path: a refused return (``give_cores``) cannot happen here.
        """
        per = self._per_numa
        first = cores[0] // per if cores else -1
        if first >= 0 and first == min(cores) // per == max(cores) // per:
            domain = self.free_by_numa[first]
            domain += cores
            domain.sort()
        else:
            touched = set()
            for c in cores:
                self.free_by_numa[c // per].append(c)
                touched.add(c // per)
            for d in touched:
                self.free_by_numa[d].sort()
        self.free_cores += len(cores)
        self.usage.cores -= len(cores)

    def give_cores(self, cores: tuple[int, ...]) -> None:
        """Return cores held outside an action (a static reservation), checking each is held."""
        if len(set(cores)) != len(cores):
            raise CapacityError(f"{self.spec.name}: cores {cores} returned twice")
        self._check_exist(cores)
        per = self._per_numa
        free = {d: set(self.free_by_numa[d]) for d in {c // per for c in cores}}
        twice = sorted(c for c in cores if c in free[c // per])
        if twice:
            raise CapacityError(f"{self.spec.name}: cores {twice} returned twice")
        self.release_granted(cores)

    def take_memory(self, gb: float) -> None:
        if gb > self.memory_free_gb + 1e-9:
            raise CapacityError(f"{self.spec.name}: {gb} GB asked, {self.memory_free_gb} GB free")
        self.memory_free_gb -= gb

    def give_memory(self, gb: float) -> None:
        self.memory_free_gb = min(self.spec.memory_gb, self.memory_free_gb + gb)


@dataclass
class GpuNodeState:
    """Which action holds each GPU, which services are resident on it, and dedicated cells."""

    spec: GpuNodeSpec
    owner: list[str | None] = field(init=False)
    resident: list[set[str]] = field(init=False)
    #: For each GPU, the cell each resident service's copy was restored as: a layer-sharded
    #: copy holds 1/k of the model on each of its k GPUs and serves only that cell.
    shape: list[dict[str, tuple[int, ...]]] = field(init=False)
    free_gpus: int = field(init=False)
    usage: Usage = field(default_factory=Usage, repr=False, compare=False)
    #: The model size (GB) the executor reported with each service's restore here: the
    #: memory a copy of a service never called yet (resident from before the run) takes.
    size_gb: dict[str, float] = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        self.size_gb = {}
        self.owner = [None] * self.spec.gpus
        self.resident = [set() for _ in range(self.spec.gpus)]
        self.shape = [{} for _ in range(self.spec.gpus)]
        self.free_gpus = self.spec.gpus

    def free_cells(self, size: int) -> list[tuple[int, ...]]:
        """Aligned free cells of ``size`` GPUs (start a multiple of size), in index order."""
        return free_cells(self.owner, size)

    def is_resident(self, service: str, cell: tuple[int, ...]) -> bool:
        """Whether a call of ``service`` on ``cell`` needs no restore: each GPU holds a copy
        that serves it (``cells.copy_serves``)."""
        shape = self.shape
        for g in cell:
            held = shape[g].get(service)
            if held is None or not copy_serves(held, cell):
                return False
        return True

    def take(self, cell: tuple[int, ...], holder: str) -> None:
        problem = cell_problem(cell, self.spec.gpus) if cell else "() is not an aligned cell"
        if problem is not None:
            raise CapacityError(f"{self.spec.name}: {problem}")
        busy = [g for g in cell if self.owner[g] is not None]
        if busy:
            raise CapacityError(
                f"{self.spec.name}: GPUs {busy} of {cell} are held by {self.owner[busy[0]]}"
            )
        for g in cell:
            self.owner[g] = holder
        self.free_gpus -= len(cell)
        self.usage.gpus += len(cell)

    def give(self, cell: tuple[int, ...], holder: str) -> None:
        for g in cell:
            if self.owner[g] != holder:
                raise CapacityError(f"{self.spec.name}: GPU {g} is not held by {holder}")
        for g in cell:
            self.owner[g] = None
        self.free_gpus += len(cell)
        self.usage.gpus -= len(cell)


@dataclass
class ApiState:
    """Calls in flight and a token bucket for the start rate."""

    spec: ApiEndpointSpec
    in_flight: int = 0
    tokens: float = field(init=False)
    refilled_at: float = 0.0
    usage: Usage = field(default_factory=Usage, repr=False, compare=False)

    def __post_init__(self) -> None:
        self.tokens = float(self.spec.burst)

    def refill(self, now: float) -> None:
        if self.spec.rate_per_s is not None and now > self.refilled_at:
            self.tokens = min(
                float(self.spec.burst),
                self.tokens + (now - self.refilled_at) * self.spec.rate_per_s,
            )
        self.refilled_at = max(self.refilled_at, now)

    def can_start(self, now: float) -> bool:
        self.refill(now)
        rate_ok = self.spec.rate_per_s is None or self.tokens >= 1.0 - 1e-9
        return self.in_flight < self.spec.concurrency and rate_ok

    def next_token_at(self, now: float) -> float | None:
        """When the next start becomes allowed by the rate (None when only concurrency binds)."""
        if self.spec.rate_per_s is None or self.tokens >= 1.0 - 1e-9:
            return None
        return now + (1.0 - self.tokens) / self.spec.rate_per_s

    def take(self, now: float) -> None:
        if not self.can_start(now):
            raise CapacityError(f"API {self.spec.name}: no call slot or rate token free")
        self.in_flight += 1
        self.usage.api_calls += 1
        if self.spec.rate_per_s is not None:
            self.tokens -= 1.0

    def give(self) -> None:
        if self.in_flight <= 0:
            raise CapacityError(f"API {self.spec.name}: call slot returned twice")
        self.in_flight -= 1
        self.usage.api_calls -= 1


class ClusterState:
    """All nodes' mutable state, indexed by name."""

    def __init__(self, spec: ClusterSpec) -> None:
        self.spec = spec
        self.usage = usage = Usage()
        self.cpu: dict[str, CpuNodeState] = {
            n.name: CpuNodeState(n, usage=usage) for n in spec.cpu_nodes
        }
        self.gpu: dict[str, GpuNodeState] = {
            n.name: GpuNodeState(n, usage=usage) for n in spec.gpu_nodes
        }
        self.api: dict[str, ApiState] = {a.name: ApiState(a, usage=usage) for a in spec.apis}

    def add_node(self, spec: ClusterSpec, node: CpuNodeSpec | GpuNodeSpec) -> None:
        """A node joined (``spec`` is the cluster with it, ``ClusterSpec.with_node``): all of
        it free, counted in the same usage as the others."""
        self.spec = spec
        if isinstance(node, CpuNodeSpec):
            self.cpu[node.name] = CpuNodeState(node, usage=self.usage)
        else:
            self.gpu[node.name] = GpuNodeState(node, usage=self.usage)

    @property
    def free_gpus(self) -> int:
        return self.spec.total_gpus - self.usage.gpus

    @property
    def held_cores(self) -> int:
        return self.usage.cores

    @property
    def held_gpus(self) -> int:
        return self.usage.gpus

    @property
    def api_in_flight(self) -> int:
        return self.usage.api_calls

    def report_residency(
        self,
        node: str,
        gpus: tuple[int, ...],
        service: str,
        resident: bool,
        size_gb: float | None = None,
    ) -> None:
        """The executor (or the simulator's residency model) says one copy of a service was
        restored as the cell ``gpus`` (whole replicas: one report per GPU, ``cells.copies_on``),
        or that it left these GPUs; ``size_gb``, when it knows it, the model's size.

        A report naming no GPU node, GPUs the node does not have (a negative index read as one
        from the end) or a size that is no finite number is refused before anything changes."""
        state = self.gpu.get(node) if isinstance(node, str) else None
        if state is None:
            raise KeyError(f"residency report for {service!r}: unknown GPU node {node!r}")
        gpus = tuple(gpus)
        n = state.spec.gpus
        bad = [
            g for g in gpus if isinstance(g, bool) or not isinstance(g, Integral) or not 0 <= g < n
        ]
        if bad or len(set(gpus)) != len(gpus):
            raise ValueError(
                f"residency report for {service!r} on {node}: gpus {gpus} are not distinct "
                f"GPUs of its {n} (0..{n - 1})"
            )
        if not isinstance(service, str) or not service:
            raise ValueError(f"residency report on {node}: service must be a non-empty name")
        if size_gb is not None and (
            isinstance(size_gb, bool)
            or not isinstance(size_gb, Real)
            or not 0 <= size_gb < float("inf")
        ):
            raise ValueError(
                f"residency report for {service!r} on {node}: size_gb must be a finite number "
                f">= 0 or None, got {size_gb!r}"
            )
        if resident and size_gb is not None and size_gb > 0:
            state.size_gb[service] = float(size_gb)
        # The cell as calls name it (ascending): a copy reported as (1, 0) was recorded as a
        # cell no call runs on, and calls on (0, 1) paid a restore for a copy already there.
        gpus = tuple(sorted(int(g) for g in gpus))
        for g in gpus:
            if resident:
                state.resident[g].add(service)
                state.shape[g][service] = gpus
            else:
                state.resident[g].discard(service)
                state.shape[g].pop(service, None)
