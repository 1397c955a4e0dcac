"""The Ray GPU executor admits a call as the single-node one does on the same node (no Ray
needed): the agent's catalog carries each service's DoPs, size, and whether it runs as whole
replicas or layer shards, so ``Action.service_replicas`` reaches the core on Ray too."""

from __future__ import annotations

from types import SimpleNamespace
from typing import Any

import pytest
import torch

from tangram.core.resources import ClusterSpec, GpuNodeSpec
from tangram.exec.ray.agent import NodeAgent
from tangram.exec.ray.executors import RayGpuExecutor
from tangram.exec.ray.fleet import Fleet
from tangram.exec.runtime.errors import BadRequest
from tangram.exec.runtime.gpu import GpuExecutor
from tangram.exec.runtime.records import ActionSpec, GpuWork

GB = 1 << 30
NODE = GpuNodeSpec("g1", gpus=4, gpu_memory_gb=16.0, host_memory_gb=64.0)
CLUSTER = ClusterSpec(name="one-gpu-node", gpu_nodes=(NODE,))

#: name -> (DoPs, resident GB per GPU, shards): a replicated model, one split over 2 GPUs
#: because it needs both, one split over 2 although it fits one (refused), one without DoP 1.
SERVICES = {
    "reward": ((1, 2, 4), 3.0, 1),
    "big": ((2,), 12.0, 2),
    "small-split": ((2,), 6.0, 2),
    "no-dop-1": ((2, 4), 1.0, 1),
}


def single_node() -> GpuExecutor:
    def info(name: str) -> SimpleNamespace:
        dops, gb, shards = SERVICES[name]
        return SimpleNamespace(
            dops=dops,
            resident_bytes=int(gb * GB),
            shards=shards,
            parallelism="layers" if shards > 1 else "replicas",
        )

    eoe = SimpleNamespace(
        devices=list(range(NODE.gpus)),
        config=SimpleNamespace(calls_per_gpu=1),
        services=lambda: tuple(SERVICES),
        info=info,
        close=lambda: None,
    )
    return GpuExecutor(eoe, NODE)


@pytest.mark.parametrize("service", ["reward", "big", "small-split", "no-dop-1", "unknown"])
@pytest.mark.parametrize("asked", [1, 2, 4])
def test_a_gpu_call_is_admitted_on_ray_as_on_one_node(service: str, asked: int) -> None:
    local = single_node()
    try:
        catalog = NodeAgent.catalog(SimpleNamespace(gpu=local))  # what the agent sends
        ray_gpu = RayGpuExecutor(Fleet(), CLUSTER, catalog)
        spec = ActionSpec(GpuWork(service, [1]), max_units=asked)
        try:
            expected = local.admit(spec, None, CLUSTER)
        except BadRequest as exc:
            with pytest.raises(BadRequest) as refused:
                ray_gpu.admit(spec, None, CLUSTER)
            assert str(refused.value) == str(exc)  # the same refusal, word for word
            return
        got = ray_gpu.admit(spec, None, CLUSTER)
        assert got == expected
        assert got.replicas == (SERVICES[service][2] == 1)  # service_replicas for the core
    finally:
        local.shutdown()


def test_inputs_that_cannot_be_cut_are_refused_when_the_call_may_get_two_gpus() -> None:
    """Batch sizes that disagree failed on a 2-GPU cell (``input_split``) and ran on a 1-GPU
    cell: the outcome depended on how busy the pool was. Now the call is refused at once when
    it may be granted more than one GPU, the same on one node and on Ray."""
    local = single_node()
    try:
        ray_gpu = RayGpuExecutor(Fleet(), CLUSTER, NodeAgent.catalog(SimpleNamespace(gpu=local)))
        ragged = {"input_ids": torch.zeros(2, 3), "attention_mask": torch.zeros(3, 3)}
        wide = ActionSpec(GpuWork("reward", ragged), max_units=2)
        for executor in (local, ray_gpu):
            with pytest.raises(BadRequest, match="different batch sizes"):
                executor.admit(wide, None, CLUSTER)
            narrow = ActionSpec(GpuWork("reward", ragged), max_units=1)
            assert executor.admit(narrow, None, CLUSTER).max_units == 1
            mode = {"input_ids": torch.zeros(2, 3), "mode": "x"}  # goes to every replica whole
            assert executor.admit(ActionSpec(GpuWork("reward", mode), max_units=2), None, CLUSTER)
    finally:
        local.shutdown()


