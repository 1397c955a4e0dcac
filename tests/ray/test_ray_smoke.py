"""Smoke: the scheduler actor runs actions on its nodes over HTTP and over Ray."""

from __future__ import annotations

from typing import Any

from tangram.exec.ray import RayClient
from tangram.exec.service import Client


def test_one_of_each_kind_over_http_and_ray(ray_cluster: Any) -> None:
    info = ray_cluster.info
    assert info["cpu_nodes"] == ["w1", "w2"]
    assert info["gpu_nodes"] == ["head", "w1", "w2"]
    with Client(info["url"]) as c:
        a = c.open_trajectory("smoke-a", memory_gb=1)
        b = c.open_trajectory("smoke-b", memory_gb=1)
        assert {a["node"], b["node"]} == {"w1", "w2"}
        out = c.run(
            command="echo hi; cat /proc/self/status | grep Cpus_allowed_list", trajectory="smoke-a"
        )
        print(out)
        assert out.ok and out.node == a["node"]
        g = c.run(service="reward", inputs=[[1, 2, 3]])
        print(g)
        assert g.ok
        e = c.run(endpoint="echo", payload={"x": 1})
        assert e.ok
    r = RayClient(ray_cluster.handle)
    out = r.run(command="echo ray", trajectory="smoke-b")
    print(out)
    assert out.ok and out.value.stdout == "ray\n" and out.node == b["node"]
    print(r.status()["nodes"])
