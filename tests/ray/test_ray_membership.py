"""The watch's handling of a Ray node the cluster lacks, with no Ray cluster: Ray's node table
and the agents' start are stand-ins, the runtime and its core are real. Adopted (the default):
its reported node joins the core and the executors; ``join_new_nodes=False``: only listed;
a node whose agent fails is tried once."""

from __future__ import annotations

import asyncio
import concurrent.futures
import threading
import time
from types import SimpleNamespace
from typing import Any

import pytest

from tangram.core.resources import ApiEndpointSpec, ClusterSpec, CpuNodeSpec, GpuNodeSpec
from tangram.exec.ray import agents
from tangram.exec.ray.config import RayConfig
from tangram.exec.ray.executors import RayCpuExecutor, RayGpuExecutor
from tangram.exec.ray.membership import Membership
from tangram.exec.ray.nodes import GpuPlan, NodeReport, ServiceEntry
from tangram.exec.runtime import RuntimeConfig
from tangram.exec.runtime.api import ApiExecutor
from tangram.exec.runtime.runtime import Runtime

CLUSTER = ClusterSpec(
    "one",
    cpu_nodes=(CpuNodeSpec("a", cores=1, numa_domains=1, memory_gb=8.0),),
    gpu_nodes=(GpuNodeSpec("a", gpus=2, gpu_memory_gb=2.0, host_memory_gb=8.0),),
    apis=(ApiEndpointSpec("echo", 4),),
)
CATALOG = {"reward": ServiceEntry(dops=(1, 2, 4), size_gb=0.1, replicas=True)}


def ray_node(node_id: str, name: str) -> dict[str, Any]:
    return {"NodeID": node_id, "Alive": True, "Labels": {"tangram-name": name}, "Resources": {}}


def report(node_id: str, name: str, cores: int, memory_gb: float, gpus: int = 0) -> NodeReport:
    plan = GpuPlan(gpus, "cpu", 2.0) if gpus else None
    return NodeReport(node_id, name, (tuple(range(cores)),) if cores else (), memory_gb, plan)


class Agent:
    """A node agent's handle whose pings answer after ``delay_s`` (None: never), from another
    thread, as a Ray ObjectRef's future does (``ref.future()``)."""

    def __init__(self, delay_s: float | None = 0.0) -> None:
        def remote() -> Any:
            answer: concurrent.futures.Future[bool] = concurrent.futures.Future()
            if delay_s == 0.0:
                answer.set_result(True)
            elif delay_s is not None:
                threading.Timer(delay_s, answer.set_result, (True,)).start()
            return SimpleNamespace(future=lambda: answer)

        self.ping = SimpleNamespace(remote=remote)


class Watch:
    """A runtime on ``CLUSTER`` with node ``a``'s agent, and its membership."""

    def __init__(self, monkeypatch: pytest.MonkeyPatch, config: RayConfig, spawn: Any) -> None:
        self.members = Membership(config, owner=None)
        cpu = RayCpuExecutor(self.members.fleet, CLUSTER)
        gpu = RayGpuExecutor(self.members.fleet, CLUSTER, CATALOG)
        self.rt = Runtime(CLUSTER, RuntimeConfig(), cpu=cpu, gpu=gpu, api=ApiExecutor({}))  # type: ignore[arg-type]
        cpu.scheduler = gpu.scheduler = self.rt.scheduler
        self.members.runtime = self.rt
        self.members.fleet.add(report("id-a", "a", 1, 8.0, gpus=2), Agent())
        self.spawned: list[str] = []
        self.table = [ray_node("id-a", "a"), ray_node("id-b", "b")]

        async def all_nodes() -> list[dict[str, Any]]:
            return self.table

        async def fake_spawn(nodes, cfg, owner, *, undeclared=False):  # noqa: ANN001, ANN202
            self.spawned += [n["NodeID"] for n in nodes]
            assert undeclared, "a node the cluster lacks is started as undeclared"
            return spawn(nodes), {}

        monkeypatch.setattr(agents, "all_nodes", all_nodes)
        monkeypatch.setattr(agents, "spawn", fake_spawn)

    async def check(self) -> None:
        await self.members.check()
        await asyncio.gather(*self.members._tasks)  # the adoptions it started


def test_a_node_the_cluster_lacks_is_added_to_the_core_and_the_executors(monkeypatch) -> None:
    async def go() -> None:
        w = Watch(
            monkeypatch,
            RayConfig(),
            lambda nodes: [(report("id-b", "b", 4, 32.0), Agent())],
        )
        await w.rt.start()
        try:
            sched = w.rt.scheduler
            assert sched.open_trajectory("full", w.rt.host.now(), memory_gb=8.0) == "a"
            assert sched.open_trajectory("more", w.rt.host.now(), memory_gb=8.0) is None
            await w.check()
            assert w.spawned == ["id-b"]
            assert [n.name for n in w.rt.cluster.cpu_nodes] == ["a", "b"]
            assert w.rt.cluster is sched.cluster and w.rt.cpu.node.name == "b"  # the largest
            assert sched.open_trajectory("more", w.rt.host.now(), memory_gb=8.0) == "b"
            assert w.members.unplaced == {} and "b" in w.members.nodes_doc()
            await w.check()  # known now: not started twice
            assert w.spawned == ["id-b"]
        finally:
            await w.rt.close()

    asyncio.run(go())


