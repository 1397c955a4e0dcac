"""``Runtime``: the live driver of the scheduler core, on asyncio, with real executors.

Data flows one way, as in the simulator: event -> core -> decision -> executor -> event.

- Events are trajectory opens and closes, action submissions and action completions. Those
  that happen during one event-loop iteration are coalesced: the first schedules a flush with
  ``loop.call_soon``, and the flush hands every pending completion and arrival to the core in
  one ``Scheduler.advance`` call (one scheduling pass, as the simulator does for one instant).
- Decisions are carried out at once: a ``Start`` runs the action on its executor (AOE in a
  worker thread on the granted cores, EOE in a worker thread on the granted cell, an API
  callable on the loop); a ``Reject`` becomes the action's error; a ``Defer`` is counted.
- Completions come back to the loop (``run_in_executor`` futures), become one ``finish``
  event each, and give the action its outcome.

Every accepted action ends with exactly one ``Outcome`` (result, error or timeout) carrying
its timings. Admission control bounds the actions pending (accepted, not yet ended): beyond
``max_pending`` a submission is refused at once with ``Overloaded`` (retryable, nothing was
accepted), never left to time out. Submissions are idempotent by id.

An action that times out or is cancelled while queued gets its outcome at once and is
withdrawn from the core's queue (``Scheduler.withdraw``). One still arriving (not yet handed
to the core) is submitted with its outcome already set: if the core starts it, the runtime
reports it finished in the next pass without running it.
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import logging
import time
import uuid
from collections import Counter, deque
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from tangram.core.action import Action, ActionError
from tangram.core.decision import Decision, Defer, Reject, Start
from tangram.core.policies import make_policy
from tangram.core.resources import ClusterSpec, ResourceKind
from tangram.core.scheduler import Scheduler
from tangram.exec.runtime.api import ApiExecutor
from tangram.exec.runtime.config import RuntimeConfig
from tangram.exec.runtime.cpu import CpuExecutor
from tangram.exec.runtime.discovery import cluster_to_dict
from tangram.exec.runtime.errors import (
    BadRequest,
    CapacityShort,
    Conflict,
    ExecutorMissing,
    LiveError,
    NotCancellable,
    Overloaded,
    ShuttingDown,
    UnknownAction,
    UnknownTrajectory,
)
from tangram.exec.runtime.gpu import GpuExecutor
from tangram.exec.runtime.recorder import RecordedAction, TraceRecorder
from tangram.exec.runtime.records import (
    ActionSpec,
    ApiWork,
    CpuWork,
    ErrorInfo,
    GpuWork,
    Outcome,
    Timings,
    TrajectoryInfo,
    check_id,
)
from tangram.exec.runtime.result import ExecResult, failed
from tangram.sim.trace import Trace

log = logging.getLogger(__name__)

#: Where an action is, from the core's point of view.
ARRIVING, QUEUED, RUNNING, FINISHING, OUT = "arriving", "queued", "running", "finishing", "out"


@dataclass(eq=False)
class _Live:
    """Mutable state of one accepted action (loop thread only)."""

    id: str
    seq: int
    spec: ActionSpec
    action: Action
    traj: str
    fingerprint: str
    arrival: float
    deadline: float
    future: asyncio.Future[Outcome]
    max_units: int
    size_gb: float
    memory_gb: float
    phase: str = ARRIVING
    start: Start | None = None
    started_at: float | None = None
    task: asyncio.Task[None] | None = None
    timers: list[asyncio.TimerHandle] = field(default_factory=list)
    outcome: Outcome | None = None
    #: Set before cancelling an API task: how the action ends (timeout or cancelled).
    interrupt: tuple[str, ErrorInfo] | None = None
    deferrals: int = 0


@dataclass(eq=False)
class _Traj:
    """An open trajectory: its container and the actions of it not yet out of the core."""

    id: str
    node: str | None
    memory_gb: float
    image: str | None
    opened_at: float
    ephemeral: bool
    state: str = "opening"  # opening | open | closing
    container: str | None = None
    ready: asyncio.Future[None] | None = None
    active: dict[str, _Live] = field(default_factory=dict)


class Runtime:
    """The live runtime: one scheduler core, its policy, and the executors that carry it out.

    Use ``async with Runtime(...)`` (or ``await start()`` / ``await close()``). Executors are
    optional: a runtime without ``cpu`` refuses CPU work with ``ExecutorMissing``, and so on.
    """

    def __init__(
        self,
        cluster: ClusterSpec,
        config: RuntimeConfig | None = None,
        *,
        cpu: CpuExecutor | None = None,
        gpu: GpuExecutor | None = None,
        api: ApiExecutor | None = None,
    ) -> None:
        self.cluster = cluster
        self.config = config or RuntimeConfig()
        self.policy = make_policy(self.config.policy)
        self.scheduler = Scheduler(cluster, self.policy)
        if cpu is not None and cpu.node.name not in {n.name for n in cluster.cpu_nodes}:
            raise ValueError(f"CPU executor's node {cpu.node.name!r} is not in the cluster")
        if gpu is not None and (
            len(cluster.gpu_nodes) != 1 or cluster.gpu_nodes[0].name != gpu.node.name
        ):
            raise ValueError(
                "a live runtime drives one GPU node: the cluster must describe exactly the "
                f"GPU executor's node {gpu.node.name!r} (scale-out is not implemented)"
            )
        self.cpu, self.gpu, self.api = cpu, gpu, api or ApiExecutor()
        self.recorder = TraceRecorder()
        self.on_outcome: list[Callable[[Outcome], None]] = []
        self.on_refused: list[Callable[[str], None]] = []
        self._loop: asyncio.AbstractEventLoop | None = None
        self._t0 = 0.0
        self._started_unix = 0.0
        self._actions: dict[str, _Live] = {}
        self._done_order: deque[str] = deque()
        self._trajs: dict[str, _Traj] = {}
        self._arrivals: list[_Live] = []
        self._finishes: list[_Live] = []
        self._flush_scheduled = False
        self._tick_due = False
        self._wake_timer: asyncio.TimerHandle | None = None
        self._wake_at: float | None = None
        self._capacity: asyncio.Condition | None = None
        self._seq = itertools.count(1)
        self._pending = 0
        self._closing = False
        self._closed: asyncio.Event | None = None
        self.counters: Counter[str] = Counter()
        self.passes = 0
        #: GPU services resident when the recording began (the replay starts warm if any).
        self._residency_at_record_start: dict[str, tuple[int, ...]] = {}

    # ------------------------------------------------------------------ lifecycle
    async def start(self) -> Runtime:
        if self._loop is not None:
            return self
        self._loop = asyncio.get_running_loop()
        self._t0 = self._loop.time()
        self._started_unix = time.time()
        self._capacity = asyncio.Condition()
        self._closed = asyncio.Event()
        return self

    async def __aenter__(self) -> Runtime:
        return await self.start()

    async def __aexit__(self, *exc: object) -> None:
        await self.close()

    def now(self) -> float:
        """Seconds since the runtime started (the clock of every event and outcome)."""
        return self._require_loop().time() - self._t0

    def _require_loop(self) -> asyncio.AbstractEventLoop:
        if self._loop is None:
            raise RuntimeError("the runtime is not started: use 'async with' or await start()")
        return self._loop

    @property
    def closing(self) -> bool:
        return self._closing

    @property
    def pending(self) -> int:
        """Actions accepted and not yet ended (what admission control bounds)."""
        return self._pending

    @property
    def open_trajectories(self) -> int:
        return len(self._trajs)

    async def close(self, grace_s: float | None = None) -> None:
        """Stop: refuse new work, end queued actions, let running ones finish (``grace_s``),
        write the trace if configured, remove the containers and stop the executors."""
        self._require_loop()
        assert self._closed is not None
        if self._closing:
            await self._closed.wait()
            return
        self._closing = True
        grace = self.config.close_grace_s if grace_s is None else grace_s
        for rec in list(self._actions.values()):
            if rec.outcome is None and rec.phase in (ARRIVING, QUEUED):
                self._end(
                    rec,
                    "error",
                    error=ErrorInfo("shutting_down", ShuttingDown().message, retryable=True),
                )
        running = [
            r.task for r in self._actions.values() if r.task is not None and not r.task.done()
        ]
        if running:
            _, late = await asyncio.wait(running, timeout=grace)
            for rec in list(self._actions.values()):
                if rec.outcome is None:
                    self._end(
                        rec,
                        "error",
                        error=ErrorInfo(
                            "shutting_down",
                            f"the runtime shut down while the action ran ({grace:g} s grace)",
                        ),
                    )
            for task in late:
                task.cancel()
        if self._wake_timer is not None:
            self._wake_timer.cancel()
        if self.config.trace_path is not None:
            try:
                path = self.write_trace(self.config.trace_path)
                log.info("trace of %d actions written to %s", len(self.recorder), path)
            except Exception:
                log.exception("could not write the trace to %s", self.config.trace_path)
        loop = self._require_loop()
        for executor in (self.cpu, self.gpu):
            if executor is not None:
                try:
                    await loop.run_in_executor(None, executor.shutdown)
                except Exception:
                    log.exception("shutting down %s failed", type(executor).__name__)
        self.api.shutdown()
        self._trajs.clear()
        self._closed.set()

    # ------------------------------------------------------------------ trajectories
    async def open_trajectory(
        self,
        trajectory: str | None = None,
        *,
        memory_gb: float | None = None,
        image: str | None = None,
        wait_s: float = 0.0,
        ephemeral: bool = False,
    ) -> TrajectoryInfo:
        """Place the trajectory's container on the CPU node and create it (AOE).

        ``wait_s`` > 0 waits that long for memory when the node is full; otherwise a full node
        is refused with ``CapacityShort`` (retryable). Returns once the container runs.
        """
        self._check_accepting()
        if self.cpu is None:
            raise ExecutorMissing(
                "this runtime has no CPU executor (started without Docker): it cannot open "
                "trajectory containers"
            )
        traj_id = check_id("trajectory", trajectory) if trajectory else f"t-{uuid.uuid4().hex[:12]}"
        if traj_id in self._trajs:
            raise Conflict(f"trajectory {traj_id!r} is already open")
        memory = self.config.default_memory_gb if memory_gb is None else memory_gb
        if not isinstance(memory, int | float) or isinstance(memory, bool) or not memory > 0:
            raise BadRequest(f"memory_gb must be a positive number, got {memory_gb!r}")
        node_spec = self.cpu.node
        if memory > node_spec.memory_gb:
            raise BadRequest(
                f"memory_gb={memory:g} exceeds the CPU node {node_spec.name!r} "
                f"({node_spec.memory_gb:g} GB): it could never be placed"
            )
        loop = self._require_loop()
        deadline = loop.time() + max(0.0, wait_s)
        while True:
            node = self.scheduler.open_trajectory(
                traj_id, self.now(), memory_gb=float(memory), node=node_spec.name
            )
            if node is not None:
                break
            self._apply(self.scheduler.close_trajectory(traj_id, self.now()))  # forget it
            left = deadline - loop.time()
            if left <= 0:
                raise CapacityShort(
                    f"node {node_spec.name!r} has not {memory:g} GB free for trajectory "
                    f"{traj_id!r} now ({len(self._trajs)} containers open); retry later"
                )
            assert self._capacity is not None
            async with self._capacity:
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(self._capacity.wait(), timeout=left)
            self._check_accepting()
            if traj_id in self._trajs:
                raise Conflict(f"trajectory {traj_id!r} is already open")
        traj = _Traj(traj_id, node, float(memory), image, self.now(), ephemeral)
        traj.ready = loop.create_future()
        self._trajs[traj_id] = traj
        try:
            handle = await self.cpu.open(traj_id, float(memory), image)
        except BaseException as exc:
            self._trajs.pop(traj_id, None)
            traj.ready.set_exception(
                UnknownTrajectory(f"trajectory {traj_id!r} failed to open: {exc}")
            )
            traj.ready.exception()  # retrieved: no "never retrieved" warning
            self._apply(self.scheduler.close_trajectory(traj_id, self.now()))
            await self._notify_capacity()
            if isinstance(exc, Exception):
                raise LiveError(
                    f"could not create the container of trajectory {traj_id!r}: "
                    f"{type(exc).__name__}: {exc}"
                ) from exc
            raise
        traj.container = getattr(handle, "container_id", None)
        traj.state = "open"
        traj.ready.set_result(None)
        self.recorder.trajectory_opened(traj_id, traj.opened_at)
        self.counters["trajectories_opened"] += 1
        return self._traj_info(traj)

    async def close_trajectory(self, trajectory: str) -> TrajectoryInfo:
        """End a trajectory: its queued actions end with an error, running ones finish, then
        its container is removed and its memory returns to the node."""
        traj = self._trajs.get(trajectory)
        if traj is None or traj.state == "closing":
            raise UnknownTrajectory(f"trajectory {trajectory!r} is not open")
        if traj.state == "opening" and traj.ready is not None:
            await asyncio.shield(traj.ready)
        traj.state = "closing"
        self._flush()
        for rec in list(traj.active.values()):
            if rec.outcome is None and rec.phase in (ARRIVING, QUEUED):
                self._end(
                    rec,
                    "error",
                    error=ErrorInfo(
                        "trajectory_closed",
                        f"trajectory {trajectory} was closed while the action was queued",
                    ),
                )
        running = [r.task for r in traj.active.values() if r.task is not None and not r.task.done()]
        if running:
            await asyncio.wait(running)
        self._flush()
        self._apply(self.scheduler.close_trajectory(trajectory, self.now()))
        self._trajs.pop(trajectory, None)
        info = self._traj_info(traj)
        try:
            assert self.cpu is not None
            await self.cpu.close(trajectory)
        except Exception as exc:
            log.warning("removing the container of %s failed: %s", trajectory, exc)
        finally:
            self.counters["trajectories_closed"] += 1
            await self._notify_capacity()
        return info

    async def recreate_trajectory(self, trajectory: str) -> TrajectoryInfo:
        """Replace the trajectory's container with a fresh one (same image and memory), e.g.
        after it died; its files and processes are gone. Actions of it waiting for the
        container run in the new one."""
        traj = self._trajs.get(trajectory)
        if traj is None or traj.state != "open":
            raise UnknownTrajectory(f"trajectory {trajectory!r} is not open")
        assert self.cpu is not None
        try:
            handle = await self.cpu.recreate(trajectory)
        except Exception as exc:
            raise LiveError(
                f"could not recreate the container of {trajectory!r}: {type(exc).__name__}: {exc}"
            ) from exc
        traj.container = getattr(handle, "container_id", None)
        self.counters["trajectories_recreated"] += 1
        return self._traj_info(traj)

    def trajectory(self, trajectory: str) -> TrajectoryInfo:
        traj = self._trajs.get(trajectory)
        if traj is None:
            raise UnknownTrajectory(f"trajectory {trajectory!r} is not open")
        return self._traj_info(traj)

    def trajectories(self) -> list[TrajectoryInfo]:
        return [self._traj_info(t) for t in self._trajs.values()]

    def _traj_info(self, traj: _Traj) -> TrajectoryInfo:
        return TrajectoryInfo(
            traj.id,
            traj.node,
            traj.container,
            traj.memory_gb,
            traj.image,
            round(traj.opened_at, 6),
            traj.ephemeral,
        )

    async def _notify_capacity(self) -> None:
        if self._capacity is not None:
            async with self._capacity:
                self._capacity.notify_all()

    # ------------------------------------------------------------------ actions
    async def submit(self, spec: ActionSpec) -> str:
        """Accept an action and return its id (the outcome comes later: ``result``).

        Raises ``Overloaded`` (retryable) beyond ``max_pending``, ``UnknownTrajectory``,
        ``BadRequest``, ``ExecutorMissing``, ``Conflict`` (the id was used for a different
        action) or ``ShuttingDown``. The same id with the same content returns that id again
        without running anything: submissions are idempotent.
        """
        self._check_accepting()
        if spec.id is not None and spec.id in self._actions:
            return self._resubmission(spec)
        traj = None
        if spec.trajectory is not None:
            traj = self._trajs.get(spec.trajectory)
            if traj is not None and traj.state == "opening" and traj.ready is not None:
                await asyncio.shield(traj.ready)
                self._check_accepting()
            if traj is not None and traj.state == "closing":
                traj = None
        if isinstance(spec.work, CpuWork):
            if self.cpu is None:
                raise ExecutorMissing(
                    "this runtime has no CPU executor (started without Docker): CPU work cannot run"
                )
            if spec.trajectory is None:
                raise BadRequest("CPU work needs a trajectory (the container it runs in)")
            if traj is None:
                raise UnknownTrajectory(
                    f"trajectory {spec.trajectory!r} is not open; open it before submitting "
                    "CPU work to it"
                )
        if spec.id is not None and spec.id in self._actions:  # raced with the same id
            return self._resubmission(spec)
        if self._pending >= self.config.max_pending:
            self.counters["refused_overloaded"] += 1
            for listener in self.on_refused:
                listener("overloaded")
            raise Overloaded(
                f"{self._pending} actions pending, the limit (max_pending) is "
                f"{self.config.max_pending}; nothing was accepted, retry later",
                retry_after_s=self._retry_hint(),
            )
        action_id = spec.id or f"a-{uuid.uuid4().hex[:16]}"
        now = self.now()
        action, max_units, size_gb, memory_gb, label = self._core_action(action_id, spec, traj, now)
        loop = self._require_loop()
        timeout = spec.timeout_s or self.config.default_timeout_s
        rec = _Live(
            id=action_id,
            seq=next(self._seq),
            spec=spec,
            action=action,
            traj=label,
            fingerprint=spec.fingerprint(),
            arrival=now,
            deadline=now + timeout,
            future=loop.create_future(),
            max_units=max_units,
            size_gb=size_gb,
            memory_gb=memory_gb,
        )
        self._actions[action_id] = rec
        self._pending += 1
        self.counters[f"submitted_{spec.resource}"] += 1
        if traj is not None:
            traj.active[action_id] = rec
        rec.timers.append(loop.call_later(timeout, self._on_deadline, rec))
        self._arrivals.append(rec)
        self._schedule_flush()
        return action_id

    async def run(self, spec: ActionSpec) -> Outcome:
        """Submit and wait for the outcome."""
        action_id = await self.submit(spec)
        return await self.result(action_id)

    async def result(self, action_id: str, wait_s: float | None = None) -> Outcome | None:
        """The outcome, waiting up to ``wait_s`` seconds for it (None: until it comes);
        None when it has not come by then."""
        rec = self._record(action_id)
        if rec.outcome is not None:
            return rec.outcome
        if wait_s is not None and wait_s <= 0:
            return None
        try:
            return await asyncio.wait_for(asyncio.shield(rec.future), timeout=wait_s)
        except TimeoutError:
            return None

    def state(self, action_id: str) -> str:
        """``queued``, ``running`` or ``done``."""
        rec = self._record(action_id)
        if rec.outcome is not None:
            return "done"
        return "running" if rec.phase in (RUNNING, FINISHING) else "queued"

    async def cancel(self, action_id: str) -> Outcome:
        """Cancel an action and return its outcome.

        A queued action ends at once with the error ``cancelled``; a running API call is
        interrupted (its task cancelled) and ends the same way; a running CPU or GPU action
        cannot be interrupted (``NotCancellable``); a finished one returns its outcome as is.
        """
        rec = self._record(action_id)
        if rec.outcome is not None:
            return rec.outcome
        error = ErrorInfo("cancelled", f"action {action_id} was cancelled by the client")
        if rec.phase in (ARRIVING, QUEUED):
            self._withdraw(rec)
            self._end(rec, "error", error=error)
        elif isinstance(rec.spec.work, ApiWork) and rec.task is not None:
            rec.interrupt = ("error", error)
            rec.task.cancel()
            await asyncio.shield(rec.future)
        else:
            left = max(0.0, rec.deadline - self.now())
            raise NotCancellable(
                f"action {action_id} is already running on the {rec.spec.resource.upper()} "
                f"executor, which cannot interrupt it; it ends by itself or at its time-out "
                f"({left:.1f} s left)"
            )
        assert rec.outcome is not None
        return rec.outcome

    def _withdraw(self, rec: _Live) -> None:
        """Take a queued action out of the core's queue so it never holds units."""
        if rec.phase == QUEUED and self.scheduler.withdraw(rec.id, self.now()):
            rec.phase = OUT
            self._forget_active(rec)

    def _record(self, action_id: str) -> _Live:
        rec = self._actions.get(action_id)
        if rec is None:
            raise UnknownAction(f"no action {action_id!r} (never accepted, or long forgotten)")
        return rec

    def _resubmission(self, spec: ActionSpec) -> str:
        assert spec.id is not None
        rec = self._actions[spec.id]
        if rec.fingerprint != spec.fingerprint():
            raise Conflict(
                f"action id {spec.id!r} was already used for a different action; ids must be "
                "unique (a retry must resend the same content)"
            )
        self.counters["resubmitted"] += 1
        return spec.id

    def _check_accepting(self) -> None:
        self._require_loop()
        if self._closing:
            raise ShuttingDown()

    def _retry_hint(self) -> float:
        """Seconds a refused client should wait: the time to drain a tenth of the bound at
        the recent completion rate (between 50 ms and 5 s)."""
        done = self.counters["completed"]
        elapsed = max(self.now(), 1e-3)
        rate = done / elapsed if done else 0.0
        if rate <= 0:
            return 0.5
        return min(5.0, max(0.05, 0.1 * self.config.max_pending / rate))

    def _core_action(
        self, action_id: str, spec: ActionSpec, traj: _Traj | None, now: float
    ) -> tuple[Action, int, float, float, str]:
        """The core's ``Action`` for a submission, with the effective units, model size,
        container memory and trajectory label."""
        label = spec.trajectory or f"~{action_id}"
        work = spec.work
        max_units, size_gb, memory_gb, node = spec.max_units, 0.0, 0.0, None
        if isinstance(work, CpuWork):
            assert traj is not None
            node, memory_gb = traj.node, traj.memory_gb
            resource = ResourceKind.CPU
        elif isinstance(work, GpuWork):
            if self.gpu is None:
                raise ExecutorMissing("this runtime has no GPU executor: GPU work cannot run")
            if work.service not in self.gpu.services():
                raise BadRequest(
                    f"unknown GPU service {work.service!r}; registered: {list(self.gpu.services())}"
                )
            dops = set(self.gpu.dops(work.service))
            cells = [k for k in (1, 2, 4, 8) if k <= self.gpu.node.gpus]
            usable = list(itertools.takewhile(lambda k: k in dops, cells))
            if not usable:
                raise BadRequest(
                    f"GPU service {work.service!r} supports DoPs {sorted(dops)}; the scheduler "
                    "may start any cell from 1 GPU up to max_units, so it must support DoP 1"
                )
            max_units = max(k for k in usable if k <= max(spec.max_units, 1))
            size_gb = self.gpu.size_gb(work.service)
            resource = ResourceKind.GPU
        else:
            assert isinstance(work, ApiWork)
            if work.endpoint not in {a.name for a in self.cluster.apis}:
                raise BadRequest(
                    f"unknown API endpoint {work.endpoint!r}; the cluster has "
                    f"{sorted(a.name for a in self.cluster.apis)}"
                )
            if work.endpoint not in self.api:
                raise ExecutorMissing(
                    f"API endpoint {work.endpoint!r} has a quota in the cluster but no callable "
                    f"registered; registered: {list(self.api.endpoints())}"
                )
            max_units = 1
            resource = ResourceKind.API
        try:
            action = Action(
                id=action_id,
                trajectory=label,
                resource=resource,
                curve=spec.elasticity(),
                arrival=now,
                max_units=max_units,
                task=spec.task,
                kind=spec.label(),
                memory_gb=0.0,
                service=spec.service,
                service_size_gb=size_gb,
                node=node,
            )
        except ActionError as exc:
            raise BadRequest(str(exc)) from None
        return action, max_units, size_gb, memory_gb, label

    # ------------------------------------------------------------------ events -> core
    def _schedule_flush(self) -> None:
        if not self._flush_scheduled:
            self._flush_scheduled = True
            self._require_loop().call_soon(self._flush)

    def _flush(self) -> None:
        """Hand every event of this loop iteration to the core in one pass, apply decisions."""
        self._flush_scheduled = False
        arrivals = [r for r in self._arrivals if r.outcome is None]
        for rec in self._arrivals:
            if rec.outcome is not None:  # ended before the core ever saw it
                self._forget_active(rec)
                rec.phase = OUT
        finishes = self._finishes
        self._arrivals, self._finishes = [], []
        tick = self._tick_due
        self._tick_due = False
        if not (arrivals or finishes or tick):
            return
        now = self.now()
        decisions: list[Decision] = []
        try:
            if tick:
                decisions += self.scheduler.tick(now)
            if arrivals or finishes:
                for rec in arrivals:
                    rec.phase = QUEUED
                decisions += self.scheduler.advance(
                    now, finished=[r.id for r in finishes], arrived=[r.action for r in arrivals]
                )
                self.passes += 1
        except Exception as exc:  # a core bug: fail what it was given rather than lose it
            log.exception("the scheduler failed on a pass; its actions end with an error")
            for rec in arrivals:
                rec.phase = OUT
                self._forget_active(rec)
                self._end(
                    rec,
                    "error",
                    error=ErrorInfo("scheduler_error", f"{type(exc).__name__}: {exc}"),
                )
        for rec in finishes:
            rec.phase = OUT
            self._forget_active(rec)
        self._apply(decisions)
        self._arm_wakeup()

    def _apply(self, decisions: list[Decision]) -> None:
        for d in decisions:
            rec = self._actions.get(d.action.id)
            if rec is None:  # forgotten long ago (keep_outcomes) and started now: finish it
                if isinstance(d, Start):
                    log.warning("start of a forgotten action %s; finishing it", d.action.id)
                continue
            if isinstance(d, Start):
                rec.start, rec.started_at, rec.phase = d, self.now(), RUNNING
                if rec.outcome is not None:  # withdrawn while queued: give the units back
                    self._finish(rec)
                    continue
                rec.task = self._require_loop().create_task(self._execute(rec))
            elif isinstance(d, Reject):
                rec.phase = OUT
                self._forget_active(rec)
                if rec.outcome is None:
                    self._end(rec, "error", error=ErrorInfo("rejected", d.reason))
            elif isinstance(d, Defer):
                rec.deferrals += 1
                self.counters["deferrals"] += 1

    def _finish(self, rec: _Live) -> None:
        rec.phase = FINISHING
        self._finishes.append(rec)
        self._schedule_flush()

    def _forget_active(self, rec: _Live) -> None:
        traj = self._trajs.get(rec.traj)
        if traj is not None:
            traj.active.pop(rec.id, None)

    def _arm_wakeup(self) -> None:
        """Ask the loop to tick the core when it wants (an API rate token frees then)."""
        wake = self.scheduler.next_wakeup
        if wake is None or (self._wake_at is not None and self._wake_at <= wake):
            return
        if self._wake_timer is not None:
            self._wake_timer.cancel()
        self._wake_at = wake
        self._wake_timer = self._require_loop().call_at(self._t0 + wake + 1e-4, self._on_wakeup)

    def _on_wakeup(self) -> None:
        self._wake_timer, self._wake_at = None, None
        self._tick_due = True
        self._schedule_flush()

    def residency_changed(self, service: str, gpus: tuple[int, ...], resident: bool) -> None:
        """EOE restored or evicted ``service`` on ``gpus`` (called from any thread)."""
        if self.gpu is None or self._loop is None:
            return
        node = self.gpu.node.name
        self._loop.call_soon_threadsafe(
            self.scheduler.report_residency, node, tuple(gpus), service, resident
        )

    # ------------------------------------------------------------------ execution
    async def _execute(self, rec: _Live) -> None:
        start = rec.start
        assert start is not None
        work = rec.spec.work
        try:
            if isinstance(work, CpuWork):
                assert self.cpu is not None
                left = rec.deadline - self.now()
                if left <= 0:
                    result = ExecResult(
                        "timeout", error=ErrorInfo("timeout", "the time-out passed at its start")
                    )
                else:
                    result = await self.cpu.run(
                        rec.traj,
                        work.command,
                        start.cores,
                        timeout_s=left,
                        env=work.env,
                        max_output_bytes=work.max_output_bytes,
                    )
            elif isinstance(work, GpuWork):
                assert self.gpu is not None
                result = await self.gpu.run(work.service, work.inputs, start.gpus)
            else:
                result = await self.api.run(work.endpoint, work.payload)
        except asyncio.CancelledError:
            status, error = rec.interrupt or (
                "error",
                ErrorInfo("cancelled", "the action was interrupted"),
            )
            ran = self.now() - (rec.started_at or self.now())
            result = ExecResult(status, error=error, exec_s=ran)  # type: ignore[arg-type]
        except Exception as exc:
            log.exception("executor failed on %s", rec.id)
            result = failed("executor_error", f"the executor raised {type(exc).__name__}: {exc}")
        self._finish(rec)
        self._end(
            rec,
            result.status,
            value=result.value,
            error=result.error,
            exec_s=result.exec_s,
            wait_s=result.wait_s,
        )

    def _on_deadline(self, rec: _Live) -> None:
        if rec.outcome is not None:
            return
        timeout = rec.deadline - rec.arrival
        if rec.phase in (ARRIVING, QUEUED):
            self._withdraw(rec)
            self._end(
                rec,
                "timeout",
                error=ErrorInfo(
                    "timeout", f"timed out after {timeout:g} s in the queue; it never started"
                ),
            )
            return
        work = rec.spec.work
        message = (
            f"timed out after {timeout:g} s (it started after {rec.started_at - rec.arrival:.3f} s)"  # type: ignore[operator]
        )
        if isinstance(work, ApiWork) and rec.task is not None:
            rec.interrupt = ("timeout", ErrorInfo("timeout", message + "; the call was cancelled"))
            rec.task.cancel()
        elif isinstance(work, GpuWork):
            # EOE never interrupts a running call: the client gets its time-out now, the cell
            # stays held until the call returns (its result is then discarded).
            ran = self.now() - (rec.started_at or self.now())
            self._end(
                rec,
                "timeout",
                error=ErrorInfo(
                    "timeout", message + "; the GPU call runs on and its result is discarded"
                ),
                exec_s=ran,
            )
        else:  # CPU: AOE kills at the deadline; declare it here only if that never reports
            loop = self._require_loop()
            rec.timers.append(
                loop.call_later(self.config.timeout_grace_s, self._late_timeout, rec, message)
            )

    def _late_timeout(self, rec: _Live, message: str) -> None:
        if rec.outcome is None:
            ran = self.now() - (rec.started_at or self.now())
            self._end(
                rec,
                "timeout",
                error=ErrorInfo("timeout", message + "; the executor did not report the kill"),
                exec_s=ran,
            )

    # ------------------------------------------------------------------ outcomes
    def _end(
        self,
        rec: _Live,
        status: str,
        *,
        value: Any = None,
        error: ErrorInfo | None = None,
        exec_s: float = 0.0,
        wait_s: float = 0.0,
    ) -> None:
        """Give the action its one outcome (later calls for it are ignored)."""
        if rec.outcome is not None:
            return
        now = self.now()
        act = max(0.0, now - rec.arrival)
        if rec.started_at is None:
            queue, exec_s = act, 0.0
        else:
            queue = min(act, rec.started_at - rec.arrival + max(0.0, wait_s))
            exec_s = min(max(0.0, exec_s), act - queue)
        timings = Timings(queue, max(0.0, act - queue - exec_s), exec_s, act)
        start = rec.start if rec.started_at is not None else None
        outcome = Outcome(
            action_id=rec.id,
            trajectory=rec.spec.trajectory,
            resource=rec.spec.resource,
            status=status,  # type: ignore[arg-type]
            value=value,
            error=error,
            timings=timings,
            arrival_s=rec.arrival,
            start_s=rec.started_at,
            end_s=now,
            units=start.units if start else None,
            node=start.node if start else None,
            cores=start.cores if start else (),
            gpus=start.gpus if start else (),
            reason=start.reason if start else (error.message if error else ""),
        )
        rec.outcome = outcome
        self._pending -= 1
        for timer in rec.timers:
            timer.cancel()
        rec.timers.clear()
        if not rec.future.done():
            rec.future.set_result(outcome)
        self.counters["completed"] += 1
        self.counters[f"outcome_{status}"] += 1
        self.recorder.add(
            RecordedAction(
                spec=rec.spec,
                trajectory=rec.traj,
                outcome=outcome,
                max_units=rec.max_units,
                service_size_gb=rec.size_gb,
                memory_gb=rec.memory_gb,
                seq=rec.seq,
            )
        )
        for listener in self.on_outcome:
            try:
                listener(outcome)
            except Exception:
                log.exception("an outcome listener raised")
        self._done_order.append(rec.id)
        while len(self._done_order) > self.config.keep_outcomes:
            old = self._actions.get(self._done_order[0])
            if old is not None and old.phase not in (OUT,):
                break  # the core still holds it: keep it until it is out
            self._actions.pop(self._done_order.popleft(), None)

    # ------------------------------------------------------------------ reading
    def status(self) -> dict[str, Any]:
        """A snapshot for people and dashboards (``GET /v1/status``)."""
        st = self.scheduler.state
        phases = Counter(r.phase for r in self._actions.values() if r.outcome is None)
        return {
            "policy": self.config.policy,
            "cluster": self.cluster.name,
            "uptime_s": round(self.now(), 3),
            "closing": self._closing,
            "pending": self._pending,
            "max_pending": self.config.max_pending,
            "queued": self.scheduler.queued,
            "running": len(self.scheduler.running),
            "waiting": dict(phases),
            "trajectories_open": len(self._trajs),
            "held": {
                "cores": st.held_cores,
                "gpus": st.held_gpus,
                "api_in_flight": {name: a.in_flight for name, a in st.api.items()},
            },
            "counters": dict(self.counters),
            "scheduler_passes": self.passes,
            "executors": {
                "cpu": self.cpu.node.name if self.cpu else None,
                "gpu": self.gpu.node.name if self.gpu else None,
                "gpu_services": list(self.gpu.services()) if self.gpu else [],
                "api": list(self.api.endpoints()),
            },
            "residency": self.gpu.eoe.residency() if self.gpu else {},
        }

    def trace_meta(self) -> dict[str, Any]:
        meta: dict[str, Any] = {
            "source": "tangram live runtime",
            "policy": self.config.policy,
            "cluster": cluster_to_dict(self.cluster),
            "started_at_unix": round(self._started_unix, 3),
            "clock": "seconds since the runtime started",
            "gpu_residency_at_start": {
                k: list(v) for k, v in self._residency_at_record_start.items()
            },
        }
        if self.gpu is not None:
            stats = self.gpu.eoe.stats()
            meta["eoe"] = {
                "backend": self.gpu.eoe.backend,
                "restores": stats.restores,
                "bytes_restored": stats.bytes_restored,
                "restore_s": round(stats.restore_s, 6),
                "evictions": stats.evictions,
                "evict_s": round(stats.evict_s, 6),
            }
        return meta

    def clear_trace(self) -> None:
        """Forget the actions recorded so far (e.g. a warm-up or calibration phase); later
        actions are recorded as usual."""
        self.recorder = TraceRecorder()
        for traj in self._trajs.values():
            self.recorder.trajectory_opened(traj.id, traj.opened_at)
        self._residency_at_record_start = self.gpu.eoe.residency() if self.gpu else {}

    def trace(self) -> Trace:
        """The actions ended so far as a trace (format v1, open loop, observed timings)."""
        return self.recorder.trace(self.trace_meta())

    def write_trace(self, path: str | Path) -> Path:
        return self.recorder.write(path, self.trace_meta())
