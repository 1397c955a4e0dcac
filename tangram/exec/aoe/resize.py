"""Resizing a running grant: a malleable action's cores grow or shrink while its command runs.

A ``RunningGrant`` lives from an action's grant to its revoke. ``resize`` moves it to a new core
set: the cores it gains are taken in the ledger first (never a core another action holds), the
container's cpuset and quota are written (``CpuControl.resize``: two cgroup writes, or one
``docker update``), and only then are the cores it lost handed back, so no core is ever run on
by two actions. The quota keeps the grant's cores-per-core ratio (a full core per core unless
the caller asked for less).

A weighted grant (``pool`` given: the container runs on the whole pool at a CPU weight, see
``cgroups.py``) resizes the same way in the ledger, but its one write is the weight
(``CpuControl.reweigh``): its cpuset stays the pool, so its new nominal cores must lie in it.

A resize that comes after the action ended (the scheduler may decide one before it hears of
the end) is a no-op reported as ``ended``; one that fails leaves the action running on its old
cores, reported as ``failed`` with the reason. Either way the action itself is untouched.
"""

from __future__ import annotations

import logging
import threading
import time
from dataclasses import dataclass
from typing import TYPE_CHECKING, Literal

from tangram.exec.aoe.errors import AoeError

if TYPE_CHECKING:
    from tangram.exec.aoe.ledger import CoreLedger
    from tangram.exec.aoe.lifecycle import Container

log = logging.getLogger(__name__)

#: ``pending``: the live CPU executor's, for a resize decided before AOE granted the action's
#: first cores (it is applied at the grant).
ResizeStatus = Literal["applied", "unchanged", "ended", "failed", "pending"]


@dataclass(frozen=True)
class ResizeResult:
    """What one resize did: its status, the cores the action runs on now, and its cost."""

    status: ResizeStatus
    #: The cores the action runs on after the call (its old ones when it failed).
    cores: tuple[int, ...]
    #: Seconds of the cgroup (or engine) writes alone, and of the whole call with the ledger.
    write_s: float = 0.0
    total_s: float = 0.0
    #: Why it failed (``failed``) or was not applied (``ended``).
    error: str | None = None


class RunningGrant:
    """One action's grant while its command runs; thread-safe (resizes come from any thread)."""

    def __init__(
        self,
        container: Container,
        ledger: CoreLedger,
        action_id: str,
        cores: tuple[int, ...],
        quota: float,
        pool: tuple[int, ...] | None = None,
        *,
        ledger_key: str | None = None,
    ) -> None:
        self.container = container
        self.ledger = ledger
        self.action_id = action_id
        #: What the ledger knows the action by (``execution.ledger_key``; its id by default).
        self.ledger_key = action_id if ledger_key is None else ledger_key
        self.cores = cores
        #: Quota per granted core (1.0 unless the action asked for a fraction).
        self.quota_per_core = quota / len(cores)
        #: The cores a weighted grant runs on (its cpuset, at a weight of ``quota`` cores);
        #: None: an exclusive grant (cpuset = ``cores``, CFS quota = ``quota``).
        self.pool = pool
        self.resizes = 0
        #: Cores outside ``cores`` the container may still run on: a failed grow whose write
        #: back failed too left its cpuset unknown, so they stay the action's in the ledger
        #: (freed, another action was granted them) until a later resize is written.
        self._stray: set[int] = set()
        self._lock = threading.Lock()
        self._ended = False

    @property
    def quota(self) -> float:
        return self.quota_per_core * len(self.cores)

    @property
    def weighted(self) -> bool:
        return self.pool is not None

    def _write(self, cores: tuple[int, ...]) -> None:
        """The container's grant for ``cores``: the weight alone when weighted (one write),
        else the cpuset and the quota."""
        control = self.container.control
        if self.pool is not None:
            control.reweigh(self.quota_per_core * len(cores))
        else:
            control.resize(cores, self.quota_per_core * len(cores))

    def _undo(self, old: tuple[int, ...], added: tuple[int, ...]) -> None:
        """After a failed write: the grant written back to ``old`` and the ``added`` cores
        given back; when the write back fails too (the cpuset may hold them), they stay the
        action's (``_stray``), never granted to another action while it may run there."""
        try:
            self._write(old)  # (cpuset written, quota not?)
        except (AoeError, OSError) as exc:
            log.warning("resize of %s: the write back failed too: %s", self.action_id, exc)
            self._stray.update(added)
            return
        self.ledger.give_back(self.ledger_key, added)

    def end(self) -> None:
        """The command ended: later resizes are no-ops (call before the container is parked,
        so no resize writes a grant into a parked container)."""
        with self._lock:
            self._ended = True

    def resize(self, cores: tuple[int, ...]) -> ResizeResult:
        """Run on ``cores`` (the whole new set, host ids) from now on."""
        t0 = time.perf_counter()
        ledger = self.ledger
        with self._lock:
            if self._ended:
                return ResizeResult("ended", self.cores, error="the action has ended")
            try:
                new = tuple(sorted(cores))
            except TypeError:  # None, a number, a list of mixed types: no core list
                return ResizeResult(
                    "failed",
                    self.cores,
                    total_s=time.perf_counter() - t0,
                    error=f"cores must be a list of core ids, got {cores!r}",
                )
            if new == self.cores:
                return ResizeResult("unchanged", new, total_s=time.perf_counter() - t0)
            old = self.cores
            if self.pool is not None and not set(new) <= set(self.pool):
                outside = sorted(set(new) - set(self.pool))
                return ResizeResult(
                    "failed",
                    old,
                    total_s=time.perf_counter() - t0,
                    error=f"cores {outside} are outside the weighted grant's pool",
                )
            try:
                added = ledger.take(self.ledger_key, new)
            except AoeError as exc:
                return ResizeResult("failed", old, total_s=time.perf_counter() - t0, error=str(exc))
            t_write = time.perf_counter()
            try:
                self._write(new)
            # (CgroupGone included: the container died under it; OSError: a file's open)
            except (AoeError, OSError) as exc:
                self._undo(old, added)
                return ResizeResult("failed", old, total_s=time.perf_counter() - t0, error=str(exc))
            write_s = time.perf_counter() - t_write
            freed = (set(old) | self._stray) - set(new)
            self._stray.clear()
            ledger.give_back(self.ledger_key, tuple(sorted(freed)))
            self.cores = new
            self.resizes += 1
            return ResizeResult("applied", new, write_s, time.perf_counter() - t0)
