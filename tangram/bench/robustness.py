"""``tangram bench robustness``: hunt for instances where a static baseline beats the default.

For ``--instances`` seeded random instances of each family (the ``random`` workload: ``cpu``,
``gpu``, ``mixed``; instance i of a run has seed ``--seed + i`` and 2..40 trajectories drawn
from it), replays each under the default policy, ``lower-bound`` and every baseline in
``BASELINES``, and computes the capacity-aware bound (``tangram.sim.bounds``). Per family it
reports the share of instances where some baseline beats the default by more than 5% and by
more than 20% on mean ACT, p99 ACT and step time; which baselines win most; and the
distribution of the default over ``lower-bound`` and over the capacity-aware bound. The worst
instances (largest margin of a baseline over the default) are written to ``--out`` as trace +
cluster files for ``tangram sim --trace T --cluster C``. ``--default POLICY`` sets another policy
against the baselines (e.g. ``tangram:128``, or a new policy against the old one's figures).

A run in which a policy rejected any action (or stalled) is not compared (its figures cover fewer actions):
such baselines are counted as ``incomparable``, and an instance whose default rejected an action
is left out of the shares and ratios (counted as ``default_rejected``).
"""

from __future__ import annotations

import argparse
import math
import shlex
import time
from collections import Counter
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from tangram.report import add_json_flag, emit, int_in, non_negative_int, path_arg, positive_int

DEFAULT_POLICY = "tangram"
#: The static baselines: fixed DoP in powers of two (1, 2, 4, 8, 16; the others between add
#: little and cost time), Kubernetes static and burstable pods of 1..4 cores, SGLang with 1..4
#: GPUs per service and sized by load.
BASELINES: tuple[str, ...] = (
    *(f"fixed:{k}" for k in (1, 2, 4, 8, 16)),
    *(f"k8s-static:{k}" for k in (1, 2, 3, 4)),
    *(f"k8s-burstable:{k}" for k in (1, 2, 3, 4)),
    *(f"sglang-static:{k}" for k in (1, 2, 3, 4)),
    "sglang-sized",
)
#: Figures compared: key -> label.
METRICS: dict[str, str] = {"act_mean_s": "mean ACT", "act_p99_s": "p99 ACT", "step_s": "step"}
#: "Beats by more than x": the default's figure over the baseline's exceeds 1 + x.
MARGINS = (0.05, 0.20)
DEFAULT_INSTANCES = 200
DEFAULT_WORST = 3
#: Bounds of the count flags. An instance replays every policy (about 0.4 s on one core), so
#: 100,000 per family is more than a day; ``--jobs`` forks every worker at once (a fork pool
#: starts all of them), so ``--jobs 100000`` exhausted memory before the first replay.
INSTANCES_MAX = 100_000
JOBS_MAX = 256


@dataclass(frozen=True)
class RunFigures:
    """One policy's figures on one instance."""

    act_mean_s: float
    act_p99_s: float
    step_s: float
    rejected: int


def figures(
    trace: Any,
    cluster: Any,
    policy: str,
    oversubscription: float = 0.0,
    warm_gpus: bool | str = True,
) -> RunFigures:
    """Replay ``trace`` under ``policy`` and read its mean and p99 ACT, mean step, rejections.
    ``oversubscription``: ``Overheads.oversubscription_slowdown`` (time-slicing's cost);
    ``warm_gpus``: what the GPUs hold at the start (``SimConfig.warm_gpus``)."""
    from tangram.sim.config import Overheads, SimConfig
    from tangram.sim.driver import SimulationStalled, simulate

    config = SimConfig(
        policy=policy,
        timeline=False,
        overheads=Overheads(oversubscription_slowdown=oversubscription),
        warm_gpus=warm_gpus,
    )
    try:
        result = simulate(trace, cluster, config)
    except SimulationStalled:  # e.g. pods held at a step barrier: counted as not comparable
        return RunFigures(math.nan, math.nan, math.nan, rejected=len(trace))
    act = np.array([r.finish - r.arrival for r in result.actions if r.outcome == "result"])
    steps = [s.end - s.start for s in result.steps if s.end is not None]
    return RunFigures(
        act_mean_s=float(act.mean()) if len(act) else math.nan,
        act_p99_s=float(np.percentile(act, 99)) if len(act) else math.nan,
        step_s=float(np.mean(steps)) if steps else math.nan,
        rejected=len(result.actions) - len(act),
    )


