"""Issue 11's check: how often a static baseline beats `tangram-paper` and `tangram`, random instances.

Each seed set is one run of `tangram bench robustness --seed S` per policy (S = 0, 1000, 2000, ...:
200 random instances per family, CPU, GPU and mixed; every baseline replayed on each), once
with the paper's policy as the one compared and once with the default. Per instance, a
baseline "beats" the policy by the best baseline's margin on that figure (mean ACT, p99 ACT,
step time); the shares beaten by more than 5% and 20% are the issue's targets (at most 5% of
instances and none, on mean ACT and on step). Writes per-instance margins, per-seed-set
shares, the claims table and a figure of the margins' distributions.

    python experiments/robustness.py [--seeds N] [--workers 2] [--smoke]

`--seeds N` runs the seed sets 0, 1000, ..., (N - 1) x 1000 (default 3, as every script's
seeds; the record uses 4, which `run_all.py` passes: 2000 and 3000 were held out from the
choice of the default's CPU rule).
"""

from __future__ import annotations

import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

import matplotlib.pyplot as plt  # noqa: E402
import numpy as np  # noqa: E402
import pandas as pd  # noqa: E402
from common import Claim, Report, md_table, parse_args, pm, save_figure  # noqa: E402

NAME = "robustness"
POLICIES = ("tangram-paper", "tangram")
#: A seed set's first seed: seed-set index x this (the benchmark's instances S, S+1, ...).
SEED_STRIDE = 1000
SMOKE_INSTANCES = 4
#: figure key -> label, as `tangram bench robustness` reports them.
FIGURES = {"act_mean_s": "mean ACT", "step_s": "step", "act_p99_s": "p99 ACT"}
#: The issue's targets per figure it sets one for: (share beaten > 5%, share beaten > 20%).
TARGETS = {"act_mean_s": (0.05, 0.0), "step_s": (0.05, 0.0)}
#: The families the start-state variant replays (the start state is the GPUs').
PLAN_FAMILIES = ("gpu", "mixed")


def instance_rows(doc: dict, policy: str, seed_set: int) -> list[dict]:
    """One row per instance of one benchmark document: the best baseline's margin per figure,
    and whether one baseline beats the policy by > 5% on both mean ACT and step."""
    from tangram.bench.robustness import MARGINS, dominated

    rows = []
    for r in doc["instances"]:
        row = {
            "policy": policy,
            "seed_set": seed_set,
            "family": r["family"],
            "seed": r["seed"],
            "actions": r["actions"],
            "trajectories": r["trajectories"],
            "cores": r["cluster"]["cores"],
            "gpus": r["cluster"]["gpus"],
            "synced": r["synced"],
            "default_rejected": r["default_rejected"],
        }
        for key in FIGURES:
            row[f"margin_{key}"] = r["best"][key]["margin"]
            row[f"best_{key}"] = r["best"][key]["policy"]
        row["dominated"] = not r["default_rejected"] and dominated(r, doc["baselines"], MARGINS[0])
        row.update({k: r["ratios"][k] for k in ("act_over_lower_bound", "act_over_capacity_bound")})
        rows.append(row)
    return rows


def share_rows(doc: dict, policy: str, seed_set: int) -> list[dict]:
    """Per family of one benchmark document: the shares beaten by > 5% and > 20% per figure
    and dominated by > 5%, as the benchmark's family summary counts them."""
    rows = []
    for family, summary in doc["families"].items():
        row = {"policy": policy, "seed_set": seed_set, "family": family}
        row["instances"] = summary["compared"]
        for key in FIGURES:
            for label, share in summary["beaten"][key].items():
                row[f"{key}_over{label.strip('>%')}"] = share
        row["dominated_over5"] = summary["dominated"][">5%"]
        row["act_over_capacity_p50"] = summary["ratios"]["act_over_capacity_bound"]["p50"]
        rows.append(row)
    return rows


def in_place_rows(doc: dict, seed_set: int) -> list[dict]:
    """Per family and baseline of one benchmark document: the shares by which the other
    baselines beat that baseline, were it in the default's place (`baselines_in_place`)."""
    rows = []
    for family, summary in doc["families"].items():
        for baseline, v in summary["baselines_in_place"].items():
            row = {"seed_set": seed_set, "family": family, "baseline": baseline}
            row["instances"] = v["compared"]
            for key in TARGETS:
                for label, share in v["beaten"][key].items():
                    row[f"{key}_over{label.strip('>%')}"] = share
            rows.append(row)
    return rows


