"""A lost node's capacity is fenced in the core at the loss (``Scheduler.fence_node``): the
cells its running calls free as they end and the memory a failed open there gives back go to
the fence in the same step, so the queued work waits for (and goes to) a node alive. Before,
the Ray layer fenced them only at its next check: the core's pass in the step the lost
node's calls ended started the queued GPU calls on the lost node's cells (never sent, each
ending ``node_lost``) while the other node was healthy, and an open waiting for room was
placed on the memory a failed open there gave back (and failed ``node_lost``).

No Ray cluster: the agents are stand-ins (a call's answer is a future the test settles, as a
Ray ObjectRef's); the fleet, membership, executors, runtime and core are real. Every wait is
bounded (``asyncio.wait_for``, loops of at most a few hundred turns)."""

from __future__ import annotations

import asyncio
import concurrent.futures
from types import SimpleNamespace
from typing import Any

from tangram.core.resources import ApiEndpointSpec, ClusterSpec, CpuNodeSpec, GpuNodeSpec
from tangram.exec.ray.config import RayConfig
from tangram.exec.ray.executors import RayCpuExecutor, RayGpuExecutor
from tangram.exec.ray.fleet import NODE_LOST
from tangram.exec.ray.membership import Membership
from tangram.exec.runtime import RuntimeConfig
from tangram.exec.runtime.api import ApiExecutor
from tangram.exec.runtime.records import ActionSpec, GpuWork
from tangram.exec.runtime.result import ExecResult
from tangram.exec.runtime.runtime import Runtime
from tests.ray.test_ray_membership import CATALOG, Agent, report

GPUS = ClusterSpec(
    "two-gpu",
    gpu_nodes=tuple(
        GpuNodeSpec(n, gpus=2, gpu_memory_gb=2.0, host_memory_gb=8.0) for n in ("a", "b")
    ),
    apis=(ApiEndpointSpec("echo", 4),),
)
CPUS = ClusterSpec(
    "two-cpu",
    cpu_nodes=tuple(CpuNodeSpec(n, cores=1, numa_domains=1, memory_gb=8.0) for n in ("a", "b")),
    apis=(ApiEndpointSpec("echo", 4),),
)


def pending() -> tuple[Any, concurrent.futures.Future[Any]]:
    """A Ray call's stand-in (``.future()``) and the future the test settles."""
    answer: concurrent.futures.Future[Any] = concurrent.futures.Future()
    return SimpleNamespace(future=lambda: answer), answer


class GpuAgent(Agent):
    """An agent whose GPU calls answer when the test says (``out``: one future per call)."""

    def __init__(self) -> None:
        super().__init__()
        self.out: list[concurrent.futures.Future[Any]] = []

        def call_gpu(service: str, inputs: Any, gpus: tuple[int, ...], left: float) -> Any:
            ref, answer = pending()
            self.out.append(answer)
            return ref

        self.call_gpu = SimpleNamespace(remote=call_gpu)

    def answer_all(self) -> int:
        """Answer every call out now; how many."""
        waiting = [f for f in self.out if not f.done()]
        for f in waiting:
            f.set_result((ExecResult("result", value=[0.5], exec_s=0.01), {}, None))
        return len(waiting)


async def turns_until(predicate: Any, what: str, turns: int = 500) -> None:
    """Let the loop run (0.01 s a turn, at most ``turns``) until ``predicate()`` holds."""
    for _ in range(turns):
        if predicate():
            return
        await asyncio.sleep(0.01)
    raise AssertionError(f"{what}: not within {turns} turns")


def test_queued_gpu_calls_go_to_the_healthy_node_after_a_node_loss() -> None:
    """2 nodes x 2 GPUs, 8 one-GPU calls: 4 run (2 on each node), 4 wait; node a is lost.
    Its 2 running calls end ``node_lost``; the 4 queued ones run on b (before: all 4 were
    started on a's freed cells in that same step and ended ``node_lost``, b healthy)."""

    async def go() -> None:
        members = Membership(RayConfig(direct_calls=False), owner=None)
        gpu = RayGpuExecutor(members.fleet, GPUS, CATALOG)
        rt = Runtime(GPUS, RuntimeConfig(), gpu=gpu, api=ApiExecutor({}))  # type: ignore[arg-type]
        gpu.scheduler = rt.scheduler
        members.runtime = rt
        agents = {n: GpuAgent() for n in ("a", "b")}
        for name, agent in agents.items():
            members.fleet.add(report(f"id-{name}", name, 0, 8.0, gpus=2), agent)
        await rt.start()
        try:
            ids = [
                await rt.submit(ActionSpec(GpuWork("reward", [[k]]), id=f"g{k}")) for k in range(8)
            ]
            await turns_until(
                lambda: len(agents["a"].out) == 2 and len(agents["b"].out) == 2, "4 calls out"
            )
            members.fleet.lose("a", "its agent died (test)")
            for _ in range(3):  # b's calls end in rounds of 2: the queued ones go there
                await turns_until(lambda: any(not f.done() for f in agents["b"].out), "b busy")
                agents["b"].answer_all()
            outs = [await asyncio.wait_for(rt.result(i, wait_s=5.0), 10.0) for i in ids]
            await asyncio.wait_for(asyncio.gather(*members._tasks), 5.0)  # the evacuation
            lost = [o for o in outs if o is not None and not o.ok]
            ran = [o for o in outs if o is not None and o.ok]
            assert len(lost) == 2 and {o.node for o in lost} == {"a"}, lost
            assert all(o.error is not None and o.error.code == NODE_LOST for o in lost)
            assert all("may not have finished" in o.error.message for o in lost)  # (were out)
            assert len(ran) == 6 and {o.node for o in ran} == {"b"}, outs
            assert len(agents["a"].out) == 2  # nothing else was sent to (or started on) a
            assert rt.scheduler.state.gpu["a"].owner == ["~lost~a", "~lost~a"]
            assert members.nodes_doc()["a"]["fenced"] is True
        finally:
            await rt.close()

    asyncio.run(go())


