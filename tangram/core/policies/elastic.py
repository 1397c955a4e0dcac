"""The ``tangram`` policies' CPU rule and their shared round: elastic FCFS window,
per-domain allocation, greedy tail eviction (the GPU rule is ``elastic_gpu``; what the default
adds to the paper's policy is switched by ``tuning.ElasticTuning``).

For each domain whose capacity or queue changed (paper-notes.md, "Elastic scheduling"):
1. candidates: the first queued actions, in FCFS order, that fit the free units at their
   smallest option (at most ``window`` of them: 32 in the paper; the default sizes it from
   the free units, so a burst of small actions is never cut off at 32);
2. allocation: split the free units among them, minimising the sum of durations
   (``allocation.allocate``: marginal gain where exact, DP otherwise);
3. eviction: while more than one candidate remains, defer the latest-arrived one and give its
   units to the others; keep that only if the estimated total ACT (``projection``) improves;
4. start the kept candidates; CPU cores are chosen NUMA-locally, GPU cells by
   ``gpu_placement`` (resident cells first).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import replace

from tangram.core.action import Action
from tangram.core.allocation import allocate, allocate_greedy, allocate_one, greedy_applies
from tangram.core.backlog import Domain
from tangram.core.context import Context
from tangram.core.options import Options
from tangram.core.policies import waits
from tangram.core.policies.base import DomainRule, RuleTraits
from tangram.core.policies.cpu_order import Continuation, KeyOrder, shortest_first
from tangram.core.policies.malleable import grow_key, grow_to_fill, shrink_to_admit
from tangram.core.policies.queue_view import OrderedQueue
from tangram.core.policies.threads import told_threads
from tangram.core.policies.tuning import ROBUST, ElasticTuning
from tangram.core.projection import projected_total
from tangram.core.round import Round
from tangram.core.state import CpuNodeState

#: An eviction must lower the estimate by more than this (seconds) to count as an improvement,
#: so float noise never flips a decision.
_EPS = 1e-9


def elastic_round(
    ctx: Context,
    domain: Domain,
    free: int,
    *,
    window: int,
    depth: int,
    options_of: Callable[[Action], Options] | None = None,
    hold: Callable[[Action], str | None] | None = None,
) -> Round | None:
    """Steps 1-3 for one domain with ``free`` units; None when nothing can start.

    ``options_of`` may replace an action's durations with costs that include what starting it
    would take (the GPU rule adds the restore time to options with no resident cell); ``hold``
    may keep an action out of this pass, with the reason it returns.
    """
    options_of = options_of or ctx.options
    if hold is None and ctx.queue_len(domain) == 1 and ctx.scheduler.fast.single_queued:
        # Most passes: one action, no lists (``FastPaths.single_queued``).
        action = ctx.queue_head(domain)
        assert action is not None
        opts = options_of(action)
        choice = alone_choice(opts, free)
        if choice is None:
            return None
        k, method = choice
        d = opts.durations[k]
        return Round([action], [opts.units[k]], [], method, d, d)
    cands: list[Action] = []
    cand_opts: list[Options] = []
    rest: list[Options] = []
    need = 0
    want = 0  # units if every candidate ran at its fastest option
    queue = ctx.queue(domain)
    for action in queue:
        if hold is not None:
            held = hold(action)
            if held is not None:
                ctx.defer(action, held)
                continue
        opts = options_of(action)
        smallest = opts.units[0]
        if need + smallest <= free:
            cands.append(action)
            cand_opts.append(opts)
            need += smallest
            want += opts.units[opts.fastest]
            if len(cands) == window or need == free:
                break
        else:
            rest.append(opts)
            if len(rest) >= depth:
                break
    if not cands:
        return None
    if want <= free:
        # No contention: everyone runs at its fastest option, which is optimal for the sum of
        # durations; evicting would give the others units they cannot use.
        units = [o.units[o.fastest] for o in cand_opts]
        total = sum([o.durations[o.fastest] for o in cand_opts])
        return Round(cands, units, [], "uncontended", total, total)
    if len(cands) == 1:  # nothing to evict: it takes its best option within the free units
        chosen, method = allocate(cand_opts, free)
        d = cand_opts[0].durations[chosen[0]]
        return Round(cands, [cand_opts[0].units[chosen[0]]], [], method, d, d)
    # Contention: the eviction test needs the queue behind the candidates, up to ``depth``.
    for action in queue:
        if len(rest) >= depth:
            break
        if hold is None or hold(action) is None:
            rest.append(options_of(action))
    now = ctx.now
    # Running actions' (finish, units), sorted, the same for every alternative compared.
    busy = ctx.scheduler.runs.finishes(domain, now)

    greedy = greedy_applies(cand_opts)

    def estimate(k: int, previous: list[int] | None) -> tuple[float, list[int], str]:
        if greedy:  # resumes from the allocation with one more candidate (see allocate_greedy)
            chosen = allocate_greedy(cand_opts[:k], free, previous[:k] if previous else None)
            method = "greedy"
        else:
            chosen, method = allocate(cand_opts[:k], free)
        pairs = [(o.units[c], o.durations[c]) for o, c in zip(cand_opts[:k], chosen, strict=True)]
        left = free - sum([u for u, _ in pairs])
        return projected_total(now, pairs, busy, left, cand_opts[k:] + rest), chosen, method

    k = len(cands)
    best, chosen, method = estimate(k, None)
    first = best
    while k > 1:
        trial, trial_chosen, trial_method = estimate(k - 1, chosen)
        if trial < best - _EPS:
            k, best, chosen, method = k - 1, trial, trial_chosen, trial_method
        else:
            break
    units = [o.units[c] for o, c in zip(cand_opts[:k], chosen, strict=True)]
    return Round(cands[:k], units, cands[k:], method, best, first)


def alone_choice(opts: Options, free: int) -> tuple[int, str] | None:
    """Steps 1-2 for a single queued action: its option index and the method, or None when
    even its smallest option does not fit the free units."""
    if opts.units[0] > free:
        return None
    if opts.units[opts.fastest] <= free:
        return opts.fastest, "uncontended"
    return allocate_one(opts, free)


def _cpu_reason(units: int, free: int, method: str, started: int) -> str:
    return f"tangram: {units} of {free} free cores ({method}, {started} started)"


class ElasticCpu(DomainRule):
    """CPU nodes under the tangram policy."""

    traits = RuleTraits(queue_driven=True, lone_arrival=True)

    def __init__(self, tuning: ElasticTuning = ROBUST) -> None:
        self.tuning = tuning
        self.depth = tuning.depth
        #: Queued non-malleable actions waiting for more cores than are free: action id ->
        #: (the cores it waits for, when it starts on what is free anyway). The held cores go
        #: to nobody else meanwhile (``waits``).
        self.awaiting: dict[str, tuple[int, float]] = {}
        #: Queued actions' shortest-first keys (``cpu_order``), dropped when they start.
        self.keys: dict[str, float] = {}
        #: Per node, the last shortest-first order (reused while its head is unchanged).
        self.orders: dict[Domain, KeyOrder] = {}
        #: The trajectories under way (``cpu_order.Continuation``), when so tuned.
        self.continuation = Continuation() if tuning.continuation_first else None
        #: Per node, the ``grow_key`` of the last grow that resized nothing (skipped again
        #: until the spare cores or the growable actions change).
        self.idle_grow: dict[Domain, tuple[int, int]] = {}
        if type(self).traits is ElasticCpu.traits:  # (a subclass declares its own traits)
            # A lone arrival may shrink a running action or wait for cores: its pass needs
            # the running set, which ``alone`` does not see.
            self.traits = replace(
                ElasticCpu.traits,
                resizes=tuning.malleable,
                tracks_arrivals=tuning.room_for_arrivals,
                lends_idle=tuning.lend_idle_cycles,
                lone_arrival=not (
                    tuning.malleable
                    or tuning.arrival_aware
                    or tuning.room_for_arrivals
                    or tuning.knee
                ),
            )

    def schedule_domain(self, ctx: Context, domain: Domain) -> None:
        node = ctx.state.cpu[domain[1]]
        malleable = self.tuning.malleable and ctx.scheduler.resizable
        view = ctx  # the pass's Context, its queue read shortest first when so tuned
        reads_queue = malleable or node.free_cores > 0  # (a full node's pass starts nothing)
        if self.tuning.shortest_first and reads_queue and ctx.queue_len(domain) > 1:
            queued = ctx.scheduler.backlog.domain_of
            if len(self.keys) > 2 * len(queued) + 1024:  # keys of actions started elsewhere
                self.keys = {k: v for k, v in self.keys.items() if k in queued}
            order = shortest_first(ctx, domain, self.keys, self.continuation, self.orders)
            view = OrderedQueue(ctx, domain, order)  # type: ignore[assignment]
        if malleable and ctx.queue_len(domain):
            shrink_to_admit(view, domain, node.spec.cores)
        if node.free_cores and ctx.queue_len(domain):
            self._round(view, domain, node)
        if malleable:
            keep = waits.held_for(ctx, domain, self.awaiting)
            key = grow_key(ctx, domain, keep)
            if self.idle_grow.get(domain) != key:
                if grow_to_fill(ctx, domain, node.spec.cores, keep=keep):
                    self.idle_grow.pop(domain, None)
                else:
                    self.idle_grow[domain] = key

    def _round(self, ctx: Context, domain: Domain, node: CpuNodeState) -> None:
        """Steps 1-4 on the node's free cores (less those held for an awaiting action)."""
        free = node.free_cores
        held = 0
        if self.tuning.arrival_aware:
            held = waits.serve_awaiting(
                ctx, domain, self.awaiting, lambda action: self._started(ctx, action)
            )
            free = node.free_cores - held
            if free <= 0:
                return
        hold = None
        if self.awaiting:
            waiting = self.awaiting

            def hold(action: Action) -> str | None:
                return "tangram: waits for its cores" if action.id in waiting else None

        rnd = elastic_round(
            ctx, domain, free, window=self.tuning.window or free, depth=self.depth, hold=hold
        )
        if rnd is None:
            return
        told = self.tuning.oversubscribe and ctx.scheduler.resizable
        if self.tuning.arrival_aware and not told:  # (told threads, its grant grows instead)
            rnd = waits.defer_short_grants(ctx, domain, rnd, free, self.awaiting)
        if self.tuning.room_for_arrivals:
            rnd = waits.leave_room_for_arrivals(ctx, domain, rnd, free)
        if self.tuning.knee:
            rnd = waits.cap_at_the_knee(ctx, domain, rnd)
        name, started = node.spec.name, len(rnd.kept)
        threads = told_threads(rnd, ctx.options) if told else [0] * started
        for action, units, n in zip(rnd.kept, rnd.units, threads, strict=True):
            reason = _cpu_reason(units, free, rnd.method, started)
            if n:
                reason += f", told {n} threads"
            ctx.start_on_cores(action, name, units, reason, threads=n)
            self._started(ctx, action)
        if rnd.evicted:
            defer_evicted(ctx, rnd)

    def _started(self, ctx: Context, action: Action) -> None:
        keys = self.keys
        keys.pop(action.id, None)
        if self.continuation is not None and self.continuation.started(action):
            # Its trajectory is under way now: its other queued actions (parallel calls)
            # are no longer newcomers (their keys are made again).
            for other in ctx.scheduler.backlog.by_trajectory.get(action.trajectory, ()):
                keys.pop(other, None)

    def on_withdraw(self, action: Action) -> None:
        """Its shortest-first key and any cores it awaited go (a reused id is a new action)."""
        self.keys.pop(action.id, None)
        self.awaiting.pop(action.id, None)

    def on_trajectory_close(self, ctx: Context, trajectory: str) -> None:
        """The trajectory is no longer under way."""
        if self.continuation is not None:
            self.continuation.closed(trajectory)

    def alone(self, node: CpuNodeState, opts: Options) -> tuple[int, str] | None:
        """What ``schedule_domain`` decides when one action waits on the node and nothing
        else happened: the units and reason it starts it with, or None."""
        free = node.free_cores
        choice = alone_choice(opts, free)
        if choice is None:
            return None
        units = opts.units[choice[0]]
        return units, _cpu_reason(units, free, choice[1], 1)


def defer_evicted(ctx: Context, rnd: Round) -> None:
    for action in rnd.evicted:
        ctx.defer(
            action,
            f"tangram: evicted; estimated total ACT {rnd.estimate_without_eviction:.3f}s -> "
            f"{rnd.estimate:.3f}s",
        )