def _recording_ray_gpu(local: object, sent: list[tuple]) -> RayGpuExecutor:
    """A Ray GPU executor over ``local``'s catalog whose node calls are recorded in ``sent``
    (each answered "done") and whose residency reports are dropped."""

    class Calls:
        async def call(self, node: str, method: str, *args: object) -> object:
            sent.append((node, method, *args))
            return "done", {}, 1

    ray_gpu = RayGpuExecutor(Calls(), CLUSTER, NodeAgent.catalog(SimpleNamespace(gpu=local)))
    ray_gpu.report = lambda node, residency, stamp=None: None  # type: ignore[method-assign]
    return ray_gpu


def test_a_gpu_call_on_ray_waits_in_eoe_no_longer_than_its_action_has_left() -> None:
    """The node agent called EOE with no time-out (as the single-node executor did): a call
    still queued there at its action's deadline started after it. The agent now gets the
    time the action has left, and EOE drops the call at it."""
    import asyncio

    sent: list[tuple] = []
    local = single_node()
    try:
        ray_gpu = _recording_ray_gpu(local, sent)
        start = SimpleNamespace(node="g", gpus=(0,))
        work = GpuWork("reward", [1])
        assert asyncio.run(ray_gpu.execute(work, start, trajectory="t", time_left_s=4.0)) == "done"
    finally:
        local.shutdown()
    assert sent == [("g", "call_gpu", "reward", [1], (0,), 4.0)]
    agent = SimpleNamespace(gpu=SimpleNamespace(eoe=SimpleNamespace(residency=dict)))
    seen: list[object] = []
    agent.gpu.call_blocking = lambda s, i, g, timeout_s=None: seen.append(timeout_s) or "r"
    assert NodeAgent.call_gpu(agent, "reward", [1], (0,), 4.0)[:2] == ("r", {})  # type: ignore[arg-type]
    assert seen == [4.0]


def test_a_gpu_call_on_ray_started_with_no_time_left_ends_at_once_unsent() -> None:
    """A GPU start with no time left (its start and its deadline in one event-loop
    iteration) was sent to its node's agent all the same (a round trip, and before the
    agent's EOE refused a wait past it, a call on a free cell after its deadline), where
    the CPU executor ends such a start at once. It ends at once with the time-out."""
    import asyncio

    sent: list[tuple] = []
    local = single_node()
    try:
        ray_gpu = _recording_ray_gpu(local, sent)
        start = SimpleNamespace(node="g", gpus=(0,))
        out = asyncio.run(
            ray_gpu.execute(GpuWork("reward", [1]), start, trajectory="t", time_left_s=0.0)
        )
    finally:
        local.shutdown()
    assert sent == []
    assert out.status == "timeout" and out.error.code == "timeout"


def test_a_gpu_nodes_residency_taken_in_out_of_order_keeps_the_later_one() -> None:
    """Each GPU call's answer carries the node's residency after it; two calls' answers may be
    taken in the other order (one thread each on the agent). The earlier residency, taken in
    last, replaced the later one: the core was told a service evicted since was resident."""
    import asyncio

    state = {"reward": (0,)}
    agent = SimpleNamespace(
        gpu=SimpleNamespace(
            eoe=SimpleNamespace(residency=lambda: dict(state)),
            call_blocking=lambda s, i, g, timeout_s=None: "r",
        )
    )
    first = NodeAgent.call_gpu(agent, "reward", [1], (0,), 4.0)  # type: ignore[arg-type]
    state.clear()  # evicted by the next call's restore, say
    second = NodeAgent.call_gpu(agent, "reward", [1], (1,), 4.0)  # type: ignore[arg-type]
    replies = [second, first]  # the later answer is taken in first

    class Calls:
        async def call(self, node: str, method: str, *args: object) -> object:
            return replies.pop(0)

    told: list[tuple] = []
    scheduler = SimpleNamespace(report_residency=lambda *a: told.append(a[:4]))
    local = single_node()
    try:
        ray_gpu = RayGpuExecutor(Calls(), CLUSTER, NodeAgent.catalog(SimpleNamespace(gpu=local)))
        ray_gpu.scheduler = scheduler  # type: ignore[assignment]

        async def both() -> list[object]:
            start = SimpleNamespace(node="g1", gpus=(0,))
            work = GpuWork("reward", [1])
            return [
                await ray_gpu.execute(work, start, trajectory="t", time_left_s=4.0)
                for _ in range(2)
            ]

        assert asyncio.run(both()) == ["r", "r"]
    finally:
        local.shutdown()
    assert ray_gpu.residency["g1"] == {} and told == []


