"""Resource types and the static description of a cluster (what a cluster TOML file holds)."""

from __future__ import annotations

import math
import numbers
from dataclasses import dataclass, field, replace
from enum import StrEnum
from functools import cached_property

from tangram.core.cells import CELL_SIZES

#: GPU cells are aligned groups of 1, 2, 4 or 8 GPUs on one node (``tangram.core.cells`` owns
#: the rule; this name stays for code that imports it from here).
GPU_CELL_SIZES: tuple[int, ...] = CELL_SIZES

#: Slowest host-to-GPU copy a GPU node may declare (GB/s: a kilobyte per second), and the
#: most memory per GPU (GB: far above any GPU today, far below a typo). Together they keep a
#: restore estimate (size / bandwidth, the size at most a node's GPUs' memory) a finite
#: number of seconds: ``h2d_gbps = 1e-320`` made a 20-GB restore take ``inf`` seconds, and a
#: cold replay failed as "event time must be a finite number of seconds, got inf".
H2D_GBPS_MIN = 1e-6
GPU_MEMORY_GB_MAX = 1e6
#: Slowest start rate an API endpoint may declare (starts/s): the wait for the next token
#: (1 / rate) stays finite; ``rate_per_s = 1e-320`` made it ``inf`` and a run failed as
#: "event time must be a finite number of seconds, got inf".
RATE_PER_S_MIN = 1e-6
#: Highest price a cluster may declare (money per resource-hour, or per API call): far above
#: any real one, low enough that price x resource-hours of the largest cluster stays finite.
#: ``cpu_core_hour = 1e308`` passed and every cost figure overflowed to ``inf``.
PRICE_MAX = 1e6
#: Longest fixed restore cost a GPU node may declare (seconds): the trace format's longest
#: time (``tangram.trace.row.TIME_MAX_S``, which the core may not import), the bound the
#: simulator's own ``overheads.gpu_restore_fixed_s`` has. ``restore_fixed_s = 1e300`` passed
#: and every cold call's ACT came out as 1e300 seconds instead of an error.
RESTORE_FIXED_S_MAX = 1e9


class SpecError(ValueError):
    """An invalid cluster description; ``key`` names the offending field."""

    def __init__(self, key: str, problem: str) -> None:
        super().__init__(f"{key}: {problem}")
        self.key = key
        self.problem = problem


def _require(ok: bool, key: str, problem: str) -> None:
    if not ok:
        raise SpecError(key, problem)


def _finite(value: object, *, low: float, strict: bool) -> bool:
    """A finite number above ``low`` (at or above it unless ``strict``), not a bool. TOML reads
    ``inf`` as a float: an infinite size, bandwidth or restore time passed ``> 0`` and made
    every figure it fed infinite (a restore of ``inf`` seconds gave an infinite mean ACT)."""
    if isinstance(value, bool) or not isinstance(value, numbers.Real) or not math.isfinite(value):
        return False
    return value > low if strict else value >= low


def _whole(value: object) -> bool:
    """An int that is no bool: True passed ``isinstance(_, int)`` (and ``in (1, 2, 4, 8)``)
    and made a node of one core, one GPU, one call."""
    return isinstance(value, int) and not isinstance(value, bool)


def _require_name(value: object, what: str) -> None:
    """A node's, endpoint's or cluster's name: a non-empty string (cluster files check theirs
    further; one built in Python took "", None or 5, which decisions, queues and the API
    endpoints' lookups then carried as a name)."""
    _require(
        isinstance(value, str) and bool(value),
        "name",
        f"{what} needs a non-empty string name, got {value!r}",
    )


def _require_positive(value: object, key: str) -> None:
    _require(
        _finite(value, low=0, strict=True), key, f"must be a positive finite number, got {value!r}"
    )


class ResourceKind(StrEnum):
    """The key elastic resource of an action (``none`` for inelastic API-only actions)."""

    CPU = "cpu"
    GPU = "gpu"
    API = "api"


@dataclass(frozen=True)
class CpuNodeSpec:
    """A CPU node: cores split evenly into NUMA domains, and memory for containers."""

    name: str
    cores: int
    numa_domains: int
    memory_gb: float

    def __post_init__(self) -> None:
        _require_name(self.name, "a CPU node")
        _require(
            _whole(self.cores) and self.cores >= 1,
            "cores",
            f"must be a positive integer, got {self.cores!r}",
        )
        _require(
            _whole(self.numa_domains) and self.numa_domains >= 1,
            "numa_domains",
            f"must be a positive integer, got {self.numa_domains!r}",
        )
        _require(
            self.cores % self.numa_domains == 0,
            "numa_domains",
            f"{self.cores} cores do not split evenly into {self.numa_domains} NUMA domains",
        )
        _require_positive(self.memory_gb, "memory_gb")

    def numa_of(self, core: int) -> int:
        """NUMA domain of a core id (cores are numbered domain by domain)."""
        return core // (self.cores // self.numa_domains)