def test_a_gpu_node_the_cluster_lacks_adds_its_cells(monkeypatch) -> None:
    async def go() -> None:
        w = Watch(
            monkeypatch, RayConfig(), lambda nodes: [(report("id-b", "b", 0, 8.0, 4), Agent())]
        )
        await w.rt.start()
        try:
            await w.check()
            sched = w.rt.scheduler
            assert list(sched.state.cpu) == ["a"] and list(sched.state.gpu) == ["a", "b"]
            assert sched.state.gpu["b"].free_gpus == 4 and sched.state.free_gpus == 6
            assert w.rt.gpu.node.name == "b" and w.rt.gpu.residency["b"] == {}  # nothing resident
            assert sched.option_builder.gpu_units(_call(4)) == (1, 2, 4)  # its 4-GPU cells
        finally:
            await w.rt.close()

    asyncio.run(go())


def _call(max_units: int) -> Any:
    from tangram.core import Action, Amdahl, ResourceKind

    return Action(
        "x",
        "t",
        ResourceKind.GPU,
        Amdahl(1.0, 0.1),
        max_units=max_units,
        service="reward",
        service_size_gb=0.1,
    )


def test_with_join_new_nodes_off_the_node_is_only_listed(monkeypatch) -> None:
    async def go() -> None:
        w = Watch(monkeypatch, RayConfig(join_new_nodes=False), lambda nodes: [])
        await w.rt.start()
        try:
            await w.check()
            await w.check()
            assert w.spawned == [] and w.members.unplaced == {"id-b": "b"}
            assert list(w.rt.scheduler.state.cpu) == ["a"]
        finally:
            await w.rt.close()

    asyncio.run(go())


def test_a_node_whose_agent_fails_stays_unplaced_and_is_tried_once(monkeypatch) -> None:
    def broken(nodes: Any) -> Any:
        raise RuntimeError("label tangram-gpus='3': a node has 1, 2, 4 or 8 GPUs")

    async def go() -> None:
        w = Watch(monkeypatch, RayConfig(), broken)
        await w.rt.start()
        try:
            await w.check()
            await w.check()
            assert w.spawned == ["id-b"] and w.members.unplaced == {"id-b": "b"}
            assert list(w.rt.scheduler.state.cpu) == ["a"]
        finally:
            await w.rt.close()

    asyncio.run(go())


def watched(monkeypatch: pytest.MonkeyPatch, agent: Any) -> Watch:
    w = Watch(monkeypatch, RayConfig(ping_every_s=0.05, lost_after_s=0.3), lambda nodes: [])
    w.table = [ray_node("id-a", "a")]
    w.members.fleet.add(report("id-a", "a", 1, 8.0, gpus=2), agent)
    return w


def test_a_node_whose_pings_go_unanswered_is_lost_after_lost_after_s(monkeypatch) -> None:
    async def go() -> None:
        w = watched(monkeypatch, Agent(None))
        await w.rt.start()
        try:
            await w.members.check()
            assert w.members.fleet.alive("a")  # not yet: its ping is 0.3 s from its time-out
            await asyncio.wait_for(w.check(), 5)
            member = w.members.fleet.by_name["a"]
            assert not member.alive and "did not answer a ping for 0.3 s" in member.why
        finally:
            await w.rt.close()

    asyncio.run(go())


def test_a_watch_that_fell_behind_does_not_count_its_own_lag_as_silence(monkeypatch) -> None:
    """The scheduler's loop blocked for longer than ``lost_after_s`` (a loaded host), then an
    agent answering in 0.1 s: under "now - last answer" every node was lost at once."""

    async def go() -> None:
        w = watched(monkeypatch, Agent(0.1))
        await w.rt.start()
        try:
            time.sleep(0.5)  # the watch's own lag, longer than lost_after_s (0.3 s)
            await asyncio.wait_for(w.check(), 5)
            assert w.members.fleet.alive("a"), w.members.fleet.by_name["a"].why
        finally:
            await w.rt.close()

    asyncio.run(go())


