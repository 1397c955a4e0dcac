"""``tangram bench ray``: what the Ray path costs per action, and how many actions per second
one scheduler actor carries, against the single-node runtime on the same machine.

Without ``--address`` it starts the local 3-node cluster (``local.py``; inside a loopback-only
network namespace, so it needs root) and, beside it, a single-node ``tangram serve`` (its
own process, no GPU). Phases, each the same client code against both:

- ``api``: no-op ``echo`` actions from one client, submit and wait (round trip p50/p99): the
  API call runs in the scheduler actor, so the difference is the service's own;
- ``cpu``: ``true`` in an open trajectory from one client: the Ray path adds the hop from the
  scheduler actor to the node agent and back; the runtime's overhead per action (its
  outcome's ``overhead_s``) shows that hop without the command's own time, which a loaded
  machine makes noisy;
- ``ray-native``: the same API and CPU actions from ``AsyncRayClient`` (actor calls, no HTTP);
- ``throughput``: ``--actions`` no-op actions from ``--clients`` concurrent clients (HTTP:
  ``tangram bench service``'s aiohttp load, against both; and ``AsyncRayClient``s), through
  the one scheduler actor (actions/s); and ``AsyncRayClient.run_many`` calls of ``--batch``
  actions each (one actor call per batch);
- ``decisions``: the scheduler's decisions per second of time spent in the core, and per
  second of wall time during the throughput phase, read from the actor.

Targets (issue 13): added latency p50 <= 2 ms over the single-node path; >= 2,000 actions/s
through one scheduler actor. Figures are noisy on a shared 2-core machine: run it twice.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import itertools
import json
import os
import subprocess
import sys
import tempfile
import time
import uuid
from pathlib import Path
from typing import Any

from tangram.report import add_json_flag, emit

#: Targets of the issue.
ADDED_P50_MS = 2.0
ACTIONS_PER_S = 2000.0


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser(
        "ray",
        help="added latency and throughput of the Ray path vs the single-node runtime",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    p.add_argument("--samples", type=int, default=300, help="one-client actions per phase")
    p.add_argument("--actions", type=int, default=4000, help="actions in the throughput phase")
    p.add_argument("--clients", type=int, default=64, help="concurrent clients (throughput)")
    p.add_argument(
        "--address",
        help="an existing Ray cluster to measure on (default: start the local 3-node one in "
        "a loopback-only network namespace, which needs root)",
    )
    p.add_argument(
        "--batch", type=int, default=16, help="actions per run_many call (batched throughput)"
    )
    p.add_argument(
        "--agent-calls",
        choices=("direct", "ray"),
        default="direct",
        help="how the scheduler actor calls its agents: the direct channel (the default, "
        "RayConfig.direct_calls) or Ray actor calls (to compare)",
    )
    add_json_flag(p)
    p.set_defaults(func=main)


def _quantiles(values: list[float]) -> dict[str, float]:
    from tangram.exec.service_bench import _quantiles as quantiles

    return {**quantiles(values), "n": len(values)}


async def _one_client(client: Any, samples: int, action: dict[str, Any]) -> dict[str, float]:
    """Round trips of ``samples`` actions, one at a time (after 20 not counted), and the
    runtime's overhead in each (``Timings.overhead_s``: all but queueing and the command
    itself, so the Ray path's hop to the agent without the command's own noise)."""
    times, overheads = [], []
    for i in range(samples + 20):
        t0 = time.perf_counter()
        out = await client.run(**action)
        took = time.perf_counter() - t0
        if not out.ok:
            raise RuntimeError(f"a benchmark action failed: {out.error}")
        if i >= 20:
            times.append(took)
            overheads.append(out.timings.overhead_s)
    return {**_quantiles(times), "overhead_p50_ms": _quantiles(overheads)["p50_ms"]}


async def _latency(client: Any, samples: int, traj: str) -> dict[str, Any]:
    await client.open_trajectory(traj, memory_gb=0.5)
    try:
        api = await _one_client(client, samples, {"endpoint": "echo", "payload": None})
        cpu = await _one_client(client, samples, {"command": "true", "trajectory": traj})
    finally:
        await client.close_trajectory(traj)
    return {"api": api, "cpu": cpu}


async def _throughput(clients: list[Any], actions: int) -> dict[str, float]:
    left = iter(range(actions))

    async def worker(c: Any) -> None:
        for _ in left:
            out = await c.run(endpoint="echo", payload=None)
            if not out.ok:
                raise RuntimeError(f"a benchmark action failed: {out.error}")

    t0 = time.perf_counter()
    await asyncio.gather(*(worker(c) for c in clients))
    wall = time.perf_counter() - t0
    return {"actions": actions, "wall_s": wall, "per_s": actions / wall}


async def _batched_throughput(clients: list[Any], actions: int, batch: int) -> dict[str, float]:
    """``--actions`` no-op actions, each client sending ``batch`` at a time (``run_many``)."""
    left = iter(range(actions))

    async def worker(c: Any) -> None:
        while chunk := [
            {"endpoint": "echo", "payload": None} for _ in itertools.islice(left, batch)
        ]:
            for out in await c.run_many(chunk):
                if not getattr(out, "ok", False):
                    raise RuntimeError(f"a benchmark action failed: {out}")

    t0 = time.perf_counter()
    await asyncio.gather(*(worker(c) for c in clients))
    wall = time.perf_counter() - t0
    return {"actions": actions, "batch": batch, "wall_s": wall, "per_s": actions / wall}


async def _http_throughput(url: str, actions: int, clients: int) -> dict[str, float]:
    """``tangram bench service``'s load (aiohttp, submit and wait, no-op ``echo``)."""
    from tangram.exec.service_bench import _phase

    doc = await _phase(url, actions, clients, True)
    return {"actions": actions, "wall_s": doc["wall_s"], "per_s": doc["per_s"]}


