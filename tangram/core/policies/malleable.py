"""Malleable CPU grants: running malleable actions shrink to admit queued ones and grow into
idle cores (beyond the paper, whose DoP is fixed at start).

At each pass over a node, before the elastic round:

* **shrink to admit**: the node's cores held by running malleable actions plus its free cores
  are split among those actions (their work left) and the queued candidates (their whole work)
  by marginal gain, each running action keeping at least one core and each candidate getting at
  least its smallest option: a candidate is always admitted before any action gets a further
  core. Running actions whose share is smaller give the difference back; the elastic round then
  starts the queue on the free cores as before.
* **grow to fill**: once nothing fits in the queue, free cores go to running malleable actions
  by marginal gain (the share of its time left the next core saves), up to ``max_units``.

Hysteresis: a running action is resized only when its grant changes by at least a quarter
(and by at least one core), so a pass never churns cpusets by a core or two; a shrink that
admits a queued action is always made.
"""

from __future__ import annotations

import heapq
from collections.abc import Callable
from itertools import islice

from tangram.core.action import Action
from tangram.core.backlog import Domain
from tangram.core.context import Context
from tangram.core.curves import Amdahl
from tangram.core.options import Options
from tangram.core.projection import projected_total
from tangram.core.resize import remaining_fraction
from tangram.core.running import Running, growth_cap

#: A grant changes only by at least this share of itself (hysteresis against churn).
HYSTERESIS = 0.25
#: About how many steps a split of a node's cores takes (the cost of a pass on a big node).
SPLIT_STEPS = 32
#: Skip the split when the queue's smallest options fit the free cores and nothing holds cores
#: it grew into (random CPU family, 120 instances: the same shares within one instance).
SKIP_WHEN_FITS = True
#: Queued actions a pass may admit by shrinking running ones (the next pass admits more).
MAX_ADMIT = 16
#: Running actions a pass may shrink: those holding the most cores.
MAX_GIVERS = 16


def _worth(old: int, new: int) -> bool:
    return abs(new - old) >= max(1.0, HYSTERESIS * old)


