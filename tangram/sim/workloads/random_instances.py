"""``random``: seeded small random instances (a trace AND its cluster) that hunt for failures.

One seed gives one instance of a family: ``cpu`` (1-2 nodes of 4-64 cores, CPU actions),
``gpu`` (1-2 nodes of 2, 4 or 8 GPUs, several services of several sizes, some larger than one
GPU, skewed popularity) or ``mixed`` (CPU, GPU and API actions in the same trajectories). As
for every workload, ``batch`` is the trajectories per step; :func:`random_instance` draws it
from 2..40 with the seed, as the robustness benchmark does. Every instance draws its own
shape: 1..``actions_max`` actions per trajectory,
heavy-tailed times (log-normal, sigma drawn up to ``sigma_max``), a share of long actions among
short ones, and with probability ``sync_share`` synchronised first actions (every trajectory's
first action arrives at the step's start). The cluster travels in the trace's meta
(``meta["cluster"]``, the cluster-file layout: :func:`tangram.sim.instances.trace_cluster`
reads it, ``tangram sim --workload random`` uses it when no ``--cluster`` is given).

The numbers are ours, chosen to cover contended and idle cases; nothing here is calibrated.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np

from tangram.core.cells import smallest_cell_for
from tangram.core.cluster_file import MAX_NODES
from tangram.core.resources import ClusterSpec
from tangram.sim.workloads.base import (
    meta_for,
    require,
    require_count_max,
    require_finite,
    row,
    streams,
    times,
)
from tangram.trace import Trace, TraceRow

#: The families, in the order the benchmark reports them.
FAMILIES = ("cpu", "gpu", "mixed")

#: Cores per CPU node to draw from (4-64; even splits into 1 or 2 NUMA domains).
CORE_CHOICES = (4, 6, 8, 12, 16, 24, 32, 48, 64)
#: GPUs per GPU node to draw from (a node's GPU count is a cell size).
GPU_CHOICES = (2, 4, 8)
#: Model sizes in billions of parameters; at 2 bytes each, 72B (145 GB) needs 2 GPUs of 80 GB.
SERVICE_SIZES_B = (7.6, 14.8, 32.8, 72.7)
GPU_MEMORY_GB = 80.0
#: Node memory large enough that container memory never binds (the bounds ignore memory).
CPU_NODE_MEMORY_GB = 4096.0
GPU_HOST_MEMORY_GB = 4096.0
CONTAINER_MEMORY_GB = 0.5
API_NAME = "search"


@dataclass(frozen=True)
class RandomParams:
    """What a random instance is drawn from (``batch``, as everywhere, is its trajectories)."""

    #: ``cpu``, ``gpu`` or ``mixed``.
    family: str = "cpu"
    #: Most actions per trajectory (each draws 1..actions_max).
    actions_max: int = 6
    #: Most CPU nodes (each instance draws 1..cpu_nodes_max).
    cpu_nodes_max: int = 2
    #: Most GPU nodes (each instance draws 1..gpu_nodes_max of 2, 4 or 8 GPUs).
    gpu_nodes_max: int = 2
    #: Most GPU services (models) of an instance (each draws 2..services_max).
    services_max: int = 4
    #: Log-normal sigma of action times: each instance draws sigma uniformly in [0, sigma_max].
    sigma_max: float = 2.0
    #: Median one-unit time of a short CPU action (s).
    cpu_t1_median_s: float = 2.0
    #: Median one-GPU time of a short call to a 7B model (s); larger models in proportion.
    gpu_t1_median_s: float = 0.3
    #: Median API call time (s).
    api_t1_median_s: float = 1.0
    #: Long actions take this many times a short one's median; each instance draws the share of
    #: long actions uniformly in [0, long_share_max].
    long_factor: float = 20.0
    long_share_max: float = 0.5
    #: Probability that an instance's first actions are synchronised (arrive at the step start).
    sync_share: float = 0.5
    #: Median LLM generation before an action (s), log-normal with sigma gen_sigma.
    gen_median_s: float = 2.0
    gen_sigma: float = 1.0
    #: Amdahl serial fraction of CPU actions: uniform in [0, serial_max].
    serial_max: float = 0.6
    #: Share of CPU actions that are malleable (use whatever cores they get while they run,
    #: ``Action.malleable``); the others keep their start DoP.
    malleable_share: float = 0.5
    #: Serial fraction of GPU calls over tensor-parallel GPUs.
    gpu_serial_fraction: float = 0.25
    #: Zipf exponent of service popularity: each instance draws it uniformly in [0, zipf_max].
    zipf_max: float = 2.0
    #: Mixed family: probability of each resource for an action (CPU, GPU, API).
    mixed_shares: tuple[float, float, float] = (0.5, 0.3, 0.2)
    #: API endpoint concurrency drawn from 1..api_concurrency_max.
    api_concurrency_max: int = 16

    def __post_init__(self) -> None:
        require_finite(self)
        require(self.family in FAMILIES, "family", f"must be one of {list(FAMILIES)}")
        require_count_max(self, "actions_max")
        for name in ("cpu_nodes_max", "gpu_nodes_max"):
            # The drawn cluster must load: a cluster file holds at most MAX_NODES of a kind
            # (past it the error named the trace's meta 'cluster', not this setting).
            value = getattr(self, name)
            require(1 <= value <= MAX_NODES, name, f"must lie in [1, {MAX_NODES}], got {value!r}")
        require(self.services_max >= 1, "services_max", "must be >= 1")
        require(self.api_concurrency_max >= 1, "api_concurrency_max", "must be >= 1")
        for name in ("sigma_max", "gen_sigma", "zipf_max"):
            require(getattr(self, name) >= 0, name, "must be >= 0")
        for name in ("cpu_t1_median_s", "gpu_t1_median_s", "api_t1_median_s", "gen_median_s"):
            require(getattr(self, name) > 0, name, "must be > 0")
        require(self.long_factor >= 1, "long_factor", "must be >= 1")
        for name in ("long_share_max", "sync_share"):
            require(0 <= getattr(self, name) <= 1, name, "must lie in [0, 1]")
        require(0 <= self.serial_max <= 1, "serial_max", "must lie in [0, 1]")
        require(0 <= self.malleable_share <= 1, "malleable_share", "must lie in [0, 1]")
        require(0 <= self.gpu_serial_fraction <= 1, "gpu_serial_fraction", "must lie in [0, 1]")
        shares = tuple(self.mixed_shares)
        require(
            len(shares) == 3 and min(shares) >= 0 and sum(shares) > 0,
            "mixed_shares",
            "must be three shares (cpu, gpu, api) >= 0, not all 0",
        )


_STREAMS = (
    "shape", "cluster", "services", "resource", "t1", "long", "gen", "serial", "units",
    "malleable",
)  # fmt: skip


@dataclass(frozen=True)
class _Shape:
    """One instance's drawn shape (the per-instance randomness, before its actions)."""

    trajectories: int
    sigma: float
    long_share: float
    synced: bool
    shares: tuple[float, float, float]
    cluster: dict[str, Any]
    services: tuple[tuple[str, float, float], ...]  # (name, size GB, popularity)


