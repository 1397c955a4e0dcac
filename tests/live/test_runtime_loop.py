"""The live runtime on the one driver loop (``tangram.core.loop.DriverLoop``): arrivals it
withdraws before any pass, a pass the core fails on, wake-ups, and the loop let go at close.
API work only (no Docker, no torch)."""

from __future__ import annotations

import asyncio
from typing import Any

from tangram.core.loop import DriverLoop
from tangram.core.resources import ApiEndpointSpec, ClusterSpec
from tangram.exec.runtime import ActionSpec, ApiExecutor, ApiWork, Runtime, RuntimeConfig
from tangram.exec.runtime.actions import Phase
from tangram.exec.runtime.api import echo

CLUSTER = ClusterSpec(
    name="loop",
    apis=(
        ApiEndpointSpec("echo", concurrency=64),
        ApiEndpointSpec("limited", concurrency=8, rate_per_s=20.0, burst=1),
        ApiEndpointSpec("slow", concurrency=1),
    ),
)


async def slow(payload: Any) -> Any:
    await asyncio.sleep(float(payload))
    return payload


def runtime(**config: Any) -> Runtime:
    return Runtime(
        CLUSTER,
        RuntimeConfig(**config),
        api=ApiExecutor({"echo": echo, "limited": echo, "slow": slow}),
    )


def spy_on_passes(rt: Runtime) -> list[list[str]]:
    """The ids of the arrivals each ``Scheduler.advance`` call was given."""
    seen: list[list[str]] = []
    real = rt.scheduler.advance

    def spy(now: float, *, finished: Any = (), arrived: Any = ()) -> Any:
        seen.append([a.id for a in arrived])
        return real(now, finished=finished, arrived=arrived)

    rt.scheduler.advance = spy  # type: ignore[method-assign]
    return seen


def test_the_runtime_drives_the_core_through_the_driver_loop() -> None:
    async def main() -> None:
        async with runtime() as rt:
            assert isinstance(rt.host.loop, DriverLoop) and rt.host.loop.host is rt.host
            outs = await asyncio.gather(*(rt.run(ActionSpec(ApiWork("echo", i))) for i in range(5)))
            assert all(o.ok for o in outs)
            assert rt.passes == rt.host.loop.passes >= 2  # the arrivals' pass, the finishes'
        assert rt.host.loop.host is None, "closing lets the loop go (no reference cycle)"

    asyncio.run(main())


def test_an_action_cancelled_before_any_pass_never_reaches_the_core() -> None:
    async def main() -> None:
        async with runtime() as rt:
            seen = spy_on_passes(rt)
            kept = await rt.submit(ActionSpec(ApiWork("echo", 1), id="kept"))
            gone = await rt.submit(ActionSpec(ApiWork("echo", 2), id="gone"))
            assert rt.host.table.get(gone).phase is Phase.ARRIVING  # type: ignore[union-attr]
            out = await rt.cancel(gone)  # same loop iteration: no pass has run
            assert out.error.code == "cancelled" and out.start_s is None
            assert rt.host.table.get(gone).phase is Phase.OUT  # type: ignore[union-attr]
            assert (await rt.result(kept)).ok  # type: ignore[union-attr]
            assert [ids for ids in seen if ids] == [["kept"]]
            assert rt.pending == 0

    asyncio.run(main())


def test_a_pass_the_core_fails_on_ends_its_arrivals_with_an_error_and_the_runtime_goes_on() -> None:
    async def main() -> None:
        async with runtime() as rt:
            real = rt.scheduler.advance
            calls = []

            def fails_once(now: float, *, finished: Any = (), arrived: Any = ()) -> Any:
                calls.append(len(arrived))
                if len(calls) == 1:
                    raise RuntimeError("a core bug")
                return real(now, finished=finished, arrived=arrived)

            rt.scheduler.advance = fails_once  # type: ignore[method-assign]
            first = await asyncio.gather(
                *(rt.run(ActionSpec(ApiWork("echo", i))) for i in range(3))
            )
            assert {o.error.code for o in first} == {"scheduler_error"}
            assert all("RuntimeError: a core bug" in o.error.message for o in first)
            assert all(rt.host.table.get(o.action_id).phase is Phase.OUT for o in first)  # type: ignore[union-attr]
            later = await rt.run(ActionSpec(ApiWork("echo", "after")))
            assert later.ok and later.value == "after"
            assert rt.pending == 0

    asyncio.run(main())


