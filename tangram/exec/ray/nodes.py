"""What a node agent finds on its node, and the cluster spec the scheduler builds from them.

Each agent reads its node's shape where it runs: the host cores its containers may use (the
``tangram-cores`` label, else every core its process may use, grouped by NUMA domain), the
memory for containers (``tangram-memory-gb``, else the Ray node's memory), its GPUs
(``tangram-gpus``: ``cpu-N`` CPU-backed devices or a count; else NVML's). The scheduler turns
the reports into one ``ClusterSpec``: a CPU node per report with cores, a GPU node per report
with GPUs, under the report's Tangram name. With a cluster file (``RayConfig.cluster``) the
file's nodes are the spec instead, matched to Ray nodes by their ``tangram-name``.
"""

from __future__ import annotations

import math
import os
import re
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from pathlib import Path

from tangram.core.resources import ApiEndpointSpec, ClusterSpec, CpuNodeSpec, GpuNodeSpec
from tangram.exec.ray.config import LABEL_CORES, LABEL_GPUS, LABEL_MEMORY, LABEL_NAME

#: GPUs a node may have (aligned cells: a power of two, at most 8).
GPU_COUNTS = (1, 2, 4, 8)


@dataclass(frozen=True)
class GpuPlan:
    """A node's GPUs as its agent runs them: how many, on which backend, memory each."""

    count: int
    backend: str
    memory_gb: float


@dataclass(frozen=True)
class ServiceEntry:
    """A GPU service as a node's EOE registered it: what the scheduler needs to admit calls."""

    dops: tuple[int, ...]
    #: GB the model holds: per replica, or all of a layer-sharded model's shards.
    size_gb: float
    #: Runs as whole data-parallel replicas, one per GPU of its cell (``Action.service_replicas``).
    replicas: bool
    #: Layer shards (a sharded service runs on cells of exactly this many GPUs).
    shards: int = 1
    #: Its calls are cut along their batch for its replicas (``GpuExecutor.splits_by_batch``).
    batch_split: bool = True


@dataclass(frozen=True)
class NodeReport:
    """One node as its agent found it (sent to the scheduler when the agent starts)."""

    ray_node: str
    name: str
    #: Host core ids for containers, by NUMA domain (empty: no CPU node here).
    domains: tuple[tuple[int, ...], ...]
    memory_gb: float
    gpus: GpuPlan | None
    #: The node as a cluster file declares it (``RayConfig.cluster``), which then wins over
    #: what the agent found (its cores must not outnumber the ones found).
    declared_cpu: CpuNodeSpec | None = None
    declared_gpu: GpuNodeSpec | None = None

    def cpu_spec(self) -> CpuNodeSpec | None:
        if self.declared_cpu is not None:
            return self.declared_cpu
        cores = sum(len(d) for d in self.domains)
        if not cores:
            return None
        even = len({len(d) for d in self.domains}) == 1
        return CpuNodeSpec(
            self.name,
            cores=cores,
            numa_domains=len(self.domains) if even else 1,
            memory_gb=self.memory_gb,
        )

    def gpu_spec(self) -> GpuNodeSpec | None:
        if self.declared_gpu is not None:
            return self.declared_gpu
        if self.gpus is None:
            return None
        return GpuNodeSpec(
            self.name,
            gpus=self.gpus.count,
            gpu_memory_gb=self.gpus.memory_gb,
            host_memory_gb=self.memory_gb,
            h2d_gbps=10.0 if self.gpus.backend == "cpu" else 25.0,
            restore_fixed_s=0.001 if self.gpus.backend == "cpu" else 0.05,
        )


def node_name(ray_node: str, labels: Mapping[str, str]) -> str:
    """The node's Tangram name: its ``tangram-name`` label, else ``ray-`` + its id's start."""
    return labels.get(LABEL_NAME) or f"ray-{ray_node[:8]}"