def _cluster(p: RandomParams, rng: np.random.Generator, kinds: set[str], seed: int) -> dict:
    """The instance's cluster in the cluster-file layout (``parse_cluster`` builds it)."""
    out: dict[str, Any] = {"name": f"random-{p.family}-{seed}"}
    if "cpu" in kinds:
        nodes = []
        for i in range(int(rng.integers(1, p.cpu_nodes_max + 1))):
            cores = int(rng.choice(CORE_CHOICES))
            numa = 2 if cores >= 32 else 1
            nodes.append(
                {"name": f"cpu{i}", "cores": cores, "numa_domains": numa,
                 "memory_gb": CPU_NODE_MEMORY_GB}
            )  # fmt: skip
        out["cpu_node"] = nodes
    if "gpu" in kinds:
        nodes = []
        for i in range(int(rng.integers(1, p.gpu_nodes_max + 1))):
            nodes.append(
                {"name": f"gpu{i}", "gpus": int(rng.choice(GPU_CHOICES)),
                 "gpu_memory_gb": GPU_MEMORY_GB, "host_memory_gb": GPU_HOST_MEMORY_GB}
            )  # fmt: skip
        out["gpu_node"] = nodes
    if "api" in kinds:
        concurrency = int(rng.integers(1, p.api_concurrency_max + 1))
        out["api"] = [{"name": API_NAME, "concurrency": concurrency}]
    return out


