"""The ``tangram`` policy's GPU rule: elastic DoP in aligned cells, resident cells first.

The round itself (candidates, allocation, eviction) is ``elastic.elastic_round``; this rule
adds what GPU starts cost (a restore where no free cell holds the service), waits for a busy
resident cell when that is sooner than a restore, and places the cells.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass

from tangram.core.action import Action
from tangram.core.backlog import GPU_DOMAIN, Domain
from tangram.core.cells import aligned_cells, cell_sizes, holds
from tangram.core.context import Context
from tangram.core.gpu_placement import host_holds, place_cell
from tangram.core.options import Options
from tangram.core.policies.base import DomainRule, RuleTraits
from tangram.core.policies.elastic import defer_evicted, elastic_round
from tangram.core.policies.gpu_cost import (
    ROOM_SHARE,
    ServiceLoad,
    copy_widths,
    evicted_by,
    eviction_charge,
    model_gb,
    own_drop,
    place_charged,
    resident_copies,
    resident_gb,
    robust_order,
)
from tangram.core.policies.gpu_waits import Backlog, CellWaits, gpu_free_times, head_patience
from tangram.core.policies.queue_view import OrderedQueue
from tangram.core.policies.tuning import ROBUST, ElasticTuning
from tangram.core.round import Round

#: A call the round narrows that runs more than this many times as long as any other call it
#: keeps is placed after them (``_RobustPass.run``).
OUTLASTS = 2.0
#: More GPU calls queued than this many per GPU of the pool: the pass is the paper's
#: (``schedule_domain`` says why and what the threshold costs).
OVERLOADED = 4


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
        self.load = ServiceLoad()
        self.waits = CellWaits()

    def on_withdraw(self, action: Action) -> None:
        """Its reservation goes (a reused id is a new call, not the one that reserved)."""
        self.waits.forget(action.id)

    def schedule_domain(self, ctx: Context, domain: Domain) -> None:
        if self.tuning.gpu_robust:
            self.load.observe(ctx)
            if ctx.queue_len(domain) <= OVERLOADED * ctx.state.spec.total_gpus:
                _RobustPass(self, ctx, domain).run()
                return
            # Overloaded: far more calls wait than the pool has GPUs. Every GPU is busy whatever
            # the rule, and the robust pass's restores and reservations cost more than they
            # save: MOPD on 10 GPUs at batch 2048, mean ACT 34.7 s under the robust pass alone,
            # 5.7 s under the paper's, 9.2 s switching at 4 calls per GPU (3.9 s at 0.5, but
            # the random GPU family then lost 0.5-10 points; at 4 it moves by 0.5-2).
        free = ctx.state.free_gpus
        if free == 0 or not ctx.queue_len(domain):
            return
        # Computed on first use, once per pass: no start happens before the round is decided.
        resident: dict[str, set[int]] | None = None
        widest: int | None = None
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
            units = ctx.options(action).units
            if self.tuning.gpu_robust:
                # The default's overloaded pass: the restore it would do now is at the widest
                # of its sizes that has a free cell (a wider one's cheaper restore cannot
                # happen now; with none free it cannot restore at all).
                nonlocal widest
                if widest is None:
                    widest = _widest_free_cell(ctx)
                fits = [u for u in units if u <= widest]
                cost = restore_cost(action, fits[-1]) if fits else math.inf
            else:
                cost = restore_cost(action, units[-1])
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
                spot = place_cell(
                    ctx.state,
                    size,
                    action.service or "",
                    action.service_size_gb,
                    action.service_replicas,
                    action.memory_gb,
                )
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
#: What a restore at a size with no free cell (none aligned and unreserved) adds to a call:
#: it cannot start there now, so neither ``hold`` nor the round may count on it.
UNPLACEABLE_S = 1e6
#: Queued calls whose work ``backlog`` sums before extrapolating (decisions stay microseconds).
_DRAIN_SAMPLE = 64


class _RobustPass:
    """One pass of the default's GPU rule: amortised restores, charged evictions, and the
    per-service order (``gpu_cost``); everything is computed on first use, once per pass."""

    def __init__(self, rule: ElasticGpu, ctx: Context, domain: Domain) -> None:
        self.rule, self.ctx, self.domain = rule, ctx, domain
        self.load = rule.load
        self.restore_cost = _first_restore_cost(ctx) if ctx.state.gpu else None
        self.pool_gb = sum(n.spec.gpus * n.spec.gpu_memory_gb for n in ctx.state.gpu.values())
        self.pool_gpus = sum(n.spec.gpus for n in ctx.state.gpu.values())
        self._widest: int | None = None
        #: ``widest_free(action)`` per (model size, replicas), this pass.
        self._widest_for: dict[tuple[float, bool, float], int] = {}
        self._backlog: Backlog | None = None
        self._resident: dict[str, set[int]] | None = None
        self._held: dict[str, set[int]] | None = None
        self._copies: dict[str, int] | None = None
        self._widths: dict[str, list[int]] | None = None
        self._busy: dict[str, float] | None = None
        self._calls: dict[str, float] = {}
        self._resident_gb: float | None = None
        self._servers: dict[str, list[_Server]] = {}
        #: The free copy (node, GPUs) each call that claimed one in ``hold`` runs on: no other
        #: call of the pass is placed over it (``_cell``).
        self._claimed_at: dict[str, tuple[str, tuple[int, ...]]] = {}
        #: The round's kept calls not yet placed (``run``).
        self._to_place: set[str] = set()
        self._seen: dict[str, int] = {}
        self._restores: set[str] = set()
        self._claimed: dict[str, int] = {}
        #: Calls that claimed a free copy on GPUs held for a waiting call (``hold``).
        self._backfills: set[str] = set()
        self._charge: dict[tuple[str, int, float], float | None] = {}
        self.waits = rule.waits
        self.reserved: dict[str, set[int]] = {}
        #: The cell held for the call placed last this pass (``run``), while the others go.
        self._kept: dict[str, set[int]] | None = None
        #: The driver said no call arrives until it says otherwise (a rollout step's last
        #: call is in: ``Scheduler.submissions_done``): a restore now serves the call it is
        #: made for, no future one (see ``calls`` and ``options``).
        self.ending = ctx.scheduler.no_more_arrivals

    def resident_sizes(self, service: str) -> set[int] | frozenset[int]:
        if self._resident is None:
            self._resident = _resident_sizes(self.ctx, free_only=True, reserved=self.reserved)
        return self._resident.get(service, _NO_SIZES)

    def held_sizes(self, service: str) -> set[int] | frozenset[int]:
        """Cell sizes at which some cell, free or busy, holds the service."""
        if self._held is None:
            self._held = _resident_sizes(self.ctx, free_only=False)
        return self._held.get(service, _NO_SIZES)

    def copies(self) -> dict[str, int]:
        if self._copies is None:
            self._copies = resident_copies(self.ctx)
        return self._copies

    def widths(self) -> dict[str, list[int]]:
        """``copy_widths``, once per pass (anew, with ``copies``, after a call starts)."""
        if self._widths is None:
            self._widths = copy_widths(self.ctx)
        return self._widths

    def queued(self, service: str) -> int:
        queue = self.ctx.scheduler.backlog.gpu_by_service.get(service)
        return len(queue) if queue is not None else 0

    def calls(self, service: str, size: int) -> float:
        """Calls a restore of ``service`` onto a cell of ``size`` is amortised over: of those
        below, the share that may run on that size (``ServiceLoad.share_at``).

        The first copy at that size serves every call expected over the horizon
        (``ServiceLoad.expected_calls``). Another copy shares with the copies that exist the
        calls still queued behind this one, or, while the pool's memory keeps room for it
        (``room_for_copy``), the calls expected: a busy service's copies then grow with its
        load instead of its calls falling back to the small cell it was warm on.

        When no call is to come (``ending``), one: the calls queued with it are already placed
        on the copies that exist (``hold``), and the rate's calls never come. (MOPD at batch
        2048 on the paper pool: its last ~58 calls arrive at once, each service has copies;
        amortised over the rate, the default restored ~40 copies for them, 1.8 s mean ACT
        against 0.65 s queued on the copies in place.)
        """
        if self.ending:
            return 1.0
        expected = self._calls.get(service)
        if expected is None:
            expected = self._calls[service] = self.load.expected_calls(
                service, self.ctx.now, self.queued(service), self.pool_gb
            )
        # A copy serves the cell it is restored as: only the calls that may run on it count.
        share = self.load.share_at(service, size)
        if size not in self.held_sizes(service):
            return max(1.0, expected * share)
        shared = self.queued(service) - self._seen.get(service, 0)
        if self.room_for_copy(service):
            shared = max(shared, expected)
        return max(1.0, shared * share / (len(self.servers(service)) + 1))

    def room_for_copy(self, service: str) -> bool:
        """Whether another copy of ``service`` fits in the pool's memory with room to spare
        (``ROOM_SHARE``, as for a first copy): else it would evict copies that are used."""
        if self._resident_gb is None:
            self._resident_gb = resident_gb(self.ctx, self.load)
        size = self.load.size_gb.get(service, 0.0)
        return self._resident_gb + size <= ROOM_SHARE * self.pool_gb

    def charge(self, action: Action, size: int) -> float | None:
        """The eviction charge of the best free cell of ``size`` (None: no free cell)."""
        # (per host memory too: a call needing more than a node has is not placed there)
        key = (action.service or "", size, action.memory_gb)
        if key not in self._charge:
            spot = place_charged(
                self.ctx,
                size,
                action,
                self.load,
                self.copies(),
                self.reserved,
                calls=self.calls(action.service or "", size),
                widths=self.widths,
            )
            self._charge[key] = None if spot is None else spot[2]
        return self._charge[key]

    def start_cost(self, action: Action, size: int) -> float:
        """What a restore onto a cell of ``size`` adds to one call: the restore over the
        calls it serves, plus the evictions it forces; ``UNPLACEABLE_S`` where no free cell of
        that size exists (the restore cannot happen now)."""
        assert self.restore_cost is not None
        charge = self.charge(action, size)
        if charge is None:
            # Priced as a restore with no evictions, a size with no free cell won ``hold``'s
            # comparison (a 4-GPU restore of a small model: a fraction of a second), the round
            # then gave the call a smaller cell that was free, and placement restored there
            # over another service's copy with an eviction charge nobody weighed against
            # waiting for the service's own cells.
            return UNPLACEABLE_S
        return self.restore_cost(action, size) / self.calls(action.service or "", size) + charge

    def displaced(self, action: Action, name: str, cell: tuple[int, ...]) -> float:
        """Restore seconds that holding ``cell`` on ``name`` for ``action`` forces on the other
        services with a copy there and calls queued: each one's restore, weighted by how much
        it needs that copy (none elsewhere: 1; else its busy GPUs over the copies left). Only
        queued calls are priced: a guess at arrivals moved MOPD's 16-GPU runs the wrong way.
        The services are summed in name order: a set's order of strings varies with
        ``PYTHONHASHSEED``, and with it the float's last bit."""
        node = self.ctx.state.gpu[name]
        now, load, copies = self.ctx.now, self.load, self.copies()
        total = own_drop(self.ctx, name, cell, action, load, self.widths)
        others = set().union(*(node.resident[g] for g in cell)) - {action.service or ""}
        for other in sorted(others):
            if self.queued(other) == 0:
                continue
            left = copies.get(other, 0) - sum(1 for g in cell if other in node.resident[g])
            need = 1.0 if left <= 0 else min(1.0, load.busy_gpus(other, now) / left)
            if need <= 0.0:
                continue
            width = max(
                len(node.shape[g].get(other, ())) for g in cell if other in node.resident[g]
            )
            total += need * node.spec.restore_s(model_gb(other, load, node), width or 1)
        return total

    def backlog(self) -> Backlog:
        """When each GPU of the pool is next free (now, or its running call's expected end),
        and the queued calls' work (each at its smallest cell) and count."""
        if self._backlog is None:
            ctx = self.ctx
            work = 0.0
            for seen, action in enumerate(ctx.queue(self.domain), 1):
                opts = ctx.options(action)
                work += opts.units[0] * opts.durations[0]
                if seen == _DRAIN_SAMPLE:  # a long queue: its head's mean work for the rest
                    work *= ctx.queue_len(self.domain) / seen
                    break
            self._backlog = Backlog(gpu_free_times(ctx), work, ctx.queue_len(self.domain))
        return self._backlog

    def widest_free(self, action: Action | None = None) -> int:
        """The largest free cell no waiting call holds, over the pool; with ``action``, the
        largest of those whose GPUs hold its model and whose node's host memory holds it (GPU
        nodes of different memory: a wide free cell where the call does not fit does not
        serve it)."""
        model = (
            None
            if action is None
            else (action.service_size_gb, action.service_replicas, action.memory_gb)
        )
        widest = self._widest if model is None else self._widest_for.get(model)
        if widest is None:
            widest = _widest_free_cell(self.ctx, self.reserved, model)
            if model is None:
                self._widest = widest
            else:
                self._widest_for[model] = widest
        return widest

    def options(self, action: Action) -> Options:
        opts = self.ctx.options(action)
        # A call that found no cell holding its service free restores at every size. One that
        # claimed a free copy (``hold``) runs free only on that copy: a sharded copy serves its
        # own cell alone (whole replicas serve any cell within it). Priced free at any resident
        # size up to its claim, a call that claimed a 4-GPU copy was given 2 GPUs by the round
        # when another call had taken the one 2-GPU copy, and placement restored it there.
        claimed = self._claimed.get(action.id, 0)
        if action.id in self._restores:
            sizes: set[int] | frozenset[int] = _NO_SIZES
        elif action.id in self._backfills:
            # Claimed a free copy on GPUs held for a waiting call that it is done before
            # (``hold``): resident there, though ``resident_sizes`` leaves held GPUs out.
            sizes = {claimed}
        elif action.service_replicas:
            sizes = {u for u in self.resident_sizes(action.service or "") if u <= claimed}
        else:
            sizes = {claimed} & self.resident_sizes(action.service or "")
        if sizes.issuperset(opts.units):
            return opts
        if self.ending and sizes:
            # No call to come: it runs on the free copy it claimed. A restore at another size
            # would take GPUs the others' copies serve them on, for one call.
            keep = [i for i, u in enumerate(opts.units) if u in sizes]
            if keep:
                return Options(
                    tuple(opts.units[i] for i in keep),
                    tuple(opts.durations[i] for i in keep),
                    False,
                )
        durations = tuple(
            d if u in sizes else d + self.start_cost(action, u)
            for u, d in zip(opts.units, opts.durations, strict=True)
        )
        return Options(opts.units, durations, False)

    def servers(self, service: str) -> list[_Server]:
        """When each cell holding the service is next free (a heap; free cells: now).

        The pass's calls of the service are queued on these cells in order (``hold``), so a
        burst of calls to one model is seen as a queue on its cells, not as one call each.
        """
        heap = self._servers.get(service)
        if heap is None:
            heap = self._servers[service] = _holding_cells(
                self.ctx, service, self.waits.ready_at(), self._released(service)
            )
        return heap

    def _released(self, service: str) -> dict[tuple[str, int], float]:
        """(node, GPU) -> when the call waiting for it is expected done, where its restore
        (if any) leaves ``service``'s copy there; ``inf`` where it evicts it."""
        ctx, at = self.ctx, {}
        for r in self.waits.by_action.values():
            node = ctx.state.gpu[r.node]
            holder = r.action.service or ""
            opts = ctx.options(r.action)
            size = len(r.cell)
            run = opts.durations[opts.units.index(size)] if size in opts.units else math.inf
            if node.is_resident(holder, r.cell):
                keeps = True
            else:
                run += ctx.restore_cost(r.action, r.node, size)
                if service == holder:
                    # Its restore is a copy of its own cell: a sharded copy of another shape
                    # there serves no longer (``cells.copy_serves``); whole ones do.
                    keeps = r.action.service_replicas or size == 1
                else:
                    keeps = service not in evicted_by(
                        node,
                        r.cell,
                        holder,
                        r.action.service_size_gb,
                        self.load,
                        r.action.service_replicas,
                    )
            done = max(r.ready, ctx.now) + run if keeps else math.inf
            for g in r.cell:
                at[(r.node, g)] = max(at.get((r.node, g), 0.0), done)
        return at

    def hold(self, action: Action) -> str | None:
        """Wait for a cell that holds the service when that is sooner than what a restore
        costs this call (amortised over the calls it serves, with its evictions); each call
        of the pass takes its place in the queue on the service's cells."""
        ctx, service = self.ctx, action.service or ""
        waiting = self.waits.by_action.get(action.id)
        if waiting is not None:
            return f"tangram: waits for the {len(waiting.cell)} GPU cell reserved for it on {waiting.node}"
        opts = ctx.options(action)
        if (
            self.waits.head is None
            and self.widest_free() > 0
            and self.widest_free(action) < opts.units[0]
            and ctx.now - action.arrival >= head_patience(opts.durations[opts.fastest])
        ):
            calls = self.calls(service, opts.units[0])

            def restore(node: str, cell: tuple[int, ...]) -> float:
                cost = ctx.restore_cost(action, node, len(cell))
                return cost + eviction_charge(
                    ctx, node, cell, action, self.load, self.copies(), calls, self.widths
                )

            reason = self.waits.reserve_head(ctx, action, restore)
            if reason is not None:
                self.reserved = self.waits.reserved()
                self._widest = self._resident = None
                self._widest_for.clear()
                # The cells the pass queued calls on: the new reservation's GPUs go to its
                # call (the calls' places on them kept: only their deadlines move).
                ready = self.waits.ready_at()
                for other, heap in self._servers.items():
                    _mark_reserved(heap, ready, self._released(other))
                return reason
        self._seen[service] = self._seen.get(service, 0) + 1
        now, best = ctx.now, None
        for cell in self.servers(service):
            # A sharded copy serves a call on its own cell alone (whole replicas: any cell
            # within it): a call that cannot run at that width would restore there anyway.
            size = cell.size
            if action.service_replicas:
                k = opts.best_within(size)
            else:
                k = opts.units.index(size) if size in opts.units else -1
            if k < 0:
                continue
            end = max(cell.at, now) + opts.durations[k]
            if end > cell.deadline + 1e-9:
                # Its GPUs go to a waiting call before it would be done: after that call,
                # if its restore leaves the copy (``released``), else never.
                end = max(cell.released, now) + opts.durations[k]
            if best is None or end < best[0]:
                best = (end, cell, k)
        # The restore that ends the call soonest (its share of the restore plus the call):
        # ordered by the share alone, a narrow cell's cheaper restore won over a wide cell
        # that ends sooner.
        extra, d_new = min(
            (
                (self.start_cost(action, u), d)
                for u, d in zip(opts.units, opts.durations, strict=True)
            ),
            key=lambda cost: cost[0] + cost[1],
        )
        restore = extra + d_new
        if best is None or best[0] - now > restore:
            self._restores.add(action.id)
            self.servers(service).append(_Server(now + restore, opts.units[-1]))
            return None
        end, cell, k = best
        if end > cell.deadline + 1e-9:  # after the waiting call: the cell is the service's again
            cell.at, cell.deadline = cell.released, math.inf
        at, cell.at = cell.at, end
        if at <= now + 1e-9:
            self._claimed[action.id] = cell.size
            if cell.free and cell.cell is not None:
                self._claimed_at[action.id] = cell.cell
            if cell.deadline < math.inf:
                self._backfills.add(action.id)
            return None
        return (
            f"tangram: waits ~{at - now:.3f}s for a cell holding {service} (then "
            f"{opts.durations[k]:.3f}s) rather than a {extra:.3f}s restore (amortised over the "
            f"calls it serves, evictions charged; {restore:.3f}s with the call)"
        )

    def run(self) -> None:
        ctx, domain = self.ctx, self.domain
        if self.waits.by_action:
            self.waits.serve(ctx)
            self.reserved = self.waits.reserved()
        free = ctx.state.free_gpus
        if free <= 0 or not ctx.queue_len(domain):
            return
        rnd = elastic_round(
            OrderedQueue(ctx, domain, robust_order(ctx, {})),  # type: ignore[arg-type]
            domain,
            free,
            window=self.rule.tuning.window or free,
            depth=self.rule.depth,
            options_of=self.options,
            hold=self.hold,
        )
        if rnd is None:
            return
        self._to_place = {action.id for action in rnd.kept}
        order = sorted(range(len(rnd.kept)), key=lambda i: (-rnd.units[i], i))
        # The call that outlasts the others is placed last (its cell kept for it meanwhile):
        # whether it waits for a larger cell (``CellWaits.consider``) depends on the cells the
        # running calls free, and placed in its turn it saw none of the pass's other calls
        # running (random GPU seed 101: an 852-s call given 2 of 10 GPUs in a synchronised
        # burst of 1-5 s calls ran 533 s, not 377 s on the 4-GPU cell they freed in 4 s).
        # The cell is the one it would take in its turn, so the others' cells stay theirs.
        last = self._outlasting(rnd, order)
        for i in order:
            if i == last:
                spot = self._spot(rnd.kept[i], rnd.units[i])
                if spot is not None:
                    self._kept = {spot[0]: set(spot[1])}
                    continue
                last = None
            self._place(rnd.kept[i], rnd.units[i], rnd.method)
        if last is not None:
            self._kept = None
            self._place(rnd.kept[last], rnd.units[last], rnd.method)
        defer_evicted(ctx, rnd)

    def _outlasting(self, rnd: Round, order: list[int]) -> int | None:
        """The kept call the round gave less than its fastest cell that runs more than
        ``OUTLASTS`` times as long as any other kept call (and has not waited yet), if any."""
        if len(order) < 2:
            return None
        ctx = self.ctx
        runs = []
        for i in order:
            opts = ctx.options(rnd.kept[i])
            runs.append((opts.durations[opts.units.index(rnd.units[i])], i, opts))
        runs.sort(key=lambda r: (-r[0], r[1]))
        run, i, opts = runs[0]
        if (
            rnd.units[i] >= opts.units[opts.fastest]
            or rnd.kept[i].id in self.waits.waited
            or run <= OUTLASTS * runs[1][0]
        ):
            return None
        return i

    def _spot(self, action: Action, units: int) -> tuple[str, tuple[int, ...]] | None:
        """Where ``_place`` would start ``action`` (given ``units``), before any wait."""
        opts = self.ctx.options(action)
        for size in reversed(opts.units[: opts.units.index(units) + 1]):
            spot = self._cell(action, opts, size)
            if spot is not None:
                return spot[0], spot[1]
        return None

    def _cell(
        self, action: Action, opts: Options, size: int
    ) -> tuple[str, tuple[int, ...], float] | None:
        """The free cell of ``size`` to start ``action`` on (``place_charged``), the GPUs
        held for waiting calls (``reserved``), for the call placed last (``_kept``) and the
        free copies other calls of the pass claimed (``hold``) out; where only a claimed
        copy's GPUs leave a cell of ``size``, the cell is taken (the round counted GPUs, not
        cells: the call is not narrowed for another's claim)."""
        spot = self._cell_held(action, opts, size, claims=True)
        if spot is None and self._claimed_at:
            spot = self._cell_held(action, opts, size, claims=False)
        return spot

    def _cell_held(
        self, action: Action, opts: Options, size: int, claims: bool
    ) -> tuple[str, tuple[int, ...], float] | None:
        ctx = self.ctx
        reserved, backfill = self.reserved, None
        # Held for a call that starts this pass: the cell kept for the call placed last, and
        # the free copy each call still to place claimed in ``hold``, which the round priced
        # free. Placed over it, a wider call of the same service dropped it (a copy of another
        # shape goes) and the claimant restored (``tests/mechanisms/gpu/claimed_copy_kept``:
        # a 0.5-s call restored a 1-GPU copy, 0.658 s; random GPU seed 3000 at t = 0, a
        # 0.44-s call 1.23 s).
        held = dict(self._kept or {})
        for aid, (n, gpus) in self._claimed_at.items() if claims else ():
            if aid == action.id or aid not in self._to_place:
                continue
            if ctx.state.gpu[n].is_resident(action.service or "", gpus) and len(gpus) == size:
                continue  # (it would run there on the copy: the two calls trade places)
            held[n] = held.get(n, set()) | set(gpus)
        if held:
            reserved = {n: set(g) for n, g in self.reserved.items()}
            for n, gpus in held.items():
                reserved.setdefault(n, set()).update(gpus)
        if reserved:
            k = opts.units.index(size)
            # (``place_charged`` adds the restore on a cell that does not hold the service:
            # counted everywhere, a call whose copy sat on a reserved GPU was kept off it by
            # a restore it would not do; ``tests/mechanisms/gpu/backfill_on_resident_copy``.)
            done = ctx.now + opts.durations[k]
            ready = self.waits.ready_at()
            if held:  # no backfill there: its call starts this pass
                ready = dict(ready)
                for n, gpus in held.items():
                    ready.update({(n, g): -math.inf for g in gpus})
            backfill = (ready, done)
        return place_charged(
            ctx,
            size,
            action,
            self.load,
            self.copies(),
            reserved,
            backfill,
            self.calls(action.service or "", size),
            self.widths,
        )

    def _place(self, action: Action, units: int, method: str) -> None:
        ctx, service = self.ctx, action.service or ""
        self._to_place.discard(action.id)
        opts = ctx.options(action)
        for size in reversed(opts.units[: opts.units.index(units) + 1]):
            spot = self._cell(action, opts, size)
            if spot is None:
                continue
            node, cell, charge = spot
            restored = not ctx.state.gpu[node].is_resident(service, cell)
            wait = self.waits.consider(
                ctx, action, node, size, restored, self.backlog,
                lambda name, cell: self.displaced(action, name, cell),
            )  # fmt: skip
            if wait is not None:
                self.reserved = self.waits.reserved()
                ctx.defer(action, wait)
                return
            how = (
                f"restore amortised over {self.calls(service, size):.1f} calls, eviction charge "
                f"{charge:.3f}s"
                if restored
                else "resident"
            )
            ctx.start(
                action,
                node,
                size,
                f"tangram: {size} GPU cell on {node} ({how}; {method} gave {units}; "
                "short-first order across services)",
                gpus=cell,
            )
            self.load.started(service, ctx.now, restored)
            self._copies = self._widths = None
            self._charge.clear()
            return
        ctx.defer(action, "tangram: no aligned free cell of its smallest size after placement")


