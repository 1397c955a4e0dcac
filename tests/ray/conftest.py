"""A 3-node Ray cluster on this machine, in a network namespace that has only loopback.

On this machine Ray binds the machine's interface even when told 127.0.0.1; in a namespace
with only ``lo`` every node binds 127.0.0.1 (``/work/shared/design.md``). The session enters
such a namespace on its main thread (``unshare(CLONE_NEWNET)``, root; Ray's processes are
its children and inherit it), and goes back to the machine's namespace at the end. Docker is
reached through its Unix socket, which works from inside.

Nodes: ``head`` (no container cores, 2 CPU-backed GPU devices; the scheduler actor and the
driver run here), ``w1`` (host core 0, 2 CPU-backed GPU devices), ``w2`` (host core 1, 2
CPU-backed GPU devices): disjoint shares of this machine's cores.
"""

from __future__ import annotations

import ctypes
import os
import subprocess
import time
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import pytest

from tangram.core.resources import ApiEndpointSpec
from tests.live.conftest import docker_client  # noqa: F401 - the engine, started if needed

CLONE_NEWNET = 0x40000000

#: The cluster's nodes: Tangram name -> the labels its agent reads.
NODES: dict[str, dict[str, str]] = {
    "head": {"tangram-name": "head", "tangram-cores": "", "tangram-gpus": "cpu:2"},
    "w1": {
        "tangram-name": "w1",
        "tangram-cores": "0",
        "tangram-gpus": "cpu:2",
        "tangram-memory-gb": "8",
    },
    "w2": {
        "tangram-name": "w2",
        "tangram-cores": "1",
        "tangram-gpus": "cpu:2",
        "tangram-memory-gb": "8",
    },
}


@dataclass
class RayCluster:
    """The running cluster: Ray's ``Cluster``, its worker nodes by name, the actor, a client."""

    cluster: Any
    workers: dict[str, Any]
    handle: Any
    info: dict[str, Any]
    config: Any

    def add(self, name: str) -> Any:
        node = self.cluster.add_node(
            num_cpus=1, node_ip_address="127.0.0.1", labels=NODES[name], wait=True
        )
        self.workers[name] = node
        return node


def _enter_loopback_namespace() -> int:
    """Put this thread (and the processes it starts) in a new network namespace with ``lo``
    up; returns a descriptor of the namespace it was in."""
    libc = ctypes.CDLL(None, use_errno=True)
    previous = os.open("/proc/thread-self/ns/net", os.O_RDONLY)
    if libc.unshare(CLONE_NEWNET) != 0:
        os.close(previous)
        err = ctypes.get_errno()
        pytest.fail(
            f"the Ray tests need a network namespace (unshare: {os.strerror(err)}); run as root"
        )
    subprocess.run(["ip", "link", "set", "lo", "up"], check=True)
    return previous


def _leave_namespace(previous: int) -> None:
    libc = ctypes.CDLL(None, use_errno=True)
    libc.setns(previous, CLONE_NEWNET)
    os.close(previous)


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


@pytest.fixture(scope="session")
def ray_cluster(request: pytest.FixtureRequest) -> Iterator[RayCluster]:
    """The 3-node cluster and a started scheduler actor (HTTP service on 127.0.0.1)."""
    request.getfixturevalue("docker_client")  # the engine and images, started if needed
    import ray
    from ray.cluster_utils import Cluster

    from tangram.exec.ray import RayConfig, start, stop
    from tangram.exec.runtime import RuntimeConfig
    from tangram.exec.service import ServeOptions

    previous = _enter_loopback_namespace()
    t0 = time.monotonic()
    cluster = None
    try:
        cluster = Cluster(
            initialize_head=True,
            head_node_args={
                "num_cpus": 1,
                "node_ip_address": "127.0.0.1",
                "include_dashboard": False,
                "labels": NODES["head"],
                "_system_config": {
                    "health_check_period_ms": 500,
                    "health_check_failure_threshold": 4,
                },
            },
        )
        rc = RayCluster(cluster, {}, None, {}, None)
        for name in ("w1", "w2"):
            rc.add(name)
        ray.init(address=cluster.address, namespace="tangram-tests", log_to_driver=False)
        config = RayConfig(
            namespace="tangram-tests",
            apis=(
                ApiEndpointSpec("echo", concurrency=256),
                ApiEndpointSpec("counted", concurrency=3),
            ),
            endpoints={"counted": counted_endpoint()},
            runtime=RuntimeConfig(max_pending=4096, default_timeout_s=120.0),
            aoe={"kill_grace_s": 3.0},
            http=ServeOptions(port=0),
            ping_every_s=0.25,
            lost_after_s=2.0,
        )
        rc.handle, rc.info = start(config)
        rc.config = config
        print(f"3-node Ray cluster and Tangram up in {time.monotonic() - t0:.1f} s")
        yield rc
    finally:
        try:
            if ray.is_initialized():
                try:
                    stop(rc.config) if cluster is not None and rc.config else None
                except Exception as exc:  # noqa: BLE001 - shutting down anyway
                    print(f"stopping the scheduler actor: {exc}")
                ray.shutdown()
            if cluster is not None:
                cluster.shutdown()
        finally:
            _leave_namespace(previous)
