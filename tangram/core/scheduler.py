"""The scheduler: the event-driven front of the core, one per cluster, driving one policy.

Drivers (the simulator, the live runtime, through ``tangram.core.loop``) hand it each
instant's events with the current time and carry out the decisions it returns. ``advance``
reads as what it does: completions return their units, arrivals are admitted and queued, then
one pass of the policy over every domain the events touched. The parts, one job each:
``backlog`` (what waits), ``running`` (what runs), ``admission`` (feasibility, container
memory), ``options`` (an action's unit options), ``starts`` (the one way an action starts),
``context`` (a pass), ``fastpaths`` (the speed shortcuts, behind one switch). The scheduler never reads a clock and iterates only
insertion-ordered containers, so the same events always give the same decisions.
"""

from __future__ import annotations

import math
import numbers
from collections.abc import Collection, Sequence
from typing import Any

from tangram.core.action import Action
from tangram.core.admission import Admission, TrajectoryState
from tangram.core.arrivals import ArrivalStats
from tangram.core.backlog import GPU_DOMAIN, Backlog, Domain, FcfsQueue
from tangram.core.capabilities import Capabilities
from tangram.core.context import Context
from tangram.core.decision import Decision, Reject, Start
from tangram.core.demand import ServiceDemand
from tangram.core.fastpaths import FAST, FastPaths
from tangram.core.options import Options, OptionsBuilder
from tangram.core.resources import ClusterSpec, CpuNodeSpec, GpuNodeSpec, ResourceKind
from tangram.core.running import Running, RunningSet
from tangram.core.starts import start_action
from tangram.core.state import CapacityError, ClusterState

__all__ = [
    "GPU_DOMAIN",
    "Context",
    "Domain",
    "FcfsQueue",
    "Options",
    "Running",
    "Scheduler",
    "TrajectoryState",
]

_CLOSED = "trajectory {} closed while the action was queued"
_UNDONE = "the open of trajectory {} was undone (no container) while the action was queued"
_INF = math.inf


def capabilities_of(policy: object) -> Capabilities:
    """The policy's declared ``Capabilities`` (a policy must declare them)."""
    caps = getattr(policy, "capabilities", None)
    if not isinstance(caps, Capabilities):
        raise TypeError(
            f"policy {policy!r} declares no capabilities: give it a `capabilities` attribute "
            "(tangram.core.capabilities.Capabilities; docs/core.md, 'Writing a policy')"
        )
    return caps