@dataclass(frozen=True)
class GpuNodeSpec:
    """A GPU node: GPUs (a power of two, at most 8) with memory each, and host memory."""

    name: str
    gpus: int
    gpu_memory_gb: float
    host_memory_gb: float
    #: Host-to-GPU copy bandwidth, used to estimate the cost of restoring a service.
    h2d_gbps: float = 25.0
    #: Fixed cost of a restore (allocation, stream setup), seconds.
    restore_fixed_s: float = 0.05

    def __post_init__(self) -> None:
        _require_name(self.name, "a GPU node")
        _require(
            _whole(self.gpus) and self.gpus in GPU_CELL_SIZES,
            "gpus",
            f"must be one of {GPU_CELL_SIZES} (aligned cells), got {self.gpus!r}",
        )
        for key in ("gpu_memory_gb", "host_memory_gb", "h2d_gbps"):
            _require_positive(getattr(self, key), key)
        _require(
            self.h2d_gbps >= H2D_GBPS_MIN,
            "h2d_gbps",
            f"must be >= {H2D_GBPS_MIN:g} GB/s (a restore at less would take no finite "
            f"time), got {self.h2d_gbps!r}",
        )
        _require(
            self.gpu_memory_gb <= GPU_MEMORY_GB_MAX,
            "gpu_memory_gb",
            f"must be <= {GPU_MEMORY_GB_MAX:g} GB per GPU, got {self.gpu_memory_gb!r}",
        )
        _require(
            _finite(self.restore_fixed_s, low=0, strict=False)
            and self.restore_fixed_s <= RESTORE_FIXED_S_MAX,
            "restore_fixed_s",
            f"must be a finite number >= 0 and <= {RESTORE_FIXED_S_MAX:g} seconds, got "
            f"{self.restore_fixed_s!r}",
        )

    def restore_s(self, size_gb: float, cell_size: int = 1, *, replicas: bool = False) -> float:
        """EOE's restore estimate for a model of ``size_gb`` onto a cell of ``cell_size`` GPUs:
        each GPU loads its 1/k shard over its own host-to-GPU link, so k GPUs restore k times
        faster (plus the fixed cost); a service run as ``replicas`` loads the whole model on
        every GPU of the cell at once, which takes as long as one."""
        shards = 1 if replicas else cell_size
        return size_gb / (shards * self.h2d_gbps) + self.restore_fixed_s


@dataclass(frozen=True)
class ApiEndpointSpec:
    """A rate-limited API: at most ``concurrency`` calls in flight, ``rate_per_s`` starts/s."""

    name: str
    concurrency: int
    rate_per_s: float | None = None
    burst: int = 1

    def __post_init__(self) -> None:
        _require_name(self.name, "an API endpoint")
        _require(
            _whole(self.concurrency) and self.concurrency >= 1,
            "concurrency",
            f"must be a positive integer, got {self.concurrency!r}",
        )
        _require(
            self.rate_per_s is None
            or (_finite(self.rate_per_s, low=0, strict=True) and self.rate_per_s >= RATE_PER_S_MIN),
            "rate_per_s",
            f"must be a positive finite number, at least {RATE_PER_S_MIN:g} starts/s, when "
            f"given (omit it for no rate limit), got {self.rate_per_s!r}",
        )
        _require(
            _whole(self.burst) and self.burst >= 1,
            "burst",
            f"must be a positive integer, got {self.burst!r}",
        )


@dataclass(frozen=True)
class Prices:
    """Money per resource-hour, to turn resource-seconds into cost."""

    cpu_core_hour: float = 0.04
    gpu_hour: float = 2.5
    api_call: float = 0.0

    def __post_init__(self) -> None:
        # A negative, infinite or NaN price turns every cost figure into nonsense silently;
        # one past PRICE_MAX overflows them to inf.
        for key in ("cpu_core_hour", "gpu_hour", "api_call"):
            value = getattr(self, key)
            _require(
                isinstance(value, int | float)
                and not isinstance(value, bool)
                and math.isfinite(value)
                and 0 <= value <= PRICE_MAX,
                key,
                f"must be a finite number >= 0 and <= {PRICE_MAX:g}, got {value!r}",
            )


