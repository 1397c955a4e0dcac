"""A long GPU call waits for a larger cell rather than run for long on a small one (issue 11).

A call's DoP is fixed at start: a 200-s call that takes the one free GPU runs 200 s, although
the 4-GPU cell a burst of short calls holds frees a second later and would run it in 88 s. When
the allocation (or the free cells left) gives a call a cell smaller than its fastest, the
default looks at the larger cells the running calls will free (their estimated finishes): if
waiting for one and then running on it finishes the call at least ``GAIN`` sooner than starting
now, the wait is at most ``MAX_WAIT_SHARE`` of the run it would do now, the cell is at most
``MAX_POOL_SHARE`` of the pool, and the time it saves pays for what the others lose (the
GPU-seconds it takes beyond a start now, counted only while calls wait (until the queued
work is placed on the GPUs as they free, ``Backlog.drained``), and the reserved GPUs idle
while it waits, weighted by the calls queued; and at least the delay its cell's hold puts on
the queued calls' service, ``blocked``), the call waits and
the cell is reserved for it: no other call starts on the reserved GPUs meanwhile, unless it is
expected to be done before the cell is (backfill). A reservation lasts until its cell frees,
or past twice the expected wait, at the next GPU pass; a call waits at most once, then
competes as any other (no starvation, no ping-pong).

The same reservation keeps a wide call from starving: a call whose smallest cell is larger
than every free one, once it has waited ``HEAD_PATIENCE`` times its expected duration (at least
``gpu_cost.AGING_CAP_S``; narrower calls may pass it that long), holds the cell of its size
that frees first until it starts (``reserve_head``; one such call at a time).
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass
from typing import NamedTuple

from tangram.core.action import Action
from tangram.core.backlog import GPU_DOMAIN
from tangram.core.cells import aligned_cells
from tangram.core.context import Context
from tangram.core.gpu_placement import runs_on
from tangram.core.policies.gpu_cost import AGING_CAP_S

#: Waiting must finish the call at least this share of its run-now time sooner.
GAIN = 0.25
#: ... and the wait may be at most this share of its run-now time.
MAX_WAIT_SHARE = 0.5
#: A call never waits for a cell of more than this share of the pool's GPUs (the others keep
#: the rest).
MAX_POOL_SHARE = 0.5
#: A reservation lasts at most this many times the expected wait.
RESERVE_FACTOR = 2.0
#: A call wider than every free cell reserves one after waiting this many times its expected
#: duration (at least ``gpu_cost.AGING_CAP_S``): its slowdown stays bounded (about twice its
#: run, plus the cell's drain), while the short calls that pass it meanwhile are not held for
#: a run far longer than theirs (a 100-s 2-GPU call reserving after 2 s kept a 2-GPU node
#: from twenty 1-s calls for 300 s; ``tests/mechanisms/gpu/head_patience``).
HEAD_PATIENCE = 1.0


class Backlog(NamedTuple):
    """The pool's backlog at a pass: when each (node, GPU) is next free, and the queued
    calls' work (GPU-seconds, each at its smallest cell) and count."""

    free_at: dict[tuple[str, int], float]
    work: float
    queued: int

    def drained(
        self, free_at: dict[tuple[str, int], float] | None = None, skip: float = 0.0
    ) -> float:
        """When the queued work but ``skip`` GPU-seconds is placed, poured onto the GPUs as
        each frees (``free_at``, default the pool's now)."""
        return filled(sorted((free_at or self.free_at).values()), max(0.0, self.work - skip))


@dataclass(frozen=True)
class Reservation:
    """A queued call waiting for ``cell`` on ``node``, expected free at ``ready``."""

    action: Action
    node: str
    cell: tuple[int, ...]
    ready: float
    until: float