def run_instance(
    family: str,
    seed: int,
    policies: Sequence[str],
    default_policy: str = DEFAULT_POLICY,
    oversubscription: float = 0.0,
    warm_gpus: bool | str = True,
) -> dict[str, Any]:
    """One instance: every policy's figures, the capacity-aware bound, the best baseline."""
    from tangram.sim.bounds import capacity_bound
    from tangram.sim.workloads.random_instances import RandomParams, random_instance

    trace, cluster = random_instance(RandomParams(family=family), seed=seed)
    runs = {
        p: figures(trace, cluster, p, oversubscription, warm_gpus)
        for p in (default_policy, "lower-bound", *policies)
    }
    bound = capacity_bound(trace, cluster)
    default = runs[default_policy]
    record: dict[str, Any] = {
        "default": default_policy,
        "family": family,
        "seed": seed,
        "trajectories": trace.meta["trajectories"],
        "actions": len(trace),
        "synced": trace.meta["synced"],
        "cluster": {
            "cores": cluster.total_cores,
            "gpus": cluster.total_gpus,
            "api_concurrency": sum(a.concurrency for a in cluster.apis),
        },
        "runs": {p: vars(f) for p, f in runs.items()},
        "bound": {"act_mean_s": bound.act_mean_s, "step_s": bound.step_mean_s},
        "default_rejected": default.rejected > 0,
        "incomparable": sorted(p for p in policies if runs[p].rejected),
    }
    # margin = default / best comparable baseline - 1 (> 0: a baseline beats the default).
    best: dict[str, dict[str, Any]] = {}
    for key in METRICS:
        ok = [p for p in policies if not runs[p].rejected]
        if default.rejected or not ok:
            best[key] = {"policy": None, "margin": math.nan}
            continue
        top = min(ok, key=lambda p: (getattr(runs[p], key), p))
        best[key] = {"policy": top, "margin": getattr(default, key) / getattr(runs[top], key) - 1}
    record["best"] = best
    lb = runs["lower-bound"]
    record["ratios"] = {
        "act_over_lower_bound": default.act_mean_s / lb.act_mean_s,
        "act_over_capacity_bound": default.act_mean_s / bound.act_mean_s,
        "step_over_lower_bound": default.step_s / lb.step_s,
        "step_over_capacity_bound": default.step_s / bound.step_mean_s,
    }
    record["_instance"] = (trace, cluster)
    return record


def _run_task(task: tuple[str, int, tuple[str, ...], str, float, bool | str]) -> dict[str, Any]:
    """``run_instance`` on one argument tuple (what a process pool maps)."""
    return run_instance(*task)


def _quantiles(values: Sequence[float]) -> dict[str, float]:
    v = [x for x in values if not math.isnan(x)]
    if not v:
        return {"p50": math.nan, "p90": math.nan, "max": math.nan}
    return {
        "p50": float(np.percentile(v, 50)),
        "p90": float(np.percentile(v, 90)),
        "max": float(max(v)),
    }


def dominated(record: dict[str, Any], policies: Sequence[str], margin: float) -> bool:
    """Whether one comparable baseline beats the default by more than ``margin`` on both mean
    ACT and step time."""
    d = record["runs"][record["default"]]
    return any(
        not run["rejected"]
        and d["act_mean_s"] / run["act_mean_s"] - 1 > margin
        and d["step_s"] / run["step_s"] - 1 > margin
        for run in (record["runs"][p] for p in policies)
    )