def _widest_free_cell(
    ctx: Context,
    reserved: dict[str, set[int]] | None = None,
    model: tuple[float, bool, float] | None = None,
) -> int:
    """The largest free aligned cell over the pool (0 when every GPU is busy); none of whose
    GPUs is ``reserved``; with ``model`` (size in GB, whole replicas, the call's host memory
    in GB), whose GPUs hold it on a node whose host memory holds the call."""
    widest = 0
    for name, node in ctx.state.gpu.items():
        if model is not None and not host_holds(model[2], node.spec):
            continue  # (no cell of this node can run the call)
        held = reserved.get(name) if reserved else None
        for size in reversed(cell_sizes(node.spec.gpus)):
            if size <= widest:
                break
            if model is not None and not holds(
                model[0], node.spec.gpu_memory_gb, size, replicas=model[1]
            ):
                break  # (a narrower cell of this node holds less)
            if any(not held or not held.intersection(c) for c in node.free_cells(size)):
                widest = size
                break
    return widest


def _resident_free_sizes(ctx: Context) -> dict[str, set[int]]:
    """For each service, the cell sizes at which a free cell already holds it.

    One sweep over every free aligned cell (at most 15 per 8-GPU node) for all services, rather
    than one per service asked about: a pass over nine teachers asked nine times.
    """
    return _resident_sizes(ctx, free_only=True)