def test_an_answer_that_came_while_the_watch_was_blocked_counts(monkeypatch) -> None:
    """The ping is sent, then the scheduler's loop blocks past ``lost_after_s`` while the answer
    arrives (0.05 s): when the loop runs again, both the answer and the ping's time-out are
    due, and the answer wins (``asyncio.wait_for`` on Python 3.12 lets the time-out win)."""

    async def go() -> None:
        w = watched(monkeypatch, Agent(0.05))
        await w.rt.start()
        try:
            await w.members.check()  # the ping is sent
            time.sleep(0.5)  # the loop blocked past lost_after_s (0.3 s)
            await asyncio.wait_for(asyncio.gather(*w.members._tasks), 5)
            assert w.members.fleet.alive("a"), w.members.fleet.by_name["a"].why
        finally:
            await w.rt.close()

    asyncio.run(go())


def test_agents_made_for_a_spawn_that_fails_are_killed(monkeypatch: pytest.MonkeyPatch) -> None:
    """A spawn whose agents do not all start (one's describe raised, or the start timed out)
    kills the agents it made before the error goes on: they are detached, so they stayed
    (each with its AOE and EOE managers, the models' host backups) for as long as the
    scheduler actor lived, and the watch made another one at each join it tried again."""
    import ray

    killed: list[str] = []

    async def answer(name: str) -> NodeReport:
        if name == "b":
            raise RuntimeError("agent b failed to start")
        return report(f"id-{name}", name, 1, 8.0)

    class Handle:
        def __init__(self, node: str, labels: dict[str, str], *args: Any) -> None:
            self.name = labels["tangram-name"]
            self.describe = SimpleNamespace(remote=lambda owner: answer(self.name))

    class Actor:
        def options(self, **kw: Any) -> Any:
            return SimpleNamespace(remote=Handle)

    monkeypatch.setattr(agents, "agent_class", lambda: Actor())
    monkeypatch.setattr(ray, "kill", lambda handle: killed.append(handle.name))
    nodes = [ray_node("a" * 56, "a"), ray_node("b" * 56, "b")]  # (Ray checks the ids' form)
    with pytest.raises(RuntimeError, match="agent b failed to start"):
        asyncio.run(agents.spawn(nodes, RayConfig(), owner=None))
    assert sorted(killed) == ["a", "b"]


def test_a_node_joining_again_does_not_hold_up_the_watch(monkeypatch) -> None:
    """A lost node that comes back is joined in the background: its agent's start (up to
    AGENT_START_S: torch, Docker, the models) ran inside the check, and meanwhile no ping
    went out and no other node's silence was seen. It is joined once, not at every check."""

    async def go() -> None:
        w = Watch(monkeypatch, RayConfig(), lambda nodes: [])
        started, release = asyncio.Event(), asyncio.Event()

        async def slow_spawn(nodes, cfg, owner, *, undeclared=False):  # noqa: ANN001, ANN202
            w.spawned += [n["NodeID"] for n in nodes]
            started.set()
            await release.wait()
            return [(report("id-a2", "a", 1, 8.0, gpus=2), Agent())], {}

        monkeypatch.setattr(agents, "spawn", slow_spawn)
        w.table = [ray_node("id-a2", "a")]  # node a's Ray node is gone; a new one is up
        await w.rt.start()
        try:
            w.members.fleet.lose("a", "its agent died")
            await asyncio.wait_for(w.members.check(), 2)  # not held up by the join
            await asyncio.wait_for(started.wait(), 2)
            await asyncio.wait_for(w.members.check(), 2)  # the join under way: not twice
            assert w.spawned == ["id-a2"]
            release.set()
            await asyncio.wait_for(asyncio.gather(*w.members._tasks), 5)
            assert w.members.fleet.alive("a") and w.spawned == ["id-a2"]
        finally:
            release.set()
            await w.rt.close()

    asyncio.run(go())


def test_a_node_that_joins_again_while_its_loss_is_handled_is_not_fenced_after(
    monkeypatch,
) -> None:
    """A lost node's trajectories are closed before its handling ends, and a close waits for
    the trajectory's running actions (a GPU call on another node may run for minutes); the
    node may join again meanwhile. The handling's last fence then held the joined node's
    memory and GPUs for good: nothing was placed there again, and no later check lifted it."""

    async def go() -> None:
        w = Watch(
            monkeypatch,
            RayConfig(direct_calls=False),
            lambda nodes: [(report("id-a2", "a", 1, 8.0, gpus=2), Agent())],
        )
        await w.rt.start()
        closing, release = asyncio.Event(), asyncio.Event()

        async def slow_close(trajectory: str) -> None:  # (its running actions still ending)
            closing.set()
            await release.wait()
            w.rt.trajs.by_id.pop(trajectory, None)

        monkeypatch.setattr(w.rt, "close_trajectory", slow_close)
        w.rt.trajs.by_id["t"] = SimpleNamespace(id="t", node="a", active={}, ephemeral=False)  # type: ignore[assignment]
        state = w.rt.scheduler.state
        try:
            w.members.fleet.lose("a", "its agent died")
            await asyncio.wait_for(closing.wait(), 5)
            assert state.cpu["a"].memory_free_gb == 0.0  # fenced while lost
            await asyncio.wait_for(w.members.join(ray_node("id-a2", "a")), 5)
            assert w.members.fleet.alive("a") and state.cpu["a"].memory_free_gb == 8.0
            release.set()
            await asyncio.wait_for(asyncio.gather(*w.members._tasks), 5)
            assert "a" not in w.rt.scheduler.fenced
            assert state.cpu["a"].memory_free_gb == 8.0 and state.gpu["a"].free_gpus == 2
        finally:
            release.set()
            w.rt.trajs.by_id.pop("t", None)
            await w.rt.close()

    asyncio.run(go())


