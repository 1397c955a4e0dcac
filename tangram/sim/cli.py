"""``tangram sim``: replay a trace (or a generated workload) under one or more policies.

With no arguments it replays the bundled coding trace on the ``paper`` cluster under
``tangram`` and ``k8s-static`` and prints the comparison: a table that fits 100 columns
(``--wide``: every figure), the rejected actions and why, and the default policy against each
other policy in words. A policy that cannot finish the trace (its simulation stalls: e.g. a
static pod per trajectory, fewer pods than trajectories at a step barrier, a deadlock a real
cluster would hit too) gets one line on stderr saying why, the others' results are printed,
and the exit status is 1 (the comparison is incomplete; 2 stays for bad input).
``--set NAME=VALUE`` sets any field of the workload's parameters
(``overheads.NAME`` / ``rollout.NAME``: of the simulator's); ``--gpus`` / ``--cpu-nodes``
resize the cluster.
"""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import sys
import textwrap
import time
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any

from tangram.core.cluster_file import load_cluster
from tangram.report import (
    add_json_flag,
    emit,
    fit_columns,
    non_negative_int,
    path_arg,
    positive_int,
)
from tangram.sim.cluster_size import resize
from tangram.sim.compare import WIDTH, closing_lines
from tangram.sim.config import WARM_GPUS_FLAG, Overheads, RolloutConfig, SimConfig, policy_arg
from tangram.sim.overrides import OverrideError, Setting, add_set_flag, build, describe_fields

DEFAULT_TRACE = Path(__file__).resolve().parents[2] / "traces" / "coding.jsonl.gz"
DEFAULT_POLICIES = ("tangram", "k8s-static")

#: ``--wide``: every figure of the summary, by its key.
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

#: The default table: summary key -> header, most important first (the last are dropped if a
#: table would not fit 100 columns); held columns only for resources the trace uses.
NARROW_COLUMNS = {
    "policy": "policy",
    "actions": "actions",
    "rejected": "rejected",
    "act_mean_s": "ACT mean",
    "act_p50_s": "ACT p50",
    "act_p99_s": "ACT p99",
    "step_mean_s": "step",
    "held_core_s": "held core-s",
    "held_gpu_s": "held GPU-s",
    "cost_usd": "cost USD",
}
HELD_BY_RESOURCE = {"held_core_s": "cpu", "held_gpu_s": "gpu"}


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser(
        "sim", help="replay a trace under policies and compare ACT, step time and cost"
    )
    src = p.add_mutually_exclusive_group()
    src.add_argument(
        "--trace",
        type=path_arg,
        help="trace file (.jsonl, .jsonl.gz, .parquet); default: bundled coding trace",
    )
    src.add_argument(
        "--workload", help="generate a workload instead: coding, deepsearch, mopd or random"
    )
    p.add_argument(
        "--cluster",
        help="bundled cluster name or TOML path (default: the cluster the trace carries, as "
        "random instances do, else paper)",
    )
    p.add_argument(
        "--policy",
        action="append",
        type=policy_arg,
        help="policy name, repeatable (default: tangram and k8s-static)",
    )
    p.add_argument(
        "--batch",
        type=positive_int,
        help=(
            "trajectories per step (with --workload; default: the paper's; random: the "
            "batch its instance draws, as `tangram bench robustness` replays it)"
        ),
    )
    p.add_argument("--steps", type=positive_int, help="RL steps (with --workload; default 1)")
    p.add_argument("--seed", type=non_negative_int, default=0)
    add_set_flag(
        p,
        "set a field of the workload's parameters (with --workload; e.g. exec_mean_s=2, "
        'teachers=\'[{"name": "m", "params_b": 7}]\'), or overheads.FIELD / '
        "rollout.FIELD; repeatable, the last wins; typed by the field (--list-params lists them)",
    )
    p.add_argument(
        "--gpus",
        type=non_negative_int,
        metavar="N",
        help="resize the cluster to N GPUs: whole nodes of its GPU node's shape, a remainder "
        "as smaller nodes in powers of two (36 of 8-GPU nodes: 4x8 + 1x4)",
    )
    p.add_argument(
        "--cpu-nodes",
        type=non_negative_int,
        metavar="N",
        help="resize the cluster to N CPU nodes of its CPU node's shape",
    )
    p.add_argument(
        "--train-s", type=float, help="training phase after each step (s) = rollout.train_s"
    )
    p.add_argument(
        "--open-loop",
        action="store_true",
        help="actions arrive at the trace's arrival_s (= rollout.mode=open; a closed-loop "
        "trace, without arrival_s, is refused)",
    )
    p.add_argument(
        "--grant-s",
        type=float,
        help=f"AOE grant+revoke per CPU action (s) = overheads.aoe_grant_s "
        f"(default {Overheads.aoe_grant_s})",
    )
    p.add_argument(
        "--container-start-s",
        type=float,
        help=f"= overheads.container_start_s (default {Overheads.container_start_s}; closed "
        "loop only: an open-loop replay starts no AOE container)",
    )
    p.add_argument(
        "--exec-noise",
        type=float,
        help="log-normal sigma of real vs estimated duration = overheads.exec_noise_sigma",
    )
    p.add_argument(
        "--warm-gpus",
        choices=tuple(WARM_GPUS_FLAG),
        default="once",
        help="what the GPUs hold at the start (SimConfig.warm_gpus): each service once "
        "(default), the replicas sglang-sized sizes from the declared demand (for every "
        "policy), or nothing",
    )
    p.add_argument("--wide", action="store_true", help="print every figure (a wide table)")
    p.add_argument(
        "--list-params",
        action="store_true",
        help="list what --set can change (the workload's parameters with --workload), then exit",
    )
    p.add_argument(
        "--out", type=path_arg, help="write per-action/trajectory/step Parquet and a plot here"
    )
    p.add_argument("--quiet", action="store_true", help="no progress bar")
    add_json_flag(p)
    p.set_defaults(func=main)