def in_place_shares(
    records: Sequence[dict[str, Any]], policies: Sequence[str]
) -> dict[str, dict[str, Any]]:
    """Each baseline set in the default's place: per figure, the share of the instances it
    completes where another baseline beats it by more than each margin. Whether some static
    choice meets the target the default is held to (each faces one rival fewer than the
    default does; the default is not among its rivals)."""
    out: dict[str, dict[str, Any]] = {}
    for candidate in policies:
        own = [r for r in records if not r["runs"][candidate]["rejected"]]
        beaten: dict[str, dict[str, float]] = {}
        for key in METRICS:
            margins = []
            for r in own:
                rivals = [
                    r["runs"][p][key]
                    for p in policies
                    if p != candidate and not r["runs"][p]["rejected"]
                ]
                if rivals:
                    margins.append(r["runs"][candidate][key] / min(rivals) - 1)
            beaten[key] = {
                f">{round(m * 100)}%": (
                    sum(x > m for x in margins) / len(margins) if margins else math.nan
                )
                for m in MARGINS
            }
        out[candidate] = {"compared": len(own), "beaten": beaten}
    return out


def family_summary(records: Sequence[dict[str, Any]], policies: Sequence[str]) -> dict[str, Any]:
    """Per family: shares beaten by more than each margin, top winners, ratio distributions."""
    compared = [r for r in records if not r["default_rejected"]]
    n = len(compared)
    beaten: dict[str, dict[str, float]] = {}
    winners: dict[str, list[tuple[str, int]]] = {}
    for key in METRICS:
        beaten[key] = {
            f">{round(m * 100)}%": (
                sum(r["best"][key]["margin"] > m for r in compared) / n if n else math.nan
            )
            for m in MARGINS
        }
        # Which baselines beat the default by more than 5% (each counted once per instance).
        wins: Counter[str] = Counter()
        for r in compared:
            d = r["runs"][r["default"]][key]
            for p in policies:
                run = r["runs"][p]
                if not run["rejected"] and d / run[key] - 1 > MARGINS[0]:
                    wins[p] += 1
        winners[key] = wins.most_common(3)
    # One baseline better on both mean ACT and step: a user could switch to it and lose
    # nothing (the shares above take the best baseline per figure, which may differ).
    dominated_shares = {
        f">{round(m * 100)}%": (
            sum(dominated(r, policies, m) for r in compared) / n if n else math.nan
        )
        for m in MARGINS
    }
    ratios = {
        name: _quantiles([r["ratios"][name] for r in compared])
        for name in (
            "act_over_lower_bound",
            "act_over_capacity_bound",
            "step_over_lower_bound",
            "step_over_capacity_bound",
        )
    }
    return {
        "instances": len(records),
        "compared": n,
        "default_rejected": len(records) - n,
        "incomparable_runs": sum(len(r["incomparable"]) for r in records),
        "beaten": beaten,
        "dominated": dominated_shares,
        "winners": {k: [{"policy": p, "instances": c} for p, c in v] for k, v in winners.items()},
        "ratios": ratios,
        "baselines_in_place": in_place_shares(records, policies),
    }


def worst_margin(record: dict[str, Any]) -> float:
    """The largest margin of a baseline over the default on any figure (NaN-free)."""
    margins = [b["margin"] for b in record["best"].values() if not math.isnan(b["margin"])]
    return max(margins, default=-math.inf)


def write_worst(
    records: Sequence[dict[str, Any]],
    out: Path,
    per_family: int,
    warm_gpus: bool | str = True,
    oversubscription: float = 0.0,
) -> list[dict[str, Any]]:
    """Write the ``per_family`` worst instances of each family as trace + cluster files; each
    one's replay command starts the GPUs as the benchmark did (``warm_gpus``) and charges the
    same time-slicing (``oversubscription``: without it, a run of ``--oversubscription 0.5``
    replayed to other figures than those reported)."""
    from tangram.sim.config import warm_gpus_flag
    from tangram.sim.instances import write_instance

    start = warm_gpus_flag(warm_gpus)
    start_flag = "" if start == "once" else f" --warm-gpus {start}"
    if oversubscription:
        start_flag += f" --set overheads.oversubscription_slowdown={oversubscription!r}"

    written = []
    families = dict.fromkeys(r["family"] for r in records)
    for family in families:
        mine = [r for r in records if r["family"] == family and worst_margin(r) > 0]
        for r in sorted(mine, key=lambda r: (-worst_margin(r), r["seed"]))[:per_family]:
            key = max(METRICS, key=lambda k: np.nan_to_num(r["best"][k]["margin"], nan=-1.0))
            trace, cluster = r["_instance"]
            try:
                paths = write_instance(trace, cluster, out, f"{family}-seed{r['seed']}")
            except OSError as exc:  # (no permission, a full disk: a traceback after the run)
                where = exc.filename or out
                raise ValueError(
                    f"--out {out}: cannot write {where}: {exc.strerror or exc}"
                ) from None
            best = r["best"][key]["policy"]
            written.append(
                {
                    "family": family,
                    "seed": r["seed"],
                    "figure": key,
                    "baseline": best,
                    "margin": r["best"][key]["margin"],
                    **paths,
                    # (quoted: an --out with a space gave a command a shell splits)
                    "replay": f"tangram sim --trace {shlex.quote(paths['trace'])} --cluster "
                    f"{shlex.quote(paths['cluster'])} --policy {shlex.quote(r['default'])} "
                    f"--policy {shlex.quote(str(best))}{start_flag}",
                }
            )
    return written


