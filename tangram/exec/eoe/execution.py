"""Running one call on its replicas, data parallel: split the inputs, run each part on its
replica (the first in the calling thread, the others on a pool), merge the results in order.
"""

from __future__ import annotations

import contextlib
import inspect
import io
import itertools
import threading
from collections.abc import AsyncIterator, Coroutine, Iterator, Sequence
from concurrent.futures import Future, ThreadPoolExecutor, wait
from typing import TYPE_CHECKING, Any

from tangram.exec.eoe.devices import Device, is_cuda_oom, no_grad_on
from tangram.exec.eoe.errors import CallArgumentError, CallFailedError, InputSplitError, told
from tangram.exec.eoe.registry import ServiceSpec, UnmappableValueError, map_tensors

if TYPE_CHECKING:
    import torch

    from tangram.exec.eoe.bookkeeping import Replica, Service


#: What a service's own code (its call, split or merge) may raise that fails its call only:
#: SystemExit too (a sys.exit() in it), which left ``manager.call`` without an outcome and,
#: in the live runtime's thread pool, reached the event loop, which stops on it.
FAILURES: tuple[type[BaseException], ...] = (Exception, SystemExit)


class ReplicaRunner:
    """Runs calls' parts on replicas; owns the pool of replica threads (made on first use)."""

    def __init__(self, devices: Sequence[Device], workers: int) -> None:
        self._devices = devices
        self._workers = max(1, workers)
        self._lock = threading.Lock()
        self._pool: ThreadPoolExecutor | None = None
        self._closed = False

    def run(self, service: Service, replicas: Sequence[Replica], inputs: Any) -> Any:
        """The call's result: ``inputs`` split across ``replicas``, results merged; for a
        sharded service, one run of the model assembled from the cell's shards.

        ``InputSplitError`` if the inputs cannot be split; ``CallFailedError`` if a part or the
        merge raised (the first part's error when several did).
        """
        spec = service.spec
        if service.info.shards > 1:
            return self._run_sharded(service, replicas, inputs)
        parts = [inputs] if len(replicas) == 1 else self._split(spec, inputs, len(replicas))
        jobs = list(zip(replicas, parts, strict=False))
        own: ThreadPoolExecutor | None = None
        futures: list[Future[Any]] = []
        results: list[Any] = []
        errors: list[BaseException] = []
        try:
            with self._lock:  # (so close cannot shut the pool between its look-up and submits)
                if len(jobs) > 1 and self._closed:  # a call running past close: own threads
                    own = ThreadPoolExecutor(len(jobs) - 1, thread_name_prefix="eoe-replica")
                pool = own or (self._executor() if len(jobs) > 1 else None)
                for rep, part in jobs[1:]:
                    futures.append(pool.submit(self._run_part, spec, rep, part))  # type: ignore[union-attr]
            try:
                results.append(self._run_part(spec, *jobs[0]))
            except BaseException as exc:
                errors.append(exc)
            for fut in futures:
                try:
                    results.append(fut.result())
                except BaseException as exc:
                    errors.append(exc)
        finally:  # the call's pins and slots go when it ends: no part may still run then
            _settle(futures, own)
        if errors:
            raise errors[0]
        if len(results) == 1:
            return results[0]
        try:
            return spec.merge_outputs(results)
        except UnmappableValueError as exc:  # (the default merge: it names the cause)
            raise CallFailedError(
                f"service {spec.name!r}: cannot merge the results of {len(results)} replicas: {exc}"
            ) from None
        except RecursionError:  # (a merge of the service's own: was 'maximum recursion depth')
            raise CallFailedError(
                f"service {spec.name!r}: cannot merge the results of {len(results)} replicas: "
                "they hold a value that contains itself, or are nested past Python's recursion "
                "limit"
            ) from None
        except FAILURES as exc:
            raise CallFailedError(
                f"service {spec.name!r}: merging the results of {len(results)} replicas failed: "
                f"{type(exc).__name__}: {told(exc)}"
            ) from exc

    @staticmethod
    def _split(spec: ServiceSpec, inputs: Any, n: int) -> list[Any]:
        """The spec's split of ``inputs`` for ``n`` replicas: a list (or tuple, or iterator) of
        1..n parts, else ``InputSplitError`` (a generator was taken for a list outside this
        check: 'unexpected TypeError in the executor', as if the executor's own bug)."""
        try:
            parts = spec.split_inputs(inputs, n)
            if not isinstance(parts, list | tuple | Iterator):
                raise InputSplitError(
                    f"service {spec.name!r}: split returned {type(parts).__name__}, not a "
                    "list of parts"
                )
            # An iterator is read one past the most it may give: an endless one
            # (itertools.repeat) was read until the host ran out of memory, the call never
            # ending.
            sized = isinstance(parts, list | tuple)
            parts = list(parts if sized else itertools.islice(parts, n + 1))
        except InputSplitError:
            raise
        except UnmappableValueError as exc:  # (the default split: it names the cause)
            raise InputSplitError(
                f"service {spec.name!r}: cannot split the inputs across {n} replicas: {exc}"
            ) from None
        except RecursionError:  # (a split of the service's own: was 'maximum recursion depth')
            raise InputSplitError(
                f"service {spec.name!r}: cannot split the inputs across {n} replicas: they "
                "hold a value that contains itself, or are nested past Python's recursion limit"
            ) from None
        except FAILURES as exc:
            raise InputSplitError(
                f"service {spec.name!r}: cannot split the inputs across {n} replicas: "
                f"{type(exc).__name__}: {told(exc)}"
            ) from exc
        if not 1 <= len(parts) <= n:
            count = f"more than {n}" if not sized and len(parts) > n else str(len(parts))
            raise InputSplitError(
                f"service {spec.name!r}: split returned {count} parts for {n} replicas"
            )
        return parts

    def _run_sharded(self, service: Service, shards: Sequence[Replica], inputs: Any) -> Any:
        """One call on the model assembled over its shards (in GPU order: shard i on the i-th
        GPU of the cell); the inputs go to the first shard's device, the hooks do the rest."""
        ordered = sorted(shards, key=lambda r: r.gpu)
        module = service.backup.assemble([r.storage for r in ordered])
        try:
            return self._run_part(service.spec, ordered[0], inputs, module)
        finally:
            service.backup.recycle(module)

    def _run_part(
        self, spec: ServiceSpec, rep: Replica, part: Any, module: Any | None = None
    ) -> Any:
        device = self._devices[rep.gpu]
        own: Exception | None = None  # a refusal of ours, which goes out as it is
        try:
            with no_grad_on(device):
                try:
                    moved = map_tensors(part, lambda t: to_device(t, device))
                except UnmappableValueError as exc:  # (was a RecursionError the service's)
                    own = CallArgumentError(
                        f"service {spec.name!r}: the inputs cannot be moved to GPU {rep.gpu}: {exc}"
                    )
                    raise own from None
                result = spec.call(rep.module if module is None else module, moved)
            lazy = _lazy(result)
            if lazy is not None:
                own = CallFailedError(
                    f"service {spec.name!r} returned {lazy}, which would run after its call "
                    f"ended, on a replica on GPU {rep.gpu} it no longer holds: return the "
                    "values themselves (a list, not a generator)"
                )
                raise own from None
            # Copied out of inference mode: normal tensors, which a caller may change in
            # place or use in a loss, at DoP 1 as after a merge (inference tensors were not).
            with device.context():
                try:
                    return map_tensors(result, to_host)
                except UnmappableValueError as exc:
                    own = CallFailedError(
                        f"service {spec.name!r} returned a result on GPU {rep.gpu} that "
                        f"cannot be copied to the host: {exc}"
                    )
                    raise own from None
        except FAILURES as exc:
            if exc is own:
                raise
            oom = " (out of memory)" if is_cuda_oom(exc) else ""
            raise CallFailedError(
                f"service {spec.name!r} raised {type(exc).__name__} on GPU {rep.gpu}{oom}: {told(exc)}"
            ) from exc

    def _executor(self) -> ThreadPoolExecutor:
        """The pool (made on first use); the caller holds ``_lock``."""
        if self._pool is None:
            self._pool = ThreadPoolExecutor(self._workers, thread_name_prefix="eoe-replica")
        return self._pool

    def close(self) -> None:
        """Stop the replica threads (after the parts they run). A call still running then
        runs its other parts on threads of its own, gone when it returns: a pool made after
        close was never shut down."""
        with self._lock:
            pool, self._pool = self._pool, None
            self._closed = True
        if pool is not None:
            pool.shutdown(wait=True)


