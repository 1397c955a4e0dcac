"""The SimPy driver: replay a trace on a modelled cluster under one policy.

Closed loop (default): each RL step launches its trajectories at once; a trajectory alternates
LLM generation (a delay from the trace, on the training cluster, not managed here) and actions
(submitted to the core); the step ends with its last trajectory, then a training phase.
Open loop: every action arrives at its trace ``arrival_s``.

Events of one simulated instant are handed to the core together by the one driver loop
(``tangram.core.loop.DriverLoop``): SimPy's event loop flushes it once no event is left at that
instant, so a step's batch of first actions is one scheduling pass, as a live system batching
its arrivals would see it. The ``Simulation`` is the loop's host: it carries out starts,
rejects and defers, samples usage after each batch, and arms SimPy timers for wake-ups.
Nothing here is global: counters live on the ``Simulation``, every random stream has its own
seeded generator, and ties are broken by event order (SimPy's FIFO for equal times).
"""

from __future__ import annotations

import gc
from array import array
from collections.abc import Callable, Iterable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field

import numpy as np
import simpy
from simpy.core import EmptySchedule

from tangram.core.action import Action
from tangram.core.cells import aligned_cells, holds, smallest_cell_for
from tangram.core.curves import ElasticityCurve
from tangram.core.decision import Defer, Reject, Resize, Start
from tangram.core.demand import size_replicas
from tangram.core.loop import DriverLoop
from tangram.core.policies import make_policy
from tangram.core.resources import ClusterSpec, ResourceKind
from tangram.core.scheduler import Scheduler
from tangram.sim.cfs import Job, SharedNode, StaticJob, serial_fraction
from tangram.sim.config import SimConfig
from tangram.sim.demand import expected_demand
from tangram.sim.gpu_model import GpuCallModel
from tangram.sim.pods import StartupClock
from tangram.sim.residency import ResidencyModel
from tangram.trace import Trace, TraceRow, row_to_action


@dataclass(slots=True)
class ActionRecord:
    """What happened to one action (one row of the per-action results; slotted, one per action)."""

    row: TraceRow
    arrival: float
    start: float | None = None
    finish: float | None = None
    units: int = 0
    node: str = ""
    overhead: float = 0.0
    execution: float = 0.0
    restored: bool = False
    evictions: int = 0
    outcome: str = "pending"
    reason: str = ""
    deferrals: int = 0


@dataclass(slots=True)
class MalleableRun:
    """A resized action's progress: the work left when its current grant began, on how many
    cores, its noise factor and the core-seconds it used so far (one per resized action)."""

    begun: float
    units: int
    left: float
    noise: float
    core_s: float = 0.0
    version: int = 0


@dataclass
class TrajectoryRecord:
    step: int
    trajectory: str
    start: float
    end: float | None = None
    actions: int = 0


@dataclass
class StepRecord:
    step: int
    start: float
    rollout_end: float | None = None
    end: float | None = None
    trajectories: int = 0


class UsageTimeline:
    """Held cores, held GPUs and API calls in flight after each event, as typed columns.

    A run samples twice per action; columns take a third of the memory of tuples and give the
    garbage collector nothing to walk. ``rows()`` yields (time, cores, gpus, calls) tuples.
    """

    __slots__ = ("time", "held_cores", "held_gpus", "api_in_flight")

    def __init__(self) -> None:
        self.time = array("d")
        self.held_cores = array("q")
        self.held_gpus = array("q")
        self.api_in_flight = array("q")

    def append(self, time: float, cores: int, gpus: int, calls: int) -> None:
        self.time.append(time)
        self.held_cores.append(cores)
        self.held_gpus.append(gpus)
        self.api_in_flight.append(calls)

    def __len__(self) -> int:
        return len(self.time)

    def __iter__(self) -> Iterator[tuple[float, int, int, int]]:
        return self.rows()

    def rows(self) -> Iterator[tuple[float, int, int, int]]:
        return zip(self.time, self.held_cores, self.held_gpus, self.api_in_flight, strict=True)

    def columns(self) -> dict[str, np.ndarray]:
        """Each column as a numpy array (copies, so the frame outlives nothing)."""
        return {name: np.array(getattr(self, name)) for name in self.__slots__}


