"""Claim 2: CPU scaling vs Kubernetes pods, AI coding at batch 256..1536.

Paper: Tangram's advantage over Kubernetes static provisioning grows with the batch, from 3.1x
at batch 256 to 27.7x at batch 1536 (mean ACT).

    python experiments/cpu_scaling.py [--seeds 3] [--workers 2] [--smoke]

Besides the default pod of 4 cores (``k8s-static``), pods of 1 and 2 cores are run as a
sensitivity check: the paper does not give its pod size.
"""

from __future__ import annotations

import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

import matplotlib.pyplot as plt  # noqa: E402
import pandas as pd  # noqa: E402
from common import (  # noqa: E402
    Claim,
    Job,
    Report,
    Variant,
    aggregate,
    command,
    md_table,
    paired_ratio,
    parse_args,
    pm,
    run_jobs,
    save_figure,
    write_tables,
)

NAME = "cpu_scaling"
PAPER = {256: 3.1, 1536: 27.7}
BASES = ["k8s-static", "k8s-static:2", "k8s-static:1"]  # k8s-static = pods of 4 cores
METRICS = [
    "act_mean_s",
    "act_p99_s",
    "exec_mean_s",
    "queue_mean_s",
    "overhead_mean_s",
    "step_mean_s",
    "held_core_s",
    "busy_core_s",
    "held_cost_usd",
    "traj_mean_s",
]


