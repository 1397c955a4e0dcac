"""``lower-bound``: every action at its fastest option the moment it arrives.

Not a schedule (it ignores capacity); it is the floor a report compares policies against:
no queueing, no overhead, the most useful units.
"""

from __future__ import annotations

from tangram.core.capabilities import Capabilities
from tangram.core.context import Context
from tangram.core.policies.base import BasePolicy
from tangram.core.resources import ResourceKind


class LowerBound(BasePolicy):
    name = "lower-bound"
    # It ignores capacity; it starts arrivals, so completions never need a pass.
    capabilities = Capabilities(respects_capacity=False, queue_driven=True)

    def schedule(self, ctx: Context) -> None:
        cluster = ctx.scheduler.cluster
        for action in ctx.arrived:
            opts = ctx.options(action)
            units = opts.units[opts.durations.index(min(opts.durations))]
            if action.resource is ResourceKind.CPU:
                node = (
                    ctx.node_of(action)
                    or action.node
                    or (cluster.cpu_nodes[0].name if cluster.cpu_nodes else "-")
                )
            elif action.resource is ResourceKind.GPU:
                node = cluster.gpu_nodes[0].name if cluster.gpu_nodes else "-"
            else:
                node = action.service or "-"
            ctx.start(action, node, units, "lower-bound: fastest option, no queueing")