def check_families(families: Sequence[str]) -> None:
    """At least one family, each known and named once: a repeated family would be replayed
    twice and counted twice (n doubled), an empty list would report nothing and succeed."""
    from tangram.sim.workloads.random_instances import FAMILIES

    if not families:
        raise ValueError(f"no family given; known: {', '.join(FAMILIES)}")
    unknown = [f for f in families if f not in FAMILIES]
    if unknown:
        raise ValueError(f"unknown family {unknown[0]!r}; known: {', '.join(FAMILIES)}")
    repeated = sorted({f for f in families if families.count(f) > 1})
    if repeated:
        raise ValueError(f"family {repeated[0]!r} given more than once")


def family_list(text: str) -> list[str]:
    """``--families``' comma-separated names, checked by :func:`check_families`; a ValueError
    naming the flag (the CLI's bad-input path, exit status 2) when they do not pass."""
    families = [f.strip() for f in text.split(",") if f.strip()]
    try:
        check_families(families)
    except ValueError as exc:
        raise ValueError(f"--families {text!r}: {exc}") from None
    return families


def run_bench(
    *,
    instances: int = DEFAULT_INSTANCES,
    seed: int = 0,
    families: Sequence[str] = ("cpu", "gpu", "mixed"),
    policies: Sequence[str] = BASELINES,
    out: Path | None = None,
    worst: int = DEFAULT_WORST,
    default_policy: str = DEFAULT_POLICY,
    progress: Callable[[], None] | None = None,
    jobs: int = 1,
    oversubscription: float = 0.0,
    warm_gpus: bool | str = True,
) -> dict[str, Any]:
    """The whole benchmark as one JSON-ready document (``jobs`` > 1: a process pool; the
    figures do not depend on it, every replay being deterministic). ``oversubscription``:
    the share of speed threads lose while they outnumber their cores, for the burstable pods
    and the default's told threads alike (``Overheads.oversubscription_slowdown``).
    ``warm_gpus``: what every policy's GPUs hold at the start (``SimConfig.warm_gpus``; "plan":
    ``sglang-sized``'s replicas resident for all, not only for it)."""
    if not 0 <= oversubscription < 1:
        raise ValueError(f"oversubscription must lie in [0, 1), got {oversubscription}")
    from tangram.sim.config import SimConfig

    SimConfig(warm_gpus=warm_gpus)  # a bad start is refused here (SimConfig's rule), not per replay
    from tangram.core.policies import make_policy

    check_families(families)
    names = {}
    for policy in (default_policy, *policies):
        names[policy] = make_policy(policy).name  # an unknown name fails here, before any replay
    # A default that is a baseline spelled otherwise (--default fixed:01, k8s-static for
    # k8s-static:4) was replayed twice per instance, once under each label, and counted as
    # one policy more: it takes the baseline's spelling, as --default fixed:1 does.
    default_policy = next(
        (p for p in policies if names[p] == names[default_policy]), default_policy
    )
    t0 = time.perf_counter()
    tasks = [
        (f, seed + i, tuple(policies), default_policy, oversubscription, warm_gpus)
        for f in families
        for i in range(instances)
    ]
    records = []
    if jobs > 1:
        from concurrent.futures import ProcessPoolExecutor

        with ProcessPoolExecutor(min(jobs, len(tasks))) as pool:
            for record in pool.map(_run_task, tasks, chunksize=4):
                records.append(record)
                if progress:
                    progress()
    else:
        for task in tasks:
            records.append(_run_task(task))
            if progress:
                progress()
    doc: dict[str, Any] = {
        "benchmark": "robustness",
        "default": default_policy,
        "baselines": list(policies),
        "instances_per_family": instances,
        "seed": seed,
        "oversubscription_slowdown": oversubscription,
        "warm_gpus": "once" if warm_gpus is True else warm_gpus,
        "families": {
            f: family_summary([r for r in records if r["family"] == f], policies) for f in families
        },  # fmt: skip
        "worst": write_worst(records, out, worst, warm_gpus, oversubscription) if out else [],
        "instances": [{k: v for k, v in r.items() if k != "_instance"} for r in records],
    }
    doc["wall_s"] = time.perf_counter() - t0
    return doc


