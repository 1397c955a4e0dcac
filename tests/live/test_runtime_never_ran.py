"""An action the core started whose executor then did not run it: its deadline passed while it
waited in the executor (AOE: for its trajectory's previous action or its cores; EOE: for its
cell in the queue). Its outcome says it never started (no start time, no units), as one that
timed out in the core's queue does: it said it had started, so ``/run_code`` answered
``TimeLimitExceeded`` (the program blamed, SandboxFusion's client does not retry) and the
OpenAI-style routes ``x-should-retry: false`` ('it started and is not run again') for work
that never ran. No Docker, no torch."""

from __future__ import annotations

import asyncio
from types import SimpleNamespace
from typing import Any

from tangram.core.resources import GpuNodeSpec
from tangram.exec.aoe import ActionOutcome
from tangram.exec.eoe.errors import QueueTimeoutError
from tangram.exec.runtime import ActionSpec, CpuExecutor, CpuWork, Runtime, RuntimeConfig
from tangram.exec.runtime.gpu import GpuExecutor
from tangram.exec.service.sandbox_fusion import ANSWERS
from tests.live.test_service_ids import CLUSTER, NODE, FakeAoe

LATE = (
    "timed out before it started: its deadline passed while it waited 0.300 s for its "
    "trajectory's previous action or its cores; nothing ran"
)


class LateAoe(FakeAoe):
    """AOE whose actions all come back 'late': their deadline passed before they could start."""

    def run_action(self, traj: str, command: Any, cores: tuple[int, ...], **kw: Any) -> Any:
        self.runs.append((traj, command, kw))
        timings = {"queue_s": 0.3, "total_s": 0.3, "overhead_s": 0.0}
        return ActionOutcome(traj, kw["action_id"], "timeout", None, b"", b"", LATE, (), 0, timings)


def test_a_cpu_action_aoe_did_not_start_before_its_deadline_never_started() -> None:
    async def main() -> Any:
        rt = Runtime(CLUSTER, RuntimeConfig(), cpu=CpuExecutor(LateAoe(), NODE))
        async with rt:
            await rt.open_trajectory("t", memory_gb=1.0)
            return await rt.run(ActionSpec(CpuWork("sleep 100"), trajectory="t", timeout_s=5))

    out = asyncio.run(main())
    assert out.status == "timeout" and out.error is not None and "nothing ran" in out.error.message
    assert out.start_s is None and out.units is None and out.cores == (), out
    assert out.timings.exec_s == 0.0 and out.timings.queue_s == out.timings.act_s, out.timings
    answer = ANSWERS["timeout"](out, 5.0)
    assert answer["status"] == "SandboxError", answer  # (a retry is safe: it never ran)


def test_a_real_time_out_of_a_running_command_still_started() -> None:
    class KilledAoe(FakeAoe):
        def run_action(self, traj: str, command: Any, cores: tuple[int, ...], **kw: Any) -> Any:
            timings = {"queue_s": 0.0, "exec_s": 0.2, "total_s": 0.2, "overhead_s": 0.0}
            error = "timed out after 0.2 s"
            return ActionOutcome(
                traj, kw["action_id"], "timeout", 124, b"x", b"", error, cores, 1, timings
            )

    async def main() -> Any:
        rt = Runtime(CLUSTER, RuntimeConfig(), cpu=CpuExecutor(KilledAoe(), NODE))
        async with rt:
            await rt.open_trajectory("t", memory_gb=1.0)
            return await rt.run(ActionSpec(CpuWork("sleep 100"), trajectory="t", timeout_s=5))

    out = asyncio.run(main())
    assert out.status == "timeout" and out.start_s is not None and out.units == 1, out


def test_a_gpu_call_whose_deadline_passed_in_eoe_s_queue_never_ran() -> None:
    """EOE's ``QueueTimeoutError``: the call waited for its cell past the action's time left."""
    out = SimpleNamespace(
        ok=False,
        error=QueueTimeoutError("waited 2 s"),
        message="waited 2 s for GPUs",
        exec_s=0.0,
        queue_s=2.0,
        restored_gpus=(),
        evicted=(),
        hit=False,
        value=None,
    )
    eoe = SimpleNamespace(
        devices=(0, 1), config=SimpleNamespace(calls_per_gpu=1), call=lambda *a, **kw: out
    )
    node = GpuNodeSpec("g", gpus=2, gpu_memory_gb=2.0, host_memory_gb=8.0)
    gpu = GpuExecutor(eoe, node)
    try:
        result = gpu.call_blocking("reward", [1], (0,), timeout_s=2.0)
    finally:
        gpu._pool.shutdown()
    assert result.status == "timeout" and result.ran is False, result
