"""``EoeManager``: Evict-on-Execution, the GPU resource manager of ``tangram.exec``.

Many services (reward models, teachers) share few GPUs. Each service's weights live in host
memory (``HostBackup``); a call at DoP k runs on an aligned cell of k GPUs, one data-parallel
replica per GPU. A replica missing on a GPU of the cell is restored from the backup first, after
evicting least-recently-used replicas on that GPU if memory is short; replicas stay resident
after the call. A replica in use by a call is pinned and never evicted.

Decide, then carry out. The pure planners decide: ``plan_cell`` which cell a call runs on,
``plan_room`` which replicas leave a GPU, what is restored, and whether the call must wait or
fail. This class holds the locks and waits, and carries the plans out in order: the ``Ledger``
books them, ``copying`` moves the weights, ``execution`` runs the replicas, and ``residency``
delivers the changes to the callback.

Concurrency. ``call`` blocks and is thread-safe (the live runtime calls it from a thread pool).
One condition variable guards the ledger; it is never held during copies or calls. Each
device also has a lock held from the moment memory on it is planned until the planned evictions
are freed and the restores allocated, so two threads never race for the same bytes; device
locks are taken in index order and never held while waiting, so calls cannot deadlock. A call
that cannot get room now (other calls pin what would have to go) releases everything but its
GPUs and waits; that wait counts as queueing.

Memory accounting, per device: ``claimed`` = resident replicas + replicas being evicted (until
really freed) + workspaces of running calls. Room for a restore is ``budget - claimed -
foreign``, where ``foreign`` is what the allocator reports beyond the manager's own live buffers,
its awake engines' claims and its running calls' workspaces (other processes' tensors on CUDA,
a test's allocations on CPU). After each eviction the allocator's figure must drop by the
replica's size before the restore goes on; an eviction that does not show up there is counted
in ``stats().unverified_evictions``.

Residency is reported through ``residency()`` and the optional ``on_residency_change(service,
gpus, resident)`` callback, called in the order the changes happened, outside the manager's lock.
"""

from __future__ import annotations

import contextlib
import logging
import math
import numbers
import threading
import time
from collections.abc import Iterable, Iterator
from typing import Any

from tangram.exec.eoe.bookkeeping import CallState, Replica, Service
from tangram.exec.eoe.config import EoeConfig
from tangram.exec.eoe.copying import drop_weights, start_restore, wait_for_copies
from tangram.exec.eoe.devices import Device, check_pinning, open_devices
from tangram.exec.eoe.errors import (
    CallArgumentError,
    EoeError,
    ExecutorError,
    HostMemoryError,
    ManagerClosedError,
    RestoreError,
    RestoreOutOfMemoryError,
    ServiceInUseError,
    ServiceSpecError,
    UnknownServiceError,
    shown,
    told,
)
from tangram.exec.eoe.execution import FAILURES, ReplicaRunner
from tangram.exec.eoe.ledger import Ledger, Started
from tangram.exec.eoe.loading import build_service
from tangram.exec.eoe.outcomes import call_outcome
from tangram.exec.eoe.plan_cell import Request, cells_for, check_request, choose_cell
from tangram.exec.eoe.plan_room import Verdict, eviction_targets, pin_only, plan_evict, plan_room
from tangram.exec.eoe.records import CallOutcome, EoeStats, EvictOutcome, ServiceInfo
from tangram.exec.eoe.registry import ServiceRegistry, ServiceSpec
from tangram.exec.eoe.residency import ResidencyCallback, ResidencyFeed

__all__ = ["EoeManager", "ResidencyCallback"]

log = logging.getLogger(__name__)