def test_rate_limited_starts_come_from_wake_ups_alone() -> None:
    async def main() -> None:
        async with runtime() as rt:
            outs = await asyncio.gather(
                *(rt.run(ActionSpec(ApiWork("limited", i))) for i in range(4))
            )
            starts = sorted(o.start_s for o in outs)
            assert all(b - a > 0.03 for a, b in zip(starts, starts[1:], strict=False))

    asyncio.run(main())


def test_close_ends_what_waits_lets_what_runs_finish_and_detaches_the_loop() -> None:
    async def main() -> None:
        rt = runtime(close_grace_s=5.0)
        await rt.start()
        ran = await rt.submit(ActionSpec(ApiWork("slow", 0.1)))
        await asyncio.sleep(0.02)
        waiting = await rt.submit(ActionSpec(ApiWork("slow", 0.1)))
        await rt.close()
        assert (await rt.result(ran)).ok  # type: ignore[union-attr]
        out = await rt.result(waiting)
        assert out.error.code == "shutting_down" and out.error.retryable  # type: ignore[union-attr]
        assert rt.host.loop.host is None and rt.pending == 0

    asyncio.run(main())


class _HeldAoe:
    """AOE's calls for ``CpuExecutor`` without containers (two cores): an action whose
    command is ``hold`` runs until ``release`` is set (10 s at most); every run is logged."""

    def __init__(self) -> None:
        import threading

        from tangram.exec.aoe.records import ContainerHandle

        self.topology = type("Topology", (), {"cores": (0, 1)})()
        self.release = threading.Event()
        self.ran: list[Any] = []
        self._handle = ContainerHandle

    def open_trajectory(self, traj: str, memory_gb: float, *, image: str | None = None) -> Any:
        return self._handle(traj, f"c-{traj}", f"fake-{traj}", image or "fake", memory_gb)

    def close_trajectory(self, traj: str) -> None:
        pass

    def run_action(self, traj: str, command: Any, cores: tuple[int, ...], **kw: Any) -> Any:
        from tangram.exec.aoe.records import ActionOutcome

        self.ran.append(command)
        if command == "hold":
            self.release.wait(10)
        return ActionOutcome(traj, kw["action_id"], "ok", 0, b"", b"", None, cores, len(cores))

    def shutdown(self) -> None:
        self.release.set()


def _fcfs_cpu_runtime(aoe: _HeldAoe) -> Runtime:
    """A runtime on a 2-core CPU node under strict FCFS (``fixed:2``): an action of 2 cores
    at the head of the queue holds back one of 1 core behind it."""
    from tangram.core.resources import CpuNodeSpec
    from tangram.exec.runtime import CpuExecutor

    node = CpuNodeSpec("local", cores=2, numa_domains=1, memory_gb=16.0)
    cluster = ClusterSpec(name="fcfs", cpu_nodes=(node,))
    return Runtime(cluster, RuntimeConfig(policy="fixed:2"), cpu=CpuExecutor(aoe, node))


