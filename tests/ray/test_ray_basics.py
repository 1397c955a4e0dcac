"""The cluster as the scheduler actor sees it, and one action of each kind over HTTP and over
the Ray-native client, on the node the core chose and its share of this machine's cores."""

from __future__ import annotations

import json
import time
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import httpx
import pytest

from tangram.exec.ray import RayClient
from tangram.exec.service import Client
from tangram.exec.service.retry import ServiceError

#: Host cores of each CPU node's containers (its ``tangram-cores`` label, in conftest).
HOST_CORES = {"w1": "0", "w2": "1"}


def test_the_cluster_file_maps_ray_nodes_to_tangram_nodes(ray_cluster: Any) -> None:
    status = RayClient(ray_cluster.handle).status()
    nodes = status["nodes"]
    up = {n: (d["cores"], d["gpus"]) for n, d in nodes.items() if d["alive"]}
    assert up == {"head": (0, 2), "w1": (1, 2), "w2": (1, 2)}  # each agent, by its labels
    # each agent's action calls take its direct channel (RayConfig.direct_calls)
    assert {n: d["direct"] for n, d in nodes.items() if d["alive"]} == dict.fromkeys(up, True)
    assert nodes["w3"] == {"alive": False, "why": "declared, not up yet", "fenced": True}
    assert status["executors"]["cpu"] == ray_cluster.info["cpu_nodes"] == ["w1", "w2"]
    assert ray_cluster.info["gpu_nodes"] == ["head", "w1", "w2", "w3"]
    assert status["held"]["gpus"] == 2  # w3's, fenced until it joins


def test_each_kind_runs_on_its_node_over_http_and_ray(ray_cluster: Any) -> None:
    show = "echo hi; grep Cpus_allowed_list /proc/self/status | cut -f2"
    with Client(ray_cluster.info["url"]) as c:
        a = c.open_trajectory("basic-a", memory_gb=1)
        b = c.open_trajectory("basic-b", memory_gb=1)
        assert {a["node"], b["node"]} == {"w1", "w2"}  # spread: the roomiest node first
        out = c.run(command=show, trajectory="basic-a")
        assert out.ok and out.node == a["node"]
        assert out.value.stdout == f"hi\n{HOST_CORES[a['node']]}\n"
        gpu = c.run(service="reward", inputs=[[1, 2, 3]])
        assert gpu.ok and gpu.node in {"head", "w1", "w2"} and len(gpu.gpus) == 1
        api = c.run(endpoint="echo", payload={"x": 1})
        assert api.ok and api.value == {"x": 1}
    r = RayClient(ray_cluster.handle)
    out = r.run(command=show, trajectory="basic-b")
    assert out.ok and out.node == b["node"]
    assert out.value.stdout == f"hi\n{HOST_CORES[b['node']]}\n"
    same = r.run(id="basic-x", endpoint="echo", payload=[1])
    assert r.run(id="basic-x", endpoint="echo", payload=[1]) == same  # one action, one outcome
    for t in ("basic-a", "basic-b"):
        r.close_trajectory(t)


def test_every_ray_node_binds_loopback_only(ray_cluster):
    # The cluster runs in a network namespace with only lo: no node may advertise another address.
    import ray

    assert {n["NodeManagerAddress"] for n in ray.nodes() if n["Alive"]} == {"127.0.0.1"}


def test_run_many_answers_each_action_in_order_with_its_outcome_or_error(ray_cluster: Any) -> None:
    r = RayClient(ray_cluster.handle)
    r.open_trajectory("many-a", memory_gb=1)
    try:
        out = r.run_many(
            [
                {"endpoint": "echo", "payload": 1},
                {"command": "echo many", "trajectory": "many-a"},
                {"command": "true", "trajectory": "no-such-trajectory"},
                {"service": "reward", "inputs": [[1, 2]]},
                {"id": "many-x", "endpoint": "echo", "payload": 5},
            ]
        )
    finally:
        r.close_trajectory("many-a")
    api, cpu, refused, gpu, named = out
    assert api.ok and api.value == 1
    assert cpu.ok and cpu.value.stdout == "many\n" and cpu.node in HOST_CORES
    assert isinstance(refused, ServiceError) and refused.code == "unknown_trajectory"
    assert gpu.ok and gpu.node in {"head", "w1", "w2"}
    assert named.ok and r.run(id="many-x", endpoint="echo", payload=5) == named  # ran once


def test_the_cluster_runs_in_a_network_namespace_with_only_loopback(ray_cluster: Any) -> None:
    # The tests (this thread) and a task on every live Ray node share one network namespace,
    # not the machine's, whose only link is lo (design.md, environment recipes).
    import os
    import subprocess

    import ray
    from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

    def where() -> tuple[str, list[str]]:  # (nested: Ray ships it by value to the workers)
        links = subprocess.run(
            ["ip", "-o", "link", "show"], check=True, capture_output=True, text=True
        ).stdout.splitlines()
        return os.readlink("/proc/thread-self/ns/net"), [ln.split(":")[1].strip() for ln in links]

    mine, links = where()
    assert links == ["lo"]  # (the machine's own namespace has its other links)
    remote = ray.remote(num_cpus=0)(where)
    nodes = [n["NodeID"] for n in ray.nodes() if n["Alive"]]
    strategy = [NodeAffinitySchedulingStrategy(n, soft=False) for n in nodes]
    seen = ray.get([remote.options(scheduling_strategy=s).remote() for s in strategy])
    assert len(seen) == len(nodes) >= 3
    assert all(ns == mine and links == ["lo"] for ns, links in seen)


def test_a_run_code_container_is_private_to_the_service_over_http_and_ray(
    ray_cluster: Any,
) -> None:
    """A /run_code request's trajectory shows in the trace once its first uploads ended: no
    client may close it or act on its actions (both APIs go through ``Runtime.public_*``)."""
    url = ray_cluster.info["url"]
    code = "x = 1\n" * 40_000 + "import time; time.sleep(6); print('ran')"  # uploads in chunks
    with ThreadPoolExecutor(1) as pool, Client(url) as c:
        running = pool.submit(
            httpx.post, f"{url}/run_code", json={"code": code, "run_timeout": 30}, timeout=120
        )
        rows: list[dict[str, Any]] = []
        deadline = time.monotonic() + 60
        while not rows and time.monotonic() < deadline:
            lines = c.trace_text().splitlines()
            rows = [
                r
                for r in map(json.loads, lines)
                if str(r.get("trajectory", "")).startswith("run-code-")
            ]
            time.sleep(0.1)
        assert rows, "no /run_code action reached the trace"
        traj, action = rows[0]["trajectory"], rows[0]["action_id"]
        r = RayClient(ray_cluster.handle)
        assert traj not in {t["id"] for t in r.trajectories()}
        for call in (
            lambda: r.close_trajectory(traj),
            lambda: r.recreate_trajectory(traj),
            lambda: r.run(command="echo intruder", trajectory=traj),
            lambda: r.result(action),
            lambda: c.close_trajectory(traj),
            lambda: c.result(action),
        ):
            with pytest.raises(ServiceError) as info:
                call()
            assert info.value.status == 404, info.value
        doc = running.result(timeout=120).json()
    assert doc["status"] == "Success" and doc["run_result"]["stdout"] == "ran\n", doc