def _shape(p: RandomParams, rng: dict[str, np.random.Generator], batch: int, seed: int) -> _Shape:
    shape = rng["shape"]
    kinds = {"cpu": {"cpu"}, "gpu": {"gpu"}, "mixed": {"cpu", "gpu", "api"}}[p.family]
    shares = {
        "cpu": (1.0, 0.0, 0.0),
        "gpu": (0.0, 1.0, 0.0),
        "mixed": tuple(float(x) / sum(p.mixed_shares) for x in p.mixed_shares),
    }[p.family]
    services: tuple[tuple[str, float, float], ...] = ()
    if "gpu" in kinds:
        srv = rng["services"]
        n = int(srv.integers(min(2, p.services_max), p.services_max + 1))
        sizes = srv.choice(SERVICE_SIZES_B, size=n)
        zipf = float(srv.uniform(0, p.zipf_max))
        popularity = (np.arange(1, n + 1, dtype=float) ** -zipf)[srv.permutation(n)]
        popularity /= popularity.sum()
        services = tuple(
            (f"m{j}-{b:g}b", round(2.0 * float(b), 3), float(w))
            for j, (b, w) in enumerate(zip(sizes, popularity, strict=True))
        )
    return _Shape(
        trajectories=batch,
        sigma=float(shape.uniform(0, p.sigma_max)),
        long_share=float(shape.uniform(0, p.long_share_max)),
        synced=bool(shape.random() < p.sync_share),
        shares=shares,  # type: ignore[arg-type]
        cluster=_cluster(p, rng["cluster"], kinds, seed),
        services=services,
    )


def _gpu_max_units(size_gb: float, draw: int) -> int:
    """A call's most GPUs: its draw, but never below the smallest cell that holds its model
    (so the ``lower-bound`` policy, which ignores memory, never takes fewer GPUs than a real
    schedule must)."""
    need = smallest_cell_for(size_gb, GPU_MEMORY_GB, 8) or 8
    return max(draw, need)


def generate_random(params: RandomParams, *, batch: int, steps: int, seed: int) -> Trace:
    """One random instance of ``params.family``: ``steps`` steps of its trajectories."""
    # Streams named per family, so the same seed gives unrelated instances in each family.
    named = streams(seed, [f"{params.family}/{name}" for name in _STREAMS])
    rng = {name: named[f"{params.family}/{name}"] for name in _STREAMS}
    shape = _shape(params, rng, batch, seed)
    n = shape.trajectories
    rows: list[TraceRow] = []
    names = [s[0] for s in shape.services]
    popularity = np.array([s[2] for s in shape.services]) if shape.services else None
    for step in range(steps):
        counts = rng["shape"].integers(1, params.actions_max + 1, size=n)
        total = int(counts.sum())
        resources = rng["resource"].choice(3, size=total, p=shape.shares)
        unit = np.exp(shape.sigma * rng["t1"].standard_normal(total))
        long = rng["long"].random(total) < shape.long_share
        scale = np.where(long, params.long_factor, 1.0)
        gen = params.gen_median_s * np.exp(params.gen_sigma * rng["gen"].standard_normal(total))
        serial = rng["serial"].uniform(0, params.serial_max, size=total)
        cpu_units = rng["units"].choice((1, 2, 4, 8, 16, 32, 64), size=total)
        gpu_units = rng["units"].choice((1, 2, 4), size=total)
        service = (
            rng["services"].choice(len(names), size=total, p=popularity)
            if names
            else np.zeros(total, dtype=int)
        )
        draws = {
            "resources": resources,
            "unit": unit * scale,
            "long": long,
            "serial": serial,
            "cpu_units": cpu_units,
            "gpu_units": gpu_units,
            "service": service,
            "malleable": rng["malleable"].random(total) < params.malleable_share,
        }
        k = 0
        for i in range(n):
            for pos in range(int(counts[i])):
                gen_before = 0.0 if (pos == 0 and shape.synced) else float(gen[k])
                rows.append(_action(params, shape, draws, (step, i, pos), k, gen_before))
                k += 1
    meta = meta_for("random", params, batch=batch, steps=steps, seed=seed)
    meta.update(
        family=params.family,
        trajectories=n,
        sigma=round(shape.sigma, 6),
        long_share=round(shape.long_share, 6),
        synced=shape.synced,
        cluster=shape.cluster,
    )
    return Trace(tuple(rows), meta)


