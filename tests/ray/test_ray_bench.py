"""``tangram bench ray --json`` on the running cluster: every figure it promises is there and
plausible (the targets are the benchmark's to judge, not this test's: the machine is shared)."""

from __future__ import annotations

import json
from typing import Any

from tangram.cli import main


def test_bench_ray_reports_latency_throughput_and_decisions(ray_cluster: Any, capsys) -> None:
    args = ["bench", "ray", "--address", ray_cluster.local.address, "--json"]
    assert main([*args, "--samples", "20", "--actions", "300", "--clients", "8"]) == 0
    doc = json.loads(capsys.readouterr().out)
    for path in ("single_node", "http", "ray_native"):
        for kind in ("api", "cpu"):
            got = doc[path][kind]
            assert got["n"] == 20 and 0 < got["p50_ms"] <= got["p99_ms"]
            assert 0 <= got["overhead_p50_ms"] < got["p99_ms"]
    paths = {"api/http", "api/ray_native", "cpu/http", "cpu/ray_native"}
    assert set(doc["added_p50_ms"]) == set(doc["added_overhead_p50_ms"]) == paths
    assert doc["agent_calls"] == "direct"
    assert doc["throughput_ray_native_batched"]["batch"] == 16
    for path in ("throughput_http", "throughput_ray_native", "throughput_ray_native_batched"):
        assert doc[path]["actions"] == 300 and doc[path]["per_s"] > 0
    assert doc["single_node"]["throughput_http"]["per_s"] > 0
    decisions = doc["decisions"]
    assert decisions["during_http_throughput"] >= 300  # at least one start per action
    assert decisions["per_core_s"] > decisions["per_wall_s"] > 0
    assert doc["targets"] == {"added_p50_ms": 2.0, "actions_per_s": 2000.0}
