"""What a GPU start costs beyond its call under the default ``tangram`` policy (issue 11).

The pieces the GPU rule (``elastic_gpu``) uses when ``ElasticTuning.gpu_robust`` is on:

- ``ServiceLoad``: each service's recent calls (arrivals counted with an exponential decay over
  ``HORIZON_S``, on the pass's clock ``ctx.now``), its model size, when it was last called and
  last restored. ``expected_calls`` is the calls a restore is amortised over: the service's
  queued calls plus those it is expected to receive over the horizon at its recent rate.
- ``eviction_charge``: what restoring a service onto a cell costs the services it evicts: for
  each one that would lose its only copy, its restore time weighted by how likely it is to be
  called again soon (its recent calls, at most 1); for one with copies elsewhere, that times
  how busy its load keeps the copies left (``ServiceLoad.busy_gpus``: a spare copy is free to
  evict, a needed one is not: two services on a small pool no longer take each other's GPUs
  in turn); doubled while it was restored recently and is at least as popular as the
  newcomer (hysteresis: no ping-pong between two services); plus, on a cell that holds other
  services while calls are queued, the restore's GPU time (each GPU-second delays each queued
  call by 1/pool s), shared by the calls it serves: under load restores thrash, so calls
  queue on the copies that exist (an empty cell costs nobody: a first copy there is free).
- ``own_drop``: what a restore costs the service's own calls when it drops the service's copy
  of a narrower shape on the cell (the share of its calls that copy served and the new one
  cannot, times that copy's restore, unless a copy as narrow is left): no widening over the
  1-GPU copy that narrow calls then restore back.
- ``robust_order``: the GPU queue merged from the per-service queues, earliest
  ``arrival + min(AGING x expected duration, AGING_CAP_S)`` first: in a burst short calls
  pass long ones, and no call is passed by one that arrived more than ``AGING`` times its
  expected duration (at most ``AGING_CAP_S``) after it: no starvation. Equal keys (a burst
  of calls whose aging saturates at the cap) go in arrival order across services.

Estimates only: the core does not know the executor's memory accounting, so a resident
service's footprint on a GPU is its size over the cell its copy was restored as
(``GpuNodeState.shape``), and the executor's eviction order (least recently used) is taken
from the calls seen.
"""

from __future__ import annotations

import heapq
import math
from collections.abc import Callable, Iterator

from tangram.core.action import Action
from tangram.core.backlog import GPU_DOMAIN
from tangram.core.context import Context
from tangram.core.gpu_placement import runs_on
from tangram.core.resources import ResourceKind
from tangram.core.state import GpuNodeState

#: Wider than any cell: the reach of a call to a service of whole replicas (``share_at``).
MAX_CELL = 1 << 30
#: Seconds over which recent calls are counted, and over which a restore is amortised.
HORIZON_S = 60.0
#: At most this many calls share one restore (a cell may be evicted before more arrive).
MAX_AMORTISED_CALLS = 32.0
#: Restores are amortised over expected future calls only while every service seen fits in
#: this share of the pool's GPU memory (beyond it, copies evict each other).
ROOM_SHARE = 0.5
#: A call that has waited this many times its expected duration is passed by no later arrival.
AGING = 4.0
#: ... and no call is passed by one that arrived more than this many seconds after it.
AGING_CAP_S = 2.0
#: The shortest window a service's load is read over (``ServiceLoad.busy_gpus``).
MIN_WINDOW_S = 10.0
#: A service restored this recently keeps its cell unless evicting it saves twice its restore.
RECENT_RESTORE_S = 30.0


