"""``NodeAgent``: the Ray actor on each node that runs that node's containers (AOE) and models
(EOE), through the same adapters as the single-node runtime (``CpuExecutor``, ``GpuExecutor``).

It is pinned to its node (``NodeAffinitySchedulingStrategy``, not soft) and holds no Ray CPUs:
Tangram accounts for the cores it grants itself (Ray cannot resize an actor's CPUs). It is
created by the scheduler actor and watches it: when the scheduler actor dies, the agent
removes its containers and exits (and if the agent's own process dies, its AOE watchdog,
``tangram.exec.aoe.reaper``, removes them).
Core numbers in calls are the node's (0..n-1, the scheduler's numbering); the adapter maps
them to host cores.

It is a threaded actor (no ``async`` method): Ray runs each call on one of its threads, which
carries the blocking AOE or EOE call itself (``run_blocking``, ``call_blocking``). Measured
here, a call into an async actor cost about 1 ms more than into a threaded one (its event loop
is one more hand-off), on the path of every CPU and GPU action. Those calls now come over the
direct channel (``serve_direct``, ``channel.py``), each on a thread of its own pool; Ray
carries the rest (describe, ping, stats, shutdown).
"""

from __future__ import annotations

import itertools
import logging
import os
import threading
from collections.abc import Mapping
from typing import Any

from tangram.exec.ray.nodes import (
    GpuPlan,
    NodeReport,
    ServiceEntry,
    core_domains,
    gpu_plan,
    memory_gb,
    node_name,
    online_cores,
)
from tangram.exec.runtime.records import ErrorInfo
from tangram.exec.runtime.result import ExecResult

log = logging.getLogger(__name__)

#: How often an agent checks that its scheduler actor is alive.
WATCH_EVERY_S = 1.0
#: Threads for the direct channel's calls (each running CPU action or GPU call holds one).
DIRECT_THREADS = 256

#: The direct calls that run an action within its time-out (``timeout_s``, their 4th argument).
TIMED = frozenset({"run_cpu", "call_gpu"})

#: Stamps of the residency readings GPU calls' answers carry (one agent per process): a larger
#: stamp is a later reading, so the scheduler keeps the latest in whatever order answers come.
_readings = threading.Lock()
_stamps = itertools.count(1)

#: The agent's concurrency group for the scheduler's control calls (pings, stats, shutdown,
#: pid), with threads of its own (``agents.CONTROL_THREADS``): in the default group they
#: queued behind the calls holding its threads (each CPU action or GPU call sent through Ray
#: holds one for its whole time), so an agent busy with that many actions left its pings
#: unanswered and was lost for it, its actions ending ``node_lost`` though they ran.
CONTROL_GROUP = "control"


def _control(method: Any) -> Any:
    """Run ``method`` in ``CONTROL_GROUP``: what ``ray.method(concurrency_group=...)`` sets
    (this module does not import Ray: importing the package does not)."""
    method.__ray_concurrency_group__ = CONTROL_GROUP
    return method


