"""A node agent whose threads all run actions (calls sent through Ray, each holding one for its
whole time) still answers the scheduler's pings: they run in a concurrency group of their
own, so a busy agent is not taken for a lost one."""

from __future__ import annotations

import time
from typing import Any

import pytest


def test_an_agent_whose_threads_all_run_actions_answers_its_pings(
    ray_cluster: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    import ray

    from tangram.exec.ray import agents
    from tangram.exec.ray.agent import NodeAgent

    class Busy(NodeAgent):  # (nested: Ray ships it by value to the worker)
        def block(self, seconds: float) -> bool:
            time.sleep(seconds)
            return True

    monkeypatch.setattr(agents, "AGENT_THREADS", 2)  # (256 calls to fill, otherwise)
    node = next(n for n in ray.nodes() if n["Alive"])
    labels = {"tangram-name": "busy", "tangram-cores": "", "tangram-gpus": "0"}  # runs nothing
    node = dict(node, Labels=labels)
    handle = agents._make_agent(agents.agent_class(Busy), node, "busy", {}, ray_cluster.config)
    try:
        assert ray.get(handle.describe.remote(), timeout=60).name == "busy"
        blocked = [handle.block.remote(30.0) for _ in range(2)]  # every thread of the agent
        time.sleep(1.0)  # (both running)
        t0 = time.monotonic()
        assert ray.get(handle.ping.remote(), timeout=10) == "busy"
        took = time.monotonic() - t0
        print(f"a ping to an agent with every thread busy answered in {took:.3f} s")
        assert not any(ray.wait(blocked, timeout=0)[0])  # (they still ran meanwhile)
    finally:
        ray.kill(handle)