def _split(
    floors: list[int],
    caps: list[int],
    cost: list[Callable[[int], float]],
    pool: int,
) -> list[int]:
    """Each participant's units: start at its floor, then hand out units to the one whose next
    step saves the largest share of its time per unit (a heap), while any saves time. Steps
    are of ``max(1, left // SPLIT_STEPS)`` units, so a split of a big node costs at most about
    ``SPLIT_STEPS`` heap operations, not one per core.

    The share, not the seconds: the split minimises the sum of the logs of the participants'
    times (proportional fairness), not the sum of the times. Seconds saved favour the longest
    action (a core saves it the most), which is the opposite of what mean ACT wants: shorter
    actions finishing sooner free their cores and leave the system (heSRPT, Berg et al. 2020,
    gives shorter jobs the larger shares). On the random CPU family (200 instances, two seed
    ranges) it took mean ACT beaten >5% from 19.5 / 16% to 11.5 / 8.5%, step from 20.5 / 25.5%
    to 23.5 / 27.5% (docs/core.md)."""
    units = list(floors)
    left = pool - sum(floors)
    step = max(1, left // SPLIT_STEPS)
    # Each heap entry carries the participant's time after its next step: a step's end is the
    # next step's start (one cost call per step, not two). The gain of a step is written out
    # twice below, not called (the split is a pass's hottest loop).
    heap = []
    for i, (c, k, cap) in enumerate(zip(cost, units, caps, strict=True)):
        if k < cap:
            now = c(k)
            nxt = k + step if k + step < cap else cap
            after = c(nxt)
            g = (now - after) / (now * (nxt - k)) if now > 0 else 0.0
            heap.append((-g, i, after))
    heapq.heapify(heap)
    pop, push = heapq.heappop, heapq.heappush
    while left > 0 and heap:
        best, i, after = pop(heap)
        if best >= 0:  # (negated) the best next step saves nothing
            break
        k, cap = units[i], caps[i]
        add = cap - k if cap - k < step else step
        if left < add:
            add = left
        k = units[i] = k + add
        left -= add
        if k < cap:
            now = after  # (add is the whole step here: only the last may be cut)
            nxt = k + step if k + step < cap else cap
            after = cost[i](nxt)
            g = (now - after) / (now * (nxt - k)) if now > 0 else 0.0
            push(heap, (-g, i, after))
    return units


def _running_cost(r: Running, left: float) -> Callable[[int], float]:
    curve = r.action.curve
    if type(curve) is Amdahl:  # (``Amdahl.duration`` inline, the same arithmetic: a split's
        # hot call, and units here are always >= 1, so its check is not needed)
        # (Defaults, not a closure: read as locals per call, and no cells made per giver.)
        return lambda k, f=left, t1=curve.t1_seconds, s=curve.serial_fraction: (
            f * (t1 * (s + (1.0 - s) / k))
        )
    return lambda k: left * curve.duration(k)


def shrink_to_admit(ctx: Context, domain: Domain, cap: int) -> None:
    """Shrink running malleable actions so the queued candidates get their share of the node."""
    node = ctx.state.cpu[domain[1]]
    # Only actions above one core can shrink: those on one keep it and stay out of the split.
    # Of those, the MAX_GIVERS holding the most take part (a pass's cost stays bounded on a
    # node of hundreds of running actions; the next pass splits again).
    runs = ctx.scheduler.runs
    wide = runs.wide.get(domain)
    if not wide:
        return
    free = node.free_cores
    options = ctx.options  # (bound once: ctx may be a queue view that forwards each lookup)
    # The queue's first MAX_ADMIT with their options, read once: both the test below and the
    # candidates read no further (each read of a queue view walks two generators).
    head = [(action, options(action)) for action in islice(ctx.queue(domain), MAX_ADMIT)]
    if _fits_free(head, free):
        return
    givers = runs.widest(domain, MAX_GIVERS) if len(wide) > MAX_GIVERS else list(wide.values())
    pool = free + sum([r.start.units for r in givers])
    room = pool - len(givers)  # each running action keeps a core
    cands: list[Action] = []
    cand_options: list[Options] = []
    need = want = 0
    for action, opts in head:  # (at most MAX_ADMIT: the head is no longer)
        smallest = opts.units[0]
        if need + smallest > room:
            break
        cands.append(action)
        cand_options.append(opts)
        need += smallest
        want += opts.units[-1]
    if not cands or want <= free:
        # (Every candidate's largest option fits the free cores: a shrink would give them
        # nothing, only move cores between running actions, which growing does.)
        return
    if SKIP_WHEN_FITS and need <= free and all([r.start.units <= r.base_units for r in givers]):
        # The queue's smallest options fit the free cores and no running action holds cores
        # it grew into: the round admits them without a shrink (a shrink below a start grant
        # to give a candidate more than its smallest option is not worth a pass's split).
        return
    now = ctx.now
    resizable = [(r, remaining_fraction(r, now)) for r in givers]
    floors = [1] * len(resizable) + [o.units[0] for o in cand_options]
    caps = [min(growth_cap(r), cap) for r in givers] + [o.units[-1] for o in cand_options]
    costs = [_running_cost(r, left) for r, left in resizable] + [
        _queued_cost(o) for o in cand_options
    ]
    target = _split(floors, caps, costs, pool)
    if any(
        t < r.base_units for r, t in zip(givers, target, strict=False)
    ) and not _admitting_is_sooner(ctx, domain, resizable, cand_options, costs, target):
        # Below their start grants only when that is estimated sooner; the cores they grew
        # into idle are always given back to queued actions.
        target = [max(t, r.base_units) for r, t in zip(givers, target, strict=False)]
    short = need - free  # cores the candidates' smallest options lack
    for r, units in zip(givers, target, strict=False):
        held = r.start.units
        if units < held and (short > 0 or units >= r.base_units or _worth(held, units)):
            ctx.resize(
                r,
                units,
                f"tangram: shrunk {held} -> {units} cores to admit {len(cands)} queued "
                f"(marginal split of {pool} cores)",
            )
            short -= held - units


def _fits_free(head: list[tuple[Action, Options]], free: int) -> bool:
    """Whether the queue's first ``MAX_ADMIT`` actions' largest options (``head``, with their
    options) all fit the free cores (then no shrink can give them anything: the common pass,
    answered before any split)."""
    want = 0
    for _, opts in head:
        want += opts.units[-1]
        if want > free:
            return False
    return True


def _admitting_is_sooner(
    ctx: Context,
    domain: Domain,
    resizable: list[tuple[Running, float]],
    cand_options: list[Options],
    costs: list[Callable[[int], float]],
    target: list[int],
) -> bool:
    """Whether the split (running actions shrunk, candidates started now) lowers the estimated
    total completion time of the running malleable actions and the candidates, against
    leaving them be and the candidates queued for the units running actions free (the
    eviction test's projection). A shrunk action is estimated to get its grant back once the
    longest admitted candidate ends: shrinking a long action for short ones pays, the
    converse rarely does."""
    now = ctx.now
    n = len(resizable)
    admitted = [cost(k) for cost, k in zip(costs[n:], target[n:], strict=True)]
    # A shrunk action runs on its share while the admitted ones run, then gets its grant back
    # (they end and it grows): its time is that phase plus the rest at its old units.
    phase = max(admitted, default=0.0)
    split = sum(admitted)
    stay = 0.0
    for i, (r, left) in enumerate(resizable):
        on_held = costs[i](r.start.units)
        stay += on_held
        on_share = costs[i](target[i])  # its work left, all on its share
        if on_share <= phase or left <= 0:
            split += on_share
        else:
            split += phase + (1.0 - phase / on_share) * on_held
    busy = ctx.scheduler.runs.finishes(domain, now)
    stay += projected_total(now, [], busy, ctx.state.cpu[domain[1]].free_cores, cand_options)
    return split < stay - 1e-9


def _queued_cost(opts: Options) -> Callable[[int], float]:
    return lambda k, durations=opts.durations, first=opts.units[0]: durations[k - first]


def grow_key(ctx: Context, domain: Domain, keep: int = 0) -> tuple[int, int]:
    """What a grow splits: the spare cores and how many running actions are below their cap
    (a pass whose key equals that of a grow that resized nothing skips it: the split would
    differ only by the work done since, which hysteresis ignores)."""
    growable = ctx.scheduler.runs.growable.get(domain)
    return ctx.state.cpu[domain[1]].free_cores - keep, len(growable) if growable else 0


def grow_to_fill(ctx: Context, domain: Domain, cap: int, *, keep: int = 0) -> int:
    """Give the node's free cores, but ``keep`` (held for an action waiting for them), to
    running malleable actions, by marginal gain; how many it resized."""
    node = ctx.state.cpu[domain[1]]
    spare = node.free_cores - keep
    if spare <= 0:
        return 0
    # Only actions below their cap can take a core (those at it would keep their units in the
    # split): the running set files them, so a pass does not walk every running action.
    growable = ctx.scheduler.runs.growable.get(domain)
    if not growable:
        return 0
    now = ctx.now
    resizable = [
        (r, left)
        for r in growable.values()
        if r.start.units < cap and (left := remaining_fraction(r, now)) > 0
    ]
    if not resizable:
        return 0
    held = [r.start.units for r, _ in resizable]
    caps = [min(growth_cap(r), cap) for r, _ in resizable]
    costs = [_running_cost(r, left) for r, left in resizable]
    target = _split(held, caps, costs, spare + sum(held))
    grown = 0
    for (r, _), old, units in zip(resizable, held, target, strict=True):
        if units > old and _worth(old, units):
            ctx.resize(r, units, f"tangram: grown {old} -> {units} cores into {spare} idle")
            grown += 1
    return grown
