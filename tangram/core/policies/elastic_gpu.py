"""The ``tangram`` policy's GPU rule: elastic DoP in aligned cells, resident cells first.

The round itself (candidates, allocation, eviction) is ``elastic.elastic_round``; this rule
adds what GPU starts cost (a restore where no free cell holds the service), waits for a busy
resident cell when that is sooner than a restore, and places the cells.
"""

from __future__ import annotations

from collections.abc import Callable

from tangram.core.action import Action
from tangram.core.backlog import GPU_DOMAIN, Domain
from tangram.core.cells import cell_sizes
from tangram.core.context import Context
from tangram.core.gpu_placement import place_cell
from tangram.core.options import Options
from tangram.core.policies.base import DomainRule, RuleTraits
from tangram.core.policies.elastic import defer_evicted, elastic_round
from tangram.core.policies.tuning import ROBUST, ElasticTuning


class ElasticGpu(DomainRule):
    """The GPU pool under the tangram policy: elastic DoP in aligned cells, resident first.

    Restoring a model costs seconds (bytes / host-to-GPU bandwidth) against sub-second calls, so
    each option's cost is its duration plus the restore when no free cell of that size already
    holds the service: the allocation then prefers the DoP whose resident cell is free, and
    elasticity only wins where it beats a restore. Cells needing a restore are chosen where the
    fewest other services would be evicted.
    """

    traits = RuleTraits(queue_driven=True)

    def __init__(self, tuning: ElasticTuning = ROBUST) -> None:
        self.tuning = tuning
        self.depth = tuning.depth

    def schedule_domain(self, ctx: Context, domain: Domain) -> None:
        free = ctx.state.free_gpus
        if free == 0 or not ctx.queue_len(domain):
            return
        # Computed on first use, once per pass: no start happens before the round is decided.
        resident: dict[str, set[int]] | None = None
        restore_cost = _first_restore_cost(ctx)
        busy_until = _resident_busy_until(ctx)

        def resident_sizes(service: str) -> set[int] | frozenset[int]:
            nonlocal resident
            if resident is None:
                resident = _resident_free_sizes(ctx)
            return resident.get(service, _NO_SIZES)

        def wait_for_resident(action: Action) -> str | None:
            """Wait for a busy cell that holds the service when that is sooner than a restore."""
            service = action.service or ""
            if service not in busy_until:
                return None
            if resident_sizes(service):
                return None
            wait = busy_until[service] - ctx.now
            cost = restore_cost(action, ctx.options(action).units[-1])
            if wait >= cost:
                return None
            return f"tangram: waits ~{wait:.3f}s for a busy cell holding {service} rather than a {cost:.3f}s restore"

        def options_with_restore(action: Action) -> Options:
            opts = ctx.options(action)
            sizes = resident_sizes(action.service or "")
            if sizes.issuperset(opts.units):
                return opts
            durations = tuple(
                d if u in sizes else d + restore_cost(action, u)
                for u, d in zip(opts.units, opts.durations, strict=True)
            )
            return Options(opts.units, durations, False)

        rnd = elastic_round(
            ctx,
            domain,
            free,
            window=self.tuning.window or free,
            depth=self.depth,
            options_of=options_with_restore,
            hold=wait_for_resident,
        )
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
        defer_evicted(ctx, rnd)


_NO_SIZES: frozenset[int] = frozenset()


def _resident_free_sizes(ctx: Context) -> dict[str, set[int]]:
    """For each service, the cell sizes at which a free cell already holds it.

    One sweep over every free aligned cell (at most 15 per 8-GPU node) for all services, rather
    than one per service asked about: a pass over nine teachers asked nine times.
    """
    sizes: dict[str, set[int]] = {}
    for node in ctx.state.gpu.values():
        resident = node.resident
        for size in cell_sizes(node.spec.gpus):
            for cell in node.free_cells(size):
                for service in set.intersection(*(resident[g] for g in cell)):
                    sizes.setdefault(service, set()).add(size)
    return sizes


def _resident_busy_until(ctx: Context) -> dict[str, float]:
    """For each service resident on a cell a running action holds: when the first such cell frees."""
    until: dict[str, float] = {}
    for running in ctx.running_in(GPU_DOMAIN):
        start = running.start
        if start.in_slot or not start.gpus:
            continue
        node = ctx.state.gpu[start.node]
        services = set.intersection(*(node.resident[g] for g in start.gpus))
        for service in services:
            until[service] = min(until.get(service, running.est_finish), running.est_finish)
    return until


def _first_restore_cost(ctx: Context) -> Callable[[Action, int], float]:
    spec = next(iter(ctx.state.gpu.values())).spec
    return lambda action, cell_size: spec.restore_s(
        action.service_size_gb, cell_size, replicas=action.service_replicas
    )