@dataclass(frozen=True)
class ClusterSpec:
    """The whole external resource pool Tangram manages."""

    name: str
    cpu_nodes: tuple[CpuNodeSpec, ...] = ()
    gpu_nodes: tuple[GpuNodeSpec, ...] = ()
    apis: tuple[ApiEndpointSpec, ...] = ()
    prices: Prices = field(default_factory=Prices)

    def __post_init__(self) -> None:
        _require_name(self.name, "a cluster")
        for group, nodes in (("cpu", self.cpu_nodes), ("gpu", self.gpu_nodes), ("api", self.apis)):
            names = [n.name for n in nodes]
            dup = sorted({n for n in names if names.count(n) > 1})
            _require(not dup, group, f"duplicate names {dup}")
        _require(
            bool(self.cpu_nodes or self.gpu_nodes or self.apis),
            "cluster",
            "describes no CPU node, GPU node or API",
        )

    @cached_property
    def total_cores(self) -> int:
        return sum(n.cores for n in self.cpu_nodes)

    @cached_property
    def total_gpus(self) -> int:
        return sum(n.gpus for n in self.gpu_nodes)

    def cpu_node(self, name: str) -> CpuNodeSpec:
        for node in self.cpu_nodes:
            if node.name == name:
                return node
        raise KeyError(f"unknown CPU node {name!r}")

    def gpu_node(self, name: str) -> GpuNodeSpec:
        for node in self.gpu_nodes:
            if node.name == name:
                return node
        raise KeyError(f"unknown GPU node {name!r}")

    def api(self, name: str) -> ApiEndpointSpec:
        for api in self.apis:
            if api.name == name:
                return api
        raise KeyError(f"unknown API endpoint {name!r}")

    def with_node(self, node: CpuNodeSpec | GpuNodeSpec) -> ClusterSpec:
        """This cluster with ``node`` appended (a node that joined a running cluster: the spec
        is frozen, so a new one). Refuses a node of neither kind, or a name its kind has."""
        groups = {CpuNodeSpec: "cpu_nodes", GpuNodeSpec: "gpu_nodes"}
        group = groups.get(type(node))
        _require(
            group is not None,
            "node",
            f"must be a CpuNodeSpec or a GpuNodeSpec, got {type(node).__name__}: {node!r}",
        )
        assert group is not None
        _require(
            isinstance(node.name, str) and bool(node.name),
            "name",
            f"a node needs a non-empty name, got {node.name!r}",
        )
        nodes: tuple = getattr(self, group)
        _require(
            all(n.name != node.name for n in nodes),
            group,
            f"node {node.name!r} is already in cluster {self.name!r}",
        )
        # ``replace`` builds the node again: its shape is checked as a cluster file's is.
        return replace(self, **{group: (*nodes, replace(node))})

    def scaled_gpus(self, total: int) -> ClusterSpec:
        """The same cluster with ``total`` GPUs: full nodes of the first GPU node's shape, the
        remainder as smaller power-of-two nodes (10 GPUs = 8 + 2)."""
        if not self.gpu_nodes:
            raise ValueError("cannot scale GPUs of a cluster that has none")
        if total < 1:
            raise ValueError(f"total GPUs must be >= 1, got {total}")
        template = self.gpu_nodes[0]
        sizes = [template.gpus] * (total // template.gpus)
        rest = total % template.gpus
        for size in (4, 2, 1):
            if rest >= size:
                sizes.append(size)
                rest -= size
        nodes = tuple(
            GpuNodeSpec(**{**template.__dict__, "name": f"gpu{i}", "gpus": g})
            for i, g in enumerate(sizes)
        )
        return ClusterSpec(f"{self.name}-{total}gpu", self.cpu_nodes, nodes, self.apis, self.prices)

    def scaled(self, *, cpu_nodes: int | None = None, gpu_nodes: int | None = None) -> ClusterSpec:
        """The same cluster with a different count of (identical) CPU or GPU nodes.

        Used by the savings search ("the smallest cluster that matches a baseline's ACT").
        """

        def _resize(nodes: tuple, count: int | None, prefix: str) -> tuple:
            if count is None:
                return nodes
            if not nodes:
                raise ValueError(f"cannot scale {prefix} nodes of a cluster that has none")
            template = nodes[0]
            return tuple(
                type(template)(**{**template.__dict__, "name": f"{prefix}{i}"})
                for i in range(count)
            )

        return ClusterSpec(
            name=f"{self.name}-scaled",
            cpu_nodes=_resize(self.cpu_nodes, cpu_nodes, "cpu"),
            gpu_nodes=_resize(self.gpu_nodes, gpu_nodes, "gpu"),
            apis=self.apis,
            prices=self.prices,
        )
