"""Claim 5: fixed DoP 4 and 16 vs elastic DoP (AI coding at several batch sizes).

Paper (ablation): a fixed DoP of 4 wastes cores when actions are sparse; a fixed DoP of 16
queues in bursts; elastic DoP beats both throughout training.

    python experiments/fixed_dop.py [--seeds 3] [--workers 2] [--smoke]
"""

from __future__ import annotations

import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

import matplotlib.pyplot as plt  # noqa: E402
import numpy as np  # noqa: E402
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

NAME = "fixed_dop"
POLICIES = ["tangram", "fixed:4", "fixed:16"]
METRICS = [
    "act_mean_s",
    "act_p99_s",
    "exec_mean_s",
    "queue_mean_s",
    "step_mean_s",
    "held_core_s",
    "busy_core_s",
    "provisioned_core_s",
    "env_units_mean",
    "reward_units_mean",
    "idle_share",
]


def main(argv=None) -> int:
    args = parse_args(__doc__.splitlines()[0], argv)
    t0 = time.perf_counter()
    batches = [32] if args.smoke else [256, 768, 1280, 1536]
    variants = tuple(Variant(p) for p in POLICIES)
    jobs = [
        Job("coding", b, s, variants) for b in sorted(batches, reverse=True) for s in args.seeds
    ]
    runs = run_jobs(jobs, workers=args.workers, desc=NAME)
    runs = runs.sort_values(["batch", "seed"], kind="stable")
    # Cores left idle in the pool over the step (never held by any action).
    runs["idle_share"] = 1 - runs.held_core_s / runs.provisioned_core_s
    agg = aggregate(runs, ["batch", "variant"], METRICS)
    ratios = pd.concat(
        [
            paired_ratio(runs, ["batch"], "act_mean_s", p, "tangram").assign(baseline=p)
            for p in POLICIES[1:]
        ],
        ignore_index=True,
    )
    write_tables(args.out, NAME, runs, agg)
    ratios.to_csv(args.out / f"{NAME}.ratios.csv", index=False, float_format="%.6g")

    # ---- figure
    fig, axes = plt.subplots(1, 3, figsize=(16, 4.5))
    ax = axes[0]
    for p in POLICIES:
        a = agg[agg.variant == p].sort_values("batch")
        ax.errorbar(
            a.batch,
            a.act_mean_s_mean,
            yerr=a.act_mean_s_std.fillna(0),
            marker="o",
            capsize=3,
            label=p,
        )
    ax.set_xlabel("batch")
    ax.set_ylabel("mean ACT (s)")
    ax.set_title("AI coding: mean ACT, fixed vs elastic DoP")
    ax.legend()
    ax.grid(alpha=0.3)
    ax = axes[1]
    x = np.arange(len(batches))
    w = 0.27
    for j, p in enumerate(POLICIES):
        a = agg[agg.variant == p].set_index("batch").loc[batches]
        ax.bar(x + (j - 1) * w, a.exec_mean_s_mean, w, color=f"C{j}", label=f"{p} execution")
        ax.bar(
            x + (j - 1) * w,
            a.queue_mean_s_mean,
            w,
            bottom=a.exec_mean_s_mean,
            color=f"C{j}",
            alpha=0.45,
            hatch="//",
            label=f"{p} queueing",
        )
    ax.set_xticks(x, [str(b) for b in batches])
    ax.set_xlabel("batch")
    ax.set_ylabel("mean seconds per action")
    ax.set_title("execution (solid) + queueing (hatched)")
    ax.legend(fontsize=7, ncol=2)
    ax = axes[2]
    for p in POLICIES:
        a = agg[agg.variant == p].sort_values("batch")
        ax.errorbar(
            a.batch,
            100 * a.idle_share_mean,
            yerr=100 * a.idle_share_std.fillna(0),
            marker="o",
            capsize=3,
            label=p,
        )
    ax.set_xlabel("batch")
    ax.set_ylabel("% of core-seconds never held")
    ax.set_title("cores left idle in the pool")
    ax.legend()
    ax.grid(alpha=0.3)
    save_figure(fig, args.out, NAME)

    # ---- report
    def r(p: str, b: int) -> tuple[float, float]:
        row = ratios[(ratios.baseline == p) & (ratios.batch == b)].iloc[0]
        return row.ratio_mean, row.ratio_std

    def a(p: str, b: int):
        return agg[(agg.variant == p) & (agg.batch == b)].iloc[0]

    lo, hi = batches[0], batches[-1]
    claims = [
        Claim(
            f"fixed DoP 4 vs elastic, batch {lo} (sparse)",
            "mean ACT fixed:4 / tangram",
            "elastic wins (DoP 4 wastes cores)",
            f"{pm(*r('fixed:4', lo), 2, 'x')}; idle cores {100 * a('fixed:4', lo).idle_share_mean:.0f}% vs "
            f"{100 * a('tangram', lo).idle_share_mean:.0f}%",
            *r("fixed:4", lo),
        ),
        Claim(
            f"fixed DoP 16 vs elastic, batch {hi} (bursty)",
            "mean ACT fixed:16 / tangram",
            "elastic wins (DoP 16 queues)",
            f"{pm(*r('fixed:16', hi), 2, 'x')}; queueing {a('fixed:16', hi).queue_mean_s_mean:.3f} s vs "
            f"{a('tangram', hi).queue_mean_s_mean:.3f} s",
            *r("fixed:16", hi),
        ),
    ]
    wins = all(
        a("tangram", b).act_mean_s_mean
        <= min(a("fixed:4", b).act_mean_s_mean, a("fixed:16", b).act_mean_s_mean)
        for b in batches
    )
    claims.append(
        Claim(
            "elastic beats both fixed DoPs at every batch",
            "mean ACT",
            "yes",
            "yes" if wins else "no (see table)",
        )
    )
    max_q4 = max(a("fixed:4", b).queue_mean_s_mean for b in batches)
    table = []
    for b in batches:
        rec = {"batch": b}
        for p in POLICIES:
            row = a(p, b)
            rec[f"{p} ACT"] = pm(row.act_mean_s_mean, row.act_mean_s_std, 3)
        for p in POLICIES[1:]:
            rec[f"{p} / tangram"] = pm(*r(p, b), 2, "x")
        table.append(rec)
    detail = agg[["batch", "variant"]].copy()
    for m, label, d in (
        ("exec_mean_s", "exec", 3),
        ("queue_mean_s", "queue", 3),
        ("act_p99_s", "p99 ACT", 2),
        ("env_units_mean", "env cores", 1),
        ("reward_units_mean", "reward cores", 1),
        ("idle_share", "idle core share", 3),
        ("step_mean_s", "step (s)", 1),
    ):
        detail[label] = [pm(x[f"{m}_mean"], x[f"{m}_std"], d) for _, x in agg.iterrows()]
    rep = Report(
        NAME,
        "Claim 5: fixed DoP 4 and 16 vs elastic DoP (AI coding)",
        "A fixed DoP of 4 wastes cores when actions are sparse; a fixed DoP of 16 queues in bursts; "
        "elastic DoP beats both.",
        command("fixed_dop.py"),
        setup=[
            f"Workload `coding`, default parameters, one RL step, batches {batches}, seeds {args.seeds}, "
            "the `paper` cluster.",
            "`fixed:K`: every action gets its largest option not above K cores (env actions up to 16, "
            "rewards up to 32), strict FCFS per node; `tangram`: elastic DoP chosen per scheduling pass.",
            "Idle core share = 1 - held core-seconds / provisioned core-seconds over the step.",
        ],
        claims=claims,
        sections=[
            ("Mean ACT per batch (mean ± std over seeds)", md_table(table)),
            ("Breakdown and core use (mean ± std)", md_table(detail)),
        ],
        differences=[
            (
                "The qualitative result holds: DoP 4 runs every action slower than needed while most "
                "of the pool idles (sparse load), DoP 16 queues once the batch is large, and elastic "
                "DoP has the lowest mean ACT at every batch."
                if wins
                else "Elastic DoP does NOT beat both fixed DoPs at every batch here (see the table): "
                "this contradicts the paper and is reported as an issue."
            )
            + " The paper shows the ablation through training (phases of different burstiness); "
            "we run single RL steps at several batch sizes, which spans the same range of load.",
            f"Our fixed:4 queues at most {max_q4:.3f} s per action on average at these batches "
            "(4 cores x the actions in flight stays below 3,840 cores), so its cost is execution "
            "at a low DoP, as the paper describes ('wastes cores'), not queueing.",
        ],
        runtime_s=time.perf_counter() - t0,
        settings={"seeds": len(args.seeds), "workers": args.workers},
    )
    rep.write(args.out)
    print(f"{NAME}: wrote {args.out}/{NAME}.md ({rep.runtime_s:.0f} s)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
