"""``tangram bench service``: how many actions per second the service sustains on loopback,
and the latency it adds to one action.

A ``tangram serve`` process is started with API work only (``--no-cpu --no-gpu``: no Docker,
no torch) and ``clients`` concurrent connections send no-op actions to the ``echo`` endpoint,
whose execution takes microseconds, so what is measured is the service itself: HTTP, JSON,
admission, the scheduler's pass, the executor hand-off and the answer. Two phases:

- ``wait``: each request submits with ``"wait": true`` and returns with the outcome. The rate
  is complete action lifecycles per second; the client's round trip is the latency the
  service adds to an action (p50, p99); ``service ACT`` is the part inside the runtime
  (queue + overhead + exec as the outcome reports it).
- ``submit``: each request only submits (202); the rate is accepted submissions per second.

The load generator is aiohttp's client in this process; the server is a separate process, so
on a 2-core machine each gets about one core.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import subprocess
import tempfile
import time
import uuid
from pathlib import Path
from typing import Any

from tangram.exec.runtime.errors import Overloaded
from tangram.exec.serve_process import start_serve
from tangram.report import add_json_flag, emit, non_negative_int, positive_int


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser(
        "service",
        help="loopback throughput and added latency of tangram serve (no-op API actions)",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    p.add_argument(
        "--requests", type=positive_int, default=5000, help="actions per phase (default 5000)"
    )
    p.add_argument(
        "--clients", type=positive_int, default=64, help="concurrent connections (default 64)"
    )
    p.add_argument("--warmup", type=non_negative_int, default=300, help="actions before measuring")
    p.add_argument("--policy", default="tangram")
    add_json_flag(p)
    p.set_defaults(func=main)


def _quantiles(values: list[float]) -> dict[str, float]:
    import numpy as np

    arr = np.asarray(values) * 1e3
    return {
        "p50_ms": float(np.percentile(arr, 50)),
        "p99_ms": float(np.percentile(arr, 99)),
        "mean_ms": float(arr.mean()),
    }


async def _phase(url: str, requests: int, clients: int, wait: bool) -> dict[str, Any]:
    import aiohttp

    latencies: list[float] = []
    acts: list[float] = []
    refused = 0
    counter = iter(range(requests))
    prefix = uuid.uuid4().hex[:8]
    connector = aiohttp.TCPConnector(limit=clients)
    async with aiohttp.ClientSession(url, connector=connector) as session:

        async def worker() -> None:
            nonlocal refused
            for i in counter:
                body = {"id": f"{prefix}-{i}", "endpoint": "echo", "payload": None, "wait": wait}
                while True:
                    t0 = time.perf_counter()
                    async with session.post("/v1/actions", json=body) as r:
                        doc = await r.json()
                        status = r.status
                    if status == Overloaded.http_status:
                        refused += 1
                        await asyncio.sleep(0.01)
                        continue
                    break
                latencies.append(time.perf_counter() - t0)
                if status not in (200, 202):
                    raise RuntimeError(f"HTTP {status}: {doc}")
                if wait:
                    acts.append(doc["outcome"]["timings"]["act_s"])

        t0 = time.perf_counter()
        await asyncio.gather(*(worker() for _ in range(clients)))
        wall = time.perf_counter() - t0
    out: dict[str, Any] = {
        "requests": requests,
        "clients": clients,
        "wall_s": wall,
        "per_s": requests / wall,
        "refused_429": refused,
        "round_trip": _quantiles(latencies),
    }
    if acts:
        out["service_act"] = _quantiles(acts)
    return out


def run_bench(requests: int, clients: int, warmup: int, policy: str) -> dict[str, Any]:
    load_before = os.getloadavg()[0]
    log = Path(tempfile.mkdtemp(prefix="tangram-bench-service-")) / "serve.log"
    args = ["--policy", policy, "--max-pending", str(max(4096, 4 * requests))]
    proc, url = start_serve(args, log)
    try:
        asyncio.run(_phase(url, warmup, min(clients, warmup), True))
        waited = asyncio.run(_phase(url, requests, clients, True))
        submitted = asyncio.run(_phase(url, requests, clients, False))
        single = asyncio.run(_phase(url, min(requests, 1000), 1, True))
    finally:
        proc.terminate()
        try:
            proc.wait(30)
        except subprocess.TimeoutExpired:
            proc.kill()
    return {
        "url": url,
        "policy": policy,
        "cpus": os.cpu_count(),
        "loadavg_1m_before": round(load_before, 2),
        "wait": waited,
        "submit": submitted,
        "single_client": single,
    }


def main(args: argparse.Namespace) -> int:
    if args.requests < 1 or args.clients < 1:
        raise ValueError("--requests and --clients must be >= 1")
    doc = run_bench(args.requests, args.clients, args.warmup, args.policy)
    rows = []
    for name, label in (
        ("wait", f"submit+wait, {args.clients} clients"),
        ("submit", f"submit only, {args.clients} clients"),
        ("single_client", "submit+wait, 1 client"),
    ):
        ph = doc[name]
        row = {
            "phase": label,
            "actions/s": ph["per_s"],
            "round trip p50 (ms)": ph["round_trip"]["p50_ms"],
            "round trip p99 (ms)": ph["round_trip"]["p99_ms"],
        }
        if "service_act" in ph:
            row["in-runtime ACT p50 (ms)"] = ph["service_act"]["p50_ms"]
            row["in-runtime ACT p99 (ms)"] = ph["service_act"]["p99_ms"]
        rows.append(row)
    emit(
        args.json, doc, {f"tangram serve on loopback ({doc['cpus']} CPUs), no-op API actions": rows}
    )
    return 0