@dataclass
class SimResult:
    """Raw records of one run; ``tangram.sim.metrics`` turns them into tables."""

    policy: str
    cluster: ClusterSpec
    config: SimConfig
    actions: list[ActionRecord]
    trajectories: list[TrajectoryRecord]
    steps: list[StepRecord]
    #: Held cores, GPUs and API calls in flight after each event.
    timeline: UsageTimeline
    makespan: float
    decisions: int
    scheduler_seconds: float = 0.0
    extra: dict = field(default_factory=dict)
    #: Whether held units were sampled on ``timeline``: not with ``SimConfig.timeline`` off,
    #: nor under a policy that ignores capacity (``lower-bound`` takes nothing from the pool,
    #: so its held figures are unknown, not 0 beside its busy ones).
    held_sampled: bool = True


class Simulation:
    """One replay of ``trace`` on ``cluster`` under ``config.policy``."""

    def __init__(
        self,
        trace: Trace,
        cluster: ClusterSpec,
        config: SimConfig | None = None,
        *,
        progress: Callable[[int], None] | None = None,
        clock: Callable[[], float] | None = None,
    ) -> None:
        self.trace = trace
        self.cluster = cluster
        self.config = config or SimConfig()
        self.env = simpy.Environment()
        self.policy = make_policy(self.config.policy)
        self.scheduler = Scheduler(cluster, self.policy, resizable=True)
        #: Actions of the rollout step not yet submitted (None: not a step-based run).
        self._unsent: int | None = None
        self.residency = ResidencyModel(
            {n.name: n.gpu_memory_gb for n in cluster.gpu_nodes}, self.scheduler.report_residency
        )
        self.noise = np.random.default_rng(np.random.SeedSequence([self.config.seed, 0x7A1]))
        self.progress = progress
        self.clock = clock  # optional wall clock, to measure time spent in the scheduler
        self.records: dict[str, ActionRecord] = {}
        self.waiters: dict[str, Callable[[], None]] = {}
        self.trajectories: list[TrajectoryRecord] = []
        self.steps: list[StepRecord] = []
        self.timeline = UsageTimeline()
        self.startup = StartupClock(self.config.overheads)
        self.gpu_model = GpuCallModel.of(self.config.overheads, self.config.gpu_calibrations)
        self.gpu_model.check(self.scheduler.state)
        #: CPU nodes a replay may place containers on as the live run did (placement observed).
        self._observed_nodes = (
            frozenset(n.name for n in cluster.cpu_nodes)
            if self.config.placement == "observed"
            else frozenset()
        )
        self._barriers: list[StepBarrier] = []
        #: Actions resized at least once: their progress, integrated grant by grant.
        self._malleable: dict[str, MalleableRun] = {}
        #: action id -> (the thread count it was told, its curve), for actions told threads
        #: (kept only when time-slicing has a cost: ``_oversubscribed``).
        self._threads: dict[str, tuple[int, ElasticityCurve]] = {}
        self.loop = DriverLoop(self.scheduler, self, timer=clock)
        self._unbounded = self.scheduler.unbounded
        caps = self.scheduler.capabilities
        #: Its CPU grants are CFS weights (``Capabilities.cpu_lends_idle``): each action runs
        #: in its node's CFS split, weighted by its grant, and a resize changes its weight.
        self._lends_idle = caps.cpu_lends_idle and not self._unbounded
        #: node -> its running actions that share the node as CFS does (burstable pods, or
        #: grants that lend idle cycles).
        self._shared: dict[str, SharedNode] | None = (
            {
                n.name: SharedNode(n.cores, self.config.overheads.oversubscription_slowdown)
                for n in cluster.cpu_nodes
            }
            if caps.cpu_shared or self._lends_idle
            else None
        )
        #: action id -> (its node, its job), for grants that lend idle cycles (resized by weight).
        self._weighted: dict[str, tuple[str, Job]] = {}
        #: node -> when its armed wake-up fires (``_arm_shared``).
        self._armed: dict[str, float] = {}
        #: Weighted grants with no more threads than their weight (``cfs.StaticJob``): action
        #: id -> node; and those resized since (their start's timer is ignored).
        self._static: dict[str, str] = {}
        self._resized_static: set[str] = set()
        self._usage = self.scheduler.state.usage
        #: Record usage after every event (an unbounded policy holds nothing to record).
        self._sampling = self.config.timeline and not self._unbounded
        tl = self.timeline
        self._timeline_appends = (
            tl.time.append,
            tl.held_cores.append,
            tl.held_gpus.append,
            tl.api_in_flight.append,
        )

    # ------------------------------------------------------------------ run
    def run(self) -> SimResult:
        if self.cluster.gpu_nodes:  # what an operator sizing static replicas knows in advance
            self.scheduler.expect(expected_demand(self.trace, self.cluster))
        if self.config.warm_gpus and not self._unbounded and self.cluster.gpu_nodes:
            self._warm_gpus()
        if self.config.rollout.mode == "closed":
            self.env.process(self._rollout())
        else:
            self.env.process(self._open_loop())
        try:
            with _collector_paused():
                self._run_events()
        finally:
            self.loop.detach()  # the loop and its host (this run) would otherwise form a cycle
        unfinished = [r for r in self.records.values() if r.outcome == "pending"]
        held = sum(len(w) for b in self._barriers for w in b.waiting.values())
        if unfinished or held:
            # What the waiting trajectories hold: the node memory others' containers wait for
            # (named, so the message does not blame pods where containers are the cause), else
            # e.g. a static pod each.
            for_memory = len(self.scheduler.admission.waiting_for_memory)
            holds = (
                f"their containers hold the node memory that {for_memory} actions' containers "
                "wait for"
                if for_memory
                else "e.g. a pod per trajectory with fewer pods than trajectories in the step"
            )
            raise SimulationStalled(
                f"simulation stalled: {len(unfinished)} actions never ended"
                + (f" (e.g. {unfinished[0].row.action_id})" if unfinished else "")
                + (
                    f" while {held} trajectories waited at a step barrier (sync actions): they "
                    f"hold what the others wait for ({holds})"
                    if held
                    else ""
                )
            )
        return SimResult(
            policy=self.config.policy,
            cluster=self.cluster,
            config=self.config,
            actions=list(self.records.values()),
            trajectories=self.trajectories,
            steps=self.steps,
            timeline=self.timeline,
            makespan=self.env.now,
            decisions=self.loop.decisions,
            scheduler_seconds=self.loop.core_seconds,
            held_sampled=self._sampling,
        )

    def _warm_gpus(self) -> None:
        """Place each GPU service once, or the declared demand's replicas, before the run (see
        ``SimConfig.warm_gpus``)."""
        services: dict[str, float] = {}
        replicas: dict[str, bool] = {}
        for row in self.trace.rows:
            if row.resource == "gpu" and row.service:
                services[row.service] = max(services.get(row.service, 0.0), row.service_size_gb)
                replicas[row.service] = row.service_replicas
        if self.config.warm_gpus == "plan":
            self._warm_planned(services, replicas)
            return
        for service, size in sorted(services.items(), key=lambda kv: (-kv[1], kv[0])):
            best = None
            for node in self.cluster.gpu_nodes:
                k = smallest_cell_for(size, node.gpu_memory_gb, node.gpus)
                if k is None:
                    continue
                for cell in aligned_cells(node.gpus, k):
                    used = max(self.residency.used_gb(node.name, g) for g in cell)
                    per_gpu = size if replicas[service] else size / k
                    if used + per_gpu <= node.gpu_memory_gb + 1e-9:
                        key = (k, used, node.name, cell[0])
                        if best is None or key < best[0]:
                            best = (key, node.name, cell)
            if best is not None:
                self.residency.restore(best[1], best[2], service, size, replicas[service])

    def _warm_planned(self, size_gb: dict[str, float], replicas: dict[str, bool]) -> None:
        """The replicas ``size_replicas`` sizes from the declared demand, placed as
        ``sglang-sized`` places them (largest replicas first, first aligned free cell), so
        that policy finds its replicas resident and every other policy starts from the same."""
        demands = expected_demand(self.trace, self.cluster)
        plan = size_replicas(demands, sum(n.gpus for n in self.cluster.gpu_nodes))
        taken: set[tuple[str, int]] = set()
        for d in sorted(demands, key=lambda d: (-d.replica_gpus, d.service)):
            left = plan[d.service]
            for node in self.cluster.gpu_nodes:
                if not holds(
                    size_gb[d.service],
                    node.gpu_memory_gb,
                    d.replica_gpus,
                    replicas=replicas[d.service],
                ):
                    continue  # (its GPUs do not hold the model: as ``sglang-sized`` places)
                for cell in aligned_cells(node.gpus, d.replica_gpus):
                    if left and not any((node.name, g) in taken for g in cell):
                        taken.update((node.name, g) for g in cell)
                        self.residency.restore(
                            node.name, cell, d.service, size_gb[d.service], replicas[d.service]
                        )
                        left -= 1

    def _rollout(self):
        groups = self.trace.trajectories()
        by_step: dict[int, list[tuple[str, tuple[TraceRow, ...]]]] = {}
        for (step, traj), rows in groups.items():
            by_step.setdefault(step, []).append((traj, rows))
        for step in sorted(by_step):
            record = StepRecord(step, self.env.now, trajectories=len(by_step[step]))
            self.steps.append(record)
            step_done = self.env.event()
            left = [len(by_step[step])]

            def one_done(step_done: simpy.Event = step_done, left: list[int] = left) -> None:
                left[0] -= 1
                if left[0] == 0:
                    step_done.succeed()

            barrier = None
            if any(r.sync for _, rows in by_step[step] for r in rows):
                barrier = StepBarrier(f"{step}/{traj}" for traj, _ in by_step[step])
                self._barriers.append(barrier)
            if self.config.rollout.announce_step_end:
                self._unsent = sum(len(rows) for _, rows in by_step[step])
                self.scheduler.submissions_done(self._unsent == 0)
            for traj, rows in by_step[step]:
                self._trajectory(step, traj, rows, one_done, barrier)
            yield step_done
            record.rollout_end = self.env.now
            yield self.env.timeout(self.config.rollout.train_s)
            record.end = self.env.now

    def _trajectory(
        self,
        step: int,
        traj: str,
        rows: tuple[TraceRow, ...],
        on_end: Callable[[], None],
        barrier: StepBarrier | None = None,
    ) -> None:
        name = f"{step}/{traj}"
        rec = TrajectoryRecord(step, name, self.env.now, actions=len(rows))
        self.trajectories.append(rec)
        if any(r.resource == "cpu" for r in rows):
            memory = max(r.memory_gb for r in rows if r.resource == "cpu")
            # AOE creates the container now, overlapped with the first generation.
            seen = None
            if self._observed_nodes:  # placement observed: where the live run put it
                seen = next((r.obs_node for r in rows if r.resource == "cpu" and r.obs_node), None)
            node = self.scheduler.open_trajectory(
                name,
                self.env.now,
                memory_gb=memory,
                node=seen if seen in self._observed_nodes else None,
            )
            self.startup.open_container(name, node, self.env.now)
        _TrajectoryRun(self, name, rows, rec, on_end, barrier).advance()

    def _open_loop(self):
        groups = list(self.trace.trajectories().items())
        remaining = {f"{s}/{t}": len(rows) for (s, t), rows in groups}
        rows = sorted(
            (
                (r.arrival_s if r.arrival_s is not None else 0.0, f"{s}/{t}", r)
                for (s, t), rs in groups
                for r in rs
            ),
            key=lambda x: x[0],
        )

        # Each trajectory's largest CPU memory, reserved when its first CPU action arrives (as
        # the closed loop's ``_trajectory`` opens it): left to that action, the container was
        # sized by it, and a later action needing more was rejected when the node could not
        # grow the container then.
        memory = {
            f"{s}/{t}": max(r.memory_gb for r in rs if r.resource == "cpu")
            for (s, t), rs in groups
            if any(r.resource == "cpu" for r in rs)
        }

        def done(name: str) -> None:
            remaining[name] -= 1
            if remaining[name] == 0:
                self.loop.close_trajectory(name, self.env.now)

        for arrival, name, row in rows:
            if arrival > self.env.now:
                yield self.env.timeout(arrival - self.env.now)
            if row.resource == "cpu" and name in memory:
                self._open_container_memory(name, row, memory.pop(name))
            self._submit(name, row, lambda name=name: done(name))

    def _open_container_memory(self, name: str, row: TraceRow, memory_gb: float) -> None:
        """Open loop: reserve the trajectory's container with its largest memory at its first
        CPU action (no container start is modelled there, as before: only the reservation);
        pinned to the node the live run used when placement is replayed."""
        node = (
            row.obs_node if self._observed_nodes and row.obs_node in self._observed_nodes else None
        )
        self.scheduler.open_trajectory(name, self.env.now, memory_gb=memory_gb, node=node)

    # ------------------------------------------------------------------ events
    def _submit(self, traj: str, row: TraceRow, on_done: Callable[[], None]) -> None:
        """Hand the action to the core (in this instant's pass); ``on_done`` runs when it ends."""
        now = self.env.now
        action = row_to_action(row, traj, now)
        if self._observed_nodes and row.obs_node in self._observed_nodes and row.resource == "cpu":
            action.__dict__["node"] = row.obs_node  # a prevalidated record: set before it is seen
        if row.action_id in self.records:
            raise ValueError(f"trace has action id {row.action_id!r} twice")
        self.records[row.action_id] = ActionRecord(row, now)
        self.waiters[row.action_id] = on_done
        self.loop.arrive(action)
        if self._unsent is not None:
            self._unsent -= 1
            if self._unsent == 0:  # the step's last action: none arrives until the next step
                self.scheduler.submissions_done()

    def _run_events(self) -> None:
        """SimPy's event loop, flushing the driver loop once no event is left at an instant.

        (Instead of a zero-delay flush event: the same batching without one more event, and
        with every event of the instant in the batch, whenever it was scheduled.)
        """
        env, loop = self.env, self.loop
        step, peek = env.step, env.peek
        while True:
            if loop.flush_requested and peek() > env.now:
                loop.flush(env.now)
                continue
            try:
                step()
            except EmptySchedule:  # (a pending flush was handled above: peek() is inf > now)
                return

    # ------------------------------------------------------------------ the loop's host
    #: None: ``_run_events`` polls ``loop.flush_requested`` and flushes once the instant has no
    #: event left; ``handed``: the records already say what happened.
    request_flush = handed = None

    def arm_wakeup(self, when: float) -> None:
        self.env.process(self._wake(when))

    def _wake(self, when: float):
        yield self.env.timeout(when - self.env.now)
        self.loop.wake(when, self.env.now)

    def pass_failed(
        self, arrived: Sequence[Action], finished: Sequence[str], error: Exception
    ) -> None:
        raise error  # a core bug: a replay must not go on without it

    def reject(self, d: Reject) -> None:
        rec = self.records[d.action.id]
        rec.outcome, rec.reason = "rejected", d.reason
        rec.start = rec.finish = self.env.now
        self.waiters.pop(d.action.id)()

    def defer(self, d: Defer) -> None:
        self.records[d.action.id].deferrals += 1

    def settled(self, now: float) -> None:
        """Sample usage after each batch of decisions (``UsageTimeline.append``, inlined)."""
        if self._sampling:
            usage = self._usage
            time, cores, gpus, calls = self._timeline_appends
            time(now)
            cores(usage.cores)
            gpus(usage.gpus)
            calls(usage.api_calls)

    def start(self, d: Start) -> None:
        rec = self.records[d.action.id]
        now = self.env.now
        ov = self.config.overheads
        rec.start, rec.units, rec.node, rec.reason = now, d.units, d.node, d.reason
        overhead = 0.0
        slow = 1.0
        static: str | None = None
        if not self._unbounded:
            kind = d.action.resource
            if kind is ResourceKind.CPU:
                traj = d.action.trajectory
                if d.in_slot:  # a pod: created when it was granted its cores
                    since = now if d.slot_since is None else d.slot_since
                    overhead = max(0.0, self.startup.pod(traj, d.node, since) - now)
                    if self._shared is not None:
                        # No limit: all its threads (its largest option, ``d.units``) on its
                        # pod's requests' weight.
                        self._start_shared(d, rec, overhead, d.units, len(d.cores))
                        return
                else:
                    overhead = max(0.0, self.startup.container(traj, now) - now) + ov.aoe_grant_s
                    if self._lends_idle:
                        action = d.action
                        threads = d.threads or (action.max_units if action.malleable else d.units)
                        if threads > d.units:  # it may use more than its weight: CFS split
                            self._start_weighted(d, rec, overhead, threads)
                            return
                        static = d.node  # it always gets its cap: one timer, as exclusive
            elif kind is ResourceKind.GPU:
                service = d.action.service or ""
                replicas = d.action.service_replicas
                if d.in_slot:  # a dedicated replica: loaded once, at deployment
                    if not self.residency.holds(d.node, d.gpus, service):
                        self.residency.restore(
                            d.node, d.gpus, service, d.action.service_size_gb, replicas
                        )
                # EOE restores what the cell lacks, whatever the policy believed.
                elif d.restore or not self.residency.holds(d.node, d.gpus, service):
                    rec.evictions = self.residency.restore(
                        d.node, d.gpus, service, d.action.service_size_gb, replicas
                    )
                    rec.restored = True
                    restore = self.gpu_model.restore_s(
                        service,
                        d.action.service_size_gb,
                        1 if d.action.service_replicas else len(d.gpus),
                        self.scheduler.state.gpu[d.node].spec,
                        d.est_overhead,
                    )
                    overhead = restore + rec.evictions * ov.eviction_s
                self.residency.touch(d.node, d.gpus, service)
                dispatch, slow = self.gpu_model.at_start(
                    service, d.node, d.units, self.scheduler.state, d.action.id
                )
                overhead += dispatch
            else:
                overhead = ov.api_call_s
        if d.threads and self.config.overheads.oversubscription_slowdown:
            self._threads[d.action.id] = (d.threads, d.action.curve)
            slow *= self._oversubscribed(d.action.id, d.units)
        execution = d.action.curve.duration(d.units) * slow
        sigma = ov.exec_noise_sigma
        if d.action.resource is ResourceKind.GPU and ov.gpu_exec_noise_sigma is not None:
            sigma = ov.gpu_exec_noise_sigma
        if sigma > 0:
            execution *= float(self.noise.lognormal(-0.5 * sigma**2, sigma))
        rec.overhead, rec.execution = overhead, execution
        if static is not None:
            self._add_static(static, d, now + overhead, execution)
        # One timer per action (no process): busy time is derived from the records afterwards.
        self.env.timeout(overhead + execution, d.action.id).callbacks.append(self._finished)

    # ------------------------------------------------------------------ CFS-shared CPU
    def _start_weighted(self, d: Start, rec: ActionRecord, overhead: float, threads: int) -> None:
        """A grant that lends idle cycles and may borrow: its threads (told, its malleable
        pool's ``max_units``) join the node's CFS split, weighted by its grant."""
        job = self._start_shared(d, rec, overhead, threads, d.units)
        self._weighted[d.action.id] = (d.node, job)

    def _add_static(self, node: str, d: Start, begin: float, execution: float) -> None:
        """A grant that lends idle cycles with no more threads than its weight: it runs its
        curve's time on its grant (its own timer), and the node learns when its serial phase
        (one thread; the serial fraction its curve implies, as ``Job.amdahl``) leaves the
        rest of its grant idle for others to borrow."""
        units = d.units
        s = serial_fraction(units, d.action.curve.speedup(units))
        serial = execution * s / (s + (1.0 - s) / units)  # its serial phase's seconds
        job = StaticJob(float(units), float(units), begin, begin + serial, begin + execution)
        shared = self._shared[node]  # type: ignore[index]
        shared.add_static(self.env.now, d.action.id, job)
        self._static[d.action.id] = node
        if shared.flexible:  # (its phases matter only to jobs that borrow)
            self._arm_shared(node)

    def _start_shared(
        self, d: Start, rec: ActionRecord, overhead: float, threads: int, weight: int
    ) -> Job:
        """An action that shares its node as CFS does: its work (``threads`` threads, CFS
        weight ``weight`` cores) joins the node's split after its overhead."""
        curve = d.action.curve
        work = curve.t1
        ov = self.config.overheads
        if ov.exec_noise_sigma > 0:
            work *= float(self.noise.lognormal(-0.5 * ov.exec_noise_sigma**2, ov.exec_noise_sigma))
        job = Job.amdahl(work, threads, curve.speedup(threads), float(max(weight, 1)))
        rec.overhead = overhead
        if overhead > 0:
            timer = self.env.timeout(overhead, (d.node, d.action.id, job))
            timer.callbacks.append(self._overhead_done)
        else:
            self._enter_shared(d.node, d.action.id, job)
        return job

    def _overhead_done(self, timer: simpy.Event) -> None:
        self._enter_shared(*timer.value)

    def _enter_shared(self, node: str, action_id: str, job: Job) -> None:
        self._shared[node].add(self.env.now, action_id, job)  # type: ignore[index]
        self._arm_shared(node)

    def _arm_shared(self, node: str) -> None:
        """Wake up at the node's next phase end, unless a wake-up no later is armed (it
        re-arms when it fires: one timer per phase end, not one per re-split)."""
        when = self._shared[node].next_finish()  # type: ignore[index]
        if when is None:
            return
        armed = self._armed.get(node)
        if armed is not None and armed <= when:
            return
        self._armed[node] = when
        wake = self.env.timeout(max(0.0, when - self.env.now), (node, when))
        wake.callbacks.append(self._wake_shared)

    def _wake_shared(self, timer: simpy.Event) -> None:
        node, when = timer.value
        if self._armed.get(node) != when:
            return  # an earlier wake-up was armed since
        del self._armed[node]
        shared = self._shared[node]  # type: ignore[index]
        now = self.env.now
        for action_id, job in shared.finish_due(now):
            rec = self.records[action_id]
            rec.execution = now - rec.start - rec.overhead
            # The mean cores it received, so that busy core-seconds (units x execution) are
            # its work.
            rec.units = job.total / rec.execution if rec.execution > 0 else job.threads
            self._weighted.pop(action_id, None)
            self._complete(action_id)
        self._arm_shared(node)

    def _finished(self, timer: simpy.Event) -> None:
        action_id = timer.value
        if action_id in self._malleable:
            return  # resized since: its own timer ends it
        node = self._static.pop(action_id, None)
        if node is not None:
            shared = self._shared[node]  # type: ignore[index]
            job = shared.remove_static(self.env.now, action_id)
            rec = self.records[action_id]
            # The cores it used: one in its serial phase, its threads after (busy core-s are
            # its work, as for the jobs of the CFS split).
            if rec.execution > 0:
                rec.units = job.work / rec.execution
            if shared.flexible:
                self._arm_shared(node)
        elif action_id in self._resized_static:
            self._resized_static.discard(action_id)
            return  # resized since: it runs in the CFS split now
        self._complete(action_id)

    # ------------------------------------------------------------------ malleable grants
    def resize(self, d: Resize) -> None:
        """A running action's cores changed: the work it did so far ran at its curve's rate on
        the old cores (Amdahl), the work left runs on the new ones."""
        action_id, curve = d.action.id, d.action.curve
        rec = self.records[action_id]
        if rec.finish is not None:
            # It ended this instant and the core has not seen that yet (a trajectory's close
            # passes before the instant's completions are flushed): nothing left to run.
            return
        node = self._static.pop(action_id, None)
        if node is not None:
            self._unstatic(node, d)
            return
        weighted = self._weighted.get(action_id)
        if weighted is not None:
            self._reweigh(weighted[0], action_id, weighted[1], d.units)
            return
        now = self.env.now
        run = self._malleable.get(action_id)
        over = self._oversubscribed
        if run is None:  # its first resize: its start's timer no longer ends it
            planned = curve.duration(rec.units) * over(action_id, int(rec.units))
            noise = rec.execution / planned if planned > 0 else 1.0
            run = self._malleable[action_id] = MalleableRun(
                rec.start + rec.overhead, int(rec.units), 1.0, noise
            )
        if now > run.begun:
            on_old = run.noise * curve.duration(run.units) * over(action_id, run.units)
            run.left = max(0.0, run.left - (now - run.begun) / on_old) if on_old > 0 else 0.0
            run.core_s += run.units * (now - run.begun)
            run.begun = now
        run.units = d.units
        run.version += 1
        ends = run.begun + run.left * run.noise * curve.duration(d.units) * over(action_id, d.units)
        timer = self.env.timeout(max(0.0, ends - now), (action_id, run.version))
        timer.callbacks.append(self._finished_malleable)

    def _unstatic(self, node: str, d: Resize) -> None:
        """A static job resized: what it had left joins the CFS split at its new weight (its
        own timer is ignored from now)."""
        now = self.env.now
        action_id = d.action.id
        static = self._shared[node].remove_static(now, action_id)  # type: ignore[index]
        self._resized_static.add(action_id)
        work, serial = static.left_at(now)
        job = Job(work, static.threads, float(max(d.units, 1)), total=static.work, serial=serial)
        self._weighted[action_id] = (node, job)
        if now < static.begin:  # still in its overhead: it joins when its work begins
            timer = self.env.timeout(static.begin - now, (node, action_id, job))
            timer.callbacks.append(self._overhead_done)
        else:
            self._enter_shared(node, action_id, job)

    def _reweigh(self, node: str, action_id: str, job: Job, units: int) -> None:
        """A weighted grant resized: from now on its CFS weight is its new grant (work done so
        far was done at the old split; one ``cpu.weight`` write live)."""
        shared = self._shared[node]  # type: ignore[index]
        shared.reweigh(self.env.now, action_id, job, float(max(units, 1)))
        if action_id in shared.jobs:
            self._arm_shared(node)

    def _oversubscribed(self, action_id: str, units: int) -> float:
        """Its time's factor on ``units`` cores while it was told more threads than that
        (``Start.threads``), else 1: its parallel part runs ``slowdown`` slower, the serial
        fraction its curve implies at its thread count (Amdahl, as ``cfs.Job.amdahl``) not,
        the same charge as a burstable pod's parallel phase."""
        slowdown = self.config.overheads.oversubscription_slowdown
        told = self._threads.get(action_id)
        if not slowdown or told is None or units >= told[0]:
            return 1.0
        threads, curve = told
        speedup = curve.speedup(threads)
        serial = serial_fraction(threads, speedup)
        parallel = (1.0 - serial) / units
        return (serial + parallel / (1.0 - slowdown)) / (serial + parallel)

    def _finished_malleable(self, timer: simpy.Event) -> None:
        action_id, version = timer.value
        run = self._malleable[action_id]
        if version != run.version:
            return  # resized again since this timer was armed
        # (It stays in ``_malleable``: its start's timer, still armed, must find it there.)
        run.version = -1
        rec = self.records[action_id]
        now = self.env.now
        run.core_s += run.units * max(0.0, now - run.begun)
        rec.execution = now - rec.start - rec.overhead
        # The mean cores it held while executing, so busy core-seconds (units x execution)
        # are what it used.
        rec.units = run.core_s / rec.execution if rec.execution > 0 else run.units
        self._complete(action_id)

    def _complete(self, action_id: str) -> None:
        rec = self.records[action_id]
        rec.finish = self.env.now
        rec.outcome = "result"
        self.loop.finish(action_id)
        self.waiters.pop(action_id)()
        if self.progress:
            self.progress(1)