def test_an_agent_lost_to_silence_is_killed(monkeypatch) -> None:
    """A node lost because its agent left a ping unanswered (a stall, not a death): its
    actions end ``node_lost`` ('submit it again') and its trajectories are closed without a
    call to it, but the agent was left running, detached: the actions ran on beside their
    resends and its containers stayed until the scheduler actor died. It is killed (its AOE
    watchdog then removes the containers)."""
    import ray

    killed: list[Any] = []
    monkeypatch.setattr(ray, "kill", lambda handle, **kw: killed.append(handle))
    monkeypatch.setattr(ray, "is_initialized", lambda: True)

    async def go() -> None:
        agent = Agent(None)
        w = watched(monkeypatch, agent)
        await w.rt.start()
        try:
            await asyncio.wait_for(w.check(), 5)
            assert not w.members.fleet.alive("a")
            assert killed == [agent]
        finally:
            await w.rt.close()

    asyncio.run(go())


def test_two_ray_nodes_under_one_new_name_get_one_agent(monkeypatch) -> None:
    """Two Ray nodes that come up under the same Tangram name (one ``tangram-name`` label on
    both) were both adopted in the same check: two agents, the second replacing the first in
    the fleet under that name while the core kept the first's node (the second's add
    refused), so the node's calls went to the other machine and the first agent was never
    stopped. One is adopted; the other is left, and said so."""

    async def go() -> None:
        w = Watch(
            monkeypatch,
            RayConfig(direct_calls=False),
            lambda nodes: [(report(n["NodeID"], "b", 4, 32.0), Agent()) for n in nodes],
        )
        w.table = [ray_node("id-a", "a"), ray_node("id-b1", "b"), ray_node("id-b2", "b")]
        await w.rt.start()
        try:
            await w.check()
            await w.check()
            assert w.spawned == ["id-b1"]
            assert w.members.fleet.by_name["b"].report.ray_node == "id-b1"
            assert [n.name for n in w.rt.cluster.cpu_nodes] == ["a", "b"]
        finally:
            await w.rt.close()

    asyncio.run(go())


def test_a_start_on_two_ray_nodes_under_one_name_fails_naming_it(monkeypatch) -> None:
    """With a cluster file the start never built a spec from the reports (whose check refuses
    a name two Ray nodes share): both nodes got an agent, the second replaced the first in
    the fleet, and the first ran on, detached and unknown, until the scheduler died. The
    start fails naming the name, as without a file, and kills the agents it made."""
    import ray

    killed: list[Any] = []
    monkeypatch.setattr(ray, "kill", lambda handle, **kw: killed.append(handle))
    monkeypatch.setattr(ray, "is_initialized", lambda: True)
    first, second = Agent(), Agent()

    async def spawn(nodes, cfg, owner, *, undeclared=False):  # noqa: ANN001, ANN202
        return [(report("id-1", "a", 1, 8.0), first), (report("id-2", "a", 1, 8.0), second)], {}

    monkeypatch.setattr(agents, "spawn", spawn)
    members = Membership(RayConfig(cluster=CLUSTER, direct_calls=False), owner=None)
    with pytest.raises(ValueError, match=r"two Ray nodes share the Tangram name\(s\) \['a'\]"):
        asyncio.run(members.spawn([ray_node("id-1", "a"), ray_node("id-2", "a")]))
    assert killed == [first, second] and members.fleet.members() == []