def _resident_sizes(
    ctx: Context, *, free_only: bool, reserved: dict[str, set[int]] | None = None
) -> dict[str, set[int]]:
    """For each service, the cell sizes at which a (free, unreserved) aligned cell holds it."""
    sizes: dict[str, set[int]] = {}
    for name, node in ctx.state.gpu.items():
        resident = node.resident
        held = reserved.get(name) if reserved else None
        for size in cell_sizes(node.spec.gpus):
            cells = node.free_cells(size) if free_only else aligned_cells(node.spec.gpus, size)
            for cell in cells:
                if held and held.intersection(cell):
                    continue
                for service in set.intersection(*(resident[g] for g in cell)):
                    if node.is_resident(service, cell):
                        sizes.setdefault(service, set()).add(size)
    return sizes


@dataclass(slots=True)
class _Server:
    """A cell holding a service, as ``hold`` queues the pass's calls on it: when it is next
    free, its size, its node and GPUs (None: a restore ``hold`` queued), whether it was free
    when the pass began, by when a call on it must be done (its GPUs reserved for a waiting
    call then; else ``inf``) and when that call is done with it where its restore leaves the
    copy (``inf`` where it evicts it)."""

    at: float
    size: int
    cell: tuple[str, tuple[int, ...]] | None = None
    free: bool = False
    deadline: float = math.inf
    released: float = 0.0


