"""Malleable CPU actions in the live runtime, as a specification: the runtime's scheduler
resizes only when its CPU executor applies resizes; a malleable action alone on a node runs
on all of it, shrinks when a second action arrives (that one runs on the core it gave up) and
grows back when it ends, and its program sees each new cpuset; a resize that crosses the
action's end is a no-op; ``malleable`` on non-CPU work is a 400 naming the field."""

from __future__ import annotations

import asyncio
import os
import threading
import time
from types import SimpleNamespace
from typing import Any

import httpx
import pytest

from tangram.core.action import Action
from tangram.core.curves import Amdahl
from tangram.core.decision import Resize, Start
from tangram.core.resources import ApiEndpointSpec, ClusterSpec, CpuNodeSpec, ResourceKind
from tangram.exec.runtime import (
    ActionSpec,
    ApiExecutor,
    BadRequest,
    CpuExecutor,
    CpuWork,
    Runtime,
    RuntimeConfig,
)
from tangram.exec.runtime.api import echo
from tangram.exec.service import ServeOptions, ServiceThread
from tangram.exec.service.schema import parse_action
from tests.exec.test_aoe_resize import watch

NODE = CpuNodeSpec("local", cores=2, numa_domains=1, memory_gb=16.0)
CLUSTER = ClusterSpec(name="malleable", cpu_nodes=(NODE,), apis=(ApiEndpointSpec("echo", 4),))


def fake_aoe() -> Any:
    return SimpleNamespace(topology=SimpleNamespace(cores=(0, 1)), shutdown=lambda: None)


# --- which runtimes resize ------------------------------------------------------------------


def test_the_scheduler_resizes_only_with_a_cpu_executor_that_applies_resizes() -> None:
    with_aoe = Runtime(CLUSTER, cpu=CpuExecutor(fake_aoe(), NODE))
    assert with_aoe.scheduler.resizable
    assert not Runtime(CLUSTER, api=ApiExecutor({"echo": echo})).scheduler.resizable

    class FixedGrants(CpuExecutor):
        resizes = False  # (the Ray agents' executor says so)

    assert not Runtime(CLUSTER, cpu=FixedGrants(fake_aoe(), NODE)).scheduler.resizable
    from tangram.exec.ray.executors import RayCpuExecutor

    assert RayCpuExecutor.resizes is False


# --- submissions --------------------------------------------------------------------------


def test_malleable_is_a_cpu_field_and_a_400_naming_it_elsewhere() -> None:
    spec, _ = parse_action(
        {"command": "make -j", "trajectory": "t", "malleable": True}, max_output_bytes=64
    )
    assert spec.malleable
    with pytest.raises(BadRequest, match="malleable: only a cpu action"):
        parse_action({"endpoint": "echo", "payload": 1, "malleable": True}, max_output_bytes=64)
    with pytest.raises(BadRequest, match="'malleable'"):
        parse_action({"command": "x", "malleable": "yes"}, max_output_bytes=64)
    plain = ActionSpec(CpuWork("x"), trajectory="t")
    assert ActionSpec(CpuWork("x"), trajectory="t", malleable=True).fingerprint() != (
        plain.fingerprint()
    )

    def api_only() -> Runtime:
        return Runtime(CLUSTER, RuntimeConfig(), api=ApiExecutor({"echo": echo}))

    with ServiceThread(api_only, ServeOptions(port=0)) as svc:
        body = {"endpoint": "echo", "payload": 1, "malleable": True}
        answer = httpx.post(f"{svc.url}/v1/actions", json=body, timeout=10)
        assert answer.status_code == 400, answer.text
        assert "malleable" in answer.text
        ok = httpx.post(f"{svc.url}/v1/actions", json={**body, "malleable": False}, timeout=10)
        assert ok.status_code in (200, 202), ok.text


# --- with Docker: a program whose cores change under it ---------------------------------


def container_marker(rt: Runtime, docker_client: Any, traj: str):
    """``seen(n)``: the program in ``traj``'s container has printed its n-th affinity."""
    container = rt.cpu.container_of(traj)  # type: ignore[union-attr]
    pid = docker_client.api.inspect_container(container)["State"]["Pid"]
    return lambda n: os.path.exists(f"/proc/{pid}/root/tmp/seen-{n}")


async def until(check: Any, what: str, within_s: float = 20.0) -> None:
    deadline = time.monotonic() + within_s
    while not check():
        assert time.monotonic() < deadline, f"never: {what}"
        await asyncio.sleep(0.005)


