"""The scheduler: owns the queue and the cluster state, feeds events to a policy, applies decisions.

Drivers (the simulator, the live runtime) call ``submit``, ``finish``, ``open_trajectory``,
``close_trajectory`` and ``tick`` with the current time, and carry out the decisions returned.
The scheduler never reads a clock and iterates only insertion-ordered containers, so the same
event sequence always gives the same decisions.

Queues are kept per *domain*, the set of units actions compete for: one per CPU node (a CPU
action is bound to its trajectory's container, hence to one node), one for all GPUs (any GPU
action may use any node's cells), one per API endpoint. Only domains touched by an event are
offered to the policy, which keeps a decision cheap when thousands of actions wait elsewhere.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from typing import NamedTuple

from tangram.core.action import Action
from tangram.core.cells import unit_options
from tangram.core.decision import Decision, Defer, Reject, Start
from tangram.core.resources import ClusterSpec, ResourceKind
from tangram.core.state import CapacityError, ClusterState

Domain = tuple[str, str]
GPU_DOMAIN: Domain = ("gpu", "*")


class FcfsQueue:
    """Actions in arrival order, with O(1) removal from anywhere.

    Removal only forgets the id; iteration skips forgotten entries, so a policy may start or
    reject actions while it walks the queue. ``compact`` (between passes) drops dead entries.
    """

    __slots__ = ("items", "head", "live")

    def __init__(self) -> None:
        self.items: list[Action] = []
        self.head = 0
        self.live: dict[str, Action] = {}

    def push(self, action: Action) -> None:
        self.items.append(action)
        self.live[action.id] = action

    def remove(self, action_id: str) -> None:
        del self.live[action_id]

    def __len__(self) -> int:
        return len(self.live)

    def __contains__(self, action_id: str) -> bool:
        return action_id in self.live

    def __iter__(self) -> Iterator[Action]:
        items, live = self.items, self.live
        i = self.head
        while i < len(items):
            action = items[i]
            i += 1
            if action.id in live:
                yield action

    def compact(self) -> None:
        """Forget removed entries: skip those at the front, and drop them from the list once
        they are the larger part (so a long run keeps only what is queued, never its history)."""
        items, live = self.items, self.live
        if not live:
            items.clear()
            self.head = 0
            return
        head = self.head
        while items[head].id not in live:  # a live entry lies at or after the head
            head += 1
        if len(items) - head > 2 * len(live) + 64:  # dead entries behind the head
            self.items = [a for a in items[head:] if a.id in live]
            head = 0
        elif head > 64 and 2 * head > len(items):  # dead entries before it
            del items[:head]
            head = 0
        self.head = head


class _OptionFields(NamedTuple):
    units: tuple[int, ...]
    durations: tuple[float, ...]
    convex: bool
    fastest: int
    consecutive: bool


def _options(
    cls: type[Options], units: tuple[int, ...], durations: tuple[float, ...], convex: bool
) -> Options:
    """An ``Options`` with its derived fields (built directly: the scheduler makes one per action)."""
    return tuple.__new__(
        cls,
        (
            units,
            durations,
            convex,
            durations.index(min(durations)),
            units[-1] - units[0] == len(units) - 1,
        ),
    )


class Options(_OptionFields):
    """The unit counts an action may use on its domain, ascending, with their durations.

    Built as ``Options(units, durations, convex)``; ``fastest`` (index of the shortest duration,
    the fewest units among equals, so no unit is wasted) and ``consecutive`` (1-unit steps like
    CPU cores, not cells like GPUs' 1/2/4/8) are derived once, since every pass reads them.
    A NamedTuple: immutable, and cheap to build once per action.
    """

    __slots__ = ()

    def __new__(cls, units: tuple[int, ...], durations: tuple[float, ...], convex: bool) -> Options:
        return _options(cls, units, durations, convex)

    def __getnewargs__(self) -> tuple[tuple[int, ...], tuple[float, ...], bool]:
        """What copy and pickle pass to ``__new__`` (the derived fields are derived again)."""
        return (self.units, self.durations, self.convex)

    def _replace(self, **changes: object) -> Options:
        """A copy with some of units, durations, convex changed; the derived fields follow."""
        derived = {"fastest", "consecutive"} & set(changes)
        if derived:
            raise ValueError(f"Options.{sorted(derived)[0]} is derived, not set")
        fields = {"units": self.units, "durations": self.durations, "convex": self.convex}
        fields.update(changes)
        return Options(**fields)  # type: ignore[arg-type]

    def best_within(self, limit: int) -> int:
        """Index of the largest option not above ``limit`` (-1 when even the smallest exceeds it)."""
        units = self.units
        if self.consecutive:  # units[i] = units[0] + i
            return min(limit - units[0], len(units) - 1) if limit >= units[0] else -1
        idx = -1
        for i, u in enumerate(units):
            if u > limit:
                break
            idx = i
        return idx


_EMPTY: tuple[Action, ...] = ()
_NONE: dict[str, Action] = {}


class Running(NamedTuple):
    """An action that has started, with where it runs and when the core expects it to end.

    (A NamedTuple for the same reason as ``Start``: one per action, on the hot path.)
    """

    action: Action
    start: Start
    domain: Domain
    est_finish: float


@dataclass
class TrajectoryState:
    """A trajectory's container binding: its CPU node and the memory reserved there."""

    id: str
    node: str | None = None
    memory_gb: float = 0.0


def _option_index(action: Action, opts: Options, units: int) -> int:
    """Which of the action's options ``units`` is; a policy asking for another is a bug."""
    try:
        return opts.units.index(units)
    except ValueError:
        raise CapacityError(
            f"{action.id}: {units} units is not one of its options {opts.units}"
        ) from None


class Context:
    """What a policy sees and does during one scheduling pass.

    ``arrived`` and ``finished`` are the events since the last pass; ``dirty`` the domains
    whose queue or free capacity changed. ``start``/``defer``/``reject`` apply at once, so a
    later decision in the same pass sees the capacity an earlier one took.
    """

    __slots__ = ("scheduler", "state", "now", "decisions", "arrived", "finished", "closed", "dirty")

    def __init__(self, scheduler: Scheduler, now: float) -> None:
        self.scheduler = scheduler
        self.state = scheduler.state
        self.now = now
        self.decisions: list[Decision] = []
        self.arrived: list[Action] = []
        self.finished: list[Running] = []
        self.closed: list[str] = []
        self.dirty: dict[Domain, None] = {}

    # --- reading ---------------------------------------------------------------------------
    def queue(self, domain: Domain) -> Iterator[Action]:
        """Queued actions of a domain in FCFS order (safe to start/reject while iterating)."""
        return iter(self.scheduler.queues.get(domain, _EMPTY))

    def queue_len(self, domain: Domain) -> int:
        queue = self.scheduler.queues.get(domain)
        return len(queue.live) if queue is not None else 0

    def queue_head(self, domain: Domain) -> Action | None:
        """The oldest queued action of a domain (None when the queue is empty)."""
        queue = self.scheduler.queues.get(domain)
        return next(iter(queue.live.values()), None) if queue is not None else None

    def queued_of_service(self, service: str) -> Iterator[Action]:
        return iter(self.scheduler.gpu_by_service.get(service, _EMPTY))

    def queued_of_trajectory(self, trajectory: str) -> Iterator[Action]:
        """A trajectory's queued actions in FCFS order (safe to start/reject while iterating)."""
        by_trajectory = self.scheduler.by_trajectory
        for action in tuple(by_trajectory.get(trajectory, _NONE).values()):
            if action.id in by_trajectory.get(trajectory, _NONE):
                yield action

    def running_in(self, domain: Domain) -> Iterator[Running]:
        return iter(self.scheduler.running_by_domain.get(domain, {}).values())

    def options(self, action: Action) -> Options:
        return self.scheduler.options[action.id]

    def node_of(self, action: Action) -> str | None:
        """The CPU node an action is bound to (its trajectory's container)."""
        traj = self.scheduler.trajectories.get(action.trajectory)
        return traj.node if traj else None

    def restore_cost(self, action: Action, node: str, cell_size: int = 1) -> float:
        """EOE restore estimate: each GPU of the cell loads its 1/k shard over its own
        host-to-GPU link, so k GPUs restore k times faster (plus the fixed cost)."""
        spec = self.state.gpu[node].spec
        return action.service_size_gb / (cell_size * spec.h2d_gbps) + spec.restore_fixed_s

    # --- acting ------------------------------------------------------------------------------
    def start(
        self,
        action: Action,
        node: str,
        units: int,
        reason: str,
        *,
        cores: tuple[int, ...] = (),
        gpus: tuple[int, ...] = (),
        in_slot: bool = False,
    ) -> Start:
        sched = self.scheduler
        opts = sched.options[action.id]
        option = _option_index(action, opts, units)
        restore, overhead = False, 0.0
        if action.resource is ResourceKind.GPU and not sched.unbounded:
            restore = not self.state.gpu[node].is_resident(action.service or "", gpus)
            overhead = self.restore_cost(action, node, len(gpus)) if restore else 0.0
        decision = Start(  # positional, in field order: the hot path of every replay
            self.now,
            action,
            node,
            units,
            reason,
            cores,
            gpus,
            restore,
            in_slot,
            opts.durations[option],
            overhead,
        )
        sched._apply_start(decision)
        self.decisions.append(decision)
        return decision

    def start_on_cores(self, action: Action, node: str, units: int, reason: str) -> Start:
        """Start a CPU action on ``units`` cores of its node that the core picks and takes at
        once (``CpuNodeState.choose_cores``: NUMA-local, best fit)."""
        sched = self.scheduler
        domain = sched.domain_of[action.id]
        if domain[1] != node or domain[0] != "cpu":
            raise CapacityError(
                f"{action.id}: CPU action started on {node}, its container is on {domain[1]}"
            )
        decision = self._on_cores(action, node, units, reason, sched.options[action.id])
        sched._record_start(decision)
        self.decisions.append(decision)
        return decision

    def _on_cores(self, action: Action, node: str, units: int, reason: str, opts: Options) -> Start:
        """Take ``units`` NUMA-local cores of ``node`` for the action: its Start record."""
        option = _option_index(action, opts, units)
        # An unbounded policy holds nothing (its starts are never given back): no cores.
        cores = () if self.scheduler.unbounded else self.state.cpu[node].grant_cores(units)
        return Start(
            self.now,
            action,
            node,
            units,
            reason,
            cores,
            (),
            False,
            False,
            opts.durations[option],
            0.0,
        )

    def defer(self, action: Action, reason: str) -> None:
        self.decisions.append(Defer(self.now, action, reason))

    def reject(self, action: Action, reason: str) -> None:
        self.scheduler._dequeue(action)
        self.decisions.append(Reject(self.now, action, reason))

    def hold_cores(self, node: str, cores: tuple[int, ...]) -> None:
        """Take cores out of the free pool without an action (a static baseline's reservation)."""
        self.state.cpu[node].take_cores(cores)

    def unhold_cores(self, node: str, cores: tuple[int, ...]) -> None:
        self.state.cpu[node].give_cores(cores)
        self.dirty[("cpu", node)] = None

    def hold_cell(self, node: str, cell: tuple[int, ...], holder: str) -> None:
        """Take a GPU cell for a holder that is not an action (a dedicated service)."""
        self.state.gpu[node].take(cell, holder)

    def wake_at(self, when: float) -> None:
        """Ask the driver to call ``tick`` at ``when`` (a rate limit frees a token then)."""
        sched = self.scheduler
        sched.wakeup = when if sched.wakeup is None else min(sched.wakeup, when)


class Scheduler:
    """Event-driven front of the core: one per cluster, driving one policy."""

    def __init__(self, cluster: ClusterSpec, policy: object) -> None:
        self.cluster = cluster
        self.state = ClusterState(cluster)
        self.policy = policy
        self.unbounded = bool(getattr(policy, "unbounded", False))
        #: The policy decides only about queued actions, so a pass with none waiting is skipped.
        self._queue_driven = bool(getattr(policy, "queue_driven", False))
        #: What the policy's pass decides for a lone CPU arrival into an empty queue: the
        #: (units, reason) it would start it with, or None. Only a queue-driven policy's.
        self._alone = getattr(policy, "alone", None) if self._queue_driven else None
        self.queues: dict[Domain, FcfsQueue] = {}
        self.gpu_by_service: dict[str, FcfsQueue] = {}
        #: trajectory -> its queued actions by id, in arrival order (a trajectory has few queued
        #: at once, so a plain dict is its FCFS queue; readers iterate a copy).
        self.by_trajectory: dict[str, dict[str, Action]] = {}
        self.options: dict[str, Options] = {}
        self.domain_of: dict[str, Domain] = {}
        self.running: dict[str, Running] = {}
        self.running_by_domain: dict[Domain, dict[str, Running]] = {}
        self.trajectories: dict[str, TrajectoryState] = {}
        self.waiting_for_memory: dict[str, Action] = {}
        self.seen: set[str] = set()
        self.wakeup: float | None = None
        self.now = 0.0
        self._touched: set[FcfsQueue] = set()
        self._max_node_cores = max((n.cores for n in cluster.cpu_nodes), default=0)
        self._max_node_gpus = max((n.gpus for n in cluster.gpu_nodes), default=0)
        self._max_gpu_mem = max((n.gpu_memory_gb for n in cluster.gpu_nodes), default=0.0)
        self._unit_ranges: dict[int, tuple[int, ...]] = {}  # top -> (1, ..., top), shared
        self._cpu_domains: dict[str | None, Domain] = {n: ("cpu", n) for n in self.state.cpu}
        self._node_cores: dict[str | None, int] = {n.name: n.cores for n in cluster.cpu_nodes}

    # ------------------------------------------------------------------ events
    def submit(self, action: Action, now: float) -> list[Decision]:
        """An action arrived. Returns the decisions this caused (possibly its own rejection)."""
        return self.submit_many([action], now)

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
        running = self.running
        for action_id in finished:
            if action_id not in running:
                raise KeyError(f"finish of {action_id!r}, which is not running")
        if not arrived and self._queue_driven and not self._queued_behind(finished):
            return self._finish_idle(now, finished)
        ctx = self._begin(now)
        for action_id in finished:
            running = self._complete(action_id)
            ctx.finished.append(running)
            ctx.dirty[running.domain] = None
        trajectories, seen = self.trajectories, self.seen
        for action in arrived:
            if action.resource is ResourceKind.CPU and action.node is None and not self.unbounded:
                traj = trajectories.get(action.trajectory)
                if (
                    traj is not None
                    and traj.node is not None
                    and action.memory_gb <= traj.memory_gb
                    and action.id not in seen
                ):  # its container is placed and big enough: nothing to check or reserve
                    seen.add(action.id)
                    if self._alone is not None and len(arrived) == 1 and not finished:
                        return self._arrive_alone(ctx, action, traj.node)
                    self._enqueue(action, ctx)
                    continue
            problem = self._infeasible(action)
            if problem:
                ctx.decisions.append(Reject(now, action, problem))
                continue
            self.seen.add(action.id)
            if action.resource is ResourceKind.CPU and not self.unbounded:
                admitted = self._admit_memory(action)
                if isinstance(admitted, str):
                    ctx.decisions.append(Reject(now, action, admitted))
                    continue
                if not admitted:
                    self.waiting_for_memory[action.id] = action
                    continue
            self._enqueue(action, ctx)
        return self._run(ctx)

    def open_trajectory(
        self, trajectory: str, now: float, *, memory_gb: float = 0.0, node: str | None = None
    ) -> str | None:
        """Place a trajectory's container: returns its CPU node, or None when memory is short now.

        Optional: a CPU action of an unopened trajectory opens it with the action's memory.
        """
        self.now = max(self.now, now)
        if node is not None and node not in self.state.cpu:
            raise ValueError(f"trajectory {trajectory!r}: unknown CPU node {node!r}")
        traj = self.trajectories.setdefault(trajectory, TrajectoryState(trajectory))
        if traj.node is None and not self.unbounded:
            self._bind(traj, memory_gb, node)
            hook = getattr(self.policy, "on_trajectory_open", None)
            if hook is not None and traj.node is not None:
                # Reservations only (a static pod); starts happen in the next pass.
                ctx = self._begin(now)
                hook(ctx, trajectory, traj.node)
                if ctx.decisions:
                    raise RuntimeError(
                        f"policy decided {len(ctx.decisions)} actions at a trajectory open"
                    )
        return traj.node

    def close_trajectory(self, trajectory: str, now: float) -> list[Decision]:
        """The trajectory ended: its container's memory (and any static slot) is freed.

        Actions of it still queued are rejected: nobody will collect their results.
        """
        ctx = self._begin(now)
        for action in list(self.by_trajectory.get(trajectory, _NONE).values()):
            ctx.reject(action, f"trajectory {trajectory} closed while the action was queued")
        for aid, action in list(self.waiting_for_memory.items()):
            if action.trajectory == trajectory:
                del self.waiting_for_memory[aid]
                ctx.decisions.append(
                    Reject(
                        now, action, f"trajectory {trajectory} closed while the action was queued"
                    )
                )
        traj = self.trajectories.pop(trajectory, None)
        ctx.closed.append(trajectory)
        hook = getattr(self.policy, "on_trajectory_close", None)
        if hook is not None:
            hook(ctx, trajectory)
        if traj is not None and traj.node is not None:
            node = self.state.cpu[traj.node]
            node.give_memory(traj.memory_gb)
            node.containers -= 1
            ctx.dirty[("cpu", traj.node)] = None
            self._retry_memory_waiters(ctx)
        return self._run(ctx)

    def withdraw(self, action_id: str, now: float) -> bool:
        """Take back a queued action (its client cancelled it or timed out waiting).

        It leaves the queue with no decision and frees nothing (it held nothing). False when
        it is not waiting: already started, ended, or never submitted.
        """
        self.now = max(self.now, now)
        if self.waiting_for_memory.pop(action_id, None) is not None:
            return True
        domain = self.domain_of.get(action_id)
        if domain is None:
            return False
        self._dequeue(self.queues[domain].live[action_id])
        return True

    def tick(self, now: float) -> list[Decision]:
        """A wake-up the scheduler asked for (``next_wakeup``): rate tokens may be free now."""
        ctx = self._begin(now)
        for name in self.state.api:
            ctx.dirty[("api", name)] = None
        return self._run(ctx)

    def report_residency(
        self, node: str, gpus: tuple[int, ...], service: str, resident: bool
    ) -> None:
        """The GPU executor restored (resident=True) or evicted a service on these GPUs."""
        self.state.report_residency(node, gpus, service, resident)

    @property
    def next_wakeup(self) -> float | None:
        return self.wakeup

    @property
    def queued(self) -> int:
        return sum(len(q) for q in self.queues.values()) + len(self.waiting_for_memory)

    # ------------------------------------------------------------------ internals
    def _clock_to(self, now: float) -> None:
        """Move the core's time to an event's (never backwards); a due wake-up is spent."""
        if now < self.now - 1e-9:
            raise ValueError(f"time went backwards: event at {now} after {self.now}")
        if now > self.now:
            self.now = now
        if self.wakeup is not None and self.wakeup <= now:
            self.wakeup = None

    def _complete(self, action_id: str) -> Running:
        """A running action ended: it stops running and its units return to the pool."""
        running = self.running.pop(action_id)
        del self.running_by_domain[running.domain][action_id]
        self._release(running.start)
        return running

    def _begin(self, now: float) -> Context:
        self._clock_to(now)
        for queue in self._touched:
            queue.compact()
        self._touched.clear()
        return Context(self, now)

    def _arrive_alone(self, ctx: Context, action: Action, node: str) -> list[Decision]:
        """The pass of one CPU arrival and nothing else (the commonest event of a replay).

        When its node's queue is empty, the policy's ``alone`` says what its pass would decide
        (start it on some cores, or nothing); the action then runs without passing through the
        queue, or waits in it. A test checks this gives the same decisions as the full pass.
        """
        domain = self._cpu_domains[node]
        queue = self.queues.get(domain)
        opts = self._options_for(action, node)
        if queue is not None and queue.live:
            self._enqueue(action, ctx, opts)
            return self._run(ctx)
        decided = self._alone(ctx, self.state.cpu[node], opts)
        if decided is None:  # the pass would start nothing: it waits, alone in its queue
            self._enqueue(action, ctx, opts)
            return ctx.decisions
        units, reason = decided
        try:
            start = ctx._on_cores(action, node, units, reason, opts)
        except CapacityError:  # a policy bug: leave the action where the full pass would
            self._enqueue(action, ctx, opts)
            raise
        self._add_running(start, domain)
        ctx.decisions.append(start)
        return ctx.decisions

    def _queued_behind(self, finished: Sequence[str]) -> bool:
        """Whether an action waits in a domain these completions free units of."""
        queues, running = self.queues, self.running
        for action_id in finished:
            queue = queues.get(running[action_id].domain)
            if queue is not None and queue.live:
                return True
        return False

    def _finish_idle(self, now: float, finished: Sequence[str]) -> list[Decision]:
        """Completions that free units nobody waits for: return them, skip the pass.

        Only for a ``queue_driven`` policy, whose pass over domains with empty queues decides
        nothing (about half of all passes in a large replay).
        """
        self._clock_to(now)
        for action_id in finished:
            self._complete(action_id)
        return []

    def _run(self, ctx: Context) -> list[Decision]:
        if ctx.dirty or ctx.arrived or ctx.finished:
            self.policy.schedule(ctx)
        return ctx.decisions

    def _infeasible(self, action: Action) -> str | None:
        """Why no cluster state could ever run this action (None if some state could)."""
        if action.id in self.seen:
            return f"duplicate action id {action.id!r}: every action needs its own id"
        if self.unbounded:
            return None
        kind = action.resource
        if kind is ResourceKind.CPU:
            if not self.cluster.cpu_nodes:
                return "CPU action but the cluster has no CPU node"
            traj = self.trajectories.get(action.trajectory)
            node = action.node or (traj.node if traj else None)
            if action.node and action.node not in self.state.cpu:
                return f"CPU action bound to unknown node {action.node!r}"
            if traj and traj.node and action.node and action.node != traj.node:
                return (
                    f"CPU action names node {action.node!r} but its container is on {traj.node!r}"
                )
            limit = (
                self.state.cpu[node].spec.memory_gb
                if node
                else max(n.memory_gb for n in self.cluster.cpu_nodes)
            )
            if action.memory_gb > limit:
                return f"needs {action.memory_gb} GB of container memory; a node has at most {limit} GB"
        elif kind is ResourceKind.GPU:
            if not self.cluster.gpu_nodes:
                return "GPU action but the cluster has no GPU node"
            if not self._gpu_units(action):
                return (
                    f"service {action.service!r} of {action.service_size_gb} GB does not fit any cell: "
                    f"at most {self._max_node_gpus} GPUs x {self._max_gpu_mem} GB on one node"
                )
        elif action.service not in self.state.api:
            return f"unknown API endpoint {action.service!r}; known: {sorted(self.state.api)}"
        return None

    def _gpu_units(self, action: Action) -> tuple[int, ...]:
        return unit_options(
            action.service_size_gb, self._max_gpu_mem, self._max_node_gpus, action.max_units
        )

    def _options_for(self, action: Action, node: str | None) -> Options:
        """Unit options after binding: a CPU action's node caps its cores."""
        kind = action.resource
        if kind is ResourceKind.CPU:
            top = action.max_units
            if not self.unbounded:
                cap = self._node_cores.get(node, self._max_node_cores)
                if cap < top:
                    top = cap
            units = self._unit_ranges.get(top)
            if units is None:
                units = self._unit_ranges[top] = tuple(range(1, top + 1))
        elif kind is ResourceKind.GPU:
            units = self._gpu_units(action) if not self.unbounded else action.allowed_units(8)
        else:
            units = (1,)
        curve = action.curve
        durations = curve.durations(units)
        convex = curve.always_convex or curve.is_convex_on(units)  # ElasticityCurve.convex_on
        return _options(Options, units, durations, convex)

    def _bind(self, traj: TrajectoryState, memory_gb: float, node: str | None) -> bool:
        """Reserve the container's memory on a node: the given one, else the roomiest."""
        if node is None:
            candidates = sorted(
                self.state.cpu.values(),
                key=lambda n: (-n.memory_free_gb, n.containers, n.spec.name),
            )
            fitting = [n for n in candidates if n.memory_free_gb + 1e-9 >= memory_gb]
            if not fitting:
                return False
            chosen = fitting[0]
        else:
            chosen = self.state.cpu[node]
            if chosen.memory_free_gb + 1e-9 < memory_gb:
                return False
        chosen.take_memory(memory_gb)
        chosen.containers += 1
        traj.node, traj.memory_gb = chosen.spec.name, memory_gb
        return True

    def _admit_memory(self, action: Action) -> bool | str:
        """Bind the action's trajectory (or grow its container) so its memory is reserved.

        False: no node has room for a new container now (it waits; it holds nothing, so it
        cannot deadlock anyone). A container that must grow but cannot is an error instead:
        waiting would hold the container's memory while asking for more (hold-and-wait).
        """
        traj = self.trajectories.get(action.trajectory)
        if traj is None:
            traj = self.trajectories[action.trajectory] = TrajectoryState(action.trajectory)
        if traj.node is None:
            return self._bind(traj, action.memory_gb, action.node)
        extra = action.memory_gb - traj.memory_gb
        if extra > 0:
            node = self.state.cpu[traj.node]
            if node.memory_free_gb + 1e-9 < extra:
                return (
                    f"needs {action.memory_gb} GB but its container on {traj.node} has {traj.memory_gb} GB "
                    f"and the node cannot grow it now; open the trajectory with its largest memory"
                )
            node.take_memory(extra)
            traj.memory_gb = action.memory_gb
        return True

    def _retry_memory_waiters(self, ctx: Context) -> None:
        for aid, action in list(self.waiting_for_memory.items()):
            admitted = self._admit_memory(action)
            if admitted:
                del self.waiting_for_memory[aid]
                if isinstance(admitted, str):
                    ctx.decisions.append(Reject(ctx.now, action, admitted))
                else:
                    self._enqueue(action, ctx)

    def _enqueue(self, action: Action, ctx: Context, opts: Options | None = None) -> None:
        kind = action.resource
        node = None
        if kind is ResourceKind.CPU:
            traj = self.trajectories.get(action.trajectory)
            node = traj.node if traj and traj.node else action.node
            domain: Domain = self._cpu_domains.get(node) or (
                "cpu",
                node or self.cluster.cpu_nodes[0].name,
            )
        elif kind is ResourceKind.GPU:
            domain = GPU_DOMAIN
        else:
            domain = ("api", action.service or "")
        aid = action.id
        self.options[aid] = self._options_for(action, node) if opts is None else opts
        self.domain_of[aid] = domain
        queue = self.queues.get(domain)
        if queue is None:
            queue = self.queues[domain] = FcfsQueue()
        queue.push(action)
        by_traj = self.by_trajectory.get(action.trajectory)
        if by_traj is None:
            self.by_trajectory[action.trajectory] = {aid: action}
        else:
            by_traj[aid] = action
        if kind is ResourceKind.GPU:
            by_service = self.gpu_by_service.get(action.service or "")
            if by_service is None:
                by_service = self.gpu_by_service[action.service or ""] = FcfsQueue()
            by_service.push(action)
        ctx.arrived.append(action)
        ctx.dirty[domain] = None

    def _dequeue(self, action: Action) -> Domain:
        """Remove a queued action from every index; returns its domain."""
        aid = action.id
        domain = self.domain_of.pop(aid)
        touched = self._touched
        queue = self.queues[domain]
        queue.remove(aid)
        touched.add(queue)
        by_traj = self.by_trajectory[action.trajectory]
        del by_traj[aid]
        if not by_traj:
            del self.by_trajectory[action.trajectory]
        if action.resource is ResourceKind.GPU:
            by_service = self.gpu_by_service[action.service or ""]
            by_service.remove(aid)
            touched.add(by_service)
        del self.options[aid]
        return domain

    def _apply_start(self, start: Start) -> None:
        action = start.action
        if not self.unbounded and not start.in_slot:
            kind = action.resource
            if kind is ResourceKind.CPU:
                domain = self.domain_of[action.id]
                if domain[1] != start.node or domain[0] != "cpu":
                    raise CapacityError(
                        f"{action.id}: CPU action started on {start.node}, its container is on {domain[1]}"
                    )
                if len(start.cores) != start.units:
                    raise CapacityError(
                        f"{action.id}: {start.units} units but {len(start.cores)} cores"
                    )
                self.state.cpu[start.node].take_cores(start.cores)
            elif kind is ResourceKind.GPU:
                if len(start.gpus) != start.units:
                    raise CapacityError(f"{action.id}: {start.units} units but cell {start.gpus}")
                self.state.gpu[start.node].take(start.gpus, action.id)
            else:
                self.state.api[action.service or ""].take(start.time)
        self._record_start(start)

    def _record_start(self, start: Start) -> None:
        """The action leaves the queue and runs (its capacity is already taken)."""
        self._add_running(start, self._dequeue(start.action))

    def _add_running(self, start: Start, domain: Domain) -> None:
        action = start.action
        running = Running(
            action, start, domain, start.time + start.est_duration + start.est_overhead
        )
        self.running[action.id] = running
        by_domain = self.running_by_domain.get(domain)
        if by_domain is None:
            by_domain = self.running_by_domain[domain] = {}
        by_domain[action.id] = running

    def _release(self, start: Start) -> None:
        if self.unbounded or start.in_slot:
            return
        action = start.action
        if action.resource is ResourceKind.CPU:
            self.state.cpu[start.node].release_granted(start.cores)
        elif action.resource is ResourceKind.GPU:
            self.state.gpu[start.node].give(start.gpus, action.id)
        else:
            self.state.api[action.service or ""].give()