class CellWaits:
    """The GPU rule's reservations: which queued calls wait for which cells."""

    __slots__ = ("by_action", "waited", "head")

    def __init__(self) -> None:
        self.by_action: dict[str, Reservation] = {}
        #: The call holding the head reservation (``reserve_head``), if any.
        self.head: str | None = None
        #: Calls that waited once (they never wait again).
        self.waited: set[str] = set()

    def forget(self, action_id: str) -> None:
        """The call was taken back: its reservation and its record of having waited go."""
        self.by_action.pop(action_id, None)
        self.waited.discard(action_id)
        if self.head == action_id:
            self.head = None

    def ready_at(self) -> dict[tuple[str, int], float]:
        """(node, GPU) -> when the call holding it expects its cell: a narrower call may run
        on a held GPU only if it is done by then (backfill)."""
        at: dict[tuple[str, int], float] = {}
        for r in self.by_action.values():
            for g in r.cell:
                at[(r.node, g)] = min(at.get((r.node, g), math.inf), r.ready)
        return at

    def reserved(self) -> dict[str, set[int]]:
        """GPUs held for waiting calls, per node."""
        held: dict[str, set[int]] = {}
        for r in self.by_action.values():
            held.setdefault(r.node, set()).update(r.cell)
        return held

    def serve(self, ctx: Context) -> None:
        """Start each waiting call whose cell is free; drop reservations past their time or
        whose call is no longer queued."""
        gpu_queue = ctx.scheduler.backlog.queues.get(GPU_DOMAIN)
        queued = gpu_queue.live if gpu_queue is not None else {}
        if self.head is not None and self.head not in self.by_action:
            self.head = None
        for aid, r in list(self.by_action.items()):
            if queued.get(aid) is not r.action:  # (that very call: an id may be reused)
                del self.by_action[aid]
                if aid == self.head:
                    self.head = None
                continue
            node = ctx.state.gpu[r.node]
            if all(node.owner[g] is None for g in r.cell):
                del self.by_action[aid]
                head = self.head
                if aid == self.head:
                    self.head = None
                restored = not node.is_resident(r.action.service or "", r.cell)
                ctx.start(
                    r.action,
                    r.node,
                    len(r.cell),
                    f"tangram: {len(r.cell)} GPU cell on {r.node} reserved for it "
                    f"({'restore' if restored else 'resident'}; "
                    f"{'no free cell was wide enough' if aid == head else 'a larger cell soon beat a small one now'})",
                    gpus=r.cell,
                )
            elif ctx.now >= r.until - 1e-9:
                del self.by_action[aid]

    def reserve_head(
        self, ctx: Context, action: Action, restore: Callable[[str, tuple[int, ...]], float]
    ) -> str | None:
        """Reserve the cell of ``action``'s smallest size it can start on first (a resident
        cell saves the restore; ``restore`` is what a restore onto a cell costs, with its
        evictions), when no other call
        holds the head reservation: a call wider than every free cell is otherwise passed
        forever by narrower ones taking each GPU as it frees (EASY backfilling's head
        reservation, without backfill); the reason, or None when there is no such cell."""
        if self.head is not None:
            return None
        size, now = ctx.options(action).units[0], ctx.now
        until, held = _busy_until(ctx), self.reserved()
        best: tuple[float, float, str, tuple[int, ...]] | None = None
        for name, node in ctx.state.gpu.items():
            if not runs_on(action, node.spec, size):
                continue
            mine = held.get(name, set())
            for cell in aligned_cells(node.spec.gpus, size):
                if mine.intersection(cell) or any(
                    node.owner[g] is not None and (name, g) not in until for g in cell
                ):
                    continue
                ready = max(until.get((name, g), now) for g in cell)
                start = ready
                if not node.is_resident(action.service or "", cell):
                    start += restore(name, cell)
                if best is None or start < best[0]:
                    best = (start, ready, name, cell)
        if best is None:
            return None
        _, ready, name, cell = best
        self.head = action.id
        self.by_action[action.id] = Reservation(action, name, cell, ready, math.inf)
        return (
            f"tangram: no free cell of its {size} GPUs; the cell {cell} on {name} (free in "
            f"~{ready - now:.3f}s) is reserved for it, no narrower call starts there"
        )

    def consider(
        self,
        ctx: Context,
        action: Action,
        node_name: str,
        size: int,
        restored: bool,
        backlog: Callable[[], Backlog],
        displaced: Callable[[str, tuple[int, ...]], float] | None = None,
    ) -> str | None:
        """Reserve a larger cell for ``action`` (about to start on ``size`` GPUs) when waiting
        for it finishes the call sooner (see the module); the reason, or None to start now."""
        if action.id in self.waited:
            return None
        opts = ctx.options(action)
        if size >= opts.units[-1]:
            return None
        k = opts.units.index(size)
        now = ctx.now
        run_now = opts.durations[k]
        if restored:
            run_now += ctx.restore_cost(action, node_name, size)
        pool = sum(n.spec.gpus for n in ctx.state.gpu.values())
        # Each GPU-second it takes from the pool delays each queued call by 1/pool seconds.
        weight = 1.0 + max(0, ctx.queue_len(GPU_DOMAIN) - 1) / pool
        until = _busy_until(ctx)
        held = self.reserved()
        service = action.service or ""
        best: tuple[float, float, str, tuple[int, ...]] | None = None
        b: Backlog | None = None
        drained = math.inf
        for name, node in ctx.state.gpu.items():
            mine = held.get(name, set())
            for j in range(k + 1, len(opts.units)):
                u = opts.units[j]
                if u > node.spec.gpus or u > pool * MAX_POOL_SHARE:
                    break
                if not runs_on(action, node.spec, u):
                    continue
                for cell in aligned_cells(node.spec.gpus, u):
                    if mine.intersection(cell) or any(
                        node.owner[g] is not None and (name, g) not in until for g in cell
                    ):
                        continue
                    ready = max(until.get((name, g), now) for g in cell)
                    run = opts.durations[j]
                    if not node.is_resident(service, cell):
                        run += ctx.restore_cost(action, name, u)
                    # Its saving must pay for what the others lose: the GPU-seconds it takes
                    # beyond a start now and the reserved GPUs idle while it waits, weighed
                    # by the calls queued behind it.
                    idle = sum(1 for g in cell if node.owner[g] is None) * (ready - now)
                    # Only while calls wait (until the pool has drained) do the GPUs it
                    # takes cost anyone anything.
                    if b is None:
                        b = backlog()
                        drained = b.drained()
                    busy = min(1.0, max(0.0, drained - ready) / run) if run > 0 else 0.0
                    cost = (max(0.0, u * run - size * run_now) * busy + idle) * weight
                    finish = ready + run
                    if now + run_now - finish < cost or (best is not None and finish >= best[0]):
                        continue
                    # ... and the restores the hold forces on the services whose copy sits on
                    # the cell (their queued calls restore elsewhere or wait). (Asked only for
                    # a cell that would otherwise be taken: it prices each service there.)
                    if displaced is not None:
                        cost += displaced(name, cell)
                        if now + run_now - finish < cost:
                            continue
                    # ... and at least what the others lose when it holds the cell: the queued
                    # calls behind it are served when the GPUs free; the GPUs it holds
                    # (``size`` from now, or the cell from ``ready``) shift when that is.
                    # (Computed last: only for a cell that would otherwise be taken.)
                    if b.queued > 1 and now + run_now - finish < blocked(
                        b, opts.units[0] * opts.durations[0], node_name, size, now + run_now,
                        name, cell, ready + run,
                    ):  # fmt: skip
                        continue
                    best = (finish, ready, name, cell)
        if best is None:
            return None
        finish, ready, name, cell = best
        wait = ready - now
        if wait <= 1e-9 or finish > now + (1.0 - GAIN) * run_now or wait > MAX_WAIT_SHARE * run_now:
            return None
        waited, queued = self.waited, ctx.scheduler.backlog.options
        if len(waited) > 2 * len(queued) + 1024:  # (mostly ids of calls started since: a long
            # run keeps only the queued ones, which alone are read)
            waited = self.waited = {aid for aid in waited if aid in queued}
        waited.add(action.id)
        until_s = now + RESERVE_FACTOR * wait
        self.by_action[action.id] = Reservation(action, name, cell, ready, until_s)
        return (
            f"tangram: waits ~{wait:.3f}s for the {len(cell)} GPU cell {cell} on {name} (done by "
            f"~{finish - now:.3f}s) rather than {run_now:.3f}s on {size} GPU now; cell reserved"
        )


