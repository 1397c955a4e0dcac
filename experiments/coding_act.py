"""Claim 1: AI-coding ACT and its breakdown at batch 1280 and 1536, Tangram vs Kubernetes pods.

Paper: execution / queueing / overhead 0.975 / 0.015 / 0.024 s at batch 1280 and
1.206 / 0.428 / 0.036 s at 1536; mean ACT 4.3x lower than Kubernetes static provisioning
(environment actions 9.0x, reward 2.8x).

    python experiments/coding_act.py [--seeds 3] [--workers 2] [--smoke]

Also writes per-action and timeline Parquet for seed 0 at batch 1280 (trimmed columns), which
``notebooks/results.ipynb`` reads.
"""

from __future__ import annotations

import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

import common  # noqa: E402
import matplotlib.pyplot as plt  # noqa: E402
import numpy as np  # noqa: E402
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

NAME = "coding_act"
PAPER = {  # batch -> (execution, queueing, overhead), Tangram, seconds per action
    1280: (0.975, 0.015, 0.024),
    1536: (1.206, 0.428, 0.036),
}
PAPER_RATIO = {"all": 4.3, "env": 9.0, "reward": 2.8}
BASE = "k8s-static"  # pods of DEFAULT_POD_CORES = 4 cores
METRICS = [
    "act_mean_s",
    "act_p50_s",
    "act_p99_s",
    "exec_mean_s",
    "queue_mean_s",
    "overhead_mean_s",
    "step_mean_s",
    "held_core_s",
    "busy_core_s",
    "provisioned_core_s",
    "held_cost_usd",
    "env_act_mean_s",
    "env_queue_mean_s",
    "env_exec_mean_s",
    "env_units_mean",
    "reward_act_mean_s",
    "reward_queue_mean_s",
    "reward_exec_mean_s",
    "reward_units_mean",
]