def test_a_lost_nodes_trajectories_are_closed_at_once(monkeypatch) -> None:
    """A lost node's trajectories were closed one after another, and a close waits for the
    trajectory's running actions (a GPU call on another node may run for minutes): the
    others stayed open meanwhile, accepting actions that could only end ``node_lost``. All
    their closes begin at once (each ends its trajectory's waiting actions as it begins)."""

    async def go() -> None:
        w = Watch(monkeypatch, RayConfig(direct_calls=False), lambda nodes: [])
        await w.rt.start()
        begun: list[str] = []
        release = asyncio.Event()

        async def slow_close(trajectory: str) -> None:
            begun.append(trajectory)
            await release.wait()
            w.rt.trajs.by_id.pop(trajectory, None)

        monkeypatch.setattr(w.rt, "close_trajectory", slow_close)
        for t in ("t1", "t2", "t3"):
            w.rt.trajs.by_id[t] = SimpleNamespace(id=t, node="a", active={}, ephemeral=False)  # type: ignore[assignment]
        try:
            w.members.fleet.lose("a", "its agent died")
            for _ in range(20):  # (loop turns, no clock)
                await asyncio.sleep(0)
            assert begun == ["t1", "t2", "t3"]
            release.set()
            await asyncio.wait_for(asyncio.gather(*w.members._tasks), 5)
        finally:
            release.set()
            for t in ("t1", "t2", "t3"):
                w.rt.trajs.by_id.pop(t, None)
            await w.rt.close()

    asyncio.run(go())


def test_a_ping_that_finds_the_agent_unreachable_for_a_moment_loses_nothing(monkeypatch) -> None:
    """Ray's ActorUnavailableError (the agent unreachable for now: a RayActorError, not a
    death) on a ping lost the node at once as 'its agent died': its actions ended
    ``node_lost``, its trajectories were closed, its agent killed. It is asked again; only
    an agent unreachable for ``lost_after_s`` is lost (saying so)."""
    import ray

    class Unreachable:
        def __init__(self, times: int) -> None:
            self.asked = 0

            def remote() -> Any:
                self.asked += 1
                answer: concurrent.futures.Future[bool] = concurrent.futures.Future()
                if self.asked <= times:
                    answer.set_exception(ray.exceptions.ActorUnavailableError("a blip", None))
                else:
                    answer.set_result(True)
                return SimpleNamespace(future=lambda: answer)

            self.ping = SimpleNamespace(remote=remote)

    async def go(times: int) -> tuple[bool, str, int]:
        agent = Unreachable(times)
        w = watched(monkeypatch, agent)
        await w.rt.start()
        try:
            await asyncio.wait_for(w.check(), 5)
            member = w.members.fleet.by_name["a"]
            return member.alive, member.why, agent.asked
        finally:
            await w.rt.close()

    alive, why, asked = asyncio.run(go(times=1))
    assert alive and asked == 2, why
    alive, why, asked = asyncio.run(go(times=10**6))  # (asked every ping_every_s: 0.05 s)
    assert not alive and "unreachable for 0.3 s" in why and asked >= 2


def test_a_node_with_nothing_to_run_that_comes_up_under_a_lost_name_is_tried_once(
    monkeypatch,
) -> None:
    """A Ray node under a lost node's name whose agent finds nothing to run (labels with no
    cores and no GPUs: the agent is killed at once) was joined again at every check: a new
    agent process started and killed every ``ping_every_s`` for as long as it stayed up. It
    is tried once, as a node that is adopted."""

    async def go() -> None:
        w = Watch(monkeypatch, RayConfig(direct_calls=False), lambda nodes: [])
        w.table = [ray_node("id-a2", "a")]  # node a's Ray node is gone; an empty one is up
        await w.rt.start()
        try:
            w.members.fleet.lose("a", "its agent died")
            for _ in range(3):
                await w.check()
            assert w.spawned == ["id-a2"]
        finally:
            await w.rt.close()

    asyncio.run(go())


