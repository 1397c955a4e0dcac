"""``EoeManager``: Evict-on-Execution, the GPU resource manager of ``tangram.exec``.

Many services (reward models, teachers) share few GPUs. Each service's weights live in host
memory (``HostBackup``); a call at DoP k runs on an aligned cell of k GPUs, one data-parallel
replica per GPU. A replica missing on a GPU of the cell is restored from the backup first, after
evicting least-recently-used replicas on that GPU if memory is short; replicas stay resident
after the call. A replica in use by a call is pinned and never evicted.

Concurrency. ``call`` blocks and is thread-safe (the live runtime calls it from a thread pool).
One condition variable guards the bookkeeping; it is never held during copies or calls. Each
device also has a lock held from the moment memory on it is planned until the planned evictions
are freed and the restores allocated, so two threads never race for the same bytes; device
locks are taken in index order and never held while waiting, so calls cannot deadlock. A call
that cannot get room now (other calls pin what would have to go) releases everything but its
GPUs and waits; that wait counts as queueing.

Memory accounting, per device: ``claimed`` = resident replicas + replicas being evicted (until
really freed) + workspaces of running calls. Room for a restore is ``budget - claimed -
foreign``, where ``foreign`` is what the allocator reports beyond the manager's own live buffers
(other processes' tensors on CUDA, a test's allocations on CPU). After each eviction the
allocator's figure must drop by the replica's size before the restore goes on; an eviction
that does not show up there is counted in ``stats().unverified_evictions``.

Residency is reported through ``residency()`` and the optional ``on_residency_change(service,
gpus, resident)`` callback, called in the order the changes happened, outside the manager's lock.
"""

from __future__ import annotations

import contextlib
import gc
import itertools
import logging
import threading
import time
import traceback
from collections import Counter, deque
from collections.abc import Callable, Iterable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from tangram.exec.eoe.backup import HostBackup
from tangram.exec.eoe.cells import Cell, aligned_cells, best_cell, validate_cell
from tangram.exec.eoe.config import EoeConfig
from tangram.exec.eoe.devices import Device, no_grad_on, open_devices
from tangram.exec.eoe.errors import (
    CallFailedError,
    DeviceOutOfMemoryError,
    DopNotSupportedError,
    EoeError,
    ExecutorError,
    HostMemoryError,
    InputSplitError,
    ManagerClosedError,
    QueueTimeoutError,
    RestoreError,
    RestoreOutOfMemoryError,
    ServiceInUseError,
    ServiceSpecError,
    ServiceTooLargeError,
    UnknownServiceError,
)
from tangram.exec.eoe.records import (
    ERROR,
    OK,
    CallOutcome,
    DeviceStats,
    EoeStats,
    EvictOutcome,
    ServiceInfo,
)
from tangram.exec.eoe.registry import ServiceRegistry, ServiceSpec, map_tensors

if TYPE_CHECKING:
    import torch

log = logging.getLogger(__name__)

ResidencyCallback = Callable[[str, tuple[int, ...], bool], None]

#: Longest single wait on the condition; waits re-check their state after it (a safety net:
#: memory used outside the manager can be freed without a notification).
_WAIT_S = 0.25

_RESTORING = "restoring"
_READY = "ready"


class _Replica:
    """One service's weights on one GPU (mutable; guarded by the manager's condition)."""

    __slots__ = (
        "service",
        "gpu",
        "claim",
        "state",
        "pins",
        "last_used",
        "module",
        "storage",
        "ready",
        "error",
    )

    def __init__(self, service: str, gpu: int, claim: int) -> None:
        self.service = service
        self.gpu = gpu
        self.claim = claim
        self.state = _RESTORING
        self.pins = 0
        self.last_used = 0
        self.module: torch.nn.Module | None = None
        self.storage: torch.Tensor | None = None
        self.ready = threading.Event()
        self.error: EoeError | None = None


@dataclass
class _Service:
    spec: ServiceSpec
    backup: HostBackup
    info: ServiceInfo


