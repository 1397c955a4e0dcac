"""Which replicas leave a GPU so that a call's replica fits, and which replicas it must restore:
least recently used first, never a replica in use, never past a GPU's budget.

Pure: plain data in (the replicas as ``ReplicaView`` records, each GPU's ``GpuMemory``), a plan
out, deterministic; no threads, locks, torch or clock. The manager plans under its condition
and the cell's device locks, then carries the plan out (evict, restore) as it says.
"""

from __future__ import annotations

import enum
import itertools
import numbers
from collections.abc import Iterable, Mapping, Sequence, Sized
from dataclasses import dataclass
from typing import Protocol

from tangram.exec.eoe.cells import Cell
from tangram.exec.eoe.errors import shown

#: Most GPUs an eviction's unsized iterable of ``gpus`` is read for (repeats allowed).
MAX_NAMED = 4096

#: A replica's key: (service, gpu).
Key = tuple[str, int]


class ReplicaView(Protocol):
    """What the planner reads of one service's replica on one GPU."""

    @property
    def service(self) -> str: ...
    @property
    def gpu(self) -> int: ...
    #: Bytes the replica claims on its GPU while it is there.
    @property
    def claim(self) -> int: ...
    #: False while its restore runs.
    @property
    def ready(self) -> bool: ...
    #: Calls using it now; a pinned replica is never evicted.
    @property
    def pins(self) -> int: ...
    #: Tick of its last use (larger is more recent).
    @property
    def last_used(self) -> int: ...


@dataclass(frozen=True)
class ReplicaState:
    """A replica as plain data (a ``ReplicaView``): for snapshots and for the planner's tests."""

    service: str
    gpu: int
    claim: int
    ready: bool = True
    pins: int = 0
    last_used: int = 0


@dataclass(frozen=True)
class GpuMemory:
    """One GPU's memory as the planner sees it, in bytes."""

    budget: int
    #: Claimed by the executor: resident replicas, replicas being evicted, running workspaces.
    claimed: int
    #: Allocated outside the executor (the allocator's figure beyond the executor's buffers).
    foreign: int

    @property
    def room(self) -> int:
        """Bytes free for a new claim now."""
        return self.budget - self.claimed - self.foreign


class Verdict(enum.Enum):
    """What the manager does with a plan."""

    #: Evict what the plan says, then restore: the bytes are there.
    GO = "go"
    #: Wait and plan again: running calls pin what would have to go.
    WAIT = "wait"
    #: Fail the call (``RestoreOutOfMemoryError``): the bytes are held outside the executor.
    NEVER = "never"


@dataclass(frozen=True)
class GpuPlan:
    """How one GPU makes room for ``need`` more bytes, and why."""

    gpu: int
    need: int
    verdict: Verdict
    reason: str
    #: Replicas to evict, least recently used first (empty unless GO).
    evict: tuple[Key, ...] = ()


@dataclass(frozen=True)
class RoomPlan:
    """How a call's cell makes room: GO with what to evict and restore, or the first GPU's
    WAIT or NEVER (the GPUs after it are not planned)."""

    verdict: Verdict
    reason: str
    #: Replicas to evict: the cell's GPUs in order, each one's LRU first.
    evict: tuple[Key, ...] = ()
    #: GPUs of the cell where the service has no replica, in order: restore there.
    restore: tuple[int, ...] = ()
    #: The plan of each GPU planned, in cell order.
    gpus: tuple[GpuPlan, ...] = ()


@dataclass(frozen=True)
class EvictPlan:
    """An explicit eviction: the replicas that leave, or the GPUs where the service is busy."""

    service: str
    #: The GPUs asked for, sorted.
    targets: tuple[int, ...]
    #: Replicas that leave (the service's on ``targets``), in GPU order.
    evict: tuple[Key, ...]
    #: GPUs of ``evict`` where a call uses or restores the replica: then nothing leaves.
    busy: tuple[int, ...]
    reason: str


def lru(replicas: Iterable[ReplicaView], gpu: int) -> list[ReplicaView]:
    """The ready replicas on ``gpu``, least recently used first (the eviction order)."""
    return sorted((r for r in replicas if r.gpu == gpu and r.ready), key=lambda r: r.last_used)


def pin_only(
    service: str, cell: Cell, replicas: Mapping[Key, ReplicaView], workspace_bytes: int
) -> bool:
    """True when a call needs no memory planned: the service has a replica (ready or being
    restored) on every GPU of the cell and the call claims no workspace, so it only pins."""
    return workspace_bytes == 0 and all((service, g) in replicas for g in cell)