class ServiceLoad:
    """Per-service calls seen by the GPU rule: decayed counts, sizes, last call and restore."""

    __slots__ = (
        "count", "seen_at", "size_gb", "last_call", "restored_at", "work", "first_seen", "reach",
    )  # fmt: skip

    def __init__(self) -> None:
        self.count: dict[str, float] = {}
        #: Decayed GPU-seconds of the calls seen (each at its smallest cell), as ``count``.
        self.work: dict[str, float] = {}
        self.first_seen: dict[str, float] = {}
        self.seen_at: dict[str, float] = {}
        self.size_gb: dict[str, float] = {}
        self.last_call: dict[str, float] = {}
        self.restored_at: dict[str, float] = {}
        #: Decayed calls per service by the widest cell they may use (as ``count``): a copy
        #: restored as a cell of k GPUs serves only the calls that may run on k.
        self.reach: dict[str, dict[int, float]] = {}

    def observe(self, ctx: Context) -> None:
        """Count the pass's GPU arrivals (each call of a service adds one, decaying)."""
        now = ctx.now
        for action in ctx.arrived:
            if action.resource is not ResourceKind.GPU:
                continue
            service = action.service or ""
            opts = ctx.options(action)
            decay = self._decay(service, now)
            self.count[service] = self.count.get(service, 0.0) * decay + 1.0
            self.work[service] = (
                self.work.get(service, 0.0) * decay + opts.units[0] * opts.durations[0]
            )
            # Whole replicas serve every cell made of them: such a call reaches any size.
            widest = MAX_CELL if action.service_replicas else opts.units[-1]
            reach = {u: n * decay for u, n in self.reach.get(service, {}).items()}
            reach[widest] = reach.get(widest, 0.0) + 1.0
            self.reach[service] = reach
            self.first_seen.setdefault(service, now)
            self.seen_at[service] = now
            self.size_gb[service] = action.service_size_gb
            self.last_call[service] = now

    def _decay(self, service: str, now: float) -> float:
        seen = self.seen_at.get(service)
        return 1.0 if seen is None else math.exp(-(now - seen) / HORIZON_S)

    def recent(self, service: str, now: float) -> float:
        """Calls of ``service`` over about the last ``HORIZON_S`` (exponentially decayed)."""
        count = self.count.get(service)
        if count is None:
            return 0.0
        return count * self._decay(service, now)

    def share_at(self, service: str, size: int) -> float:
        """The share of the service's recent calls that may run on a cell of ``size`` GPUs
        (1.0 before any is seen): a copy of that shape serves only those."""
        reach = self.reach.get(service)
        if not reach:
            return 1.0
        return sum(n for u, n in reach.items() if u >= size) / sum(reach.values())

    def busy_gpus(self, service: str, now: float) -> float:
        """GPUs the service's calls keep busy on average: its decayed GPU-seconds over the
        window they were counted in (``HORIZON_S``, or less since its first call, at least
        ``MIN_WINDOW_S``, so a burst at the start reads as a burst, not as a rate)."""
        work = self.work.get(service)
        if work is None:
            return 0.0
        age = max(MIN_WINDOW_S, now - self.first_seen[service])
        window = HORIZON_S * (1.0 - math.exp(-age / HORIZON_S))
        return work * self._decay(service, now) / window

    def expected_calls(self, service: str, now: float, queued: int, pool_gb: float) -> float:
        """Calls one restore of ``service`` serves: queued ones, plus the recent rate's over
        the horizon when the pool's memory holds every service seen with room to spare (else
        the new copy is likely evicted before those calls come: only the queued count)."""
        if sum(self.size_gb.values()) > ROOM_SHARE * pool_gb:
            return max(1.0, float(queued))
        return min(MAX_AMORTISED_CALLS, max(1.0, queued + self.recent(service, now)))

    def started(self, service: str, now: float, restored: bool) -> None:
        self.last_call[service] = now
        if restored:
            self.restored_at[service] = now


def _block(node: GpuNodeState, gpu: int, service: str) -> int:
    """GPUs of the cell ``service``'s copy on ``gpu`` was restored as (its shard there is
    1/that of the model; 1 when not resident)."""
    held = node.shape[gpu].get(service)
    return 1 if held is None else len(held)


def model_gb(service: str, load: ServiceLoad, node: GpuNodeState) -> float:
    """A service's model size: from its calls, else from the executor's report of a copy on
    ``node`` (a copy resident before its first call), else 0 (unknown)."""
    size = load.size_gb.get(service)
    return node.size_gb.get(service, 0.0) if size is None else size


