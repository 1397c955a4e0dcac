"""Fixtures of the live-runtime and service tests.

``docker_client`` gets a running engine with Tangram's images, starting one with
``scripts/ensure-docker.sh`` when ``docker info`` fails; nothing skips: a green run without
Docker would say nothing about the containers. ``service`` is a full service (AOE + EOE on
CPU-backed devices + API endpoints, some of them faulty on purpose) on a background thread,
reached over HTTP on loopback.
"""

from __future__ import annotations

import asyncio
import collections
import subprocess
import threading
from collections.abc import Iterator
from typing import Any

import pytest

from tangram.core.resources import ApiEndpointSpec, ClusterSpec, CpuNodeSpec, GpuNodeSpec


@pytest.fixture(scope="session")
def docker_client() -> Any:
    from tangram.exec.aoe.errors import EngineUnavailable
    from tangram.exec.aoe.images import IMAGES, connect, ensure_engine, has_image

    ok = subprocess.run(["docker", "info"], capture_output=True, check=False).returncode == 0
    try:
        if not ok:
            ensure_engine(python_image=True)
        client = connect()
        if not all(has_image(client, image) for image in IMAGES):
            ensure_engine(python_image=True)
    except (EngineUnavailable, FileNotFoundError) as exc:
        pytest.fail(f"the live tests need a Docker engine and could not get one: {exc}")
    return client


def live_cluster(
    *, cores: int = 2, memory_gb: float = 16.0, extra_apis: tuple[ApiEndpointSpec, ...] = ()
) -> ClusterSpec:
    """This machine's shape, with the endpoints the tests use."""
    return ClusterSpec(
        name="live-test",
        cpu_nodes=(CpuNodeSpec("local", cores=cores, numa_domains=1, memory_gb=memory_gb),),
        gpu_nodes=(
            GpuNodeSpec(
                "local-gpu",
                gpus=2,
                gpu_memory_gb=2.0,
                host_memory_gb=8.0,
                h2d_gbps=10.0,
                restore_fixed_s=0.001,
            ),
        ),
        apis=(
            ApiEndpointSpec("echo", concurrency=256),
            ApiEndpointSpec("search", concurrency=4, rate_per_s=50.0, burst=4),
            ApiEndpointSpec("faulty", concurrency=8),
            ApiEndpointSpec("slow", concurrency=64),
            ApiEndpointSpec("counted", concurrency=3),
            *extra_apis,
        ),
    )


class CallLog:
    """Thread-safe counts of endpoint calls by key, and the most calls seen at once."""

    def __init__(self) -> None:
        self.calls: collections.Counter[str] = collections.Counter()
        self.in_flight = 0
        self.peak = 0
        self.lock = threading.Lock()

    def enter(self, key: str) -> None:
        with self.lock:
            self.calls[key] += 1
            self.in_flight += 1
            self.peak = max(self.peak, self.in_flight)

    def leave(self) -> None:
        with self.lock:
            self.in_flight -= 1


def faulty_endpoints(log: CallLog) -> dict[str, Any]:
    """Endpoints for the tests: ``faulty`` raises, ``slow`` sleeps, ``counted`` records calls."""

    async def faulty(payload: Any) -> Any:
        raise RuntimeError(f"the endpoint broke on {payload!r}")

    async def slow(payload: Any) -> Any:
        await asyncio.sleep(float((payload or {}).get("s", 1.0)))
        return "slept"

    async def counted(payload: Any) -> Any:
        log.enter(str(payload.get("key")))
        try:
            await asyncio.sleep(float(payload.get("s", 0.01)))
        finally:
            log.leave()
        return {"key": payload.get("key")}

    return {"faulty": faulty, "slow": slow, "counted": counted}


def failing_service() -> Any:
    """An EOE service whose call raises (a buggy reward model)."""
    import torch

    from tangram.exec.eoe import ServiceSpec

    def call(module: Any, inputs: Any) -> Any:
        raise ValueError("the reward model crashed on purpose")

    return ServiceSpec(name="broken", factory=lambda: torch.nn.Linear(4, 1), call=call, dops=(1, 2))


def sleepy_service() -> Any:
    """An EOE service whose call sleeps ``inputs`` seconds (a slow model, DoP 1 only)."""
    import time

    import torch

    from tangram.exec.eoe import ServiceSpec

    def call(module: Any, inputs: Any) -> Any:
        time.sleep(float(inputs))
        return "woke"

    return ServiceSpec(name="sleepy", factory=lambda: torch.nn.Linear(1, 1), call=call, dops=(1,))


@pytest.fixture(scope="module")
def service(docker_client: Any, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Any]:
    """A full service over HTTP: its ``url``, ``runtime``, ``calls`` (CallLog), ``trace_path``."""
    from tangram.exec.aoe import AoeConfig
    from tangram.exec.runtime import RuntimeConfig, build_runtime, default_services
    from tangram.exec.service import ServeOptions, ServiceThread

    log = CallLog()
    trace_path = tmp_path_factory.mktemp("trace") / "live.jsonl"

    def make() -> Any:
        return build_runtime(
            live_cluster(),
            RuntimeConfig(max_pending=4096, default_timeout_s=120.0, trace_path=trace_path),
            gpu_backend="cpu",
            services=[*default_services(), failing_service(), sleepy_service()],
            endpoints=faulty_endpoints(log),
            aoe_config=AoeConfig(kill_grace_s=3.0),
            docker_client=docker_client,
        )

    thread = ServiceThread(make, ServeOptions(port=0, trace_path=trace_path))
    thread.start()
    thread.calls = log  # type: ignore[attr-defined]
    thread.trace_path = trace_path  # type: ignore[attr-defined]
    try:
        yield thread
    finally:
        thread.stop()


def fail_commits(writer: Any) -> Any:
    """Put the journal writer's connection on a disk that fails: every transaction's BEGIN
    raises 'disk I/O error', other statements reach the real connection. Returns the real
    one (set ``writer.db`` back to it when the disk recovers)."""
    import sqlite3

    real = writer.db

    class Broken:
        in_transaction = False

        def execute(self, sql: str, *args: Any) -> Any:
            if sql == "BEGIN":
                raise sqlite3.OperationalError("disk I/O error")
            return real.execute(sql, *args)

    writer.db = Broken()
    return real
