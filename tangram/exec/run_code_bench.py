"""``tangram bench run-code``: SandboxFusion's ``/run_code`` through ``tangram serve``, driven by
the official ``sandbox-fusion`` client, cold pool against warm pool.

For each pool mode (``cold``: ``--warm-pool 0``, every request makes and removes a container;
``warm``: the warm pool, prewarmed and sized by a warm-up burst that is not measured) and each
language (python ``print(1)``, and C++ printing 1: compile and run), it measures the latency
of ``sequential`` requests one after another and of ``concurrent`` requests from
``concurrency`` threads (``sandbox_fusion.run_concurrent``), and the throughput of the latter.
Every answer must be ``Success`` with stdout ``1``; the service's count of accepted CPU actions
must grow by exactly the actions the requests need (no request lost, none run twice, 429s
retried by the client). Targets (2-core machine): warm python p50 <= 60 ms sequentially and
>= 40 requests/s at concurrency 16.
"""

from __future__ import annotations

import argparse
import os
import re
import subprocess
import tempfile
import time
from pathlib import Path
from typing import Any

import numpy as np

from tangram.exec.serve_process import start_serve
from tangram.report import add_json_flag, emit

#: The programs: each prints 1; and how many actions one request takes (compile + run).
PROGRAMS: dict[str, tuple[str, int]] = {
    "python": ("print(1)", 1),
    "cpp": ('#include <cstdio>\nint main() { std::puts("1"); }', 2),
}
TARGET_P50_MS = 60.0
TARGET_PER_S = 40.0


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser(
        "run-code",
        help="/run_code latency and throughput with the sandbox-fusion client, cold vs warm pool",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    p.add_argument("--sequential", type=int, default=30, help="sequential requests (30)")
    p.add_argument("--concurrent", type=int, default=80, help="concurrent requests (80)")
    p.add_argument("--concurrency", type=int, default=16, help="client threads (16)")
    p.add_argument(
        "--language", action="append", choices=sorted(PROGRAMS), help="default: python and cpp"
    )
    p.add_argument("--mode", action="append", choices=("cold", "warm"), help="default: both")
    add_json_flag(p)
    p.set_defaults(func=main)


def _accepted_cpu(url: str) -> float:
    """The service's count of accepted CPU actions (``/metrics``)."""
    import httpx

    text = httpx.get(f"{url}/metrics", timeout=30).text
    m = re.search(r'^tangram_actions_submitted_total\{resource="cpu"\} (\S+)$', text, re.M)
    return float(m.group(1)) if m else 0.0


def _one(url: str, language: str) -> tuple[float, bool]:
    """One request through the sandbox-fusion client: seconds, and whether it was right."""
    from sandbox_fusion import RunCodeRequest, run_code

    code, _ = PROGRAMS[language]
    t0 = time.perf_counter()
    resp = run_code(
        RunCodeRequest(code=code, language=language, run_timeout=10, compile_timeout=30),
        endpoint=url,
        max_attempts=10,
        client_timeout=300,
    )
    took = time.perf_counter() - t0
    ok = resp.status.value == "Success" and resp.run_result.stdout == "1\n"
    return took, ok


def _phase(url: str, language: str, n: int, concurrency: int) -> dict[str, Any]:
    """``n`` requests from ``concurrency`` threads: latencies, wall time, right answers."""
    from sandbox_fusion import run_concurrent

    before = _accepted_cpu(url)
    t0 = time.perf_counter()
    if concurrency == 1:
        results = [_one(url, language) for _ in range(n)]
    else:
        results = run_concurrent(_one, args=[[url, language]] * n, concurrency=concurrency)
    wall = time.perf_counter() - t0
    actions = _accepted_cpu(url) - before
    lat = np.array([r[0] for r in results]) * 1000
    return {
        "requests": n,
        "concurrency": concurrency,
        "p50_ms": float(np.percentile(lat, 50)),
        "p99_ms": float(np.percentile(lat, 99)),
        "per_s": n / wall,
        "correct": sum(r[1] for r in results),
        "actions": actions,
        "actions_expected": n * PROGRAMS[language][1],
    }


def run_bench(
    languages: list[str], modes: list[str], sequential: int, concurrent: int, concurrency: int
) -> dict[str, Any]:
    rows: list[dict[str, Any]] = []
    with tempfile.TemporaryDirectory(prefix="tangram-bench-run-code-") as tmp:
        for mode in modes:
            pool = ["--warm-pool", "0", "--prewarm", "0"]
            if mode == "warm":
                pool = ["--warm-pool", str(2 * concurrency), "--warm-pool-total", "64"]
                pool += ["--prewarm", str(concurrency)]
            proc, url = start_serve(
                ["--no-journal", *pool], Path(tmp) / f"serve-{mode}.log", ("--no-gpu",)
            )
            try:
                for language in languages:
                    # One request first: builds the compilers image if missing, starts caches.
                    _one(url, language)
                    if mode == "warm":  # let the pool size itself; not measured
                        _phase(url, language, 3 * concurrency, concurrency)
                        time.sleep(2.0)
                    for phase, n, c in (
                        ("sequential", sequential, 1),
                        ("concurrent", concurrent, concurrency),
                    ):
                        rows.append(
                            {"mode": mode, "language": language, "phase": phase}
                            | _phase(url, language, n, c)
                        )
            finally:
                proc.terminate()
                try:
                    proc.wait(60)
                except subprocess.TimeoutExpired:
                    proc.kill()
    return {"cpus": os.cpu_count(), "rows": rows, "verdict": _verdict(rows)}


def _verdict(rows: list[dict[str, Any]]) -> dict[str, Any]:
    def find(phase: str) -> dict[str, Any] | None:
        for r in rows:
            if (r["mode"], r["language"], r["phase"]) == ("warm", "python", phase):
                return r
        return None

    seq, conc = find("sequential"), find("concurrent")
    exact = all(
        r["correct"] == r["requests"] and r["actions"] == r["actions_expected"] for r in rows
    )
    return {
        "warm_python_p50_ms": seq and seq["p50_ms"],
        "warm_python_per_s": conc and conc["per_s"],
        "targets": f"p50 <= {TARGET_P50_MS:g} ms, >= {TARGET_PER_S:g} requests/s",
        "p50_met": None if seq is None else seq["p50_ms"] <= TARGET_P50_MS,
        "throughput_met": None if conc is None else conc["per_s"] >= TARGET_PER_S,
        "every_request_one_correct_answer": exact,
    }


def main(args: argparse.Namespace) -> int:
    if min(args.sequential, args.concurrent, args.concurrency) < 1:
        raise ValueError("--sequential, --concurrent and --concurrency must be >= 1")
    doc = run_bench(
        args.language or ["python", "cpp"],
        args.mode or ["cold", "warm"],
        args.sequential,
        args.concurrent,
        args.concurrency,
    )
    emit(
        args.json,
        doc,
        {
            f"/run_code via the sandbox-fusion client ({doc['cpus']} CPUs)": doc["rows"],
            "verdict": [doc["verdict"]],
        },
    )
    return 0
