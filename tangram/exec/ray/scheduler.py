"""``SchedulerActor``: the one scheduler of a Ray cluster, in a named, detached async actor.

It runs the same ``Runtime`` as ``tangram serve`` (the ``Scheduler`` and its policy through
``DriverLoop`` and ``LiveHost``; admission, idempotent ids, outcomes, trace), with executors
that send each start to the node agent of the node the core chose (``executors``). One
``NodeAgent`` per Ray node, created pinned to its node (detached: each watches this actor
and removes its containers when it is gone). Optionally it
serves the HTTP API itself (``RayConfig.http``), so ``/v1/...`` and ``/run_code`` reach the
runtime with no extra hop; frameworks on Ray call its methods instead (``client``).

Faults (``docs/ray.md``): a node whose agent died (Ray reports it at once) or that stopped
answering pings for ``lost_after_s`` is lost: its calls in flight end with a retryable
``node_lost`` error, its trajectories are closed and listed as lost (reopening one places it
on another node), and its container memory is fenced in the core (a trajectory holding all
of it) so nothing is placed there again. A node with the same Tangram name that comes back
gets a new agent and its fence is lifted: capacity returns without a restart.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import Mapping
from typing import Any

from tangram.core.resources import ClusterSpec
from tangram.exec.ray.agent import NodeAgent
from tangram.exec.ray.config import RayConfig
from tangram.exec.ray.executors import RayCpuExecutor, RayGpuExecutor
from tangram.exec.ray.fleet import NODE_LOST, Fleet
from tangram.exec.ray.nodes import NodeReport, cluster_spec, node_name
from tangram.exec.runtime.actions import WAITING
from tangram.exec.runtime.api import ApiExecutor, builtin_endpoints
from tangram.exec.runtime.errors import LiveError, UnknownTrajectory
from tangram.exec.runtime.records import ActionSpec, ErrorInfo
from tangram.exec.runtime.runtime import Runtime
from tangram.exec.service.limits import DEFAULT_MAX_OUTPUT_BYTES
from tangram.exec.service.schema import (
    outcome_doc,
    parse_action,
    parse_trajectory,
    state_doc,
    trajectory_doc,
)

log = logging.getLogger(__name__)

#: How long an agent may take to start (torch import, Docker connection, model registration).
AGENT_START_S = 180.0
#: Threads of a node agent (a threaded actor): calls it runs at once (a running CPU action or
#: GPU call holds one; pings need one free).
AGENT_THREADS = 256


def error_reply(exc: LiveError) -> dict[str, Any]:
    """A runtime error as the Ray client's reply (the same code, message, retryability)."""
    return {
        "error": {
            "code": exc.code,
            "message": exc.message,
            "retryable": exc.retryable,
            "retry_after_s": exc.retry_after_s,
        }
    }