def gpu_plan(labels: Mapping[str, str], device_memory_gb: float) -> GpuPlan | None:
    """The node's GPUs from its ``tangram-gpus`` label (``cpu-N``: N CPU-backed devices,
    ``N``: N CUDA GPUs, ``0``: none), else what NVML finds."""
    text = labels.get(LABEL_GPUS)
    if text is None:
        from tangram.exec.runtime.discovery import discover_gpus

        found = discover_gpus()
        if found.backend != "cuda":
            return None
        return GpuPlan(found.node.gpus, "cuda", found.node.gpu_memory_gb)
    backend, _, count_text = text.replace(":", "-").rpartition("-")
    try:
        count = int(count_text)
    except ValueError:
        raise ValueError(f"label {LABEL_GPUS}={text!r}: expected 'cpu-N', 'N' or '0'") from None
    if count == 0:
        return None
    if count not in GPU_COUNTS:
        raise ValueError(f"label {LABEL_GPUS}={text!r}: a node has 1, 2, 4 or 8 GPUs")
    if backend not in ("", "cpu", "cuda"):
        raise ValueError(f"label {LABEL_GPUS}={text!r}: backend must be cpu or cuda")
    return GpuPlan(count, backend or "cuda", device_memory_gb)


#: The largest core id a ``tangram-cores`` label may name (no host has more cores).
MAX_CORE_ID = 1 << 16


def core_domains(
    labels: Mapping[str, str], online: frozenset[int] | None = None
) -> tuple[tuple[int, ...], ...]:
    """Host cores for containers: the ``tangram-cores`` cpulist (one domain; ``_`` separates
    ranges, as a Ray label value has no commas: ``0-3_8-11``), else the host's NUMA domains.
    With ``online`` (the host's cores: the agent passes ``online_cores()``), a label naming
    a core the host lacks is refused naming the label: taken, the node joined with cores no
    container could be given, and every container's create failed there (docker's 'requested
    CPUs are not available'), each open a 500."""
    text = labels.get(LABEL_CORES)
    if text is None:
        from tangram.exec.aoe.topology import read_host_topology

        return read_host_topology().domains
    if not text.strip():
        return ()
    from tangram.exec.aoe.topology import format_cpulist, parse_cpulist

    # (Checked before the list is expanded: '0-999999999' made a billion core ids, the agent's
    # memory and minutes, before anything could refuse it.)
    top = max((int(n) for n in re.findall(r"\d+", text)), default=0)
    if top > MAX_CORE_ID:
        raise ValueError(f"label {LABEL_CORES}={text!r}: core ids go up to {MAX_CORE_ID}")
    try:
        cores = tuple(parse_cpulist(text.replace("_", ",")))
    except ValueError as exc:
        raise ValueError(f"label {LABEL_CORES}={text!r}: not a cpulist ({exc})") from None
    missing = sorted(set(cores) - online) if online is not None else []
    if missing:
        raise ValueError(
            f"label {LABEL_CORES}={text!r}: this host has no core {format_cpulist(missing)} "
            f"(its cores: {format_cpulist(sorted(online or ()))})"
        )
    return (cores,)


def online_cores(online: Path = Path("/sys/devices/system/cpu/online")) -> frozenset[int]:
    """The host's online cores (sysfs), else ``0..os.cpu_count()-1``. Not this process's
    affinity: containers may be given cores the agent itself does not run on."""
    from tangram.exec.aoe.topology import parse_cpulist

    try:
        return frozenset(parse_cpulist(online.read_text().strip()))
    except (OSError, ValueError):
        return frozenset(range(os.cpu_count() or 1))


def memory_gb(labels: Mapping[str, str], ray_memory_bytes: float) -> float:
    """Container memory: the ``tangram-memory-gb`` label, else the Ray node's memory."""
    text = labels.get(LABEL_MEMORY)
    if text is not None:
        try:
            value = float(text)
        except ValueError:
            value = math.nan
        if not (value > 0 and math.isfinite(value)):
            raise ValueError(f"label {LABEL_MEMORY}={text!r} must be a positive number of GB")
        return value
    return round(ray_memory_bytes / (1 << 30), 3)


def cluster_spec(
    reports: Iterable[NodeReport], apis: tuple[ApiEndpointSpec, ...], name: str = "ray"
) -> ClusterSpec:
    """One cluster from the agents' reports (sorted by name: the same nodes, the same spec)."""
    ordered = sorted(reports, key=lambda r: r.name)
    names = [r.name for r in ordered]
    dup = sorted({n for n in names if names.count(n) > 1})
    if dup:
        raise ValueError(f"two Ray nodes share the Tangram name(s) {dup}: set {LABEL_NAME}")
    return ClusterSpec(
        name=name,
        cpu_nodes=tuple(s for r in ordered if (s := r.cpu_spec()) is not None),
        gpu_nodes=tuple(s for r in ordered if (s := r.gpu_spec()) is not None),
        apis=apis,
    )