#: Old flags, as the settings they stand for (a later ``--set`` of the same field wins).
FLAG_SETTINGS = {
    "grant_s": "overheads.aoe_grant_s",
    "container_start_s": "overheads.container_start_s",
    "exec_noise": "overheads.exec_noise_sigma",
    "train_s": "rollout.train_s",
}


def sections() -> dict[str, type]:
    """``--set`` prefixes for the simulator's own parameters: SimConfig's dataclass fields."""
    defaults = SimConfig()
    values = {f.name: getattr(defaults, f.name) for f in dataclasses.fields(SimConfig)}
    return {name: type(v) for name, v in values.items() if dataclasses.is_dataclass(v)}


def all_settings(args: argparse.Namespace) -> list[Setting]:
    """The old flags as settings, then ``--set`` in command-line order."""
    out = [
        Setting(name, repr(getattr(args, flag)), flag="--" + flag.replace("_", "-"))
        for flag, name in FLAG_SETTINGS.items()
        if getattr(args, flag) is not None
    ]
    if args.open_loop:
        out.append(Setting("rollout.mode", "open"))
    return out + list(args.settings)


def configure(args: argparse.Namespace) -> tuple[Any, dict[str, Any]]:
    """Workload parameters (None for a trace) and the simulator's sections, from the settings."""
    groups = sections()
    also = "; or " + ", ".join(f"{g}.FIELD" for g in groups)
    mine: dict[str, list[Setting]] = {g: [] for g in groups}
    workload: list[Setting] = []
    for s in all_settings(args):
        head = s.name.split(".", 1)[0]
        (mine[head] if head in groups and "." in s.name else workload).append(s)
    built = {g: build(tp, mine[g], g, prefix=f"{g}.") for g, tp in groups.items()}
    if not args.workload:
        refuse_generator_flags(args)
        if workload:
            raise OverrideError(
                f"--set {workload[0].text}: workload parameters need --workload (a trace file "
                f"has no generator); with a trace only {', '.join(f'{g}.FIELD' for g in groups)}"
            )
        return None, built
    from tangram.sim.workloads import WORKLOADS

    if args.workload not in WORKLOADS:
        raise ValueError(
            f"--workload: unknown workload {args.workload!r}; known: {', '.join(sorted(WORKLOADS))}"
        )
    params = build(
        WORKLOADS[args.workload].params_type, workload, f"workload {args.workload!r}", also=also
    )
    return params, built


