"""The cluster's membership as the scheduler actor keeps it: which nodes are up, lost or
absent, and what a loss or a join does to the runtime (``docs/ray.md``, "Faults").

- A node is **lost** when its agent died (a call or a ping fails with Ray's actor error), Ray
  marks it dead, or it has not answered pings for ``lost_after_s``: ``Fleet.lose`` ends its
  calls in flight with ``node_lost``; ``evacuate`` ends its trajectories' waiting actions the
  same way, closes the trajectories (listed in ``lost_trajectories``) and fences the node.
- A **fence** holds a node's free capacity in the core, so nothing is placed there
  (``Scheduler.fence_node``): its free container memory and its free GPUs (a fence holder);
  the cells its ending actions free and the memory its closing containers free go to the
  fence in the same step, before any pass could place work there.
- A node of the cluster that comes up on a Ray node (lost before, or declared by a cluster
  file and absent) **joins**: a new agent, the fence lifted, its capacity back in the core.
- A Ray node under a name the cluster lacks is **adopted** (``RayConfig.join_new_nodes``):
  an agent there, and the CPU and GPU nodes it reports added to the core
  (``Scheduler.add_node``), in the background while the watch goes on.
"""

from __future__ import annotations

import asyncio
import logging
from typing import Any

from tangram.exec.ray import agents
from tangram.exec.ray.channel import new_key
from tangram.exec.ray.config import LABEL_NAME, RayConfig
from tangram.exec.ray.executors import RayCpuExecutor, RayGpuExecutor
from tangram.exec.ray.fleet import NODE_LOST, Fleet
from tangram.exec.ray.nodes import NodeReport, node_name
from tangram.exec.runtime.actions import WAITING
from tangram.exec.runtime.records import ErrorInfo
from tangram.exec.runtime.runtime import Runtime

log = logging.getLogger(__name__)

#: Trajectories kept in ``lost_trajectories`` (the latest lost; an older one's 404 no longer
#: says it was lost with its node).
LOST_KEPT = 10_000

#: The longest pause between two tries at joining a node whose join failed (the pause doubles
#: from ``ping_every_s`` with each failure up to this).
JOIN_RETRY_MAX_S = 60.0


