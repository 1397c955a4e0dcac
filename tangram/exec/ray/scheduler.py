"""``SchedulerActor``: the one scheduler of a Ray cluster, in a named, detached async actor.

It runs the same ``Runtime`` as ``tangram serve`` (the ``Scheduler`` and its policy through
``DriverLoop`` and ``LiveHost``; admission, idempotent ids, outcomes, trace), with executors
that send each start to the node agent of the node the core chose (``executors``). One
``NodeAgent`` per Ray node, created pinned to its node (detached: each watches this actor
and removes its containers when it is gone). Optionally it
serves the HTTP API itself (``RayConfig.http``), so ``/v1/...`` and ``/run_code`` reach the
runtime with no extra hop; frameworks on Ray call its methods instead (``client``).

Which nodes are up, lost or absent, and what a loss or a join does, is ``membership``'s
(``docs/ray.md``, "Faults").
"""

from __future__ import annotations

import asyncio
import contextlib
import gc
import logging
import math
import time
from collections.abc import Mapping
from typing import Any

from tangram.exec.ray import agents
from tangram.exec.ray.config import RayConfig
from tangram.exec.ray.executors import RayCpuExecutor, RayGpuExecutor
from tangram.exec.ray.membership import Membership
from tangram.exec.ray.nodes import cluster_spec
from tangram.exec.runtime.api import ApiExecutor, builtin_endpoints
from tangram.exec.runtime.errors import BadRequest, LiveError, UnknownTrajectory
from tangram.exec.runtime.records import ActionSpec, is_finite_number
from tangram.exec.runtime.runtime import Runtime
from tangram.exec.service.body import depth_problem
from tangram.exec.service.limits import DEFAULT_MAX_OUTPUT_BYTES
from tangram.exec.service.schema import (
    outcome_doc,
    parse_action,
    parse_trajectory,
    require_object,
    state_doc,
    trajectory_doc,
)

log = logging.getLogger(__name__)


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


def _reply_of(reply: dict[str, Any] | BaseException) -> dict[str, Any]:
    """One ``run`` of a ``run_many``: its reply, or the exception it raised as an ``internal``
    error (as the HTTP API's 500; not retryable: the action may have been accepted)."""
    if not isinstance(reply, BaseException):
        return reply
    if not isinstance(reply, Exception):
        raise reply
    log.error("a run of run_many failed", exc_info=reply)
    message = f"internal error: {type(reply).__name__}: {reply}"[:1000]
    return {
        "error": {"code": "internal", "message": message, "retryable": False, "retry_after_s": None}
    }


def _object(body: Any, what: str) -> dict[str, Any]:
    """A document the actor's caller sent, as a dict; a ``BadRequest`` naming ``what`` when
    it is no object (``dict()`` of a string or a list raised a bare ``ValueError``), or when
    it nests deeper than an HTTP body may (a Ray caller's dict never passed the JSON reader's
    bound: a payload nested a few hundred deep raised ``RecursionError`` here)."""
    doc = dict(require_object(body, what))
    problem = depth_problem(doc)
    if problem is not None:
        raise BadRequest(problem)
    return doc


def _trajectory_of(body: Any) -> Any:
    return body.get("trajectory") if isinstance(body, Mapping) else None


def _check_id(action_id: Any) -> None:
    if not isinstance(action_id, str):
        raise BadRequest(f"action id: expected a string, got {type(action_id).__name__}")


def _check_trajectory(trajectory: Any) -> None:
    """A trajectory id a Ray caller named must be a string: a list or dict raised
    ``TypeError`` (unhashable) out of the runtime's lookup, a bare Ray error to the caller."""
    if not isinstance(trajectory, str):
        raise BadRequest(f"trajectory id: expected a string, got {type(trajectory).__name__}")


def settle_heap() -> None:
    """Keep what is alive once the actor serves (Ray's and Tangram's modules, the runtime:
    ~250,000 objects) out of the collector's full passes, which otherwise scan it all once per
    few thousand actions (0.1-0.2 s here, every request waiting): ``gc.freeze``."""
    gc.collect()
    gc.freeze()


#: Seconds a GPU node's agent has to list its services at the scheduler's start.
CATALOG_S = 60.0


async def catalog_of(member: Any) -> dict[str, Any]:
    """The GPU services of ``member``'s agent (``NodeAgent.catalog``); ``RuntimeError`` naming
    the node when it does not answer within ``CATALOG_S`` (the start would wait for ever)."""
    try:
        return await asyncio.wait_for(member.handle.catalog.remote(), CATALOG_S)
    except TimeoutError:
        raise RuntimeError(
            f"the agent of GPU node {member.report.name!r} did not list its services within "
            f"{CATALOG_S:g} s: the scheduler cannot start without them"
        ) from None


#: Seconds a GPU agent has to send its EOE counters for a ``status``.
STATS_S = 5.0
#: Seconds an agent has to shut down at the scheduler's stop (then it is killed all the same).
AGENT_SHUTDOWN_S = 60.0