def _settle(futures: list[Future[Any]], own: ThreadPoolExecutor | None) -> None:
    """Wait for every part a call started, past an interrupt while waiting (re-raised once all
    have ended), then shut the call's own pool down. An interrupt before the parts were
    waited for (or while one was) ended the call with parts still running on its replicas:
    its pins and call slots were given back, so another call could run on those GPUs at once
    and an eviction could drop a replica a part still computed on."""
    interrupt: BaseException | None = None
    for fut in futures:
        while not fut.done():
            try:
                wait([fut])
            except BaseException as exc:
                interrupt = interrupt or exc
    if own is not None:
        own.shutdown(wait=True)
    if interrupt is not None:
        raise interrupt


def _lazy(result: Any) -> str | None:
    """What ``result`` is when it is work not done yet (a generator or other iterator, a
    coroutine), closed so that it never runs; None for a value. Such a result was the
    call's 'ok' value: run by the caller after the call ended, outside its GPU slot and
    pins, on a replica maybe evicted meanwhile ('Tensor on device meta'), or never run at
    all (a coroutine), and no device tensor it made was copied to the host."""
    if isinstance(result, io.IOBase) or not (  # (a file is an iterator, and a value)
        isinstance(result, Iterator | AsyncIterator | Coroutine) or inspect.isawaitable(result)
    ):
        return None
    close = getattr(result, "close", None)
    if callable(close):
        with contextlib.suppress(Exception):  # (a generator's own finally, as it is closed)
            close()
    return f"a {type(result).__name__}"


def to_device(tensor: torch.Tensor, device: Device) -> torch.Tensor:
    """The replica's own copy of an input tensor on ``device``, never the caller's tensor:
    on a CPU device ``.to`` returned it as it was, and a call that changed its inputs in
    place changed the caller's (a GPU's are copies)."""
    return tensor.to(device.torch_device, non_blocking=True, copy=True)


def to_host(tensor: torch.Tensor) -> torch.Tensor:
    """A host copy of a result tensor, never the device's memory itself: on a CPU device
    ``.to("cpu")`` returns the tensor as it is, and a result viewing the replica's weights
    kept its evicted buffer allocated for as long as the caller held it (a GPU's is a copy)."""
    return tensor.to("cpu", copy=True)