#: Flags that only shape a generated workload: refused with a trace rather than ignored.
GENERATOR_FLAGS = {"batch": "--batch", "steps": "--steps"}


def refuse_generator_flags(args: argparse.Namespace) -> None:
    """Refuse --batch / --steps without --workload: a trace file fixes both, and ignoring
    them silently would report a run the user did not ask for."""
    for dest, flag in GENERATOR_FLAGS.items():
        if getattr(args, dest) is not None:
            raise ValueError(
                f"{flag} needs --workload (a trace file fixes its trajectories and steps)"
            )


#: Settings an open-loop replay never pays: an AOE container opens with its trajectory, which
#: an open-loop trace does not record, so its start is not charged (the pods' start is).
UNPAID_IN_OPEN_LOOP = {"overheads.container_start_s": "--container-start-s"}


def refuse_unpaid_in_open_loop(settings: Sequence[Setting], overheads: Overheads) -> None:
    """Refuse a cost given explicitly that open loop never pays: ``--open-loop
    --container-start-s 30`` gave the figures of ``--container-start-s 0``, silently (AOE
    containers are never started in an open-loop replay; the static baselines' pods still pay
    ``pod_start_s``). A setting of 0 asks for what open loop does and passes."""
    for setting in settings:
        flag = UNPAID_IN_OPEN_LOOP.get(setting.name)
        field = setting.name.split(".", 1)[-1]
        if flag is not None and getattr(overheads, field):
            raise ValueError(
                f"{setting.name} ({flag}) is the start of a trajectory's AOE container, "
                "created when the trajectory opens; an open-loop replay (--open-loop) has no "
                "opens, so no container start is charged and the setting would change nothing"
            )


def policy_list(given: Sequence[str] | None) -> list[str]:
    """The policies to run: ``--policy`` each once (a repeat ran the same simulation twice, its
    figures printed twice, its --out files and rejection reasons written over), else the
    defaults. A policy is the one its name says whatever the spelling (``fixed:04`` is
    ``fixed:4``, ``k8s-static`` is ``k8s-static:4``): two spellings of one are a repeat."""
    from tangram.core.policies import make_policy

    if not given:
        return list(DEFAULT_POLICIES)
    seen: dict[str, str] = {}
    for spec in given:
        name = make_policy(spec).name
        if name in seen:
            if seen[name] == spec:
                raise ValueError(f"--policy {spec} given more than once")
            raise ValueError(
                f"--policy {seen[name]} and --policy {spec} are the same policy ({name}); "
                "give it once"
            )
        seen[name] = spec
    return list(given)


def load_source(args: argparse.Namespace, params: Any = None):
    from tangram.trace import load_trace

    if args.workload:
        from tangram.sim.workloads import WORKLOADS

        workload = WORKLOADS[args.workload]
        steps = 1 if args.steps is None else args.steps
        return workload(params, batch=args.batch, steps=steps, seed=args.seed)
    path = args.trace or DEFAULT_TRACE
    trace = load_trace(path)
    if not len(trace):
        # Nothing to simulate: every figure would be undefined (the header alone is valid).
        raise ValueError(f"{path}: the trace has no actions (a header and no rows)")
    return trace