def test_a_malleable_action_shrinks_for_an_arrival_and_grows_back(docker_client: Any) -> None:
    from tangram.exec.aoe import AoeConfig, AoeManager
    from tangram.exec.aoe.config import PYTHON_IMAGE

    async def main() -> None:
        aoe = AoeManager(AoeConfig(kill_grace_s=3.0), client=docker_client)
        cpu = CpuExecutor(aoe, NODE)
        # Exclusive grants: a resize moves the cpuset, which the program sees. (Weighted
        # grants, the default policy's, keep the cpuset on the node's cores and resize the
        # weight: tests/live/test_weighted_live.py.)
        config = RuntimeConfig(policy="tangram", default_timeout_s=60.0, exclusive_cores=True)
        async with Runtime(CLUSTER, config, cpu=cpu) as rt:
            await rt.open_trajectory("long", image=PYTHON_IMAGE)
            await rt.open_trajectory("short")
            seen = container_marker(rt, docker_client, "long")
            long_id = await rt.submit(
                ActionSpec(
                    CpuWork(watch(2)),
                    trajectory="long",
                    max_units=2,
                    t1_s=60.0,
                    serial_fraction=0.0,
                    malleable=True,
                )
            )
            await until(lambda: seen(1), "the long action printed its first cpuset")
            short = await rt.run(
                ActionSpec(
                    # (it lasts 0.3 s, so the long one's 2-ms polls see it shrunk)
                    CpuWork("grep Cpus_allowed_list /proc/self/status | cut -f2; sleep 0.3"),
                    trajectory="short",
                    t1_s=0.5,
                )
            )
            await until(lambda: seen(2), "the long action saw its cpuset shrink")
            out = await rt.result(long_id, wait_s=30)
            resizes = list(rt.host.resizes)
            counters = dict(rt.counters)

        assert out is not None and out.status == "result", out
        first, *after = out.value.stdout.split()
        assert out.units == 2 and first == "0,1"  # alone: the whole node
        shrink, grow = resizes
        assert (shrink.action_id, shrink.status, shrink.previous) == (long_id, "applied", 2)
        assert (grow.action_id, grow.status, grow.previous) == (long_id, "applied", 1)
        assert len(shrink.cores) == 1 and grow.cores == (0, 1)
        # What the program saw is what the core decided (node core i is host core i here).
        assert after == [",".join(map(str, shrink.cores)), "0,1"]
        # The short action ran on the core the long one gave up.
        assert short.status == "result" and short.units == 1
        freed = set((0, 1)) - set(shrink.cores)
        assert short.value.stdout.strip() == str(freed.pop())
        assert counters["resizes_applied"] == 2 and counters.get("resizes_failed", 0) == 0
        print(
            f"\nlive resizes: shrink {shrink.write_s * 1e6:.0f} us, grow "
            f"{grow.write_s * 1e6:.0f} us of cgroup writes"
        )

    asyncio.run(main())


def test_a_resize_that_crosses_the_end_is_a_no_op(docker_client: Any) -> None:
    from tangram.exec.aoe import AoeConfig, AoeManager

    async def main() -> None:
        aoe = AoeManager(AoeConfig(kill_grace_s=3.0), client=docker_client)
        cpu = CpuExecutor(aoe, NODE)
        async with Runtime(CLUSTER, RuntimeConfig(policy="tangram"), cpu=cpu) as rt:
            await rt.open_trajectory("t")
            spec = ActionSpec(CpuWork("echo done"), trajectory="t", max_units=2, malleable=True)
            aid = await rt.submit(spec)
            out = await rt.result(aid, wait_s=30)
            rec = rt.host.table.get(aid)
            assert out is not None and rec is not None
            # The core decided it before it heard of the end (at the host, and at the
            # executor whose run has returned): nothing happens, the outcome stands.
            rt.host.resize(Resize(rt.now(), rec.action, "local", 1, (0,), 2, "late"))
            late = await cpu.resize(aid, (0,))
            assert late.status == "ended"
            assert rt.host.resizes[-1].status == "ended"
            assert rt.counters["resizes_ended"] == 1
            assert rt.host.table.get(aid).outcome is out and out.status == "result"
            assert aoe.free_cores() == (0, 1)
            again = await rt.run(ActionSpec(CpuWork("echo again"), trajectory="t"))
            assert again.value.stdout == "again\n"

    asyncio.run(main())


# --- the executor's order: a resize before AOE's grant is applied at the grant ----------


