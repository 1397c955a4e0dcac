"""``tangram bench soak``: does the service's memory stay flat as actions pass through it?

A ``tangram serve`` process (API work only: no Docker, no torch) runs with a journal and a
streamed trace in a temporary directory, as a long-lived service would. ``clients`` loopback
connections send ``actions`` small no-op actions (the ``echo`` endpoint, submit and wait) in
batches of ``every``; after each batch, when nothing is in flight, the server's resident
memory (``VmRSS`` of its process) is sampled. The target: the last sample within 10% of the
sample at 20,000 actions, i.e. no growth with the count of actions once the bounded
structures (outcomes kept for polling, the journal's cache) are full. Samples are taken
between batches so that in-flight work never counts.
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
from tangram.report import add_json_flag, emit

#: The sample the last one is compared with (actions), and the allowed growth.
BASELINE_AT = 20_000
TOLERANCE = 0.10


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser(
        "soak",
        help="resident memory of tangram serve over 100,000 small actions (no growth target)",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    p.add_argument("--actions", type=int, default=100_000, help="actions in all (default 100k)")
    p.add_argument("--every", type=int, default=10_000, help="sample every N actions (10k)")
    p.add_argument("--clients", type=int, default=32, help="concurrent connections (default 32)")
    p.add_argument("--policy", default="tangram")
    add_json_flag(p)
    p.set_defaults(func=main)


def rss_bytes(pid: int) -> int:
    """Resident memory of process ``pid`` (Linux ``/proc``)."""
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) * 1024
    raise RuntimeError(f"no VmRSS for process {pid}")


async def _batch(url: str, first: int, count: int, clients: int, prefix: str) -> int:
    """Send actions ``first .. first+count-1`` and wait for each outcome; returns 429s seen."""
    import aiohttp

    refused = 0
    ids = iter(range(first, first + count))
    connector = aiohttp.TCPConnector(limit=clients)
    async with aiohttp.ClientSession(url, connector=connector) as session:

        async def worker() -> None:
            nonlocal refused
            for i in ids:
                body = {"id": f"{prefix}-{i}", "endpoint": "echo", "payload": {"i": i}}
                body["wait"] = True
                for _ in range(1000):  # bounded: 1000 refusals of 10 ms at most
                    async with session.post("/v1/actions", json=body) as r:
                        doc = await r.json()
                    if r.status != Overloaded.http_status:
                        break
                    refused += 1
                    await asyncio.sleep(0.01)
                if r.status != 200 or doc["outcome"]["status"] != "result":
                    raise RuntimeError(f"action {body['id']}: HTTP {r.status}: {doc}")

        await asyncio.gather(*(worker() for _ in range(clients)))
    return refused


def run_soak(actions: int, every: int, clients: int, policy: str) -> dict[str, Any]:
    """Run the soak; returns the samples and the verdict."""
    samples: list[dict[str, Any]] = []
    refused = 0
    prefix = uuid.uuid4().hex[:8]
    with tempfile.TemporaryDirectory(prefix="tangram-soak-") as tmp:
        state = Path(tmp)
        proc, url = start_serve(
            [
                "--policy",
                policy,
                "--journal",
                str(state / "journal.sqlite"),
                "--trace",
                str(state / "soak.jsonl"),
            ],
            state / "serve.log",
        )
        t0 = time.perf_counter()
        try:
            samples.append({"actions": 0, "rss_mb": rss_bytes(proc.pid) / 2**20, "wall_s": 0.0})
            done = 0
            while done < actions:
                n = min(every, actions - done)
                refused += asyncio.run(_batch(url, done, n, clients, prefix))
                done += n
                samples.append(
                    {
                        "actions": done,
                        "rss_mb": rss_bytes(proc.pid) / 2**20,
                        "wall_s": time.perf_counter() - t0,
                        "journal_mb": _size_mb(state, "journal.sqlite*"),
                        "trace_mb": _size_mb(state, "soak.jsonl"),
                    }
                )
        finally:
            proc.terminate()
            try:
                proc.wait(60)
            except subprocess.TimeoutExpired:
                proc.kill()
    wall = time.perf_counter() - t0
    by_count = {s["actions"]: s["rss_mb"] for s in samples}
    base = by_count.get(BASELINE_AT)
    last = samples[-1]["rss_mb"]
    growth = None if base is None else (last - base) / base
    return {
        "actions": actions,
        "every": every,
        "clients": clients,
        "policy": policy,
        "cpus": os.cpu_count(),
        "wall_s": wall,
        "per_s": actions / wall,
        "refused_429": refused,
        "samples": samples,
        "baseline_at": BASELINE_AT,
        "growth_since_baseline": growth,
        "target": f"last sample within {TOLERANCE:.0%} of the sample at {BASELINE_AT:,}",
        "met": None if growth is None else abs(growth) <= TOLERANCE,
    }


def _size_mb(folder: Path, pattern: str) -> float:
    return sum(p.stat().st_size for p in folder.glob(pattern)) / 2**20


def main(args: argparse.Namespace) -> int:
    if args.actions < 1 or args.every < 1 or args.clients < 1:
        raise ValueError("--actions, --every and --clients must be >= 1")
    doc = run_soak(args.actions, args.every, args.clients, args.policy)
    rows = [
        {
            "actions": s["actions"],
            "RSS (MiB)": s["rss_mb"],
            "wall (s)": s["wall_s"],
            "journal (MiB)": s.get("journal_mb", 0.0),
            "trace (MiB)": s.get("trace_mb", 0.0),
        }
        for s in doc["samples"]
    ]
    growth = doc["growth_since_baseline"]
    verdict = [
        {
            "actions/s": doc["per_s"],
            "growth since 20k": "n/a" if growth is None else f"{growth:+.1%}",
            "target": doc["target"],
            "met": doc["met"],
        }
    ]
    emit(
        args.json,
        doc,
        {
            f"tangram serve soak ({doc['cpus']} CPUs), {doc['actions']:,} echo actions": rows,
            "verdict": verdict,
        },
    )
    return 0