def plan_gpu(
    service: str, gpu: int, need: int, replicas: Mapping[Key, ReplicaView], memory: GpuMemory
) -> GpuPlan:
    """How ``gpu`` makes room for ``need`` more bytes of ``service``.

    GO when the room is there, or appears by evicting idle replicas of other services (ready,
    unpinned), least recently used first and no more than needed; WAIT when it can only appear
    once running calls release what they pin; NEVER when even that would not make it.
    """
    if need == 0:
        return GpuPlan(gpu, need, Verdict.GO, "nothing to claim")
    room = memory.room
    if room >= need:
        return GpuPlan(gpu, need, Verdict.GO, f"{room} bytes free")
    idle = [r for r in lru(replicas.values(), gpu) if r.service != service and r.pins == 0]
    victims: list[Key] = []
    for rep in idle:
        victims.append((rep.service, gpu))
        room += rep.claim
        if room >= need:
            return GpuPlan(
                gpu,
                need,
                Verdict.GO,
                f"evicting {len(victims)} idle replicas, least recently used first, frees room",
                tuple(victims),
            )
    # Short even after evicting every idle replica: will other calls free enough later?
    own_rep = replicas.get((service, gpu))
    own = own_rep.claim if own_rep is not None else 0
    held_by_others = memory.claimed - sum(r.claim for r in idle) - own
    if held_by_others > 0 and memory.budget - memory.foreign - own - need >= 0:
        return GpuPlan(
            gpu,
            need,
            Verdict.WAIT,
            f"GPU {gpu}: running calls hold {held_by_others} bytes that {need} more need",
        )
    return GpuPlan(
        gpu,
        need,
        Verdict.NEVER,
        f"service {service!r} needs {need} bytes on GPU {gpu} but cannot get them: budget "
        f"{memory.budget}, claimed by the executor {memory.claimed}, used outside the executor "
        f"{memory.foreign}",
    )


def plan_room(
    service: str,
    cell: Cell,
    replicas: Mapping[Key, ReplicaView],
    memory: Mapping[int, GpuMemory],
    *,
    resident_bytes: int,
    workspace_bytes: int,
) -> RoomPlan:
    """How ``cell`` makes room for a call of ``service``: on each GPU, its workspace plus, where
    it has no replica, ``resident_bytes`` for one to restore. ``memory`` covers the cell."""
    plans: list[GpuPlan] = []
    for g in cell:
        need = workspace_bytes + (0 if (service, g) in replicas else resident_bytes)
        plan = plan_gpu(service, g, need, replicas, memory[g])
        plans.append(plan)
        if plan.verdict is not Verdict.GO:
            return RoomPlan(plan.verdict, plan.reason, gpus=tuple(plans))
    restore = tuple(g for g in cell if (service, g) not in replicas)
    evict = tuple(key for plan in plans for key in plan.evict)
    reason = f"evict {len(evict)}, restore on {len(restore)} of {len(cell)} GPUs"
    return RoomPlan(Verdict.GO, reason, evict, restore, tuple(plans))


def eviction_targets(gpus: Iterable[int] | None, n_gpus: int) -> tuple[int, ...]:
    """The GPUs an explicit eviction names (None: every GPU), sorted; ``ValueError`` for GPUs
    the node does not have, or values that are no GPU indices."""
    if gpus is not None:
        named = None
        if isinstance(gpus, Iterable) and not isinstance(gpus, str):
            # Bounded: gpus=itertools.count() made list() run forever.
            named = list(gpus if isinstance(gpus, Sized) else itertools.islice(gpus, MAX_NAMED + 1))
            if len(named) > MAX_NAMED:
                raise ValueError(
                    f"gpus must name at most {MAX_NAMED} GPUs, got more from {shown(gpus)}"
                )
        odd = (
            [gpus]
            if named is None
            else [g for g in named if isinstance(g, bool) or not isinstance(g, numbers.Integral)]
        )
        if odd:
            raise ValueError(f"gpus must be GPU indices (ints), got {shown(odd[:8])}")
        gpus = [int(g) for g in named]  # type: ignore[union-attr]
    targets = tuple(sorted(set(range(n_gpus) if gpus is None else gpus)))
    bad = [g for g in targets if not 0 <= g < n_gpus]
    if bad:
        raise ValueError(f"GPUs {shown(bad[:8])} do not exist (this executor has {n_gpus})")
    return targets


def plan_evict(
    service: str, targets: Sequence[int], replicas: Mapping[Key, ReplicaView]
) -> EvictPlan:
    """Evicting ``service`` from ``targets``: its replicas there, all or none. ``busy`` names
    the GPUs where a call pins the replica or its restore runs; then nothing leaves."""
    found = [replicas[(service, g)] for g in targets if (service, g) in replicas]
    busy = tuple(r.gpu for r in found if r.pins or not r.ready)
    evict = tuple((service, r.gpu) for r in found)
    reason = (
        f"service {service!r} is in use on GPUs {list(busy)}; it cannot be evicted now"
        if busy
        else f"service {service!r} leaves GPUs {[g for _, g in evict]}"
    )
    return EvictPlan(service, tuple(targets), evict, busy, reason)
