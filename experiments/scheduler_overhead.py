"""Claim 6: scheduler and system overhead as a share of ACT.

Paper: the CPU manager's overhead (AOE) is under 3% of ACT; the GPU manager's (EOE, mostly model
restores) about 25%. Here we also measure the scheduler itself: the wall time of each decision
(``Scheduler.advance`` / ``tick``, one call per simulated instant with events) while replaying
the paper's workloads, against the mean ACT, plus ``tangram bench scheduler`` (decision latency
per event with 256..8192 actions queued).

    python experiments/scheduler_overhead.py [--seeds 3] [--smoke]

Timing runs in one process (``--workers`` is ignored): parallel runs on a small shared machine
would inflate each other's wall times.
"""

from __future__ import annotations

import json
import subprocess
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

import common  # noqa: E402
import matplotlib.pyplot as plt  # noqa: E402
import numpy as np  # noqa: E402
from common import (  # noqa: E402
    ROOT,
    Claim,
    Job,
    Report,
    Variant,
    aggregate,
    command,
    md_table,
    parse_args,
    pm,
    run_jobs,
    save_figure,
    write_tables,
)

NAME = "scheduler_overhead"
METRICS = [
    "actions",
    "act_mean_s",
    "overhead_mean_s",
    "sched_calls",
    "sched_total_s",
    "sched_mean_us",
    "sched_p50_us",
    "sched_p99_us",
    "sched_max_us",
    "sched_per_action_us",
    "sched_share_event",
    "sched_share_action",
    "overhead_share",
    "wall_s",
]


def bench_scheduler(smoke: bool) -> dict:
    """``tangram bench scheduler --json`` (the CLI, as a user would run it)."""
    exe = Path(sys.executable).with_name("tangram")
    policy = ["--policy", common.ELASTIC]
    cmd = [str(exe) if exe.exists() else "tangram", "bench", "scheduler", "--json", *policy]
    if smoke:
        return {"skipped": "smoke run", "command": " ".join(cmd[1:])}
    out = subprocess.run(cmd, capture_output=True, text=True, cwd=ROOT, check=True)
    doc = json.loads(out.stdout)
    doc["command"] = " ".join(["tangram bench scheduler --json", *policy])
    return doc