@contextmanager
def _collector_paused() -> Iterator[None]:
    """Pause Python's cyclic garbage collector for the event loop, then restore it.

    A run allocates a few objects per action and keeps most of them (records, decisions), so
    the collector's periodic passes over everything alive cost 10-15% of a large run while
    finding nothing: a run creates no reference cycles (a test checks that the garbage left is
    the same for small and large traces). Reference counting still frees everything else.
    The pause is process-wide: cycles other threads or a ``progress`` callback make during the
    run are collected after it.
    """
    was_enabled = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if was_enabled:
            gc.enable()


class _TrajectoryRun:
    """One trajectory as a chain of callbacks: generation, action, generation, ...

    (Callbacks rather than a SimPy process per trajectory: the same events in the same order,
    without a generator resumed twice per action. An object rather than closures: closures
    that call each other form reference cycles, garbage the collector must find later.)
    """

    __slots__ = ("sim", "name", "rows", "next", "record", "on_end", "barrier", "synced")

    def __init__(
        self,
        sim: Simulation,
        name: str,
        rows: tuple[TraceRow, ...],
        record: TrajectoryRecord,
        on_end: Callable[[], None],
        barrier: StepBarrier | None = None,
    ) -> None:
        self.sim, self.name, self.rows, self.record, self.on_end = sim, name, rows, record, on_end
        self.barrier = barrier
        self.next = 0
        self.synced = 0  # sync actions passed

    def advance(self) -> None:
        """The previous action ended (or the trajectory starts): generate, then the next one."""
        rows, i = self.rows, self.next
        env = self.sim.env
        if i == len(rows):
            gen_after = rows[-1].gen_after_s if rows else 0.0
            if gen_after:
                env.timeout(gen_after).callbacks.append(self._finish)
            else:
                self._finish()
            return
        self.next = i + 1
        row = rows[i]
        if row.gen_before_s or row.sync:
            env.timeout(row.gen_before_s, row).callbacks.append(self._submit)
        else:
            self.sim._submit(self.name, row, self.advance)

    def _submit(self, generated: simpy.Event) -> None:
        row = generated.value
        if row.sync and self.barrier is not None:
            self.synced += 1
            self.barrier.reach(self.name, self.synced, lambda: self._submit_now(row))
        else:
            self.sim._submit(self.name, row, self.advance)

    def _submit_now(self, row: TraceRow) -> None:
        self.sim._submit(self.name, row, self.advance)

    def _finish(self, _event: object = None) -> None:
        sim = self.sim
        now = sim.env.now
        sim.loop.close_trajectory(self.name, now)
        sim.startup.forget(self.name)
        self.record.end = now
        if self.barrier is not None:
            self.barrier.end(self.name)
        self.on_end()