def evicted_by(
    node: GpuNodeState,
    cell: tuple[int, ...],
    service: str,
    size_gb: float,
    load: ServiceLoad,
    replicas: bool = False,
) -> dict[str, int]:
    """Services a restore of ``service`` onto ``cell`` would evict, each with the cell size it
    was resident as (least recently called first, on each GPU until the newcomer's shard, or
    whole replica, fits; a service whose size neither a call nor the executor's report gave
    counts as taking no memory)."""
    shard = size_gb if replicas else size_gb / len(cell)
    capacity = node.spec.gpu_memory_gb
    victims: dict[str, int] = {}
    for g in cell:
        others = [t for t in node.resident[g] if t != service]
        if not others:
            continue
        blocks = {t: _block(node, g, t) for t in others}
        used = {t: model_gb(t, load, node) / blocks[t] for t in others}
        total = sum(used.values())
        for t in sorted(others, key=lambda t: (load.last_call.get(t, -math.inf), t)):
            if total + shard <= capacity + 1e-9:
                break
            total -= used[t]
            victims.setdefault(t, blocks[t])
    return victims


def eviction_charge(
    ctx: Context,
    node_name: str,
    cell: tuple[int, ...],
    action: Action,
    load: ServiceLoad,
    copies: dict[str, int],
    calls: float = 1.0,
    widths: Callable[[], dict[str, list[int]]] | None = None,
) -> float:
    """Expected restore seconds the evictions of a restore onto ``cell`` cost later, and
    what its GPU time costs the queued calls (``_crowding``, shared by the ``calls`` it
    serves), and the service's own copy it drops (``own_drop``).

    ``copies``: GPUs holding each service across the pool; a victim with a copy outside the
    cell costs nothing (its calls go to that copy). ``widths``: ``copy_widths`` of the pass,
    asked only when needed (None: ``own_drop`` scans the pool itself).
    """
    node = ctx.state.gpu[node_name]
    service = action.service or ""
    charge = _crowding(ctx, node, cell, service, action) / calls + own_drop(
        ctx, node_name, cell, action, load, widths
    )
    victims = evicted_by(node, cell, service, action.service_size_gb, load, action.service_replicas)
    if not victims:
        return charge
    now = ctx.now
    mine = load.recent(service, now)
    for t, k in victims.items():
        inside = max(k, sum(1 for g in cell if t in node.resident[g]))
        left = copies.get(t, 0) - inside
        recent = load.recent(t, now)
        # A victim with copies elsewhere loses capacity, not its model: charged in proportion
        # to how busy its load would keep the copies left (an idle spare copy costs nothing).
        need = 1.0 if left <= 0 else min(1.0, load.busy_gpus(t, now) / left)
        if t not in load.count:
            # Never called yet (resident from before the run, or placed by an operator): a
            # copy is placed for calls to come, so its loss is charged as a service's about
            # to be called is, not as an idle one's (random GPU family, 200 instances per
            # seed set: mean ACT / step beaten >5% at sets 0-3000 10 / 15.5 / 14.5 / 15 and
            # 14 / 10.5 / 10.5 / 11.5% -> 10 / 15.5 / 14.5 / 14 and 14 / 10 / 11 / 11%).
            recent = 1.0
        if need <= 0.0:
            continue
        cost = need * min(1.0, recent) * node.spec.restore_s(model_gb(t, load, node), k)
        if now - load.restored_at.get(t, -math.inf) < RECENT_RESTORE_S and recent >= mine:
            cost *= 2.0
        charge += cost
    return charge


