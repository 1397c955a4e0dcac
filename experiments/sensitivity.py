"""How the headline ratios move with the modelling choices they rest on.

    python experiments/sensitivity.py [--seeds 3] [--workers 2] [--smoke]

The paper's claims against Kubernetes and SGLang depend on assumptions it does not publish:
how long a pod takes to start, the pod's shape and QoS, how parallel the agents' commands
are, how popular each teacher is, and where the RL loop synchronises. Each section varies one
of them with everything else at the faithful defaults, and reports the ratio baseline / tangram
of mean ACT per seed on the same trace (mean ± std over seeds):

1. ``pods``: coding, batches 256-1536: pod startup 0/5/10/30/60 s (4-core static pods) and pod
   shapes (static 1/2/4/8 cores, burstable with 2/4 requested) at the default 5 s startup.
2. ``serial``: coding batch 1280: the env actions' mean serial fraction 0.2/0.5/0.8.
3. ``bursts``: coding batch 1280: a batch-wide 20-s setup action, a batch-synchronous reward,
   both; against static and burstable pods and fixed DoP 4 (and the lower bound).
4. ``popularity``: MOPD batch 2048: equal shares, Zipf (exponent 1 and 2, largest or smallest
   teachers most popular): SGLang with 4 GPUs per teacher (36), SGLang sized by load on 36,
   tangram on 36 and on fewer GPUs, each with its offered load (busy / provisioned GPU-s).
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

NAME = "sensitivity"
POD_STARTS = (0.0, 5.0, 10.0, 30.0, 60.0)
#: env_serial_alpha, env_serial_beta -> mean serial fraction alpha / (alpha + beta).
SERIAL = {0.2: (1.0, 4.0), 0.5: (2.0, 2.0), 0.8: (4.0, 1.0)}
BURSTS = {
    "async (default)": (),
    "setup 20 s": (("setup_t1_mean_s", 20.0),),
    "sync reward": (("reward_sync", "step"),),
    "setup + sync reward": (("setup_t1_mean_s", 20.0), ("reward_sync", "step")),
}
POPULARITY = {
    "equal": (),
    "zipf 1, largest first": (("popularity", "zipf"),),
    "zipf 1, smallest first": (("popularity", "zipf"), ("zipf_order", "smallest-first")),
    "zipf 2, largest first": (("popularity", "zipf"), ("zipf_exponent", 2.0)),
}


def pod_variants() -> tuple[Variant, ...]:
    out = [Variant("tangram")]
    out += [
        Variant("k8s-static:4", label=f"k8s-static:4 start {s:g}s", overheads=(("pod_start_s", s),))
        for s in POD_STARTS
    ]
    out += [Variant(f"k8s-static:{k}") for k in (1, 2, 8)]
    out += [Variant(f"k8s-burstable:{r}") for r in (2, 4)]
    return tuple(out)


def ratio_table(runs: pd.DataFrame, keys: list[str], bases: list[str], ours: str = "tangram"):
    """base / ours mean ACT per seed, one row per base, one column per value of ``keys``."""
    frames = []
    for base in bases:
        r = paired_ratio(runs, keys, "act_mean_s", base, ours)
        r.insert(0, "baseline", base)
        frames.append(r)
    return pd.concat(frames, ignore_index=True)


def wide(ratios: pd.DataFrame, column: str) -> pd.DataFrame:
    """Baselines as rows, ``column``'s values as columns, cells 'mean ± std'."""
    # A missing ratio is a run that stalled (``SimulationStalled``): pods held at a barrier.
    cells = ratios.assign(
        cell=[
            pm(m, s, 2) + "x" if m == m else "stalled"
            for m, s in zip(ratios.ratio_mean, ratios.ratio_std, strict=True)
        ]
    )
    table = cells.pivot(index="baseline", columns=column, values="cell").fillna("stalled")
    table = table.reindex(list(dict.fromkeys(ratios.baseline)))
    table = table[list(dict.fromkeys(ratios[column]))]  # the order the sections list them
    table.columns = [f"{column} {c}" for c in table.columns]
    return table.reset_index()


