"""``tangram serve --ray ADDRESS``: attaches to the running cluster, serves the HTTP API from
its scheduler actor, and on SIGINT shuts it down and removes the actor."""

from __future__ import annotations

import json
import selectors
import signal
import subprocess
import sys
import time
from types import SimpleNamespace
from typing import Any

import pytest

from tangram.exec.service import Client


def first_line(proc: subprocess.Popen[str], timeout_s: float) -> str:
    assert proc.stdout is not None
    sel = selectors.DefaultSelector()
    sel.register(proc.stdout, selectors.EVENT_READ)
    if not sel.select(timeout_s):
        proc.kill()
        pytest.fail(f"tangram serve --ray printed nothing within {timeout_s} s")
    return proc.stdout.readline()


class _Started(Exception):
    """Raised by the faked ``service.start``: the command got as far as starting."""


def _stop_at_start(monkeypatch: pytest.MonkeyPatch, ray: Any, service: Any) -> list[Any]:
    """Fake Ray's init and the service's start (which records its config and raises
    ``_Started``); this process keeps its own signal handlers. Returns the configs seen."""
    seen: list[Any] = []

    def start(config: Any) -> Any:
        seen.append(config)
        raise _Started

    monkeypatch.setattr(ray, "init", lambda *a, **kw: None)
    monkeypatch.setattr(signal, "signal", lambda *a: None)
    monkeypatch.setattr(service, "start", start)
    return seen


def test_serve_on_ray_attaches_serves_and_stops(ray_cluster: Any, tmp_path: Any) -> None:
    import ray

    cmd = [sys.executable, "-m", "tangram.cli", "serve", "--ray", ray_cluster.local.address]
    cmd += ["--port", "0", "--json", "--no-journal", "--policy", "fixed:1"]
    log = (tmp_path / "serve.log").open("w")
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=log, text=True)
    try:
        info = json.loads(first_line(proc, 180))
        # The spec from the Ray nodes alive now (no cluster file): w3 is not one of them.
        assert info["cpu_nodes"] == ["w1", "w2"] and info["gpu_nodes"] == ["head", "w1", "w2"]
        assert info["policy"] == "fixed:1"
        with Client(info["url"]) as c:
            traj = c.open_trajectory("cli-1", memory_gb=0.5)
            out = c.run(command="echo served", trajectory="cli-1")
            assert out.ok and out.value.stdout == "served\n" and out.node == traj["node"]
            assert c.run(endpoint="echo", payload="x").value == "x"
        t0 = time.monotonic()
        proc.send_signal(signal.SIGINT)
        assert proc.wait(120) == 0
        print(f"tangram serve --ray stopped in {time.monotonic() - t0:.1f} s")
    finally:
        if proc.poll() is None:
            proc.kill()
    with pytest.raises(ValueError):
        ray.get_actor("tangram-scheduler", namespace="tangram")


def test_serve_on_ray_passes_the_tenant_bounds_to_the_service(monkeypatch: Any) -> None:
    """``--tenant-max-trajectories`` reaches the HTTP service in the scheduler actor, as it
    does without ``--ray``: it was checked, then dropped, so one tenant could open as many
    trajectories (containers) as the cluster holds, and the others' opens were refused."""
    import ray

    from tangram.cli import build_parser
    from tangram.exec.ray import service

    seen = _stop_at_start(monkeypatch, ray, service)
    argv = ["serve", "--ray", "auto", "--no-journal", "--port", "0"]
    argv += ["--client", "a=" + "x" * 32, "--client", "b=" + "y" * 32]
    argv += ["--tenant-max-pending", "5", "--tenant-max-trajectories", "3"]
    argv += ["--tenant-max-connections", "7"]
    args = build_parser().parse_args(argv)
    with pytest.raises(_Started):
        args.func(args)
    (config,) = seen
    assert config.http.tenant_max_pending == 5 and config.http.tenant_max_trajectories == 3
    assert config.http.limits.tenant_max_connections == 7
    assert sorted(config.http.clients) == ["a", "b"]


@pytest.mark.parametrize("cluster", [False, True], ids=["default-apis", "cluster-file"])
def test_serve_on_ray_refuses_an_api_the_cluster_does_not_declare(
    monkeypatch: Any, tmp_path: Any, cluster: bool
) -> None:
    """An ``--api NAME=URL`` whose NAME the cluster does not declare (a typo: ``serch``) is
    refused at start naming the flag, as ``tangram serve`` does without ``--ray``: on Ray it
    was accepted and never called, the declared endpoint's calls going to the built-in demo
    (fake hits) instead of the operator's service."""
    import ray

    from tangram.cli import build_parser
    from tangram.exec.ray import service

    seen = _stop_at_start(monkeypatch, ray, service)
    argv = ["serve", "--ray", "auto", "--no-journal", "--port", "0"]
    if cluster:
        path = tmp_path / "c.toml"
        path.write_text('name = "c"\n[[api]]\nname = "search"\nconcurrency = 2\n')
        argv += ["--cluster", str(path)]
    args = build_parser().parse_args([*argv, "--api", "serch=http://127.0.0.1:9/x"])
    with pytest.raises(ValueError, match="--api .*serch.*declares no API endpoint"):
        args.func(args)
    assert seen == []
    args = build_parser().parse_args([*argv, "--api", "search=http://127.0.0.1:9/x"])
    with pytest.raises(_Started):
        args.func(args)
    assert list(seen[0].endpoints) == ["search"]


