"""The GPU executor adapter: calls of EOE services on the cell the scheduler granted.

One ``EoeManager`` serves one GPU node of the cluster (GPU indices are the node's). EOE calls
block, so they run on this adapter's thread pool; residency changes EOE reports from those
threads are handed to the runtime's callback (which moves them onto the event loop).
As the runtime's ``Executor`` for ``GpuWork``: a call may get any aligned cell up to its
``max_units`` (so its service must support every DoP from 1 up), and EOE never interrupts a
running call, so a deadline ends the action at once while the call runs on.
"""

from __future__ import annotations

import asyncio
import itertools
from concurrent.futures import ThreadPoolExecutor
from typing import Any, ClassVar

from tangram.core.cells import cell_sizes, smallest_cell_for
from tangram.core.decision import Start
from tangram.core.resources import ClusterSpec, GpuNodeSpec, ResourceKind
from tangram.exec.eoe.errors import QueueTimeoutError, RestoreOutOfMemoryError
from tangram.exec.eoe.registry import batch_problem
from tangram.exec.runtime.errors import BadRequest
from tangram.exec.runtime.executor import Admission, OnDeadline
from tangram.exec.runtime.records import ActionSpec, ErrorInfo, GpuWork
from tangram.exec.runtime.result import ExecResult
from tangram.exec.runtime.trajectories import Trajectory

#: Bytes per GB in the cluster's figures (GPU memory, model sizes): GiB, as EOE budgets are.
GB = 1 << 30


