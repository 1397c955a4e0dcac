"""Waiting for cores: a non-malleable action keeps its start DoP for its whole run, so starting
it on the one or two cores free now can finish far later than waiting a moment for running
actions to free more (an 800 s job on 1 core of a 4-core node whose other actions end in
seconds). The ``tangram`` policy's CPU rule then defers it and holds the cores it waits for.

* **The test** (``defer_short_grants``): for a kept candidate that is not malleable and got
  fewer cores than its fastest option, walk the running actions' estimated finishes: waiting
  until the j-th finish gives it its own cores, the round's leftovers and every core freed by
  then. If the best such finish beats starting now by ``WAIT_GAIN`` of its time, it waits.
* **The hold** (``serve_awaiting``): while it waits, free cores up to what it waits for are
  held for it (others cannot take them one by one); it starts as soon as they are free, or on
  whatever is free once its expected wait has passed ``PATIENCE`` times over (the estimates
  were wrong: it never waits for ever). One action waits per node at a time, so at most one
  node's worth of cores is ever held.
"""

from __future__ import annotations

import math
from collections.abc import Callable

from tangram.core.action import Action
from tangram.core.allocation import allocate_one
from tangram.core.backlog import Domain
from tangram.core.context import Context
from tangram.core.options import Options
from tangram.core.round import Round

#: A wait is taken only when it promises a finish earlier by this share of starting now.
WAIT_GAIN = 0.5
#: ... and only when the wait is at most this share of its time if started now (a long hold
#: of cores delays every action queued behind it, which the test does not weigh).
MAX_WAIT_SHARE = 0.25
ONLY_ALONE = True
#: An awaiting action starts on what is free once its expected wait has passed this many times.
PATIENCE = 2.0

#: action id -> (cores it waits for, when it starts on what is free anyway).
Awaiting = dict[str, tuple[int, float]]


def _duration(opts: Options, units: int) -> float:
    return opts.durations[opts.units.index(units)]


def _frees(ctx: Context, domain: Domain) -> list[tuple[float, int]]:
    """(estimated finish, units) of the node's running actions that end in the future, sorted."""
    now = ctx.now
    return sorted(
        [
            (r.est_finish, r.start.units)
            for r in ctx.running_in(domain)
            if not r.start.in_slot and r.est_finish > now
        ]
    )


def best_wait(
    opts: Options, free: int, frees: list[tuple[float, int]]
) -> tuple[float, int, float] | None:
    """The earliest finish by waiting: (when it would start, on how many cores, its finish)."""
    top = opts.units[opts.fastest]
    best: tuple[float, int, float] | None = None
    have = free
    for when, units in frees:
        have += units
        k = min(have, top)
        if k < opts.units[0]:
            continue
        k = opts.units[opts.best_within(k)] if not opts.consecutive else k
        finish = when + _duration(opts, k)
        if best is None or finish < best[2]:
            best = (when, k, finish)
        if have >= top:
            break
    return best


def _waiting_here(ctx: Context, domain: Domain, awaiting: Awaiting) -> str | None:
    """The action waiting on this node (entries of actions no longer queued are dropped)."""
    domain_of = ctx.scheduler.backlog.domain_of
    for action_id in list(awaiting):
        where = domain_of.get(action_id)
        if where is None:
            del awaiting[action_id]
        elif where == domain:
            return action_id
    return None


def held_for(ctx: Context, domain: Domain, awaiting: Awaiting) -> int:
    """Free cores held on this node for its awaiting action (0 when none waits)."""
    if not awaiting:
        return 0
    action_id = _waiting_here(ctx, domain, awaiting)
    if action_id is None:
        return 0
    return min(ctx.state.cpu[domain[1]].free_cores, awaiting[action_id][0])


def serve_awaiting(
    ctx: Context,
    domain: Domain,
    awaiting: Awaiting,
    started: Callable[[Action], None] | None = None,
) -> int:
    """Start the node's awaiting action once its cores are free (or its patience is spent),
    telling ``started``; returns the free cores still held for it."""
    if not awaiting:
        return 0
    action_id = _waiting_here(ctx, domain, awaiting)
    if action_id is None:
        return 0
    wanted, until = awaiting[action_id]
    node = ctx.state.cpu[domain[1]]
    free = node.free_cores
    if free < wanted and ctx.now < until:
        return free
    del awaiting[action_id]
    action = ctx.scheduler.backlog.queues[domain].live[action_id]
    opts = ctx.options(action)
    if opts.units[0] > free:
        return 0
    k, _ = allocate_one(opts, free)
    units = opts.units[k]
    why = "its cores are free" if free >= wanted else "its wait ran past the estimate"
    ctx.start_on_cores(
        action,
        node.spec.name,
        units,
        f"tangram: {units} of {free} free cores after waiting ({why})",
    )
    if started is not None:
        started(action)
    return 0