def _serve_single(attempts: int = 2) -> tuple[subprocess.Popen[str], str]:
    """A single-node ``tangram serve`` (CPU and APIs, no journal) on a free port; started
    again once if it failed to (its AOE start can race with containers other work removes:
    see ``agent._start_aoe``)."""
    cmd = [sys.executable, "-m", "tangram.cli", "serve", "--no-gpu", "--no-journal"]
    for attempt in range(attempts):
        log = Path(tempfile.mkdtemp(prefix="tangram-bench-ray-")) / "serve.log"
        with log.open("w") as err:
            proc = subprocess.Popen(
                [*cmd, "--port", "0", "--json"], stdout=subprocess.PIPE, stderr=err, text=True
            )
        assert proc.stdout is not None
        line = proc.stdout.readline()
        if line:
            return proc, json.loads(line)["url"]
        proc.wait(30)
        if attempt == attempts - 1:
            raise RuntimeError(f"tangram serve did not start: {log.read_text()[-2000:]}")
    raise AssertionError("unreachable")


def _single_node(samples: int, actions: int, clients: int) -> dict[str, Any]:
    """The same one-client phases against a single-node ``tangram serve`` (CPU + APIs, no
    journal: the scheduler actor runs without one too)."""
    from tangram.exec.service import AsyncClient

    proc, url = _serve_single()
    try:

        async def go() -> dict[str, Any]:
            async with AsyncClient(url) as c:
                out = await _latency(c, samples, f"bench-single-{uuid.uuid4().hex[:6]}")
            out["throughput_http"] = await _http_throughput(url, actions, clients)
            return out

        return asyncio.run(go())
    finally:
        proc.terminate()
        try:
            proc.wait(30)
        except subprocess.TimeoutExpired:
            proc.kill()


def _on_ray(
    handle: Any, url: str, samples: int, actions: int, clients: int, batch: int
) -> dict[str, Any]:
    from tangram.exec.ray.client import AsyncRayClient
    from tangram.exec.service import AsyncClient

    async def go() -> dict[str, Any]:
        out: dict[str, Any] = {}
        async with AsyncClient(url) as c:
            out["http"] = await _latency(c, samples, f"bench-http-{uuid.uuid4().hex[:6]}")
        native = AsyncRayClient(handle)
        out["ray_native"] = await _latency(native, samples, f"bench-ray-{uuid.uuid4().hex[:6]}")
        before = await handle.core_figures.remote()
        out["throughput_http"] = await _http_throughput(url, actions, clients)
        after = await handle.core_figures.remote()
        natives = [AsyncRayClient(handle) for _ in range(clients)]
        out["throughput_ray_native"] = await _throughput(natives, actions)
        out["throughput_ray_native_batched"] = await _batched_throughput(natives, actions, batch)
        decisions = after["decisions"] - before["decisions"]
        core_s = after["core_s"] - before["core_s"]
        out["decisions"] = {
            "during_http_throughput": decisions,
            "per_core_s": decisions / core_s if core_s > 0 else 0.0,
            "per_wall_s": decisions / out["throughput_http"]["wall_s"],
            "passes": after["passes"] - before["passes"],
        }
        return out

    return asyncio.run(go())