class NodeAgent:
    """One node's executors (its ``report`` says what it runs); wrapped by ``ray.remote``."""

    def __init__(
        self,
        ray_node: str,
        labels: Mapping[str, str],
        ray_memory_bytes: float,
        settings: Mapping[str, Any],
        declared: tuple[Any, Any] = (None, None),
    ) -> None:
        domains = core_domains(labels, online_cores())
        memory = memory_gb(labels, ray_memory_bytes)
        gpus = gpu_plan(labels, float(settings.get("gpu_memory_gb", 2.0)))
        cpu_decl, gpu_decl = declared  # the cluster file's specs of this node, if any
        if cpu_decl is not None or gpu_decl is not None:  # the file says what runs here
            domains = domains if cpu_decl is not None else ()
            backend = gpus.backend if gpus is not None else "cpu"
            gpus = GpuPlan(gpu_decl.gpus, backend, gpu_decl.gpu_memory_gb) if gpu_decl else None
        self.report = NodeReport(
            ray_node, node_name(ray_node, labels), domains, memory, gpus, cpu_decl, gpu_decl
        )
        self.cpu: Any = None
        self.gpu: Any = None
        self._watch: threading.Thread | None = None
        self._closing = threading.Lock()
        self._direct: Any = None
        cpu_spec, gpu_spec = self.report.cpu_spec(), self.report.gpu_spec()
        if cpu_spec is not None:
            from tangram.exec.aoe import AoeConfig, AoeManager
            from tangram.exec.aoe.topology import NumaTopology
            from tangram.exec.runtime.cpu import CpuExecutor

            config = AoeConfig.for_node(NumaTopology(domains), settings.get("aoe", {}))
            self.cpu = CpuExecutor(_start_aoe(AoeManager, config), cpu_spec)
            prewarm = int(settings.get("prewarm", 0))
            if prewarm > 0:  # made in the background by the warm pool's workers
                from tangram.exec.service.sandbox_fusion import RunCodeSettings

                rc = RunCodeSettings()
                self.cpu.aoe.prewarm(prewarm, image=rc.image, memory_gb=rc.memory_gb)
        if gpu_spec is not None and gpus is not None:
            from tangram.exec.eoe import EoeConfig, EoeManager
            from tangram.exec.runtime.builder import default_services
            from tangram.exec.runtime.gpu import GB, GpuExecutor

            eoe = EoeManager(
                EoeConfig(
                    backend=gpus.backend,
                    devices=gpus.count,
                    device_memory_bytes=int(gpus.memory_gb * GB) if gpus.backend == "cpu" else None,
                )
            )
            threads = settings.get("torch_threads")
            if threads:
                import torch

                torch.set_num_threads(int(threads))
            services = settings.get("services")
            for spec in default_services() if services is None else services:
                eoe.register(spec)
            self.gpu = GpuExecutor(eoe, gpu_spec)

    # -- what the scheduler asks --------------------------------------------------------------

    def describe(self, scheduler: Any = None) -> NodeReport:
        """This node's report; from then on the agent watches ``scheduler`` (its owner)."""
        if scheduler is not None and self._watch is None:
            self._watch = threading.Thread(
                target=self._watch_owner, args=(scheduler,), name="tangram-watch", daemon=True
            )
            self._watch.start()
        return self.report

    def _watch_owner(self, scheduler: Any) -> None:
        """When the scheduler actor is gone (Ray says it died), remove this node's containers
        and exit: a scheduler that restarts makes new agents, so nothing is left behind."""
        import ray

        while True:
            threading.Event().wait(WATCH_EVERY_S)
            try:
                ray.get(scheduler.alive.remote(), timeout=WATCH_EVERY_S * 10)
            except ray.exceptions.ActorUnavailableError:
                # Not gone: unreachable for now (a RayActorError too). Taken for a death, the
                # agent removed its containers and exited, and its node was lost for it.
                continue
            except (ray.exceptions.RayActorError, ray.exceptions.ActorDiedError):
                log.warning("the scheduler actor is gone: node %s shuts down", self.report.name)
                self.shutdown()
                os._exit(0)
            except Exception:  # noqa: BLE001 - busy or slow: ask again
                continue

    def serve_direct(self, key: bytes) -> tuple[str, int]:
        """Listen for the scheduler actor's direct channel (``channel``) on this Ray node's
        address; its address (once: later calls return the same)."""
        if self._direct is None:
            import ray

            from tangram.exec.ray.channel import AgentServer

            host = ray.util.get_node_ip_address()
            self._direct = AgentServer(self._direct_call, host, key, DIRECT_THREADS)
        return self._direct.address

    def _direct_call(self, method: str, args: tuple[Any, ...], waited_s: float = 0.0) -> Any:
        """A direct call, ``waited_s`` after it arrived (the channel's threads all busy). An
        action's time-out (``timeout_s``, its 4th argument) ran meanwhile: it gets what is
        left, and one with nothing left ends as a time-out that never ran. Given its whole
        time-out, an action that waited past it ran after the scheduler had ended it (a
        time-out, 'the node's executor did not report the kill'), the command running with
        no outcome left to give."""
        if method in TIMED and len(args) > 3 and args[3] is not None and waited_s > 0:
            left = args[3] - waited_s
            if left <= 0:
                return self._never_ran(method, waited_s)
            args = (*args[:3], left, *args[4:])
        return getattr(self, method)(*args)

    def _never_ran(self, method: str, waited_s: float) -> Any:
        """The answer of an action whose time-out passed while it waited for a thread here."""
        message = (
            f"it waited {waited_s:.3g} s for a thread on node {self.report.name} and its "
            "time-out passed before it started; it never ran"
        )
        result = ExecResult("timeout", error=ErrorInfo("timeout", message), ran=False)
        if method == "run_cpu":
            return result
        gpu = self.gpu
        residency = dict(gpu.eoe.residency()) if gpu is not None else {}
        with _readings:
            return result, residency, next(_stamps)

    @_control
    def ping(self) -> str:
        return self.report.name

    @_control
    def pid(self) -> int:
        """This agent's process id (fault tests kill it)."""
        return os.getpid()

    def catalog(self) -> dict[str, ServiceEntry]:
        """The GPU services here, as the single-node executor admits them (DoPs, size,
        replicas or layer shards)."""
        if self.gpu is None:
            return {}
        gpu = self.gpu
        return {
            s: ServiceEntry(
                gpu.dops(s),
                gpu.size_gb(s),
                gpu.replicas(s),
                gpu.eoe.info(s).shards,
                gpu.splits_by_batch(s),
            )
            for s in gpu.services()
        }

    # -- containers ---------------------------------------------------------------------------

    def open(self, traj: str, memory: float, image: str | None) -> str | None:
        return self._cpu().aoe.open_trajectory(traj, memory, image=image).container_id

    def close(self, traj: str) -> None:
        self._cpu().aoe.close_trajectory(traj)

    def recreate(self, traj: str) -> str | None:
        return self._cpu().aoe.recreate(traj).container_id

    def containers(self) -> dict[str, str | None]:
        """Open trajectories here -> their container ids."""
        cpu = self._cpu()
        return {t: cpu.container_of(t) for t in cpu.aoe.trajectories()}

    # -- actions ------------------------------------------------------------------------------

    def run_cpu(
        self,
        traj: str,
        command: str | tuple[str, ...],
        cores: tuple[int, ...],
        timeout_s: float,
        env: Mapping[str, str] | None,
        max_output_bytes: int | None,
        weighted: bool = False,
    ) -> ExecResult:
        """Run a command in the trajectory's container on the node's ``cores``; ``weighted``:
        as a CFS weight over the node's cores, not an exclusive cpuset (the runtime's choice,
        ``RayCpuExecutor.weighted``)."""
        return self._cpu().run_blocking(
            traj,
            command,
            cores,
            timeout_s=timeout_s,
            env=env,
            max_output_bytes=max_output_bytes,
            weighted=weighted,
        )

    def call_gpu(
        self,
        service: str,
        inputs: Any,
        gpus: tuple[int, ...],
        timeout_s: float | None = None,
    ) -> tuple[ExecResult, dict[str, tuple[int, ...]], int]:
        """Call a service on the cell ``gpus``, waiting in EOE's queue at most ``timeout_s``
        (what its action has left); the result, the node's residency after it, and the
        reading's stamp (larger: read later; calls end, and are answered, in any order)."""
        gpu = self.gpu
        if gpu is None:
            raise RuntimeError(f"node {self.report.name} runs no GPU executor")
        result = gpu.call_blocking(service, inputs, gpus, timeout_s=timeout_s)
        with _readings:
            return result, dict(gpu.eoe.residency()), next(_stamps)

    @_control
    def stats(self) -> dict[str, Any]:
        """EOE's counters here (restores, evictions), for the status and the trace header."""
        if self.gpu is None:
            return {}
        s = self.gpu.eoe.stats()
        return {
            "backend": self.gpu.eoe.backend,
            "restores": s.restores,
            "bytes_restored": s.bytes_restored,
            "restore_s": s.restore_s,
            "evictions": s.evictions,
            "evict_s": s.evict_s,
            "calls": s.calls,
            "residency": dict(self.gpu.eoe.residency()),
        }

    @_control
    def shutdown(self) -> None:
        """Remove this node's containers and free its devices (once)."""
        with self._closing:
            if self._direct is not None:
                self._direct.close()
            for executor in (self.cpu, self.gpu):
                if executor is not None:
                    executor.shutdown()
            self.cpu = self.gpu = None

    def _cpu(self) -> Any:
        if self.cpu is None:
            raise RuntimeError(f"node {self.report.name} runs no CPU executor")
        return self.cpu


#: Attempts at starting an ``AoeManager`` (see ``_start_aoe``).
AOE_START_ATTEMPTS = 3


def _start_aoe(manager: Any, config: Any) -> Any:
    """``AoeManager(config)``, tried again when its start raced with a container's removal:
    it lists Tangram's containers to remove orphans, then inspects each, and one removed in
    between (by another manager's watchdog: agents of a lost node or of a dead scheduler
    remove theirs as others start) fails the inspection with ``NotFound``."""
    import docker

    for attempt in range(AOE_START_ATTEMPTS):
        try:
            return manager(config)
        except docker.errors.NotFound:
            if attempt == AOE_START_ATTEMPTS - 1:
                raise
            log.warning("AOE's start raced with a container's removal; starting it again")
            threading.Event().wait(0.5)
    raise AssertionError("unreachable")