def defer_short_grants(
    ctx: Context, domain: Domain, rnd: Round, free: int, awaiting: Awaiting
) -> Round:
    """The round with its first short-granted non-malleable candidate deferred (and its
    cores held) when waiting for cores finishes it sooner; the others keep their grants."""
    if _waiting_here(ctx, domain, awaiting) is not None:
        return rnd
    if ONLY_ALONE and (rnd.evicted or ctx.queue_len(domain) > len(rnd.kept)):
        return rnd  # others wait too: holding cores for one would delay them all
    now = ctx.now
    frees: list[tuple[float, int]] | None = None
    left = free - sum(rnd.units)
    for i, (action, units) in enumerate(zip(rnd.kept, rnd.units, strict=True)):
        if action.malleable:
            continue
        opts = ctx.options(action)
        if units >= opts.units[opts.fastest]:
            continue
        if frees is None:
            frees = _frees(ctx, domain)
            if not frees:
                return rnd
        wait = best_wait(opts, units + left, frees)
        start_now = now + _duration(opts, units)
        if wait is None or wait[2] >= start_now - WAIT_GAIN * (start_now - now):
            continue
        if wait[0] - now > MAX_WAIT_SHARE * (start_now - now):
            continue
        when, cores, finish = wait
        awaiting[action.id] = (cores, now + PATIENCE * (when - now))
        ctx.defer(
            action,
            f"tangram: waits ~{when - now:.3f}s for {cores} cores (finish ~{finish - now:.3f}s) "
            f"rather than {units} now (~{start_now - now:.3f}s)",
        )
        # The others keep their grants; its own cores and the leftovers are held for it.
        return Round(
            [a for j, a in enumerate(rnd.kept) if j != i],
            [u for j, u in enumerate(rnd.units) if j != i],
            rnd.evicted,
            rnd.method,
            rnd.estimate,
            rnd.estimate_without_eviction,
        )
    return rnd


def leave_room_for_arrivals(ctx: Context, domain: Domain, rnd: Round, free: int) -> Round:
    """The round with non-malleable grants trimmed so the trajectories generating on the node
    find a core when they send their next action during the grant's run.

    Expected arrivals within a grant's run of d seconds: generating trajectories x
    (1 - exp(-d / mean gap)), the gap being how long the node's trajectories generated
    between actions so far (``tangram.core.arrivals``); each needs a core beyond those the
    round left free. A malleable action is not trimmed (it will shrink when they come).
    """
    node = ctx.state.cpu[domain[1]]
    stats = ctx.scheduler.arrivals  # (kept when the rule declares ``tracks_arrivals``)
    gap = stats.gap.get(node.spec.name) if stats is not None else None
    if not gap or gap <= 0:
        return rnd
    generating = _generating(ctx, domain)
    if generating <= 0:
        return rnd
    resizes = ctx.scheduler.resizable
    units = list(rnd.units)
    for i, (action, k) in enumerate(zip(rnd.kept, rnd.units, strict=True)):
        opts = ctx.options(action)
        if (action.malleable and resizes) or k == opts.units[0]:
            continue
        expected = generating * -math.expm1(-_duration(opts, k) / gap)
        spare = free - sum(units)
        room = math.ceil(expected - 1e-9) - spare
        if room <= 0:
            continue
        cap = max(opts.units[0], k - room)
        units[i] = opts.units[opts.best_within(cap)]
    return _regranted(rnd, units, "room for arrivals")


#: A non-malleable grant stops where a core adds less than this share of a core's speed-up
#: ... while other trajectories on the node may send actions (``cap_at_the_knee``).
KNEE = 0.4


def cap_at_the_knee(ctx: Context, domain: Domain, rnd: Round) -> Round:
    """The round with each non-malleable grant cut to its knee (the most cores at which its
    efficiency, speed-up / cores, is still ``KNEE``) when other trajectories on the node are
    generating: its DoP is fixed for its whole run, and cores past the knee buy little speed
    while the actions those trajectories will send would have to wait for them."""
    if _generating(ctx, domain) <= 0:
        return rnd
    resizes = ctx.scheduler.resizable
    units = list(rnd.units)
    for i, (action, k) in enumerate(zip(rnd.kept, rnd.units, strict=True)):
        if (action.malleable and resizes) or k <= 1:
            continue
        units[i] = knee_of(ctx.options(action), k)
    return _regranted(rnd, units, "at the knee")


def knee_of(opts: Options, k: int) -> int:
    """The most units up to ``k`` at which the action's efficiency (speed-up / units) is
    still ``KNEE``."""
    d1 = opts.durations[0] * opts.units[0]  # (one-unit time, for consecutive CPU options)
    knee = opts.units[0]
    for j, u in enumerate(opts.units):
        if u > k:
            break
        if d1 / (opts.durations[j] * u) >= KNEE:
            knee = u
    return knee


def _generating(ctx: Context, domain: Domain) -> int:
    """Trajectories bound to the node with no CPU action queued or running there (generating,
    or waiting on a GPU or API call)."""
    in_flight = ctx.queue_len(domain) + len(ctx.scheduler.runs.by_domain.get(domain, ()))
    return ctx.state.cpu[domain[1]].containers - in_flight


def _regranted(rnd: Round, units: list[int], why: str) -> Round:
    """The round with its kept actions' units replaced (itself when none changed)."""
    if units == rnd.units:
        return rnd
    return Round(
        rnd.kept, units, rnd.evicted, f"{rnd.method}, {why}", rnd.estimate,
        rnd.estimate_without_eviction,
    )  # fmt: skip