def main(argv=None) -> int:
    args = parse_args(__doc__.splitlines()[0], argv)
    t0 = time.perf_counter()
    smoke = args.smoke
    batches = [32] if smoke else [256, 768, 1280, 1536]
    big = 32 if smoke else 1280
    mopd_batch = 32 if smoke else 2048
    jobs: list[Job] = []
    pods = pod_variants()
    for b in sorted(batches, reverse=True):
        for s in args.seeds:
            jobs.append(Job("coding", b, s, pods, tags=(("section", "pods"),)))
    sv = (Variant("tangram"), Variant("k8s-static:4"), Variant("k8s-burstable:4"))
    for mean, (a, bb) in SERIAL.items():
        for s in args.seeds:
            jobs.append(
                Job(
                    "coding",
                    big,
                    s,
                    sv,
                    overrides=(("env_serial_alpha", a), ("env_serial_beta", bb)),
                    tags=(("section", "serial"), ("serial_mean", mean)),
                )
            )
    bv = sv + (Variant("fixed:4"), Variant("lower-bound"))
    for label, overrides in BURSTS.items():
        for s in args.seeds:
            jobs.append(
                Job(
                    "coding",
                    big,
                    s,
                    bv,
                    overrides=overrides,
                    tags=(("section", "bursts"), ("structure", label)),
                )
            )
    gpu_counts = (36, 16, 10)
    mv = (
        Variant("sglang-static:4", gpus=36),
        Variant("sglang-sized", label="sglang-sized@36", gpus=36),
        *(Variant("tangram", label=f"tangram@{g}", gpus=g) for g in gpu_counts),
    )
    for label, overrides in POPULARITY.items():
        for s in args.seeds:
            jobs.append(
                Job(
                    "mopd",
                    mopd_batch,
                    s,
                    mv,
                    overrides=overrides,
                    tags=(("section", "popularity"), ("popularity", label)),
                )
            )
    runs = run_jobs(jobs, workers=args.workers, desc=NAME)
    runs["offered_load"] = runs["busy_gpu_s"] / runs["provisioned_gpu_s"]

    # ---- tables
    sec = {name: runs[runs.section == name] for name in ("pods", "serial", "bursts", "popularity")}
    pod_bases = [v.name for v in pods[1:]]
    pods_ratio = ratio_table(sec["pods"], ["batch"], pod_bases)
    serial_ratio = ratio_table(sec["serial"], ["serial_mean"], ["k8s-static:4", "k8s-burstable:4"])
    burst_ratio = ratio_table(
        sec["bursts"], ["structure"], ["k8s-static:4", "k8s-burstable:4", "fixed:4", "lower-bound"]
    )
    step_frames = []
    for base in ("k8s-static:4", "k8s-burstable:4", "fixed:4"):
        r = paired_ratio(sec["bursts"], ["structure"], "step_mean_s", base, "tangram")
        r.insert(0, "baseline", base)
        step_frames.append(r)
    burst_step = pd.concat(step_frames, ignore_index=True)
    pop = sec["popularity"]
    pop_ratio = ratio_table(
        pop, ["popularity"], ["sglang-static:4", "sglang-sized@36"], "tangram@36"
    )
    pop_agg = aggregate(pop, ["popularity", "variant"], ["act_mean_s", "offered_load", "gpus"])
    agg = aggregate(
        runs,
        ["section", "workload", "batch", "variant"],
        ["act_mean_s", "step_mean_s", "offered_load"],
    )
    write_tables(args.out, NAME, runs, agg)
    pd.concat(
        [
            pods_ratio.assign(section="pods"),
            serial_ratio.assign(section="serial"),
            burst_ratio.assign(section="bursts", metric="act_mean_s"),
            burst_step.assign(section="bursts", metric="step_mean_s"),
            pop_ratio.assign(section="popularity"),
        ],
        ignore_index=True,
    ).to_csv(args.out / f"{NAME}.ratios.csv", index=False, float_format="%.6g")

    # ---- figure
    fig, axes = plt.subplots(2, 2, figsize=(13, 9))
    ax = axes[0][0]
    for s in POD_STARTS:
        base = f"k8s-static:4 start {s:g}s"
        r = pods_ratio[pods_ratio.baseline == base].sort_values("batch")
        ax.errorbar(
            r.batch,
            r.ratio_mean,
            yerr=r.ratio_std.fillna(0),
            marker="o",
            capsize=3,
            label=f"pod start {s:g} s",
        )
    ax.axhline(1, color="k", lw=0.8)
    ax.set(xlabel="batch", ylabel="mean ACT, k8s-static:4 / tangram", title="Pod startup")
    ax.legend(fontsize=8)
    ax.grid(alpha=0.3)
    ax = axes[0][1]
    for base in [
        "k8s-static:1",
        "k8s-static:2",
        "k8s-static:4 start 5s",
        "k8s-static:8",
        "k8s-burstable:2",
        "k8s-burstable:4",
    ]:
        r = pods_ratio[pods_ratio.baseline == base].sort_values("batch")
        ax.errorbar(
            r.batch,
            r.ratio_mean,
            yerr=r.ratio_std.fillna(0),
            marker="o",
            capsize=3,
            label=base.replace(" start 5s", ""),
        )
    ax.axhline(1, color="k", lw=0.8)
    ax.set(
        xlabel="batch", ylabel="mean ACT, baseline / tangram", title="Pod shape and QoS (start 5 s)"
    )
    ax.legend(fontsize=8)
    ax.grid(alpha=0.3)
    ax = axes[1][0]
    labels = list(BURSTS)
    width = 0.2
    for i, base in enumerate(["k8s-static:4", "k8s-burstable:4", "fixed:4"]):
        r = burst_ratio[burst_ratio.baseline == base].set_index("structure").reindex(labels)
        ax.bar(
            [j + i * width for j in range(len(labels))],
            r.ratio_mean,
            width,
            yerr=r.ratio_std.fillna(0),
            label=base,
        )
    ax.set_xticks([j + width for j in range(len(labels))], labels, fontsize=8)
    ax.axhline(1, color="k", lw=0.8)
    ax.set(ylabel="mean ACT, baseline / tangram", title=f"RL loop structure (coding, batch {big})")
    ax.legend(fontsize=8)
    ax = axes[1][1]
    plabels = list(POPULARITY)
    for i, v in enumerate(mv):
        a = pop_agg[pop_agg.variant == v.name].set_index("popularity").reindex(plabels)
        ax.bar([j + i * 0.16 for j in range(len(plabels))], a.act_mean_s_mean, 0.16, label=v.name)
    ax.set_xticks([j + 0.32 for j in range(len(plabels))], plabels, fontsize=8)
    ax.set(ylabel="mean ACT (s)", title=f"MOPD teacher popularity (batch {mopd_batch})")
    ax.legend(fontsize=8)
    save_figure(fig, args.out, NAME)

    # ---- report
    def get(frame, base, key, value):
        r = frame[(frame.baseline == base) & (frame[key] == value)]
        return (
            (r.ratio_mean.iloc[0], r.ratio_std.iloc[0]) if len(r) else (float("nan"), float("nan"))
        )

    claims = []
    top = max(batches)
    for s in (0.0, 5.0, 60.0):
        m, sd = get(pods_ratio, f"k8s-static:4 start {s:g}s", "batch", top)
        claims.append(
            Claim(
                f"coding mean ACT vs 4-core pods starting in {s:g} s, batch {top}",
                "k8s / tangram",
                "4.3x (b1280), 27.7x (b1536)",
                pm(m, sd, 2) + "x",
                m,
                sd,
            )
        )
    m, sd = get(pods_ratio, "k8s-burstable:4", "batch", top)
    claims.append(
        Claim(
            f"coding mean ACT vs burstable pods (4 cores requested), batch {top}",
            "k8s / tangram",
            "-",
            pm(m, sd, 2) + "x",
            m,
            sd,
        )
    )
    for label in ("equal", "zipf 1, largest first"):
        m, sd = get(pop_ratio, "sglang-sized@36", "popularity", label)
        claims.append(
            Claim(
                f"MOPD mean ACT vs SGLang sized by load on 36 GPUs, popularity {label}",
                "sglang / tangram (both 36 GPUs)",
                "-",
                pm(m, sd, 2) + "x",
                m,
                sd,
            )
        )

    pop_rows = pop_agg.assign(
        act=[
            pm(m, s, 3)
            for m, s in zip(pop_agg.act_mean_s_mean, pop_agg.act_mean_s_std, strict=True)
        ],
        load=[f"{m:.1%}" for m in pop_agg.offered_load_mean],
    )[["popularity", "variant", "gpus_mean", "act", "load"]].rename(
        columns={
            "gpus_mean": "GPUs",
            "act": "mean ACT (s)",
            "load": "offered load (busy / provisioned GPU-s)",
        }
    )
    rep = Report(
        NAME,
        "Sensitivity: how the headline ratios move with the baselines' and workloads' assumptions",
        "(not a paper claim) The paper's ratios over Kubernetes (4.3x coding, 3.1-27.7x scaling) "
        "and SGLang (36 -> 10 GPUs) rest on pod startup, pod shape, elasticity, popularity and "
        "loop structure it does not publish; this experiment varies each.",
        command("sensitivity.py"),
        setup=[
            f"Seeds {args.seeds}; the `paper` cluster (15 x 256 cores, 5 x 8 GPUs), resized for the GPU "
            "variants. Ratio = baseline's mean ACT / tangram's on the same trace, per seed, mean ± std.",
            "Defaults: pod startup 5 s (the Kubernetes pod-startup SLO, p99), no image pull (pre-pulled), "
            "no warm pool; AOE container start 1 s at the trajectory's open.",
        ],
        claims=claims,
        sections=[
            ("Pod startup and pod shape (coding)", md_table(wide(pods_ratio, "batch"))),
            (
                f"Serial fraction of env actions (coding, batch {big})",
                md_table(wide(serial_ratio, "serial_mean")),
            ),
            (
                f"RL loop structure (coding, batch {big}): mean ACT",
                md_table(wide(burst_ratio, "structure")),
            ),
            ("RL loop structure: RL step time", md_table(wide(burst_step, "structure"))),
            (
                f"Teacher popularity (MOPD, batch {mopd_batch}): tangram@36 vs SGLang on 36",
                md_table(wide(pop_ratio, "popularity")),
            ),
            ("Teacher popularity: every variant with its offered load", md_table(pop_rows)),
        ],
        runtime_s=time.perf_counter() - t0,
        settings={"seeds": len(args.seeds), "smoke": smoke},
    )
    print(rep.write(args.out))
    return 0


if __name__ == "__main__":
    sys.exit(main())