async def _held_back(rt: Runtime, traj: str) -> tuple[str, str]:
    """One core held by a running action (in ``hold``), then a 2-core head that cannot
    start and a 1-core action behind it, both of ``traj``, both queued: (head, behind)."""
    from tangram.exec.runtime import CpuWork

    await rt.open_trajectory("holder", memory_gb=1.0)
    holder = await rt.submit(ActionSpec(CpuWork("hold"), trajectory="holder"))
    for _ in range(10_000):  # (5 s at most)
        if rt.state(holder) == "running":
            break
        await asyncio.sleep(0.0005)
    spec = {"trajectory": traj, "timeout_s": 60}
    head = await rt.submit(ActionSpec(CpuWork("head"), max_units=2, serial_fraction=0.0, **spec))
    behind = await rt.submit(ActionSpec(CpuWork("behind"), **spec))
    for _ in range(100):  # (their pass)
        await asyncio.sleep(0)
    assert (rt.state(holder), rt.state(head), rt.state(behind)) == ("running", "queued", "queued")
    return head, behind


def test_a_shutdown_refuses_every_queued_action_and_starts_none() -> None:
    """The shutdown ended the queued actions one by one, and the withdrawal of a queue's
    head let the core start the action it held back: that one ran during the shutdown
    instead of being refused (``shutting_down``, retryable: nothing ran). Every waiting
    action now has its outcome before any is withdrawn."""
    aoe = _HeldAoe()

    async def main() -> Any:
        rt = _fcfs_cpu_runtime(aoe)
        await rt.start()
        await rt.open_trajectory("t", memory_gb=1.0)
        head, behind = await _held_back(rt, "t")
        closing = asyncio.ensure_future(rt.close(grace_s=5.0))
        for _ in range(1000):  # (the close ends what waits before it waits for what runs)
            if rt.host.pending == 1:
                break
            await asyncio.sleep(0)
        aoe.release.set()
        await asyncio.wait_for(closing, timeout=30)
        return await rt.result(head), await rt.result(behind)

    head, behind = asyncio.run(main())
    for out in (head, behind):
        assert out.status == "error" and out.error is not None, out
        assert out.error.code == "shutting_down" and out.error.retryable, out
        assert out.start_s is None, out
    assert aoe.ran == ["hold"]


def test_closing_a_trajectory_ends_every_queued_action_of_it_and_starts_none() -> None:
    """Closing a trajectory ended its queued actions one by one, and the withdrawal of a
    queue's head let the core start the action of the same trajectory it held back: that one
    ran in the closing container instead of ending ``trajectory_closed``."""
    aoe = _HeldAoe()

    async def main() -> Any:
        async with _fcfs_cpu_runtime(aoe) as rt:
            await rt.open_trajectory("t", memory_gb=1.0)
            head, behind = await _held_back(rt, "t")
            await asyncio.wait_for(rt.close_trajectory("t"), timeout=30)
            outs = await rt.result(head), await rt.result(behind)
            aoe.release.set()
            return outs

    head, behind = asyncio.run(main())
    for out in (head, behind):
        assert out.status == "error" and out.error is not None, out
        assert out.error.code == "trajectory_closed", out
        assert out.start_s is None, out
    assert aoe.ran == ["hold"]


def test_an_open_waiting_for_memory_is_refused_at_once_when_the_runtime_closes() -> None:
    """An open waiting for a node's memory (``wait_s``) was not woken by the shutdown: it
    waited out the rest of its ``wait_s`` (``/run_code``'s is 300 s) after the runtime had
    closed, its client without an answer. It is refused with ``shutting_down`` at once."""
    from tangram.exec.runtime import ShuttingDown

    aoe = _HeldAoe()

    async def main() -> None:
        rt = _fcfs_cpu_runtime(aoe)  # (its node has 16 GB)
        await rt.start()
        await rt.open_trajectory("full", memory_gb=16.0)
        waiting = asyncio.ensure_future(rt.open_trajectory("next", memory_gb=1.0, wait_s=600))
        for _ in range(100):
            await asyncio.sleep(0)
        assert not waiting.done()
        await rt.close(grace_s=1.0)
        try:
            await asyncio.wait_for(waiting, timeout=10)
        except ShuttingDown:
            return
        raise AssertionError("the open succeeded after the shutdown")

    asyncio.run(main())