@dataclass
class _CallState:
    """What one call holds, so that it is released exactly once whatever happens."""

    service: _Service
    cell: Cell = ()
    pinned: list[_Replica] = field(default_factory=list)
    workspace_gpus: list[int] = field(default_factory=list)
    restored: list[int] = field(default_factory=list)
    evicted: list[tuple[str, int]] = field(default_factory=list)
    waited_for_restore: bool = False
    #: perf_counter() time after which waiting (for GPUs or memory) fails; None: wait forever.
    deadline: float | None = None
    queue_s: float = 0.0
    evict_s: float = 0.0
    restore_s: float = 0.0


@dataclass
class _Counters:
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
    errors_by_type: Counter[str] = field(default_factory=Counter)


class EoeManager:
    """The GPU executor: register services, call them on cells, report residency.

    >>> manager = EoeManager(EoeConfig(backend="cpu", devices=2, device_memory_bytes=1 << 28))
    >>> manager.register(reward_model_spec())          # doctest: +SKIP
    >>> manager.call("reward", tokens, dop=2).unwrap() # doctest: +SKIP
    """

    def __init__(
        self,
        config: EoeConfig | None = None,
        *,
        on_residency_change: ResidencyCallback | None = None,
        devices: list[Device] | None = None,
    ) -> None:
        self.config = config or EoeConfig()
        if devices is not None and not devices:
            raise ValueError("devices, when given, must name at least one device")
        self.devices: tuple[Device, ...] = tuple(devices or open_devices(self.config))
        self.backend = self.devices[0].backend
        self._pin_host = (
            self.config.pin_host_memory
            if self.config.pin_host_memory is not None
            else self.backend == "cuda"
        )
        self._on_residency_change = on_residency_change
        self._registry = ServiceRegistry()
        self._services: dict[str, _Service] = {}
        self._cond = threading.Condition(threading.Lock())
        self._device_locks = [threading.Lock() for _ in self.devices]
        n = len(self.devices)
        self._replicas: dict[tuple[str, int], _Replica] = {}
        self._claimed = [0] * n
        self._live = [0] * n
        self._busy = [0] * n
        self._tick = itertools.count(1)
        self._host_bytes = 0
        self._counters = _Counters()
        self._events: deque[tuple[str, tuple[int, ...], bool]] = deque()
        self._event_lock = threading.RLock()
        self._pool: ThreadPoolExecutor | None = None
        self._closed = False

    # --- services -----------------------------------------------------------------------------

    def register(self, spec: ServiceSpec) -> ServiceInfo:
        """Build the service on the host, back it up, and make it callable.

        Raises ``DuplicateServiceError``, ``ServiceSpecError`` (factory failed, memory_bytes
        below the measured size), ``ServiceTooLargeError`` (no GPU of this executor could hold
        one replica plus workspace) or ``HostMemoryError``.
        """
        self._check_open()
        if spec.name in self._registry:
            self._registry.add(spec)  # raises DuplicateServiceError with the message
        start = time.perf_counter()
        try:
            module = spec.factory()
        except Exception as exc:
            raise ServiceSpecError(
                f"service {spec.name!r}: factory raised {type(exc).__name__}: {exc}"
            ) from exc
        backup = HostBackup(module, pin=self._pin_host)
        del module
        if spec.memory_bytes is not None and spec.memory_bytes < backup.tensor_bytes:
            raise ServiceSpecError(
                f"service {spec.name!r} declares memory_bytes={spec.memory_bytes} but its "
                f"parameters and buffers take {backup.tensor_bytes} bytes"
            )
        info = ServiceInfo(
            name=spec.name,
            dops=spec.dops,
            weight_bytes=backup.tensor_bytes,
            replica_bytes=backup.nbytes,
            resident_bytes=max(spec.memory_bytes or 0, backup.nbytes),
            workspace_bytes=spec.workspace_bytes,
            pinned=backup.pinned,
            build_s=time.perf_counter() - start,
        )
        largest = max(d.budget_bytes for d in self.devices)
        if info.need_bytes > largest:
            raise ServiceTooLargeError(
                f"service {spec.name!r} needs {info.need_bytes} bytes per GPU "
                f"({info.resident_bytes} resident + {info.workspace_bytes} workspace) but the "
                f"largest GPU budget is {largest} bytes; every GPU of a cell holds a whole "
                f"data-parallel replica, so no cell can run it"
            )
        with self._cond:
            limit = self.config.host_memory_bytes
            if limit is not None and self._host_bytes + backup.nbytes > limit:
                raise HostMemoryError(
                    f"service {spec.name!r}: its host backup of {backup.nbytes} bytes would bring "
                    f"the backups to {self._host_bytes + backup.nbytes} bytes, over the host "
                    f"budget of {limit} bytes"
                )
            self._registry.add(spec)
            self._services[spec.name] = _Service(spec, backup, info)
            self._host_bytes += backup.nbytes
        return info

    def unregister(self, service: str) -> None:
        """Evict the service everywhere and forget it (``ServiceInUseError`` if a call uses it)."""
        self.evict(service)
        with self._cond:
            if any(r.service == service for r in self._replicas.values()):
                raise ServiceInUseError(
                    f"service {service!r} was restored again while unregistering"
                )
            svc = self._services.pop(service)
            self._registry.remove(service)
            self._host_bytes -= svc.backup.nbytes

    def services(self) -> tuple[str, ...]:
        return self._registry.names()

    def info(self, service: str) -> ServiceInfo:
        return self._service(service).info

    def _service(self, name: str) -> _Service:
        with self._cond:
            svc = self._services.get(name)
        if svc is None:
            self._registry.get(name)  # raises UnknownServiceError naming the known services
            raise UnknownServiceError(f"unknown service {name!r}")
        return svc

    # --- residency ----------------------------------------------------------------------------

    def residency(self) -> dict[str, tuple[int, ...]]:
        """service -> the GPUs where a replica is resident and ready (services with none omitted)."""
        with self._cond:
            found: dict[str, list[int]] = {}
            for (name, gpu), rep in self._replicas.items():
                if rep.state == _READY:
                    found.setdefault(name, []).append(gpu)
        return {name: tuple(sorted(gpus)) for name, gpus in sorted(found.items())}

    def lru_order(self, gpu: int) -> tuple[str, ...]:
        """Services resident on ``gpu``, least recently used first (the eviction order)."""
        with self._cond:
            reps = [r for r in self._replicas.values() if r.gpu == gpu and r.state == _READY]
        return tuple(r.service for r in sorted(reps, key=lambda r: r.last_used))

    def _notify(self, service: str, gpus: Iterable[int], resident: bool) -> None:
        """Queue a residency change (caller holds the condition)."""
        gpus = tuple(sorted(gpus))
        if gpus:
            self._events.append((service, gpus, resident))

    def _deliver(self) -> None:
        """Deliver queued residency changes in order, outside the condition."""
        if self._on_residency_change is None:
            with self._cond:
                self._events.clear()
            return
        with self._event_lock:
            while True:
                with self._cond:
                    if not self._events:
                        return
                    event = self._events.popleft()
                try:
                    self._on_residency_change(*event)
                except Exception:
                    log.exception("on_residency_change%r raised", event)

    # --- calls --------------------------------------------------------------------------------

    def call(
        self,
        service: str,
        inputs: Any,
        dop: int | None = None,
        gpus: tuple[int, ...] | None = None,
        *,
        timeout_s: float | None = None,
    ) -> CallOutcome:
        """Run one call of ``service`` on ``inputs`` at DoP ``dop`` on the cell ``gpus``.

        ``gpus`` is the cell chosen by the scheduler; if None the manager picks a free aligned
        cell of ``dop`` GPUs, preferring one where the service is resident. ``dop`` defaults to
        ``len(gpus)``, or 1. ``timeout_s`` bounds the time spent waiting for the GPUs and for
        memory (``QueueTimeoutError``); a call that has started running is never interrupted.
        Blocks until done; never raises for a problem of this call: the returned
        ``CallOutcome`` has status "error" and the specific ``EoeError``.
        """
        start = time.perf_counter()
        state: _CallState | None = None
        outcome_kwargs: dict[str, Any] = {}
        try:
            self._check_open()
            svc = self._service(service)
            dop, cell = self._check_request(svc, dop, gpus)
            state = _CallState(svc)
            if timeout_s is not None:
                state.deadline = start + timeout_s
            self._admit(state, dop, cell)
            try:
                replicas = self._prepare(state)
                t_exec = time.perf_counter()
                value = self._execute(svc, state.cell, replicas, inputs)
                outcome_kwargs["exec_s"] = time.perf_counter() - t_exec
            finally:
                self._release(state)
            outcome_kwargs["value"] = value
            status, error = OK, None
        except EoeError as exc:
            status, error = ERROR, exc
        except Exception as exc:  # a bug of ours or of torch: still one outcome for the call
            log.exception("EOE call of %r failed unexpectedly", service)
            error = ExecutorError(f"unexpected {type(exc).__name__} in the executor: {exc}")
            error.__cause__ = exc
            status = ERROR
        finally:
            self._deliver()
        detail = ""
        if error is not None:
            # The traceback's frames would keep the replica's weights alive (and an evicted
            # replica's memory unfreed) for as long as the outcome lives: keep it as text.
            detail = "".join(traceback.format_exception(error))
            _drop_tracebacks(error)
        hit = bool(
            state is not None
            and state.cell
            and not state.restored
            and not state.waited_for_restore
            and status == OK
        )
        outcome = CallOutcome(
            service=service,
            status=status,
            error=error,
            gpus=state.cell if state else (),
            dop=len(state.cell) if state and state.cell else (dop or 0),
            hit=hit,
            restored_gpus=tuple(state.restored) if state else (),
            evicted=tuple(state.evicted) if state else (),
            queue_s=state.queue_s if state else 0.0,
            evict_s=state.evict_s if state else 0.0,
            restore_s=state.restore_s if state else 0.0,
            total_s=time.perf_counter() - start,
            detail=detail,
            **outcome_kwargs,
        )
        with self._cond:
            c = self._counters
            c.calls += 1
            if outcome.ok:
                c.ok += 1
                c.hits += outcome.hit
                c.misses += not outcome.hit
            else:
                c.errors += 1
                c.errors_by_type[type(error).__name__] += 1
        return outcome

    def _check_open(self) -> None:
        if self._closed:
            raise ManagerClosedError("the EOE manager is closed")

    def _check_request(
        self, svc: _Service, dop: int | None, gpus: tuple[int, ...] | None
    ) -> tuple[int, Cell | None]:
        n = len(self.devices)
        if dop is None:
            dop = len(tuple(gpus)) if gpus is not None else 1
        name = svc.spec.name
        if dop not in svc.spec.dops:
            raise DopNotSupportedError(
                f"service {name!r} supports DoPs {svc.spec.dops}, not {dop!r}"
            )
        if dop > n:
            raise DopNotSupportedError(
                f"DoP {dop} needs a cell of {dop} GPUs but this executor has {n}"
            )
        cell = validate_cell(gpus, n, dop) if gpus is not None else None
        need = svc.info.need_bytes
        small = [g for g in (cell or ()) if self.devices[g].budget_bytes < need]
        if small:
            raise ServiceTooLargeError(
                f"service {name!r} needs {need} bytes per GPU but GPUs {small} of cell {cell} "
                f"have budgets of {[self.devices[g].budget_bytes for g in small]} bytes"
            )
        return dop, cell

    def _admit(self, state: _CallState, dop: int, cell: Cell | None) -> None:
        """Wait until the cell (given, or the best one free) has a free call slot on each GPU."""
        limit = self.config.calls_per_gpu
        need = state.service.info.need_bytes
        name = state.service.spec.name
        t0 = time.perf_counter()

        def free(c: Cell) -> bool:
            return all(self._busy[g] < limit for g in c)

        def fits(c: Cell) -> bool:
            return all(self.devices[g].budget_bytes >= need for g in c)

        candidates = [c for c in aligned_cells(len(self.devices), dop) if fits(c)]
        if cell is None and not candidates:
            raise ServiceTooLargeError(
                f"service {name!r} needs {need} bytes per GPU; no cell of {dop} GPUs has that"
            )
        with self._cond:
            while True:
                self._check_open()
                if cell is not None:
                    chosen = cell if free(cell) else None
                else:
                    chosen = best_cell(candidates, free, lambda c: self._cell_key(name, need, c))
                if chosen is not None:
                    for g in chosen:
                        self._busy[g] += 1
                    state.cell = chosen
                    break
                self._cond.wait(self._wait_s(state, "free GPUs"))
        state.queue_s += time.perf_counter() - t0

    def _wait_s(self, state: _CallState, what: str) -> float:
        """How long the next wait may last; ``QueueTimeoutError`` once the deadline passed."""
        if state.deadline is None:
            return _WAIT_S
        left = state.deadline - time.perf_counter()
        if left <= 0:
            raise QueueTimeoutError(
                f"service {state.service.spec.name!r}: waited longer than its timeout for {what}"
            )
        return min(_WAIT_S, left)

    def _cell_key(self, name: str, need: int, cell: Cell) -> tuple[int, int, int, int]:
        """Rank of a free cell: most replicas of the service present, then fewest bytes to
        evict, then least busy, then lowest index (caller holds the condition)."""
        present = sum((name, g) in self._replicas for g in cell)
        short = 0
        for g in cell:
            missing = 0 if (name, g) in self._replicas else need
            short += max(0, missing - (self.devices[g].budget_bytes - self._claimed[g]))
        return (-present, short, sum(self._busy[g] for g in cell), cell[0])

    # --- memory: plan, evict, restore ---------------------------------------------------------

    def _prepare(self, state: _CallState) -> list[_Replica]:
        """Make the service resident on every GPU of the cell and pin it there."""
        svc = state.service
        name = svc.spec.name
        ws = svc.info.workspace_bytes
        while True:
            with self._cond:
                self._check_open()
                reps = [self._replicas.get((name, g)) for g in state.cell]
                if ws == 0 and all(r is not None for r in reps):
                    self._pin(state, reps)  # the fast path: resident (or being restored) everywhere
                    break
            done = self._plan_and_restore(state)
            if done:
                break
        # Replicas restored by a concurrent call of the same service.
        replicas = []
        for rep in state.pinned:
            if not rep.ready.is_set():
                state.waited_for_restore = True
                t0 = time.perf_counter()
                while not rep.ready.wait(self._wait_s(state, "a concurrent restore")):
                    pass
                state.queue_s += time.perf_counter() - t0
            if rep.error is not None:
                raise RestoreError(
                    f"service {name!r}: a concurrent restore on GPU {rep.gpu} failed: {rep.error}"
                )
            replicas.append(rep)
        return replicas

    def _pin(self, state: _CallState, reps: list[_Replica | None]) -> None:
        for rep in reps:
            assert rep is not None
            rep.pins += 1
            state.pinned.append(rep)

    def _plan_and_restore(self, state: _CallState) -> bool:
        """One attempt under the cell's device locks; False means "wait and retry"."""
        svc = state.service
        name = svc.spec.name
        claim, ws = svc.info.resident_bytes, svc.info.workspace_bytes
        locks = [self._device_locks[g] for g in state.cell]
        with contextlib.ExitStack() as stack:
            for lock in locks:  # the cell is sorted: locks are taken in index order
                stack.enter_context(lock)
            with self._cond:
                self._check_open()
                plans: dict[int, list[_Replica]] = {}
                blocked = False
                for g in state.cell:
                    rep = self._replicas.get((name, g))
                    need = ws + (0 if rep is not None else claim)
                    evict, ok = self._plan_room(name, g, need)
                    if ok is None:
                        self._fail_no_room(name, g, need)
                    if not ok:
                        blocked = True
                        break
                    plans[g] = evict
                if blocked:
                    t0 = time.perf_counter()
                    stack.close()  # release the device locks before waiting
                    self._cond.wait(self._wait_s(state, "memory"))
                    state.queue_s += time.perf_counter() - t0
                    return False
                # Commit: evictees leave the residency now (their bytes stay claimed until freed).
                to_restore: list[_Replica] = []
                for g in state.cell:
                    for victim in plans[g]:
                        del self._replicas[(victim.service, g)]
                        self._notify(victim.service, (g,), False)
                        state.evicted.append((victim.service, g))
                    rep = self._replicas.get((name, g))
                    if rep is None:
                        rep = _Replica(name, g, claim)
                        self._replicas[(name, g)] = rep
                        self._claimed[g] += claim
                        to_restore.append(rep)
                    self._pin(state, [rep])
                    if ws:
                        self._claimed[g] += ws
                        state.workspace_gpus.append(g)
            # Free the evictees, then restore, still holding the device locks.
            t0 = time.perf_counter()
            try:
                for g in state.cell:
                    for victim in plans[g]:
                        state.evict_s += self._free(victim)
                t0 = time.perf_counter()
                self._restore(svc, to_restore)
            except BaseException as exc:
                self._abandon(name, to_restore, exc)
                raise
            finally:
                elapsed = time.perf_counter() - t0
                state.restore_s += elapsed
                state.restored.extend(r.gpu for r in to_restore if r.error is None)
                if to_restore:
                    with self._cond:
                        self._counters.restore_s += elapsed
        return True

    def _plan_room(self, name: str, g: int, need: int) -> tuple[list[_Replica], bool | None]:
        """Replicas to evict on GPU ``g`` to fit ``need`` more bytes, LRU first.

        Returns (victims, True) when room can be made now, ([], False) when it can only be made
        after running calls release what they pin, and ([], None) when it never can.
        """
        if need == 0:
            return [], True
        device = self.devices[g]
        foreign = max(0, device.allocated_bytes() - self._live[g])
        room = device.budget_bytes - self._claimed[g] - foreign
        if room >= need:
            return [], True
        victims: list[_Replica] = []
        candidates = sorted(
            (
                r
                for r in self._replicas.values()
                if r.gpu == g and r.service != name and r.state == _READY and r.pins == 0
            ),
            key=lambda r: r.last_used,
        )
        for rep in candidates:
            victims.append(rep)
            room += rep.claim
            if room >= need:
                return victims, True
        # Short even after evicting every idle replica: will other calls free enough later?
        own = self._replicas[(name, g)].claim if (name, g) in self._replicas else 0
        held_by_others = self._claimed[g] - sum(r.claim for r in candidates) - own
        if held_by_others > 0 and device.budget_bytes - foreign - own - need >= 0:
            return [], False
        return [], None

    def _fail_no_room(self, name: str, g: int, need: int) -> None:
        device = self.devices[g]
        foreign = max(0, device.allocated_bytes() - self._live[g])
        raise RestoreOutOfMemoryError(
            f"service {name!r} needs {need} bytes on GPU {g} but cannot get them: budget "
            f"{device.budget_bytes}, claimed by the executor {self._claimed[g]}, used outside "
            f"the executor {foreign}"
        )

    def _free(self, victim: _Replica) -> float:
        """Drop an evicted replica's module and buffer and check the allocator saw it go.

        The caller holds the replica's device lock; returns the seconds it took.
        """
        t0 = time.perf_counter()
        device = self.devices[victim.gpu]
        size = 0 if victim.storage is None else int(victim.storage.numel())
        before = device.allocated_bytes()
        svc = self._services.get(victim.service)
        if svc is not None and victim.module is not None:
            svc.backup.recycle(victim.module)  # keeps the skeleton, drops the device tensors
        victim.module = None
        victim.storage = None
        freed = before - device.allocated_bytes()
        if freed < size:
            gc.collect()  # a reference cycle in the module may hold the buffer
            freed = before - device.allocated_bytes()
        elapsed = time.perf_counter() - t0
        with self._cond:
            self._claimed[victim.gpu] -= victim.claim
            self._live[victim.gpu] -= size
            c = self._counters
            c.evictions += 1
            c.bytes_evicted += size
            c.evict_s += elapsed
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
            self._cond.notify_all()
        return elapsed

    def _abandon(self, name: str, reps: list[_Replica], exc: BaseException) -> None:
        """Undo placeholders whose restore never finished (an unexpected error)."""
        with self._cond:
            for rep in reps:
                if rep.ready.is_set():
                    continue
                rep.error = RestoreError(f"restore abandoned: {type(exc).__name__}: {exc}")
                if self._replicas.get((name, rep.gpu)) is rep:
                    del self._replicas[(name, rep.gpu)]
                    self._claimed[rep.gpu] -= rep.claim
                rep.ready.set()
            self._cond.notify_all()

    def _restore(self, svc: _Service, reps: list[_Replica]) -> None:
        """Restore ``reps`` (placeholders this call owns): start every copy, then wait for all."""
        if not reps:
            return
        name = svc.spec.name
        started: list[tuple[_Replica, Any, Any, Any]] = []
        failure: EoeError | None = None
        for rep in reps:
            device = self.devices[rep.gpu]
            try:
                module, storage = svc.backup.restore(device, sync=False)
            except DeviceOutOfMemoryError as exc:
                failure = RestoreOutOfMemoryError(
                    f"service {name!r}: out of memory restoring {svc.backup.nbytes} bytes to "
                    f"GPU {rep.gpu}: {exc}"
                )
                failure.__cause__ = exc
                break
            except Exception as exc:
                if _is_cuda_oom(exc):
                    failure = RestoreOutOfMemoryError(
                        f"service {name!r}: CUDA out of memory restoring to GPU {rep.gpu}: {exc}"
                    )
                else:
                    failure = RestoreError(
                        f"service {name!r}: restoring to GPU {rep.gpu} failed: "
                        f"{type(exc).__name__}: {exc}"
                    )
                failure.__cause__ = exc
                break
            started.append((rep, module, storage, device.fence()))
            with self._cond:
                self._live[rep.gpu] += int(storage.numel())
            del module, storage
        for item in started:  # the copies to different GPUs ran concurrently; wait for each
            if item[3] is not None:
                item[3].synchronize()
        with self._cond:
            for item in started:
                rep = item[0]
                size = int(item[2].numel())
                if failure is None:
                    rep.module, rep.storage = item[1], item[2]
                    rep.state = _READY
                    rep.last_used = next(self._tick)
                    self._counters.restores += 1
                    self._counters.bytes_restored += size
                else:  # all or nothing: a call needs its whole cell; drop what was restored
                    self._live[rep.gpu] -= size
            if failure is None:
                self._notify(name, [r.gpu for r in reps], True)
            else:
                for rep in reps:
                    rep.error = failure
                    if self._replicas.get((name, rep.gpu)) is rep:
                        del self._replicas[(name, rep.gpu)]
                        self._claimed[rep.gpu] -= rep.claim
            for rep in reps:
                rep.ready.set()
            self._cond.notify_all()
        started.clear()
        if failure is not None:
            raise failure

    # --- execution ----------------------------------------------------------------------------

    def _execute(self, svc: _Service, cell: Cell, replicas: list[_Replica], inputs: Any) -> Any:
        spec = svc.spec
        if len(replicas) == 1:
            parts = [inputs]
        else:
            try:
                parts = spec.split_inputs(inputs, len(replicas))
            except Exception as exc:
                raise InputSplitError(
                    f"service {spec.name!r}: cannot split the inputs across {len(replicas)} "
                    f"replicas: {exc}"
                ) from exc
            if not 1 <= len(parts) <= len(replicas):
                raise InputSplitError(
                    f"service {spec.name!r}: split returned {len(parts)} parts for "
                    f"{len(replicas)} replicas"
                )
        jobs = list(zip(replicas, parts, strict=False))
        futures = [
            self._executor().submit(self._run_part, spec, rep, part) for rep, part in jobs[1:]
        ]
        results: list[Any] = []
        errors: list[BaseException] = []
        try:
            results.append(self._run_part(spec, *jobs[0]))
        except BaseException as exc:
            errors.append(exc)
        for fut in futures:
            try:
                results.append(fut.result())
            except BaseException as exc:
                errors.append(exc)
        if errors:
            raise errors[0]
        if len(results) == 1:
            return results[0]
        try:
            return spec.merge_outputs(results)
        except Exception as exc:
            raise CallFailedError(
                f"service {spec.name!r}: merging the results of {len(results)} replicas failed: "
                f"{type(exc).__name__}: {exc}"
            ) from exc

    def _run_part(self, spec: ServiceSpec, rep: _Replica, part: Any) -> Any:
        device = self.devices[rep.gpu]
        try:
            with no_grad_on(device):
                moved = map_tensors(part, lambda t: t.to(device.torch_device, non_blocking=True))
                result = spec.call(rep.module, moved)
                return map_tensors(result, lambda t: t.to("cpu"))
        except Exception as exc:
            oom = " (out of memory)" if _is_cuda_oom(exc) else ""
            raise CallFailedError(
                f"service {spec.name!r} raised {type(exc).__name__} on GPU {rep.gpu}{oom}: {exc}"
            ) from exc

    def _executor(self) -> ThreadPoolExecutor:
        with self._cond:
            if self._pool is None:
                workers = max(1, len(self.devices) * self.config.calls_per_gpu)
                self._pool = ThreadPoolExecutor(workers, thread_name_prefix="eoe-replica")
            return self._pool

    def _release(self, state: _CallState) -> None:
        with self._cond:
            tick = next(self._tick)
            for rep in state.pinned:
                rep.pins -= 1
                rep.last_used = tick
            for g in state.workspace_gpus:
                self._claimed[g] -= state.service.info.workspace_bytes
            for g in state.cell:
                self._busy[g] -= 1
            state.pinned.clear()
            state.workspace_gpus.clear()
            self._cond.notify_all()

    # --- explicit eviction --------------------------------------------------------------------

    def evict(self, service: str, gpus: Iterable[int] | None = None) -> EvictOutcome:
        """Evict ``service`` from ``gpus`` (default: everywhere) now.

        Raises ``UnknownServiceError``, or ``ServiceInUseError`` if a call is using (or
        restoring) one of those replicas; then nothing is evicted.
        """
        self._service(service)
        targets = sorted(set(range(len(self.devices)) if gpus is None else gpus))
        bad = [g for g in targets if not 0 <= g < len(self.devices)]
        if bad:
            raise ValueError(f"GPUs {bad} do not exist (this executor has {len(self.devices)})")
        start = time.perf_counter()
        freed = 0
        with contextlib.ExitStack() as stack:
            for g in targets:
                stack.enter_context(self._device_locks[g])
            with self._cond:
                reps = [
                    self._replicas[(service, g)] for g in targets if (service, g) in self._replicas
                ]
                busy = [r.gpu for r in reps if r.pins or r.state != _READY]
                if busy:
                    raise ServiceInUseError(
                        f"service {service!r} is in use on GPUs {busy}; it cannot be evicted now"
                    )
                for rep in reps:
                    del self._replicas[(service, rep.gpu)]
                self._notify(service, [r.gpu for r in reps], False)
            for rep in reps:
                freed += 0 if rep.storage is None else int(rep.storage.numel())
                self._free(rep)
        self._deliver()
        return EvictOutcome(service, tuple(r.gpu for r in reps), freed, time.perf_counter() - start)

    # --- figures and lifetime -----------------------------------------------------------------

    def stats(self) -> EoeStats:
        figures = [d.figures() for d in self.devices]
        with self._cond:
            c = self._counters
            devices = tuple(
                DeviceStats(
                    index=f.index,
                    backend=f.backend,
                    name=f.name,
                    budget_bytes=f.budget_bytes,
                    claimed_bytes=self._claimed[f.index],
                    allocated_bytes=f.allocated_bytes,
                    peak_allocated_bytes=f.peak_allocated_bytes,
                    running_calls=self._busy[f.index],
                    resident=tuple(
                        sorted(
                            r.service
                            for r in self._replicas.values()
                            if r.gpu == f.index and r.state == _READY
                        )
                    ),
                    nvml_total_bytes=f.nvml_total_bytes,
                    nvml_used_bytes=f.nvml_used_bytes,
                )
                for f in figures
            )
            return EoeStats(
                calls=c.calls,
                ok=c.ok,
                errors=c.errors,
                hits=c.hits,
                misses=c.misses,
                restores=c.restores,
                evictions=c.evictions,
                bytes_restored=c.bytes_restored,
                bytes_evicted=c.bytes_evicted,
                restore_s=c.restore_s,
                evict_s=c.evict_s,
                unverified_evictions=c.unverified_evictions,
                errors_by_type=dict(c.errors_by_type),
                devices=devices,
            )

    def close(self) -> None:
        """Stop serving: evict every idle replica and stop the replica threads."""
        with self._cond:
            self._closed = True
            self._cond.notify_all()
        for name in list(self._services):
            with contextlib.suppress(EoeError):
                self.evict(name)
        with self._cond:
            pool, self._pool = self._pool, None
        if pool is not None:
            pool.shutdown(wait=True)

    def __enter__(self) -> EoeManager:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def _drop_tracebacks(exc: BaseException) -> None:
    """Clear the traceback of ``exc`` and of every exception chained to it."""
    seen: set[int] = set()
    stack: list[BaseException | None] = [exc]
    while stack:
        e = stack.pop()
        if e is None or id(e) in seen:
            continue
        seen.add(id(e))
        e.__traceback__ = None
        stack += [e.__cause__, e.__context__]


def _is_cuda_oom(exc: BaseException) -> bool:
    try:
        import torch
    except ImportError:  # pragma: no cover
        return False
    return isinstance(exc, torch.cuda.OutOfMemoryError)