def _share(value: float) -> str:
    """A share as the tables print it: a whole percentage, or ``-`` where it is undefined
    (NaN: no instance compared, e.g. the default rejected an action of every one), as the
    tables print every NaN; it printed ``nan%``."""
    return "-" if math.isnan(value) else f"{value:.0%}"


def tables(doc: dict[str, Any]) -> dict[str, list[dict[str, Any]]]:
    """The document as tables for a person (each fits 100 columns)."""
    beaten, ratios = [], []
    for family, s in doc["families"].items():
        for key, label in METRICS.items():
            top = ", ".join(f"{w['policy']} {w['instances']}" for w in s["winners"][key])
            beaten.append(
                {
                    "family": family,
                    "figure": label,
                    "n": s["compared"],
                    **{f"beaten {m}": _share(v) for m, v in s["beaten"][key].items()},
                    "most wins >5% (instances)": top or "-",
                }
            )
        beaten.append(
            {
                "family": family,
                "figure": "mean ACT and step, one baseline",
                "n": s["compared"],
                **{f"beaten {m}": _share(v) for m, v in s["dominated"].items()},
                "most wins >5% (instances)": "-",
            }
        )
        for name, label in (
            ("act_over_lower_bound", "ACT / lower-bound"),
            ("act_over_capacity_bound", "ACT / capacity bound"),
            ("step_over_lower_bound", "step / lower-bound"),
            ("step_over_capacity_bound", "step / capacity bound"),
        ):
            q = s["ratios"][name]
            ratios.append({"family": family, "default's": label, **q})
    in_place = []
    for family, s in doc["families"].items():
        for key in ("act_mean_s", "step_s"):
            shares = {
                p: v["beaten"][key][">5%"]
                for p, v in s["baselines_in_place"].items()
                if v["compared"] and not math.isnan(v["beaten"][key][">5%"])
            }
            if not shares:
                continue
            top = min(shares, key=lambda p: (shares[p], p))
            in_place.append(
                {
                    "family": family,
                    "figure": METRICS[key],
                    f"{doc['default']} beaten >5%": _share(s["beaten"][key][">5%"]),
                    "most robust baseline": top,
                    "its share beaten >5%": _share(shares[top]),
                    "baselines meeting 5%": sum(v <= 0.05 for v in shares.values()),
                }
            )
    out = {
        f"instances where a baseline beats {doc['default']} by more than 5% / 20%": beaten,
        "each baseline in the default's place (beaten by the other baselines)": in_place,
        f"{doc['default']} over the floors (p50, p90, max over instances)": ratios,
    }
    if doc["worst"]:
        out["worst instances (replay with the command in --json's worst[].replay)"] = [
            {
                "family": w["family"],
                "seed": w["seed"],
                "baseline": w["baseline"],
                "figure": METRICS[w["figure"]],
                "margin": f"{w['margin']:+.0%}",
                "trace": w["trace"],
            }
            for w in doc["worst"]
        ]
    return out


