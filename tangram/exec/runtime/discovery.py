"""This machine as a cluster: its cores, memory and GPUs, for ``tangram serve`` without a file.

- CPU: one node named after the host, with the cores this process may use (AOE's topology:
  the cgroup's cpuset, NUMA domains from sysfs when they split the cores evenly) and 75% of
  the physical memory for containers.
- GPU: one node with the GPUs NVML reports (a power of two, at most 8; budgets of 90% of the
  smallest GPU's memory). Without NVML or a GPU: two CPU-backed devices of 2 GB, like the
  bundled ``local`` cluster, so the GPU path runs everywhere (EOE's ``cpu`` backend).
- API: the built-in demo endpoints ``echo`` (no quota to speak of) and ``search`` (4 in
  flight, 20 starts/s, as ``local``).

``cluster_to_dict`` writes a ``ClusterSpec`` in the cluster-file schema, so a live trace can
carry the exact cluster it ran on and ``tangram replay`` can rebuild it.
"""

from __future__ import annotations

import contextlib
import os
import socket
from dataclasses import asdict, dataclass
from typing import Any

from tangram.core.cells import cell_sizes
from tangram.core.resources import ApiEndpointSpec, ClusterSpec, CpuNodeSpec, GpuNodeSpec

#: CPU-backed "GPUs" when no real one is found (as the bundled local cluster).
CPU_BACKED_DEVICES = 2
CPU_BACKED_MEMORY_GB = 2.0


@dataclass(frozen=True)
class GpuDiscovery:
    """What was found: the backend EOE should use and the node describing it."""

    backend: str  # "cuda" or "cpu"
    node: GpuNodeSpec


def host_cores() -> tuple[tuple[int, ...], ...]:
    """The cores this process may use, grouped by NUMA domain (AOE's view of the host)."""
    try:
        from tangram.exec.aoe.topology import read_host_topology

        return tuple(tuple(d) for d in read_host_topology().domains)
    except Exception:  # noqa: BLE001 - no sysfs: one domain of the affinity mask
        return (tuple(sorted(os.sched_getaffinity(0))),)


def memory_gb() -> float:
    """Physical memory in GB (GiB), from /proc/meminfo."""
    with contextlib.suppress(OSError, ValueError, IndexError), open("/proc/meminfo") as f:
        for line in f:
            if line.startswith("MemTotal:"):
                return int(line.split()[1]) / (1 << 20)
    return 4.0


def discover_gpus(name: str = "local-gpu") -> GpuDiscovery:
    """GPUs from NVML (EOE's ``nvml_gpus``), else CPU-backed devices."""
    try:
        from tangram.exec.eoe import nvml_gpus

        found = nvml_gpus()
    except Exception:  # noqa: BLE001 - no NVML library: CPU-backed devices
        found = ()
    if found:
        gpus = max(cell_sizes(len(found)))  # the largest aligned cell: the node's GPUs
        per_gpu = 0.9 * min(g.total_bytes for g in found[:gpus]) / (1 << 30)
        node = GpuNodeSpec(
            name=name, gpus=gpus, gpu_memory_gb=round(per_gpu, 3), host_memory_gb=64.0
        )
        return GpuDiscovery("cuda", node)
    node = GpuNodeSpec(
        name=name,
        gpus=CPU_BACKED_DEVICES,
        gpu_memory_gb=CPU_BACKED_MEMORY_GB,
        host_memory_gb=8.0,
        h2d_gbps=10.0,
        restore_fixed_s=0.001,
    )
    return GpuDiscovery("cpu", node)


def default_apis() -> tuple[ApiEndpointSpec, ...]:
    return (
        ApiEndpointSpec("echo", concurrency=256),
        ApiEndpointSpec("search", concurrency=4, rate_per_s=20.0, burst=4),
    )


def discover_cluster(*, gpus: bool = True, cpu: bool = True) -> tuple[ClusterSpec, str | None]:
    """This machine as a ``ClusterSpec``, and the EOE backend for its GPU node (None: no GPU
    node)."""
    cpu_nodes: tuple[CpuNodeSpec, ...] = ()
    if cpu:
        domains = host_cores()
        cores = sum(len(d) for d in domains)
        even = len({len(d) for d in domains}) == 1
        cpu_nodes = (
            CpuNodeSpec(
                name=socket.gethostname().split(".")[0] or "local",
                cores=cores,
                numa_domains=len(domains) if even else 1,
                memory_gb=round(0.75 * memory_gb(), 1),
            ),
        )
    gpu_nodes: tuple[GpuNodeSpec, ...] = ()
    backend = None
    if gpus:
        found = discover_gpus()
        gpu_nodes, backend = (found.node,), found.backend
    cluster = ClusterSpec(
        name="discovered",
        cpu_nodes=cpu_nodes,
        gpu_nodes=gpu_nodes,
        apis=default_apis(),
    )
    return cluster, backend


def cluster_to_dict(cluster: ClusterSpec) -> dict[str, Any]:
    """The cluster in the cluster-file schema (``parse_cluster`` reads it back)."""

    def clean(d: dict[str, Any]) -> dict[str, Any]:
        return {k: v for k, v in d.items() if v is not None}

    return {
        "name": cluster.name,
        "cpu_node": [asdict(n) for n in cluster.cpu_nodes],
        "gpu_node": [asdict(n) for n in cluster.gpu_nodes],
        "api": [clean(asdict(a)) for a in cluster.apis],
        "prices": asdict(cluster.prices),
    }
