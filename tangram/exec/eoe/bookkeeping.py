"""The records of the manager's books: a registered service, a replica, what a call holds, and
the counters behind ``stats()`` (the ``Ledger`` keeps them; the manager guards them).
"""

from __future__ import annotations

import threading
import time
from collections import Counter
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from tangram.exec.eoe.cells import Cell
from tangram.exec.eoe.errors import EoeError, QueueTimeoutError
from tangram.exec.eoe.records import CallOutcome, DeviceStats, EoeStats, ServiceInfo

if TYPE_CHECKING:
    import torch

    from tangram.exec.eoe.backup import HostBackup
    from tangram.exec.eoe.registry import ServiceSpec

#: Longest single wait on the condition; waits re-check their state after it (a safety net:
#: memory used outside the manager can be freed without a notification).
WAIT_S = 0.25


@dataclass(frozen=True)
class Service:
    """A registered service: its spec, its host backup and its figures."""

    spec: ServiceSpec
    backup: HostBackup
    info: ServiceInfo


class Replica:
    """One service's weights on one GPU; a ``plan_room.ReplicaView`` for the planner.

    Created as a placeholder when a restore is planned (``ready`` False, its bytes claimed);
    ``settled`` is set once that restore finished, with ``error`` if it failed.
    """

    __slots__ = (
        "service",
        "gpu",
        "claim",
        "ready",
        "pins",
        "last_used",
        "module",
        "storage",
        "settled",
        "error",
        "engine",
        "engine_bytes",
        "unbooked",
        "dropped",
    )

    def __init__(
        self, service: str, gpu: int, claim: int, *, engine: bool = False, engine_bytes: int = 0
    ) -> None:
        self.service = service
        self.gpu = gpu
        self.claim = claim
        #: An engine's replica: the engine allocates its memory itself (the claim covers it).
        self.engine = engine
        #: The weight bytes an engine's wake-up and sleep move (it has no buffer of ours).
        self.engine_bytes = engine_bytes
        self.ready = False
        self.pins = 0
        self.last_used = 0
        self.module: torch.nn.Module | None = None
        self.storage: torch.Tensor | None = None
        self.settled = threading.Event()
        self.error: EoeError | None = None
        #: Evicted and its bytes unbooked (``Ledger.freed``): freeing it again does nothing.
        self.unbooked = False
        #: Its buffer's bytes, taken as it is evicted, before they are dropped (a second
        #: try at freeing it books those, not the 0 bytes left).
        self.dropped: int | None = None

    @property
    def nbytes(self) -> int:
        """Bytes of its device buffer (0 once dropped)."""
        return 0 if self.storage is None else int(self.storage.numel())

    def moved(self, buffer_bytes: int) -> int:
        """Bytes its restore or eviction moved, given its device buffer's ``buffer_bytes``: an
        engine's weight bytes (its buffer, the engine's own memory, is 0 bytes of ours)."""
        return self.engine_bytes if self.engine else buffer_bytes


@dataclass
class CallState:
    """What one call holds and has done, so that it is released exactly once whatever happens.

    Owned by the call's thread; the manager changes the held parts under its condition.
    """

    service: Service
    #: perf_counter() time after which waiting (for GPUs or memory) fails; None: wait forever.
    deadline: float | None = None
    cell: Cell = ()
    #: The GPUs whose call slot the call holds (``cell`` stays the cell once they are given
    #: back: the outcome reports it).
    slots: Cell = ()
    pinned: list[Replica] = field(default_factory=list)
    workspace_gpus: list[int] = field(default_factory=list)
    restored: list[int] = field(default_factory=list)
    evicted: list[tuple[str, int]] = field(default_factory=list)
    waited_for_restore: bool = False
    queue_s: float = 0.0
    evict_s: float = 0.0
    restore_s: float = 0.0
    exec_s: float = 0.0

    def wait_s(self, what: str) -> float:
        """How long the next wait may last; ``QueueTimeoutError`` once the deadline passed."""
        if self.deadline is None:
            return WAIT_S
        left = self.deadline - time.perf_counter()
        if left <= 0:
            raise QueueTimeoutError(
                f"service {self.service.spec.name!r}: waited longer than its timeout for {what}"
            )
        return min(WAIT_S, left)

    def hit(self, ok: bool) -> bool:
        """True when the call ran on replicas that were all resident: it restored none and
        waited for no one's restore."""
        return bool(self.cell and not self.restored and not self.waited_for_restore and ok)


@dataclass
class Counters:
    """The running totals behind ``stats()``."""

    calls: int = 0
    ok: int = 0
    errors: int = 0
    hits: int = 0
    misses: int = 0
    restores: int = 0
    evictions: int = 0
    bytes_restored: int = 0
    bytes_evicted: int = 0
    restore_s: float = 0.0
    evict_s: float = 0.0
    unverified_evictions: int = 0
    failed_restore_s: float = 0.0
    errors_by_type: Counter[str] = field(default_factory=Counter)

    def count(self, outcome: CallOutcome) -> None:
        """Count one finished call."""
        self.calls += 1
        if outcome.ok:
            self.ok += 1
            self.hits += outcome.hit
            self.misses += not outcome.hit
        else:
            self.errors += 1
            self.errors_by_type[type(outcome.error).__name__] += 1

    def stats(self, devices: tuple[DeviceStats, ...]) -> EoeStats:
        """The totals as the public record, with the devices now."""
        return EoeStats(
            calls=self.calls,
            ok=self.ok,
            errors=self.errors,
            hits=self.hits,
            misses=self.misses,
            restores=self.restores,
            evictions=self.evictions,
            bytes_restored=self.bytes_restored,
            bytes_evicted=self.bytes_evicted,
            restore_s=self.restore_s,
            evict_s=self.evict_s,
            unverified_evictions=self.unverified_evictions,
            failed_restore_s=self.failed_restore_s,
            errors_by_type=dict(self.errors_by_type),
            devices=devices,
        )