def _action(
    p: RandomParams,
    shape: _Shape,
    d: dict[str, np.ndarray],
    where: tuple[int, int, int],
    k: int,
    gen_before: float,
) -> TraceRow:
    """The step's k-th action at (step, trajectory, position), from the step's draws ``d``."""
    step, i, pos = where
    kind = ("cpu", "gpu", "api")[int(d["resources"][k])]
    factor = float(d["unit"][k])
    common = {"gen_before_s": times(np.array([gen_before]), positive=False)[0], "resource": kind}
    if kind == "cpu":
        return row(
            "random", step, i, pos, "long" if d["long"][k] else "short",
            t1_s=times(np.array([p.cpu_t1_median_s * factor]))[0],
            max_units=int(d["cpu_units"][k]), serial_fraction=round(float(d["serial"][k]), 4),
            memory_gb=CONTAINER_MEMORY_GB, malleable=bool(d["malleable"][k]), **common,
        )  # fmt: skip
    if kind == "gpu":
        name, size_gb, _ = shape.services[int(d["service"][k])]
        per_size = size_gb / (2.0 * SERVICE_SIZES_B[0])
        return row(
            "random", step, i, pos, "teacher",
            t1_s=times(np.array([p.gpu_t1_median_s * per_size * factor]))[0],
            max_units=_gpu_max_units(size_gb, int(d["gpu_units"][k])),
            serial_fraction=p.gpu_serial_fraction, service=name, service_size_gb=size_gb,
            **common,
        )  # fmt: skip
    return row(
        "random", step, i, pos, "search",
        t1_s=times(np.array([p.api_t1_median_s * factor]))[0], max_units=1, service=API_NAME,
        **common,
    )  # fmt: skip


#: An instance's trajectories per step, drawn by :func:`instance_batch` (both ends included).
TRAJECTORIES = (2, 40)


def instance_batch(family: str, seed: int) -> int:
    """The trajectories of instance ``seed`` of ``family``: uniform in ``TRAJECTORIES``."""
    rng = streams(seed, [f"{family}/batch"])[f"{family}/batch"]
    return int(rng.integers(TRAJECTORIES[0], TRAJECTORIES[1] + 1))


def random_instance(
    params: RandomParams | None = None, *, seed: int = 0, steps: int = 1
) -> tuple[Trace, ClusterSpec]:
    """Instance ``seed`` of ``params.family``: its trace (with a drawn batch) and cluster."""
    from tangram.sim.instances import trace_cluster
    from tangram.sim.workloads import WORKLOADS

    trace = WORKLOADS["random"](params or RandomParams(), steps=steps, seed=seed)
    cluster = trace_cluster(trace)
    assert cluster is not None  # generate_random always writes one
    return trace, cluster
