"""The ``tangram`` policy: elastic FCFS window, per-domain allocation, greedy tail eviction.

For each domain whose capacity or queue changed (paper-notes.md, "Elastic scheduling"):
1. candidates: the first queued actions, in FCFS order, that fit the free units at their
   smallest option (at most ``window`` of them);
2. allocation: split the free units among them, minimising the sum of durations
   (``allocation.allocate``: marginal gain where exact, DP otherwise);
3. eviction: while more than one candidate remains, defer the latest-arrived one and give its
   units to the others; keep that only if the estimated total ACT (``projection``) improves;
4. start the kept candidates; CPU cores are chosen NUMA-locally, GPU cells by
   ``gpu_placement`` (resident cells first).
"""

from __future__ import annotations

from dataclasses import dataclass

from tangram.core.action import Action
from tangram.core.allocation import allocate
from tangram.core.gpu_placement import place_cell
from tangram.core.policies.base import DomainRule
from tangram.core.projection import projected_total
from tangram.core.scheduler import Context, Domain, Options

#: An eviction must lower the estimate by more than this (seconds) to count as an improvement,
#: so float noise never flips a decision.
_EPS = 1e-9


@dataclass(frozen=True)
class Round:
    """The outcome of one domain's allocation and eviction."""

    kept: list[Action]
    units: list[int]
    evicted: list[Action]
    method: str
    estimate: float
    estimate_without_eviction: float


def elastic_round(
    ctx: Context, domain: Domain, free: int, *, window: int, depth: int
) -> Round | None:
    """Steps 1-3 for one domain with ``free`` units; None when nothing can start."""
    cands: list[Action] = []
    rest: list[Options] = []
    need = 0
    for action in ctx.queue(domain):
        opts = ctx.options(action)
        if len(cands) < window and need + opts.units[0] <= free:
            cands.append(action)
            need += opts.units[0]
        else:
            rest.append(opts)
            if len(rest) >= depth:
                break
    if not cands:
        return None
    cand_opts = [ctx.options(a) for a in cands]
    fastest = [o.fastest for o in cand_opts]
    if sum(o.units[k] for o, k in zip(cand_opts, fastest, strict=True)) <= free:
        # No contention: everyone runs at its fastest option, which is optimal for the sum of
        # durations; evicting would give the others units they cannot use.
        units = [o.units[k] for o, k in zip(cand_opts, fastest, strict=True)]
        total = sum(o.durations[k] for o, k in zip(cand_opts, fastest, strict=True))
        return Round(cands, units, [], "uncontended", total, total)
    if (
        len(cands) == 1
    ):  # nothing to evict: the one candidate takes its best option within the free units
        chosen, method = allocate(cand_opts, free)
        return Round(
            cands,
            [cand_opts[0].units[chosen[0]]],
            [],
            method,
            cand_opts[0].durations[chosen[0]],
            cand_opts[0].durations[chosen[0]],
        )
    busy = [(r.est_finish, r.start.units) for r in ctx.running_in(domain) if not r.start.in_slot]

    def estimate(k: int) -> tuple[float, list[int], str]:
        chosen, method = allocate(cand_opts[:k], free)
        pairs = [(o.units[c], o.durations[c]) for o, c in zip(cand_opts[:k], chosen, strict=True)]
        left = free - sum(u for u, _ in pairs)
        return projected_total(ctx.now, pairs, busy, left, cand_opts[k:] + rest), chosen, method

    k = len(cands)
    best, chosen, method = estimate(k)
    first = best
    while k > 1:
        trial, trial_chosen, trial_method = estimate(k - 1)
        if trial < best - _EPS:
            k, best, chosen, method = k - 1, trial, trial_chosen, trial_method
        else:
            break
    units = [o.units[c] for o, c in zip(cand_opts[:k], chosen, strict=True)]
    return Round(cands[:k], units, cands[k:], method, best, first)


class ElasticCpu(DomainRule):
    """CPU nodes under the tangram policy."""

    def __init__(self, window: int = 32, depth: int = 32) -> None:
        self.window, self.depth = window, depth

    def schedule_domain(self, ctx: Context, domain: Domain) -> None:
        node = ctx.state.cpu[domain[1]]
        if node.free_cores == 0 or not ctx.queue_len(domain):
            return
        free = node.free_cores
        rnd = elastic_round(ctx, domain, free, window=self.window, depth=self.depth)
        if rnd is None:
            return
        for action, units in zip(rnd.kept, rnd.units, strict=True):
            ctx.start(
                action,
                node.spec.name,
                units,
                f"tangram: {units} of {free} free cores ({rnd.method}, {len(rnd.kept)} started)",
                cores=node.choose_cores(units),
            )
        _defer_evicted(ctx, rnd)


class ElasticGpu(DomainRule):
    """The GPU pool under the tangram policy: elastic DoP in aligned cells, resident first."""

    def __init__(self, window: int = 32, depth: int = 32) -> None:
        self.window, self.depth = window, depth

    def schedule_domain(self, ctx: Context, domain: Domain) -> None:
        free = ctx.state.free_gpus
        if free == 0 or not ctx.queue_len(domain):
            return
        rnd = elastic_round(ctx, domain, free, window=self.window, depth=self.depth)
        if rnd is None:
            return
        # Place large cells first: small ones fit in the gaps large ones leave.
        order = sorted(range(len(rnd.kept)), key=lambda i: (-rnd.units[i], i))
        for i in order:
            action, units = rnd.kept[i], rnd.units[i]
            opts = ctx.options(action)
            for size in reversed(opts.units[: opts.units.index(units) + 1]):
                spot = place_cell(ctx.state, size, action.service or "")
                if spot is not None:
                    node, cell = spot
                    resident = ctx.state.gpu[node].is_resident(action.service or "", cell)
                    ctx.start(
                        action,
                        node,
                        size,
                        f"tangram: {size} GPU cell on {node} ({'resident' if resident else 'restore'}, "
                        f"{rnd.method} gave {units})",
                        gpus=cell,
                    )
                    break
            else:
                ctx.defer(
                    action, "tangram: no aligned free cell of its smallest size after placement"
                )
        _defer_evicted(ctx, rnd)


def _defer_evicted(ctx: Context, rnd: Round) -> None:
    for action in rnd.evicted:
        ctx.defer(
            action,
            f"tangram: evicted; estimated total ACT {rnd.estimate_without_eviction:.3f}s -> "
            f"{rnd.estimate:.3f}s",
        )