def _check_indices(devices: tuple[Device, ...]) -> None:
    """``ValueError`` unless device i has index i: the books are kept by place, while stats()
    and an engine's home read each device's own index (devices [1] made stats() an
    IndexError; [0, 0] showed GPU 0's books for both)."""
    odd = [d for d in devices if not isinstance(d, Device)]
    if odd:  # ('cuda:0' passed as its str.index method, named in a message about indices)
        raise ValueError(
            f"devices must be Device objects (CpuDevice, CudaDevice), got {shown(odd[0])}"
        )
    indices = [d.index for d in devices]
    if indices != list(range(len(devices))):
        raise ValueError(f"devices must be indexed 0..n-1 in order, got indices {indices[:16]}")


def _seconds(timeout_s: object) -> float:
    """``timeout_s`` as seconds (0 or more; inf: no bound), or ``CallArgumentError`` naming
    it: NaN passed every deadline check (the call waited for ever), a negative one was
    taken for a deadline passed already (a ``QueueTimeoutError``, as if the call had waited),
    and an int too large for a float was an OverflowError, reported as the executor's bug
    (it is no bound now)."""
    if isinstance(timeout_s, bool) or not isinstance(timeout_s, numbers.Real):
        raise CallArgumentError(
            f"timeout_s must be a number of seconds or None, got {shown(timeout_s)}"
        )
    try:
        seconds = float(timeout_s)
    except OverflowError:  # an int past any float: no bound (or a deadline long passed)
        seconds = math.inf if timeout_s > 0 else -math.inf
    except (ValueError, TypeError):
        seconds = math.nan
    if math.isnan(seconds) or seconds < 0:
        raise CallArgumentError(
            f"timeout_s must be a number of seconds (0 or more) or None, got {shown(timeout_s)}"
        )
    return seconds


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
        if on_residency_change is not None and not callable(on_residency_change):
            # (else every change was a TypeError logged as the callback's, none delivered)
            raise ValueError(
                f"on_residency_change must be a callable or None, got {shown(on_residency_change)}"
            )
        if self.config.pin_host_memory:  # (before the devices: nothing made to let go)
            check_pinning()
        self.devices: tuple[Device, ...] = tuple(devices or open_devices(self.config))
        _check_indices(self.devices)
        self.backend = self.devices[0].backend
        self._pin_host = (
            self.config.pin_host_memory
            if self.config.pin_host_memory is not None
            else self.backend == "cuda"
        )
        self._budgets = tuple(d.budget_bytes for d in self.devices)
        self._registry = ServiceRegistry()
        self._services: dict[str, Service] = {}
        self._host_bytes = 0
        self._feed = ResidencyFeed(on_residency_change)
        self._ledger = Ledger(len(self.devices), self._feed)
        self._cond = threading.Condition(threading.Lock())  # guards services, bytes, ledger
        self._device_locks = [threading.Lock() for _ in self.devices]
        self._runner = ReplicaRunner(self.devices, len(self.devices) * self.config.calls_per_gpu)
        self._closed = False

    @property
    def _live(self) -> list[int]:
        """The ledger's live bytes per GPU (a CUDA test pretends foreign memory is ours here)."""
        return self._ledger.live

    # --- services -----------------------------------------------------------------------------

    def register(self, spec: ServiceSpec) -> ServiceInfo:
        """Build the service on the host, back it up, and make it callable.

        Raises ``DuplicateServiceError``, ``DopNotSupportedError`` (no DoP of the service fits
        this executor's GPUs), ``InvalidCellError`` (an engine's home GPU is not one of this
        executor's), ``ServiceSpecError`` (factory failed, memory_bytes below the
        measured size), ``ServiceTooLargeError`` (no GPU of this executor could hold
        one replica plus workspace) or ``HostMemoryError``.
        """
        self._check_open()
        if not isinstance(spec, ServiceSpec):  # (its name was read first: an AttributeError)
            raise ServiceSpecError(f"expected a ServiceSpec, got {type(spec).__name__}")
        with self._cond:
            self._drop_stale_name(spec.name)
            if spec.name in self._registry:
                self._registry.add(spec)  # raises DuplicateServiceError with the message
        reserved = 0

        def admit(size: int) -> None:
            # Checked (and the bytes reserved) once the backup's size is known, before its
            # buffer is allocated and its weights copied or read: an over-budget model is
            # refused without being loaded into host memory.
            nonlocal reserved
            with self._cond:
                limit = self.config.host_memory_bytes
                if limit is not None and self._host_bytes + size > limit:
                    raise HostMemoryError(
                        f"service {spec.name!r}: its host backup of {size} bytes would bring "
                        f"the backups to {self._host_bytes + size} bytes, over the host "
                        f"budget of {limit} bytes"
                    )
                # (One line: reserved, then recorded on the next, an interrupt in between
                # kept the bytes reserved for good.)
                self._host_bytes, reserved = self._host_bytes + size, size

        svc: Service | None = None
        try:
            svc = build_service(spec, pin=self._pin_host, budgets=self._budgets, admit=admit)
            with self._cond:
                self._check_open()  # closed while it was built: nothing would ever free it
                self._drop_stale_name(spec.name)
                self._registry.add(spec)  # DuplicateServiceError if registered meanwhile
                self._services[spec.name] = svc
        except BaseException:
            with self._cond:
                self._undo_register(spec, svc, reserved)
            raise
        return svc.info

    def _drop_stale_name(self, name: str) -> None:
        """(Under the condition, where a spec is in the registry only with its service.)
        Forget ``name`` in the registry when no service goes with it: the leftover of an
        unregister (or an undone register) that an interrupt (a KeyboardInterrupt) cut short
        inside the registry's own remove. The name was a DuplicateServiceError to register
        and an UnknownServiceError to call, for good."""
        if name not in self._services and name in self._registry:
            self._registry.remove(name)

    def _undo_register(self, spec: ServiceSpec, svc: Service | None, reserved: int) -> None:
        """(Under the condition.) Undo a register that failed or was interrupted: its host
        bytes go back, and its spec, if the registry took it without its service (an
        interrupt in between left the name registered without a service for good). One
        registered all the same (an interrupt as the lock was let go) stays, with its bytes."""
        if svc is not None and self._services.get(spec.name) is svc:
            return
        self._host_bytes -= reserved
        name = spec.name
        if (
            name not in self._services
            and name in self._registry
            and self._registry.get(name) is spec
        ):
            self._registry.remove(name)

    def unregister(self, service: str) -> None:
        """Evict the service everywhere and forget it (``ServiceInUseError`` if a call uses it).

        Forgets the service it evicted only: one unregistered (maybe registered anew) by
        someone else meanwhile is ``UnknownServiceError``, and what is under the name stays.
        """
        svc = self._service(service)
        self.evict(service)
        with self._cond:
            if self._services.get(service) is not svc:
                raise UnknownServiceError(
                    f"service {service!r} was unregistered by another caller meanwhile"
                )
            if self._ledger.has_replicas(service):
                raise ServiceInUseError(
                    f"service {service!r} was restored again while unregistering"
                )
            # The service and its bytes go on one line, its spec after it, whatever comes
            # in between (on three lines, an interrupt left halves: a name registered
            # without its service, or bytes reserved for no service, for good).
            try:
                self._host_bytes -= self._services.pop(service).backup.nbytes
            finally:
                if service not in self._services and service in self._registry:
                    self._registry.remove(service)

    def services(self) -> tuple[str, ...]:
        """The registered services' names, sorted (those with a service: a name an
        interrupted unregister left in the registry alone is none)."""
        with self._cond:
            return tuple(sorted(self._services))

    def info(self, service: str) -> ServiceInfo:
        return self._service(service).info

    def spec(self, service: str) -> ServiceSpec:
        """The registered spec of ``service`` (``UnknownServiceError`` naming the known ones)."""
        return self._service(service).spec

    def _service(self, name: str) -> Service:
        """The registered service ``name``; ``UnknownServiceError`` naming what is wrong (a
        name that is no string could not even be looked up: a list was an unhashable
        TypeError, reported as the executor's own bug)."""
        if not isinstance(name, str):
            raise UnknownServiceError(
                f"a service is named by a string, got {type(name).__name__} {shown(name)}"
            )
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
            return self._ledger.residency()

    def lru_order(self, gpu: int) -> tuple[str, ...]:
        """Services resident on ``gpu``, least recently used first (the eviction order).

        ``ValueError`` for a GPU this executor lacks (it was an empty order, as if idle)."""
        n = len(self.devices)
        if isinstance(gpu, bool) or not isinstance(gpu, numbers.Integral) or not 0 <= gpu < n:
            raise ValueError(
                f"GPU {shown(gpu)} is no GPU index of this executor: this executor has {n}"
            )
        with self._cond:
            return self._ledger.lru_order(int(gpu))

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
        state: CallState | None = None
        value: Any = None
        error: EoeError | None = None
        try:
            self._check_open()
            svc = self._service(service)
            request = check_request(svc.info, dop, gpus, self._budgets)
            dop = request.dop
            deadline = None if timeout_s is None else start + _seconds(timeout_s)
            state = CallState(svc, deadline=deadline)
            value = self._run(state, request, inputs)
        except EoeError as exc:
            error = exc
        except Exception as exc:  # a bug of ours or of torch: still one outcome for the call
            log.exception("EOE call of %r failed unexpectedly", service)
            error = ExecutorError(f"unexpected {type(exc).__name__} in the executor: {told(exc)}")
            error.__cause__ = exc
        finally:
            self._feed.deliver()
        outcome = call_outcome(service, dop, state, value if error is None else None, error, start)
        with self._cond:
            self._ledger.count(outcome)
        return outcome

    def _run(self, state: CallState, request: Request, inputs: Any) -> Any:
        """Admit the call to a cell, make its replicas resident and pinned, run it, release.

        Admitted inside the try whose finally releases: admitted before it, an interrupt
        once the slots were taken (in _admit's finally, or before the try began) kept them
        for good, and those GPUs ran no call again. (A call never admitted releases
        nothing.)"""
        try:
            self._admit(state, request)
            replicas = self._prepare(state)
            with self._engine_turn(state):
                t0 = time.perf_counter()
                try:
                    return self._runner.run(state.service, replicas, inputs)
                finally:  # a call that raised ran too: its time is its exec_s
                    state.exec_s = time.perf_counter() - t0
        finally:
            with self._cond:
                try:
                    self._ledger.release(state)
                finally:  # (past an interrupt giving them back: what is left goes)
                    self._ledger.release(state)
                self._cond.notify_all()
                closed = self._closed
            if closed:  # close() evicted the idle replicas, not this call's: they go now
                with contextlib.suppress(EoeError):  # (another call still uses them)
                    self.evict(state.service.info.name)

    @contextlib.contextmanager
    def _engine_turn(self, state: CallState) -> Iterator[None]:
        """For an engine service, hold its engine's turn while the call runs: calls of one
        engine run one at a time (vLLM's ``LLM`` is not thread-safe, and with calls_per_gpu
        > 1 two calls pinning its one replica ran on it at once). The wait keeps the call's
        deadline and counts as queueing; other services need no turn.

        The turn is taken inside the try whose finally gives it back, its acquire's result
        recorded on the acquire's own line: taken before that try, an interrupt in between
        (at the loop's test, or counting the wait) kept it for good, and no later call of
        that engine ran."""
        turn = getattr(state.service.backup, "turn", None)
        if turn is None:
            yield
            return
        taken = False
        try:
            t0 = time.perf_counter()
            try:
                taken = turn.acquire(blocking=False)  # free: no wait, whatever the deadline
                while not taken:
                    taken = turn.acquire(timeout=state.wait_s("its engine"))
            finally:
                state.queue_s += time.perf_counter() - t0
            yield
        finally:
            if taken:
                turn.release()

    def _check_open(self) -> None:
        if self._closed:
            raise ManagerClosedError("the EOE manager is closed")

    def _check_registered(self, svc: Service) -> None:
        """(Under the condition.) ``UnknownServiceError`` when ``svc`` is no longer the
        registered service of its name: unregistered (maybe replaced) while the call waited,
        so nothing of it may be restored or pinned."""
        if self._services.get(svc.info.name) is not svc:
            raise UnknownServiceError(
                f"service {svc.info.name!r} was unregistered while the call waited"
            )

    def _admit(self, state: CallState, request: Request) -> None:
        """Wait until the cell (given, or the best one free) has a free call slot on each GPU."""
        info = state.service.info
        given = request.cell is not None
        cells = cells_for(info, request, self._budgets)
        limit = self.config.calls_per_gpu
        t0 = time.perf_counter()
        try:
            with self._cond:
                while True:
                    self._check_open()
                    self._check_registered(state.service)
                    load = self._ledger.load(self._budgets, limit)
                    held = () if given else self._ledger.held(info.name)
                    choice = choose_cell(cells, load, held=held, need=info.need_bytes, given=given)
                    if choice is not None:
                        break
                    self._cond.wait(state.wait_s("free GPUs"))
                self._ledger.take_slots(state, choice.cell)
        finally:  # a time-out (or a close) ends the wait too: it still counts as queueing
            state.queue_s += time.perf_counter() - t0

    def _prepare(self, state: CallState) -> list[Replica]:
        """Make the service resident on every GPU of the cell and pin it there."""
        info = state.service.info
        while True:
            with self._cond:
                self._check_open()
                self._check_registered(state.service)
                if pin_only(info.name, state.cell, self._ledger.replicas, info.workspace_bytes):
                    self._ledger.pin(state)  # resident (or being restored) everywhere
                    break
            if self._make_room(state):
                break
        return self._await_restores(state)

    def _await_restores(self, state: CallState) -> list[Replica]:
        """The pinned replicas once ready, after waiting for restores that other calls run."""
        for rep in state.pinned:
            if not rep.settled.is_set():
                state.waited_for_restore = True
                t0 = time.perf_counter()
                try:
                    while not rep.settled.wait(state.wait_s("a concurrent restore")):
                        pass
                finally:  # a time-out ends the wait too: it still counts as queueing
                    state.queue_s += time.perf_counter() - t0
            if rep.error is not None:
                # Of the restore's own kind: a lack of memory is RestoreOutOfMemoryError for
                # every call that waited for it (the call did not run; the runtime retries it),
                # not only for the one that ran the restore.
                kind = (
                    RestoreOutOfMemoryError
                    if isinstance(rep.error, RestoreOutOfMemoryError)
                    else RestoreError
                )
                raise kind(
                    f"service {rep.service!r}: a concurrent restore on GPU {rep.gpu} failed: "
                    f"{rep.error}"
                )
        return list(state.pinned)

    # --- memory: plan, book, evict, restore ---------------------------------------------------

    def _make_room(self, state: CallState) -> bool:
        """One attempt under the cell's device locks: plan, book, evict and restore as planned.

        False means the plan said wait: the locks were released and the call waited; retry.
        """
        info = state.service.info
        victims: list[Replica] = []  # (filled as the plan is booked: an interrupt booking
        placeholders: list[Replica] = []  # it, or after, undoes what is listed)
        with contextlib.ExitStack() as stack:
            self._lock_cell(state, stack)
            try:
                with self._cond:
                    self._check_open()
                    self._check_registered(state.service)
                    plan = plan_room(
                        info.name,
                        state.cell,
                        self._ledger.replicas,
                        self._ledger.memory(state.cell, self.devices, self._budgets),
                        resident_bytes=info.resident_bytes,
                        workspace_bytes=info.workspace_bytes,
                    )
                    if plan.verdict is Verdict.NEVER:
                        raise RestoreOutOfMemoryError(plan.reason)
                    if plan.verdict is Verdict.WAIT:
                        t0 = time.perf_counter()
                        stack.close()  # release the device locks before waiting
                        try:
                            self._cond.wait(state.wait_s("memory"))
                        finally:
                            state.queue_s += time.perf_counter() - t0
                        return False
                    self._ledger.book(state, plan, victims, placeholders)
                self._carry_out(state, victims, placeholders)
            except BaseException as exc:  # (an interrupt before _carry_out's own try too)
                self._undo(victims, placeholders, exc)
                raise
        return True

    def _lock_cell(self, state: CallState, stack: contextlib.ExitStack) -> None:
        """Take the device locks of the call's cell (in index order, released by ``stack``).

        Another call restoring or evicting on a GPU of the cell (calls_per_gpu > 1) holds its
        lock for as long as that takes: the wait keeps the call's deadline
        (``QueueTimeoutError``) and counts as queueing, as every other wait for memory does.

        The release is on ``stack`` before any lock is taken, and each acquire's result is
        recorded on the acquire's own line: a lock taken and then handed to ``stack`` on a later line
        stayed held for good when an interrupt came in between, and every later call needing
        memory on that GPU (and its eviction) waited on it for ever.
        """
        held: dict[int, bool] = {}
        stack.callback(self._release_held, held)
        t0 = time.perf_counter()
        try:
            for g in state.cell:  # the cell is sorted: locks are taken in index order
                lock = self._device_locks[g]
                held[g] = lock.acquire(blocking=False)  # free: no wait, whatever the deadline
                while not held[g]:
                    held[g] = lock.acquire(timeout=state.wait_s("memory"))
        finally:
            state.queue_s += time.perf_counter() - t0

    def _release_held(self, held: dict[int, bool]) -> None:
        """Release the device locks ``held`` marks as taken, each once (its mark cleared on
        the line releasing it), past an interrupt releasing one."""
        try:
            for g in sorted(held, reverse=True):
                if held[g]:
                    held[g] = self._device_locks[g].release() is not None  # False: released
        finally:
            for g in held:
                if held[g]:
                    held[g] = self._device_locks[g].release() is not None

    def _carry_out(
        self, state: CallState, victims: list[Replica], placeholders: list[Replica]
    ) -> None:
        """Free the evictees, then restore the placeholders (the caller holds the device locks).

        ``victims`` is emptied as they are freed; on any failure or interrupt, ``_undo``
        frees those left (they had left the books: an interrupt before they were freed kept
        their bytes claimed for good, and calls waited for memory nothing would free)."""
        restored = False
        t0 = time.perf_counter()
        try:
            state.evict_s += self._free_all(victims)
            t0 = time.perf_counter()
            self._restore(state.service, placeholders)
            restored = True
        except BaseException as exc:
            self._undo(victims, placeholders, exc)
            raise
        finally:
            elapsed = time.perf_counter() - t0
            state.restore_s += elapsed
            state.restored.extend(r.gpu for r in placeholders if r.error is None)
            if placeholders:
                with self._cond:
                    self._ledger.restore_time(elapsed, completed=restored)

    def _undo(
        self, victims: list[Replica], placeholders: list[Replica], exc: BaseException
    ) -> None:
        """After a failure carrying out a plan: free the evictees not freed yet, abandon the
        placeholders not settled, and put an engine woken for them back to sleep (all
        idempotent: called again on the way out, it does nothing)."""
        try:
            self._free_all(victims)
        finally:
            with self._cond:
                self._ledger.abandon(placeholders, exc)
                self._cond.notify_all()
            svc = self._services.get(placeholders[0].service) if placeholders else None
            if svc is not None:  # (an engine woken for the failed restore sleeps again)
                self._sleep_if_unused(svc)

    def _restore(self, svc: Service, reps: list[Replica]) -> None:
        """Restore ``reps`` (placeholders this call owns): start every copy, then wait for all.

        All or nothing, on every path: an interrupt (a KeyboardInterrupt, no Exception) on the
        way is booked as a failed restore, what was copied let go, and then re-raised (the
        bytes allocated stayed counted as the manager's own for good, hiding as much foreign
        memory from every later plan on that GPU)."""
        if not reps:
            return
        started: list[Started] = []
        try:
            failure = self._start_copies(svc, reps, started)
            failure = self._wait_copies(svc, started, failure)
        except BaseException as exc:
            failure = RestoreError(
                f"service {svc.spec.name!r}: restore interrupted by {type(exc).__name__}"
            )
            self._restores_done(reps, started, failure)
            raise
        self._restores_done(reps, started, failure)
        if failure is not None:
            raise failure

    def _sleep_if_unused(self, svc: Service) -> None:
        """Put ``svc``'s engine back to sleep when it is awake with no replica booked: it woke
        for a restore that then failed (an interrupt after its wake-up, or its wake-up raised
        partway: ``EngineBackup.restore`` marks it awake then), or an eviction's
        sleep was interrupted. Its memory stayed allocated outside every claim (foreign to
        every later plan on its GPU) until its next restore. The caller holds the engine's
        GPU's device lock, so no restore or eviction of it runs meanwhile. A sleep that
        fails is logged (the call's own error goes out)."""
        backup = svc.backup
        if not getattr(backup, "awake", False):  # (a HostBackup has no engine)
            return
        with self._cond:
            if self._ledger.has_replicas(svc.info.name):
                return
        try:
            backup.recycle(None)
        except FAILURES:
            log.exception("putting the engine of %r back to sleep raised", svc.info.name)

    def _start_copies(
        self, svc: Service, reps: list[Replica], started: list[Started]
    ) -> EoeError | None:
        """Start the copy of each of ``reps`` in turn, appending each to ``started``; the
        first failure stops it and is returned.

        Nothing is booked here: the bytes are booked live when the restore is done
        (``Ledger.restores_done``), with the replica. Booked here and then listed, an
        interrupt between the two left them booked live for good, hiding as much foreign
        memory from every later plan on that GPU; a copy not listed yet is let go with the
        interrupt's frames. (No plan reads these GPUs' memory meanwhile: the restoring call
        holds their device locks.)"""
        for rep in reps:
            try:
                shard = rep.gpu % svc.info.shards if svc.info.shards > 1 else None
                module, storage, fence = start_restore(
                    svc.spec.name, svc.backup, self.devices[rep.gpu], rep.gpu, shard
                )
            except EoeError as exc:
                return exc
            started.append((rep, module, storage, fence))
            del module, storage
        return None

    def _wait_copies(
        self, svc: Service, started: list[Started], failure: EoeError | None
    ) -> EoeError | None:
        """Wait for the copies started (they ran concurrently); the restore's failure, if any."""
        try:
            wait_for_copies(fence for *_, fence in started)
        except Exception as exc:  # (a CUDA error surfaces at the synchronize)
            return failure or RestoreError(
                f"service {svc.spec.name!r}: waiting for its copies failed: "
                f"{type(exc).__name__}: {told(exc)}"
            )
        return failure

    def _restores_done(
        self, reps: list[Replica], started: list[Started], failure: EoeError | None
    ) -> None:
        """Book the restore's end (all or nothing) and wake the calls waiting for it."""
        with self._cond:
            self._ledger.restores_done(reps, started, failure)
            self._cond.notify_all()
        started.clear()  # on a failure, this lets go of what was copied

    def _free(self, victim: Replica) -> float:
        """Drop an evicted replica's weights and unbook it; the caller holds its device lock.

        Returns the seconds it took (0 for a replica unbooked already).
        """
        if victim.unbooked:
            return 0.0
        t0 = time.perf_counter()
        if victim.dropped is None:
            victim.dropped = victim.nbytes
        svc = self._services.get(victim.service)
        backup = None if svc is None else svc.backup
        interrupt: BaseException | None = None
        device = self.devices[victim.gpu]
        before = device.allocated_bytes()
        try:
            _, freed = drop_weights(victim, device, backup)
            size = victim.dropped or 0
        except BaseException as exc:
            # (An engine's sleep that raised or exited, or an interrupt.) The replica has
            # left the books: its claim must go too, or it stays booked for ever and calls
            # wait for bytes nothing frees. Whatever the drop left allocated shows up as
            # foreign memory in later plans. An interrupt (no failure of the service's own
            # code, see FAILURES) is re-raised once the books are right.
            log.exception("dropping %r from GPU %d raised", victim.service, victim.gpu)
            victim.module = victim.storage = None
            # What the allocator saw go (taken as 0, a drop whose memory did go, as after an
            # interrupted one now, was counted an unverified eviction and logged as a leak).
            size, freed = victim.dropped or 0, max(0, before - device.allocated_bytes())
            interrupt = None if isinstance(exc, FAILURES) else exc
        elapsed = time.perf_counter() - t0
        with self._cond:
            self._ledger.freed(victim, size, freed, elapsed)
            self._cond.notify_all()
        if interrupt is not None:
            if svc is not None:  # (an engine's sleep it cut short is tried once more)
                self._sleep_if_unused(svc)
            raise interrupt
        return elapsed

    def _free_all(self, victims: list[Replica]) -> float:
        """``_free`` each of ``victims`` (taken out of the books already), past an interrupt
        freeing one: the others' bytes stayed claimed for good. Each leaves ``victims`` once
        unbooked, so a second pass frees only what is left; one an interrupt kept from being
        unbooked at all (it landed before ``_free`` booked it: it was skipped, its bytes
        claimed for good) is tried once more. The first interrupt is re-raised once all are
        freed. Returns the seconds it took."""
        total = 0.0
        interrupt: BaseException | None = None
        tries = 0
        while victims:
            victim = victims[0]
            tries += 1
            try:
                total += self._free(victim)
            except BaseException as exc:
                interrupt = interrupt or exc
            finally:
                if victim.unbooked or tries >= 2:
                    del victims[0]
                    tries = 0
        if interrupt is not None:
            raise interrupt
        return total

    # --- explicit eviction --------------------------------------------------------------------

    def evict(self, service: str, gpus: Iterable[int] | None = None) -> EvictOutcome:
        """Evict ``service`` from ``gpus`` (default: everywhere) now.

        Raises ``UnknownServiceError``, or ``ServiceInUseError`` if a call is using (or
        restoring) one of those replicas; then nothing is evicted.
        """
        self._service(service)
        targets = eviction_targets(gpus, len(self.devices))
        start = time.perf_counter()
        reps: list[Replica] = []
        try:
            with contextlib.ExitStack() as stack:
                for g in targets:
                    stack.enter_context(self._device_locks[g])
                try:
                    with self._cond:
                        plan = plan_evict(service, targets, self._ledger.replicas)
                        if plan.busy:
                            raise ServiceInUseError(plan.reason)
                        self._ledger.take_out(plan.evict, reps)
                    freed = sum(rep.moved(rep.nbytes) for rep in reps)
                    self._free_all(list(reps))
                except BaseException:  # an interrupt once they were taken out: free them
                    self._free_all(list(reps))  # (those freed already are left as they are)
                    raise
        finally:  # an interrupt freeing them: the replicas left the residency all the same
            self._feed.deliver()
        return EvictOutcome(service, tuple(r.gpu for r in reps), freed, time.perf_counter() - start)

    # --- figures and lifetime -----------------------------------------------------------------

    def stats(self) -> EoeStats:
        figures = [d.figures() for d in self.devices]
        with self._cond:
            return self._ledger.stats(figures)

    def close(self) -> None:
        """Stop serving: evict every idle replica (those calls still use go as the calls
        end) and stop the replica threads."""
        with self._cond:
            self._closed = True
            self._cond.notify_all()
        for name in list(self._services):
            with contextlib.suppress(EoeError):
                self.evict(name)
        self._runner.close()

    def __enter__(self) -> EoeManager:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