def main(argv=None) -> int:
    args = parse_args(__doc__.splitlines()[0], argv)
    t0 = time.perf_counter()
    batches = [32] if args.smoke else [1280, 1536]
    save_batch = batches[0]
    variants = (Variant("tangram"), Variant(BASE))
    jobs = [
        Job(
            "coding",
            b,
            s,
            variants,
            save_dir=str(args.out) if (b == save_batch and s == 0) else None,
            save_variants=("tangram", BASE),
        )
        for b in batches
        for s in args.seeds
    ]
    runs = run_jobs(jobs, workers=args.workers, desc=NAME)
    agg = aggregate(runs, ["batch", "variant"], METRICS)
    ratios = {
        kind: paired_ratio(runs, ["batch"], col, BASE, "tangram")
        for kind, col in (
            ("all", "act_mean_s"),
            ("env", "env_act_mean_s"),
            ("reward", "reward_act_mean_s"),
            ("step", "step_mean_s"),
        )
    }
    for kind, r in ratios.items():
        agg = agg.merge(
            r[["batch", "ratio_mean", "ratio_std"]].rename(
                columns={"ratio_mean": f"ratio_{kind}_mean", "ratio_std": f"ratio_{kind}_std"}
            ),
            on="batch",
            how="left",
        )
    write_tables(args.out, NAME, runs, agg)

    # ---- figure: breakdown bars (ours beside the paper's) and the per-kind speedups
    fig, axes = plt.subplots(1, 2, figsize=(13, 4.5))
    ax = axes[0]
    labels, parts = [], []
    for b in batches:
        if b in PAPER:
            labels.append(f"paper\ntangram {b}")
            parts.append(PAPER[b])
        for v in ("tangram", BASE):
            row = agg[(agg.batch == b) & (agg.variant == v)].iloc[0]
            labels.append(f"ours\n{v} {b}")
            parts.append((row.exec_mean_s_mean, row.queue_mean_s_mean, row.overhead_mean_s_mean))
    parts = np.array(parts)
    bottom = np.zeros(len(labels))
    for i, (part, color) in enumerate(
        zip(
            ("execution", "queueing", "overhead"),
            ("tab:blue", "tab:orange", "tab:green"),
            strict=True,
        )
    ):
        ax.bar(labels, parts[:, i], bottom=bottom, label=part, color=color)
        bottom += parts[:, i]
    for i, total in enumerate(bottom):
        ax.text(i, total, f"{total:.2f}", ha="center", va="bottom", fontsize=8)
    ax.set_ylabel("mean seconds per action")
    ax.set_title("AI coding: ACT breakdown (mean over seeds)")
    ax.tick_params(axis="x", labelsize=7)
    ax.legend()

    ax = axes[1]
    kinds = ["all", "env", "reward"]
    x = np.arange(len(kinds))
    width = 0.8 / (len(batches) + 1)
    ax.bar(x, [PAPER_RATIO[k] for k in kinds], width, label="paper (batch 1280)", color="grey")
    for j, b in enumerate(batches):
        means = [ratios[k].set_index("batch").loc[b, "ratio_mean"] for k in kinds]
        stds = [ratios[k].set_index("batch").loc[b, "ratio_std"] for k in kinds]
        ax.bar(
            x + (j + 1) * width, means, width, yerr=np.nan_to_num(stds), label=f"ours, batch {b}"
        )
    ax.set_xticks(x + width * len(batches) / 2, ["all actions", "env actions", "reward"])
    ax.set_ylabel(f"mean ACT, {BASE} / tangram")
    ax.set_title("speedup over Kubernetes pods (4 cores)")
    ax.axhline(1, color="k", lw=0.5)
    ax.legend()
    save_figure(fig, args.out, NAME)

    # ---- report
    def cell(b: int, v: str, m: str, digits: int = 3) -> str:
        row = agg[(agg.batch == b) & (agg.variant == v)].iloc[0]
        return pm(row[f"{m}_mean"], row[f"{m}_std"], digits)

    def ratio(kind: str, b: int) -> tuple[str, float, float]:
        r = ratios[kind].set_index("batch").loc[b]
        return pm(r.ratio_mean, r.ratio_std, 2, "x"), r.ratio_mean, r.ratio_std

    claims = []
    for b in batches:
        if b in PAPER:
            e, q, o = PAPER[b]
            row = agg[(agg.batch == b) & (agg.variant == "tangram")].iloc[0]
            claims.append(
                Claim(
                    f"coding ACT breakdown, batch {b}",
                    "exec / queue / overhead (s)",
                    f"{e} / {q} / {o}",
                    " / ".join(
                        cell(b, "tangram", m)
                        for m in ("exec_mean_s", "queue_mean_s", "overhead_mean_s")
                    ),
                    row.act_mean_s_mean,
                    row.act_mean_s_std,
                )
            )
    rb = batches[0]
    for kind, what in (("all", "mean ACT"), ("env", "env-action ACT"), ("reward", "reward ACT")):
        text, m, s = ratio(kind, rb)
        claims.append(
            Claim(
                f"coding {what} vs k8s-static, batch {rb}",
                f"{BASE} / tangram",
                f"{PAPER_RATIO[kind]}x",
                text,
                m,
                s,
            )
        )
    if len(batches) > 1:
        text, m, s = ratio("all", batches[-1])
        claims.append(
            Claim(
                f"coding mean ACT vs k8s-static, batch {batches[-1]}",
                f"{BASE} / tangram",
                "-",
                text,
                m,
                s,
            )
        )

    table = agg[["batch", "variant", "seeds"]].copy()
    for m, label in (
        ("act_mean_s", "mean ACT"),
        ("exec_mean_s", "exec"),
        ("queue_mean_s", "queue"),
        ("overhead_mean_s", "overhead"),
        ("act_p99_s", "p99 ACT"),
        ("env_act_mean_s", "env ACT"),
        ("reward_act_mean_s", "reward ACT"),
        ("env_units_mean", "env cores"),
        ("reward_units_mean", "reward cores"),
        ("step_mean_s", "step"),
    ):
        table[label] = [pm(r[f"{m}_mean"], r[f"{m}_std"], 3) for _, r in agg.iterrows()]
    last = agg[(agg.batch == batches[-1]) & (agg.variant == "tangram")].iloc[0]
    first = agg[(agg.batch == batches[0]) & (agg.variant == "tangram")].iloc[0]
    base_first = agg[(agg.batch == batches[0]) & (agg.variant == BASE)].iloc[0]
    util_last = last.busy_core_s_mean / last.provisioned_core_s_mean
    rep = Report(
        NAME,
        "Claim 1: AI-coding ACT and its breakdown (batch 1280 and 1536)",
        "Tangram's mean ACT in AI coding splits into execution / queueing / overhead of "
        "0.975 / 0.015 / 0.024 s at batch 1280 and 1.206 / 0.428 / 0.036 s at 1536; it is 4.3x "
        "lower than Kubernetes static provisioning (environment actions 9.0x, reward 2.8x).",
        command("coding_act.py"),
        setup=[
            f"Workload `coding` (default parameters, `docs/workloads.md`), one RL step, batches {batches}, "
            f"seeds {args.seeds}; the `paper` cluster (15 x 256 cores).",
            f"Policies: `tangram` (elastic: `{common.ELASTIC}`) and `k8s-static` (a pod of 4 cores per "
            "trajectory, requested when the trajectory opens and held until it ends; 960 pods "
            "fit, later trajectories wait, FCFS, for a pod to free).",
            "Default overheads: AOE grant+revoke 0.5 ms per action, container start 1 s (AOE: "
            "overlapped with the first generation; pods: paid when the pod gets its cores).",
            "Ratios are per seed (same trace under both policies), then mean ± std over seeds.",
        ],
        claims=claims,
        sections=[("All figures (mean ± std over seeds)", md_table(table))],
        differences=[
            "The breakdown at 1280 matches closely because the generator is calibrated on it: "
            "the coding workload's mean execution at the largest useful DoP is set to the paper's "
            "0.975 s (docs/workloads.md). It is a calibration, not an independent confirmation.",
            f"At 1536 the paper's queueing grows to 0.428 s; ours is {last.queue_mean_s_mean:.3f} s. Our 3,840 cores "
            f"are not saturated: busy core-seconds are {util_last:.0%} of provisioned at batch {batches[-1]}, "
            "so Tangram only trims DoP (fewer cores per action, slightly higher execution) "
            "instead of queueing. The paper's traces are burstier (phase-dependent arrivals) than "
            "our closed-loop generator, whose generation times are independent log-normals.",
            "The speedup over Kubernetes is far smaller than 4.3x. In our model a pod's actions "
            "run immediately inside the pod at up to 4 cores, so the baseline's ACT is "
            f"execution at 4 cores ({base_first.exec_mean_s_mean:.2f} s) plus queueing only for trajectories that wait for a pod "
            "(batch x 4 > 3,840 cores). The paper's Kubernetes baseline must have queued much "
            "more (its env-action speedup, 9.0x, is larger than its reward speedup, 2.8x, which "
            "DoP cannot explain: in our elasticity model rewards are the most parallel actions, "
            "so DoP alone favours them; queueing, which hits env actions, can). "
            "Pod size, pod startup and scheduling latency of real Kubernetes are not in the paper "
            "notes; `cpu_scaling.md` shows how the ratio moves with the pod size.",
            f"Overhead is {first.overhead_mean_s_mean:.3f} s vs the paper's 0.024 s at batch {batches[0]}: our AOE grant cost (0.5 ms, from the "
            "project's cgroup benchmark) is lower than the paper's measured overhead, and "
            "container start is hidden behind the first generation.",
        ],
        runtime_s=time.perf_counter() - t0,
        settings={"seeds": len(args.seeds), "workers": args.workers},
    )
    rep.write(args.out)
    print(f"{NAME}: wrote {args.out}/{NAME}.md ({rep.runtime_s:.0f} s)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