class Membership:
    """The agents (``fleet``), lost and absent nodes, fences, and the watch that updates them."""

    def __init__(self, config: RayConfig, owner: Any) -> None:
        self.config = config
        #: The scheduler actor's handle (the agents watch it).
        self.owner = owner
        self.fleet = Fleet()
        self.fleet.on_lost.append(self._lost)
        self.fleet.on_opened.append(self._opened)
        #: The runtime whose core the fences hold (set once it is made).
        self.runtime: Runtime | None = None
        #: Trajectories lost with their node: id -> why.
        self.lost_trajectories: dict[str, str] = {}
        #: Ray nodes with a name the cluster spec does not have, not used (Ray id -> name):
        #: with ``join_new_nodes`` only while their agent starts, or if it could not.
        self.unplaced: dict[str, str] = {}
        #: Ray nodes being adopted now, and those tried: nothing to run there, or failed.
        self.adopting: set[str] = set()
        #: Ray nodes where a node of the cluster is joining now (its agent starting).
        self.joining: set[str] = set()
        self.tried: set[str] = set()
        #: Ray nodes whose join failed: how many times, and the loop time of the next try.
        self.join_failures: dict[str, tuple[int, float]] = {}
        #: Ray node -> the Tangram name its agent is starting under (a join or an adoption).
        self.starting: dict[str, str] = {}
        #: Ray nodes left because another Ray node has their Tangram name (said once).
        self.clashes: set[str] = set()
        #: Nodes of the cluster file with no Ray node yet (fenced until one joins).
        self.absent: set[str] = set()
        #: The key of the agents' direct channels (``channel``), new for each scheduler.
        self.key = new_key()
        self._tasks: set[asyncio.Task[Any]] = set()

    async def spawn(
        self, nodes: list[dict[str, Any]], *, undeclared: bool = False
    ) -> list[NodeReport]:
        """Agents on ``nodes``, in the fleet; their reports. ``ValueError`` (the agents
        killed) when two of them share a Tangram name: the second replaced the first in the
        fleet, which ran on, detached and unknown."""
        started, unplaced = await agents.spawn(
            nodes, self.config, self.owner, undeclared=undeclared
        )
        names = [report.name for report, _ in started]
        shared = sorted({n for n in names if names.count(n) > 1})
        if shared:  # (as ``cluster_spec`` refuses without a cluster file)
            for report, handle in started:
                _kill_agent(handle, report.name)
            raise ValueError(
                f"two Ray nodes share the Tangram name(s) {shared}: set {LABEL_NAME} on each"
            )
        self.unplaced.update(unplaced)
        members = [self.fleet.add(report, handle) for report, handle in started]
        if self.config.direct_calls:
            await asyncio.gather(*(self.fleet.connect(m, self.key) for m in members))
        return [report for report, _ in started]

    def fence_absent(self, up: set[str]) -> None:
        """Fence the cluster's nodes not in ``up`` (declared, not started yet)."""
        rt = self._rt()
        for name in sorted(agents.node_names(rt.cluster) - up):
            self.absent.add(name)
            self.fence(name)

    def nodes_doc(self) -> dict[str, Any]:
        """Each node: its agent's Ray node, alive or why not, cores, GPUs, calls, fence."""
        doc: dict[str, Any] = {}
        for m in self.fleet.members():
            cpu, gpu = m.report.cpu_spec(), m.report.gpu_spec()
            doc[m.report.name] = {
                "ray_node": m.report.ray_node,
                "alive": m.alive,
                "why": m.why,
                "cores": cpu.cores if cpu else 0,
                "gpus": gpu.gpus if gpu else 0,
                "in_flight": len(m.pending),
                "direct": m.channel is not None and m.channel.closed is None,
                "fenced": self.runtime is not None
                and m.report.name in self.runtime.scheduler.fenced,
            }
        for name in sorted(self.absent):
            doc[name] = {"alive": False, "why": "declared, not up yet", "fenced": True}
        return doc

    # ------------------------------------------------------------------ the watch
    async def watch(self) -> None:
        """Ping the agents and read Ray's node table: lose the silent, take back the returned."""
        while True:
            await asyncio.sleep(self.config.ping_every_s)
            try:
                await self.check()
            except Exception:  # noqa: BLE001 - the watch must go on
                log.exception("checking the nodes failed")

    async def check(self) -> None:
        """One look: ping the live agents (``_ping``, in the background), check the lost
        nodes are fenced, and read Ray's node table for deaths, returns and new nodes."""
        cfg = self.config
        live = [m for m in self.fleet.members() if m.alive]
        for member in live:  # each ping runs to its answer or its time-out, past this check
            self._background(self._ping(member))
        await asyncio.sleep(0)
        for member in self.fleet.members():
            if not member.alive:
                self.fence(member.report.name)  # (the core fenced them at the loss: a no-op)
        nodes = await agents.all_nodes()
        by_id = {n["NodeID"]: n for n in nodes}
        self._forget_gone({n["NodeID"] for n in nodes if n.get("Alive")})
        for member in self.fleet.members():
            node = by_id.get(member.report.ray_node)
            if member.alive and node is not None and not node.get("Alive", True):
                self.fleet.lose(member.report.name, "Ray reports its node dead")
        known = {m.report.ray_node for m in self.fleet.members()}
        known |= self.adopting | self.tried | self.joining
        if not cfg.join_new_nodes:
            known |= set(self.unplaced)
        claimed = self._claimed_names()
        now = asyncio.get_running_loop().time()
        for node in nodes:
            if not node.get("Alive") or node["NodeID"] in known:
                continue
            if self.join_failures.get(node["NodeID"], (0, now))[1] > now:
                continue  # (its join failed: tried again after a pause)
            name = node_name(node["NodeID"], node.get("Labels") or {})
            if name in claimed:
                self._clash(node["NodeID"], name)
                continue
            member = self.fleet.by_name.get(name)
            if (member is not None and not member.alive) or name in self.absent:
                # In the background, as an adoption: an agent's start (torch, Docker, the
                # models) may take minutes, and the watch's pings must go on meanwhile.
                self.joining.add(node["NodeID"])
                self._start_under(node, name, self._join(node))
                claimed.add(name)
            elif member is None:
                self.unplaced[node["NodeID"]] = name
                if cfg.join_new_nodes:
                    self.adopting.add(node["NodeID"])  # (now: the next check skips it)
                    self._start_under(node, name, self.adopt(node))
                    claimed.add(name)

    async def _ping(self, member: Any) -> None:
        """Ping ``member``'s agent; lose its node when the ping goes unanswered for
        ``lost_after_s`` after it was sent, or Ray says the agent died.

        Silence is one ping unanswered for ``lost_after_s`` after it was sent, not the time
        since the last answer this watch took in: when the scheduler's own event loop falls
        behind (a loaded host), answers that arrived meanwhile are taken in before the ping's
        time-out fires, where "now - last answer" counted the watch's own lag and lost every
        node at once (2-21 s on a loaded 2-core machine). Ray's ``ActorUnavailableError``
        (unreachable for now, not dead) is asked again every ``ping_every_s`` within that
        window: taken for a death, a blip lost the node, its actions and trajectories."""
        import ray

        cfg, name = self.config, member.report.name
        loop = asyncio.get_running_loop()
        deadline = loop.time() + cfg.lost_after_s
        how_long = f"{cfg.lost_after_s:g} s"

        def lose(why: str) -> None:  # (not a node lost, or one that joined again, since)
            if member.alive and self.fleet.by_name.get(name) is member:
                self.fleet.lose(name, why)

        while True:
            # Not wait_for: since Python 3.12 it is asyncio.timeout, which cancels the waiting
            # task when its timer fires even where the answer came (while this loop was
            # blocked) and only the task's wake-up was still queued. An ObjectRef's future is
            # wrapped at once (its answer lands without a task step of ours in between).
            answer = asyncio.wrap_future(member.handle.ping.remote().future())
            await asyncio.wait({answer}, timeout=max(0.0, deadline - loop.time()))
            if not answer.done():
                answer.cancel()
                return lose(f"its agent did not answer a ping for {how_long}")
            try:
                answer.result()
                return
            except ray.exceptions.ActorUnavailableError:
                pass  # (below: asked again within the window)
            except (ray.exceptions.RayActorError, ray.exceptions.ActorDiedError) as exc:
                return lose(f"its agent died ({type(exc).__name__})")
            except Exception:  # noqa: BLE001 - a failed ping: the next ones decide
                log.debug("ping of node %s failed", name, exc_info=True)
                return
            await asyncio.sleep(min(cfg.ping_every_s, max(0.0, deadline - loop.time())))
            if loop.time() >= deadline:
                return lose(f"its agent was unreachable for {how_long}")

    def _forget_gone(self, alive: set[str]) -> None:
        """Forget the Ray nodes that are no longer alive (dead, or gone from Ray's table) in
        the watch's lists of nodes not used: a Ray node id is never reused, so its entry can
        never matter again. Kept, status()'s ``unplaced_nodes`` named every dead node for the
        actor's life, and these grew with each node a cluster ever had. (A join or an adoption
        under way keeps its own: it ends by itself.)"""
        busy = self.adopting | self.joining | set(self.starting)
        for ray_id in [r for r in self.unplaced if r not in alive and r not in busy]:
            del self.unplaced[ray_id]
        for ray_id in [r for r in self.join_failures if r not in alive]:
            del self.join_failures[ray_id]
        self.tried &= alive
        self.clashes &= alive

    def _claimed_names(self) -> set[str]:
        """The Tangram names an agent holds (alive) or is starting under: another Ray node
        under one of them is not taken (two agents under one name: the second replaced the
        first in the fleet, the core kept the first's node, and calls went to the other)."""
        alive = {m.report.name for m in self.fleet.members() if m.alive}
        return alive | set(self.starting.values())

    def _clash(self, ray_id: str, name: str) -> None:
        """Ray node ``ray_id`` has a Tangram name another Ray node holds: left, said once."""
        if ray_id not in self.clashes:
            self.clashes.add(ray_id)
            log.warning(
                "Ray node %s has the Tangram name %r of another Ray node: not used (set a "
                "distinct tangram-name label)",
                ray_id,
                name,
            )

    def _start_under(self, node: dict[str, Any], name: str, work: Any) -> None:
        """Run a join or an adoption (``work``) in the background, ``name`` claimed till it ends."""
        ray_id = node["NodeID"]
        self.starting[ray_id] = name
        task = self._background(work)
        task.add_done_callback(lambda _: self.starting.pop(ray_id, None))

    async def _join(self, node: dict[str, Any]) -> None:
        """``join`` from the watch: a failure is logged, and a later check tries again."""
        ray_id = node["NodeID"]
        try:
            await self.join(node)
        except Exception:  # noqa: BLE001 - the watch goes on; a later check tries again
            # After a pause that doubles with each failure: tried at every check, a node whose
            # agent cannot start (a label it refuses, a start that times out) had an agent
            # process started and killed every ping_every_s for as long as it stayed up.
            failures = self.join_failures.get(ray_id, (0, 0.0))[0] + 1
            pause = min(JOIN_RETRY_MAX_S, self.config.ping_every_s * 2**failures)
            self.join_failures[ray_id] = (failures, asyncio.get_running_loop().time() + pause)
            log.exception(
                "node %s could not join (tried again in %g s)",
                node_name(ray_id, node.get("Labels") or {}),
                pause,
            )
        else:
            self.join_failures.pop(ray_id, None)
        finally:
            self.joining.discard(ray_id)

    async def join(self, node: dict[str, Any]) -> None:
        """A node of the cluster (lost, or declared and absent) is up on a Ray node: a new
        agent, the fence lifted, its capacity back in the core."""
        rt = self._rt()
        name = node_name(node["NodeID"], node.get("Labels") or {})
        old = self.fleet.by_name.get(name)
        # (undeclared: the core has the node, declared by the file or adopted since)
        reports = await self.spawn([node], undeclared=True)
        if not reports:  # nothing to run there: tried once (joined again, an agent per check)
            self.tried.add(node["NodeID"])
            return
        report = reports[0]
        cpu = rt.scheduler.state.cpu.get(name)
        gpu = rt.scheduler.state.gpu.get(name)
        short = short_of(report, cpu.spec if cpu else None, gpu.spec if gpu else None)
        self.absent.discard(name)
        if short:
            # The core keeps the node's shape: joined, it granted cores the agent refuses
            # (every such action an executor error) and cells of GPUs its EOE lacks.
            self.tried.add(node["NodeID"])
            self.fleet.lose(name, f"it came up smaller than the cluster's node ({short})")
            log.error(
                "node %s came up on Ray node %s smaller than the cluster's node (%s): not "
                "joined, it stays lost (start it with the cluster's shape)",
                name,
                node["NodeID"],
                short,
            )
            return
        if (cpu and report.cpu_spec() != cpu.spec) or (gpu and report.gpu_spec() != gpu.spec):
            log.warning("node %s joined with another shape than the cluster's", name)
        self.unfence(report.name)
        if isinstance(rt.gpu, RayGpuExecutor):
            rt.gpu.report(report.name, {})  # a new agent: nothing resident yet
        how = "again" if old is not None else "for the first time (declared, absent till now)"
        log.warning("node %s joined %s on Ray node %s", name, how, node["NodeID"])

    async def adopt(self, node: dict[str, Any]) -> None:
        """A Ray node the cluster lacks is up: an agent there, and the CPU and GPU nodes it
        reports added to the core (``Scheduler.add_node``, under the node's Tangram name),
        so work waiting for room may start there; tried once per Ray node."""
        ray_id = node["NodeID"]
        name = self.unplaced.get(ray_id) or node_name(ray_id, node.get("Labels") or {})
        self.adopting.add(ray_id)
        try:
            reports = await self.spawn([node], undeclared=True)
        except Exception as exc:  # noqa: BLE001 - it stays unplaced, the watch goes on
            log.warning("node %s (Ray node %s): no agent started there: %s", name, ray_id, exc)
            return
        finally:
            self.adopting.discard(ray_id)
            self.tried.add(ray_id)
        rt = self._rt()
        if not reports or rt.closing:
            self.unplaced.pop(ray_id, None)  # nothing to run there (or shutting down)
            return
        try:
            added = self.add_to_core(reports[0])
        except Exception:  # noqa: BLE001 - a core that refuses it: it stays unplaced
            log.exception("node %s (Ray node %s) could not be added to the core", name, ray_id)
            return
        if added:
            self.unplaced.pop(ray_id, None)
        log.warning("node %s joined on Ray node %s: %s added", name, ray_id, added or "nothing")

    def add_to_core(self, report: NodeReport) -> list[str]:
        """The report's CPU and GPU nodes in the core and the executors (those of a kind this
        runtime has an executor for); what was added."""
        rt = self._rt()
        added = []
        for kind, spec, executor in (
            ("cpu", report.cpu_spec(), rt.cpu),
            ("gpu", report.gpu_spec(), rt.gpu),
        ):
            if spec is None:
                continue
            if executor is None:
                log.warning("node %s: this runtime has no %s executor: not used", spec.name, kind)
                continue
            rt.host.loop.add_node(spec, rt.host.now())
            rt.cluster = rt.scheduler.cluster
            if isinstance(executor, RayGpuExecutor):
                executor.add_node(rt.cluster, spec.name)
            elif isinstance(executor, RayCpuExecutor):
                executor.add_node(rt.cluster)
            added.append(kind)
        if "cpu" in added:
            self._background(rt.trajs._notify_capacity())  # opens waiting for room: retry
        return added

    # ------------------------------------------------------------------ a loss
    def _lost(self, name: str, why: str) -> None:
        member = self.fleet.by_name.get(name)
        if member is not None:
            _kill_agent(member.handle, name)
        if self.runtime is not None:
            # Now, not in the evacuation's task: the calls told node_lost just now end before
            # it runs, and their cells (or a failed open's memory) went back to the core, whose
            # pass started queued GPU calls there (never sent, ending node_lost) while a node
            # alive had room.
            self.fence(name)
        self._background(self.evacuate(name, why))

    def _opened(self, name: str, trajectory: str) -> None:
        """A trajectory lost with its node is open again (reopened by the Ray-native API or
        over HTTP): no longer lost. Only the Ray-native open took it off the list, so one
        reopened over HTTP stayed listed as lost while open, and once closed its 404s said
        it was lost with its node."""
        self.lost_trajectories.pop(trajectory, None)

    def cancel_background(self) -> None:
        """Cancel the pings and adoptions in flight (at shutdown)."""
        for task in list(self._tasks):
            task.cancel()

    def _background(self, work: Any) -> asyncio.Task[Any]:
        """Run ``work`` (a coroutine) on the actor's loop, kept until it ends; its task."""
        task = asyncio.get_running_loop().create_task(work)
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)
        return task

    async def evacuate(self, name: str, why: str) -> None:
        """The node is gone: fence its memory, end its trajectories' actions, close them, and
        fence what they freed unless the node joined again meanwhile (its fence would stay)."""
        rt = self._rt()
        if isinstance(rt.gpu, RayGpuExecutor) and name in rt.gpu.residency:
            rt.gpu.report(name, {})  # its models went with it
        self.fence(name)
        if name not in rt.scheduler.state.cpu:
            return
        info = ErrorInfo(NODE_LOST, f"node {name} was lost ({why}) before the action started", True)
        doomed = [t for t in rt.trajs.by_id.values() if t.node == name]
        for traj in doomed:
            for rec in list(traj.active.values()):
                if rec.outcome is None and rec.phase in WAITING:
                    rt.host.end_waiting(rec, "error", info)
            if not traj.ephemeral:  # (a /run_code container: private, its id never reused)
                self._list_lost(traj.id, f"lost with node {name}: {why}")
        # At once: a close waits for its trajectory's running actions (a GPU call elsewhere
        # may run for minutes), and one after another left the others open meanwhile,
        # accepting actions that could only end node_lost.
        await asyncio.gather(*(rt.close_trajectory(t.id) for t in doomed), return_exceptions=True)
        if not self.fleet.alive(name):  # (a close waits for running actions: it may be back)
            self.fence(name)

    def _list_lost(self, trajectory: str, why: str) -> None:
        """List ``trajectory`` as lost, keeping the latest ``LOST_KEPT``: an entry goes only
        when its id is opened again, and trajectories whose ids are never reused (one per
        episode) piled up over the actor's life with every node lost, each ``status()``
        sending all of them."""
        lost = self.lost_trajectories
        lost.pop(trajectory, None)  # (listed again: the latest)
        lost[trajectory] = why
        while len(lost) > LOST_KEPT:
            del lost[next(iter(lost))]

    def fence(self, name: str) -> None:
        """Hold a lost (or absent) node's free capacity in the core, so nothing is placed
        there (``Scheduler.fence_node``): its free container memory and its free GPUs, and
        what its ending actions and closing containers give back from now on."""
        rt = self._rt()
        state = rt.scheduler.state
        if name in state.cpu or name in state.gpu:
            rt.scheduler.fence_node(name, f"~lost~{name}")

    def unfence(self, name: str) -> None:
        """Give a returned node's capacity back to the core: queued GPU calls and containers
        waiting for memory may start there at once, and the opens waiting for room are told."""
        rt = self._rt()
        if name not in rt.scheduler.fenced or rt.closing:
            return
        rt.host.loop.unfence_node(name, rt.host.now())
        self._background(rt.trajs._notify_capacity())

    def _rt(self) -> Runtime:
        if self.runtime is None:
            raise RuntimeError("the scheduler actor is not started: call start() first")
        return self.runtime