def in_place_table(in_place: pd.DataFrame, shares: pd.DataFrame) -> pd.DataFrame:
    """Per family and figure (mean over seed sets): the default's share beaten by > 5%, the
    most robust baseline's in its place, and how many baselines would meet the 5% target."""
    out = []
    means = in_place.groupby(["family", "baseline"], sort=False).mean(numeric_only=True)
    for family in dict.fromkeys(in_place.family):
        per = means.loc[family]
        for key in TARGETS:
            column = f"{key}_over5"
            col = per[column].dropna()
            top = col.idxmin()
            own = shares[(shares.policy == "tangram") & (shares.family == family)][column]
            out.append(
                {
                    "family": family,
                    "figure": FIGURES[key],
                    "tangram beaten > 5%": f"{100 * own.mean():.1f}%",
                    "most robust baseline": f"`{top}`",
                    "its share beaten > 5%": f"{100 * col[top]:.1f}%",
                    "its share beaten > 20%": f"{100 * per.loc[top, f'{key}_over20']:.1f}%",
                    "baselines meeting <= 5%": int((col <= 0.05).sum()),
                }
            )
    return pd.DataFrame(out)


def _margin_curve(ax: plt.Axes, margins: pd.Series, label: str, **style: str) -> None:
    """The share of instances (y) whose margin is at least x %, labelled with the share > 5%."""
    m = np.sort(margins.to_numpy() * 100)
    if m.size:
        share = np.arange(m.size, 0, -1) / m.size
        over5 = 100 * float((m > 5).mean())
        ax.step(m, share, where="post", label=f"{label} ({over5:.1f}% beaten > 5%)", **style)


def figure(instances: pd.DataFrame, out: Path, planned: pd.DataFrame | None = None) -> Path:
    """Per family, the margin's distribution (the best baseline's gain over the policy; right of
    0: a baseline is better) for mean ACT and step, both policies, the targets' lines; dashed,
    the default from the sized replicas' start (``planned``, the families with GPUs)."""
    families = list(dict.fromkeys(instances.family))
    fig, axes = plt.subplots(2, len(families), figsize=(4.6 * len(families), 7.2), squeeze=False)
    for col, family in enumerate(families):
        for row, key in enumerate(("act_mean_s", "step_s")):
            ax = axes[row][col]
            for i, policy in enumerate(POLICIES):
                sel = instances[
                    (instances.family == family) & (instances.policy == policy)
                    & ~instances.default_rejected
                ]  # fmt: skip
                _margin_curve(ax, sel[f"margin_{key}"], policy, color=f"C{i}")
            if planned is not None and family in set(planned.family):
                sel = planned[(planned.family == family) & ~planned.default_rejected]
                _margin_curve(ax, sel[f"margin_{key}"], "tangram, sized start", color="C1", ls="--")
            for x, style in ((5, "--"), (20, ":")):
                ax.axvline(x, color="k", ls=style, lw=1)
            ax.axhline(0.05, color="grey", lw=0.8)
            ax.set_xscale("symlog", linthresh=10)
            ax.set_yscale("log")
            ax.set_ylim(1 / 1000, 1.05)
            ax.set_xlabel(f"best baseline's gain on {FIGURES[key]} (%)")
            ax.set_ylabel("share of instances with at least this gain")
            ax.set_title(f"{family}: {FIGURES[key]}")
            ax.grid(alpha=0.3)
            ax.legend(fontsize=7, loc="lower left")
    return save_figure(fig, out, NAME)


def online_limit_section() -> str:
    """``tangram bench online-limit`` from both starts: per figure, the least ratio by which any
    online policy is beaten on one of two instances that are alike until they diverge."""
    from tangram.bench import online_limit

    rows = []
    for warm, label in ((True, "each service once"), ("plan", "sglang-sized's replicas")):
        doc = online_limit.run_bench(warm=warm)
        for name, pair in doc["pairs"].items():
            for start in pair["starts"]:
                rows.append(
                    {
                        "figure": name,
                        "GPUs start with": label,
                        "the long call starts": start["start"],
                        "beaten on one twin by at least": f"{start['ratio']:.3f}x ({start['on']})",
                    }
                )
            rows.append(
                {
                    "figure": name,
                    "GPUs start with": label,
                    "the long call starts": "as `tangram` starts it",
                    "beaten on one twin by at least": " / ".join(
                        f"{r:.3f}x ({t})" for t, r in pair["default_ratio"].items()
                    ),
                }
            )
    return (
        'Issue 11\'s "by more than 20% on none" is out of reach of any policy that sees only '
        "the past, on mean ACT and on step (`tangram bench online-limit`, "
        "`tangram.bench.online_limit`, docs/core.md). Per figure, two GPU instances are the "
        "same until they diverge (arrivals, declared demand, cluster, warm copies); a 100-s "
        "call that may take 4 GPUs arrives at 0. Mean ACT: fifteen 1-s one-GPU calls follow, "
        "in `alone` after it, in `crowd` at 20 s. Step: two 25.5-s calls at 16 s, and a 25.5-s "
        "call after the long one (`after_long`) or after a crowd call (`after_crowd`). Per "
        "start of the long call, a lower bound on the figure in each twin over that twin's "
        "best baseline; the least over the starts is what every online policy is beaten by on "
        "one of them, so the >20% shares above count how often the family draws such "
        "instances.\n\n" + md_table(pd.DataFrame(rows))
    )


