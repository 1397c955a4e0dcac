"""Weighted CPU grants in the live runtime, as a specification: under the default policy
(whose grants lend idle cycles, ``Capabilities.cpu_lends_idle``) a started action's container
runs on all the node's cores with no quota at a weight of its units; under ``tangram-paper``,
or with ``RuntimeConfig.exclusive_cores``, on its own cores under a quota. A malleable action's
resizes change its weight and leave its cpuset alone. Each action waits for a file the test
writes, so the container is looked at while the action runs (no timing is asserted)."""

from __future__ import annotations

import asyncio
import time
from pathlib import Path
from typing import Any

import pytest

from tangram.core.resources import ClusterSpec, CpuNodeSpec
from tangram.exec.runtime import ActionSpec, CpuExecutor, CpuWork, Runtime, RuntimeConfig
from tangram.exec.runtime.reporting import status
from tests.exec.test_aoe_weighted import cgroup_state

NODE = CpuNodeSpec("local", cores=2, numa_domains=1, memory_gb=16.0)
CLUSTER = ClusterSpec(name="weighted", cpu_nodes=(NODE,))

#: Prints its affinity and told cores, marks /tmp/started, then waits (at most 30 s) for
#: /tmp/go, which the test writes through the container's root.
HOLD = (
    "grep Cpus_allowed_list /proc/self/status | cut -f2; echo $TANGRAM_CORES; "
    "rm -f /tmp/go; touch /tmp/started; i=0; "
    'while [ ! -e /tmp/go ] && [ "$i" -lt 3000 ]; do sleep 0.01; i=$((i+1)); done; '
    "rm -f /tmp/started /tmp/go"
)


class Holder:
    """The held action of one trajectory: ``started()`` once it waits, ``release()`` to end it."""

    def __init__(self, rt: Runtime, docker_client: Any, traj: str) -> None:
        container = rt.cpu.container_of(traj)  # type: ignore[union-attr]
        pid = docker_client.api.inspect_container(container)["State"]["Pid"]
        self.root = Path(f"/proc/{pid}/root/tmp")

    def started(self) -> bool:
        return (self.root / "started").exists()

    def release(self) -> None:
        (self.root / "go").touch()


async def until(check: Any, what: str, within_s: float = 30.0) -> None:
    deadline = time.monotonic() + within_s
    while not check():
        assert time.monotonic() < deadline, f"never: {what}"
        await asyncio.sleep(0.005)


def runtime(docker_client: Any, config: RuntimeConfig) -> Runtime:
    from tangram.exec.aoe import AoeConfig, AoeManager

    aoe = AoeManager(AoeConfig(kill_grace_s=3.0), client=docker_client)
    return Runtime(CLUSTER, config, cpu=CpuExecutor(aoe, NODE))


def lends_idle(policy: str) -> bool:
    from tangram.core.policies import make_policy

    return bool(getattr(make_policy(policy).capabilities, "cpu_lends_idle", False))


@pytest.mark.parametrize(
    ("policy", "exclusive"), [("tangram", False), ("tangram-paper", False), ("tangram", True)]
)
def test_a_started_action_is_weighted_under_the_default_policy_else_exclusive(
    docker_client: Any, policy: str, exclusive: bool
) -> None:
    weighted = lends_idle(policy) and not exclusive
    if policy == "tangram" and not exclusive:
        assert weighted, "the default policy's CPU grants lend idle cycles"

    async def main() -> None:
        config = RuntimeConfig(policy=policy, default_timeout_s=60.0, exclusive_cores=exclusive)
        async with runtime(docker_client, config) as rt:
            assert rt.weighted_cpu is weighted and rt.cpu.weighted is weighted  # type: ignore[union-attr]
            grants = status(rt)["executors"]["cpu_grants"]
            assert grants == ("weighted" if weighted else "exclusive")
            assert rt.trace_meta()["cpu_grants"] == grants
            await rt.open_trajectory("t")
            held = Holder(rt, docker_client, "t")
            aid = await rt.submit(ActionSpec(CpuWork(HOLD), trajectory="t", max_units=1))
            await until(held.started, "the action started")
            running = cgroup_state(rt.cpu.aoe, "t")  # type: ignore[union-attr]
            free = rt.cpu.aoe.free_cores()  # type: ignore[union-attr]
            held.release()
            out = await rt.result(aid, wait_s=30)
            parked = cgroup_state(rt.cpu.aoe, "t")  # type: ignore[union-attr]

        assert out is not None and out.status == "result", out
        affinity, told = out.value.stdout.split()
        assert out.units == 1 and told == "1"
        assert len(free) == 1  # the ledger holds its one nominal core either way
        if weighted:
            assert affinity == "0-1"
            assert running == {"cpus": "0-1", "quota": None, "weight": 1.0, "frozen": False}
        else:
            assert affinity in ("0", "1") and free == (1 - int(affinity),)
            assert running == {"cpus": affinity, "quota": 1.0, "weight": 1.0, "frozen": False}
        assert parked["frozen"] and parked["cpus"] == "0-1" and parked["weight"] == 1.0

    asyncio.run(main())


def test_a_weighted_malleable_action_is_reweighed_not_moved(docker_client: Any) -> None:
    if not lends_idle("tangram"):
        pytest.fail("the default policy's CPU grants must lend idle cycles for this test")

    async def main() -> None:
        config = RuntimeConfig(policy="tangram", default_timeout_s=60.0)
        async with runtime(docker_client, config) as rt:
            aoe = rt.cpu.aoe  # type: ignore[union-attr]
            await rt.open_trajectory("long")
            await rt.open_trajectory("short")
            long_held = Holder(rt, docker_client, "long")
            short_held = Holder(rt, docker_client, "short")
            long_spec = ActionSpec(
                CpuWork(HOLD),
                trajectory="long",
                max_units=2,
                t1_s=60.0,
                serial_fraction=0.0,
                malleable=True,
            )
            long_id = await rt.submit(long_spec)
            await until(long_held.started, "the long action started")
            alone = cgroup_state(aoe, "long")
            short_id = await rt.submit(ActionSpec(CpuWork(HOLD), trajectory="short", t1_s=0.5))
            # The short one starts once the long one's shrink gave a core back (AOE's ledger).
            await until(short_held.started, "the short action started")
            shared = cgroup_state(aoe, "long"), cgroup_state(aoe, "short")
            short_held.release()
            short = await rt.result(short_id, wait_s=30)
            await until(lambda: len(rt.host.resizes) >= 2, "the long action grew back")
            await until(lambda: cgroup_state(aoe, "long")["weight"] == 2.0, "its weight grew")
            long_held.release()
            out = await rt.result(long_id, wait_s=30)
            resizes = list(rt.host.resizes)

        assert out is not None and out.status == "result", out
        assert short is not None and short.status == "result", short
        assert out.value.stdout.split() == ["0-1", "2"]  # all the node, told its 2 cores
        assert short.value.stdout.split() == ["0-1", "1"]
        assert alone == {"cpus": "0-1", "quota": None, "weight": 2.0, "frozen": False}
        assert shared == (
            {"cpus": "0-1", "quota": None, "weight": 1.0, "frozen": False},
            {"cpus": "0-1", "quota": None, "weight": 1.0, "frozen": False},
        )
        shrink, grow = resizes
        assert (shrink.action_id, shrink.status, shrink.previous) == (long_id, "applied", 2)
        assert (grow.action_id, grow.status, grow.previous) == (long_id, "applied", 1)

    asyncio.run(main())
