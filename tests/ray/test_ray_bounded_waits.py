"""The scheduler actor's start and stop with its agents, with no Ray cluster (the agents'
handles are stand-ins): its waits on them at start are bounded in time, and its stop shuts
them down on every path."""

from __future__ import annotations

import asyncio
import logging
from types import SimpleNamespace
from typing import Any

import pytest

from tangram.exec.ray import agents, fleet, scheduler
from tangram.exec.ray.config import RayConfig
from tangram.exec.ray.nodes import GpuPlan, NodeReport


def silent() -> Any:
    """A call whose answer never comes (an agent that hangs)."""
    return SimpleNamespace(remote=lambda *a: asyncio.get_running_loop().create_future())


def gpu_report(name: str) -> NodeReport:
    return NodeReport(f"id-{name}", name, (), 8.0, GpuPlan(2, "cpu", 2.0))


def test_a_direct_channel_whose_agent_never_answers_is_given_up_naming_why(
    monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    """``Fleet.connect`` waited for ever for the agent's channel address: an agent that hung
    held up the scheduler's start (or a node's joining). It gives up after
    ``DIRECT_START_S``, says why, and the node's calls stay on Ray."""
    monkeypatch.setattr(fleet, "DIRECT_START_S", 0.05, raising=False)
    f = fleet.Fleet()
    member = f.add(gpu_report("a"), SimpleNamespace(serve_direct=silent()))

    async def go() -> None:
        await asyncio.wait_for(f.connect(member, b"k" * 32), 3.0)

    with caplog.at_level(logging.WARNING, logger=fleet.__name__):
        asyncio.run(go())
    assert member.channel is None and member.alive
    assert "did not say where its channel listens within 0.05 s" in caplog.text


def test_a_start_whose_gpu_agent_never_lists_its_services_fails_naming_the_node(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The scheduler's start waited for ever for a GPU agent's catalog: ``start`` (and
    ``tangram serve --ray``) hung. It fails after ``CATALOG_S``, naming the node."""
    import ray

    monkeypatch.setattr(scheduler, "CATALOG_S", 0.05, raising=False)
    actor = scheduler.SchedulerActor(RayConfig())
    monkeypatch.setattr(ray, "get_runtime_context", lambda: SimpleNamespace(current_actor=None))

    async def alive_nodes() -> list[dict[str, Any]]:
        return []

    async def spawn(nodes: Any, **kw: Any) -> list[NodeReport]:
        report = gpu_report("g1")
        actor.fleet.add(report, SimpleNamespace(catalog=silent()))
        return [report]

    monkeypatch.setattr(agents, "alive_nodes", alive_nodes)
    monkeypatch.setattr(actor.members, "spawn", spawn)

    async def go() -> None:
        await asyncio.wait_for(actor._start(), 3.0)

    with pytest.raises(RuntimeError, match=r"GPU node 'g1' did not list its services within"):
        asyncio.run(go())


def test_stop_shuts_the_agents_down_when_closing_the_runtime_raises(
    monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    """``stop`` shuts every agent down (and kills it) on every path: when the runtime's close
    raised, the agents were left, detached, with their containers, after the actor's kill.
    The close's error is logged and still raised to the caller."""
    import ray

    done: list[str] = []

    async def shutdown() -> None:
        done.append("shutdown")

    class Runtime:
        closing = False

        async def close(self) -> None:
            raise OSError("the trace's disk is full")

    monkeypatch.setattr(ray, "kill", lambda handle: done.append("kill"))
    actor = scheduler.SchedulerActor(RayConfig())
    actor.runtime = Runtime()  # type: ignore[assignment]
    actor.fleet.add(gpu_report("a"), SimpleNamespace(shutdown=SimpleNamespace(remote=shutdown)))
    with (
        caplog.at_level(logging.ERROR, logger=scheduler.__name__),
        pytest.raises(OSError, match="disk is full"),
    ):
        asyncio.run(actor.stop())
    assert done == ["shutdown", "kill"]
    assert "closing the runtime failed; stopping the agents anyway" in caplog.text


def test_stop_asks_every_agent_to_shut_down_without_waiting_for_a_hung_one(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """``stop`` asked the agents one after another, each waited for up to 60 s: with two hung
    agents it passed ``service.stop``'s 120 s, the actor was killed mid-stop, and the agents
    after them were neither shut down nor killed (detached, their containers left). All are
    asked at once, then all killed, whatever each answered."""
    import ray

    asked: list[str] = []
    killed: list[str] = []
    answers: dict[str, asyncio.Future[None]] = {}

    def agent(name: str) -> Any:
        def remote() -> asyncio.Future[None]:
            asked.append(name)
            answers[name] = asyncio.get_running_loop().create_future()
            return answers[name]

        return SimpleNamespace(name=name, shutdown=SimpleNamespace(remote=remote))

    monkeypatch.setattr(ray, "kill", lambda handle: killed.append(handle.name))
    actor = scheduler.SchedulerActor(RayConfig())
    for name in ("a", "b", "c"):
        actor.fleet.add(gpu_report(name), agent(name))

    async def go() -> list[str]:
        stopping = asyncio.ensure_future(actor._stop_agents())
        for _ in range(20):  # (loop turns, no clock: each agent's ask is one turn away)
            await asyncio.sleep(0)
        seen = list(asked)  # (before any answer: a hung agent holds no other's shutdown)
        for _ in range(10):  # now each answers (one fails), in whatever order they were asked
            for name, answer in list(answers.items()):
                if not answer.done():
                    if name == "a":
                        answer.set_exception(RuntimeError("its node is wedged"))
                    else:
                        answer.set_result(None)
            await asyncio.sleep(0)
        await asyncio.wait_for(stopping, 30.0)
        return seen

    assert sorted(asyncio.run(go())) == ["a", "b", "c"]
    assert sorted(killed) == ["a", "b", "c"]


def test_status_asks_the_gpu_agents_for_their_counters_at_once() -> None:
    """``status`` read each GPU agent's EOE counters one after another, each for up to 5 s:
    with n stalled GPU nodes (not yet lost) a status took 5n s. All are asked at once; a
    node that does not answer keeps its last counters."""
    from tangram.core.resources import ApiEndpointSpec, ClusterSpec, GpuNodeSpec
    from tangram.exec.ray.executors import RayGpuExecutor
    from tangram.exec.ray.nodes import ServiceEntry
    from tangram.exec.runtime.api import ApiExecutor
    from tangram.exec.runtime.runtime import Runtime

    names = ("g1", "g2", "g3")
    cluster = ClusterSpec(
        "gpus",
        gpu_nodes=tuple(
            GpuNodeSpec(n, gpus=2, gpu_memory_gb=2.0, host_memory_gb=8.0) for n in names
        ),
        apis=(ApiEndpointSpec("echo", 4),),
    )
    asked: list[str] = []
    answers: dict[str, asyncio.Future[dict[str, Any]]] = {}

    def agent(name: str) -> Any:
        def remote() -> asyncio.Future[dict[str, Any]]:
            asked.append(name)
            answers[name] = asyncio.get_running_loop().create_future()
            return answers[name]

        return SimpleNamespace(stats=SimpleNamespace(remote=remote))

    async def go() -> list[str]:
        actor = scheduler.SchedulerActor(RayConfig())
        catalog = {"reward": ServiceEntry(dops=(1, 2), size_gb=0.1, replicas=True)}
        gpu = RayGpuExecutor(actor.fleet, cluster, catalog)
        actor.runtime = Runtime(cluster, gpu=gpu, api=ApiExecutor({}))  # type: ignore[arg-type]
        for name in names:
            actor.fleet.add(gpu_report(name), agent(name))
        refresh = asyncio.ensure_future(actor._refresh_stats())
        for _ in range(20):  # (loop turns, no clock)
            await asyncio.sleep(0)
        seen = list(asked)
        for _ in range(10):  # g2 never answers; the others do, as they are asked
            for name, answer in list(answers.items()):
                if name != "g2" and not answer.done():
                    answer.set_result({"calls": 1})
            await asyncio.sleep(0)
        answers["g2"].set_exception(RuntimeError("stalled"))  # (its 5 s, without the wait)
        await asyncio.wait_for(refresh, 30.0)
        assert set(gpu.eoe.counters) == {"g1", "g3"}
        return seen

    assert asyncio.run(go()) == list(names)