def main(argv=None) -> int:
    args = parse_args(__doc__.splitlines()[0], argv)
    t0 = time.perf_counter()
    batches = [32] if args.smoke else [256, 512, 768, 1024, 1280, 1536]
    variants = (Variant("tangram"),) + tuple(Variant(b) for b in BASES)
    # Largest batches first so the pool's last jobs are short.
    jobs = [
        Job("coding", b, s, variants) for b in sorted(batches, reverse=True) for s in args.seeds
    ]
    runs = run_jobs(jobs, workers=args.workers, desc=NAME)
    runs = runs.sort_values(["batch", "variant", "seed"], kind="stable")
    agg = aggregate(runs, ["batch", "variant"], METRICS)
    ratio_frames = []
    for base in BASES:
        for metric in ("act_mean_s", "step_mean_s", "held_core_s"):
            r = paired_ratio(runs, ["batch"], metric, base, "tangram")
            r.insert(1, "baseline", base)
            r.insert(2, "metric", metric)
            ratio_frames.append(r)
    ratios = pd.concat(ratio_frames, ignore_index=True)
    write_tables(args.out, NAME, runs, agg)
    ratios.to_csv(args.out / f"{NAME}.ratios.csv", index=False, float_format="%.6g")

    # ---- figure
    fig, axes = plt.subplots(1, 2, figsize=(13, 4.5))
    colors = {v: f"C{i}" for i, v in enumerate(["tangram"] + BASES)}
    ax = axes[0]
    for v in ["tangram"] + BASES:
        a = agg[agg.variant == v].sort_values("batch")
        ax.errorbar(
            a.batch,
            a.act_mean_s_mean,
            yerr=a.act_mean_s_std.fillna(0),
            marker="o",
            capsize=3,
            color=colors[v],
            label=v + (" (4-core pods)" if v == "k8s-static" else ""),
        )
    ax.set_xlabel("batch (trajectories per step)")
    ax.set_ylabel("mean ACT (s)")
    ax.set_ylim(bottom=0)
    ax.set_title("AI coding: mean ACT vs batch")
    ax.legend()
    ax.grid(alpha=0.3)
    ax = axes[1]
    for base in BASES:
        r = ratios[(ratios.baseline == base) & (ratios.metric == "act_mean_s")].sort_values("batch")
        ax.errorbar(
            r.batch,
            r.ratio_mean,
            yerr=r.ratio_std.fillna(0),
            marker="o",
            capsize=3,
            color=colors[base],
            label=f"ours: {base}",
        )
    ax.plot(list(PAPER), list(PAPER.values()), "k*--", ms=12, label="paper (endpoints only)")
    ax.set_xlabel("batch")
    ax.set_ylabel("mean ACT, k8s / tangram (log)")
    ax.set_yscale("log")
    ax.set_yticks([1, 2, 3, 5, 10, 20, 30], ["1", "2", "3", "5", "10", "20", "30"])
    ax.set_title("CPU scaling: speedup over Kubernetes pods")
    ax.legend()
    ax.grid(alpha=0.3)
    save_figure(fig, args.out, NAME)

    # ---- report
    def ratio_of(base: str, b: int, metric: str = "act_mean_s"):
        r = ratios[
            (ratios.baseline == base) & (ratios.metric == metric) & (ratios.batch == b)
        ].iloc[0]
        return r.ratio_mean, r.ratio_std

    claims = []
    for b in batches if args.smoke else [256, 1536]:
        m, s = ratio_of("k8s-static", b)
        claims.append(
            Claim(
                f"CPU scaling vs k8s-static (4-core pods), batch {b}",
                "mean ACT, k8s / tangram",
                f"{PAPER[b]}x" if b in PAPER else "-",
                pm(m, s, 2, "x"),
                m,
                s,
            )
        )
    for base in BASES[1:]:
        b = batches[-1]
        m, s = ratio_of(base, b)
        claims.append(
            Claim(
                f"CPU scaling vs {base.split(':')[1]}-core pods ({base}, sensitivity), batch {b}",
                "mean ACT, k8s / tangram",
                f"{PAPER[b]}x" if b in PAPER else "-",
                pm(m, s, 2, "x"),
                m,
                s,
            )
        )
    table = []
    for b in batches:
        rec = {"batch": b}
        for v in ["tangram"] + BASES:
            a = agg[(agg.batch == b) & (agg.variant == v)].iloc[0]
            rec[f"{v} ACT (s)"] = pm(a.act_mean_s_mean, a.act_mean_s_std, 3)
        for base in BASES:
            m, s = ratio_of(base, b)
            rec[f"{base} / tangram"] = pm(m, s, 2, "x")
        table.append(rec)
    breakdown = agg[["batch", "variant"]].copy()
    for m, label in (
        ("exec_mean_s", "exec"),
        ("queue_mean_s", "queue"),
        ("overhead_mean_s", "overhead"),
        ("step_mean_s", "step (s)"),
        ("held_core_s", "held core-s"),
        ("busy_core_s", "busy core-s"),
    ):
        breakdown[label] = [
            pm(r[f"{m}_mean"], r[f"{m}_std"], 3 if m.endswith("mean_s") else 0)
            for _, r in agg.iterrows()
        ]
    step_rows = []
    for b in batches:
        rec = {"batch": b}
        for base in BASES:
            for metric, label in (("step_mean_s", "step"), ("held_core_s", "held core-s")):
                m, s = ratio_of(base, b, metric)
                rec[f"{base}: {label}"] = pm(m, s, 2, "x")
        step_rows.append(rec)
    hi = batches[-1]
    t_hi = agg[(agg.batch == hi) & (agg.variant == "tangram")].iloc[0]
    k_hi = agg[(agg.batch == hi) & (agg.variant == "k8s-static")].iloc[0]
    lo = batches[0]
    k1_lo = agg[(agg.batch == lo) & (agg.variant == "k8s-static:1")].iloc[0]
    t_lo = agg[(agg.batch == lo) & (agg.variant == "tangram")].iloc[0]
    rep = Report(
        NAME,
        "Claim 2: CPU scaling vs Kubernetes (AI coding, batch 256..1536)",
        "Tangram's mean-ACT advantage over Kubernetes static provisioning grows with the load: "
        "3.1x at batch 256, 27.7x at batch 1536.",
        command("cpu_scaling.py"),
        setup=[
            f"Workload `coding`, default parameters, one RL step, batches {batches}, seeds {args.seeds}; "
            "the `paper` cluster (15 x 256 = 3,840 cores).",
            "Baseline `k8s-static`: a pod of K cores per trajectory, requested when the trajectory "
            "opens and held until it ends (K = 4, the project default; K = 2 and K = 1 as a sensitivity "
            "check, since the paper does not say). Pods that do not fit wait, FCFS.",
            "Ratio = baseline's mean ACT / tangram's, per seed on the same trace, then mean ± std.",
            "'CPU scaling' is read as the ratio of mean ACT as the batch grows on a fixed pool; the "
            "paper notes give only the two endpoints.",
        ],
        claims=claims,
        sections=[
            ("Mean ACT and speedup per batch (mean ± std over seeds)", md_table(table)),
            ("Step time and held core-seconds, baseline / tangram", md_table(step_rows)),
            ("Breakdown (mean ± std)", md_table(breakdown)),
        ],
        differences=[
            f"With 4-core pods our speedup grows with the batch, as in the paper, but stays far "
            f"below it: {pm(*ratio_of('k8s-static', lo), 2, 'x')} at batch {lo} and "
            f"{pm(*ratio_of('k8s-static', hi), 2, 'x')} at batch {hi} vs 3.1x and 27.7x; it only "
            "grows once pods no longer fit (above 960 trajectories). With 1- and 2-core pods, "
            "which always fit, it shrinks slightly with the batch, as Tangram's DoP falls with the "
            "load. With 4-core pods "
            f"the baseline's ACT at batch {hi} is {k_hi.act_mean_s_mean:.2f} s, of which "
            f"{k_hi.queue_mean_s_mean:.2f} s queueing (trajectories waiting for a pod: "
            f"{hi} x 4 cores > 3,840); Tangram's is {t_hi.act_mean_s_mean:.2f} s. A 27.7x gap "
            f"would need the baseline to queue ~{27.7 * t_hi.act_mean_s_mean - k_hi.exec_mean_s_mean:.0f} s "
            "per action on average, i.e. most trajectories "
            "waiting for a whole other trajectory to finish. In our closed-loop generator "
            f"trajectory lengths are log-normal (mean ~29 actions, {t_hi.traj_mean_s_mean:.0f} s under "
            "Tangram), so freed pods come quickly: a trajectory that waits for a pod waits once, "
            "and its later actions run at once in the pod.",
            f"At low load the ratio is the DoP effect alone: at batch {lo}, 1-core pods give "
            f"{k1_lo.act_mean_s_mean:.2f} s vs Tangram's {t_lo.act_mean_s_mean:.2f} s "
            f"({pm(*ratio_of('k8s-static:1', lo), 2, 'x')}); the paper's 3.1x at batch 256 is "
            "closer to small pods than to our 4-core default. Smaller pods, in turn, never "
            "queue at these batches (1536 x 2 cores < 3,840), so no pod size reproduces both "
            "endpoints: the paper's baseline must lose time in ways our model does not have "
            "(pod startup and scheduling latency under churn, noisy neighbours, or burstier "
            "arrivals).",
            "Our generator is calibrated from published statistics (docs/workloads.md), not the "
            "paper's traces; its bursts come only from the step's synchronous start.",
        ],
        runtime_s=time.perf_counter() - t0,
        settings={"seeds": len(args.seeds), "workers": args.workers},
    )
    rep.write(args.out)
    print(f"{NAME}: wrote {args.out}/{NAME}.md ({rep.runtime_s:.0f} s)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
