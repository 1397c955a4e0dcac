"""Which action holds which core: first come, first served waiting, and a log of every grant.

The scheduler core decides grants in the live runtime, so the ledger normally finds the cores
free at once. It is still the manager's last line of defence: a core is never given to two
actions at the same time, whatever the caller asks; a request whose cores are busy waits, in
arrival order, and the wait is reported as the action's queueing time.
"""

from __future__ import annotations

import numbers
import threading
import time
from collections import deque
from dataclasses import dataclass

from tangram.exec.aoe.errors import AoeError, GrantError
from tangram.exec.aoe.records import GrantRecord
from tangram.exec.aoe.topology import NumaTopology, choose_cores, format_cpulist


@dataclass(eq=False)  # identity: two waiters are never the same request
class _Request:
    action_id: str
    cores: tuple[int, ...] | None  # explicit cores, or None to choose ``n``
    n: int
    granted: tuple[int, ...] | None = None


class CoreLedger:
    """Thread-safe ownership of a node's cores by action id."""

    def __init__(self, topology: NumaTopology, log_size: int = 100_000) -> None:
        self.topology = topology
        self._all = frozenset(topology.cores)
        self._owner: dict[int, str] = {}
        self._since: dict[str, float] = {}
        self._waiting: deque[_Request] = deque()
        self._cond = threading.Condition()
        self._log: deque[GrantRecord] = deque(maxlen=log_size)
        self._closed: str | None = None

    def validate(self, cores: tuple[int, ...] | int) -> None:
        """Raise ``GrantError`` for a request that could never be granted on this node."""
        if isinstance(cores, bool) or not isinstance(cores, int | tuple):
            raise GrantError(f"cores must be a tuple of core ids or a count, got {cores!r}")
        if isinstance(cores, int):
            if not 1 <= cores <= len(self._all):
                raise GrantError(f"asked for {cores} cores; this node has {len(self._all)}")
            return
        if not cores:
            raise GrantError("a grant needs at least one core, got an empty tuple")
        if any(isinstance(c, bool) or not isinstance(c, numbers.Integral) for c in cores):
            # True and 1.0 equal core 1 here, but the cpuset was written 'True' / '1.0'.
            raise GrantError(f"cores must be whole-number core ids, got {cores!r}")
        if len(set(cores)) != len(cores):
            raise GrantError(f"core list {cores} names a core twice")
        unknown = sorted(set(cores) - self._all)
        if unknown:
            raise GrantError(
                f"cores {unknown} are not on this node (cores {format_cpulist(self._all)})"
            )

    def acquire(
        self, action_id: str, cores: tuple[int, ...] | int, deadline: float | None = None
    ) -> tuple[int, ...] | None:
        """Block until the cores (or ``cores`` many NUMA-local ones) are free; return them.
        ``deadline`` (``time.monotonic``): None when it passes first, nothing granted (the
        wait had no other end than the cores' release, however long their holder ran)."""
        self.validate(cores)
        req = (
            _Request(action_id, None, cores)
            if isinstance(cores, int)
            else _Request(action_id, tuple(sorted(cores)), len(cores))
        )
        with self._cond:
            if action_id in self._since:
                raise AoeError(f"action id {action_id!r} already holds cores")
            if any(w.action_id == action_id for w in self._waiting):
                # Both would be granted, and one's release would free the other's cores.
                raise AoeError(f"action id {action_id!r} already waits for cores")
            self._waiting.append(req)
            try:
                return self._wait_for(req, deadline)
            except BaseException:
                # Granted, yet not handed to the caller (an interrupt, a KeyboardInterrupt,
                # after the grant): nobody would release them, kept for good.
                if req.granted is not None:
                    self._ungrant(req)
                raise
            finally:
                if req in self._waiting:
                    self._waiting.remove(req)
                    self._cond.notify_all()

    def _wait_for(self, req: _Request, deadline: float | None) -> tuple[int, ...] | None:
        """``acquire``'s wait for ``req`` (queued); the caller holds the lock."""
        while True:
            if req.granted is not None:
                # Granted by another thread's ``_assign`` while we waited (maybe just
                # before a close): ours, to run and release; refused, nobody would.
                return req.granted
            if self._closed:
                raise AoeError(f"core ledger closed: {self._closed}")
            self._assign()
            if req.granted is not None:
                return req.granted
            if deadline is None:
                self._cond.wait()
                continue
            left = deadline - time.monotonic()
            if left <= 0:
                return None  # (acquire's finally takes the request out of the queue)
            self._cond.wait(left)

    def _ungrant(self, req: _Request) -> None:
        """Take back the cores granted to ``req`` (the caller holds the lock), unlogged."""
        for core in req.granted or ():
            if self._owner.get(core) == req.action_id:
                del self._owner[core]
        self._since.pop(req.action_id, None)
        self._cond.notify_all()

    def holds(self, action_id: str) -> bool:
        """Whether ``action_id`` holds cores now."""
        with self._cond:
            return action_id in self._since

    def _assign(self) -> None:
        """Grant waiting requests in arrival order; a later one may pass an earlier one only
        when it wants none of the cores the earlier one is waiting for."""
        free = self._all - self._owner.keys()
        reserved: set[int] = set()
        chooser_waiting = False
        for req in list(self._waiting):
            if req.granted is not None:
                continue
            if req.cores is None:
                pick = (
                    None if chooser_waiting else choose_cores(self.topology, free - reserved, req.n)
                )
                if pick is None:
                    chooser_waiting = True
                    continue
            else:
                if not set(req.cores) <= free - reserved:
                    reserved.update(req.cores)
                    continue
                pick = req.cores
            for core in pick:
                if core in self._owner:  # the invariant this class exists for
                    raise AssertionError(f"core {core} granted twice")
                self._owner[core] = req.action_id
            self._since[req.action_id] = time.monotonic()
            req.granted = pick
            free = free - set(pick)
            self._waiting.remove(req)

    def release(
        self, action_id: str, traj_id: str, quota_cores: float, record_as: str | None = None
    ) -> GrantRecord:
        """Free the cores ``action_id`` holds and log the grant, under ``record_as`` when given
        (the action's own id, where ``action_id`` is its ledger key)."""
        with self._cond:
            cores = tuple(sorted(c for c, a in self._owner.items() if a == action_id))
            if not cores:
                raise AoeError(f"action {action_id!r} holds no cores")
            for core in cores:
                del self._owner[core]
            record = GrantRecord(
                traj_id,
                action_id if record_as is None else record_as,
                cores,
                quota_cores,
                self._since.pop(action_id),
                time.monotonic(),
            )
            self._log.append(record)
            self._cond.notify_all()
            return record

    def take(self, action_id: str, cores: tuple[int, ...]) -> tuple[int, ...]:
        """A running action grows onto ``cores`` (its whole new set): the ones it lacks become
        its own at once, or ``GrantError`` naming their holder and nothing changes. Never waits:
        the scheduler core grows an action only into cores it knows are free. Returns the
        cores added; ``AoeError`` when ``action_id`` holds no cores (it ended)."""
        self.validate(cores)
        with self._cond:
            if self._closed:  # as ``acquire``: nothing is granted after the close
                raise AoeError(f"core ledger closed: {self._closed}")
            if action_id not in self._since:
                raise AoeError(f"action {action_id!r} holds no cores (it ended)")
            added = tuple(sorted(c for c in cores if self._owner.get(c) != action_id))
            taken = {c: self._owner[c] for c in added if c in self._owner}
            if taken:
                holders = ", ".join(f"core {c}: {a}" for c, a in sorted(taken.items()))
                raise GrantError(f"cannot grow {action_id!r}: cores held by others ({holders})")
            for core in added:
                self._owner[core] = action_id
            return added

    def give_back(self, action_id: str, cores: tuple[int, ...]) -> None:
        """A running action shrank off ``cores`` (its container no longer runs there): they
        are free for the next waiter. Cores it does not hold are ignored."""
        with self._cond:
            for core in cores:
                if self._owner.get(core) == action_id:
                    del self._owner[core]
            self._cond.notify_all()

    def free_cores(self) -> tuple[int, ...]:
        with self._cond:
            return tuple(sorted(self._all - self._owner.keys()))

    def busy(self) -> dict[int, str]:
        """core -> action id, for every core granted now."""
        with self._cond:
            return dict(self._owner)

    def log(self) -> tuple[GrantRecord, ...]:
        with self._cond:
            return tuple(self._log)

    def close(self, reason: str) -> None:
        """Wake every waiter with an error (the manager is shutting down)."""
        with self._cond:
            self._closed = reason
            self._cond.notify_all()
