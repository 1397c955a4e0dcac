"""An action whose node is lost while its call is out reports the time it was out as its
execution (as a deadline or a cancel does: ``Host._end_running``, ``_execute``), not as the
runtime's overhead. No Ray needed: a fleet whose call ends with ``NodeLost`` when told."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest

from tangram.core.decision import Start
from tangram.core.resources import ClusterSpec, CpuNodeSpec
from tangram.exec.ray import executors
from tangram.exec.ray.executors import RayCpuExecutor, RayGpuExecutor
from tangram.exec.ray.fleet import NODE_LOST, NodeLost
from tangram.exec.runtime.records import CpuWork, GpuWork
from tests.ray.test_ray_executors import CLUSTER as GPU_CLUSTER

CPU_CLUSTER = ClusterSpec(
    name="one-cpu-node", cpu_nodes=(CpuNodeSpec("c1", cores=2, numa_domains=1, memory_gb=8.0),)
)


class LosingFleet:
    """``call`` waits until the test loses the node, then raises ``NodeLost``; the clock
    moves 7 s while the call is out."""

    def __init__(self, clock: list[float]) -> None:
        self.clock = clock
        self.entered = asyncio.Event()
        self.lost = asyncio.Event()

    async def call(self, node: str, method: str, *args: Any) -> Any:
        self.entered.set()
        await self.lost.wait()
        self.clock[0] += 7.0
        raise NodeLost(node, "its agent died (test)")


@pytest.mark.parametrize("kind", ["cpu", "gpu"])
def test_a_lost_nodes_action_reports_its_time_out_there_as_execution(
    kind: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    clock = [100.0]
    monkeypatch.setattr(executors, "clock", lambda: clock[0], raising=False)

    async def main() -> Any:
        fleet = LosingFleet(clock)
        if kind == "cpu":
            ex: Any = RayCpuExecutor(fleet, CPU_CLUSTER)  # type: ignore[arg-type]
            work: Any = CpuWork(command="sleep 100")
            start = Start(0.0, None, "c1", 1, "test", cores=(0,))  # type: ignore[arg-type]
        else:
            ex = RayGpuExecutor(fleet, GPU_CLUSTER, {})  # type: ignore[arg-type]
            work = GpuWork(service="reward", inputs=[[1]])
            start = Start(0.0, None, "g1", 1, "test", gpus=(0,))  # type: ignore[arg-type]
        task = asyncio.create_task(ex.execute(work, start, trajectory="t", time_left_s=60.0))
        await asyncio.wait_for(fleet.entered.wait(), 10.0)
        fleet.lost.set()
        return await asyncio.wait_for(task, 10.0)

    result = asyncio.run(main())
    assert result.status == "error" and result.error.code == NODE_LOST
    assert result.error.retryable
    assert result.exec_s == pytest.approx(7.0)


@pytest.mark.parametrize("kind", ["cpu", "gpu"])
def test_an_action_started_on_a_node_lost_already_says_it_did_not_run(kind: str) -> None:
    """A start on a node lost already (a GPU cell its ending actions freed, used again before
    the watch fenced it) is never sent; it ended saying 'the action may not have finished
    there', as one whose call was out, though it never ran. It says it did not run, no
    execution time."""
    from tangram.exec.ray.fleet import Fleet
    from tangram.exec.ray.nodes import GpuPlan, NodeReport

    async def main() -> Any:
        fleet = Fleet()
        name = "c1" if kind == "cpu" else "g1"
        fleet.add(NodeReport(f"id-{name}", name, ((0,),), 8.0, GpuPlan(4, "cpu", 2.0)), None)
        fleet.lose(name, "its agent died (test)")
        if kind == "cpu":
            ex: Any = RayCpuExecutor(fleet, CPU_CLUSTER)
            work: Any = CpuWork(command="true")
            start = Start(0.0, None, "c1", 1, "test", cores=(0,))  # type: ignore[arg-type]
        else:
            ex = RayGpuExecutor(fleet, GPU_CLUSTER, {})
            work = GpuWork(service="reward", inputs=[[1]])
            start = Start(0.0, None, "g1", 1, "test", gpus=(0,))  # type: ignore[arg-type]
        return await ex.execute(work, start, trajectory="t", time_left_s=60.0)

    result = asyncio.run(main())
    assert result.status == "error" and result.error.code == NODE_LOST
    assert result.error.retryable and result.exec_s == 0.0
    assert "did not run" in result.error.message
    assert "may not have finished" not in result.error.message
    assert result.ran is False, "its outcome says it never started (no start time, no units)"
