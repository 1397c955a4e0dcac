"""Starting node agents: one per Ray node, pinned to it, holding no Ray CPUs, detached.

``spawn`` creates them and waits for their reports; ``node_names``/``declared`` read a cluster
file's nodes; ``all_nodes``/``alive_nodes`` read Ray's node table off the event loop.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from typing import Any

from tangram.core.resources import ClusterSpec
from tangram.exec.ray.agent import CONTROL_GROUP, NodeAgent
from tangram.exec.ray.config import RayConfig
from tangram.exec.ray.nodes import NodeReport, node_name

#: How long an agent may take to start (torch import, Docker connection, model registration).
AGENT_START_S = 180.0
#: Threads of a node agent (a threaded actor): calls it runs at once (a running CPU action or
#: GPU call sent through Ray holds one).
AGENT_THREADS = 256
#: Threads of its control group (``agent.CONTROL_GROUP``: pings, stats, shutdown), apart from
#: those: an agent whose threads all run actions still answers its pings.
CONTROL_THREADS = 4


async def spawn(
    nodes: list[dict[str, Any]], config: RayConfig, owner: Any, *, undeclared: bool = False
) -> tuple[list[tuple[NodeReport, Any]], dict[str, str]]:
    """An agent on each of ``nodes`` (Ray's node records) that runs something there: their
    reports and handles, and the nodes a cluster file lacks (Ray id -> name), left out
    unless ``undeclared`` (a node that joins: its agent reports what it finds)."""
    import ray

    agent_cls = agent_class()
    settings = {
        "gpu_memory_gb": config.gpu_memory_gb,
        "aoe": dict(config.aoe),
        "prewarm": config.prewarm,
        "services": config.services,
        "torch_threads": config.torch_threads,
    }
    handles: list[Any] = []
    unplaced: dict[str, str] = {}
    try:
        for node in nodes:
            name = node_name(node["NodeID"], node.get("Labels") or {})
            if not (undeclared or config.cluster is None or name in node_names(config.cluster)):
                unplaced[node["NodeID"]] = name  # not in the cluster file
                continue
            handles.append(_make_agent(agent_cls, node, name, settings, config))
        reports = await asyncio.wait_for(
            asyncio.gather(*(h.describe.remote(owner) for h in handles)), AGENT_START_S
        )
    except BaseException:
        # Detached: an agent not killed here outlives this spawn (its AOE and EOE managers,
        # its models' host backups) for as long as the scheduler actor lives; those made
        # before one Ray refused to make too.
        for handle in handles:
            with contextlib.suppress(Exception):
                ray.kill(handle)
        raise
    out = []
    for report, handle in zip(reports, handles, strict=True):
        if report.cpu_spec() is None and report.gpu_spec() is None:
            ray.kill(handle)  # nothing to run there
            continue
        out.append((report, handle))
    return out, unplaced


def agent_class(cls: type = NodeAgent) -> Any:
    """``cls`` (``NodeAgent``) as a Ray actor class with its control group's threads (Ray
    takes concurrency groups in ``ray.remote`` only, not in ``options``)."""
    import ray

    return ray.remote(concurrency_groups={CONTROL_GROUP: CONTROL_THREADS})(cls)


def _make_agent(
    agent_cls: Any, node: dict[str, Any], name: str, settings: dict[str, Any], config: RayConfig
) -> Any:
    """A detached agent pinned to ``node`` (its handle; Ray may refuse to make it)."""
    from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

    return agent_cls.options(
        num_cpus=0,
        max_concurrency=AGENT_THREADS,
        scheduling_strategy=NodeAffinitySchedulingStrategy(node["NodeID"], soft=False),
        name=f"tangram-agent-{name}-{time.time_ns()}",
        namespace=config.namespace,
        # Not owned by the scheduler actor: Ray would kill an owned agent with it, AOE's
        # watchdog process too, and leave its containers. A detached agent outlives the
        # actor, sees it gone (``NodeAgent._watch_owner``), removes them, exits.
        lifetime="detached",
    ).remote(
        node["NodeID"],
        node.get("Labels") or {},
        node["Resources"].get("memory", 0.0),
        settings,
        declared(config.cluster, name),
    )


def node_names(cluster: ClusterSpec) -> set[str]:
    return {n.name for n in cluster.cpu_nodes} | {n.name for n in cluster.gpu_nodes}


def declared(cluster: ClusterSpec | None, name: str) -> tuple[Any, Any]:
    """The cluster file's CPU and GPU specs of node ``name`` (None where it declares none)."""
    if cluster is None:
        return None, None
    cpu = next((n for n in cluster.cpu_nodes if n.name == name), None)
    gpu = next((n for n in cluster.gpu_nodes if n.name == name), None)
    return cpu, gpu


async def all_nodes() -> list[dict[str, Any]]:
    import ray

    return await asyncio.get_running_loop().run_in_executor(None, ray.nodes)


async def alive_nodes() -> list[dict[str, Any]]:
    return [n for n in await all_nodes() if n.get("Alive")]