def own_drop(
    ctx: Context,
    node_name: str,
    cell: tuple[int, ...],
    action: Action,
    load: ServiceLoad,
    widths: Callable[[], dict[str, list[int]]] | None = None,
) -> float:
    """Restore seconds a restore of the action's service onto ``cell`` costs its own calls by
    dropping its copy of a narrower shape there: the share of its calls that copy served and
    the new one cannot (``share_at``) x that copy's restore x how much it needs the copy (1
    with none as narrow left; else its busy GPUs over the copies left, each counted as wide
    as the dropped one) x its recent calls (at most 1). (Random GPU family: a 4-GPU restore
    over a service's 1-GPU copy, then a 1-GPU call restoring it back.)
    ``widths``: ``copy_widths`` of the pass, asked only when needed (None: the pool is scanned
    here, per call: placement asks once per free cell, so a pass scanned every GPU of the
    pool once per cell)."""
    if action.service_replicas:
        return 0.0
    node = ctx.state.gpu[node_name]
    service = action.service or ""
    dropped = {node.shape[g][service] for g in cell if service in node.resident[g]} - {cell}
    if not dropped or node.is_resident(service, cell):
        return 0.0  # (1-GPU copies on each of its GPUs serve the cell: no restore, no drop)
    now, width = ctx.now, len(cell)
    total = 0.0
    mine: list[int] | None = None
    # One charge per width dropped, as one per service evicted (``eviction_charge``): the
    # calls that lose a copy of that width restore one back.
    for k in sorted({len(shape) for shape in dropped}):
        lost = load.share_at(service, k) - load.share_at(service, width)
        if lost <= 0.0:
            continue
        if mine is None and widths is not None:
            mine = widths().get(service, [])
        elif mine is None:
            mine = [
                len(held) for other in ctx.state.gpu.values() for held in _shapes(other, service)
            ]
        # Its copies as narrow, but those the restore drops (all on this node, all its own).
        left = sum(1 for w in mine if w <= k) - sum(1 for held in dropped if len(held) <= k)
        need = 1.0 if left == 0 else min(1.0, load.busy_gpus(service, now) / (left * k))
        recent = min(1.0, load.recent(service, now))
        total += need * lost * recent * node.spec.restore_s(model_gb(service, load, node), k)
    return total


def copy_widths(ctx: Context) -> dict[str, list[int]]:
    """For each service, the width of each of its copies in the pool (each cell it was
    restored as, once per node: ``own_drop``'s copies left, counted once per pass)."""
    widths: dict[str, list[int]] = {}
    for node in ctx.state.gpu.values():
        shapes: set[tuple[str, tuple[int, ...]]] = set()
        for g in range(node.spec.gpus):
            held = node.shape[g]
            shapes.update((service, held[service]) for service in node.resident[g])
        for service, shape in shapes:
            widths.setdefault(service, []).append(len(shape))
    return widths


def _shapes(node: GpuNodeState, service: str) -> set[tuple[int, ...]]:
    """The cells ``service``'s copies on ``node`` were restored as."""
    return {node.shape[g][service] for g in range(node.spec.gpus) if service in node.resident[g]}


def _crowding(
    ctx: Context, node: GpuNodeState, cell: tuple[int, ...], service: str, action: Action
) -> float:
    """What the restore's GPU time costs the queued calls of the services already on the cell
    (they could have run there meanwhile; each GPU-second delays each of them 1/pool s)."""
    others = set().union(*(node.resident[g] for g in cell)) - {service}
    if not others:
        return 0.0
    queued = max(0, ctx.queue_len(GPU_DOMAIN) - 1)
    if not queued:
        return 0.0
    pool = sum(n.spec.gpus for n in ctx.state.gpu.values())
    restore = node.spec.restore_s(
        action.service_size_gb, len(cell), replicas=action.service_replicas
    )
    return restore * len(cell) * queued / pool


def _buddy_free(node: GpuNodeState, cell: tuple[int, ...]) -> int:
    """Free GPUs in the aligned block twice the cell's size around it, outside the cell: a
    small call placed where its buddy is busy leaves the larger free blocks whole (the buddy
    allocator's rule), so a wide call later finds its cell."""
    size = len(cell)
    if 2 * size > node.spec.gpus:
        return 0
    start = cell[0] - cell[0] % (2 * size)
    return sum(1 for g in range(start, start + 2 * size) if g not in cell and node.owner[g] is None)


