"""Starting Tangram on a Ray cluster: the scheduler actor by name, from any Ray driver.

``start(config)`` (inside a framework's Ray driver, after ``ray.init``) gets or creates the
named, detached scheduler actor on this driver's node, starts it (agents on every node, the
cluster spec from them, the HTTP service if ``config.http``) and returns its handle and info.
``stop(config)`` shuts it down (containers removed) and kills it; so does a ``start`` that
fails (its agents stopped, the actor gone: a next ``start`` makes a fresh one).
"""

from __future__ import annotations

import contextlib
from typing import Any

from tangram.exec.ray.config import RayConfig
from tangram.exec.ray.scheduler import SchedulerActor

#: How long starting the actor and its agents may take.
START_TIMEOUT_S = 300.0


def start(config: RayConfig | None = None) -> tuple[Any, dict[str, Any]]:
    """The scheduler actor's handle (created if absent) and its ``info`` once it serves."""
    import ray
    from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

    cfg = config or RayConfig()
    if not ray.is_initialized():
        raise RuntimeError("call ray.init(address=...) first (or use tangram serve --ray)")
    here = ray.get_runtime_context().get_node_id()
    handle = (
        ray.remote(SchedulerActor)
        .options(
            name=cfg.name,
            namespace=cfg.namespace,
            lifetime="detached",
            get_if_exists=True,
            num_cpus=0,
            max_concurrency=100_000,
            scheduling_strategy=NodeAffinitySchedulingStrategy(here, soft=False),
        )
        .remote(cfg)
    )
    try:
        info = ray.get(handle.start.remote(), timeout=START_TIMEOUT_S)
    except BaseException:
        # The actor is named and detached, and keeps its failed start as its answer: left
        # alive, it (and the agents it made) stayed, and every later start got that error.
        with contextlib.suppress(Exception):
            stop(cfg, handle)
        raise
    return handle, info


def find(config: RayConfig | None = None) -> Any:
    """The running scheduler actor's handle (``ValueError`` when there is none)."""
    import ray

    cfg = config or RayConfig()
    return ray.get_actor(cfg.name, namespace=cfg.namespace)


def stop(config: RayConfig | None = None, handle: Any = None, timeout_s: float = 120.0) -> None:
    """Shut the runtime and the agents down, then kill the actor."""
    import ray

    handle = handle or find(config)
    try:
        ray.get(handle.stop.remote(), timeout=timeout_s)
    finally:
        ray.kill(handle)