def test_a_container_whose_open_fails_leaves_nothing_placed() -> None:
    """An open that failed on its node (a bad image, the node lost) forgets where it was to
    be: each failed open with a fresh id left an entry in ``placed`` for good."""
    import asyncio

    from tangram.core.resources import CpuNodeSpec
    from tangram.exec.ray.executors import RayCpuExecutor

    class Failing:
        async def call(self, node: str, method: str, *args: object) -> object:
            raise RuntimeError("image 'nope' not found")

    cluster = ClusterSpec("c", cpu_nodes=(CpuNodeSpec("c1", 1, 1, 8.0),))
    cpu = RayCpuExecutor(Failing(), cluster)  # type: ignore[arg-type]
    cpu.scheduler = SimpleNamespace(trajectories={"t": SimpleNamespace(node="c1")})  # type: ignore[assignment]
    with pytest.raises(RuntimeError, match="not found"):
        asyncio.run(cpu.open("t", 1.0, "nope"))
    assert cpu.placed == {} and cpu.containers == {}


def test_a_call_that_ray_refuses_to_send_leaves_nothing_in_flight() -> None:
    """A Ray actor call whose sending raised (arguments Ray cannot serialize) left its future
    among the node's calls in flight for good: status counted it, and a loss of the node
    later failed it with no one waiting (an exception never retrieved)."""
    import asyncio

    from tangram.exec.ray.nodes import NodeReport

    def refuse(*args: object) -> object:
        raise TypeError("cannot serialize a lock")

    handle = SimpleNamespace(call_gpu=SimpleNamespace(remote=refuse))
    fleet = Fleet()
    member = fleet.add(NodeReport("id-g", "g", (), 8.0, None), handle)
    with pytest.raises(TypeError, match="cannot serialize"):
        asyncio.run(fleet.call("g", "call_gpu", "reward", [1], (0,), 4.0))
    assert member.pending == set()


def test_an_agent_shuts_down_when_its_scheduler_died_not_when_it_was_unreachable(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The agent's watch took Ray's ActorUnavailableError (the scheduler actor could not be
    reached for a moment: a RayActorError, 'may or may not have been executed') for its
    death: the agent removed its containers and exited, and its node was lost with every
    action and trajectory on it. It asks again; only a death shuts it down."""
    import ray

    from tangram.exec.ray import agent as agent_module

    answers = [
        ray.exceptions.ActorUnavailableError("the head is unreachable for now", None),
        ray.exceptions.GetTimeoutError("busy"),
        ray.exceptions.ActorDiedError(),
    ]
    asked: list[int] = []
    done: list[str] = []

    def get(ref: Any, timeout: float | None = None) -> Any:
        asked.append(1)
        raise answers[len(asked) - 1]

    class Exit(BaseException):
        pass

    def exit_(code: int) -> None:
        done.append("exit")
        raise Exit

    monkeypatch.setattr(ray, "get", get)
    monkeypatch.setattr(agent_module, "WATCH_EVERY_S", 0.0)
    monkeypatch.setattr(agent_module.os, "_exit", exit_)
    scheduler = SimpleNamespace(alive=SimpleNamespace(remote=lambda: None))
    a = SimpleNamespace(report=SimpleNamespace(name="w1"), shutdown=lambda: done.append("shutdown"))
    with pytest.raises(Exit):
        NodeAgent._watch_owner(a, scheduler)  # type: ignore[arg-type]
    assert len(asked) == 3 and done == ["shutdown", "exit"]