class Scheduler:
    """Event-driven front of the core: one per cluster, driving one policy."""

    def __init__(
        self,
        cluster: ClusterSpec,
        policy: Any,
        *,
        fast: FastPaths = FAST,
        resizable: bool = False,
    ) -> None:
        caps = capabilities_of(policy)
        #: The driver applies ``Resize`` decisions to running actions (a driver that cannot
        #: says False, and the policy then keeps every grant as it started).
        self.resizable = resizable
        self.cluster = cluster
        self.policy = policy
        self.capabilities = caps
        self.fast = fast
        self.respects_capacity = caps.respects_capacity
        #: The lower bound: starts hold nothing and nothing is checked for fit.
        self.unbounded = not caps.respects_capacity
        self.state = ClusterState(cluster)
        self.backlog = Backlog()
        self.runs = RunningSet()
        #: How long trajectories generate between actions, per node: kept only for a policy
        #: that reads it (``Capabilities.tracks_arrivals``), so no other pays for it per event.
        self.arrivals = ArrivalStats() if caps.tracks_arrivals else None
        self.option_builder = OptionsBuilder(cluster, respects_capacity=caps.respects_capacity)
        self.admission = Admission(
            cluster, self.state, self.option_builder, respects_capacity=caps.respects_capacity
        )
        self.wakeup: float | None = None
        self.now = 0.0
        #: The driver said no action arrives until it says otherwise (``submissions_done``):
        #: a rollout step whose trajectories have all sent their last action.
        self.no_more_arrivals = False
        #: Domains a withdrawal left since their last pass (``withdraw``, ``after_withdrawals``).
        self._vacated: dict[Domain, None] = {}
        #: A withdrawn action waiting for memory had others of its trajectory behind it:
        #: ``after_withdrawals`` retries them (they waited only behind it).
        self._memory_vacated = False
        #: Shortcuts in force: the switch and what the policy promises (``tangram.core.fastpaths``).
        self._skip_idle = caps.queue_driven and fast.idle_finish
        self._alone = caps.alone if fast.lone_arrival else None
        self._skip_placed_checks = fast.placed_arrival
        #: The policy may resize running malleable actions, and this driver applies resizes.
        self._resizes = caps.resizes and resizable
        self._cpu_domains: dict[str | None, Domain] = {n: ("cpu", n) for n in self.state.cpu}
        # The parts' members the hot path reads on every event, bound once.
        self._queues = self.backlog.queues
        self._running = self.runs.by_id
        self._seen = self.admission.seen
        self._placed_node = self.admission.placed_node
        self._options_for = self.option_builder.for_action
        #: Fenced nodes (``fence_node``): node -> the holder of their GPUs; shared with the
        #: admission, which places no container there. Empty: nothing is fenced.
        self.fenced: dict[str, str] = self.admission.fenced
        #: Container memory each fenced CPU node's fence holds (GB).
        self.fenced_memory_gb: dict[str, float] = {}

    # ------------------------------------------------------------------ events
    def submit(self, action: Action, now: float) -> list[Decision]:
        """An action arrived. Returns the decisions this caused (possibly its own rejection)."""
        return self.advance(now, arrived=[action])

    def submit_many(self, actions: list[Action], now: float) -> list[Decision]:
        """Actions that arrived at the same instant, scheduled in one pass.

        Drivers should group simultaneous arrivals (a step's batch, a burst of tool calls):
        one pass sees them all as candidates instead of the first taking every free unit.
        """
        return self.advance(now, arrived=actions)

    def finish(self, action_id: str, now: float) -> list[Decision]:
        """A running action ended (whatever the outcome); its units return to the pool."""
        return self.advance(now, finished=[action_id])

    def finish_many(self, action_ids: list[str], now: float) -> list[Decision]:
        """Actions that ended at the same instant, then one scheduling pass."""
        return self.advance(now, finished=action_ids)

    def advance(
        self, now: float, *, finished: Sequence[str] = (), arrived: Sequence[Action] = ()
    ) -> list[Decision]:
        """All events of one instant: completions first (their units return), then arrivals,
        then a single scheduling pass over every domain they touched."""
        if not self.now - 1e-9 <= now < _INF:  # (before anything changes)
            self._refuse_time(now)
        running = self._running
        for action_id in finished:
            if action_id not in running:
                raise KeyError(f"finish of {action_id!r}, which is not running")
        if len(finished) > 1 and len(set(finished)) < len(finished):
            twice = next(a for i, a in enumerate(finished) if a in finished[:i])
            raise ValueError(f"finish of {twice!r} given twice at one instant")
        for action in arrived:  # (before the completions return their units)
            if not isinstance(action, Action):
                raise TypeError(f"an arrival must be an Action, got {action!r}")
        if not arrived and self._skip_idle and self._finished_idle(now, finished):
            return []
        placed_node = self._placed_node
        lone = self._alone is not None and len(arrived) == 1 and not finished
        if lone:
            node = placed_node(arrived[0])
            if node is not None:
                return self._arrive_alone(arrived[0], node, now)
        ctx = self._begin(now)
        if finished:
            self._complete(ctx, finished)
        # (A lone arrival was just found not placed: no second look.)
        skip_checks = self._skip_placed_checks and not lone
        for action in arrived:  # admission: enqueue, hold for memory, or refuse
            if skip_checks and placed_node(action) is not None:
                self._seen.add(action.id)  # (``FastPaths.placed_arrival``: nothing to check)
                self._enqueue(ctx, action)
            else:
                self._admit(ctx, action)
        if ctx.dirty or ctx.arrived or ctx.finished:  # the pass (``_pass``, inline)
            self.policy.schedule(ctx)
        return ctx.decisions

    def open_trajectory(
        self, trajectory: str, now: float, *, memory_gb: float = 0.0, node: str | None = None
    ) -> str | None:
        """Place a trajectory's container: returns its CPU node, or None when memory is short now.

        Optional: a CPU action of an unopened trajectory opens it with the action's memory.
        A trajectory already open (its container placed) keeps it: an open asking no more
        memory and no other node returns its node; one pinning it to another node, or asking
        more memory than its container has, is refused (``ValueError``, naming both) before
        anything changes: it was answered with the old node as if it had been granted.
        """
        if not self.now - 1e-9 <= now < _INF:  # (before the container is placed)
            self._refuse_time(now)
        if not isinstance(trajectory, str) or not trajectory:  # (as an Action's trajectory)
            raise ValueError(f"a trajectory needs a non-empty string id, got {trajectory!r}")
        if node is not None and node not in self.state.cpu:
            raise ValueError(f"trajectory {trajectory!r}: unknown CPU node {node!r}")
        if (
            not isinstance(memory_gb, numbers.Real)
            or isinstance(memory_gb, bool)
            or not 0 <= memory_gb < _INF
        ):
            raise ValueError(
                f"trajectory {trajectory!r}: memory_gb must be a finite number >= 0, "
                f"got {memory_gb!r}"
            )
        placed = self.admission.trajectories.get(trajectory)
        if placed is not None and placed.node is not None:  # already open: the same asked?
            if node is not None and node != placed.node:
                raise ValueError(
                    f"trajectory {trajectory!r} is open on node {placed.node!r}: an open "
                    f"pinning it to {node!r} is refused (close it first)"
                )
            if memory_gb > placed.memory_gb + 1e-9:
                raise ValueError(
                    f"trajectory {trajectory!r} is open with {placed.memory_gb} GB of "
                    f"container memory: an open asking {memory_gb} GB is refused (a container "
                    "does not grow at an open; close it first, or open it with its largest)"
                )
        self.now = max(self.now, now)
        traj = self.admission.trajectory(trajectory)
        if traj.node is None and self.respects_capacity:
            self.admission.bind(traj, memory_gb, node)
            if traj.node is None:  # no room now: its first CPU action places it with this
                traj.asked_gb = max(traj.asked_gb, memory_gb)
            else:
                # Reservations only (a static pod); starts happen in the next pass.
                ctx = self._begin(now)
                self.policy.on_trajectory_open(ctx, trajectory, traj.node)
                if ctx.decisions:
                    raise RuntimeError(
                        f"policy decided {len(ctx.decisions)} actions at a trajectory open"
                    )
        return traj.node

    def submissions_done(self, done: bool = True) -> None:
        """The driver's word that no action arrives until it says ``done=False`` (the
        trainer has submitted every action of the step's rollouts: no call to come for a
        restore to be amortised over); optional, off by default."""
        self.no_more_arrivals = done

    def expect(self, demands: tuple[ServiceDemand, ...]) -> None:
        """Tell the policy the load each GPU service is expected to get, before any action
        (``tangram.core.demand``: a static baseline sizes its replicas from it). A service
        declared twice, or an entry that is no ``ServiceDemand``, is refused (``ValueError``)
        before the policy hears of any: it raised out of the first call's pass."""
        demands = tuple(demands)
        seen: set[str] = set()
        for d in demands:
            if not isinstance(d, ServiceDemand):
                raise ValueError(f"expect: {d!r} is no ServiceDemand")
            if d.service in seen:
                raise ValueError(f"expect: service {d.service!r} is declared twice")
            seen.add(d.service)
        self.policy.expect(demands)

    def close_trajectory(
        self,
        trajectory: str,
        now: float,
        *,
        opened: bool = True,
        ended: Collection[str] = (),
    ) -> list[Decision]:
        """The trajectory ended: its container's memory (and any static slot) is freed.

        Actions of it still queued are rejected: nobody will collect their results.
        ``opened`` False: an open that failed (no room, or no container) is undone; the
        actions labelled with the id are not its (GPU and API work may carry any label, the
        trajectory never opened) and keep their places, but CPU actions queued in the
        container it had been given are rejected (it is gone).

        A CPU action of it still running would be left without the memory and cores it runs
        in (another container placed in that memory, a static pod's cores given to another
        trajectory's action), so such a close is refused (``ValueError``) before anything
        changes, unless the action is in ``ended``: the ids whose finish the driver holds,
        not yet handed over (``DriverLoop`` passes its buffered finishes; the simulator
        closes a trajectory at its last action's end, that finish buffered for the instant's
        pass).
        """
        if not self.now - 1e-9 <= now < _INF:  # (before anything is checked or changes)
            self._refuse_time(now)
        running = self._running_in_container(trajectory, ended)
        if running:
            raise ValueError(
                f"close of trajectory {trajectory!r} while its CPU actions {running} run: "
                "its container's memory (and a static pod's cores) would be freed under them; "
                "close it once they end"
            )
        ctx = self._begin(now)
        if opened:
            self._reject_closed(ctx, trajectory, now)
        else:
            self._reject_uncontained(ctx, trajectory)
        ctx.closed = [trajectory]
        node = self.admission.release(trajectory)
        self.policy.on_trajectory_close(ctx, trajectory)
        if node is not None and node in self.fenced:
            self._hold_fenced(node)  # (its memory to the fence: no container placed there)
        elif node is not None:
            ctx.dirty[("cpu", node)] = None
            self._retry_memory_waiters(ctx)
        return self._pass(ctx)

    def _running_in_container(self, trajectory: str, ended: Collection[str]) -> list[str]:
        """The trajectory's CPU actions running in its container (on its node), less ``ended``."""
        traj = self.admission.trajectories.get(trajectory)
        if traj is None or traj.node is None or self.unbounded:
            return []
        on_node = self.runs.by_domain.get(self._cpu_domains.get(traj.node) or ("cpu", traj.node))
        if not on_node:
            return []
        return [
            aid
            for aid, r in on_node.items()
            if r.action.trajectory == trajectory
            and r.action.resource is ResourceKind.CPU
            and aid not in ended
        ]

    def _reject_closed(self, ctx: Context, trajectory: str, now: float) -> None:
        """Reject the closed trajectory's queued actions and forget its arrivals."""
        for action in list(self.backlog.by_trajectory.get(trajectory, {}).values()):
            ctx.reject(action, _CLOSED.format(trajectory))
            self._left_queue(action)
        waiting = self.admission.waiting_for_memory
        for aid, action in list(waiting.items()):
            if action.trajectory == trajectory:
                del waiting[aid]
                ctx.decisions.append(Reject(now, action, _CLOSED.format(trajectory)))
        if self.arrivals is not None:
            self.arrivals.closed(trajectory)

    def _reject_uncontained(self, ctx: Context, trajectory: str) -> None:
        """An undone open (``close_trajectory(opened=False)``) of a bound trajectory: its CPU
        actions queued on the container's node have no container now (left queued, they
        started there with no memory held for them); they are rejected. Other work labelled
        with the id keeps its place, as do CPU actions waiting for a container to be placed."""
        traj = self.admission.trajectories.get(trajectory)
        if traj is None or traj.node is None:
            return
        for action in list(self.backlog.by_trajectory.get(trajectory, {}).values()):
            if action.resource is ResourceKind.CPU:
                ctx.reject(action, _UNDONE.format(trajectory))
                self._left_queue(action)

    def withdraw(self, action_id: str, now: float) -> bool:
        """Take back a queued action (its client cancelled it or timed out waiting).

        It leaves the queue with no decision and frees nothing (it held nothing); the policy
        drops what it kept under its id. False when it is not waiting: already started, ended,
        or never submitted.
        """
        if not self.now - 1e-9 <= now < _INF:
            self._refuse_time(now)
        self.now = max(self.now, now)
        waiting = self.admission.waiting_for_memory.pop(action_id, None)
        if waiting is not None:
            if self.admission.waits(waiting.trajectory):  # (one behind it may fit now)
                self._memory_vacated = True
            return True
        domain = self.backlog.domain_of.get(action_id)
        if domain is None:
            return False
        action = self.backlog.queues[domain].live[action_id]
        self.backlog.remove(action)
        self._left_queue(action)
        self._vacated[domain] = None
        return True

    def after_withdrawals(self, now: float) -> list[Decision]:
        """A pass over the domains withdrawals left since (none: no pass). A withdrawn action
        may have held the others back (a FCFS head waiting for more units than are free, a
        call a cell was kept for): without it they may start now, not at the next event."""
        if not self.now - 1e-9 <= now < _INF:  # (before the domains are taken)
            self._refuse_time(now)
        vacated, self._vacated = self._vacated, {}
        retry, self._memory_vacated = self._memory_vacated, False
        if not vacated and not retry:
            return []
        ctx = self._begin(now)
        ctx.dirty.update(vacated)
        if retry:
            self._retry_memory_waiters(ctx)
        return self._pass(ctx)

    def _left_queue(self, action: Action) -> None:
        """A queued action left without a decision of the policy's (withdrawn, or rejected as
        its trajectory closed): the policy drops what it kept under the id, which the driver
        may forget and reuse (``on_withdraw``, an optional hook: ``BasePolicy`` has it)."""
        hook = getattr(self.policy, "on_withdraw", None)
        if hook is not None:
            hook(action)

    def forget(self, action_id: str) -> None:
        """Stop remembering an ended action's id, which the core keeps to refuse its reuse: a
        driver that guards ids itself (the live runtime's journal) calls this, so a long run
        does not keep every id it ever saw. Reusing a forgotten id is the driver's to refuse.
        An id still queued, waiting for its container's memory or running stays known."""
        if (
            action_id not in self._running
            and action_id not in self.backlog.domain_of
            and action_id not in self.admission.waiting_for_memory
        ):
            self._seen.discard(action_id)

    def tick(self, now: float) -> list[Decision]:
        """A wake-up the scheduler asked for (``next_wakeup``): rate tokens may be free now."""
        ctx = self._begin(now)
        for name in self.state.api:
            ctx.dirty[("api", name)] = None
        return self._pass(ctx)

    def add_node(self, node: CpuNodeSpec | GpuNodeSpec, now: float) -> list[Decision]:
        """A node joined the running cluster: its capacity is the core's from now on, and
        the decisions this causes (work waiting for room may start there). A CPU node takes
        containers waiting for memory and later opens; a GPU node's cells serve queued calls,
        whose options widen if it is larger. A node of neither kind, or a name its kind
        already has, is refused (``ValueError``) and nothing changes."""
        cluster = self.cluster.with_node(node)  # (refuses before anything changes)
        node = (cluster.cpu_nodes if isinstance(node, CpuNodeSpec) else cluster.gpu_nodes)[-1]
        ctx = self._begin(now)
        self.cluster = cluster
        self.state.add_node(cluster, node)
        self.option_builder.add_node(node)
        self.admission.add_node(cluster)
        if isinstance(node, CpuNodeSpec):
            self._cpu_domains[node.name] = ("cpu", node.name)
            ctx.dirty[("cpu", node.name)] = None
            self._retry_memory_waiters(ctx)
        else:
            self._widen_gpu_options()
            ctx.dirty[GPU_DOMAIN] = None
        return self._pass(ctx)

    def fence_node(self, node: str, holder: str) -> None:
        """Hold node ``node``'s free capacity so nothing new is placed there (a driver's node
        that is lost or not up yet): its free GPUs go to ``holder`` (``GpuNodeState.owner``),
        its free container memory to the fence (``fenced_memory_gb``), no container is
        placed there (``Admission.bind``), and the GPUs and memory its running actions and
        containers give back go straight to the fence (``_release``, ``close_trajectory``),
        so no pass starts work on them. A fenced node fenced again holds what is free now.
        CPU actions of containers already there are not held (they have no other node: the
        driver ends them). Unknown node: ``ValueError``."""
        if node not in self.state.cpu and node not in self.state.gpu:
            raise ValueError(f"fence of unknown node {node!r}")
        if not isinstance(holder, str) or not holder:
            raise ValueError(f"fence of {node!r}: the holder must be a non-empty str")
        old = self.fenced.get(node)
        if old is not None and old != holder:
            raise ValueError(f"node {node!r} is fenced by {old!r}, not {holder!r}")
        self.fenced[node] = holder
        self._hold_fenced(node)

    def unfence_node(self, node: str, now: float) -> list[Decision]:
        """Lift ``fence_node``: the node's fenced GPUs and memory are free again, and a pass
        over its domains starts queued work there (the containers waiting for memory are
        retried). Not fenced: nothing changes, no decision."""
        holder = self.fenced.pop(node, None)
        if holder is None:
            return []
        ctx = self._begin(now)
        gpu = self.state.gpu.get(node)
        if gpu is not None:
            held = tuple(g for g, owner in enumerate(gpu.owner) if owner == holder)
            for g in held:
                gpu.give((g,), holder)
            if held:
                ctx.dirty[GPU_DOMAIN] = None
        memory = self.fenced_memory_gb.pop(node, 0.0)
        cpu = self.state.cpu.get(node)
        if cpu is not None:
            cpu.give_memory(memory)
            ctx.dirty[("cpu", node)] = None
            self._retry_memory_waiters(ctx)
        return self._pass(ctx)

    def _hold_fenced(self, node: str) -> None:
        """The fenced node's free GPUs and container memory go to its fence."""
        gpu = self.state.gpu.get(node)
        if gpu is not None:
            holder = self.fenced[node]
            for g, owner in enumerate(gpu.owner):
                if owner is None:
                    gpu.take((g,), holder)
        cpu = self.state.cpu.get(node)
        if cpu is not None and cpu.memory_free_gb > 0:
            free = cpu.memory_free_gb
            cpu.take_memory(free)
            self.fenced_memory_gb[node] = self.fenced_memory_gb.get(node, 0.0) + free

    def report_residency(
        self,
        node: str,
        gpus: tuple[int, ...],
        service: str,
        resident: bool,
        size_gb: float | None = None,
    ) -> None:
        """The GPU executor restored one copy of a service as the cell ``gpus`` (resident=True;
        whole replicas a GPU at a time) or evicted it from these GPUs (``GpuNodeState``);
        ``size_gb``: the model's size when the executor knows it (the memory the copy takes,
        for a service whose calls have not told the core yet)."""
        self.state.report_residency(node, gpus, service, resident, size_gb)

    # ------------------------------------------------------------------ reading
    @property
    def next_wakeup(self) -> float | None:
        return self.wakeup

    @property
    def queued(self) -> int:
        return len(self.backlog) + len(self.admission.waiting_for_memory)

    @property
    def running(self) -> dict[str, Running]:
        """Running actions by id."""
        return self.runs.by_id

    @property
    def trajectories(self) -> dict[str, TrajectoryState]:
        return self.admission.trajectories

    @property
    def queues(self) -> dict[Domain, FcfsQueue]:
        return self.backlog.queues

    @property
    def domain_of(self) -> dict[str, Domain]:
        return self.backlog.domain_of

    @property
    def options(self) -> dict[str, Options]:
        return self.backlog.options

    # ------------------------------------------------------------------ internals
    def _clock_to(self, now: float) -> None:
        """Move the core's time to an event's (never backwards); a due wake-up is spent."""
        if not self.now - 1e-9 <= now < _INF:
            self._refuse_time(now)
        if now > self.now:
            self.now = now
        if self.wakeup is not None and self.wakeup <= now:
            self.wakeup = None

    def _refuse_time(self, now: object) -> None:
        """An event's time that is not a finite number at or after the core's (``now`` failed
        ``self.now - 1e-9 <= now < inf``): NaN compared false with every time and was taken,
        an infinite one refused every later event as going backwards."""
        if not isinstance(now, int | float) or isinstance(now, bool) or not math.isfinite(now):
            raise ValueError(f"event time must be a finite number of seconds, got {now!r}")
        raise ValueError(f"time went backwards: event at {now} after {self.now}")

    def _begin(self, now: float) -> Context:
        """A pass at ``now``: the clock moves (``_clock_to``, inline), dead queue entries go."""
        if not self.now - 1e-9 <= now < _INF:
            self._refuse_time(now)
        if now > self.now:
            self.now = now
        if self.wakeup is not None and self.wakeup <= now:
            self.wakeup = None
        touched = self.backlog._touched
        if touched:  # (``Backlog.compact``, inline: every pass asks)
            for queue in touched:
                queue.compact()
            touched.clear()
        return Context(self, now)

    def _pass(self, ctx: Context) -> list[Decision]:
        """The policy's pass over the domains the events touched (none touched: no pass)."""
        if ctx.dirty or ctx.arrived or ctx.finished:
            self.policy.schedule(ctx)
        return ctx.decisions

    def _complete(self, ctx: Context, finished: Sequence[str]) -> None:
        """Running actions ended: they stop running and their units return to the pool."""
        pop = self.runs.pop
        for action_id in finished:
            running = pop(action_id)
            self._release(running.start)
            ctx.finished.append(running)
            ctx.dirty[running.domain] = None

    def _finished_idle(self, now: float, finished: Sequence[str]) -> bool:
        """Completions that free units nobody waits for: return their units and say so (True),
        so the pass is skipped (``FastPaths.idle_finish``, for a queue-driven policy, whose pass
        would decide nothing); False, doing nothing, when an action waits where they free units.
        (The commonest event of a replay: the clock move and the running set's pop, inline.)"""
        queues, running = self._queues, self._running
        growable = self.runs.growable if self._resizes else None
        for action_id in finished:
            domain = running[action_id].domain
            queue = queues.get(domain)
            if queue is not None and queue.live:
                return False
            if growable and growable.get(domain):  # freed cores may grow a running action
                return False
        self._clock_to(now)
        pop = self.runs.pop
        for action_id in finished:
            self._release(pop(action_id).start)
        return True

    def _admit(self, ctx: Context, action: Action) -> None:
        """An arrival's full admission: refused if infeasible, held while its container waits
        for memory, else queued on its domain."""
        admission = self.admission
        problem = admission.infeasible(action)
        if problem:
            ctx.decisions.append(Reject(ctx.now, action, problem))
            return
        admission.seen.add(action.id)
        if action.resource is ResourceKind.CPU and self.respects_capacity:
            waiting = admission.waiting_for_memory
            if waiting and admission.waits(action.trajectory):  # (behind its trajectory's)
                waiting[action.id] = action
                return
            admitted = admission.admit_memory(action)
            if isinstance(admitted, str):
                ctx.decisions.append(Reject(ctx.now, action, admitted))
                return
            if not admitted:
                admission.waiting_for_memory[action.id] = action
                return
        self._enqueue(ctx, action)

    def _arrive_alone(self, action: Action, node: str, now: float) -> list[Decision]:
        """The pass of one CPU arrival and nothing else (the commonest event of a replay).

        When its node's queue is empty, the policy's ``alone`` says what its pass would decide
        (start it on some cores, or nothing); the action then runs without passing through the
        queue, or waits in it, and no pass is built (``FastPaths.lone_arrival``; a property
        test compares this with the full pass).
        """
        self._seen.add(action.id)
        if self.arrivals is not None:
            self.arrivals.arrived(action.trajectory, node, now)
        domain = self._cpu_domains[node]
        opts = self._options_for(action, node)
        queue = self._queues.get(domain)
        if (queue is not None and queue.live) or (  # others wait: it joins them, the full pass
            self._resizes and self.runs.wide.get(domain)  # or it may shrink a running one
        ):
            ctx = self._begin(now)
            self._enqueue(ctx, action, opts)
            return self._pass(ctx)
        self._clock_to(now)
        decided = self._alone(self.state.cpu[node], opts)  # type: ignore[misc]
        if decided is None:  # the pass would start nothing: it waits, alone in its queue
            self.backlog.push(action, domain, opts)
            return []
        units, reason = decided
        try:
            start = start_action(self, action, node, units, reason, opts, domain, now, queued=False)
        except CapacityError:  # a policy bug: leave the action where the full pass would
            self.backlog.push(action, domain, opts)
            raise
        return [start]

    def _retry_memory_waiters(self, ctx: Context) -> None:
        """Admit the actions waiting for memory that now fit, in arrival order; an action
        behind one of its trajectory's still waiting is not tried (it would place the
        container, at its own memory, ahead of it)."""
        waiting = self.admission.waiting_for_memory
        blocked: set[str] = set()
        for aid, action in list(waiting.items()):
            if action.trajectory in blocked:
                continue
            admitted = self.admission.admit_memory(action)
            if not admitted:
                blocked.add(action.trajectory)
            else:
                del waiting[aid]
                if isinstance(admitted, str):
                    ctx.decisions.append(Reject(ctx.now, action, admitted))
                else:
                    self._enqueue(ctx, action)

    def _widen_gpu_options(self) -> None:
        """Queued GPU calls may use the cells of a GPU node that joined (``widened``)."""
        queue = self._queues.get(GPU_DOMAIN)
        options = self.backlog.options
        for action in queue.live.values() if queue is not None else ():
            options[action.id] = self.option_builder.widened(action, options[action.id])

    def _enqueue(self, ctx: Context, action: Action, opts: Options | None = None) -> None:
        """Queue an admitted action on its domain (a CPU action on its container's node)."""
        kind = action.resource
        node = None
        if kind is ResourceKind.CPU:
            traj = self.admission.trajectories.get(action.trajectory)
            node = traj.node if traj and traj.node else action.node
            domain: Domain = self._cpu_domains.get(node) or (
                "cpu",
                node or self.cluster.cpu_nodes[0].name,
            )
        elif kind is ResourceKind.GPU:
            domain = GPU_DOMAIN
        else:
            domain = ("api", action.service or "")
        if opts is None:
            opts = self._options_for(action, node)
        if self.arrivals is not None:
            self.arrivals.arrived(action.trajectory, node, self.now)
        self.backlog.push(action, domain, opts)
        ctx.arrived.append(action)
        ctx.dirty[domain] = None

    def _release(self, start: Start) -> None:
        """Return a finished action's units (nothing for a reservation or an unbounded policy)."""
        action = start.action
        if self.arrivals is not None:
            self.arrivals.last_end[action.trajectory] = self.now  # (``ArrivalStats.ended``)
        if self.unbounded or start.in_slot:
            return
        if action.resource is ResourceKind.CPU:
            self.state.cpu[start.node].release_granted(start.cores)
        elif action.resource is ResourceKind.GPU:
            gpu = self.state.gpu[start.node]
            gpu.give(start.gpus, action.id)
            if self.fenced and start.node in self.fenced:  # (to the fence: no pass starts there)
                gpu.take(start.gpus, self.fenced[start.node])
        else:
            self.state.api[action.service or ""].give()
