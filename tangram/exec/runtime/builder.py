"""``build_runtime``: a ``Runtime`` with the executors a cluster needs, made on this machine.

- CPU: an ``AoeManager`` (Docker) for the cluster's first CPU node, whose cores must not
  outnumber the host's; ``cpu=False`` (or no CPU node) leaves CPU work refused.
- GPU: an ``EoeManager`` for the cluster's GPU node (CUDA when ``backend`` says so or NVML
  found GPUs, else CPU-backed devices with the node's memory as their budget), with the
  example services ``reward`` and ``teacher`` (tiny) unless ``services`` are given.
- API: the built-in callables for the endpoints the cluster declares, plus ``endpoints``.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping, Sequence
from typing import Any

from tangram.core.resources import ClusterSpec
from tangram.exec.runtime.api import ApiCallable, ApiExecutor, builtin_endpoints
from tangram.exec.runtime.config import RuntimeConfig
from tangram.exec.runtime.cpu import CpuExecutor
from tangram.exec.runtime.gpu import GB, GpuExecutor
from tangram.exec.runtime.runtime import Runtime

log = logging.getLogger(__name__)


def default_services() -> list[Any]:
    """The example EOE services: a reward model and a teacher, both ``tiny``."""
    from tangram.exec.eoe import reward_model_spec, teacher_spec

    return [reward_model_spec("reward", "tiny"), teacher_spec("teacher", "tiny")]


def build_runtime(
    cluster: ClusterSpec,
    config: RuntimeConfig | None = None,
    *,
    cpu: bool = True,
    gpu: bool = True,
    gpu_backend: str = "auto",
    services: Sequence[Any] | None = None,
    endpoints: Mapping[str, ApiCallable] | None = None,
    aoe_config: Any = None,
    docker_client: Any = None,
) -> Runtime:
    """Make the executors for ``cluster`` and the runtime driving them (not yet started)."""
    cpu_exec = None
    if cpu and cluster.cpu_nodes:
        from tangram.exec.aoe import AoeConfig, AoeManager

        aoe = AoeManager(aoe_config or AoeConfig(), client=docker_client)
        try:
            cpu_exec = CpuExecutor(aoe, cluster.cpu_nodes[0])
        except BaseException:
            aoe.shutdown()
            raise
        if len(cluster.cpu_nodes) > 1:
            log.warning(
                "the cluster has %d CPU nodes; this runtime drives only %s (scale-out is not "
                "implemented)",
                len(cluster.cpu_nodes),
                cluster.cpu_nodes[0].name,
            )
    try:
        gpu_exec, holder = _gpu_executor(cluster, gpu, gpu_backend, services)
    except BaseException:
        if cpu_exec is not None:  # (its AOE manager holds Docker and a watchdog)
            cpu_exec.aoe.shutdown()
        raise
    declared = {a.name for a in cluster.apis}
    calls = {k: v for k, v in builtin_endpoints().items() if k in declared}
    calls.update(endpoints or {})
    api_exec = ApiExecutor(calls)
    try:
        runtime = Runtime(cluster, config, cpu=cpu_exec, gpu=gpu_exec, api=api_exec)
    except BaseException:
        # (A cluster the runtime refuses, e.g. two GPU nodes: the executors made above hold
        # Docker, a watchdog, devices and threads that nothing else would stop.)
        for executor in (cpu_exec, gpu_exec, api_exec):
            if executor is not None:
                try:
                    executor.shutdown()
                except Exception:
                    log.exception("shutting down %s failed", type(executor).__name__)
        raise
    holder["runtime"] = runtime
    return runtime


def _gpu_executor(
    cluster: ClusterSpec, gpu: bool, gpu_backend: str, services: Sequence[Any] | None
) -> tuple[GpuExecutor | None, dict[str, Runtime]]:
    """The GPU executor for the cluster's GPU node (None: none asked for), and the holder its
    residency relay reads the runtime from; a service that fails to register closes the EOE
    manager (its devices) before the error goes on."""
    gpu_exec = None
    holder: dict[str, Runtime] = {}
    if gpu and cluster.gpu_nodes:
        from tangram.exec.eoe import EoeConfig, EoeManager

        node = cluster.gpu_nodes[0]
        backend = gpu_backend
        if backend == "auto":
            from tangram.exec.runtime.discovery import discover_gpus

            backend = discover_gpus().backend
        eoe_config = EoeConfig(
            backend=backend,
            devices=node.gpus,
            device_memory_bytes=int(node.gpu_memory_gb * GB) if backend == "cpu" else None,
        )

        def relay(service: str, gpus: tuple[int, ...], resident: bool) -> None:
            rt = holder.get("runtime")
            if rt is not None:
                rt.residency_changed(service, gpus, resident)

        eoe = EoeManager(eoe_config, on_residency_change=relay)
        try:
            for spec in default_services() if services is None else services:
                eoe.register(spec)
            gpu_exec = GpuExecutor(eoe, node)
        except BaseException:
            eoe.close()
            raise
    return gpu_exec, holder
