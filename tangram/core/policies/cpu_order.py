"""The order in which the ``tangram`` policy's CPU rule looks at a node's queue: trajectories
already under way first, then shortest expected first, with aging (beyond the paper, whose
order is FCFS).

Under FCFS an action of seconds queued behind one of minutes waits minutes (a node's cores are
held for an action's whole run, unlike CFS, which time-slices). Each queued action's key is its
arrival plus ``AGING`` times its fastest expected duration (at most ``AGING_CAP_S``); the queue
is read in key order. An action is passed only by actions arriving less than
min(``AGING`` x (its duration - theirs), ``AGING_CAP_S``) after it, so none waits for ever (no
starvation), and among equal durations the order is FCFS. Only the oldest ``LOOKAHEAD`` are
reordered (a bounded sort per pass).

**Continuation first** (``Continuation``). On an overloaded node, an action of a trajectory
that has already run one goes before the first action of a trajectory that has not (unless it
arrives more than ``NEWCOMER_STRETCH`` of the newcomer's expected durations after it). Mean ACT
is the area under the number of queued actions: served shortest first, every trajectory stays
alive, each with an action queued part of the time, until the batch drains at the end; served
continuation first, the trajectories under way finish one by one and the queue shrinks as they
do (what a Kubernetes pod per trajectory gets by admitting pods up to the node's requests).
A newcomer starts whenever no continuing action waits for the free cores, so the trajectories
under way are never more than the node keeps busy. A newcomer expected to run longer than the
node needs to drain the other work in view (the queue's head and the running actions' expected
remainders) is not held: it may be its step's critical path, which every second it waits
would lengthen (random CPU family: step beaten >5% on 4.5 / 6% of instances at seeds
0 / 1000 when every newcomer is held, 4 / 2.5% with this exception). No starvation: a held
newcomer is passed only by actions arriving within ``NEWCOMER_STRETCH`` + ``AGING`` of its
expected durations after it.
"""

from __future__ import annotations

from collections.abc import Iterator
from itertools import islice

from tangram.core.action import Action
from tangram.core.backlog import Domain, FcfsQueue
from tangram.core.context import Context

#: How many of its own expected durations an action may be passed by shorter later arrivals
#: (1 favoured mean ACT a little more and cost step and p99 ACT; docs/core.md has the figures).
AGING = 0.25
#: ... and by at most this many seconds of arrivals after it, however long it is: a long
#: action is often its trajectory's last and its step's critical path (random CPU family,
#: continuation first: no cap gave step beaten >5% on 4 / 6% of instances at seeds 0 / 1000,
#: 10 s gave 4 / 4%; 5-30 s give about the same).
AGING_CAP_S = 10.0
#: Only the oldest this many queued actions are reordered (the rest follow in FCFS order), so
#: a pass costs a bounded sort however long the queue.
LOOKAHEAD = 64

#: A held newcomer's key adds this many of its own expected durations: newcomers go shortest
#: first among themselves, and after every continuing action that arrives within that many of
#: its durations (a bounded stretch: none waits for ever). Random CPU family, 200 instances at
#: each of seeds 0 / 1000 / 2000 / 3000, mean ACT beaten >5%: 4 / 2 / 1 / 6.5% with newcomers
#: strictly after continuations (in arrival order), 3.5 / 2.5 / 1 / 5% at 4, 2.5 / 1 / 1.5 / 5%
#: at 16, 2 / 1 / 1.5 / 4% at 64 (step 4.5 / 2 / 4.5 / 4%), the same at 128-512.
NEWCOMER_STRETCH = 64.0


class Continuation:
    """The trajectories that have started an action (until they close): their later actions
    go before newcomers' first ones."""

    __slots__ = ("begun",)

    def __init__(self) -> None:
        self.begun: set[str] = set()

    def started(self, action: Action) -> bool:
        """Its trajectory is under way; whether it just began."""
        begun = self.begun
        if action.trajectory in begun:
            return False
        begun.add(action.trajectory)
        return True

    def closed(self, trajectory: str) -> None:
        self.begun.discard(trajectory)

    def newcomer(self, action: Action) -> bool:
        return action.trajectory not in self.begun


def drain_s(ctx: Context, domain: Domain, head: list[Action]) -> float:
    """Seconds the node's cores need for the work in view: the queued ``head``'s one-core
    times and the running actions' expected remaining core-seconds (a node under the CPU rule
    runs no static pods, so the running set's ``busy_core_seconds`` counts every one)."""
    work = sum([a.curve.t1 for a in head])
    work += ctx.scheduler.runs.busy_core_seconds(domain, ctx.now)
    return work / ctx.state.cpu[domain[1]].spec.cores