def test_a_scheduler_actor_whose_start_fails_is_stopped_and_killed(monkeypatch: Any) -> None:
    """``start`` kills the named, detached scheduler actor when its start fails (stopping its
    agents first): it stayed, its failed start kept as its answer, so every later ``start``
    (``tangram serve --ray``) got the same error back from it until someone killed it."""
    import ray

    from tangram.exec.ray import service

    done: list[str] = []

    class Handle:
        start = SimpleNamespace(remote=lambda: RuntimeError("no Ray node runs a Tangram agent"))
        stop = SimpleNamespace(remote=lambda: done.append("stop"))

    def get(ref: Any, timeout: float | None = None) -> Any:
        if isinstance(ref, Exception):
            raise ref
        return ref

    context = SimpleNamespace(get_node_id=lambda: "c" * 56)
    monkeypatch.setattr(ray, "is_initialized", lambda: True)
    monkeypatch.setattr(ray, "get_runtime_context", lambda: context)
    actor = SimpleNamespace(options=lambda **kw: SimpleNamespace(remote=lambda cfg: Handle()))
    monkeypatch.setattr(ray, "remote", lambda cls: actor)
    monkeypatch.setattr(ray, "get", get)
    monkeypatch.setattr(ray, "kill", lambda handle: done.append("kill"))
    with pytest.raises(RuntimeError, match="no Ray node runs a Tangram agent"):
        service.start()
    assert done == ["stop", "kill"]


def test_serve_on_ray_passes_the_warm_pool_and_prewarm_to_the_agents(monkeypatch: Any) -> None:
    """``--warm-pool``, ``--warm-pool-total`` and ``--prewarm`` reach each agent's AOE under
    ``--ray``: they were accepted and dropped, so the agents ran with no warm pool and no
    container was prewarmed."""
    import ray

    from tangram.cli import build_parser
    from tangram.exec.aoe.config import WarmPoolConfig
    from tangram.exec.ray import service

    seen = _stop_at_start(monkeypatch, ray, service)
    argv = ["serve", "--ray", "auto", "--no-journal", "--port", "0"]
    argv += ["--warm-pool", "3", "--warm-pool-total", "7", "--prewarm", "5"]
    args = build_parser().parse_args(argv)
    with pytest.raises(_Started):
        args.func(args)
    (config,) = seen
    assert config.aoe["warm_pool"] == WarmPoolConfig(max_per_key=3, max_total=7)
    assert config.prewarm == 5


def test_a_cpu_agent_prewarms_run_code_containers_in_its_warm_pool(monkeypatch: Any) -> None:
    """A node agent given ``prewarm`` asks its AOE for that many ``/run_code`` containers,
    with the warm pool of its settings (as ``tangram serve --prewarm`` does on one node)."""
    from tangram.exec.aoe.config import WarmPoolConfig
    from tangram.exec.ray import agent
    from tangram.exec.service.sandbox_fusion import RunCodeSettings

    made: list[Any] = []

    class Aoe:
        def __init__(self, config: Any) -> None:
            self.config = config
            self.topology = config.topology
            self.prewarmed: list[Any] = []

        def prewarm(self, count: int, **kw: Any) -> bool:
            self.prewarmed.append((count, kw))
            return True

        def shutdown(self) -> None:
            pass

    def start_aoe(manager: Any, config: Any) -> Any:
        made.append(Aoe(config))
        return made[-1]

    monkeypatch.setattr(agent, "_start_aoe", start_aoe)
    labels = {"tangram-cores": "0-1", "tangram-gpus": "0", "tangram-name": "n1"}
    pool = WarmPoolConfig(max_per_key=3, max_total=7)
    settings = {"aoe": {"warm_pool": pool}, "prewarm": 2}
    a = agent.NodeAgent("r" * 56, labels, 4 * 2**30, settings)
    (aoe,) = made
    assert aoe.config.warm_pool == pool
    rc = RunCodeSettings()
    assert aoe.prewarmed == [(2, {"image": rc.image, "memory_gb": rc.memory_gb})]
    a.cpu.shutdown()
