"""A multi-node Ray cluster on this one machine, for tests, benchmarks and the fidelity run.

On a machine whose Ray binds the network interface even when told 127.0.0.1, every node
binds 127.0.0.1 inside a network namespace that has only loopback: ``loopback_namespace``
moves the calling thread (and every process it starts: Ray's) into a new one with ``lo`` up
(root; Docker's Unix socket still works there) and back out at the end. ``LOCAL_NODES``
splits this machine: ``head`` (no container cores; the scheduler actor and the driver), ``w1``
and ``w2`` (host core 0 and core 1), each with 2 CPU-backed GPU devices; ``w3`` (2 devices,
no container cores) and ``w4`` (host core 1, 2 devices) are started only when asked (``add``).
"""

from __future__ import annotations

import contextlib
import ctypes
import os
import subprocess
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any

CLONE_NEWNET = 0x40000000

#: The nodes of the local cluster: Tangram name -> the labels its agent reads.
LOCAL_NODES: dict[str, dict[str, str]] = {
    "head": {"tangram-name": "head", "tangram-cores": "", "tangram-gpus": "cpu-2"},
    "w1": {
        "tangram-name": "w1",
        "tangram-cores": "0",
        "tangram-gpus": "cpu-2",
        "tangram-memory-gb": "8",
    },
    "w2": {
        "tangram-name": "w2",
        "tangram-cores": "1",
        "tangram-gpus": "cpu-2",
        "tangram-memory-gb": "8",
    },
    # Not started by default: a GPU node that joins later (tests of a declared node's join).
    "w3": {"tangram-name": "w3", "tangram-cores": "", "tangram-gpus": "cpu-2"},
    # Not started by default either, and in no cluster file: a node that joins and is added
    # to the core (its containers share host core 1 with w2's: this machine has 2).
    "w4": {
        "tangram-name": "w4",
        "tangram-cores": "1",
        "tangram-gpus": "cpu-2",
        "tangram-memory-gb": "8",
    },
}

#: Ray's health check on the local cluster: a stopped node is dead after 4 x 0.5 s.
HEALTH_CHECK = {"health_check_period_ms": 500, "health_check_failure_threshold": 4}


@contextlib.contextmanager
def loopback_namespace() -> Iterator[None]:
    """Run the body (this thread and its children) in a new network namespace, ``lo`` up."""
    libc = ctypes.CDLL(None, use_errno=True)
    previous = os.open("/proc/thread-self/ns/net", os.O_RDONLY)
    try:
        if libc.unshare(CLONE_NEWNET) != 0:
            err = os.strerror(ctypes.get_errno())
            raise PermissionError(f"cannot make a network namespace ({err}): run as root")
        subprocess.run(["ip", "link", "set", "lo", "up"], check=True)
        links = subprocess.run(
            ["ip", "-o", "link", "show"], check=True, capture_output=True, text=True
        ).stdout.splitlines()
        names = [line.split(":")[1].strip().split("@")[0] for line in links]
        if names != ["lo"]:  # nothing may bind anything but loopback in here
            raise RuntimeError(f"the new network namespace has links {names}, not only lo")
        yield
    finally:
        libc.setns(previous, CLONE_NEWNET)
        os.close(previous)


@dataclass
class LocalCluster:
    """Ray's ``Cluster`` with the ``LOCAL_NODES`` shape; ``workers`` by Tangram name."""

    cluster: Any
    workers: dict[str, Any] = field(default_factory=dict)

    @classmethod
    def start(cls, workers: tuple[str, ...] = ("w1", "w2")) -> LocalCluster:
        from ray.cluster_utils import Cluster

        cluster = Cluster(
            initialize_head=True,
            head_node_args={
                "num_cpus": 1,
                "node_ip_address": "127.0.0.1",
                "include_dashboard": False,
                "labels": LOCAL_NODES["head"],
                "_system_config": HEALTH_CHECK,
            },
        )
        local = cls(cluster)
        try:
            for name in workers:
                local.add(name)
        except BaseException:
            cluster.shutdown()
            raise
        return local

    @property
    def address(self) -> str:
        return self.cluster.address

    def add(self, name: str) -> Any:
        """Start worker node ``name`` (its labels from ``LOCAL_NODES``)."""
        node = self.cluster.add_node(
            num_cpus=1, node_ip_address="127.0.0.1", labels=LOCAL_NODES[name], wait=True
        )
        self.workers[name] = node
        return node

    def remove(self, name: str) -> None:
        """Stop worker node ``name`` at once (no graceful drain)."""
        self.cluster.remove_node(self.workers.pop(name), allow_graceful=False)

    def shutdown(self) -> None:
        self.cluster.shutdown()