def head_patience(expected_s: float) -> float:
    """How long a call wider than every free cell waits before it reserves one."""
    return max(AGING_CAP_S, HEAD_PATIENCE * expected_s)


def _busy_until(ctx: Context) -> dict[tuple[str, int], float]:
    """(node, GPU) -> when the running call holding it is expected to end."""
    now, until = ctx.now, {}
    for running in ctx.running_in(GPU_DOMAIN):
        start = running.start
        end = max(now, running.est_finish)
        for g in start.gpus:
            until[(start.node, g)] = end
    return until


def blocked(
    b: Backlog,
    mine: float,
    node_now: str,
    size: int,
    end_now: float,
    node_wait: str,
    cell: tuple[int, ...],
    end_wait: float,
) -> float:
    """What waiting for ``cell`` (held until ``end_wait``) rather than starting now on
    ``size`` GPUs of ``node_now`` (held until ``end_now``) costs the other queued calls: each
    is served by when the queued work (``mine`` left out) is placed on the GPUs as they free,
    and that moves by the difference (the others' count times it; none if it moves earlier)."""
    now_at = dict(b.free_at)
    now = min(now_at.values())
    taken = 0
    for key, at in sorted(now_at.items(), key=lambda kv: kv[1]):
        if taken == size:
            break
        if key[0] == node_now and at <= now + 1e-9:
            now_at[key] = end_now
            taken += 1
    wait_at = dict(b.free_at)
    for g in cell:
        wait_at[(node_wait, g)] = end_wait
    shift = b.drained(wait_at, mine) - b.drained(now_at, mine)
    return max(0.0, shift) * (b.queued - 1)


def gpu_free_times(ctx: Context) -> dict[tuple[str, int], float]:
    """When each GPU of the pool is next free: now, or its running call's expected end."""
    now = ctx.now
    free = {(name, g): now for name, node in ctx.state.gpu.items() for g in range(node.spec.gpus)}
    for running in ctx.running_in(GPU_DOMAIN):
        start = running.start
        for g in start.gpus:
            free[(start.node, g)] = max(now, running.est_finish)
    return free


def filled(free_at: list[float], work: float) -> float:
    """The time T by which GPUs freeing at ``free_at`` (sorted) give ``work`` GPU-seconds:
    sum over the GPUs of max(0, T - free) = work (water-filling)."""
    if not free_at:
        return math.inf
    total, level = 0.0, free_at[0]
    for i, at in enumerate(free_at):
        # GPUs 0..i-1 are open: filling them up to ``at`` gives i x (at - level) more.
        if i and work <= total + i * (at - level):
            return level + (work - total) / i
        total += i * (at - level)
        level = at
    return level + (work - total) / len(free_at)