def done(value: Any) -> Any:
    ref, answer = pending()
    answer.set_result(value)
    return ref


class SlowOpens(Agent):
    """An agent whose container opens answer when the test says (``opens``)."""

    def __init__(self) -> None:
        super().__init__()
        self.opens: list[concurrent.futures.Future[Any]] = []

        def open_(traj: str, *args: Any) -> Any:
            ref, answer = pending()
            self.opens.append(answer)
            return ref

        self.open = SimpleNamespace(remote=open_)
        self.close = SimpleNamespace(remote=lambda traj: done(None))


def test_an_open_that_fails_on_a_lost_node_frees_no_room_for_the_next_open_there() -> None:
    """a holds x's open (its agent still making the container), b is full; w waits for room.
    a is lost: x's open fails ``node_lost`` and gives its memory back. Before, w, woken by
    it, was placed on a (the roomiest) and failed there too; now it waits for room on b."""
    from tangram.exec.runtime.errors import LiveError

    async def go() -> None:
        members = Membership(RayConfig(direct_calls=False), owner=None)
        cpu = RayCpuExecutor(members.fleet, CPUS)
        rt = Runtime(CPUS, RuntimeConfig(), cpu=cpu, api=ApiExecutor({}))  # type: ignore[arg-type]
        cpu.scheduler = rt.scheduler
        members.runtime = rt
        agents = {n: SlowOpens() for n in ("a", "b")}
        for name, agent in agents.items():
            members.fleet.add(report(f"id-{name}", name, 1, 8.0), agent)
        await rt.start()
        try:
            x = asyncio.ensure_future(rt.open_trajectory("x", memory_gb=8.0))
            await turns_until(lambda: len(agents["a"].opens) == 1, "x's open sent to a")
            y = asyncio.ensure_future(rt.open_trajectory("y", memory_gb=8.0))
            await turns_until(lambda: len(agents["b"].opens) == 1, "y's open sent to b")
            agents["b"].opens[0].set_result("c-y")
            assert (await asyncio.wait_for(y, 5.0)).node == "b"
            w = asyncio.ensure_future(rt.open_trajectory("w", memory_gb=8.0, wait_s=30.0))
            for _ in range(20):  # (loop turns: it waits for room)
                await asyncio.sleep(0)
            assert not w.done()
            members.fleet.lose("a", "its agent died (test)")
            try:
                await asyncio.wait_for(x, 5.0)
                raise AssertionError("x's open on the lost node succeeded")
            except LiveError:
                pass
            for _ in range(50):  # (loop turns: w, woken by x's failure, finds no room)
                await asyncio.sleep(0)
            assert not w.done(), w
            assert len(agents["a"].opens) == 1
            await asyncio.wait_for(asyncio.gather(*members._tasks), 5.0)
            await rt.close_trajectory("y")  # room on b, the node alive
            await turns_until(lambda: len(agents["b"].opens) == 2, "w's open sent to b")
            agents["b"].opens[1].set_result("c-w")
            assert (await asyncio.wait_for(w, 5.0)).node == "b"
        finally:
            await rt.close()

    asyncio.run(go())


def test_an_open_waiting_for_room_is_placed_on_a_declared_node_when_it_joins(
    monkeypatch,
) -> None:
    """b is declared and absent (fenced), a is full: an open waits for room. When b joins,
    its fence is lifted and the waiting open is told at once and placed there."""
    from tangram.exec.ray import agents as agents_module
    from tests.ray.test_ray_membership import Containers, ray_node

    async def go() -> None:
        members = Membership(RayConfig(direct_calls=False), owner=None)
        cpu = RayCpuExecutor(members.fleet, CPUS)
        rt = Runtime(CPUS, RuntimeConfig(), cpu=cpu, api=ApiExecutor({}))  # type: ignore[arg-type]
        cpu.scheduler = rt.scheduler
        members.runtime = rt
        members.fleet.add(report("id-a", "a", 1, 8.0), Containers())

        async def spawn(nodes, cfg, owner, *, undeclared=False):  # noqa: ANN001, ANN202
            return [(report("id-b", "b", 1, 8.0), Containers())], {}

        monkeypatch.setattr(agents_module, "spawn", spawn)
        await rt.start()
        try:
            members.fence_absent({"a"})
            assert members.nodes_doc()["b"]["fenced"] is True
            assert (await rt.open_trajectory("x", memory_gb=8.0)).node == "a"
            w = asyncio.ensure_future(rt.open_trajectory("w", memory_gb=8.0, wait_s=60.0))
            for _ in range(20):  # (loop turns: it waits for room)
                await asyncio.sleep(0)
            assert not w.done()
            await asyncio.wait_for(members.join(ray_node("id-b", "b")), 5.0)
            assert members.nodes_doc()["b"]["fenced"] is False
            assert (await asyncio.wait_for(w, 5.0)).node == "b"
        finally:
            await rt.close()

    asyncio.run(go())
