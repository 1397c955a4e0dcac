"""``tangram sim``: replay a trace (or a generated workload) under one or more policies.

With no arguments it replays the bundled coding trace on the ``paper`` cluster under
``tangram`` and ``k8s-static`` and prints the comparison.
"""

from __future__ import annotations

import argparse
import time
from pathlib import Path

from tangram.core.cluster_file import load_cluster
from tangram.report import add_json_flag, emit, positive_int
from tangram.sim.config import Overheads, RolloutConfig, SimConfig

DEFAULT_TRACE = Path(__file__).resolve().parents[2] / "traces" / "coding.jsonl.gz"
DEFAULT_POLICIES = ("tangram", "k8s-static")

TABLE_COLUMNS = [
    "policy",
    "actions",
    "rejected",
    "act_mean_s",
    "act_p50_s",
    "act_p99_s",
    "queue_mean_s",
    "overhead_mean_s",
    "exec_mean_s",
    "step_mean_s",
    "provisioned_core_s",
    "held_core_s",
    "busy_core_s",
    "provisioned_gpu_s",
    "held_gpu_s",
    "busy_gpu_s",
    "cost_usd",
]


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser(
        "sim", help="replay a trace under policies and compare ACT, step time and cost"
    )
    src = p.add_mutually_exclusive_group()
    src.add_argument(
        "--trace",
        type=Path,
        help="trace file (.jsonl, .jsonl.gz, .parquet); default: bundled coding trace",
    )
    src.add_argument("--workload", help="generate a workload instead: coding, deepsearch or mopd")
    p.add_argument(
        "--cluster", default="paper", help="bundled cluster name or TOML path (default: paper)"
    )
    p.add_argument(
        "--policy",
        action="append",
        help="policy name, repeatable (default: tangram and k8s-static)",
    )
    p.add_argument(
        "--batch",
        type=positive_int,
        help="trajectories per step (with --workload; default: the paper's)",
    )
    p.add_argument("--steps", type=positive_int, default=1, help="RL steps (with --workload)")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--train-s", type=float, default=0.0, help="training phase after each step (s)")
    p.add_argument(
        "--open-loop", action="store_true", help="actions arrive at the trace's arrival_s"
    )
    p.add_argument(
        "--grant-s",
        type=float,
        default=Overheads.aoe_grant_s,
        help="AOE grant+revoke per CPU action (s)",
    )
    p.add_argument("--container-start-s", type=float, default=Overheads.container_start_s)
    p.add_argument(
        "--exec-noise",
        type=float,
        default=0.0,
        help="log-normal sigma of real vs estimated duration",
    )
    p.add_argument(
        "--out", type=Path, help="write per-action/trajectory/step Parquet and a plot here"
    )
    p.add_argument("--quiet", action="store_true", help="no progress bar")
    add_json_flag(p)
    p.set_defaults(func=main)


def load_source(args: argparse.Namespace):
    from tangram.trace import load_trace

    if args.workload:
        from tangram.sim.workloads import generate

        return generate(args.workload, batch=args.batch, steps=args.steps, seed=args.seed)
    return load_trace(args.trace or DEFAULT_TRACE)


def main(args: argparse.Namespace) -> int:
    from tqdm import tqdm

    from tangram.sim.driver import simulate
    from tangram.sim.metrics import actions_frame, summary, timeline_frame, write_results

    trace = load_source(args)
    cluster = load_cluster(args.cluster)
    policies = args.policy or list(DEFAULT_POLICIES)
    overheads = Overheads(
        aoe_grant_s=args.grant_s,
        container_start_s=args.container_start_s,
        exec_noise_sigma=args.exec_noise,
    )
    rollout = RolloutConfig(train_s=args.train_s, mode="open" if args.open_loop else "closed")
    rows, files, frames, timelines = [], {}, {}, {}
    bar = tqdm(
        total=len(trace) * len(policies),
        unit="action",
        disable=args.quiet or args.json,
        leave=False,
    )
    for policy in policies:
        bar.set_description(policy)
        config = SimConfig(policy=policy, seed=args.seed, overheads=overheads, rollout=rollout)
        t0 = time.perf_counter()
        result = simulate(trace, cluster, config, progress=bar.update)
        acts, tl = actions_frame(result), timeline_frame(result)  # built once, used thrice
        row = summary(result, actions=acts, timeline=tl)
        row["wall_s"] = time.perf_counter() - t0
        rows.append(row)
        if args.out:
            files[policy] = write_results(result, args.out, actions=acts, timeline=tl)
            frames[policy], timelines[policy] = acts, tl
    bar.close()
    doc = {
        "trace": str(args.trace or (args.workload or DEFAULT_TRACE)),
        "trace_meta": trace.meta,
        "cluster": cluster.name,
        "results": rows,
        "files": files,
    }
    if args.out:
        from tangram.sim.plots import comparison_figure

        doc["figure"] = str(comparison_figure(frames, timelines, Path(args.out) / "comparison.png"))
    source = args.workload or Path(args.trace or DEFAULT_TRACE).name
    emit(
        args.json,
        doc,
        {
            f"{source} on {cluster.name} ({len(trace)} actions)": [
                {k: r[k] for k in TABLE_COLUMNS} for r in rows
            ]
        },
    )
    if len(rows) >= 2 and not args.json:
        base, ours = rows[-1], rows[0]
        print(
            f"\n{ours['policy']} vs {base['policy']}: mean ACT {base['act_mean_s'] / ours['act_mean_s']:.2f}x lower, "
            f"step {base['step_mean_s'] / ours['step_mean_s']:.2f}x shorter, "
            f"held core-s {base['held_core_s'] / max(ours['held_core_s'], 1e-9):.2f}x fewer"
        )
    if args.out and not args.json:
        print(f"results: {args.out}/ (Parquet per policy, comparison.png)")
    return 0