class GatedAoe:
    """A stand-in AOE whose ``run_action`` records the cores it was asked for, then waits for
    ``grant`` before handing its hook a stand-in grant, then for ``finish``."""

    def __init__(self) -> None:
        self.topology = SimpleNamespace(cores=(0, 1))
        self.called, self.grant, self.finish = (
            threading.Event(),
            threading.Event(),
            threading.Event(),
        )
        self.asked: tuple[int, ...] = ()
        self.running: StandInGrant | None = None

    def run_action(self, traj: str, command: Any, cores: tuple[int, ...], **kw: Any) -> Any:
        from tangram.exec.aoe.records import ActionOutcome

        self.asked = cores
        self.called.set()
        assert self.grant.wait(10)
        self.running = StandInGrant(cores)
        kw["on_grant"](self.running)
        assert self.finish.wait(10)
        return ActionOutcome(traj, "a", "ok", 0, b"", b"", None, cores, 1.0, {})

    def shutdown(self) -> None:
        pass


class StandInGrant:
    def __init__(self, cores: tuple[int, ...]) -> None:
        self.cores = cores
        self.moves: list[tuple[int, ...]] = []

    def resize(self, cores: tuple[int, ...]) -> Any:
        from tangram.exec.aoe.resize import ResizeResult

        self.moves.append(cores)
        self.cores = cores
        return ResizeResult("applied", cores)


def started(action_id: str = "m1") -> Start:
    action = Action(
        action_id, "t", ResourceKind.CPU, Amdahl(4.0, 0.0), 0.0, max_units=2, malleable=True
    )
    return Start(0.0, action, "local", 2, "test", cores=(0, 1))


def test_a_resize_before_aoe_runs_the_action_changes_the_cores_it_asks_for() -> None:
    async def main() -> None:
        aoe = GatedAoe()
        cpu = CpuExecutor(aoe, NODE, threads=1)
        blocker = threading.Event()
        cpu._actions.submit(blocker.wait, 10)  # the action's thread is busy for now
        task = asyncio.create_task(
            cpu.execute(CpuWork("x"), started(), trajectory="t", time_left_s=10)
        )
        await asyncio.sleep(0)  # execute registered it and queued its run
        assert (await cpu.resize("m1", (1,))).status == "pending"
        blocker.set()
        await asyncio.to_thread(aoe.called.wait, 10)
        assert aoe.asked == (1,)  # AOE was asked for the resized set
        aoe.grant.set()
        aoe.finish.set()
        assert (await task).status == "result"
        assert aoe.running is not None and aoe.running.moves == []  # nothing left to apply
        assert (await cpu.resize("m1", (0,))).status == "ended"

    asyncio.run(main())


def test_a_resize_between_aoe_call_and_grant_is_applied_at_the_grant() -> None:
    async def main() -> None:
        aoe = GatedAoe()
        cpu = CpuExecutor(aoe, NODE)
        task = asyncio.create_task(
            cpu.execute(CpuWork("x"), started(), trajectory="t", time_left_s=10)
        )
        await asyncio.to_thread(aoe.called.wait, 10)
        assert aoe.asked == (0, 1)
        assert (await cpu.resize("m1", (0,))).status == "pending"
        aoe.grant.set()
        await until(lambda: aoe.running is not None and aoe.running.moves, "applied at the grant")
        assert aoe.running.moves == [(0,)]
        after = await cpu.resize("m1", (0, 1))  # granted now: straight to AOE's grant
        assert after.status == "applied" and aoe.running.moves == [(0,), (0, 1)]
        aoe.finish.set()
        assert (await task).status == "result"

    asyncio.run(main())


def test_a_resize_that_fails_at_the_grant_is_not_counted_in_the_cores_held() -> None:
    """A resize decided before AOE's grant is applied at the grant; when that failed (the
    action runs on, on its old cores), the grant history recorded the resized count all the
    same, and the trace's observed units (``held_units``) of the action were the cores it
    never had. It records the cores the action runs on."""
    from tangram.exec.aoe.resize import ResizeResult
    from tangram.exec.runtime.cpu import _Grant

    class Refuses:
        action_id = "m1"
        cores = (0, 1)

        def resize(self, cores: tuple[int, ...]) -> Any:
            return ResizeResult("failed", self.cores, error="cgroup write refused")

    cpu = CpuExecutor(GatedAoe(), NODE, threads=1, lifecycle_threads=1)
    try:
        entry = _Grant((0, 1))
        entry.cores = (0,)  # the pending resize, decided before the grant
        cpu._granted(entry, Refuses())  # type: ignore[arg-type]
        assert [units for _, units in entry.history] == [2], "it runs on its 2 old cores"
    finally:
        cpu.shutdown()
