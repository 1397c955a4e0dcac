"""The GPU executor adapter: calls of EOE services on the cell the scheduler granted.

One ``EoeManager`` serves one GPU node of the cluster (GPU indices are the node's). EOE calls
block, so they run on this adapter's thread pool; residency changes EOE reports from those
threads are handed to the runtime's callback (which moves them onto the event loop).
"""

from __future__ import annotations

import asyncio
from concurrent.futures import ThreadPoolExecutor
from typing import Any

from tangram.core.resources import GpuNodeSpec
from tangram.exec.runtime.records import ErrorInfo
from tangram.exec.runtime.result import ExecResult

#: Bytes per GB in the cluster's figures (GPU memory, model sizes): GiB, as EOE budgets are.
GB = 1 << 30


class GpuExecutor:
    """Runs GPU actions on an ``EoeManager`` (``eoe``) for the GPU node ``node``."""

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
        """The service's resident bytes per GPU, in GB, for the scheduler's restore estimate."""
        return self.eoe.info(service).resident_bytes / GB

    def dops(self, service: str) -> tuple[int, ...]:
        return tuple(self.eoe.info(service).dops)

    async def run(self, service: str, inputs: Any, gpus: tuple[int, ...]) -> ExecResult:
        loop = asyncio.get_running_loop()
        out = await loop.run_in_executor(
            self._pool, lambda: self.eoe.call(service, inputs, gpus=tuple(gpus))
        )
        detail = {"restored": list(out.restored_gpus), "evicted": len(out.evicted), "hit": out.hit}
        if out.ok:
            return ExecResult(
                "result", out.value, None, exec_s=out.exec_s, wait_s=out.queue_s, detail=detail
            )
        code = _snake(type(out.error).__name__) if out.error is not None else "exec_failed"
        return ExecResult(
            "error",
            None,
            ErrorInfo(code, out.message or "the call failed"),
            exec_s=out.exec_s,
            wait_s=out.queue_s,
            detail=detail,
        )

    def shutdown(self) -> None:
        self._pool.shutdown(wait=False, cancel_futures=True)
        self.eoe.close()


def _snake(name: str) -> str:
    """``CallFailedError`` -> ``call_failed``."""
    name = name.removesuffix("Error")
    return "".join(f"_{c.lower()}" if c.isupper() and i else c.lower() for i, c in enumerate(name))