class GpuExecutor:
    """Runs GPU actions on an ``EoeManager`` (``eoe``) for the GPU node ``node``."""

    work: ClassVar[type] = GpuWork
    on_deadline: ClassVar[OnDeadline] = OnDeadline.END_NOW
    deadline_note: ClassVar[str] = "; the GPU call runs on and its result is discarded"
    cancellable: ClassVar[bool] = False

    def __init__(self, eoe: Any, node: GpuNodeSpec, *, threads: int | None = None) -> None:
        if len(eoe.devices) < node.gpus:
            raise ValueError(
                f"GPU node {node.name!r} has {node.gpus} GPUs in the cluster file but the EOE "
                f"executor manages {len(eoe.devices)} devices"
            )
        self.eoe = eoe
        self.node = node
        workers = threads or node.gpus * max(1, eoe.config.calls_per_gpu) + 4
        self._pool = ThreadPoolExecutor(workers, thread_name_prefix="tangram-gpu")

    def services(self) -> tuple[str, ...]:
        return tuple(self.eoe.services())

    def size_gb(self, service: str) -> float:
        """The model's size in GB, for the scheduler's restore estimate and cell choice: the
        bytes each replica holds, or all of a layer-sharded model's shards."""
        info = self.eoe.info(service)
        if info.parallelism == "replicas":
            return info.resident_bytes / GB
        return info.resident_bytes * info.shards / GB

    def replicas(self, service: str) -> bool:
        """True when the service runs as whole replicas, one per GPU of its cell (EOE says)."""
        return self.eoe.info(service).parallelism == "replicas"

    def dops(self, service: str) -> tuple[int, ...]:
        return tuple(self.eoe.info(service).dops)

    def splits_by_batch(self, service: str) -> bool:
        """True when the service's calls are cut along their batch for its replicas (EOE's
        default ``split_batch``), so admission can check that a batch can be cut."""
        spec = getattr(self.eoe, "spec", None)
        return spec is None or getattr(spec(service), "split", None) is None

    def admit(
        self, spec: ActionSpec, trajectory: Trajectory | None, cluster: ClusterSpec
    ) -> Admission:
        """A registered service, on cells from 1 GPU up to the largest of its DoPs (without a
        gap) within ``max_units``; a layer-sharded one on its k GPUs, which the scheduler
        grants exactly when k is the fewest GPUs whose memory holds the model."""
        work: GpuWork = spec.work  # type: ignore[assignment]  # the registry's key
        services = self.services()
        if work.service not in services:
            raise BadRequest(f"unknown GPU service {work.service!r}; registered: {list(services)}")
        home = getattr(self.eoe.info(work.service), "home", None)
        if home is not None and (self.node.gpus > 1 or home != 0):
            # The core grants any GPU of the node; EOE runs an engine on its home only.
            raise BadRequest(
                f"GPU service {work.service!r} is an engine on GPU {home} only; the scheduler "
                f"may grant any of node {self.node.name!r}'s {self.node.gpus} GPUs, so it runs "
                "through the runtime only on a node of one GPU, its home"
            )
        if not self.replicas(work.service):
            return self._admit_shards(work.service)
        dops = set(self.dops(work.service))
        usable = list(itertools.takewhile(lambda k: k in dops, cell_sizes(self.node.gpus)))
        if not usable:
            raise BadRequest(
                f"GPU service {work.service!r} supports DoPs {sorted(dops)}; the scheduler "
                "may start any cell from 1 GPU up to max_units, so it must support DoP 1"
            )
        max_units = max(k for k in usable if k <= max(spec.max_units, 1))
        if max_units > 1 and self.splits_by_batch(work.service):
            problem = batch_problem(work.inputs)
            if problem is not None:  # else it would fail on 2 GPUs and run on 1
                raise BadRequest(
                    f"the inputs of GPU service {work.service!r} cannot be cut along their "
                    f"batch: {problem}. A call that may get more than one GPU (max_units "
                    f"{spec.max_units}) is cut into one piece per GPU along dim 0 of its "
                    "tensors and lists; send max_units 1 to run it whole on one GPU"
                )
        return Admission(
            ResourceKind.GPU,
            max_units,
            size_gb=self.size_gb(work.service),
            replicas=self.replicas(work.service),
        )

    def _admit_shards(self, service: str) -> Admission:
        """A service split in k layer shards runs on cells of exactly k GPUs; the core's cells
        for a model of its size start at the fewest GPUs that hold it, so the two must agree."""
        k = self.eoe.info(service).shards
        size = self.size_gb(service)
        fewest = smallest_cell_for(size, self.node.gpu_memory_gb, self.node.gpus)
        if fewest != k:
            raise BadRequest(
                f"GPU service {service!r} is split in {k} shards, but the scheduler would grant "
                f"a model of {size:.3g} GB a cell of {fewest} GPUs of {self.node.gpu_memory_gb} "
                f"GB: it runs through the runtime only when it needs all {k}"
            )
        return Admission(ResourceKind.GPU, k, size_gb=size, replicas=False)

    async def execute(
        self, work: GpuWork, start: Start, *, trajectory: str, time_left_s: float
    ) -> ExecResult:
        """Call the service on the granted cell (EOE restores it there if needed). It waits in
        EOE's queue no longer than the action has left: a call that had not started by its
        deadline would start after it, holding its GPUs and its slot until it returned.
        One started with no time left (its start and its deadline in one event-loop
        iteration) ends at once with the time-out, without calling EOE."""
        if time_left_s <= 0:
            return _late()
        return await self.run(work.service, work.inputs, start.gpus, timeout_s=time_left_s)

    async def run(
        self,
        service: str,
        inputs: Any,
        gpus: tuple[int, ...],
        *,
        timeout_s: float | None = None,
    ) -> ExecResult:
        loop = asyncio.get_running_loop()
        return await loop.run_in_executor(
            self._pool, lambda: self.call_blocking(service, inputs, gpus, timeout_s=timeout_s)
        )

    def call_blocking(
        self,
        service: str,
        inputs: Any,
        gpus: tuple[int, ...],
        *,
        timeout_s: float | None = None,
    ) -> ExecResult:
        """``run`` on the calling thread (the node agents of ``tangram.exec.ray``);
        ``timeout_s`` bounds its wait in EOE's queue (None: none); one of 0 or less ends
        at once with the time-out: EOE would start it on a free cell after its deadline."""
        if timeout_s is not None and timeout_s <= 0:
            return _late()
        out = self.eoe.call(service, inputs, gpus=tuple(gpus), timeout_s=timeout_s)
        detail = {"restored": list(out.restored_gpus), "evicted": len(out.evicted), "hit": out.hit}
        if out.ok:
            return ExecResult(
                "result", out.value, None, exec_s=out.exec_s, wait_s=out.queue_s, detail=detail
            )
        if isinstance(out.error, QueueTimeoutError):
            # Its wait was bounded by what its action had left: the action's time-out passed
            # before the call started, as the runtime's own deadline says (whichever of the
            # two comes first, the client sees the same outcome).
            return ExecResult(
                "timeout",
                None,
                ErrorInfo("timeout", f"the time-out passed before the call started: {out.message}"),
                exec_s=out.exec_s,
                wait_s=out.queue_s,
                detail=detail,
                ran=False,  # (it never left EOE's queue)
            )
        code = _snake(type(out.error).__name__) if out.error is not None else "exec_failed"
        # A restore that ran out of memory (held outside EOE, or a real CUDA OOM) ends the
        # call before it ran: the same action may succeed under a new id once memory frees.
        retryable = isinstance(out.error, RestoreOutOfMemoryError)
        return ExecResult(
            "error",
            None,
            ErrorInfo(code, out.message or "the call failed", retryable),
            exec_s=out.exec_s,
            wait_s=out.queue_s,
            detail=detail,
        )

    def shutdown(self) -> None:
        self._pool.shutdown(wait=False, cancel_futures=True)
        self.eoe.close()


def _late() -> ExecResult:
    """The outcome of a call whose action had no time left at its start: it never ran."""
    return ExecResult(
        "timeout", error=ErrorInfo("timeout", "the time-out passed at its start"), ran=False
    )


def _snake(name: str) -> str:
    """``CallFailedError`` -> ``call_failed``."""
    name = name.removesuffix("Error")
    return "".join(f"_{c.lower()}" if c.isupper() and i else c.lower() for i, c in enumerate(name))
