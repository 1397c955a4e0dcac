"""Fixtures of the AOE tests: a real Docker engine (started and imaged by
``scripts/ensure-docker.sh`` when needed) and managers on it.

Nothing here skips: when the engine cannot be started the fixture fails with the script's
message, because a green run without Docker would say nothing about AOE.
"""

from __future__ import annotations

import os
import threading
import time
import weakref
from collections.abc import Iterator
from typing import Any

import pytest

#: Every warm pool made in this run, to check none is left working past its test.
_POOLS: weakref.WeakSet[Any] = weakref.WeakSet()


def _pool_jobs(pool: Any) -> tuple[int, int]:
    """A warm pool's resets and fills in flight (its worker threads' jobs)."""
    with pool._lock:
        return sum(pool._resetting.values()), sum(pool._filling.values())


@pytest.fixture(scope="session", autouse=True)
def _register_warm_pools() -> Iterator[None]:
    """Note each ``WarmPool`` made; at the session's end no pool worker may be left (a
    manager or pool someone never closed: ``WarmPool.close`` joins its workers)."""
    from tangram.exec.aoe.pool import WarmPool

    real_init = WarmPool.__init__

    def init(self: Any, *args: Any, **kwargs: Any) -> None:
        real_init(self, *args, **kwargs)
        _POOLS.add(self)

    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(WarmPool, "__init__", init)
        yield
    left = [t.name for t in threading.enumerate() if t.name.startswith("tangram-pool")]
    assert not left, f"warm pool workers outlived the run (a pool never closed): {left}"


@pytest.fixture(autouse=True)
def _no_pool_job_outlives_its_test() -> Iterator[None]:
    """Fail a test that ends with a warm pool's reset or fill still running: it would run on
    into the next test (a reset SIGKILLs the processes it lists as its container's, and once
    killed the test run when a later test patched that listing). Waits for them first, so
    the next test starts clean either way."""
    yield
    left = []
    for pool in list(_POOLS):
        if pool._closed:
            continue
        jobs = _pool_jobs(pool)
        if any(jobs):
            left.append(jobs)
            deadline = time.monotonic() + 60
            while any(_pool_jobs(pool)) and time.monotonic() < deadline:
                time.sleep(0.02)
    assert not left, (
        f"warm pool jobs (resets, fills) still running at the test's end: {left}; "
        "wait for them (tests/exec/test_aoe_pool.py's idle) before the test returns"
    )


@pytest.fixture(scope="session")
def docker_client() -> Any:
    """A client of a running engine with the tangram-busybox and tangram-python images."""
    from tangram.exec.aoe.errors import EngineUnavailable
    from tangram.exec.aoe.images import IMAGES, connect, ensure_engine, has_image

    try:
        ensure_engine(python_image=True)
        client = connect()
    except EngineUnavailable as exc:
        pytest.fail(f"the AOE tests need a Docker engine and could not get one: {exc}")
    for image in IMAGES:
        assert has_image(client, image), f"{image} missing after ensure-docker.sh"
    return client


@pytest.fixture(scope="module")
def manager(docker_client: Any) -> Iterator[Any]:
    """An AOE manager with the runner transport and direct cgroup writes (the defaults)."""
    from tangram.exec.aoe import AoeConfig, AoeManager

    with AoeManager(AoeConfig(kill_grace_s=3.0), client=docker_client) as m:
        yield m


@pytest.fixture(scope="module", params=["runner", "exec"])
def any_manager(request: pytest.FixtureRequest, docker_client: Any) -> Iterator[Any]:
    """The manager once per transport (persistent runner, one docker exec per action)."""
    from tangram.exec.aoe import AoeConfig, AoeManager

    with AoeManager(
        AoeConfig(transport=request.param, kill_grace_s=3.0), client=docker_client
    ) as m:
        yield m


@pytest.fixture
def trajectory(request: pytest.FixtureRequest) -> Iterator[Any]:
    """``trajectory(manager, **kw)`` opens a uniquely named trajectory, closed after the test."""
    opened: list[tuple[Any, str]] = []
    counter = iter(range(1000))

    def open_one(mgr: Any, **kwargs: Any) -> str:
        traj = f"{request.node.name[:30]}-{next(counter)}"
        mgr.open_trajectory(traj, **kwargs)
        opened.append((mgr, traj))
        return traj

    yield open_one
    for mgr, traj in opened:
        if traj in mgr.trajectories():
            mgr.close_trajectory(traj)


class HostCpu:
    """The whole machine's CPU use, to tell a failed grant from cores taken by other work."""

    @staticmethod
    def busy_s() -> float:
        """CPU seconds the machine has been busy (all processes, all cores)."""
        with open("/proc/stat") as stat:
            fields = [int(x) for x in stat.readline().split()[1:]]
        return (sum(fields[:8]) - fields[3] - fields[4]) / os.sysconf("SC_CLK_TCK")

    def wait_quiet(self, max_wait_s: float = 60.0, below: float = 0.3) -> float:
        """Wait until the machine's other work uses under ``below`` cores (measured over half
        a second), at most ``max_wait_s``; return the last level seen. Never skips: a test
        that then fails can say the machine was busy."""
        deadline = time.monotonic() + max_wait_s
        while True:
            b0, t0 = self.busy_s(), time.monotonic()
            time.sleep(0.5)
            level = (self.busy_s() - b0) / (time.monotonic() - t0)
            if level < below or time.monotonic() >= deadline:
                return level


@pytest.fixture
def host_cpu() -> HostCpu:
    return HostCpu()
