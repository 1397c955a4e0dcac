"""The order in which the ``tangram`` policy's CPU rule looks at a node's queue: shortest
expected first, with aging (beyond the paper, whose order is FCFS).

Under FCFS an action of seconds queued behind one of minutes waits minutes (a node's cores are
held for an action's whole run, unlike CFS, which time-slices). Each queued action's key is its
arrival plus ``AGING`` times its fastest expected duration; the queue is read in key order. An
action is passed only by actions arriving less than ``AGING`` x (its duration - theirs) after
it, so none waits for ever (no starvation), and among equal durations the order is FCFS. Only
the oldest ``LOOKAHEAD`` are reordered (a bounded sort per pass).
"""

from __future__ import annotations

from itertools import islice

from tangram.core.action import Action
from tangram.core.backlog import Domain
from tangram.core.context import Context

#: How many of its own expected durations an action may be passed by shorter later arrivals
#: (1 favoured mean ACT a little more and cost step and p99 ACT; docs/core.md has the figures).
AGING = 0.25
#: ... and by at most this many seconds of arrivals after it, however long it is.
AGING_CAP_S = float("inf")
#: Only the oldest this many queued actions are reordered (the rest follow in FCFS order), so
#: a pass costs a bounded sort however long the queue.
LOOKAHEAD = 64


def shortest_first(
    ctx: Context, domain: Domain, keys: dict[str, float] | None = None
) -> list[Action]:
    """The domain's queued actions by arrival + AGING x fastest duration (FCFS among ties),
    the oldest ``LOOKAHEAD`` of them reordered, the rest after them in FCFS order. ``keys``
    caches each action's key (it never changes while the action waits)."""
    options = ctx.options
    cache: dict[str, float] = {} if keys is None else keys

    def key(action: Action) -> float:
        k = cache.get(action.id)
        if k is None:
            opts = options(action)
            k = cache[action.id] = action.arrival + min(
                AGING * opts.durations[opts.fastest], AGING_CAP_S
            )
        return k

    queue = ctx.queue(domain)
    head = list(islice(queue, LOOKAHEAD))
    head.sort(key=key)
    head.extend(queue)
    return head
