"""``fixed:K``: action-level sharing at a fixed DoP K (the paper's DoP-4 and DoP-16 ablations).

Every action gets its largest option not above K (at least its smallest option) and starts in
strict FCFS order per domain: when the head does not fit, later actions wait behind it, which is
what makes a large fixed K queue in bursts.
"""

from __future__ import annotations

from tangram.core.backlog import Domain
from tangram.core.context import Context
from tangram.core.gpu_placement import place_cell
from tangram.core.options import Options
from tangram.core.policies.base import DomainRule, RuleTraits


def _fixed_units(opts: Options, k: int) -> int:
    return opts.units[max(opts.best_within(k), 0)]


class FixedCpu(DomainRule):
    traits = RuleTraits(queue_driven=True)

    def __init__(self, dop: int) -> None:
        self.dop = dop

    def schedule_domain(self, ctx: Context, domain: Domain) -> None:
        node = ctx.state.cpu[domain[1]]
        for action in ctx.queue(domain):
            units = _fixed_units(ctx.options(action), self.dop)
            if node.free_cores < units:
                return
            ctx.start_on_cores(action, node.spec.name, units, f"fixed:{self.dop}: {units} cores")


class FixedGpu(DomainRule):
    traits = RuleTraits(queue_driven=True)

    def __init__(self, dop: int) -> None:
        self.dop = dop

    def schedule_domain(self, ctx: Context, domain: Domain) -> None:
        for action in ctx.queue(domain):
            units = _fixed_units(ctx.options(action), self.dop)
            spot = place_cell(
                ctx.state,
                units,
                action.service or "",
                action.service_size_gb,
                action.service_replicas,
                action.memory_gb,
            )
            if spot is None:
                return
            ctx.start(action, spot[0], units, f"fixed:{self.dop}: {units} GPU cell", gpus=spot[1])