def list_params(args: argparse.Namespace) -> int:
    """Print each settable name with its type and default (a default too long is cut)."""
    tables = {}
    if args.workload:
        from tangram.sim.workloads import WORKLOADS

        tp = WORKLOADS[args.workload].params_type
        tables[f"--set NAME=VALUE for workload {args.workload!r} ({tp.__name__})"] = tp
    for group, tp in sections().items():
        tables[f"--set {group}.NAME=VALUE ({tp.__name__})"] = tp
    doc = {title: describe_fields(tp) for title, tp in tables.items()}
    if not args.json:
        for rows in doc.values():
            for r in rows:
                room = WIDTH - 2 * 2 - max(len(x["name"]) for x in rows) - 24
                if len(r["default"]) > room:
                    r["default"] = r["default"][: room - 3] + "..."
    emit(args.json, doc, doc)
    return 0


def narrow_table(rows: Sequence[dict[str, Any]], resources: set[str]) -> list[dict[str, Any]]:
    """The default table: the main figures under short headers, fitted to 100 columns."""
    keys = [k for k in NARROW_COLUMNS if HELD_BY_RESOURCE.get(k, "") in resources | {""}]
    shown = [{NARROW_COLUMNS[k]: r[k] for k in keys} for r in rows]
    kept = fit_columns(shown, [NARROW_COLUMNS[k] for k in keys], WIDTH)
    return [{h: r[h] for h in kept} for r in shown]


def rejection_lines(
    rows: Sequence[dict[str, Any]], reasons: dict[str, dict[str, int]]
) -> list[str]:
    """Per policy with rejections: how many and why (most frequent reasons first)."""
    lines = []
    for r in rows:
        if not r["rejected"]:
            continue
        why = sorted(reasons[r["policy"]].items(), key=lambda kv: (-kv[1], kv[0]))
        lines.append(f"{r['policy']}: {r['rejected']} of {r['actions']} actions rejected")
        lines += [f"  {n} x {reason}"[:WIDTH] for reason, n in why[:3]]
        if len(why) > 3:
            lines.append(f"  ... and {len(why) - 3} other reasons")
    return lines