def main(argv=None) -> int:
    args = parse_args(__doc__.splitlines()[0], argv)
    t0 = time.perf_counter()
    small = args.smoke
    v = (Variant("tangram", clock=True, timeline=False),)
    specs = [
        ("coding", 32 if small else 1280, (), v, "coding"),
        ("coding", 32 if small else 1536, (), v, "coding"),
        (
            "deepsearch",
            32 if small else 2048,
            (("search_median_s", 1.0),),
            v,
            "deepsearch (search 1 s)",
        ),
        (
            "mopd",
            32 if small else 2048,
            (),
            (
                Variant("tangram", label="tangram@40", clock=True, timeline=False),
                Variant("tangram", label="tangram@10", gpus=10, clock=True, timeline=False),
            ),
            "mopd",
        ),
    ]
    specs = list(
        {(wl, b, label): (wl, b, ov, vs, label) for wl, b, ov, vs, label in specs}.values()
    )
    jobs = [
        Job(wl, b, s, variants, overrides=ov, tags=(("setting", f"{label} b{b}"),))
        for s in args.seeds
        for wl, b, ov, variants, label in specs
    ]
    runs = run_jobs(jobs, workers=1, desc=NAME)
    runs["sched_share_event"] = runs.sched_mean_us * 1e-6 / runs.act_mean_s
    runs["sched_share_action"] = runs.sched_per_action_us * 1e-6 / runs.act_mean_s
    runs["overhead_share"] = runs.overhead_mean_s / runs.act_mean_s
    runs["key"] = runs.setting + " " + runs.variant.where(runs.workload == "mopd", "")
    runs["key"] = runs.key.str.strip()
    agg = aggregate(runs, ["key", "workload", "batch", "variant"], METRICS)
    write_tables(args.out, NAME, runs, agg)
    bench = bench_scheduler(args.smoke)
    (args.out / f"{NAME}.bench.json").write_text(
        json.dumps(bench, indent=2) + "\n", encoding="utf-8"
    )

    # ---- figure
    fig, axes = plt.subplots(1, 2, figsize=(13, 4.6))
    ax = axes[0]
    keys = list(agg.key)
    x = np.arange(len(keys))
    for j, (m, label) in enumerate(
        (("sched_p50_us", "p50"), ("sched_mean_us", "mean"), ("sched_p99_us", "p99"))
    ):
        ax.bar(
            x + (j - 1) * 0.27,
            agg[f"{m}_mean"],
            0.27,
            yerr=agg[f"{m}_std"].fillna(0),
            capsize=2,
            label=label,
        )
    if "results" in bench:
        for r in bench["results"]:
            ax.axhline(r["p99_us"], color="grey", lw=0.6, ls=":")
        ax.text(
            len(keys) - 0.5,
            bench["results"][-1]["p99_us"],
            "bench p99 (256..8192 queued)",
            fontsize=7,
            ha="right",
            va="bottom",
            color="grey",
        )
    ax.set_yscale("log")
    ax.set_xticks(x, [k.replace(" b", "\nb") for k in keys], fontsize=7)
    ax.set_ylabel("wall time per scheduling call (µs)")
    ax.set_title("scheduler decision latency per event")
    ax.legend(fontsize=8)
    ax = axes[1]
    for j, (m, label) in enumerate(
        (
            ("sched_share_event", "scheduler, one event / ACT"),
            ("sched_share_action", "scheduler, all calls per action / ACT"),
            ("overhead_share", "system overhead (AOE/EOE) / ACT"),
        )
    ):
        ax.bar(
            x + (j - 1) * 0.27,
            100 * agg[f"{m}_mean"],
            0.27,
            yerr=100 * agg[f"{m}_std"].fillna(0),
            capsize=2,
            label=label,
        )
    ax.axhline(3, color="k", ls="--", lw=1, label="paper: AOE < 3% of ACT")
    ax.axhline(25, color="k", ls=":", lw=1, label="paper: EOE ~25% of ACT")
    ax.set_yscale("log")
    ax.set_xticks(x, [k.replace(" b", "\nb") for k in keys], fontsize=7)
    ax.set_ylabel("% of mean ACT")
    ax.set_title("overhead as a share of ACT")
    ax.legend(fontsize=7)
    save_figure(fig, args.out, NAME)

    # ---- report
    def row(key: str):
        return agg[agg.key == key].iloc[0]

    claims = []
    for key in keys:
        r = row(key)
        claims.append(
            Claim(
                f"scheduler time per event vs mean ACT, {key}",
                "mean decision latency / mean ACT",
                "- (not reported)",
                f"{pm(r.sched_mean_us_mean, r.sched_mean_us_std, 0)} µs = "
                f"{pm(100 * r.sched_share_event_mean, 100 * r.sched_share_event_std, 4, '%')}",
                r.sched_share_event_mean,
                r.sched_share_event_std,
            )
        )
    for key in keys:
        r = row(key)
        wl = r.workload
        paper = "< 3% (AOE)" if wl in ("coding",) else ("~25% (EOE)" if wl == "mopd" else "-")
        claims.append(
            Claim(
                f"system overhead share of ACT, {key}",
                "overhead / ACT",
                paper,
                pm(100 * r.overhead_share_mean, 100 * r.overhead_share_std, 2, "%"),
                r.overhead_share_mean,
                r.overhead_share_std,
            )
        )
    table = agg[["key", "seeds"]].copy()
    for m, label, d, scale in (
        ("actions", "actions", 0, 1),
        ("act_mean_s", "mean ACT (s)", 3, 1),
        ("sched_calls", "scheduling calls", 0, 1),
        ("sched_p50_us", "p50 µs", 1, 1),
        ("sched_mean_us", "mean µs", 1, 1),
        ("sched_p99_us", "p99 µs", 0, 1),
        ("sched_max_us", "max µs", 0, 1),
        ("sched_per_action_us", "µs per action", 1, 1),
        ("sched_share_action", "per action / ACT (%)", 4, 100),
        ("overhead_share", "overhead / ACT (%)", 2, 100),
    ):
        table[label] = [
            pm(scale * r[f"{m}_mean"], scale * r[f"{m}_std"], d) for _, r in agg.iterrows()
        ]
    sections = [
        (
            "Per-event decision latency while replaying the workloads (mean ± std over seeds)",
            md_table(table),
        )
    ]
    if "results" in bench:
        sections.append(
            (
                "`tangram bench scheduler --json`",
                md_table(
                    [
                        {
                            "queued": r["queued"],
                            "running": round(r["running_mean"]),
                            "events": r["events"],
                            "p50 µs": r["p50_us"],
                            "p99 µs": r["p99_us"],
                            "max µs": r["max_us"],
                        }
                        for r in bench["results"]
                    ],
                    floatfmt=".1f",
                )
                + f"\n\nTarget: {bench.get('target')} (met: {bench.get('target_met')}).",
            )
        )
    worst = agg.sched_share_action_mean.max()

    def pct(x: float) -> str:
        return f"{100 * x:.1f}%"

    cpu_share = agg[agg.workload == "coding"].overhead_share_mean.max()
    gpu40 = agg[(agg.workload == "mopd") & (agg.variant == "tangram@40")].overhead_share_mean.iloc[
        0
    ]
    gpu10 = agg[(agg.workload == "mopd") & (agg.variant == "tangram@10")].overhead_share_mean.iloc[
        0
    ]
    rep = Report(
        NAME,
        "Claim 6: scheduler and system overhead as a share of ACT",
        "Tangram's overhead is small against ACT: under 3% for CPU actions (AOE), about 25% for GPU "
        "actions (EOE, mostly restoring a model to the GPU). The scheduler itself must decide in "
        "well under an action's seconds-long ACT.",
        command("scheduler_overhead.py"),
        setup=[
            "Each run replays one workload under `tangram` with the scheduler's calls wrapped in "
            "`time.perf_counter` (the `Simulation(..., clock=time.perf_counter)` hook plus the same "
            "wrapper around `tick`): one call per simulated instant with arrivals or completions, "
            "deciding every action those events make startable.",
            f"Workloads: coding 1280 and 1536, DeepSearch 2048 (search median 1 s), MOPD 2048 on 40 and "
            f"10 GPUs (smoke: batch 32). Seeds {args.seeds}. One process; the machine has 2 shared "
            "cores, so wall times are upper bounds.",
            "'one event / ACT' = mean latency of one scheduling call / mean ACT: what an action waits "
            "for the decision that starts it. 'all calls per action' = total scheduler time / "
            "actions / mean ACT: the scheduler's CPU cost per action, a stricter bound.",
            "System overhead = the simulator's modelled AOE grant (0.5 ms) / container readiness and "
            "EOE restores, from the cluster file, not wall time.",
        ],
        claims=claims,
        sections=sections,
        differences=[
            f"The scheduler's cost is negligible against ACT: at most {100 * worst:.3f}% of mean ACT "
            "per action, in Python on a shared 2-core machine. The paper gives no separate figure "
            "for its scheduler; its overheads are the AOE and EOE costs, which the second half of "
            "the table reproduces from our modelled costs.",
            f"CPU (AOE) overhead is {pct(cpu_share)} of ACT (paper: < 3%): our grant cost is a direct "
            "cgroup write (0.5 ms, measured by this project's AOE benchmark) and the container start is "
            "hidden behind the first generation.",
            f"GPU (EOE) overhead is {pct(gpu40)} of ACT on the full 40-GPU pool and {pct(gpu10)} on 10 "
            "GPUs (paper: ~25%). On 40 GPUs restores are rare (every teacher starts resident; "
            "restores are copies onto further cells when its resident "
            "cells are busy), but each costs seconds (a 145 GB teacher on a 2-GPU cell: 2.9 s at 25 GB/s per link) against ~0.3 s "
            "calls; on 10 GPUs the teachers evict each other (see `mopd_gpu_savings.md`).",
        ],
        runtime_s=time.perf_counter() - t0,
        settings={"seeds": len(args.seeds), "workers": 1},
    )
    rep.write(args.out)
    print(f"{NAME}: wrote {args.out}/{NAME}.md ({rep.runtime_s:.0f} s)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