def main(argv=None) -> int:
    args = parse_args(__doc__.splitlines()[0], argv)
    from tangram.bench.robustness import DEFAULT_INSTANCES, run_bench

    t0 = time.perf_counter()
    instances_per_family = SMOKE_INSTANCES if args.smoke else DEFAULT_INSTANCES
    seed_sets = [s * SEED_STRIDE for s in args.seeds]
    rows, share_list, in_place_list = [], [], []
    from tqdm import tqdm

    with tqdm(total=(len(POLICIES) + 1) * len(seed_sets), desc=NAME, unit="run") as bar:
        for seed_set in seed_sets:
            for policy in POLICIES:
                doc = run_bench(
                    instances=instances_per_family,
                    seed=seed_set,
                    default_policy=policy,
                    jobs=args.workers,
                )
                rows += instance_rows(doc, policy, seed_set)
                if policy == "tangram":
                    in_place_list += in_place_rows(doc, seed_set)
                share_list += share_rows(doc, policy, seed_set)
                bar.update()
        # The start state varied (the default only; the families with GPUs): every policy's
        # GPUs hold sglang-sized's replicas at the start, the head start only it had.
        plan_list, plan_rows = [], []
        for seed_set in seed_sets:
            doc = run_bench(
                instances=instances_per_family,
                seed=seed_set,
                families=PLAN_FAMILIES,
                default_policy="tangram",
                jobs=args.workers,
                warm_gpus="plan",
            )
            plan_list += share_rows(doc, "tangram", seed_set)
            plan_rows += instance_rows(doc, "tangram", seed_set)
            bar.update()
    instances = pd.DataFrame(rows)
    shares = pd.DataFrame(share_list)
    plan_shares = pd.DataFrame(plan_list)
    args.out.mkdir(parents=True, exist_ok=True)
    instances.to_csv(args.out / f"{NAME}_instances.csv", index=False, float_format="%.6g")
    shares.to_csv(args.out / f"{NAME}_runs.csv", index=False, float_format="%.6g")
    plan_shares.to_csv(args.out / f"{NAME}_plan_start.csv", index=False, float_format="%.6g")
    columns = [c for c in shares.columns if c not in ("policy", "seed_set", "family")]
    agg = shares.groupby(["policy", "family"], sort=False)[columns].agg(["mean", "std"])
    agg.columns = [f"{c}_{stat}" for c, stat in agg.columns]
    agg.reset_index().to_csv(args.out / f"{NAME}.csv", index=False, float_format="%.6g")
    in_place = pd.DataFrame(in_place_list)
    in_place.to_csv(args.out / f"{NAME}_in_place.csv", index=False, float_format="%.6g")
    planned = pd.DataFrame(plan_rows)
    planned.to_csv(args.out / f"{NAME}_plan_start_instances.csv", index=False, float_format="%.6g")
    figure(instances, args.out, planned)
    limit = online_limit_section()

    def cell(policy: str, family: str, column: str) -> tuple[str, float, float]:
        v = 100 * shares[(shares.policy == policy) & (shares.family == family)][column]
        std = float(v.std()) if len(v) > 1 else float("nan")
        return pm(float(v.mean()), std, 1, "%"), float(v.mean()), std

    claims = []
    for family in dict.fromkeys(shares.family):
        for key, (t5, t20) in TARGETS.items():
            for column, target in (
                (f"{key}_over5", f"<= {t5:.0%}"),
                (f"{key}_over20", f"{t20:.0%}"),
            ):
                paper, m, s = cell("tangram-paper", family, column)
                default, default_mean, _ = cell("tangram", family, column)
                margin = column.rsplit("over", 1)[1]
                claims.append(
                    Claim(
                        f"{family} instances: a baseline beats the policy's {FIGURES[key]} by > {margin}%",
                        "share of instances",
                        f"default {target} (issue 11)",
                        paper,
                        m,
                        s,
                        default=default,
                        default_mean=default_mean,
                    )
                )

    def percent_table(frame: pd.DataFrame) -> pd.DataFrame:
        table = frame.copy()
        for key in FIGURES:
            for m in ("5", "20"):
                table[f"{FIGURES[key]} > {m}%"] = [
                    f"{100 * v:.1f}%" for v in table[f"{key}_over{m}"]
                ]
        table["dominated > 5%"] = [f"{100 * v:.1f}%" for v in table.dominated_over5]
        return table[
            ["policy", "seed_set", "family", "instances",
             *(f"{FIGURES[k]} > {m}%" for k in FIGURES for m in ("5", "20")), "dominated > 5%",
             "act_over_capacity_p50"]
        ]  # fmt: skip

    table = percent_table(shares)
    rep = Report(
        NAME,
        "Issue 11: how often a static baseline beats the policy on random instances",
        "Not a paper claim: issue 11 asks that a baseline beat the default by more than 5% on "
        "at most 5% of instances and by more than 20% on none, on mean ACT and on step time.",
        f"python experiments/robustness.py --seeds {len(seed_sets)}",
        setup=[
            f"Seed sets {seed_sets}: each is `tangram bench robustness --seed S` with "
            f"{instances_per_family} instances per family (the `random` workload: 1-2 nodes of "
            "4-64 cores or 2-8 GPUs, 2-40 trajectories, heavy tails, half with synchronised "
            "first actions; docs/workloads.md), once per policy.",
            "Baselines: `fixed:1/2/4/8/16`, `k8s-static:1..4`, `k8s-burstable:1..4`, "
            "`sglang-static:1..4`, `sglang-sized` (given each service's GPU-seconds in advance, "
            "its replicas deployed at no cost). Per figure the best baseline of the instance "
            "counts, so mean and step may be beaten by two different baselines.",
            "`dominated`: one baseline beats the policy by > 5% on both mean ACT and step "
            "(a user could switch to it and lose nothing). "
            "Shares per seed set, then mean ± std over seed sets. The figure: per family and "
            "figure, the share of instances (log) whose best baseline gains at least x on the "
            "policy (x right of 0: the baseline is better); dashed 5%, dotted 20%, the grey "
            "line the 5% share the target allows; the dashed orange curve, the default from "
            "the sized replicas' start (GPU and mixed). An instance whose baselines were all "
            "rejected counts as not beaten, as in `tangram bench robustness`.",
        ],
        claims=claims,
        sections=[
            ("Shares per seed set", md_table(table)),
            (
                "Start state varied: every policy starts from `sglang-sized`'s replicas",
                "Above, every policy's GPUs start with each service resident once, except "
                "`sglang-sized` and `sglang-static`, whose replicas are deployed before the run "
                "at no cost. Here (`tangram bench robustness --warm-gpus plan`, default policy, "
                "the families with GPUs) every policy starts with the replicas `sglang-sized` "
                'sizes from the declared demand resident (`SimConfig.warm_gpus = "plan"`), '
                "as after earlier steps that warmed the pool to the load; the baselines are "
                "replayed from that start too.\n\n" + md_table(percent_table(plan_shares)),
            ),
            (
                "Each baseline in the default's place",
                "How hard the target is: each baseline set where the default stands and "
                "compared with the other baselines on the same instances (the default itself "
                "not among its rivals, so it faces one rival fewer). Shares beaten by > 5% "
                "per family, mean over the seed sets; every baseline's figures per seed set in "
                f"`{NAME}_in_place.csv` (`tangram bench robustness` reports it as "
                "`baselines_in_place`).\n\n" + md_table(in_place_table(in_place, shares)),
            ),
            ("The online limit: twin instances alike until they diverge", limit),
            (
                "Per instance",
                f"`{NAME}_instances.csv`: each instance's best baseline and its margin per "
                "figure, the policy's mean ACT over `lower-bound` and over the capacity-aware "
                "bound. Replay one with `tangram sim --workload random --seed S --set "
                "family=F --policy tangram --policy <baseline>`.",
            ),
        ],
        differences=[
            "The GPU family's losses split between narrow baselines on mean ACT (`sglang-sized`, "
            "`fixed:1`) and wide ones on step (`fixed:16`, `fixed:2`); docs/core.md lists the "
            "GPU variants tried.",
        ],
        runtime_s=time.perf_counter() - t0,
        settings={"seed_sets": len(seed_sets), "workers": args.workers},
        elastic_note=False,
    )
    rep.write(args.out)
    print(f"{NAME}: wrote {args.out}/{NAME}.md ({rep.runtime_s:.0f} s)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