class SchedulerActor:
    """The scheduler of the cluster and its agents (wrapped by ``ray.remote`` in ``service``)."""

    def __init__(self, config: RayConfig) -> None:
        self.config = config
        self.fleet = Fleet()
        self.fleet.on_lost.append(self._lost)
        self.runtime: Runtime | None = None
        self.url: str | None = None
        self.runner: Any = None
        #: Trajectories lost with their node: id -> why.
        self.lost_trajectories: dict[str, str] = {}
        #: Node -> the core trajectories fencing its memory while it is lost.
        self.fences: dict[str, list[str]] = {}
        #: Ray nodes that joined with a name the cluster spec does not have (not used).
        self.unplaced: dict[str, str] = {}
        #: Nodes of the cluster file with no Ray node yet (fenced until one joins).
        self.absent: set[str] = set()
        self.declared: ClusterSpec | None = None
        self._fence_seq = 0
        self._started: asyncio.Future[dict[str, Any]] | None = None
        self._tasks: set[asyncio.Task[Any]] = set()
        self._monitor: asyncio.Task[None] | None = None

    # ------------------------------------------------------------------ start and stop
    async def start(self) -> dict[str, Any]:
        """Create the agents, build the cluster and the runtime, serve; idempotent."""
        if self._started is None:
            self._started = asyncio.get_running_loop().create_future()
            try:
                self._started.set_result(await self._start())
            except BaseException as exc:
                self._started.set_exception(exc)
        return await asyncio.shield(self._started)

    async def _start(self) -> dict[str, Any]:
        cfg = self.config
        self.declared = cfg.cluster
        reports = await self._spawn_agents(await _alive_nodes())
        if not reports:
            raise RuntimeError("no Ray node runs a Tangram agent (no cores and no GPUs found)")
        cluster = cfg.cluster or cluster_spec(reports, cfg.apis)
        apis = cluster.apis
        calls = {k: v for k, v in builtin_endpoints().items() if k in {a.name for a in apis}}
        calls.update(cfg.endpoints or {})
        cpu = RayCpuExecutor(self.fleet, cluster) if cluster.cpu_nodes else None
        gpu = None
        if cluster.gpu_nodes:
            holder = next((m for m in self.fleet.members() if m.report.gpus is not None), None)
            if holder is None:
                raise RuntimeError("no GPU node of the cluster is up: the services are unknown")
            gpu = RayGpuExecutor(self.fleet, cluster, await holder.handle.catalog.remote())
        runtime = Runtime(cluster, cfg.runtime, cpu=cpu, gpu=gpu, api=ApiExecutor(calls))
        for executor in (cpu, gpu):
            if executor is not None:
                executor.scheduler = runtime.scheduler  # (the core the runtime made)
        runtime.host.loop.timer = time.perf_counter  # the time spent in the core, measured
        self.runtime = runtime
        if cfg.http is not None:
            from tangram.exec.service.server import start_site

            self.runner, self.url = await start_site(runtime, cfg.http)
        else:
            await runtime.start()
        up = {r.name for r in reports}
        for name in sorted(_node_names(cluster) - up):  # declared, not up: fenced till it joins
            self.absent.add(name)
            self._fence(name)
        self._monitor = asyncio.get_running_loop().create_task(self._watch())
        return self.info()

    async def _spawn_agents(self, nodes: list[dict[str, Any]]) -> list[NodeReport]:
        """One agent per node (pinned to it, no Ray CPUs); their reports."""
        import ray
        from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

        agent_cls = ray.remote(NodeAgent)
        settings = {
            "gpu_memory_gb": self.config.gpu_memory_gb,
            "aoe": dict(self.config.aoe),
            "services": self.config.services,
            "torch_threads": self.config.torch_threads,
        }
        handles = []
        for node in nodes:
            labels = node.get("Labels") or {}
            name = node_name(node["NodeID"], labels)
            if self.declared is not None and name not in _node_names(self.declared):
                self.unplaced[node["NodeID"]] = name  # not in the cluster file
                continue
            handle = agent_cls.options(
                num_cpus=0,
                max_concurrency=AGENT_THREADS,
                scheduling_strategy=NodeAffinitySchedulingStrategy(node["NodeID"], soft=False),
                name=f"tangram-agent-{name}-{time.time_ns()}",
                namespace=self.config.namespace,
                # Not owned by this actor: Ray would kill an owned agent with it, AOE's
                # watchdog process too, and leave its containers. A detached agent outlives
                # this actor, sees it gone (``NodeAgent._watch_owner``), removes them, exits.
                lifetime="detached",
            ).remote(
                node["NodeID"],
                labels,
                node["Resources"].get("memory", 0.0),
                settings,
                _declared(self.declared, name),
            )
            handles.append(handle)
        me = ray.get_runtime_context().current_actor
        reports = await asyncio.wait_for(
            asyncio.gather(*(h.describe.remote(me) for h in handles)), AGENT_START_S
        )
        now = time.monotonic()
        out = []
        for report, handle in zip(reports, handles, strict=True):
            if report.cpu_spec() is None and report.gpu_spec() is None:
                ray.kill(handle)
                continue
            self.fleet.add(report, handle, now)
            out.append(report)
        return out

    async def stop(self) -> None:
        """Shut the runtime down (queued actions end, running ones finish), then the agents."""
        if self._monitor is not None:
            self._monitor.cancel()
        if self.runtime is not None and not self.runtime.closing:
            await self.runtime.close()
        if self.runner is not None:
            await self.runner.cleanup()
        import ray

        for member in self.fleet.members():
            if member.alive:
                with contextlib.suppress(Exception):
                    await asyncio.wait_for(member.handle.shutdown.remote(), 60.0)
                with contextlib.suppress(Exception):
                    ray.kill(member.handle)

    async def alive(self) -> bool:
        """The agents' check that their scheduler still runs."""
        return True

    def info(self) -> dict[str, Any]:
        rt = self._rt()
        return {
            "url": self.url,
            "policy": rt.config.policy,
            "cpu_nodes": [n.name for n in rt.cluster.cpu_nodes],
            "gpu_nodes": [n.name for n in rt.cluster.gpu_nodes],
            "api": list(rt.api.endpoints()),
        }

    # ------------------------------------------------------------------ faults
    async def _watch(self) -> None:
        """Ping the agents and read Ray's node table: lose the silent, take back the returned."""
        cfg = self.config
        while True:
            await asyncio.sleep(cfg.ping_every_s)
            try:
                await self._check()
            except Exception:  # noqa: BLE001 - the watch must go on
                log.exception("checking the nodes failed")

    async def _check(self) -> None:
        now = time.monotonic()
        live = [m for m in self.fleet.members() if m.alive]

        async def ping(member: Any) -> None:
            import ray

            try:
                await asyncio.wait_for(member.handle.ping.remote(), self.config.lost_after_s)
                member.last_seen = time.monotonic()
            except (ray.exceptions.RayActorError, ray.exceptions.ActorDiedError) as exc:
                self.fleet.lose(member.report.name, f"its agent died ({type(exc).__name__})")
            except Exception:  # noqa: BLE001 - slow or busy: ``lost_after_s`` decides
                pass

        await asyncio.wait(
            [asyncio.ensure_future(ping(m)) for m in live], timeout=self.config.ping_every_s
        )
        for member in live:
            if member.alive and now - member.last_seen > self.config.lost_after_s:
                silent = now - member.last_seen
                self.fleet.lose(member.report.name, f"its agent did not answer for {silent:.1f} s")
        for member in self.fleet.members():
            if not member.alive:
                self._fence(member.report.name)  # cells freed since by actions that ended
        nodes = await _all_nodes()
        by_id = {n["NodeID"]: n for n in nodes}
        for member in self.fleet.members():
            node = by_id.get(member.report.ray_node)
            if member.alive and node is not None and not node.get("Alive", True):
                self.fleet.lose(member.report.name, "Ray reports its node dead")
        known = {m.report.ray_node for m in self.fleet.members()} | set(self.unplaced)
        for node in nodes:
            if not node.get("Alive") or node["NodeID"] in known:
                continue
            name = node_name(node["NodeID"], node.get("Labels") or {})
            member = self.fleet.by_name.get(name)
            if (member is not None and not member.alive) or name in self.absent:
                await self._join(node)
            elif member is None:
                self.unplaced[node["NodeID"]] = name

    async def _join(self, node: dict[str, Any]) -> None:
        """A node of the cluster (lost, or declared and absent) is up on a Ray node: a new
        agent, the fence lifted, its capacity back in the core."""
        rt = self._rt()
        name = node_name(node["NodeID"], node.get("Labels") or {})
        old = self.fleet.by_name.get(name)
        reports = await self._spawn_agents([node])
        if not reports:
            return
        report = reports[0]
        cpu = rt.scheduler.state.cpu.get(name)
        gpu = rt.scheduler.state.gpu.get(name)
        if (cpu and report.cpu_spec() != cpu.spec) or (gpu and report.gpu_spec() != gpu.spec):
            log.warning("node %s joined with another shape than the cluster's", name)
        if old is None:
            log.warning("node %s joined (it was declared, absent until now)", name)
        self.absent.discard(name)
        self._unfence(report.name)
        if isinstance(rt.gpu, RayGpuExecutor):
            rt.gpu.report(report.name, {})  # a new agent: nothing resident yet
        log.warning("node %s joined again (Ray node %s)", report.name, node["NodeID"])

    def _lost(self, name: str, why: str) -> None:
        task = asyncio.get_running_loop().create_task(self._evacuate(name, why))
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    async def _evacuate(self, name: str, why: str) -> None:
        """The node is gone: fence its memory, end its trajectories' actions, close them."""
        rt = self._rt()
        if isinstance(rt.gpu, RayGpuExecutor) and name in rt.gpu.residency:
            rt.gpu.report(name, {})  # its models went with it
        self._fence(name)
        if name not in rt.scheduler.state.cpu:
            return
        info = ErrorInfo(NODE_LOST, f"node {name} was lost ({why}) before the action started", True)
        doomed = [t for t in rt.trajs.by_id.values() if t.node == name]
        for traj in doomed:
            for rec in list(traj.active.values()):
                if rec.outcome is None and rec.phase in WAITING:
                    rt.host.end_waiting(rec, "error", info)
            self.lost_trajectories[traj.id] = f"lost with node {name}: {why}"
        for traj in doomed:
            with contextlib.suppress(Exception):
                await rt.close_trajectory(traj.id)
        self._fence(name)

    def _fence(self, name: str) -> None:
        """Hold a lost node's free capacity in the core, so nothing is placed there: its free
        container memory (a trajectory that holds it) and its free GPUs (held by a fence;
        a cell a running action holds is fenced when it ends: the watch calls this again)."""
        rt = self._rt()
        state = rt.scheduler.state
        holder = f"~lost~{name}"
        gpus = state.gpu.get(name)
        if gpus is not None:
            for g, owner in enumerate(gpus.owner):
                if owner is None:
                    gpus.take((g,), holder)
        cpu = state.cpu.get(name)
        if cpu is None or cpu.memory_free_gb <= 1e-9:
            return
        self._fence_seq += 1
        fence = f"{holder}~{self._fence_seq}"
        placed = rt.scheduler.open_trajectory(
            fence, rt.host.now(), memory_gb=cpu.memory_free_gb, node=name
        )
        if placed is not None:
            self.fences.setdefault(name, []).append(fence)

    def _unfence(self, name: str) -> None:
        """Give a returned node's capacity back to the core."""
        rt = self._rt()
        holder = f"~lost~{name}"
        gpus = rt.scheduler.state.gpu.get(name)
        if gpus is not None:
            for g, owner in enumerate(gpus.owner):
                if owner == holder:
                    gpus.give((g,), holder)
        for fence in self.fences.pop(name, []):
            rt.host.close_trajectory(fence)  # (a pass over the node: CPU work may start)

    # ------------------------------------------------------------------ the Ray-native API
    async def open_trajectory(self, body: Mapping[str, Any]) -> dict[str, Any]:
        try:
            fields = parse_trajectory(dict(body))
            info = await self._rt().open_trajectory(**fields)
        except LiveError as exc:
            return error_reply(exc)
        self.lost_trajectories.pop(info.id, None)
        return {"value": trajectory_doc(info)}

    async def close_trajectory(self, trajectory: str) -> dict[str, Any]:
        try:
            return {"value": trajectory_doc(await self._rt().close_trajectory(trajectory))}
        except LiveError as exc:
            return error_reply(self._explain(exc, trajectory))

    async def recreate_trajectory(self, trajectory: str) -> dict[str, Any]:
        try:
            return {"value": trajectory_doc(await self._rt().recreate_trajectory(trajectory))}
        except LiveError as exc:
            return error_reply(self._explain(exc, trajectory))

    async def trajectories(self) -> dict[str, Any]:
        return {"value": [trajectory_doc(t) for t in self._rt().trajectories()]}

    async def submit(self, body: Mapping[str, Any]) -> dict[str, Any]:
        try:
            spec, _ = parse_action(dict(body), max_output_bytes=self._max_output())
            return {"value": await self._rt().submit(spec)}
        except LiveError as exc:
            return error_reply(self._explain(exc, body.get("trajectory")))

    async def run(self, body: Mapping[str, Any]) -> dict[str, Any]:
        """Submit and wait: the outcome as the HTTP API's document (the same fields)."""
        try:
            spec, _ = parse_action(dict(body), max_output_bytes=self._max_output())
            rt = self._rt()
            outcome = await rt.result(await rt.submit(spec))
        except LiveError as exc:
            return error_reply(self._explain(exc, body.get("trajectory")))
        assert outcome is not None
        return {"value": outcome_doc(outcome)}

    async def run_spec(self, spec: ActionSpec) -> dict[str, Any]:
        """Submit an ``ActionSpec`` (Python objects: tensors as inputs) and wait: the
        ``Outcome`` itself, for drivers that build specs as the runtime's own callers do."""
        try:
            rt = self._rt()
            return {"value": await rt.result(await rt.submit(spec))}
        except LiveError as exc:
            return error_reply(self._explain(exc, spec.trajectory))

    async def clear_trace(self) -> None:
        """Forget the actions recorded so far (a warm-up's); later ones are recorded."""
        self._rt().clear_trace()

    async def write_trace(self, path: str) -> str:
        """Write the trace so far (format v1) to ``path`` on this actor's node."""
        return str(self._rt().write_trace(path))

    async def result(self, action_id: str, wait_s: float | None = 0.0) -> dict[str, Any]:
        try:
            rt = self._rt()
            outcome = await rt.result(action_id, wait_s)
            return {"value": state_doc(action_id, rt.state(action_id), outcome)}
        except LiveError as exc:
            return error_reply(exc)

    async def cancel(self, action_id: str) -> dict[str, Any]:
        try:
            return {"value": outcome_doc(await self._rt().cancel(action_id))}
        except LiveError as exc:
            return error_reply(exc)

    async def status(self) -> dict[str, Any]:
        """The runtime's status, with each node's agent, loss and fences."""
        rt = self._rt()
        await self._refresh_stats()
        doc = rt.status()
        doc["executors"]["cpu"] = [n.name for n in rt.cluster.cpu_nodes] if rt.cpu else None
        doc["executors"]["gpu"] = [n.name for n in rt.cluster.gpu_nodes] if rt.gpu else None
        doc["nodes"] = {
            m.report.name: {
                "ray_node": m.report.ray_node,
                "alive": m.alive,
                "why": m.why,
                "cores": m.report.cpu_spec().cores if m.report.cpu_spec() else 0,
                "gpus": m.report.gpus.count if m.report.gpus else 0,
                "in_flight": len(m.pending),
                "fenced": bool(self.fences.get(m.report.name)),
            }
            for m in self.fleet.members()
        }
        for name in sorted(self.absent):
            doc["nodes"][name] = {"alive": False, "why": "declared, not up yet", "fenced": True}
        doc["lost_trajectories"] = dict(self.lost_trajectories)
        doc["unplaced_nodes"] = dict(self.unplaced)
        return {"value": doc}

    async def core_figures(self) -> dict[str, float]:
        """Scheduling so far: decisions, passes, and seconds spent in the core (its own rate
        is decisions / core_s; ``tangram bench ray`` reads it before and after a load)."""
        loop = self._rt().host.loop
        return {"decisions": loop.decisions, "passes": loop.passes, "core_s": loop.core_seconds}

    async def agent_handles(self) -> dict[str, Any]:
        """Node name -> its agent's handle (tests and tools read containers, grant logs)."""
        return {m.report.name: m.handle for m in self.fleet.members() if m.alive}

    # ------------------------------------------------------------------ helpers
    async def _refresh_stats(self) -> None:
        rt = self._rt()
        if not isinstance(rt.gpu, RayGpuExecutor):
            return
        for member in self.fleet.members():
            if member.alive and member.report.gpus is not None:
                with contextlib.suppress(Exception):
                    stats = await asyncio.wait_for(member.handle.stats.remote(), 5.0)
                    rt.gpu.eoe.counters[member.report.name] = stats

    def _explain(self, exc: LiveError, trajectory: Any) -> LiveError:
        """A trajectory lost with its node says so (and that it can be reopened)."""
        why = self.lost_trajectories.get(trajectory) if isinstance(trajectory, str) else None
        if why is not None and isinstance(exc, UnknownTrajectory):
            return UnknownTrajectory(
                f"trajectory {trajectory!r} is not open: it was {why}; open it again (it is "
                "placed on another node) and resend its actions"
            )
        return exc

    def _max_output(self) -> int:
        http = self.config.http
        return http.max_output_bytes if http is not None else DEFAULT_MAX_OUTPUT_BYTES

    def _rt(self) -> Runtime:
        if self.runtime is None:
            raise RuntimeError("the scheduler actor is not started: call start() first")
        return self.runtime


def _node_names(cluster: ClusterSpec) -> set[str]:
    return {n.name for n in cluster.cpu_nodes} | {n.name for n in cluster.gpu_nodes}


def _declared(cluster: ClusterSpec | None, name: str) -> tuple[Any, Any]:
    """The cluster file's CPU and GPU specs of node ``name`` (None where it declares none)."""
    if cluster is None:
        return None, None
    cpu = next((n for n in cluster.cpu_nodes if n.name == name), None)
    gpu = next((n for n in cluster.gpu_nodes if n.name == name), None)
    return cpu, gpu


async def _all_nodes() -> list[dict[str, Any]]:
    import ray

    return await asyncio.get_running_loop().run_in_executor(None, ray.nodes)


async def _alive_nodes() -> list[dict[str, Any]]:
    return [n for n in await _all_nodes() if n.get("Alive")]