def short_of(report: NodeReport, cpu: Any, gpu: Any) -> str:
    """What ``report`` lacks of the core's CPU and GPU specs of its node (``cpu``, ``gpu``:
    None where the core has none) that its agent could not serve: cores, GPUs; '' if
    nothing. (Memory is not: without a label it is Ray's reading of the node's free memory
    at its start, a little different at each start.)"""
    missing = []
    found_cpu, found_gpu = report.cpu_spec(), report.gpu_spec()
    if cpu is not None:
        if found_cpu is None:
            missing.append("no container cores")
        elif found_cpu.cores < cpu.cores:
            missing.append(f"{found_cpu.cores} cores, not {cpu.cores}")
    if gpu is not None:
        if found_gpu is None:
            missing.append("no GPUs")
        elif found_gpu.gpus < gpu.gpus:
            missing.append(f"{found_gpu.gpus} GPUs, not {gpu.gpus}")
    return "; ".join(missing)


def _kill_agent(handle: Any, name: str) -> None:
    """Kill a lost node's agent. One lost to silence (a stall) still ran, detached: the actions
    told ``node_lost`` ran on beside their resends, and the containers of its trajectories
    (closed without a call to it) stayed until the scheduler actor died. Killed, its AOE
    watchdog removes them; for an agent or node already dead this does nothing."""
    import ray

    if not ray.is_initialized():  # (no Ray here: no actor to kill; ray.kill would start one)
        return
    try:
        ray.kill(handle)
    except Exception as exc:  # noqa: BLE001 - gone already, or Ray cannot reach it now
        log.debug("killing the agent of lost node %s: %s", name, exc)
