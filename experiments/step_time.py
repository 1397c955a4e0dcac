"""Claim 4: RL step duration, DeepSearch and AI coding, Tangram vs the static baselines.

Paper: the RL step is up to 1.5x faster (DeepSearch 1.5x, AI coding 1.4x).

    python experiments/step_time.py [--seeds 3] [--workers 2] [--smoke]

DeepSearch runs with ``search_median_s=1.0`` (a plain search API) as the main setting and the
generator's default (6 s median, from interactive-agent traces) as a sensitivity check: at the
default, ~26,600 calls of ~19 s mean saturate the 512-call quota of the ``paper`` cluster's
search endpoint, and both policies queue identically (FIFO) for it.
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

NAME = "step_time"
PAPER = {"deepsearch": 1.5, "coding": 1.4}
SEARCH_MEDIAN_S = 1.0  # main DeepSearch setting (see the module docstring)
METRICS = [
    "step_mean_s",
    "rollout_mean_s",
    "traj_mean_s",
    "act_mean_s",
    "queue_mean_s",
    "exec_mean_s",
    "search_act_mean_s",
    "search_queue_mean_s",
    "judge_act_mean_s",
    "judge_queue_mean_s",
    "judge_units_mean",
    "env_act_mean_s",
    "reward_act_mean_s",
]


def main(argv=None) -> int:
    args = parse_args(__doc__.splitlines()[0], argv)
    t0 = time.perf_counter()
    ds_batch = 32 if args.smoke else 2048
    coding_batches = [32] if args.smoke else [1280, 1536]
    ds_variants = (Variant("tangram"), Variant("sglang-static"))
    cd_variants = (Variant("tangram", timeline=False), Variant("k8s-static", timeline=False))
    jobs = []
    for s in args.seeds:
        for b in coding_batches:
            jobs.append(Job("coding", b, s, cd_variants, tags=(("setting", f"coding b{b}"),)))
        jobs.append(
            Job(
                "deepsearch",
                ds_batch,
                s,
                ds_variants,
                overrides=(("search_median_s", SEARCH_MEDIAN_S),),
                tags=(("setting", f"deepsearch search {SEARCH_MEDIAN_S:g}s"),),
            )
        )
        jobs.append(
            Job(
                "deepsearch",
                ds_batch,
                s,
                ds_variants,
                tags=(("setting", "deepsearch search 6s (default)"),),
            )
        )
    runs = run_jobs(jobs, workers=args.workers, desc=NAME)
    runs["baseline"] = runs.variant != "tangram"
    settings = list(dict.fromkeys(runs.sort_values(["workload", "batch"]).setting))
    agg = aggregate(runs, ["setting", "workload", "batch", "variant"], METRICS)
    ratio_frames = []
    for setting in settings:
        sub = runs[runs.setting == setting]
        base = sub[sub.baseline].variant.iloc[0]
        for metric in ("step_mean_s", "traj_mean_s", "act_mean_s"):
            r = paired_ratio(sub, ["setting"], metric, base, "tangram")
            r.insert(1, "baseline", base)
            r.insert(2, "metric", metric)
            ratio_frames.append(r)
    ratios = pd.concat(ratio_frames, ignore_index=True)
    write_tables(args.out, NAME, runs, agg)
    ratios.to_csv(args.out / f"{NAME}.ratios.csv", index=False, float_format="%.6g")

    def ratio(setting: str, metric: str = "step_mean_s") -> tuple[float, float]:
        r = ratios[(ratios.setting == setting) & (ratios.metric == metric)].iloc[0]
        return r.ratio_mean, r.ratio_std

    # ---- figure
    fig, axes = plt.subplots(1, 2, figsize=(13, 4.6))
    ax = axes[0]
    x = np.arange(len(settings))
    for j, who in enumerate(("tangram", "baseline")):
        means, stds = [], []
        for setting in settings:
            a = agg[agg.setting == setting]
            a = a[a.variant == "tangram"] if who == "tangram" else a[a.variant != "tangram"]
            means.append(a.step_mean_s_mean.iloc[0])
            stds.append(a.step_mean_s_std.iloc[0])
        ax.bar(
            x + (j - 0.5) * 0.38,
            means,
            0.38,
            yerr=np.nan_to_num(stds),
            capsize=3,
            label="tangram"
            if who == "tangram"
            else "k8s-static (coding) / sglang-static (DeepSearch)",
        )
    ax.set_xticks(x, [s.replace(" (default)", "\n(default)") for s in settings], fontsize=8)
    ax.set_ylabel("RL step (rollout) duration, s")
    ax.set_title("step duration (mean ± std over seeds)")
    ax.legend(fontsize=8)
    ax = axes[1]
    width = 0.27
    for j, (metric, label) in enumerate(
        (("step_mean_s", "step"), ("traj_mean_s", "mean trajectory"), ("act_mean_s", "mean ACT"))
    ):
        vals = [ratio(s, metric) for s in settings]
        ax.bar(
            x + (j - 1) * width,
            [v[0] for v in vals],
            width,
            yerr=[np.nan_to_num(v[1]) for v in vals],
            capsize=3,
            label=f"ours: {label}",
        )
    for i, s in enumerate(settings):
        wl = s.split()[0]
        ax.plot(
            [i - 1.5 * width, i + 1.5 * width],
            [PAPER[wl]] * 2,
            "k--",
            lw=1.5,
            label="paper: step" if i == 0 else None,
        )
    ax.axhline(1, color="k", lw=0.5)
    ax.set_xticks(x, [s.replace(" (default)", "\n(default)") for s in settings], fontsize=8)
    ax.set_ylabel("baseline / tangram")
    ax.set_title("speedup (per seed, then mean ± std)")
    ax.legend(fontsize=8)
    save_figure(fig, args.out, NAME)

    # ---- report
    main_ds = f"deepsearch search {SEARCH_MEDIAN_S:g}s"
    claims = []
    for setting, wl in ((main_ds, "deepsearch"), (f"coding b{coding_batches[0]}", "coding")):
        m, s = ratio(setting)
        claims.append(
            Claim(
                f"RL step speedup, {setting}",
                "baseline / tangram step time",
                f"{PAPER[wl]}x",
                pm(m, s, 2, "x"),
                m,
                s,
            )
        )
    for setting in (main_ds, f"coding b{coding_batches[0]}"):
        m, s = ratio(setting, "traj_mean_s")
        claims.append(
            Claim(
                f"mean trajectory duration speedup, {setting}",
                "baseline / tangram",
                "-",
                pm(m, s, 2, "x"),
                m,
                s,
            )
        )
    for setting in settings:
        if setting in (main_ds, f"coding b{coding_batches[0]}"):
            continue
        m, s = ratio(setting)
        wl = setting.split()[0]
        claims.append(
            Claim(
                f"RL step speedup, {setting}",
                "baseline / tangram step time",
                f"{PAPER[wl]}x",
                pm(m, s, 2, "x"),
                m,
                s,
            )
        )
    table = []
    for setting in settings:
        a = agg[agg.setting == setting]
        t = a[a.variant == "tangram"].iloc[0]
        b = a[a.variant != "tangram"].iloc[0]
        rec = {"setting": setting, "baseline": b.variant}
        rec["tangram step (s)"] = pm(t.step_mean_s_mean, t.step_mean_s_std, 1)
        rec["baseline step (s)"] = pm(b.step_mean_s_mean, b.step_mean_s_std, 1)
        for metric, label in (
            ("step_mean_s", "step"),
            ("traj_mean_s", "mean traj."),
            ("act_mean_s", "mean ACT"),
        ):
            rec[f"{label} speedup"] = pm(*ratio(setting, metric), 2, "x")
        table.append(rec)
    kinds = agg[["setting", "variant"]].copy()
    for m, label in (
        ("search_act_mean_s", "search ACT"),
        ("search_queue_mean_s", "search queue"),
        ("judge_act_mean_s", "judge ACT"),
        ("judge_queue_mean_s", "judge queue"),
        ("judge_units_mean", "judge GPUs"),
        ("env_act_mean_s", "env ACT"),
        ("reward_act_mean_s", "reward ACT"),
    ):
        kinds[label] = [pm(r[f"{m}_mean"], r[f"{m}_std"], 3) for _, r in agg.iterrows()]
    dsm = agg[(agg.setting == main_ds) & (agg.variant != "tangram")].iloc[0]
    dsd = agg[(agg.setting == "deepsearch search 6s (default)") & (agg.variant == "tangram")].iloc[
        0
    ]
    rep = Report(
        NAME,
        "Claim 4: RL step duration (DeepSearch and AI coding)",
        "Action-level scheduling makes the RL step up to 1.5x faster: DeepSearch 1.5x, AI coding 1.4x.",
        command("step_time.py"),
        setup=[
            f"DeepSearch batch {ds_batch} (searches on the `search` API, 512 concurrent calls and 400/s; "
            "an LLM judge on GPU) under `tangram` and `sglang-static` (4 dedicated GPUs for the judge; "
            "the search API is FIFO under both). Coding batches "
            f"{coding_batches} under `tangram` and `k8s-static` (4-core pods). Seeds {args.seeds}, one RL step each.",
            f"DeepSearch search latency: `search_median_s={SEARCH_MEDIAN_S:g}` (log-normal, sigma 1.6, "
            "so mean ~3.6 s) is the main setting. Why: the generator's default median of 6 s comes "
            "from interactive web-agent traces (TraceLab 'web / lookup', mean ~19 s with its tail); "
            "with it a batch of 2048 makes ~26,600 calls, ~510,000 call-seconds, against 512 "
            "concurrent slots: the quota binds for the whole step, every search queues "
            f"({dsd.search_queue_mean_s_mean:.1f} s on average) and the step is decided by the API, "
            "identically under any scheduler. An RL setup calls a fast search backend "
            "(a retrieval server or a search API answering in ~1 s), so 1 s is the representative "
            "setting; the default is kept as a second row.",
            "Step = rollout duration (training time `train_s` = 0: a fixed training phase would "
            "add the same seconds to both and shrink every ratio). Mean trajectory duration and mean ACT "
            "ratios are shown too.",
        ],
        claims=claims,
        sections=[
            ("Step, trajectory and ACT speedups (mean ± std over seeds)", md_table(table)),
            ("Per-kind figures (mean ± std)", md_table(kinds)),
        ],
        differences=[
            "Our step speedups are much smaller than the paper's. The step ends with its longest "
            "trajectory, and in our closed-loop generator the longest trajectory is mostly LLM "
            "generation (47% busy share for coding, by construction; DeepSearch trajectories "
            "are long chains of searches whose latency no scheduler changes). By the time it "
            "ends, the pool is nearly idle under both policies, so its actions run at full speed "
            "either way: the baseline's queueing hits the middle of the step, not its tail "
            "(coding batch 1280, seed 0: in the step's second half Tangram has ~100 cores busy on "
            "average and the pods ~44, out of 3,840; see the notebook's utilisation plot).",
            f"DeepSearch: Tangram gives the judge more GPUs (DoP up to 4) and avoids the "
            f"baseline's judge queue ({dsm.judge_queue_mean_s_mean:.1f} s on 4 dedicated GPUs), "
            "which shows in mean ACT and trajectory time, but the judge is one action per "
            "trajectory at its very end; searches (the bulk of the step) are the same API calls "
            "under both policies.",
            "The paper's VeRL asynchronous rollout, straggler effects and real generation "
            "times (with bursts across trajectories) are not modelled; the mean-trajectory "
            "speedup column is closer to what an asynchronous rollout (no barrier at the step's "
            "end) would gain.",
        ],
        runtime_s=time.perf_counter() - t0,
        settings={"seeds": len(args.seeds), "workers": args.workers},
    )
    rep.write(args.out)
    print(f"{NAME}: wrote {args.out}/{NAME}.md ({rep.runtime_s:.0f} s)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