class SimulationStalled(RuntimeError):
    """The event queue emptied with actions left: what they waited for never came."""


class StepBarrier:
    """Holds a step's ``sync`` actions until every trajectory of the step has reached the
    same one (its k-th) or ended: a batch-synchronous reward or judge."""

    __slots__ = ("members", "ended", "waiting", "released")

    def __init__(self, members: Iterable[str]) -> None:
        self.members = frozenset(members)
        self.ended: set[str] = set()
        #: round k -> trajectory -> the continuation that submits its k-th sync action.
        self.waiting: dict[int, dict[str, Callable[[], None]]] = {}
        self.released = 0  # rounds released

    def reach(self, trajectory: str, round_: int, go: Callable[[], None]) -> None:
        self.waiting.setdefault(round_, {})[trajectory] = go
        self._release()

    def end(self, trajectory: str) -> None:
        self.ended.add(trajectory)
        self._release()

    def _release(self) -> None:
        while True:
            k = self.released + 1
            here = self.waiting.get(k, {})
            if len(here) + len(self.ended - here.keys()) < len(self.members) or not here:
                return
            self.released = k
            for go in self.waiting.pop(k).values():
                go()


def simulate(
    trace: Trace, cluster: ClusterSpec, config: SimConfig | None = None, **kwargs
) -> SimResult:
    """Run one simulation (see ``Simulation``)."""
    return Simulation(trace, cluster, config, **kwargs).run()
