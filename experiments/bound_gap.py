"""Issue 11's check: mean ACT of `tangram-paper` and `tangram` over the bounds, bundled workloads.

On each bundled workload at the paper's batch on the `paper` cluster, the mean ACT of the
paper's policy and of the default over `lower-bound` (every action at its fastest option on
arrival, capacity ignored; target for the default: at most 1.15x) and over the capacity-aware
fluid bound (`tangram.sim.bounds.capacity_bound`), per seed then mean ± std.

    python experiments/bound_gap.py [--seeds 3] [--workers 2] [--smoke]

One run of it is what `tangram sim --workload W --batch B --cluster paper --policy tangram
--policy tangram-paper --policy lower-bound --seed S --json` prints, for each W, B and S.
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
    cluster_for,
    md_table,
    parse_args,
    pm,
    run_jobs,
    save_figure,
    write_tables,
)

NAME = "bound_gap"
POLICIES = ("tangram-paper", "tangram")  # named: not the `tangram` stand-in of the other scripts
#: The default without the trainer's word that a step's calls are all in (the assumption the
#: default's MOPD figure rests on, varied: ``RolloutConfig.announce_step_end``).
UNANNOUNCED = "tangram-unannounced"
VARIANTS = (*POLICIES, UNANNOUNCED)
FLOOR = "lower-bound"
TARGET = 1.15
#: workload -> the paper's batch (each workload's default; docs/workloads.md)
WORKLOADS = {"coding": 1280, "mopd": 2048, "deepsearch": 2048}


def capacity_rows(jobs: list[Job]) -> pd.DataFrame:
    """The capacity-aware bound of each job's trace on the `paper` cluster."""
    from tangram.sim.bounds import capacity_bound
    from tangram.sim.workloads import generate

    rows = []
    for job in jobs:
        trace = generate(job.workload, batch=job.batch, steps=job.steps, seed=job.seed)
        b = capacity_bound(trace, cluster_for(Variant(FLOOR)))
        rows.append(
            {
                "workload": job.workload,
                "batch": job.batch,
                "seed": job.seed,
                "capacity_act_mean_s": b.act_mean_s,
                "capacity_step_mean_s": b.step_mean_s,
            }
        )
    return pd.DataFrame(rows)