async def _shut_down(handle: Any) -> None:
    """Ask one agent to shut down (its containers removed), then kill it, whatever it said."""
    import ray

    with contextlib.suppress(Exception):
        await asyncio.wait_for(handle.shutdown.remote(), AGENT_SHUTDOWN_S)
    with contextlib.suppress(Exception):
        ray.kill(handle)


class SchedulerActor:
    """The scheduler of the cluster and its agents (wrapped by ``ray.remote`` in ``service``)."""

    def __init__(self, config: RayConfig) -> None:
        self.config = config
        #: Agents, lost and absent nodes, fences (``membership``).
        self.members = Membership(config, owner=None)
        self.fleet = self.members.fleet
        self.runtime: Runtime | None = None
        self.url: str | None = None
        self.runner: Any = None
        self._started: asyncio.Future[dict[str, Any]] | None = None
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
        import ray

        self.members.owner = ray.get_runtime_context().current_actor  # the agents watch it
        reports = await self.members.spawn(await agents.alive_nodes())
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
            gpu = RayGpuExecutor(self.fleet, cluster, await catalog_of(holder))
        runtime = Runtime(cluster, cfg.runtime, cpu=cpu, gpu=gpu, api=ApiExecutor(calls))
        for executor in (cpu, gpu):
            if executor is not None:
                executor.scheduler = runtime.scheduler  # (the core the runtime made)
        runtime.host.loop.timer = time.perf_counter  # the time spent in the core, measured
        self.runtime = self.members.runtime = runtime
        if cfg.http is not None:
            from tangram.exec.service.server import start_site

            self.runner, self.url = await start_site(runtime, cfg.http)
        else:
            await runtime.start()
        self.members.fence_absent({r.name for r in reports})
        self._monitor = asyncio.get_running_loop().create_task(self.members.watch())
        settle_heap()
        return self.info()

    async def stop(self) -> None:
        """Shut the runtime down (queued actions end, running ones finish), then the agents."""
        if self._monitor is not None:
            self._monitor.cancel()
        self.members.cancel_background()  # pings in flight would "lose" the agents it stops
        try:
            try:
                if self.runtime is not None and not self.runtime.closing:
                    await self.runtime.close()
            finally:
                if self.runner is not None:
                    await self.runner.cleanup()
        except BaseException:
            # The agents (their containers, their models' host backups) go regardless: they
            # are detached, and would otherwise outlive the actor's kill.
            log.exception("closing the runtime failed; stopping the agents anyway")
            raise
        finally:
            await self._stop_agents()

    async def _stop_agents(self) -> None:
        """Close the direct channels; shut every live agent down and kill it. All are asked at
        once, each for up to ``AGENT_SHUTDOWN_S``: asked one after another, two hung agents
        took past ``service.stop``'s time-out, the actor was killed mid-stop, and the agents
        after them were left (detached) with their containers."""
        self.fleet.close_channels()
        live = [m for m in self.fleet.members() if m.alive]
        await asyncio.gather(*(_shut_down(m.handle) for m in live))

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

    # ------------------------------------------------------------------ the Ray-native API
    async def open_trajectory(self, body: Mapping[str, Any]) -> dict[str, Any]:
        try:
            fields = parse_trajectory(None if body is None else _object(body, "a trajectory"))
            info = await self._rt().open_trajectory(**fields)
        except LiveError as exc:
            return error_reply(exc)  # (node_lost: the executor's own, 503 retryable)
        return {"value": trajectory_doc(info)}

    async def close_trajectory(self, trajectory: str) -> dict[str, Any]:
        try:
            rt = self._rt()
            _check_trajectory(trajectory)
            info = await rt.close_trajectory(rt.public_trajectory(trajectory))
            return {"value": trajectory_doc(info)}
        except LiveError as exc:
            return error_reply(self._explain(exc, trajectory))

    async def recreate_trajectory(self, trajectory: str) -> dict[str, Any]:
        try:
            rt = self._rt()
            _check_trajectory(trajectory)
            info = await rt.recreate_trajectory(rt.public_trajectory(trajectory))
            return {"value": trajectory_doc(info)}
        except LiveError as exc:
            return error_reply(self._explain(exc, trajectory))

    async def trajectories(self) -> dict[str, Any]:
        return {"value": [trajectory_doc(t) for t in self._rt().public_trajectories()]}

    async def submit(self, body: Mapping[str, Any]) -> dict[str, Any]:
        try:
            spec, _ = parse_action(_object(body, "an action"), max_output_bytes=self._max_output())
            rt = self._rt()
            rt.public_trajectory(spec.trajectory)
            return {"value": await rt.submit(spec)}
        except LiveError as exc:
            return error_reply(self._explain(exc, _trajectory_of(body)))

    async def run(self, body: Mapping[str, Any]) -> dict[str, Any]:
        """Submit and wait: the outcome as the HTTP API's document (the same fields)."""
        try:
            spec, _ = parse_action(_object(body, "an action"), max_output_bytes=self._max_output())
            rt = self._rt()
            rt.public_trajectory(spec.trajectory)
            outcome = await rt.result(await rt.submit(spec))
        except LiveError as exc:
            return error_reply(self._explain(exc, _trajectory_of(body)))
        assert outcome is not None
        return {"value": outcome_doc(outcome)}

    async def run_many(self, bodies: list[Mapping[str, Any]]) -> list[dict[str, Any]]:
        """``run`` for each document, in one actor call; the replies in order, once all ended.
        A document whose ``run`` raises gets an ``internal`` error reply of its own: raising
        failed the whole call, the others' outcomes lost while they ran (and a caller
        resending the batch with new ids ran them twice). ``bodies`` that are no list (or
        tuple) get one ``bad_request`` reply naming it: None raised ``TypeError`` out of the
        actor, and a dict ran its keys, a string its characters."""
        if not isinstance(bodies, list | tuple):
            what = type(bodies).__name__
            problem = f"run_many: expected a list of action documents, got {what}"
            return [error_reply(BadRequest(problem))]
        replies = await asyncio.gather(*(self.run(body) for body in bodies), return_exceptions=True)
        return [_reply_of(r) for r in replies]

    async def run_spec(self, spec: ActionSpec) -> dict[str, Any]:
        """Submit an ``ActionSpec`` (Python objects: tensors as inputs) and wait: the
        ``Outcome`` itself, for drivers that build specs as the runtime's own callers do."""
        try:
            rt = self._rt()
            if not isinstance(spec, ActionSpec):
                raise BadRequest(
                    f"run_spec: expected an ActionSpec, got {type(spec).__name__} (documents "
                    "go to run)"
                )
            rt.public_trajectory(spec.trajectory)
            return {"value": await rt.result(await rt.submit(spec))}
        except LiveError as exc:
            return error_reply(self._explain(exc, getattr(spec, "trajectory", None)))

    async def clear_trace(self) -> None:
        """Forget the actions recorded so far (a warm-up's); later ones are recorded."""
        self._rt().clear_trace()

    async def write_trace(self, path: str) -> str:
        """Write the trace so far (format v1) to ``path`` on this actor's node."""
        return str(self._rt().write_trace(path))

    async def result(self, action_id: str, wait_s: float | None = 0.0) -> dict[str, Any]:
        try:
            rt = self._rt()
            _check_id(action_id)
            if wait_s is not None and not (
                wait_s == math.inf or (is_finite_number(wait_s) and wait_s >= 0)
            ):  # (inf: until the outcome)
                raise BadRequest(f"wait_s: expected seconds >= 0 or None, got {wait_s!r}"[:300])
            outcome = await rt.result(rt.public_action(action_id), wait_s)
            return {"value": state_doc(action_id, rt.state(action_id), outcome)}
        except LiveError as exc:
            return error_reply(exc)

    async def cancel(self, action_id: str) -> dict[str, Any]:
        try:
            rt = self._rt()
            _check_id(action_id)
            return {"value": outcome_doc(await rt.cancel(rt.public_action(action_id)))}
        except LiveError as exc:
            return error_reply(exc)

    async def status(self) -> dict[str, Any]:
        """The runtime's status, with each node's agent, loss and fences."""
        rt = self._rt()
        await self._refresh_stats()
        doc = rt.status()
        doc["executors"]["cpu"] = [n.name for n in rt.cluster.cpu_nodes] if rt.cpu else None
        doc["executors"]["gpu"] = [n.name for n in rt.cluster.gpu_nodes] if rt.gpu else None
        doc["nodes"] = self.members.nodes_doc()
        doc["lost_trajectories"] = dict(self.members.lost_trajectories)
        doc["unplaced_nodes"] = dict(self.members.unplaced)
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
        """Each live GPU agent's EOE counters, all asked at once (one after another, n
        stalled nodes made a status take n times ``STATS_S``); a node that does not answer
        within ``STATS_S`` keeps its last ones."""
        rt = self._rt()
        gpu = rt.gpu
        if not isinstance(gpu, RayGpuExecutor):
            return

        async def refresh(member: Any) -> None:
            with contextlib.suppress(Exception):
                stats = await asyncio.wait_for(member.handle.stats.remote(), STATS_S)
                gpu.eoe.counters[member.report.name] = stats

        held = [m for m in self.fleet.members() if m.alive and m.report.gpus is not None]
        await asyncio.gather(*(refresh(m) for m in held))

    def _explain(self, exc: LiveError, trajectory: Any) -> LiveError:
        """A trajectory lost with its node says so (and that it can be reopened)."""
        lost = self.members.lost_trajectories
        why = lost.get(trajectory) if isinstance(trajectory, str) else None
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
