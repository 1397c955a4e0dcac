"""The node's books: which replicas are where, the bytes claimed and live on each GPU, the calls
running, the LRU clock and the counters; each change booked as the planners decided it.

Not thread-safe on its own: the manager holds its condition around every method, and reads
the planners' inputs from here under that same condition.
"""

from __future__ import annotations

import itertools
import logging
import operator
from collections.abc import Sequence
from typing import Any

from tangram.exec.eoe.bookkeeping import CallState, Counters, Replica
from tangram.exec.eoe.cells import Cell
from tangram.exec.eoe.devices import Device, DeviceFigures
from tangram.exec.eoe.errors import EoeError, RestoreError, told
from tangram.exec.eoe.plan_cell import NodeLoad
from tangram.exec.eoe.plan_room import GpuMemory, Key, RoomPlan, lru
from tangram.exec.eoe.records import CallOutcome, DeviceStats, EoeStats
from tangram.exec.eoe.residency import ResidencyFeed

log = logging.getLogger(__name__)

_gpu = operator.attrgetter("gpu")

#: A restore under way: (placeholder, module, device buffer, fence).
Started = tuple[Replica, Any, Any, Any]


class Ledger:
    """The books of one node's GPUs (see the module docstring for the locking)."""

    def __init__(self, n_gpus: int, feed: ResidencyFeed) -> None:
        self.replicas: dict[Key, Replica] = {}
        #: Bytes booked per GPU: resident replicas, replicas being evicted, running workspaces.
        self.claimed = [0] * n_gpus
        #: Bytes of the manager's own live device buffers per GPU (the rest is foreign).
        self.live = [0] * n_gpus
        #: Bytes claimed per GPU by awake engines: memory the engine allocates itself, which
        #: the allocator counts beyond the manager's buffers, and is not foreign.
        self.engines = [0] * n_gpus
        #: Bytes of running calls' workspaces per GPU: their activations, which the allocator
        #: counts too, are within them (not foreign).
        self.workspaces = [0] * n_gpus
        #: Calls running per GPU.
        self.busy = [0] * n_gpus
        self.counters = Counters()
        self._tick = itertools.count(1)
        self._feed = feed

    # --- what the planners read ---------------------------------------------------------------

    def held(self, service: str) -> set[int]:
        """GPUs where ``service`` has a replica, ready or being restored."""
        return {g for g in range(len(self.busy)) if (service, g) in self.replicas}

    def load(self, budgets: tuple[int, ...], calls_per_gpu: int) -> NodeLoad:
        return NodeLoad(budgets, tuple(self.claimed), tuple(self.busy), calls_per_gpu)

    def memory(
        self, cell: Cell, devices: Sequence[Device], budgets: Sequence[int]
    ) -> dict[int, GpuMemory]:
        """Each GPU of ``cell``: budget, bytes claimed, and bytes the allocator holds beyond
        the manager's own buffers, its awake engines' claims and its running calls'
        workspaces (foreign)."""
        return {
            g: GpuMemory(
                budget=budgets[g],
                claimed=self.claimed[g],
                foreign=max(
                    0,
                    devices[g].allocated_bytes()
                    - self.live[g]
                    - self.engines[g]
                    - self.workspaces[g],
                ),
            )
            for g in cell
        }

    # --- a call's lifetime --------------------------------------------------------------------

    def take_slots(self, state: CallState, cell: Cell) -> None:
        """The call runs on ``cell``: one call slot on each of its GPUs, each taken and added
        to ``state.cell`` and ``state.slots`` (what ``release`` gives back) in one statement.
        Taken all, then the cell recorded on a later line, an interrupt in between kept the
        slots for good."""
        busy = self.busy
        for g in cell:
            busy[g], state.cell, state.slots = busy[g] + 1, (*state.cell, g), (*state.slots, g)

    def pin(self, state: CallState) -> None:
        """The call pins its service's replica on every GPU of its cell (all are booked), each
        pin counted and listed in ``state.pinned`` (what ``release`` takes off) on one line:
        counted, then listed on the next, an interrupt in between kept the replica pinned
        (never evicted) for good."""
        name = state.service.info.name
        for g in state.cell:
            rep = self.replicas[(name, g)]
            rep.pins, state.pinned = rep.pins + 1, [*state.pinned, rep]

    def book(
        self,
        state: CallState,
        plan: RoomPlan,
        victims: list[Replica],
        placeholders: list[Replica],
    ) -> None:
        """Book a GO plan: evictees leave the residency now (their bytes stay claimed until
        freed), placeholders claim the restores, the call pins its replicas and claims its
        workspace. The evictees and placeholders are listed in ``victims`` and
        ``placeholders``, the caller's, for the manager to carry out (or undo): each is
        listed in the statement that books it. Returned once booked all, an interrupt
        part-way left evictees out of the books and out of every list (their bytes claimed
        for good) and placeholders claiming bytes no one would restore or give back."""
        info = state.service.info
        name, ws, rs, feed = info.name, info.workspace_bytes, self.replicas, self._feed
        claimed, workspaces = self.claimed, self.workspaces
        for key in plan.evict:
            state.evicted.append(key)
            _ = victims.append(rs.pop(key)), feed.queue((key[0], (key[1],), False))
        engine = state.service.spec.backend == "engine"
        for g in plan.restore:
            rep = Replica(
                name,
                g,
                info.resident_bytes,
                engine=engine,
                engine_bytes=info.weight_bytes if engine else 0,
            )
            rs[(name, g)], claimed[g], placeholders[len(placeholders) :] = (
                rep,
                claimed[g] + rep.claim,
                [rep],
            )
        self.pin(state)
        if ws:
            for g in state.cell:
                claimed[g], workspaces[g], state.workspace_gpus = (
                    claimed[g] + ws,
                    workspaces[g] + ws,
                    [*state.workspace_gpus, g],
                )

    def release(self, state: CallState) -> None:
        """Give back what the call holds: pins (its replicas were used now), workspaces, slots.

        Each given back and struck from ``state`` on one line, so a second call gives back
        only what is left: given back all, then struck off together, an interrupt part-way
        kept the rest (pins, workspace bytes, call slots) for good."""
        tick = next(self._tick)
        ws, gpus = state.service.info.workspace_bytes, state.workspace_gpus
        claimed, workspaces, busy = self.claimed, self.workspaces, self.busy
        while state.pinned:
            state.pinned[-1].last_used = tick
            state.pinned.pop().pins -= 1
        while gpus:  # (one physical line: a statement over several has line events inside)
            g = gpus[-1]
            claimed[g], workspaces[g], _ = claimed[g] - ws, workspaces[g] - ws, gpus.pop()
        while state.slots:
            g = state.slots[-1]
            busy[g], state.slots = busy[g] - 1, state.slots[:-1]

    def count(self, outcome: CallOutcome) -> None:
        self.counters.count(outcome)

    # --- restores and evictions ---------------------------------------------------------------

    def restores_done(
        self, reps: list[Replica], started: list[Started], failure: EoeError | None
    ) -> None:
        """The copies of ``reps`` finished (``started`` of them began). All or nothing: on a
        failure every placeholder is dropped with its claim, and what was copied is let go.
        The copies' bytes are booked live here, on success only (see
        ``EoeManager._start_copies``)."""
        live, engines = self.live, self.engines
        for rep, module, storage, _ in started:
            size = int(storage.numel())
            if failure is None:
                # Booked live and made ready in one statement (booked live first, an
                # interrupt before the replica had its buffer kept the bytes live for good;
                # ``_forget`` unbooks a ready one).
                g, engine = rep.gpu, rep.claim if rep.engine else 0
                live[g], engines[g], rep.module, rep.storage, rep.ready = (
                    live[g] + size,
                    engines[g] + engine,
                    module,
                    storage,
                    True,
                )
                rep.last_used = next(self._tick)
                self.counters.restores += 1
                self.counters.bytes_restored += rep.moved(size)
        if failure is None:
            self._feed.push(reps[0].service, [r.gpu for r in reps], True)
        else:
            for rep in reps:
                rep.error = failure
                self._forget(rep)
        for rep in reps:
            rep.settled.set()

    def restore_time(self, seconds: float, *, completed: bool) -> None:
        """Count a restore's ``seconds``: a completed one's in ``restore_s``, beside the bytes
        it restored; a failed one's apart, in ``failed_restore_s``. (A failed restore's time
        was counted with its 0 bytes, and bytes_restored / restore_s, the restore rate a
        trace calibration derives, came out too slow.)"""
        if completed:
            self.counters.restore_s += seconds
        else:
            self.counters.failed_restore_s += seconds

    def abandon(self, reps: list[Replica], exc: BaseException) -> None:
        """Undo placeholders whose restore never finished (an unexpected error)."""
        for rep in reps:
            if rep.settled.is_set():
                continue
            rep.error = RestoreError(f"restore abandoned: {type(exc).__name__}: {told(exc)}")
            self._forget(rep)
            rep.settled.set()

    def _forget(self, placeholder: Replica) -> None:
        """Drop a failed placeholder and its claim, if it is still the booked one; one made
        ready already (an interrupt finishing its restore) with its live bytes and its
        residency, reported gone if it was reported (each in one statement)."""
        key, g = (placeholder.service, placeholder.gpu), placeholder.gpu
        if self.replicas.get(key) is placeholder:
            _, self.claimed[g] = self.replicas.pop(key), self.claimed[g] - placeholder.claim
        if placeholder.ready:
            size, engine = placeholder.nbytes, placeholder.claim if placeholder.engine else 0
            live, engines, queue = self.live, self.engines, self._feed.queue
            live[g], engines[g], placeholder.ready, placeholder.module, placeholder.storage, _ = (
                live[g] - size,
                engines[g] - engine,
                False,
                None,
                None,
                queue((placeholder.service, (g,), False)),
            )

    def take_out(self, keys: Sequence[Key], out: list[Replica]) -> None:
        """An explicit eviction: the replicas leave the residency now (bytes claimed until
        freed), each listed in ``out``, the caller's (what it frees), in the statement that
        takes it out, and the change queued for the residency callback however the loop
        ends. Taken out all, then returned (and the change queued) on later lines, an
        interrupt in between left them out of the books and out of the caller's hands: never
        freed (their bytes claimed, their memory allocated for good), and reported resident
        for ever."""
        try:
            for key in keys:
                out.append(self.replicas.pop(key))
        finally:
            if out:  # (map and sorted: no line of Python runs between here and the queue)
                self._feed.queue((out[0].service, tuple(sorted(map(_gpu, out))), False))

    def freed(self, victim: Replica, size: int, freed: int, seconds: float) -> None:
        """An evicted replica's ``size`` bytes were dropped, ``freed`` of them seen freed
        (once: a replica unbooked already is left as it is)."""
        if victim.unbooked:
            return
        # Unbooked in one statement (marked unbooked first, its bytes on the next lines, an
        # interrupt in between kept them claimed and live for good: no second try books a
        # replica marked unbooked).
        g, claim, engine = victim.gpu, victim.claim, victim.claim if victim.engine else 0
        claimed, live, engines = self.claimed, self.live, self.engines
        victim.unbooked, claimed[g], live[g], engines[g] = (
            True,
            claimed[g] - claim,
            live[g] - size,
            engines[g] - engine,
        )
        c = self.counters
        c.evictions += 1
        c.bytes_evicted += victim.moved(size)
        c.evict_s += seconds
        if freed < size:
            c.unverified_evictions += 1
            log.warning(
                "evicting %r from GPU %d freed %d of its %d bytes (a reference to its "
                "weights is still alive, or another allocation happened meanwhile)",
                victim.service,
                victim.gpu,
                freed,
                size,
            )

    # --- reports ------------------------------------------------------------------------------

    def residency(self) -> dict[str, tuple[int, ...]]:
        """service -> the GPUs where a replica is ready (services with none omitted)."""
        found: dict[str, list[int]] = {}
        for (name, gpu), rep in self.replicas.items():
            if rep.ready:
                found.setdefault(name, []).append(gpu)
        return {name: tuple(sorted(gpus)) for name, gpus in sorted(found.items())}

    def lru_order(self, gpu: int) -> tuple[str, ...]:
        return tuple(r.service for r in lru(self.replicas.values(), gpu))

    def has_replicas(self, service: str) -> bool:
        """True if ``service`` has a replica booked anywhere (ready or being restored)."""
        return any(r.service == service for r in self.replicas.values())

    def stats(self, figures: Sequence[DeviceFigures]) -> EoeStats:
        """The counters and each device's figures beside the books."""
        return self.counters.stats(tuple(self._device_stats(f) for f in figures))

    def _device_stats(self, f: DeviceFigures) -> DeviceStats:
        return DeviceStats(
            index=f.index,
            backend=f.backend,
            name=f.name,
            budget_bytes=f.budget_bytes,
            claimed_bytes=self.claimed[f.index],
            allocated_bytes=f.allocated_bytes,
            peak_allocated_bytes=f.peak_allocated_bytes,
            running_calls=self.busy[f.index],
            resident=tuple(
                sorted(r.service for r in self.replicas.values() if r.gpu == f.index and r.ready)
            ),
            nvml_total_bytes=f.nvml_total_bytes,
            nvml_used_bytes=f.nvml_used_bytes,
        )