def _measure(
    address: str, samples: int, actions: int, clients: int, direct: bool, batch: int
) -> dict[str, Any]:
    """Both paths, with a scheduler actor of its own on the cluster at ``address`` (this
    process's Ray connection when it has one)."""
    import ray

    from tangram.exec.ray.config import RayConfig
    from tangram.exec.ray.service import start, stop
    from tangram.exec.service import ServeOptions

    single = _single_node(samples, actions, clients)
    joined = not ray.is_initialized()
    if joined:
        ray.init(address=address, log_to_driver=False)
    config = RayConfig(namespace="tangram-bench", http=ServeOptions(port=0), direct_calls=direct)
    try:
        handle, info = start(config)
        try:
            on_ray = _on_ray(handle, info["url"], samples, actions, clients, batch)
        finally:
            with contextlib.suppress(Exception):
                stop(config, handle)
    finally:
        if joined:
            ray.shutdown()
    return {"single_node": single, **on_ray}


def run_bench(
    samples: int,
    actions: int,
    clients: int,
    address: str | None = None,
    direct: bool = True,
    batch: int = 16,
) -> dict[str, Any]:
    """Measure on ``address``, or on the local cluster started in a loopback namespace."""
    from tangram.exec.ray.local import LocalCluster, loopback_namespace

    load_before = os.getloadavg()[0]
    if address is not None:
        measured = _measure(address, samples, actions, clients, direct, batch)
    else:
        with loopback_namespace():
            local = LocalCluster.start()
            try:
                measured = _measure(local.address, samples, actions, clients, direct, batch)
            finally:
                local.shutdown()
    return {
        "cpus": os.cpu_count(),
        "loadavg_1m_before": round(load_before, 2),
        "loadavg_1m_after": round(os.getloadavg()[0], 2),
        "cluster": address or "local 3-node cluster (tangram.exec.ray.local)",
        "agent_calls": "direct" if direct else "ray",
        **measured,
        "targets": {"added_p50_ms": ADDED_P50_MS, "actions_per_s": ACTIONS_PER_S},
    }


def main(args: argparse.Namespace) -> int:
    for name in ("samples", "actions", "clients", "batch"):
        if getattr(args, name) < 1:
            raise ValueError(f"--{name} must be >= 1")
    doc = run_bench(
        args.samples,
        args.actions,
        args.clients,
        args.address,
        args.agent_calls == "direct",
        args.batch,
    )
    single = doc["single_node"]
    rows = []
    for kind in ("api", "cpu"):
        base = single[kind]["p50_ms"]
        for path in ("http", "ray_native"):
            got = doc[path][kind]
            rows.append(
                {
                    "action": kind,
                    "path": path,
                    "p50 (ms)": got["p50_ms"],
                    "p99 (ms)": got["p99_ms"],
                    "single-node p50 (ms)": base,
                    "added p50 (ms)": got["p50_ms"] - base,
                    f"<= {ADDED_P50_MS:g} ms": got["p50_ms"] - base <= ADDED_P50_MS,
                    "added overhead p50 (ms)": got["overhead_p50_ms"]
                    - single[kind]["overhead_p50_ms"],
                }
            )
    doc["added_p50_ms"] = {f"{r['action']}/{r['path']}": r["added p50 (ms)"] for r in rows}
    doc["added_overhead_p50_ms"] = {
        f"{r['action']}/{r['path']}": r["added overhead p50 (ms)"] for r in rows
    }
    through = [
        {
            "path": path,
            "clients": args.clients,
            "actions/s": got["per_s"],
            f">= {ACTIONS_PER_S:,.0f}/s": got["per_s"] >= ACTIONS_PER_S,
        }
        for path, got in (
            ("single-node http", single["throughput_http"]),
            ("ray http", doc["throughput_http"]),
            ("ray native", doc["throughput_ray_native"]),
            (f"ray native, run_many of {args.batch}", doc["throughput_ray_native_batched"]),
        )
    ]
    dec = doc["decisions"]
    decisions = [
        {
            "decisions": dec["during_http_throughput"],
            "per second in the core": dec["per_core_s"],
            "per wall second": dec["per_wall_s"],
        }
    ]
    emit(
        args.json,
        doc,
        {
            f"one client, round trip vs single-node tangram serve ({doc['cpus']} CPUs, load "
            f"{doc['loadavg_1m_before']})": rows,
            "throughput through one scheduler actor (no-op API actions)": through,
            "scheduler decisions in the actor (HTTP throughput phase)": decisions,
        },
    )
    return 0
