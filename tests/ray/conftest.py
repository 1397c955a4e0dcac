"""A 3-node Ray cluster on this machine (``tangram.exec.ray.local``), in a network namespace
that has only loopback, and a scheduler actor on it serving HTTP on 127.0.0.1.

On this machine Ray binds the machine's interface even when told 127.0.0.1; in a namespace
with only ``lo`` every node binds 127.0.0.1 (``/work/shared/design.md``). The session enters
such a namespace on its main thread (Ray's processes are its children and inherit it) and
goes back to the machine's after the last test of this package (the fixture's scope), so
the rest of the suite runs outside it. Docker is reached through its Unix socket.

Nodes: ``head`` (no container cores, 2 CPU-backed GPU devices; the scheduler actor and the
driver run here), ``w1`` (host core 0) and ``w2`` (host core 1), each with 2 CPU-backed GPU
devices: disjoint shares of this machine's cores. The scheduler takes its spec from a cluster
file (``CLUSTER``) that also declares ``w3``, a GPU node that joins in the fault tests;
``tangram serve --ray`` and ``tangram bench ray`` (their tests) take it from the Ray nodes. One cluster for the package (a start costs
~20 s); ``test_ray_faults.py`` changes it and runs last of the tests that use it.
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import pytest

from tangram.core.resources import ApiEndpointSpec, ClusterSpec, CpuNodeSpec, GpuNodeSpec
from tests.live.conftest import docker_client  # noqa: F401 - the engine, started if needed


def _gpu(name: str) -> GpuNodeSpec:
    return GpuNodeSpec(
        name, gpus=2, gpu_memory_gb=2.0, host_memory_gb=8.0, h2d_gbps=10.0, restore_fixed_s=0.001
    )


#: The cluster file of the tests' scheduler: the local nodes by their ``tangram-name``, and
#: ``w3``, a GPU node declared but not started (fenced until it joins).
CLUSTER = ClusterSpec(
    name="ray-tests",
    cpu_nodes=tuple(CpuNodeSpec(n, cores=1, numa_domains=1, memory_gb=8.0) for n in ("w1", "w2")),
    gpu_nodes=tuple(_gpu(n) for n in ("head", "w1", "w2", "w3")),
    apis=(ApiEndpointSpec("echo", concurrency=256), ApiEndpointSpec("counted", concurrency=3)),
)


@dataclass
class RayCluster:
    """The running cluster (``local``), the scheduler actor's handle, info and config."""

    local: Any
    handle: Any = None
    info: Any = None
    config: Any = None


def counted_endpoint() -> Any:
    """An endpoint that appends ``key start end`` (monotonic, system-wide clock) to the file
    its payload names: the test counts each key's runs and the most calls in flight."""

    async def counted(payload: Any) -> Any:
        import asyncio
        import time

        t0 = time.monotonic()
        await asyncio.sleep(float(payload.get("s", 0.0)))
        with open(payload["file"], "a") as f:
            f.write(f"{payload['key']} {t0:.6f} {time.monotonic():.6f}\n")
        return {"key": payload["key"]}

    return counted


@pytest.fixture(scope="package")
def ray_cluster(request: pytest.FixtureRequest) -> Iterator[RayCluster]:
    """The 3-node cluster and a started scheduler actor (HTTP service on 127.0.0.1)."""
    request.getfixturevalue("docker_client")  # the engine and images, started if needed
    import ray

    from tangram.exec.ray import RayConfig, start, stop
    from tangram.exec.ray.local import LocalCluster, loopback_namespace
    from tangram.exec.runtime import RuntimeConfig
    from tangram.exec.service import ServeOptions

    t0 = time.monotonic()
    with loopback_namespace():
        local = LocalCluster.start()
        rc = RayCluster(local)
        try:
            ray.init(address=local.address, namespace="tangram-tests", log_to_driver=False)
            rc.config = RayConfig(
                namespace="tangram-tests",
                runtime=RuntimeConfig(max_pending=4096, default_timeout_s=120.0),
                cluster=CLUSTER,
                endpoints={"counted": counted_endpoint()},
                aoe={"kill_grace_s": 3.0},
                http=ServeOptions(port=0),
                ping_every_s=0.25,
                # Silence alone loses a node only after one ping goes this long unanswered.
                # On a loaded 2-core machine the scheduler actor's event loop fell behind by
                # 2-21 s in the acceptance test and every node was "lost" at once (the watch
                # then counted its own lag as silence: fixed in membership.check, tested in
                # test_ray_membership.py), and a freshly joined agent went 100 s unheard. No
                # test here waits for silence: a killed agent fails its pings at once, a
                # stopped node is dead by Ray's health check.
                lost_after_s=300.0,
            )
            rc.handle, rc.info = start(rc.config)
            print(f"3-node Ray cluster and Tangram up in {time.monotonic() - t0:.1f} s")
            yield rc
        finally:
            try:
                if rc.handle is not None:
                    stop(rc.config)
            except Exception as exc:  # noqa: BLE001 - shutting down anyway
                print(f"stopping the scheduler actor: {exc}")
            ray.shutdown()
            local.shutdown()