def test_agents_made_before_one_that_cannot_be_made_are_killed(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Making an agent can raise (Ray refuses the actor: a bad node id, a name in use) after
    the agents of the nodes before it were made: those, detached, were left running (AOE,
    EOE, the models' host backups) until the scheduler actor died. They are killed."""
    import ray

    killed: list[str] = []

    class Handle:
        def __init__(self, node: str, labels: dict[str, str], *args: Any) -> None:
            if labels["tangram-name"] == "b":
                raise ValueError("Ray refused the actor")
            self.name = labels["tangram-name"]

    class Actor:
        def options(self, **kw: Any) -> Any:
            return SimpleNamespace(remote=Handle)

    monkeypatch.setattr(agents, "agent_class", lambda: Actor())
    monkeypatch.setattr(ray, "kill", lambda handle: killed.append(handle.name))
    nodes = [ray_node("a" * 56, "a"), ray_node("b" * 56, "b")]  # (Ray checks the ids' form)
    with pytest.raises(ValueError, match="Ray refused the actor"):
        asyncio.run(agents.spawn(nodes, RayConfig(), owner=None))
    assert killed == ["a"]


def test_a_lost_nodes_private_trajectories_are_not_listed_as_lost(monkeypatch) -> None:
    """A lost node's /run_code containers (private trajectories, a fresh id per request) were
    listed in ``lost_trajectories`` with the clients' ones: shown by every status, though no
    client may name them, and kept for ever, since only a reopen of the id removes an entry
    and none is ever reopened. They are closed, not listed."""

    async def go() -> dict[str, str]:
        w = Watch(monkeypatch, RayConfig(direct_calls=False), lambda nodes: [])
        await w.rt.start()

        async def close(trajectory: str) -> None:
            w.rt.trajs.by_id.pop(trajectory, None)

        monkeypatch.setattr(w.rt, "close_trajectory", close)
        for t, private in (("client-1", False), ("rc-1", True)):
            w.rt.trajs.by_id[t] = SimpleNamespace(id=t, node="a", active={}, ephemeral=private)  # type: ignore[assignment]
        try:
            w.members.fleet.lose("a", "its agent died")
            await asyncio.wait_for(asyncio.gather(*w.members._tasks), 5)
            assert "rc-1" not in w.rt.trajs.by_id  # (closed all the same)
            return dict(w.members.lost_trajectories)
        finally:
            for t in ("client-1", "rc-1"):
                w.rt.trajs.by_id.pop(t, None)
            await w.rt.close()

    assert list(asyncio.run(go())) == ["client-1"]


def test_an_open_whose_node_is_lost_while_its_container_is_made_is_a_retryable_node_lost(
    monkeypatch,
) -> None:
    """An open whose node was lost while its agent made the container was the runtime's
    wrapper of the executor's ``NodeLost``: a 500 (code ``error``) not to be retried, though
    nothing was opened and the open sent again is placed on another node. It is the
    retryable ``node_lost`` (503), which the Ray clients resend with the same id."""
    from tangram.exec.ray.client import unwrap
    from tangram.exec.ray.scheduler import SchedulerActor
    from tangram.exec.service.retry import ServiceError

    async def go() -> None:
        w = Watch(monkeypatch, RayConfig(direct_calls=False), lambda nodes: [])
        actor = SchedulerActor(RayConfig(direct_calls=False))
        actor.members, actor.fleet, actor.runtime = w.members, w.members.fleet, w.rt
        making: concurrent.futures.Future[str] = concurrent.futures.Future()  # never made
        agent = w.members.fleet.by_name["a"].handle
        agent.open = SimpleNamespace(remote=lambda *args: SimpleNamespace(future=lambda: making))
        await w.rt.start()
        try:
            opening = asyncio.ensure_future(actor.open_trajectory({"id": "t", "memory_gb": 1}))
            for _ in range(20):  # (loop turns, no clock: the open is out on the agent)
                await asyncio.sleep(0)
            assert not opening.done()
            w.members.fleet.lose("a", "its agent died (RayActorError)")
            reply = await asyncio.wait_for(opening, 5)
            err = reply["error"]
            assert err["code"] == "node_lost" and err["retryable"], reply
            assert "node a was lost" in err["message"]
            with pytest.raises(ServiceError) as raised:
                unwrap(reply)
            assert raised.value.status == 503 and raised.value.retryable
            assert "t" not in w.rt.trajs.by_id  # nothing opened: the id is free
        finally:
            await w.rt.close()

    asyncio.run(go())


TWO = ClusterSpec(
    "two",
    cpu_nodes=tuple(CpuNodeSpec(n, cores=1, numa_domains=1, memory_gb=8.0) for n in ("a", "b")),
    apis=(ApiEndpointSpec("echo", 4),),
)


class Containers(Agent):
    """An agent whose containers open and close at once."""

    def __init__(self) -> None:
        super().__init__()

        def done(value: Any) -> Any:
            answer: concurrent.futures.Future[Any] = concurrent.futures.Future()
            answer.set_result(value)
            return SimpleNamespace(future=lambda: answer)

        self.open = SimpleNamespace(remote=lambda traj, *args: done(f"c-{traj}"))
        self.close = SimpleNamespace(remote=lambda traj: done(None))


def test_an_open_waiting_for_room_is_not_placed_on_a_lost_node_its_closes_free(
    monkeypatch,
) -> None:
    """A lost node's trajectories are closed after its free memory is fenced, and each close
    gave its memory back to the core before the evacuation's last fence: an open waiting for
    room, woken by that close, was placed on the lost node (the roomiest) and failed there
    (``node_lost``), where it would have waited for room on another. A lost node's closed
    trajectory's memory is fenced before the waiting opens are told."""

    async def go() -> None:
        members = Membership(RayConfig(direct_calls=False), owner=None)
        cpu = RayCpuExecutor(members.fleet, TWO)
        rt = Runtime(TWO, RuntimeConfig(), cpu=cpu, api=ApiExecutor({}))  # type: ignore[arg-type]
        cpu.scheduler = rt.scheduler
        members.runtime = rt
        for name in ("a", "b"):
            members.fleet.add(report(f"id-{name}", name, 1, 8.0), Containers())
        await rt.start()
        try:
            assert (await rt.open_trajectory("ta", memory_gb=8.0)).node == "a"
            assert (await rt.open_trajectory("tb", memory_gb=8.0)).node == "b"
            waiting = asyncio.ensure_future(rt.open_trajectory("w", memory_gb=8.0, wait_s=30.0))
            for _ in range(20):  # (loop turns, no clock: it waits for room)
                await asyncio.sleep(0)
            assert not waiting.done()
            members.fleet.lose("a", "its agent died (RayActorError)")
            await asyncio.wait_for(asyncio.gather(*members._tasks), 5)  # the evacuation
            assert "ta" not in rt.trajs.by_id
            assert not waiting.done(), waiting  # (failed on a, before: node_lost)
            await rt.close_trajectory("tb")  # room on b, the node alive
            assert (await asyncio.wait_for(waiting, 5)).node == "b"
        finally:
            await rt.close()

    asyncio.run(go())


def test_a_node_whose_join_fails_is_tried_again_after_a_growing_pause(monkeypatch) -> None:
    """A Ray node under a lost node's name whose agent cannot start (a label it refuses: its
    describe raises) was joined again at every check: an agent process started and killed
    every ``ping_every_s`` for as long as the node stayed up. It is tried again after a
    pause that doubles with each failure (up to ``JOIN_RETRY_MAX_S``)."""

    def refuse(nodes: Any) -> Any:
        raise ValueError("label tangram-gpus='3': a node has 1, 2, 4 or 8 GPUs")

    async def go() -> None:
        w = Watch(monkeypatch, RayConfig(ping_every_s=0.05, lost_after_s=10.0), refuse)
        w.table = [ray_node("id-a2", "a")]  # node a's Ray node is gone; a bad one is up
        await w.rt.start()
        try:
            w.members.fleet.lose("a", "its agent died")
            await w.check()
            assert w.spawned == ["id-a2"]
            for _ in range(5):  # (checks within the first pause, 0.1 s)
                await w.check()
            assert w.spawned == ["id-a2"]
            await asyncio.sleep(0.15)
            await w.check()  # the pause is over: tried again, then a longer pause (0.2 s)
            assert w.spawned == ["id-a2", "id-a2"]
            await asyncio.sleep(0.15)
            await w.check()
            assert w.spawned == ["id-a2", "id-a2"]
            assert not w.members.fleet.alive("a")
        finally:
            await w.rt.close()

    asyncio.run(go())


def test_a_lost_trajectory_reopened_by_any_api_is_no_longer_listed_as_lost(monkeypatch) -> None:
    """Only the Ray-native open took a reopened trajectory off ``lost_trajectories``: one
    reopened over HTTP (the runtime's own open) stayed listed as lost while it was open, and
    once closed, a Ray-native call naming it was told it was lost with its node."""
    from tangram.exec.ray.scheduler import SchedulerActor
    from tangram.exec.runtime.errors import UnknownTrajectory

    async def go() -> None:
        w = Watch(monkeypatch, RayConfig(direct_calls=False), lambda nodes: [])
        w.members.fleet.by_name["a"].handle = Containers()
        actor = SchedulerActor(RayConfig(direct_calls=False))
        actor.members, actor.fleet, actor.runtime = w.members, w.members.fleet, w.rt
        w.members.lost_trajectories["t"] = "lost with node b: its agent died"
        await w.rt.start()
        try:
            await w.rt.open_trajectory("t", memory_gb=1.0)  # (as the HTTP route does)
            assert "t" not in w.members.lost_trajectories
            await w.rt.close_trajectory("t")
            told = actor._explain(UnknownTrajectory("trajectory 't' is not open"), "t")
            assert "lost" not in told.message, told.message
        finally:
            await w.rt.close()

    asyncio.run(go())


def test_a_recreate_whose_node_is_lost_meanwhile_says_the_trajectory_was_lost(
    monkeypatch,
) -> None:
    """A recreate whose node was lost while its agent made the new container was the
    runtime's wrapper of the executor's ``NodeLost``: a 500 ('could not recreate'), though
    the trajectory is lost with its node (closed by its loss), as any later call naming it
    is told. It is that 404, naming the node."""
    from tangram.exec.ray.scheduler import SchedulerActor

    async def go() -> None:
        w = Watch(monkeypatch, RayConfig(direct_calls=False), lambda nodes: [])
        agent = Containers()
        making: concurrent.futures.Future[str] = concurrent.futures.Future()  # never made
        agent.recreate = SimpleNamespace(remote=lambda traj: SimpleNamespace(future=lambda: making))
        w.members.fleet.by_name["a"].handle = agent
        actor = SchedulerActor(RayConfig(direct_calls=False))
        actor.members, actor.fleet, actor.runtime = w.members, w.members.fleet, w.rt
        await w.rt.start()
        try:
            await w.rt.open_trajectory("t", memory_gb=1.0)
            recreating = asyncio.ensure_future(actor.recreate_trajectory("t"))
            for _ in range(20):  # (loop turns, no clock: the recreate is out on the agent)
                await asyncio.sleep(0)
            assert not recreating.done()
            w.members.fleet.lose("a", "its agent died (RayActorError)")
            err = (await asyncio.wait_for(recreating, 5))["error"]
            assert err["code"] == "unknown_trajectory" and "lost with node a" in err["message"]
            await asyncio.wait_for(asyncio.gather(*w.members._tasks), 5)
            assert "t" in w.members.lost_trajectories
        finally:
            await w.rt.close()

    asyncio.run(go())


@pytest.mark.parametrize(
    ("cores", "memory_gb", "gpus", "said"),
    [(1, 8.0, 1, "1 GPUs, not 2"), (0, 8.0, 2, "no container cores"), (1, 4.0, 0, "no GPUs")],
)
def test_a_lost_node_that_comes_back_smaller_is_not_joined(
    monkeypatch, cores: int, memory_gb: float, gpus: int, said: str
) -> None:
    """A lost node that came back smaller than the core's node (a replaced machine, other
    labels) was joined with a warning: the core kept its shape and granted cores its agent
    refuses (each such action an executor error) and cells of GPUs its EOE lacks. It is
    not joined: it stays lost and fenced, saying why, and is not tried again."""

    async def go() -> None:
        w = Watch(
            monkeypatch,
            RayConfig(direct_calls=False),
            lambda nodes: [(report("id-a2", "a", cores, memory_gb, gpus=gpus), Agent())],
        )
        w.table = [ray_node("id-a2", "a")]  # node a's Ray node is gone; a smaller one is up
        await w.rt.start()
        state = w.rt.scheduler.state
        try:
            w.members.fleet.lose("a", "its agent died")
            await w.check()
            await w.check()
            assert w.spawned == ["id-a2"]  # tried once
            assert not w.members.fleet.alive("a")
            assert said in w.members.nodes_doc()["a"]["why"]
            assert state.cpu["a"].memory_free_gb == 0.0 and state.gpu["a"].free_gpus == 0
        finally:
            await w.rt.close()

    asyncio.run(go())


def test_the_lost_trajectories_kept_are_the_latest_few(monkeypatch) -> None:
    """An entry of ``lost_trajectories`` went only when its id was opened again, so ids never
    reused (one per episode) piled up over the actor's life with every node lost, each
    ``status()`` sending them all. The latest ``LOST_KEPT`` are kept."""
    from tangram.exec.ray import membership

    monkeypatch.setattr(membership, "LOST_KEPT", 3, raising=False)

    async def go() -> list[str]:
        w = Watch(monkeypatch, RayConfig(direct_calls=False), lambda nodes: [])
        await w.rt.start()

        async def close(trajectory: str) -> None:
            w.rt.trajs.by_id.pop(trajectory, None)

        monkeypatch.setattr(w.rt, "close_trajectory", close)
        ids = [f"episode-{i}" for i in range(5)]
        for t in ids:
            w.rt.trajs.by_id[t] = SimpleNamespace(id=t, node="a", active={}, ephemeral=False)  # type: ignore[assignment]
        try:
            w.members.fleet.lose("a", "its agent died")
            await asyncio.wait_for(asyncio.gather(*w.members._tasks), 5)
            return list(w.members.lost_trajectories)
        finally:
            for t in ids:
                w.rt.trajs.by_id.pop(t, None)
            await w.rt.close()

    assert asyncio.run(go()) == ["episode-2", "episode-3", "episode-4"]


@pytest.mark.parametrize("join_new_nodes", [False, True], ids=["listed", "agent-failed"])
def test_a_ray_node_that_died_leaves_the_unplaced_list(monkeypatch, join_new_nodes) -> None:
    """A Ray node listed as unplaced (not joined, or its agent failed) stayed listed, and in
    the watch's sets, after Ray reported it dead or dropped it from its table: on a cluster
    whose nodes come and go, status()'s unplaced_nodes named every dead node for the actor's
    life and the sets grew with each. A Ray node id is never reused, so it goes."""

    def broken(nodes: Any) -> Any:
        raise RuntimeError("its agent could not start")

    async def go() -> None:
        w = Watch(monkeypatch, RayConfig(join_new_nodes=join_new_nodes), broken)
        await w.rt.start()
        try:
            w.table.append(ray_node("id-c", "c"))
            await w.check()
            assert w.members.unplaced == {"id-b": "b", "id-c": "c"}
            w.table[1] = {**w.table[1], "Alive": False}  # b: dead, still in Ray's table
            del w.table[2]  # c: gone from the table
            await w.check()
            assert w.members.unplaced == {}
            assert not (w.members.tried | w.members.clashes) & {"id-b", "id-c"}
            assert not set(w.members.join_failures) & {"id-b", "id-c"}
        finally:
            await w.rt.close()

    asyncio.run(go())
