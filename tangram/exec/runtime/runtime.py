"""``Runtime``: the live driver of the scheduler core, on asyncio, with real executors.

It is a front over named parts; data flows one way, as in the simulator: event -> core ->
decision -> executor -> event.

- ``tangram.core.loop.DriverLoop`` turns the events of one event-loop iteration (submissions,
  completions) into one ``Scheduler.advance`` pass and routes the decisions;
  ``host.LiveHost`` is its host here: it runs starts on the executors, ends rejected actions,
  arms wake-up timers, and gives every action its outcome, deadline or cancel included.
- ``actions``: the table of accepted actions and their phases (one transition function).
- ``executor``: the one interface the CPU (AOE), GPU (EOE) and API adapters implement,
  found by the kind of work.
- ``trajectories``: open trajectories, their containers' memory in the core and their
  containers (AOE), opening and closing.
- ``reporting``: ``status`` and the trace's metadata.
- ``journal``: accepted ids, fingerprints and outcomes on disk, so a restarted service never
  runs an id twice; ``recorder``: the trace, streamed to disk as actions end.

This class keeps what is the runtime's own: admission (validation, the ``max_pending`` bound,
idempotent ids, in memory and in the journal), what ended (journal, trace), and the order of
shutdown. Every accepted action ends with exactly one ``Outcome`` (result, error or timeout;
``unknown`` for one a previous run accepted and never ended) carrying its timings. Beyond
``max_pending`` a submission is refused at once with ``Overloaded`` (retryable, nothing was
accepted), never left to time out. Acceptances reach the journal's log before any start
(the host's ``before_start``), its SQLite commits follow within ``LINGER_S`` (``_commit``),
and trace rows are appended (and outcomes encoded) once the answers are out (``_persist``).
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import logging
import time
import uuid
from collections import Counter
from collections.abc import Callable
from pathlib import Path
from typing import Any

from tangram.core.action import Action, ActionError
from tangram.core.cells import copies_on
from tangram.core.policies import make_policy
from tangram.core.resources import ClusterSpec
from tangram.core.scheduler import Scheduler
from tangram.exec.runtime import reporting
from tangram.exec.runtime.actions import STARTED, LiveAction
from tangram.exec.runtime.api import ApiExecutor
from tangram.exec.runtime.config import RuntimeConfig
from tangram.exec.runtime.cpu import CpuExecutor
from tangram.exec.runtime.errors import (
    BadRequest,
    Conflict,
    Overloaded,
    ShuttingDown,
    UnknownAction,
    UnknownTrajectory,
)
from tangram.exec.runtime.executor import executor_for, executors_by_work
from tangram.exec.runtime.gpu import GpuExecutor
from tangram.exec.runtime.host import LiveHost
from tangram.exec.runtime.journal import LINGER_S, Entry, Journal
from tangram.exec.runtime.recorder import RecordedAction, TraceRecorder, stream_path
from tangram.exec.runtime.records import (
    ActionSpec,
    ErrorInfo,
    Outcome,
    TrajectoryInfo,
)
from tangram.exec.runtime.trajectories import Trajectories
from tangram.trace import Trace

log = logging.getLogger(__name__)

#: Event-loop iterations between an outcome and the writing of its trace row and journal
#: entry (``Runtime._persist_soon`` says why).
PERSIST_HOPS = 3
#: The most journal entries waiting for its writer before submissions are refused
#: (``Overloaded``): while its commits fail (a full disk) each accepted action's entry, its
#: outcome and output included, stays in memory until they succeed. Normally a span's
#: entries (``LINGER_S``) and the batch in hand: far below it.
JOURNAL_BACKLOG_MAX = 10_000


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
        # The core resizes malleable CPU actions only where the CPU executor applies resizes
        # (``resizes``: AOE on one node rewrites a running container's cpuset and quota); the
        # Ray executor's agents do not yet, so with it (or no CPU executor) grants stay fixed.
        resizable = cpu is not None and getattr(cpu, "resizes", False)
        self.scheduler = Scheduler(cluster, self.policy, resizable=resizable)
        #: CPU grants are CFS weights over the node's cores, decided once here: where the
        #: policy's grants lend idle cycles (``Capabilities.cpu_lends_idle``) and the config
        #: does not ask for exclusive cores; else exclusive cpusets with a quota.
        self.weighted_cpu = (
            bool(getattr(self.scheduler.capabilities, "cpu_lends_idle", False))
            and not self.config.exclusive_cores
        )
        if cpu is not None and hasattr(cpu, "weighted"):
            cpu.weighted = self.weighted_cpu
        # A multi-node executor (``multi_node``: ``tangram.exec.ray``) routes each start to
        # the node the core chose; a plain one drives the one node it names.
        single_cpu = cpu is not None and not getattr(cpu, "multi_node", False)
        if single_cpu and cpu.node.name not in {n.name for n in cluster.cpu_nodes}:
            raise ValueError(f"CPU executor's node {cpu.node.name!r} is not in the cluster")
        if (
            gpu is not None
            and not getattr(gpu, "multi_node", False)
            and (len(cluster.gpu_nodes) != 1 or cluster.gpu_nodes[0].name != gpu.node.name)
        ):
            raise ValueError(
                "a live runtime drives one GPU node: the cluster must describe exactly the "
                f"GPU executor's node {gpu.node.name!r} (scale-out is not implemented)"
            )
        self.cpu, self.gpu, self.api = cpu, gpu, api or ApiExecutor()
        #: The executors by the kind of work they run (``CpuWork`` -> ``self.cpu``...).
        self.executors = executors_by_work(self.cpu, self.gpu, self.api)
        self.recorder = TraceRecorder(stream_path(self.config.trace_path))
        cfg = self.config
        #: Accepted ids and outcomes on disk (None: ids live only as long as their outcome).
        self.journal = (
            Journal(
                cfg.journal_path,
                fsync=cfg.journal_fsync,
                keep=cfg.journal_keep,
                keep_s=cfg.journal_keep_s,
            )
            if cfg.journal_path is not None
            else None
        )
        self.on_outcome: list[Callable[[Outcome], None]] = []
        self.on_refused: list[Callable[[str], None]] = []
        self.counters: Counter[str] = Counter()
        self.host = LiveHost(self.scheduler, self.config, self.counters, self._recorded)
        if self.journal is not None:
            self.host.before_start = self.journal.write_ahead  # on disk before it can run
            # The core remembers every id it ever admitted, to refuse a second use
            # (``Admission.seen``): a set that grows with every action. With a journal the
            # runtime refuses a reused id itself (table, then journal) before the core sees
            # it, so an id the table drops leaves that set too and memory stays bounded.
            self.host.table.forget = self.scheduler.forget
        #: Wall-clock time of the start (the trace's ``started_at_unix``).
        self.started_unix = 0.0
        #: GPU services resident when the recording began (the replay starts warm if any).
        self.residency_at_record_start: dict[str, tuple[int, ...]] = {}
        self.trajs = Trajectories(
            self.scheduler,
            self.host,
            self.cpu,
            self.counters,
            default_memory_gb=self.config.default_memory_gb,
        )
        self._loop: asyncio.AbstractEventLoop | None = None
        self._t0 = 0.0
        self._seq = itertools.count(1)
        self._closing = False
        self._closed: asyncio.Event | None = None
        self._persist_armed = False
        self._commit_armed = False
        self._executors_stopped = False

    # ------------------------------------------------------------------ lifecycle
    async def start(self) -> Runtime:
        if self._loop is not None:
            return self
        if self.journal is not None:  # first: a journal in use elsewhere stops the start here
            unknown = self.journal.open()
            self.counters["completed"] += unknown
            self.counters["outcome_unknown"] += unknown
        self._loop = asyncio.get_running_loop()
        self._t0 = self._loop.time()
        self.host.bind(self._loop, self._t0)
        self.started_unix = time.time()
        self._closed = asyncio.Event()
        try:
            self.recorder.start(self.trace_meta())
        except BaseException as exc:
            if self.journal is not None:
                self.journal.close()
            self._loop = None
            if isinstance(exc, OSError):  # (tangram serve blamed its listening address)
                stream = stream_path(self.config.trace_path)
                raise ValueError(
                    f"the trace stream {stream}: cannot write it "
                    f"({exc.strerror or exc}); give another --trace path"
                ) from exc
            raise
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
        return self.host.pending

    @property
    def passes(self) -> int:
        """Scheduling passes so far (``Scheduler.advance`` calls)."""
        return self.host.loop.passes

    @property
    def open_trajectories(self) -> int:
        return len(self.trajs)

    async def close(self, grace_s: float | None = None) -> None:
        """Stop: refuse new work, end queued actions, let running ones finish (``grace_s``),
        write the trace if configured, remove the containers and stop the executors. A runtime
        that never started (its start failed) only stops its executors: they were made for it
        and nothing else stops them."""
        if self._loop is None:
            await self._stop_executors()
            return
        assert self._closed is not None
        if self._closing:
            await self._closed.wait()
            return
        self._closing = True
        await self.trajs.stop()
        grace = self.config.close_grace_s if grace_s is None else grace_s
        host = self.host
        refused = ErrorInfo(ShuttingDown.code, ShuttingDown().message, retryable=True)
        host.end_all_waiting(host.table.records(), "error", refused)
        running = [r.task for r in host.table if r.task is not None and not r.task.done()]
        if running:
            _, late = await asyncio.wait(running, timeout=grace)
            cut = ErrorInfo(
                ShuttingDown.code, f"the runtime shut down while the action ran ({grace:g} s grace)"
            )
            for rec in host.table.records():
                if rec.outcome is None:  # (it ran until now: execution, not overhead)
                    host.end(rec, "error", error=cut, exec_s=host.ran(rec))
            for task in late:
                task.cancel()
        await self.trajs.settle(grace)
        host.close()
        self._persist()
        if self.journal is not None:
            self.journal.close()  # (commits what is buffered)
        trace_path = self.config.trace_path
        if trace_path is not None:
            try:
                path = self.write_trace(trace_path)
                log.info("trace of %d actions written to %s", len(self.recorder), path)
                stream = stream_path(trace_path)
                if stream != trace_path and stream is not None:
                    stream.unlink(missing_ok=True)  # the final file is written from it
            except Exception:
                log.exception("could not write the trace to %s", trace_path)
        self.recorder.close()
        await self._stop_executors()
        self.trajs.by_id.clear()
        self._closed.set()

    async def _stop_executors(self) -> None:
        """Close and shut down every executor, once (a second call does nothing); a failure
        is logged, so the other executors still stop."""
        if self._executors_stopped:
            return
        self._executors_stopped = True
        loop = asyncio.get_running_loop()
        for executor in self.executors.values():
            await self._aclose(executor)
            try:
                await loop.run_in_executor(None, executor.shutdown)
            except Exception:
                log.exception("shutting down %s failed", type(executor).__name__)

    @staticmethod
    async def _aclose(executor: object) -> None:
        """Close what ``executor`` holds open on the loop (the API executor's HTTP
        connections), before its blocking ``shutdown`` on a worker thread; a failure is
        logged, so the other executors still stop."""
        aclose = getattr(executor, "aclose", None)
        if aclose is None:
            return
        try:
            await aclose()
        except Exception:
            log.exception("closing %s failed", type(executor).__name__)

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
        traj = await self.trajs.open(trajectory, memory_gb, image, wait_s, ephemeral)
        self.recorder.trajectory_opened(traj.id, traj.opened_at)
        return traj.info()

    async def close_trajectory(self, trajectory: str) -> TrajectoryInfo:
        """End a trajectory: its queued actions end with an error, running ones finish, then
        its container is removed and its memory returns to the node."""
        ephemeral = self.private(trajectory)
        info = await self.trajs.close(trajectory)
        if ephemeral:  # (a fresh id per request, never opened again: its trace entry goes)
            self.recorder.forget(trajectory)
        else:  # (its entry stays while among the recently closed: a reopen goes on)
            self.recorder.trajectory_closed(trajectory)
        return info

    async def recreate_trajectory(self, trajectory: str) -> TrajectoryInfo:
        """Replace the trajectory's container with a fresh one (same image and memory), e.g.
        after it died; its files and processes are gone. Actions of it waiting for the
        container run in the new one."""
        return (await self.trajs.recreate(trajectory)).info()

    def trajectory(self, trajectory: str) -> TrajectoryInfo:
        return self.trajs.get(trajectory).info()

    async def opened_trajectory(self, trajectory: str) -> TrajectoryInfo:
        """``trajectory`` once open: one whose container is being made is waited for;
        ``UnknownTrajectory`` if that fails."""
        return (await self.trajs.opened(trajectory)).info()

    def trajectories(self) -> list[TrajectoryInfo]:
        return [t.info() for t in self.trajs.by_id.values()]

    def private(self, trajectory: str | None) -> bool:
        """Whether ``trajectory`` is open for the service's own use (``ephemeral``: a
        ``/run_code`` request's container). The client-facing APIs (HTTP and Ray-native)
        neither list it nor let a client act on it, through ``public_*``."""
        traj = self.trajs.by_id.get(trajectory) if trajectory is not None else None
        return traj is not None and traj.ephemeral

    def public_trajectory(self, trajectory: str | None) -> str | None:
        """``trajectory`` as a client may name it: a private one is, to clients, not open
        (one client must not close or use another's sandbox)."""
        if self.private(trajectory):
            raise UnknownTrajectory(f"trajectory {trajectory!r} is not open")
        return trajectory

    def public_action(self, action_id: str) -> str:
        """``action_id`` as a client may name it: an action in a private trajectory is, to
        clients, unknown."""
        rec = self.host.table.get(action_id)
        if rec is not None and self.private(rec.spec.trajectory):
            raise UnknownAction(f"no action {action_id!r}")
        return action_id

    def public_trajectories(self) -> list[TrajectoryInfo]:
        """The open trajectories a client may see (not the private ones)."""
        return [t.info() for t in self.trajs.by_id.values() if not t.ephemeral]

    # ------------------------------------------------------------------ actions
    async def submit(self, spec: ActionSpec) -> str:
        """Accept an action and return its id (the outcome comes later: ``result``).

        Raises ``Overloaded`` (retryable) beyond ``max_pending``, ``UnknownTrajectory``,
        ``BadRequest``, ``ExecutorMissing``, ``Conflict`` (the id was used for a different
        action) or ``ShuttingDown``. The same id with the same content returns that id again
        without running anything: submissions are idempotent.
        """
        self._check_accepting()
        table = self.host.table
        if spec.id is not None and spec.id in table:
            return self._resubmission(spec)
        if spec.id is not None and self.journal is not None:
            entry = self.journal.lookup(spec.id)
            if entry is not None:  # accepted earlier (maybe by a previous run): never again
                return self._resubmission(spec, entry)
        traj = await self.trajs.of(spec.trajectory)
        if traj is None and self.trajs.closing(spec.trajectory):
            # A GPU or API action labelled with it would be accepted, then rejected when the
            # core forgets the trajectory (or run, had a unit been free): refused now instead.
            raise UnknownTrajectory(
                f"trajectory {spec.trajectory!r} is closing: no action of it is accepted"
            )
        executor = executor_for(self.executors, spec.work)
        admitted = executor.admit(spec, traj, self.cluster)
        if spec.id is not None and spec.id in table:  # raced with the same id
            return self._resubmission(spec)
        self._check_room()
        action_id = spec.id or f"a-{uuid.uuid4().hex[:16]}"
        now = self.now()
        label = spec.trajectory or f"~{action_id}"
        try:
            action = Action(
                id=action_id,
                trajectory=label,
                resource=admitted.resource,
                curve=spec.elasticity(),
                arrival=now,
                max_units=admitted.max_units,
                task=spec.task,
                kind=spec.label(),
                memory_gb=0.0,  # the container's memory was reserved when it opened
                service=spec.service,
                service_size_gb=admitted.size_gb,
                node=admitted.node,
                service_replicas=admitted.replicas,
                malleable=spec.malleable,
            )
        except ActionError as exc:
            raise BadRequest(str(exc)) from None
        timeout = spec.timeout_s or self.config.default_timeout_s
        rec = LiveAction(
            id=action_id,
            seq=next(self._seq),
            spec=spec,
            action=action,
            traj=label,
            fingerprint=spec.fingerprint(),
            arrival=now,
            deadline=now + timeout,
            future=self._require_loop().create_future(),
            max_units=admitted.max_units,
            size_gb=admitted.size_gb,
            memory_gb=admitted.memory_gb,
            executor=executor,
            active=traj.active if traj is not None else None,
        )
        self.counters[f"submitted_{spec.resource}"] += 1
        if traj is not None:
            traj.active[action_id] = rec
        if self.journal is not None:  # before it can start: the host's gate logs it
            self.journal.accept(
                action_id, rec.fingerprint, spec.resource, spec.trajectory, time.time()
            )
            self._commit_soon()
        self.host.accept(rec, timeout)
        return action_id

    async def run(self, spec: ActionSpec) -> Outcome:
        """Submit and wait for the outcome."""
        action_id = await self.submit(spec)
        return await self.result(action_id)

    async def result(self, action_id: str, wait_s: float | None = None) -> Outcome | None:
        """The outcome, waiting up to ``wait_s`` seconds for it (None: until it comes);
        None when it has not come by then. One that came as the wait ran out (a time-out
        ending with it) is returned: the caller reads the state next and must not see
        ``done`` without it."""
        rec = self.host.table.get(action_id)
        if rec is None:
            return self._journaled(action_id)
        if rec.outcome is not None:
            return rec.outcome
        if wait_s is not None and wait_s <= 0:
            return None
        try:
            return await asyncio.wait_for(asyncio.shield(rec.future), timeout=wait_s)
        except TimeoutError:
            return rec.outcome

    def state(self, action_id: str) -> str:
        """``queued``, ``running`` or ``done``."""
        rec = self.host.table.get(action_id)
        if rec is None:
            self._journaled(action_id)  # raises UnknownAction if it is not there either
            return "done"
        if rec.outcome is not None:
            return "done"
        return "running" if rec.phase in STARTED else "queued"

    async def cancel(self, action_id: str) -> Outcome:
        """Cancel an action and return its outcome.

        A queued action ends at once with the error ``cancelled``; a running API call is
        interrupted (its task cancelled) and ends the same way; a running CPU or GPU action
        cannot be interrupted (``NotCancellable``); a finished one returns its outcome as is.
        """
        rec = self.host.table.get(action_id)
        if rec is None:
            return self._journaled(action_id)
        return await self.host.cancel(rec)

    def _journaled(self, action_id: str) -> Outcome:
        """The outcome of an action no longer (or never) in memory, from the journal;
        ``UnknownAction`` saying why when there is none."""
        cfg = self.config
        kept = (
            f"outcomes are kept in memory for {cfg.keep_outcomes_s:g} s, at most "
            f"{cfg.keep_outcomes:,}"
        )
        if self.journal is None:
            raise UnknownAction(
                f"no action {action_id!r}: never accepted, or its outcome expired ({kept}; "
                "a service with a journal answers for older ones)"
            )
        entry = self.journal.lookup(action_id)
        if entry is None:
            raise UnknownAction(
                f"no action {action_id!r}: never accepted, or expired from the journal too "
                f"({kept}; the journal keeps {cfg.journal_keep:,} entries for "
                f"{cfg.journal_keep_s:g} s)"
            )
        if entry.outcome is None:  # every accepted action not ended is in memory
            raise RuntimeError(f"journal entry {action_id!r} has no outcome and no record")
        return entry.outcome

    def _resubmission(self, spec: ActionSpec, entry: Entry | None = None) -> str:
        """The same id again: the same action (never a second run), or ``Conflict`` when the
        content differs; ``entry`` when it is known from the journal only."""
        assert spec.id is not None
        rec = self.host.table.get(spec.id)
        if entry is not None:
            fingerprint = entry.fingerprint
        elif rec is not None:
            fingerprint = rec.fingerprint
        else:
            raise UnknownAction(f"no action {spec.id!r}")
        if fingerprint != spec.fingerprint():
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

    def _check_room(self) -> None:
        """Admission control: ``Overloaded`` (retryable, with a back-off hint) when
        ``max_pending`` actions are pending, or the journal has ``JOURNAL_BACKLOG_MAX``
        entries not yet committed (its writer failing: memory would grow with each)."""
        journal = self.journal
        if journal is not None and journal.buffered >= JOURNAL_BACKLOG_MAX:
            raise self.overloaded(
                "refused_overloaded",  # (its reason in the metrics: the admission bound)
                f"the journal has {journal.buffered} entries not yet on disk (its last "
                f"commit: {journal.error or 'in progress'}); nothing was accepted, retry later",
            )
        if self.host.pending < self.config.max_pending:
            return
        raise self.overloaded(
            "refused_overloaded",
            f"{self.host.pending} actions pending, the limit (max_pending) is "
            f"{self.config.max_pending}; nothing was accepted, retry later",
        )

    def overloaded(self, counter: str, message: str) -> Overloaded:
        """An admission bound's refusal, for the caller to raise: counted under ``counter``,
        told to the ``on_refused`` listeners (the metrics), with a back-off hint."""
        self.counters[counter] += 1
        for listener in self.on_refused:
            listener(Overloaded.code)
        return Overloaded(message, retry_after_s=self._retry_hint())

    def known(self, action_id: str) -> bool:
        """Whether the id was accepted before (in memory or in the journal): submitting it
        again is a resubmission, answered with that action."""
        if action_id in self.host.table:
            return True
        return self.journal is not None and self.journal.lookup(action_id) is not None

    def _retry_hint(self) -> float:
        """Seconds a refused client should wait: the time to drain a tenth of the bound at
        the recent completion rate (between 50 ms and 5 s)."""
        done = self.counters["completed"]
        elapsed = max(self.now(), 1e-3)
        rate = done / elapsed if done else 0.0
        if rate <= 0:
            return 0.5
        return min(5.0, max(0.05, 0.1 * self.config.max_pending / rate))

    def _recorded(self, rec: LiveAction, outcome: Outcome) -> None:
        """An action ended (the host calls this once per action): journal it, trace it, tell
        listeners."""
        if self.journal is not None and self.journal.is_open:
            self.journal.ended(outcome, time.time())
            self._commit_soon()
        self._persist_soon()
        self.recorder.add(
            RecordedAction(
                spec=rec.spec,
                trajectory=rec.traj,
                outcome=outcome,
                max_units=rec.max_units,
                service_size_gb=rec.size_gb,
                memory_gb=rec.memory_gb,
                seq=rec.seq,
                malleable=rec.action.malleable,
                service_replicas=rec.action.service_replicas,
                held_units=rec.held_units,
            )
        )
        for listener in self.on_outcome:
            try:
                listener(outcome)
            except Exception:
                log.exception("an outcome listener raised")

    def _persist_soon(self) -> None:
        """Arm one ``_persist`` for the outcomes of this event-loop iteration, to run
        ``PERSIST_HOPS`` iterations later: after the answers they woke are written (a waiter
        wakes through a shield, ``wait_for`` and its task, one iteration each). Measured with
        one client: run at the next iteration, the rows were on the path of every answer
        (+55 us at the median round trip of 0.44 ms); after the answers, they overlap with
        the client's own time."""
        if not self._persist_armed and self._loop is not None and not self._loop.is_closed():
            self._persist_armed = True
            self._loop.call_soon(self._persist_after, PERSIST_HOPS)

    def _persist_after(self, hops: int) -> None:
        assert self._loop is not None
        if hops > 1 and not self._loop.is_closed():
            self._loop.call_soon(self._persist_after, hops - 1)
        else:
            self._persist()

    def _commit_soon(self) -> None:
        """Arm one journal commit ``LINGER_S`` from now (outcomes and acceptances share it)."""
        if not self._commit_armed and self._loop is not None and not self._loop.is_closed():
            self._commit_armed = True
            self._loop.call_later(LINGER_S, self._commit)

    def _persist(self) -> None:
        """Append the trace rows of what ended to the stream (a failure is logged; the rows
        stay buffered for the next one) and encode the journal's outcomes."""
        self._persist_armed = False
        try:
            self.recorder.flush()
        except Exception:
            log.exception("could not append to the trace stream %s", self.recorder.path)
        if self.journal is not None and self.journal.is_open:
            self.journal.encode()

    def _commit(self) -> None:
        """Hand the journal's buffered entries to its writer thread (which commits them to
        SQLite, retrying on failure; the journal's log keeps the acceptances meanwhile)."""
        self._commit_armed = False
        if self.journal is not None and self.journal.is_open and not self.journal.flush():
            self._commit_soon()  # the writer still commits the previous batch

    def residency_changed(self, service: str, gpus: tuple[int, ...], resident: bool) -> None:
        """EOE restored or evicted ``service`` on ``gpus`` (called from any thread); a restore
        is told to the core a copy at a time (``copies_on``: per GPU, or per sharded cell)."""
        if self.gpu is None or self._loop is None:
            return
        node = self.gpu.node.name
        copies = (tuple(gpus),)
        size_gb = None  # (the core then learns the model's size from its first call)
        if resident:
            # Unregistered since (UnknownServiceError): its GPUs as one copy.
            with contextlib.suppress(KeyError):
                copies = copies_on(gpus, self.gpu.eoe.info(service).shards)
                size_gb = self.gpu.size_gb(service)
        for copy in copies:
            self._loop.call_soon_threadsafe(
                self.scheduler.report_residency, node, copy, service, resident, size_gb
            )

    # ------------------------------------------------------------------ reading
    def submissions_done(self, done: bool = True) -> None:
        """The trainer's word that every action of the step is submitted (``done``), or that
        more come (``done=False``): the default's GPU rule then stops amortising restores
        over calls that will not come (``Scheduler.submissions_done``). A hint: the next
        pass reads it; nothing is refused or reordered for it."""
        self.scheduler.submissions_done(done)

    def status(self) -> dict[str, Any]:
        """A snapshot for people and dashboards (``GET /v1/status``)."""
        return reporting.status(self)

    def trace_meta(self) -> dict[str, Any]:
        return reporting.trace_meta(self)

    def clear_trace(self) -> None:
        """Forget the actions recorded so far (e.g. a warm-up or calibration phase); later
        actions are recorded as usual."""
        self.residency_at_record_start = self.gpu.eoe.residency() if self.gpu else {}
        opened = {traj.id: traj.opened_at for traj in self.trajs.by_id.values()}
        self.recorder.clear(self.trace_meta(), opened)

    def trace(self) -> Trace:
        """The actions ended so far as a trace (format v1, open loop, observed timings)."""
        return self.recorder.trace(self.trace_meta())

    def write_trace(self, path: str | Path) -> Path:
        return self.recorder.write(path, self.trace_meta())