def main(args: argparse.Namespace) -> int:
    from tqdm import tqdm

    from tangram.sim.driver import SimulationStalled, simulate
    from tangram.sim.instances import trace_cluster
    from tangram.sim.metrics import (
        actions_frame,
        check_out_dir,
        summary,
        timeline_frame,
        write_results,
    )

    params, built = configure(args)
    policies = policy_list(args.policy)
    if args.list_params:
        return list_params(args)
    if args.out:
        check_out_dir(args.out)  # before the run, not after it
    trace = load_source(args, params)
    cluster = resize(
        load_cluster(args.cluster)
        if args.cluster is not None  # ('' is refused as empty, not taken as absent)
        else trace_cluster(trace, args.trace or args.workload or DEFAULT_TRACE)
        or load_cluster("paper"),
        gpus=args.gpus,
        cpu_nodes=args.cpu_nodes,
    )
    overheads: Overheads = built["overheads"]
    rollout: RolloutConfig = built["rollout"]
    if rollout.mode == "open":
        refuse_unpaid_in_open_loop(all_settings(args), overheads)
        untimed = sum(1 for r in trace.rows if r.arrival_s is None)
        if untimed:  # they would all arrive at t=0, each trajectory's positions at once
            raise ValueError(
                f"open loop (--open-loop / rollout.mode=open) replays each action at its "
                f"arrival_s, and {untimed} of {len(trace)} actions have none: this trace is "
                "closed-loop (its gaps are gen_before_s); drop --open-loop"
            )
    rows, files, frames, timelines = [], {}, {}, {}
    reasons: dict[str, dict[str, int]] = {}
    stalled: dict[str, str] = {}
    bar = tqdm(
        total=len(trace) * len(policies),
        unit="action",
        disable=args.quiet or args.json,
        leave=False,
    )
    for policy in policies:
        bar.set_description(policy)
        config = SimConfig(
            policy=policy,
            seed=args.seed,
            overheads=overheads,
            rollout=rollout,
            warm_gpus=WARM_GPUS_FLAG[args.warm_gpus],
        )
        t0 = time.perf_counter()
        try:
            result = simulate(trace, cluster, config, progress=bar.update)
        except SimulationStalled as exc:
            stalled[policy] = str(exc)  # the others still have figures to compare
            continue
        acts, tl = actions_frame(result), timeline_frame(result)  # built once, used thrice
        row = summary(result, actions=acts, timeline=tl)
        row["wall_s"] = time.perf_counter() - t0
        rows.append(row)
        rejected = acts[acts["outcome"] == "rejected"] if len(acts) else acts
        reasons[policy] = {str(k): int(v) for k, v in rejected["reason"].value_counts().items()}
        if args.out:
            with out_errors(args.out):
                files[policy] = write_results(result, args.out, actions=acts, timeline=tl)
            frames[policy], timelines[policy] = acts, tl
    bar.close()
    doc = {
        "trace": str(args.trace or (args.workload or DEFAULT_TRACE)),
        "trace_meta": trace.meta,
        "cluster": cluster.name,
        "results": rows,
        "files": files,
        "settings": [s.text for s in args.settings],
        "overheads": dataclasses.asdict(overheads),
        "rollout": dataclasses.asdict(rollout),
        "rejected_reasons": reasons,
        "stalled": stalled,
    }
    if args.out and frames:
        from tangram.sim.plots import comparison_figure

        with out_errors(args.out):
            figure = comparison_figure(frames, timelines, Path(args.out) / "comparison.png")
        doc["figure"] = str(figure)
    source = args.workload or Path(args.trace or DEFAULT_TRACE).name
    title = f"{source} on {cluster.name}: {len(trace)} actions"
    if args.wide:
        table = [{k: r[k] for k in TABLE_COLUMNS} for r in rows]
    else:
        table = narrow_table(rows, {r.resource for r in trace.rows})
    emit(args.json, doc, {title: table})
    if not args.json:
        notes = ["times in s; ACT over the actions that ran; cost in USD"]
        notes[0] += "" if args.wide else "; --wide: every figure"
        used = {r.resource for r in trace.rows}
        notes += rejection_lines(rows, reasons) + closing_lines(rows, resources=used)
        if notes:
            print("\n" + "\n".join(notes))
        if args.out and frames:
            print(f"results: {args.out}/ (Parquet per policy, comparison.png)")
    for policy, why in stalled.items():
        print(f"tangram sim: {policy} could not finish: {why}", file=sys.stderr)
    if stalled:
        return 1
    if rows and all(r["actions"] and r["rejected"] == r["actions"] for r in rows):
        print(
            textwrap.fill(all_rejected_message(rows, reasons, cluster.name), WIDTH), file=sys.stderr
        )
        return 1
    return 0


@contextlib.contextmanager
def out_errors(out: Path) -> Iterator[None]:
    """An OSError writing under ``--out`` (no permission, a full disk, a read-only file
    system) as a ValueError naming the flag and the path, not a traceback: the directory
    check before the run (``check_out_dir``) cannot see them all (root passes os.access)."""
    try:
        yield
    except OSError as exc:
        where = exc.filename or out
        raise ValueError(f"--out {out}: cannot write {where}: {exc.strerror or exc}") from None


def all_rejected_message(
    rows: Sequence[dict[str, Any]], reasons: dict[str, dict[str, int]], cluster: str
) -> str:
    """Why there is nothing to compare: every action of every policy was rejected."""
    first = rows[0]
    why = max(reasons[first["policy"]].items(), key=lambda kv: kv[1])[0]
    return (
        f"tangram sim: every action was rejected ({first['actions']} per policy, "
        f"{len(rows)} {'policy' if len(rows) == 1 else 'policies'}), so there is no ACT, step "
        f"or cost to compare. Cluster {cluster!r} cannot run this trace; e.g. {why}"
    )