def place_charged(
    ctx: Context,
    size: int,
    action: Action,
    load: ServiceLoad,
    copies: dict[str, int],
    reserved: dict[str, set[int]] | None = None,
    backfill: tuple[dict[tuple[str, int], float], float] | None = None,
    calls: float = 1.0,
    widths: Callable[[], dict[str, list[int]]] | None = None,
) -> tuple[str, tuple[int, ...], float] | None:
    """The free aligned cell of ``size`` GPUs to start ``action`` on, and its eviction charge.

    A cell that holds the service first (no restore); otherwise the least eviction charge,
    then fewest other services; then a cell whose buddy block is busy (``_buddy_free``), then
    ``gpu_placement``'s order (best fit, node and cell order).
    ``reserved``: GPUs held for calls waiting for them (``gpu_waits``), per node: not used,
    unless ``backfill`` = (when each held GPU is expected by its call, when this call would
    be done on a cell that holds its service) says it is done by then, with the restore on a
    cell that does not.
    """
    service = action.service or ""
    best: tuple[tuple[float, ...], str, tuple[int, ...], float] | None = None
    for order, (name, node) in enumerate(ctx.state.gpu.items()):
        free = node.free_gpus
        if size > node.spec.gpus or free < size:
            continue
        if not runs_on(action, node.spec, size):  # (its GPUs and host memory hold the call)
            continue
        held = reserved.get(name) if reserved else None
        for cell in node.free_cells(size):
            if held and held.intersection(cell):
                if backfill is None:
                    continue
                at, done = backfill
                if not node.is_resident(service, cell):
                    # (A copy of the service there starts the call at once: its restore
                    # counts only where there is none.)
                    done += node.spec.restore_s(
                        action.service_size_gb, size, replicas=action.service_replicas
                    )
                if any(done > at.get((name, g), math.inf) + 1e-9 for g in cell if g in held):
                    continue
            loose = _buddy_free(node, cell)
            if node.is_resident(service, cell):
                key: tuple[float, ...] = (0, 0.0, 0, loose, free, order, cell[0])
                charge = 0.0
            else:
                charge = eviction_charge(ctx, name, cell, action, load, copies, calls, widths)
                others = len(set().union(*(node.resident[g] for g in cell)) - {service})
                key = (1, charge, others, loose, free, order, cell[0])
            if best is None or key < best[0]:
                best = (key, name, cell, charge)
    return None if best is None else (best[1], best[2], best[3])


def resident_gb(ctx: Context, load: ServiceLoad) -> float:
    """GPU memory the pool's resident services take (each copy's shard on each of its GPUs;
    a service whose size was never seen counts as taking none)."""
    used = 0.0
    size = load.size_gb
    for node in ctx.state.gpu.values():
        for g, resident in enumerate(node.resident):
            for service in resident:
                used += size.get(service, 0.0) / _block(node, g, service)
    return used


def resident_copies(ctx: Context) -> dict[str, int]:
    """For each service, how many GPUs of the pool hold it."""
    copies: dict[str, int] = {}
    for node in ctx.state.gpu.values():
        for resident in node.resident:
            for service in resident:
                copies[service] = copies.get(service, 0) + 1
    return copies


def robust_order(ctx: Context, expected: dict[str, float]) -> Iterator[Action]:
    """The queued GPU calls, the per-service queues merged by ``arrival + AGING x duration``.

    Within a service the order stays FCFS; across services the head with the earliest key goes
    next, equal keys in the GPU queue's arrival order. Why not by service: in a burst every
    call longer than ``AGING_CAP_S / AGING`` gets the same key, and the service listed first
    would take the whole pool before any other's call (random GPU instance 41: eleven calls to
    a 72B model, then fifteen to a 15B one). ``expected`` caches each action's fastest
    duration for the pass. The robust pass runs on at most ``OVERLOADED`` calls per GPU, so
    numbering the queue once per pass stays cheap.
    """
    position = {action.id: n for n, action in enumerate(ctx.queue(GPU_DOMAIN))}
    heads: list[tuple[float, int, Action, Iterator[Action]]] = []

    def key(action: Action) -> float:
        d = expected.get(action.id)
        if d is None:
            opts = ctx.options(action)
            d = expected[action.id] = opts.durations[opts.fastest]
        return action.arrival + min(AGING * d, AGING_CAP_S)

    for service in ctx.services_waiting():
        it = ctx.queued_of_service(service)
        head = next(it, None)
        if head is not None:
            heads.append((key(head), position[head.id], head, it))
    heapq.heapify(heads)
    while heads:
        _, _, action, it = heads[0]
        nxt = next(it, None)
        if nxt is None:
            heapq.heappop(heads)
        else:
            heapq.heapreplace(heads, (key(nxt), position[nxt.id], nxt, it))
        yield action
