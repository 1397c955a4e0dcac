"""``lower-bound``: every action at its fastest option the moment it arrives.

Not a schedule (it ignores capacity); it is the floor a report compares policies against:
no queueing, no overhead, the most useful units. What the cluster cannot serve at all (a CPU
or GPU action on a cluster with no node of its kind, a GPU call whose model no cell of a node
with its host memory holds, a call to an API endpoint the cluster lacks) is rejected, as under every capacity-respecting policy: "run", it gave 0 rejected and a
finite ACT for actions no real schedule runs, so the comparison was meaningless.
"""

from __future__ import annotations

from tangram.core.action import Action
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
            unservable = _unservable(ctx, action)
            if unservable is not None:
                ctx.reject(action, f"lower-bound: {unservable}")
                continue
            opts = ctx.options(action)
            units = opts.units[opts.durations.index(min(opts.durations))]
            if action.resource is ResourceKind.CPU:
                node = ctx.node_of(action) or action.node or cluster.cpu_nodes[0].name
            elif action.resource is ResourceKind.GPU:
                node = cluster.gpu_nodes[0].name
            else:
                node = action.service or "-"
            ctx.start(action, node, units, "lower-bound: fastest option, no queueing")


def _unservable(ctx: Context, action: Action) -> str | None:
    """Why the cluster can never serve ``action`` whatever its capacity (None: it can). The
    same words as admission's check, which a policy that ignores capacity skips."""
    cluster = ctx.scheduler.cluster
    if action.resource is ResourceKind.CPU:
        return None if cluster.cpu_nodes else "CPU action but the cluster has no CPU node"
    if action.resource is ResourceKind.GPU:
        if not cluster.gpu_nodes:
            return "GPU action but the cluster has no GPU node"
        # (Capacity-respecting options: empty when no cell of a node whose host memory holds
        # the call holds its model; its own options then were a cell no schedule can use.)
        if not ctx.scheduler.admission.options.gpu_units(action):
            return (
                f"service {action.service!r} of {action.service_size_gb} GB fits no cell of at "
                f"most {action.max_units} GPUs on a GPU node with {action.memory_gb} GB of "
                "host memory"
            )
        return None
    if action.service not in ctx.state.api:
        return f"unknown API endpoint {action.service!r}; known: {sorted(ctx.state.api)}"
    return None
