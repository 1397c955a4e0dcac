"""Claim 3: MOPD on GPUs, Tangram vs dedicated SGLang services, and the GPUs each needs.

Paper: SGLang-style serving dedicates 4 GPUs to each of 9 teachers (36 GPUs); Tangram reaches
comparable latency on 10 GPUs (71.2% saved). Mean ACT 18.1x lower than SGLang at batch 2048.
Tangram's breakdown (execution / queueing / overhead): 0.621 / 0.081 / 0.201 s at batch 2048,
0.705 / 15.05 / 0.240 s at 3072.

    python experiments/mopd_gpu_savings.py [--seeds 3] [--workers 2] [--smoke]

The savings search replays each trace under ``tangram`` on ``cluster.scaled_gpus(n)`` for every
n in 2..40 and reports the smallest n whose mean ACT is at most ``sglang-static``'s on 36 GPUs.
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
    mean_std,
    parse_args,
    pm,
    run_jobs,
    save_figure,
    write_tables,
)

NAME = "mopd_gpu_savings"
PAPER_BREAKDOWN = {2048: (0.621, 0.081, 0.201), 3072: (0.705, 15.05, 0.240)}
PAPER_GPUS = (36, 10)
PAPER_SAVED = 0.712
PAPER_SPEEDUP_2048 = 18.1
SGLANG_GPUS = 36  # 9 teachers x 4 GPUs
FULL_GPUS = 40  # the paper cluster: 5 nodes x 8
METRICS = [
    "act_mean_s",
    "act_p50_s",
    "act_p99_s",
    "exec_mean_s",
    "queue_mean_s",
    "overhead_mean_s",
    "step_mean_s",
    "rejected",
    "busy_gpu_s",
    "held_gpu_s",
    "provisioned_gpu_s",
    "gpu_cost_usd",
    "teacher_units_mean",
]


def smallest(scan: pd.DataFrame, ok: pd.Series) -> float:
    """The smallest GPU count in ``scan`` where ``ok`` holds (NaN if none)."""
    n = scan.loc[ok, "gpus"]
    return float(n.min()) if len(n) else float("nan")


def main(argv=None) -> int:
    args = parse_args(__doc__.splitlines()[0], argv)
    t0 = time.perf_counter()
    batches = [32] if args.smoke else [2048, 3072]
    grid = [4, 8, 10, 16, 24, FULL_GPUS] if args.smoke else list(range(2, FULL_GPUS + 1))
    # The scan's timeline (held GPUs) is kept only on the full pool, to save time.
    variants = (
        Variant("sglang-static", label="sglang-static@36", gpus=SGLANG_GPUS),
        # The same 36 GPUs split by expected load (popularity x call cost), as operators size them.
        Variant("sglang-sized", label="sglang-sized@36", gpus=SGLANG_GPUS),
    ) + tuple(
        Variant("tangram", label=f"tangram@{n}", gpus=n, timeline=n == FULL_GPUS) for n in grid
    )
    jobs = [Job("mopd", b, s, variants) for b in batches for s in args.seeds]
    runs = run_jobs(jobs, workers=args.workers, desc=NAME)
    runs["scan"] = runs.variant.str.startswith("tangram@")
    agg = aggregate(runs, ["batch", "variant", "gpus"], METRICS)

    # ---- savings per (batch, seed)
    savings = []
    for (b, s), g in runs.groupby(["batch", "seed"]):
        sg = g[g.variant == "sglang-static@36"].iloc[0]
        sized = g[g.variant == "sglang-sized@36"].iloc[0]
        full = g[g.variant == "tangram@40"].iloc[0]
        sc = g[g.scan].sort_values("gpus")
        n_act = smallest(sc, sc.act_mean_s <= sg.act_mean_s)
        # "comparable": within 10% of the baseline's mean ACT / within 1% of its step time
        n_act10 = smallest(sc, sc.act_mean_s <= 1.10 * sg.act_mean_s)
        n_step = smallest(sc, sc.step_mean_s <= 1.01 * sg.step_mean_s)
        at10 = sc[sc.gpus == 10]
        savings.append(
            {
                "batch": b,
                "seed": s,
                "sglang_act_mean_s": sg.act_mean_s,
                "sglang_step_s": sg.step_mean_s,
                "tangram40_act_mean_s": full.act_mean_s,
                "speedup_at_40": sg.act_mean_s / full.act_mean_s,
                "gpus_equal_act": n_act,
                "sized_act_mean_s": sized.act_mean_s,
                "gpus_equal_act_sized": smallest(sc, sc.act_mean_s <= sized.act_mean_s),
                "saved_equal_act": 1 - n_act / SGLANG_GPUS,
                "gpus_act_within_10pct": n_act10,
                "gpus_step_within_1pct": n_step,
                "saved_step_within_1pct": 1 - n_step / SGLANG_GPUS,
                "tangram10_act_mean_s": float(at10.act_mean_s.iloc[0]) if len(at10) else np.nan,
                "tangram10_step_s": float(at10.step_mean_s.iloc[0]) if len(at10) else np.nan,
            }
        )
    sav = pd.DataFrame(savings)
    sav_agg = aggregate(sav, ["batch"], [c for c in sav.columns if c not in ("batch", "seed")])
    write_tables(args.out, NAME, runs, agg)
    sav.to_csv(args.out / f"{NAME}.savings_runs.csv", index=False, float_format="%.6g")
    sav_agg.to_csv(args.out / f"{NAME}.savings.csv", index=False, float_format="%.6g")

    # ---- figure
    fig, axes = plt.subplots(1, 2, figsize=(13, 4.6))
    ax = axes[0]
    for i, b in enumerate(batches):
        a = agg[(agg.batch == b) & agg.variant.str.startswith("tangram@")].sort_values("gpus")
        color = f"C{i}"
        ax.plot(a.gpus, a.act_mean_s_mean, "o-", color=color, ms=3, label=f"tangram, batch {b}")
        ax.fill_between(
            a.gpus,
            a.act_mean_s_mean - a.act_mean_s_std.fillna(0),
            a.act_mean_s_mean + a.act_mean_s_std.fillna(0),
            color=color,
            alpha=0.2,
        )
        sg = agg[(agg.batch == b) & (agg.variant == "sglang-static@36")].iloc[0]
        ax.axhline(
            sg.act_mean_s_mean,
            color=color,
            ls="--",
            lw=1,
            label=f"sglang-static on 36 GPUs, batch {b}",
        )
        n = sav_agg[sav_agg.batch == b].iloc[0]
        ax.axvline(n.gpus_equal_act_mean, color=color, ls=":", lw=1)
    ax.axvline(PAPER_GPUS[1], color="k", ls="-.", lw=1, label="paper: 10 GPUs")
    ax.set_yscale("log")
    ax.set_xlabel("GPUs in the pool (tangram)")
    ax.set_ylabel("mean ACT (s)")
    ax.set_title("MOPD: mean ACT vs GPUs (dotted: smallest n matching SGLang)")
    ax.legend(fontsize=7)
    ax.grid(alpha=0.3)

    ax = axes[1]
    labels, parts = [], []
    for b in batches:
        if b in PAPER_BREAKDOWN:
            labels.append(f"paper\n{b}")
            parts.append(PAPER_BREAKDOWN[b])
        for v in ("tangram@40", "tangram@10", "sglang-static@36"):
            a = agg[(agg.batch == b) & (agg.variant == v)]
            if a.empty:
                continue
            a = a.iloc[0]
            labels.append(f"{v}\n{b}")
            parts.append((a.exec_mean_s_mean, a.queue_mean_s_mean, a.overhead_mean_s_mean))
    parts = np.array(parts)
    bottom = np.zeros(len(labels))
    for i, part in enumerate(("execution", "queueing", "overhead")):
        ax.bar(labels, parts[:, i], bottom=bottom, label=part)
        bottom += parts[:, i]
    for i, total in enumerate(bottom):
        ax.text(i, total, f"{total:.2f}", ha="center", va="bottom", fontsize=7)
    ax.set_yscale("symlog", linthresh=1)
    ax.set_ylabel("mean seconds per action (symlog)")
    ax.set_title("MOPD ACT breakdown")
    ax.tick_params(axis="x", labelsize=6)
    ax.legend(fontsize=7)
    save_figure(fig, args.out, NAME)

    # ---- report
    def s_(b: int, col: str, digits: int = 1, unit: str = "") -> tuple[str, float, float]:
        r = sav_agg[sav_agg.batch == b].iloc[0]
        return (
            pm(r[f"{col}_mean"], r[f"{col}_std"], digits, unit),
            r[f"{col}_mean"],
            r[f"{col}_std"],
        )

    def bd(b: int, v: str) -> tuple[str, float, float]:
        a = agg[(agg.batch == b) & (agg.variant == v)].iloc[0]
        text = " / ".join(
            pm(a[f"{m}_mean"], a[f"{m}_std"], 3)
            for m in ("exec_mean_s", "queue_mean_s", "overhead_mean_s")
        )
        return text, a.act_mean_s_mean, a.act_mean_s_std

    b0 = batches[0]

    def load(b: int, v: str) -> str:
        """Offered load of a variant: busy / provisioned GPU-seconds (mean over seeds)."""
        a = agg[(agg.batch == b) & (agg.variant == v)]
        if a.empty:
            return "n/a"
        a = a.iloc[0]
        return f"{a.busy_gpu_s_mean / a.provisioned_gpu_s_mean:.1%}"

    loads = (
        f"offered load (busy / provisioned GPU-s): sglang@36 {load(b0, 'sglang-static@36')}, "
        f"tangram@40 {load(b0, 'tangram@40')}, tangram@10 {load(b0, 'tangram@10')}"
    )
    claims = []
    t, m, sd = s_(b0, "gpus_equal_act", 1)
    saved_m, saved_s = mean_std(sav[sav.batch == b0].saved_equal_act)
    claims.append(
        Claim(
            f"MOPD GPUs for equal mean ACT, batch {b0}",
            "GPUs: sglang-static -> tangram (saved)",
            "36 -> 10 (71.2%)",
            f"36 -> {t} ({pm(100 * saved_m, 100 * saved_s, 1, '%')}); {loads}",
            m,
            sd,
        )
    )
    t, m, sd = s_(b0, "gpus_equal_act_sized", 1)
    claims.append(
        Claim(
            f"MOPD GPUs for equal mean ACT vs SGLang sized by load, batch {b0}",
            "GPUs: sglang-sized -> tangram",
            "-",
            f"36 -> {t}; offered load sglang-sized@36 {load(b0, 'sglang-sized@36')}",
            m,
            sd,
        )
    )
    t, m, sd = s_(b0, "gpus_step_within_1pct", 1)
    claims.append(
        Claim(
            f"MOPD GPUs for step time within 1% of SGLang, batch {b0}",
            "GPUs: sglang-static -> tangram",
            '36 -> 10 ("comparable latency")',
            f"36 -> {t}; {loads}",
            m,
            sd,
        )
    )
    t, m, sd = s_(b0, "speedup_at_40", 2, "x")
    claims.append(
        Claim(
            f"MOPD mean ACT vs sglang-static, batch {b0}",
            "sglang-static@36 / tangram@40",
            f"{PAPER_SPEEDUP_2048}x" if b0 == 2048 else "-",
            t,
            m,
            sd,
        )
    )
    for b in batches:
        paper = " / ".join(str(x) for x in PAPER_BREAKDOWN[b]) if b in PAPER_BREAKDOWN else "-"
        for v in ("tangram@40", "tangram@10"):
            t, m, sd = bd(b, v)
            claims.append(
                Claim(
                    f"MOPD ACT breakdown, batch {b}, {v} GPUs",
                    "exec / queue / overhead (s)",
                    paper,
                    t,
                    m,
                    sd,
                )
            )

    sav_table = []
    for b in batches:
        rec = {"batch": b}
        for col, label, d in (
            ("sglang_act_mean_s", "sglang@36 ACT (s)", 3),
            ("sized_act_mean_s", "sglang-sized@36 ACT (s)", 3),
            ("gpus_equal_act_sized", "GPUs: ACT <= sized", 1),
            ("tangram40_act_mean_s", "tangram@40 ACT (s)", 3),
            ("speedup_at_40", "speedup", 2),
            ("gpus_equal_act", "GPUs: ACT <= sglang", 1),
            ("gpus_act_within_10pct", "GPUs: ACT <= 1.1x sglang", 1),
            ("gpus_step_within_1pct", "GPUs: step <= 1.01x sglang", 1),
            ("tangram10_act_mean_s", "tangram@10 ACT (s)", 3),
        ):
            rec[label] = s_(b, col, d)[0]
        sav_table.append(rec)
    fixed_table = agg[
        agg.variant.isin(["tangram@40", "sglang-static@36", "tangram@10", "tangram@24"])
    ][["batch", "variant", "gpus"]].copy()
    sub = agg.loc[fixed_table.index]
    for m, label, d in (
        ("act_mean_s", "mean ACT", 3),
        ("act_p99_s", "p99 ACT", 3),
        ("exec_mean_s", "exec", 3),
        ("queue_mean_s", "queue", 3),
        ("overhead_mean_s", "overhead", 3),
        ("teacher_units_mean", "GPUs per call", 2),
        ("step_mean_s", "step (s)", 1),
        ("busy_gpu_s", "busy GPU-s", 0),
    ):
        fixed_table[label] = [pm(r[f"{m}_mean"], r[f"{m}_std"], d) for _, r in sub.iterrows()]
    full = agg[(agg.batch == b0) & (agg.variant == "tangram@40")].iloc[0]
    ten = agg[(agg.batch == b0) & (agg.variant == "tangram@10")]
    ten = ten.iloc[0] if len(ten) else full
    sg0 = agg[(agg.batch == b0) & (agg.variant == "sglang-static@36")].iloc[0]
    util10 = ten.busy_gpu_s_mean / (10 * ten.step_mean_s_mean)
    rep = Report(
        NAME,
        "Claim 3: MOPD, Tangram vs dedicated SGLang GPUs, and the GPUs each needs",
        "Multi-teacher on-policy distillation (9 teachers): SGLang-style serving needs 36 GPUs "
        "(4 per teacher); Tangram reaches comparable latency with 10 GPUs (71.2% saved) and is "
        "18.1x faster in mean ACT at batch 2048 on the same pool. Tangram's breakdown "
        "(exec / queue / overhead): 0.621 / 0.081 / 0.201 s at 2048, 0.705 / 15.05 / 0.240 s at 3072.",
        command("mopd_gpu_savings.py"),
        setup=[
            f"Workload `mopd` (9 teachers of 7B..72B, default parameters), one RL step, batches "
            f"{batches}, seeds {args.seeds}.",
            "Baseline `sglang-static` on `cluster.scaled_gpus(36)`: each teacher gets 4 dedicated GPUs "
            "(replicas of its smallest tensor-parallel cell), calls queue FCFS per teacher.",
            "Tangram on the full `paper` pool (40 GPUs) and, for the savings search, on "
            f"`scaled_gpus(n)` for n in {grid[0]}..{grid[-1]} (10 = 8 + 2). EOE restore cost from the "
            "cluster file: bytes / 25 GB/s + 50 ms.",
            "Savings: per seed, the smallest n with tangram's mean ACT <= sglang-static's mean ACT "
            "on 36 GPUs; also with a 10% tolerance, and the smallest n whose step time is within 1% "
            "of the baseline's (the 'comparable latency' the paper may mean). The scan is not "
            "monotone everywhere (restore thrash depends on placement), so 'smallest n' is the "
            "first n that satisfies the test.",
        ],
        claims=claims,
        sections=[
            ("Savings and speedup per batch (mean ± std over seeds)", md_table(sav_table)),
            ("Selected configurations (mean ± std over seeds)", md_table(fixed_table)),
        ],
        differences=[
            f"Tangram needs far more than 10 GPUs to match SGLang's mean ACT here, because the "
            f"baseline is much better in our model than in the paper's: SGLang on 36 GPUs has a "
            f"mean ACT of {sg0.act_mean_s_mean:.3f} s (mostly execution on one replica; its "
            f"queueing is {sg0.queue_mean_s_mean:.3f} s), so the 18.1x gap the paper measured does "
            "not exist to be traded for GPUs. Our MOPD generator spreads a batch's teacher calls "
            f"over the ~{sg0.step_mean_s_mean:.0f} s step (student generation of median 8k tokens "
            f"at 40.7 tok/s), ~{b0 / sg0.step_mean_s_mean:.1f} calls/s at batch {b0}, so dedicated "
            "replicas rarely queue. The paper's "
            "SGLang baseline must see bursts (e.g. synchronous rollouts ending together) that "
            "our closed-loop generator does not produce.",
            f"On 10 GPUs Tangram's mean ACT is {ten.act_mean_s_mean:.2f} s: busy GPUs are only "
            f"{util10:.0%} of the pool, but restores dominate: 9 teachers (578 GB of bf16 weights) "
            "compete for 800 GB of GPU memory, each miss restores up to 145 GB at 25 GB/s, and "
            f"the overhead ({ten.overhead_mean_s_mean:.2f} s) and queueing behind restores "
            f"({ten.queue_mean_s_mean:.2f} s) are several times the execution. The paper's "
            "0.201 s overhead at batch 2048 suggests faster restores (or fewer misses) than ours: "
            "our modelled restore takes size / 25 GB/s whatever the cell's width, whereas a "
            "tensor-parallel cell could load its shards over each GPU's own PCIe link at once.",
            "By step time the savings do appear: the RL step is dominated by student generation, "
            "so Tangram on few GPUs keeps the step within 1% of the baseline's (row 2 above).",
            "The paper's 15.05 s queueing at batch 3072 means its pool was saturated there; ours is "
            "not at 40 GPUs, and at 10 GPUs it queues but less (see the table); our curve reaches "
            "that regime only below ~9 GPUs, where mean ACT climbs steeply (figure, left).",
            "Both pools start warm (`SimConfig.warm_gpus`): every teacher is resident once before "
            "the step, as after earlier steps, and the SGLang replicas are loaded at deployment. "
            "Restores in Tangram's run are copies onto further cells when a teacher's resident "
            "cells are busy, and, on small pools, teachers evicting each other. A restore of a "
            "k-GPU cell loads k shards over k host-to-GPU links.",
        ],
        runtime_s=time.perf_counter() - t0,
        settings={"seeds": len(args.seeds), "workers": args.workers, "scan points": len(grid)},
    )
    rep.write(args.out)
    print(f"{NAME}: wrote {args.out}/{NAME}.md ({rep.runtime_s:.0f} s)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