def main(argv=None) -> int:
    args = parse_args(__doc__.splitlines()[0], argv)
    import common

    common.ELASTIC = "tangram"  # the variants name their policy; `tangram` is the default here
    t0 = time.perf_counter()
    workloads = {w: 32 for w in WORKLOADS} if args.smoke else WORKLOADS
    variants = (
        *(Variant(p, timeline=False) for p in (*POLICIES, FLOOR)),
        Variant(
            "tangram", label=UNANNOUNCED, timeline=False, rollout=(("announce_step_end", False),)
        ),
    )
    jobs = [Job(w, b, s, variants) for w, b in workloads.items() for s in args.seeds]
    runs = run_jobs(jobs, workers=args.workers, desc=NAME)
    bounds = capacity_rows(jobs)
    keys = ["workload", "batch", "seed"]
    wide = runs.pivot_table(index=keys, columns="variant", values=["act_mean_s", "step_mean_s"])
    ratios = []
    for (w, b, s), row in wide.iterrows():
        cap = bounds.set_index(keys).loc[(w, b, s)]
        for p in VARIANTS:
            ratios.append(
                {
                    "workload": w,
                    "batch": b,
                    "seed": s,
                    "policy": p,
                    "act_mean_s": row[("act_mean_s", p)],
                    "lower_bound_act_mean_s": row[("act_mean_s", FLOOR)],
                    "capacity_act_mean_s": cap.capacity_act_mean_s,
                    "over_lower_bound": row[("act_mean_s", p)] / row[("act_mean_s", FLOOR)],
                    "over_capacity_bound": row[("act_mean_s", p)] / cap.capacity_act_mean_s,
                    "step_over_lower_bound": row[("step_mean_s", p)] / row[("step_mean_s", FLOOR)],
                }
            )
    ratios = pd.DataFrame(ratios)
    cols = ["over_lower_bound", "over_capacity_bound", "step_over_lower_bound", "act_mean_s"]
    agg = ratios.groupby(["workload", "batch", "policy"], sort=False)[cols].agg(["mean", "std"])
    agg.columns = [f"{m}_{stat}" for m, stat in agg.columns]
    agg = agg.reset_index()
    write_tables(args.out, NAME, runs, agg)
    ratios.to_csv(args.out / f"{NAME}.ratios.csv", index=False, float_format="%.6g")

    def cell(w: str, p: str, m: str = "over_lower_bound") -> tuple[str, float, float]:
        r = agg[(agg.workload == w) & (agg.policy == p)].iloc[0]
        return pm(r[f"{m}_mean"], r[f"{m}_std"], 2, "x"), r[f"{m}_mean"], r[f"{m}_std"]

    # ---- figure: the ratio over each bound, both policies side by side
    fig, axes = plt.subplots(1, 2, figsize=(12, 4.2))
    x = np.arange(len(workloads))
    for ax, (metric, title) in zip(
        axes,
        (
            ("over_lower_bound", f"mean ACT / {FLOOR} (capacity ignored)"),
            ("over_capacity_bound", "mean ACT / capacity-aware bound"),
        ),
        strict=True,
    ):
        for j, p in enumerate(VARIANTS):
            vals = [cell(w, p, metric) for w in workloads]
            ax.bar(
                x + (j - 1) * 0.27,
                [v[1] for v in vals],
                0.27,
                yerr=[np.nan_to_num(v[2]) for v in vals],
                capsize=3,
                label=p,
            )
        if metric == "over_lower_bound":
            ax.axhline(TARGET, color="k", ls="--", lw=1, label=f"target {TARGET}x (issue 11)")
        ax.axhline(1, color="k", lw=0.5)
        ax.set_xticks(x, [f"{w} b{b}" for w, b in workloads.items()])
        ax.set_title(title)
        ax.legend(fontsize=8)
    save_figure(fig, args.out, NAME)

    claims = []
    for w, b in workloads.items():
        for metric, what in (
            ("over_lower_bound", FLOOR),
            ("over_capacity_bound", "capacity-aware bound"),
        ):
            paper, m, s = cell(w, "tangram-paper", metric)
            default, default_mean, _ = cell(w, "tangram", metric)
            claims.append(
                Claim(
                    f"{w} b{b} mean ACT over {what}, paper cluster",
                    f"policy / {what}",
                    f"default <= {TARGET}x (issue 11)" if metric == "over_lower_bound" else "-",
                    paper,
                    m,
                    s,
                    default=default,
                    default_mean=default_mean,
                )
            )
    table = ratios.groupby(["workload", "batch", "policy"], sort=False).agg(
        act_mean_s=("act_mean_s", "mean"),
        lower_bound_s=("lower_bound_act_mean_s", "mean"),
        capacity_bound_s=("capacity_act_mean_s", "mean"),
    )
    table = table.reset_index()
    for metric, label in (
        ("over_lower_bound", f"/ {FLOOR}"),
        ("over_capacity_bound", "/ capacity bound"),
        ("step_over_lower_bound", f"step / {FLOOR}"),
    ):
        table[label] = [cell(r.workload, r.policy, metric)[0] for r in table.itertuples()]
    rep = Report(
        NAME,
        "Issue 11: distance of `tangram-paper` and `tangram` to the bounds (bundled workloads)",
        "Not a paper claim: issue 11 asks the default policy's mean ACT to be at most "
        f"{TARGET}x `lower-bound`'s on the bundled workloads at the paper's batches on the "
        "`paper` cluster (before the robust policy: 1.10 coding, 1.33 MOPD).",
        "python experiments/bound_gap.py",  # not command(): `--policy` means nothing here
        setup=[
            f"Workloads {dict(workloads)} (default parameters, the paper's batches), one RL step, "
            f"seeds {args.seeds}, the `paper` cluster (15 x 256 cores, 40 GPUs, a search API).",
            f"Policies `tangram-paper` (the paper's), `tangram` (the default) and `{FLOOR}` "
            "(every action at its fastest option on arrival, capacity ignored). The default "
            "is told when each step's last action is submitted (`RolloutConfig."
            "announce_step_end`, as a trainer says `POST /v1/submissions`); "
            f"`{UNANNOUNCED}` is the default never told (the assumption varied). The "
            "capacity-aware bound is `tangram.sim.bounds.capacity_bound` on the same trace "
            "(fluid relaxation, docs/metrics.md).",
            "Ratios per seed on the same trace, then mean ± std over seeds.",
        ],
        claims=claims,
        sections=[("All figures (mean over seeds; ratios mean ± std)", md_table(table))],
        differences=[
            "DeepSearch at its default search latency (6 s median) is bound by the search "
            "API's 512 concurrent calls, which `lower-bound` ignores: its gap measures the "
            "quota, not the scheduler (step_time.md).",
        ],
        runtime_s=time.perf_counter() - t0,
        settings={"seeds": len(args.seeds), "workers": args.workers},
        elastic_note=False,
    )
    rep.write(args.out)
    print(f"{NAME}: wrote {args.out}/{NAME}.md ({rep.runtime_s:.0f} s)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