def shortest_first(
    ctx: Context,
    domain: Domain,
    keys: dict[str, float] | None = None,
    continuation: Continuation | None = None,
    last: dict[Domain, KeyOrder] | None = None,
) -> KeyOrder:
    """The domain's queued actions by key (FCFS among ties): arrival + AGING x fastest
    duration, plus, with ``continuation``, NEWCOMER_STRETCH x fastest duration for a newcomer
    (unless longer than the others' drain); the oldest ``LOOKAHEAD`` reordered, the rest after
    them in FCFS order. ``keys`` caches each action's key (the caller drops those of a
    trajectory's other queued actions when one of them starts: they are no longer newcomers).

    ``last`` keeps each domain's order: while nothing left the queue since and any actions
    pushed went behind the oldest ``LOOKAHEAD``, and every one of those still has its key, the
    order is the same and is reused (a pass on a busy node whose queue only grew at its end,
    the common pass there, reads and sorts nothing). Keys are only ever made here and dropped
    by the caller, so a key present now is the one sorted by."""
    options = ctx.options
    cache: dict[str, float] = {} if keys is None else keys
    fcfs_queue = ctx.scheduler.backlog.queues.get(domain)
    if last is not None and fcfs_queue is not None:
        before = last.get(domain)
        if before is not None and before.still_holds(fcfs_queue, cache):
            return before.for_pass(ctx)
    queue = ctx.queue(domain)
    head = list(islice(queue, LOOKAHEAD))
    drain: list[float] = []  # (computed once, for the pass's first newcomer)
    cores = ctx.state.cpu[domain[1]].spec.cores

    def key(action: Action) -> float:
        k = cache.get(action.id)
        if k is None:
            opts = options(action)
            fastest = opts.durations[opts.fastest]
            held = False
            if continuation is not None and continuation.newcomer(action):
                if not drain:
                    drain.append(drain_s(ctx, domain, head))
                # (The drain without its own work: what the others keep the cores busy for.)
                held = fastest <= drain[0] - action.curve.t1 / cores
            k = action.arrival + min(AGING * fastest, AGING_CAP_S)
            if held:
                k += NEWCOMER_STRETCH * fastest
            cache[action.id] = k
        return k

    ids = [action.id for action in head]
    for action, action_id in zip(head, ids, strict=True):  # (keys first: ``drain_s`` reads
        if action_id not in cache:  # the head; most keys are kept from an earlier pass)
            key(action)
    ranks = [cache[action_id] for action_id in ids]
    # A stable sort of positions by key (ties stay FCFS), keyed in C: the head in key order.
    head = [head[i] for i in sorted(range(len(head)), key=ranks.__getitem__)]
    # (A tuple of strings: the collector stops tracking it at its first pass over it.)
    fcfs = tuple(ids)
    order = KeyOrder(ctx, domain, head, set(ids))
    if last is not None and fcfs_queue is not None:
        order.sorted_from(fcfs_queue, fcfs)
        # The kept order holds no Context: a pass's Context (its decisions, the records they
        # name) would otherwise live on per node until the next rebuild, and every young
        # collection of the cyclic collector walked it.
        last[domain] = order.for_pass(None)
    return order


class KeyOrder:
    """The head in key order, then the rest of the queue in FCFS order, read lazily each time
    it is iterated (a pass's readers stop after a few candidates: copying a queue of thousands
    per pass cost more than the rest of the decision, ``tangram bench scheduler``)."""

    __slots__ = ("_ctx", "_domain", "_head", "_in_head", "_source")

    def __init__(
        self,
        ctx: Context | None,
        domain: Domain,
        head: list[Action],
        in_head: set[str] | None = None,
        source: tuple[FcfsQueue, int, int, tuple[str, ...]] | None = None,
    ) -> None:
        self._ctx, self._domain, self._head = ctx, domain, head
        self._in_head = {a.id for a in head} if in_head is None else in_head
        #: The queue the head was read from, its removals and length then, and the head's ids.
        self._source = source

    def sorted_from(self, queue: FcfsQueue, fcfs: tuple[str, ...]) -> None:
        """Remember the queue the head was just read from (its ids in ``fcfs``)."""
        self._source = (queue, queue.removed, len(queue.live), fcfs)

    def still_holds(self, queue: FcfsQueue, keys: dict[str, float]) -> bool:
        """Whether the head is still the queue's oldest ``LOOKAHEAD`` and keeps its keys: the
        same queue, nothing removed since, pushes only behind a full head."""
        source = self._source
        if source is None:
            return False
        read_from, removed, length, fcfs = source
        return (
            queue is read_from
            and queue.removed == removed
            and (length >= LOOKAHEAD or len(queue.live) == length)
            and all(map(keys.__contains__, fcfs))
        )

    def for_pass(self, ctx: Context | None) -> KeyOrder:
        """The same order, read through another pass's Context (None: kept between passes,
        not read)."""
        return KeyOrder(ctx, self._domain, self._head, self._in_head, self._source)

    def __iter__(self) -> Iterator[Action]:
        yield from self._head
        in_head = self._in_head
        assert self._ctx is not None, "a kept order is read through a pass's Context"
        for action in self._ctx.queue(self._domain):
            if action.id not in in_head:
                yield action