def slowdown_share(text: str) -> float:
    """An argparse type for ``--oversubscription``: a share in [0, 1). NaN or 1 was taken and
    refused after the progress bar had started, as "oversubscription must lie in [0, 1)",
    naming no flag."""
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a number") from None
    if not 0.0 <= value < 1.0:  # (NaN compares false)
        raise argparse.ArgumentTypeError(f"must be a share in [0, 1), got {text}")
    return value


def register(sub: argparse._SubParsersAction) -> None:
    from tangram.sim.config import WARM_GPUS_FLAG, policy_arg

    p = sub.add_parser(
        "robustness",
        help="random instances where a static baseline may beat the default policy",
    )
    p.add_argument(
        "--instances",
        type=int_in(1, INSTANCES_MAX, "each replays every policy: more runs for days"),
        default=DEFAULT_INSTANCES,
        help=f"instances per family (default {DEFAULT_INSTANCES}; at most {INSTANCES_MAX:,})",
    )
    p.add_argument(
        "--seed", type=non_negative_int, default=0, help="instance i has seed SEED + i (>= 0)"
    )
    p.add_argument(
        "--families",
        default="cpu,gpu,mixed",
        help="comma-separated families of the random workload (default cpu,gpu,mixed)",
    )
    p.add_argument(
        "--out", type=path_arg, help="write the worst instances here as trace + cluster files"
    )
    p.add_argument(
        "--worst",
        type=positive_int,
        default=DEFAULT_WORST,
        help=f"worst instances written per family (default {DEFAULT_WORST})",
    )
    p.add_argument(
        "--default",
        type=policy_arg,
        default=DEFAULT_POLICY,
        metavar="POLICY",
        help=f"the policy the baselines are set against (default {DEFAULT_POLICY}; e.g. "
        "tangram:128 to try a wider window)",
    )
    p.add_argument(
        "--jobs",
        type=int_in(1, JOBS_MAX, "each is a process started at once; more cores are rare"),
        default=1,
        help="worker processes (default 1; the figures are the same for any number; at most "
        f"{JOBS_MAX})",
    )
    p.add_argument(
        "--oversubscription",
        type=slowdown_share,
        default=0.0,
        metavar="SHARE",
        help="share of speed threads lose while they outnumber their cores, in [0, 1): "
        "charged to burstable pods and to the default's told threads alike (default 0: "
        "time-slicing is free)",
    )
    p.add_argument(
        "--warm-gpus",
        choices=tuple(WARM_GPUS_FLAG),
        default="once",
        help="what every policy's GPUs hold at the start: each service once (default), the "
        "replicas sglang-sized sizes from the declared demand (its head start, given to all), "
        "or nothing",
    )
    p.add_argument("--quiet", action="store_true", help="no progress bar")
    add_json_flag(p)
    p.set_defaults(func=_main)


def replayed(doc: dict[str, Any]) -> set[str]:
    """The policies each instance replays: the default, ``lower-bound`` and the baselines, each
    once (a default that is one of them, ``--default fixed:1``, was counted twice)."""
    return {doc["default"], "lower-bound", *doc["baselines"]}


def _main(args: argparse.Namespace) -> int:
    from tqdm import tqdm

    from tangram.sim.config import WARM_GPUS_FLAG
    from tangram.sim.metrics import check_out_dir

    families = family_list(args.families)
    if args.out:
        check_out_dir(args.out)  # the worst instances are written after every replay
    bar = tqdm(
        total=args.instances * len(families),
        unit="instance",
        disable=args.quiet or args.json,
        leave=False,
    )
    doc = run_bench(
        instances=args.instances,
        seed=args.seed,
        families=families,
        out=args.out,
        worst=args.worst,
        default_policy=args.default,
        progress=lambda: bar.update(1),
        jobs=args.jobs,
        oversubscription=args.oversubscription,
        warm_gpus=WARM_GPUS_FLAG[args.warm_gpus],
    )
    bar.close()
    emit(args.json, doc, tables(doc))
    if not args.json:
        print(
            f"\n{len(families)} families x {args.instances} instances, "
            f"{len(replayed(doc))} policies each; wall {doc['wall_s']:.1f} s"
        )
    return 0