def _holding_cells(
    ctx: Context,
    service: str,
    ready: dict[tuple[str, int], float] | None = None,
    after: dict[tuple[str, int], float] | None = None,
) -> list[_Server]:
    """Each cell holding ``service``: free cells (now), largest first and not overlapping,
    and the cells running actions hold with it resident.

    A cell whose GPUs are reserved for a waiting call (``ready``: when each such GPU is
    expected by its call) goes to that call: another call may use it only if done by then,
    as placement backfills it (``place_charged``), or once that call is done with it where
    its restore leaves the copy (``after``); see ``_mark_reserved``. Others: by ``inf``.
    """
    now, cells = ctx.now, []
    for name, node in ctx.state.gpu.items():
        taken: set[int] = set()
        for size in reversed(cell_sizes(node.spec.gpus)):
            for cell in node.free_cells(size):
                if not taken.intersection(cell) and node.is_resident(service, cell):
                    taken.update(cell)
                    cells.append(_Server(now, size, (name, tuple(cell)), free=True))
    for running in ctx.running_in(GPU_DOMAIN):
        start = running.start
        if start.in_slot or not start.gpus:
            continue
        if ctx.state.gpu[start.node].is_resident(service, start.gpus):
            cells.append(
                _Server(max(now, running.est_finish), len(start.gpus), (start.node, start.gpus))
            )
    _mark_reserved(cells, ready or {}, after or {})
    return cells


def _mark_reserved(
    cells: list[_Server],
    ready: dict[tuple[str, int], float],
    after: dict[tuple[str, int], float],
) -> None:
    """Set each cell's ``deadline`` (when the first of its GPUs is expected by a waiting
    call) and ``released`` (when that call is done with it, where it leaves the copy)."""
    for c in cells:
        if c.cell is None:
            continue
        name, gpus = c.cell
        c.deadline = min(
            c.deadline, min((ready.get((name, g), math.inf) for g in gpus), default=math.inf)
        )
        c.released = max(c.released, max((after.get((name, g), 0.0) for g in gpus), default=0.0))


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
            if not node.is_resident(service, start.gpus):
                continue
            until[service] = min(until.get(service, running.est_finish), running.est_finish)
    return until


def _first_restore_cost(ctx: Context) -> Callable[[Action, int], float]:
    spec = next(iter(ctx.state.gpu.values())).spec
    return lambda action, cell_size: spec.restore_s(
        action.service_size_gb, cell_size, replicas=action.service_replicas
    )
