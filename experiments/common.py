"""Shared machinery of the experiment scripts: run simulations over seeds, aggregate, write outputs.

Every script in ``experiments/`` reproduces one claim of the ARL-Tangram paper. It builds a list
of ``Job``s (one generated trace each, replayed under one or more ``Variant``s: policy, cluster
size, simulation options), runs them with ``run_jobs`` (a process pool, a tqdm bar), and writes:

- ``results/<name>_runs.csv``: one row per (trace, variant, seed): ``tangram.sim.metrics.summary``
  plus per-kind figures (``env_act_mean_s``...) and the run's parameters;
- ``results/<name>.csv``: mean and std over seeds of the figures that matter for the claim;
- ``results/<name>.png``: the figure;
- ``results/<name>.md``: the claim, the paper's figure beside ours, why they differ, the command.
- ``results/<name>.claims.csv``: the key rows (claim, paper, ours) that ``run_all.py`` gathers
  into ``docs/experiments.md``.

Command-line flags shared by all scripts (``parse_args``): ``--seeds N`` (default 3),
``--workers N`` (default ``$TANGRAM_WORKERS`` or 2), ``--out DIR`` (default
``experiments/results``), ``--smoke`` (batch 32, one seed, for the tests; also
``TANGRAM_SMOKE=1``), ``--policy NAME`` (the elastic policy a variant named ``tangram`` runs:
``tangram-paper``, the paper's, by default; ``run_all.py`` runs each reproduction a second time
with ``--policy tangram``, the default policy, into ``results/default/``).
"""

from __future__ import annotations

import argparse
import functools
import math
import multiprocessing
import os
import sys
import time
from collections.abc import Callable, Iterable, Sequence
from concurrent.futures import ProcessPoolExecutor, as_completed
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402
import numpy as np  # noqa: E402
import pandas as pd  # noqa: E402
from tqdm import tqdm  # noqa: E402

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent
RESULTS = HERE / "results"
DEFAULT_SEEDS = 3
#: The policy the variants named ``tangram`` run (``--policy``): the paper's by default, so the
#: scripts reproduce the paper's claims; ``run_all.py`` also runs them under the default policy.
PAPER_POLICY = "tangram-paper"
ELASTIC = PAPER_POLICY


def resolve(policy: str) -> str:
    """The policy a variant runs: ``tangram`` stands for ``ELASTIC`` (set by ``--policy``)."""
    return ELASTIC if policy == "tangram" else policy


#: Figures every run reports (from ``summary``), in the order the CSVs list them.
SUMMARY_COLUMNS = [
    "actions",
    "rejected",
    "act_mean_s",
    "act_p50_s",
    "act_p95_s",
    "act_p99_s",
    "queue_mean_s",
    "overhead_mean_s",
    "exec_mean_s",
    "step_mean_s",
    "makespan_s",
    "busy_core_s",
    "held_core_s",
    "provisioned_core_s",
    "busy_gpu_s",
    "held_gpu_s",
    "provisioned_gpu_s",
    "cost_usd",
]


# --------------------------------------------------------------------------- jobs
@dataclass(frozen=True)
class Variant:
    """One way to replay a trace: a policy on a cluster, with simulation options.

    ``gpus``: total GPUs (``cluster.scaled_gpus``); ``cpu_nodes``: CPU node count
    (``cluster.scaled``); ``label`` names the variant in tables (default: the policy).
    ``clock``: time the scheduler with ``time.perf_counter`` (per-event latencies).
    """

    policy: str
    label: str = ""
    gpus: int | None = None
    cpu_nodes: int | None = None
    train_s: float = 0.0
    timeline: bool = True
    clock: bool = False
    extra: tuple[tuple[str, Any], ...] = ()
    #: ``tangram.sim.config.Overheads`` fields to change (e.g. ``(("pod_start_s", 30.0),)``).
    overheads: tuple[tuple[str, Any], ...] = ()
    #: ``tangram.sim.config.RolloutConfig`` fields to change (``train_s`` has its own field).
    rollout: tuple[tuple[str, Any], ...] = ()

    @property
    def name(self) -> str:
        return self.label or self.policy


@dataclass(frozen=True)
class Job:
    """One generated trace (workload, batch, seed, parameter overrides) and its variants."""

    workload: str
    batch: int
    seed: int
    variants: tuple[Variant, ...]
    steps: int = 1
    overrides: tuple[tuple[str, Any], ...] = ()
    #: Write per-action and timeline Parquet of these variant names here (small: trimmed columns).
    save_dir: str | None = None
    save_variants: tuple[str, ...] = ()
    tags: tuple[tuple[str, Any], ...] = ()


@functools.lru_cache(maxsize=1)
def _cluster(name: str = "paper"):
    from tangram.core import load_cluster

    return load_cluster(name)


def cluster_for(variant: Variant):
    cluster = _cluster()
    if variant.cpu_nodes is not None:
        cluster = cluster.scaled(cpu_nodes=variant.cpu_nodes)
    if variant.gpus is not None:
        cluster = cluster.scaled_gpus(variant.gpus)
    return cluster


def _run_keys(job: Job, v: Variant, cluster) -> dict[str, Any]:
    """The columns that say which run a row is: the job, the variant and their settings."""
    return {
        "workload": job.workload,
        "batch": job.batch,
        "seed": job.seed,
        "steps": job.steps,
        "variant": v.name,
        "policy": resolve(v.policy),
        "gpus": cluster.total_gpus,
        "cores": cluster.total_cores,
        **dict(job.overrides),
        **dict(job.tags),
        **dict(v.extra),
        **{f"overheads.{k}": val for k, val in v.overheads},
        **{f"rollout.{k}": val for k, val in v.rollout},
    }


def _stalled_row(job: Job, v: Variant, cluster, reason: str) -> dict[str, Any]:
    """The row of a run that stalled (e.g. pods held at a step barrier): no figures, the reason."""
    return {
        **_run_keys(job, v, cluster),
        **dict.fromkeys(SUMMARY_COLUMNS, np.nan),
        "stalled": reason,
    }


def _kind_columns(result) -> dict[str, Any]:
    from tangram.sim.metrics import by_kind

    out: dict[str, Any] = {}
    for row in by_kind(result).to_dict("records"):
        k = row["kind"]
        for col in (
            "actions",
            "act_mean_s",
            "act_p99_s",
            "queue_mean_s",
            "overhead_mean_s",
            "exec_mean_s",
            "units_mean",
        ):
            out[f"{k}_{col}"] = row[col]
    return out


class _TimedScheduler:
    """Wraps a scheduler's ``advance`` and ``tick`` (instance attributes, the class is untouched)
    to record the wall time of each call: the decision latency a live system pays per event."""

    def __init__(self, scheduler) -> None:
        self.samples: list[float] = []
        self.decisions: list[int] = []
        for name in ("advance", "tick"):
            setattr(scheduler, name, self._wrap(getattr(scheduler, name)))

    def _wrap(self, fn: Callable) -> Callable:
        def timed(*args, **kwargs):
            t0 = time.perf_counter()
            out = fn(*args, **kwargs)
            self.samples.append(time.perf_counter() - t0)
            self.decisions.append(len(out) if out is not None else 0)
            return out

        return timed


def _slim_actions(result) -> pd.DataFrame:
    """The per-action columns the notebook needs, in compact types (small Parquet)."""
    from tangram.sim.metrics import actions_frame

    df = actions_frame(result)
    df = df[df["outcome"] == "result"]
    out = pd.DataFrame(
        {
            "policy": pd.Categorical([result.policy] * len(df)),
            "kind": pd.Categorical(df["kind"]),
            "resource": pd.Categorical(df["resource"]),
            # rounded to 0.1 ms: ample for CDFs and means, and it compresses 2x better
            "queue_s": df["queue_s"].round(4).astype("float32"),
            "overhead_s": df["overhead_s"].round(4).astype("float32"),
            "exec_s": df["exec_s"].round(4).astype("float32"),
            "act_s": df["act_s"].round(4).astype("float32"),
            "units": df["units"].astype("int16"),
        }
    )
    return out.reset_index(drop=True)


def _slim_timeline(result, resolution_s: float = 1.0) -> pd.DataFrame:
    """Usage over time sampled every ``resolution_s`` (the step function's value there).

    Before the first row nothing is held or busy (0); held units the simulator did not sample
    (a policy that ignores capacity: ``timeline_frame`` has them NaN) stay NaN, unknown.
    """
    from tangram.sim.metrics import timeline_frame

    tl = timeline_frame(result)
    grid = pd.DataFrame({"time": np.arange(0.0, result.makespan + resolution_s, resolution_s)})
    tl = pd.merge_asof(grid, tl.sort_values("time"), on="time", direction="backward").fillna(0)
    if not result.held_sampled:
        tl[["held_cores", "held_gpus", "api_in_flight"]] = np.nan
    tl.insert(0, "policy", result.policy)
    cols = ["held_cores", "held_gpus", "busy_cores", "busy_gpus", "api_in_flight"]
    tl[cols] = tl[cols].astype("float32")
    tl["time"] = tl["time"].astype("float32")
    return tl


def execute(job: Job) -> list[dict[str, Any]]:
    """Generate the job's trace and replay it under each variant; one row per variant."""
    from tangram.sim.config import Overheads, RolloutConfig, SimConfig
    from tangram.sim.driver import Simulation, SimulationStalled
    from tangram.sim.metrics import summary
    from tangram.sim.workloads import generate

    trace = generate(
        job.workload, batch=job.batch, steps=job.steps, seed=job.seed, **dict(job.overrides)
    )
    rows = []
    for v in job.variants:
        cluster = cluster_for(v)
        config = SimConfig(
            policy=resolve(v.policy),
            seed=job.seed,
            rollout=RolloutConfig(train_s=v.train_s, **dict(v.rollout)),
            timeline=v.timeline,
            overheads=Overheads(**dict(v.overheads)),
        )
        t0 = time.perf_counter()
        sim = Simulation(trace, cluster, config, clock=time.perf_counter if v.clock else None)
        timer = _TimedScheduler(sim.scheduler) if v.clock else None
        try:
            result = sim.run()
        except SimulationStalled as exc:  # a finding, not a crash: reported as stalled
            rows.append(_stalled_row(job, v, cluster, str(exc)))
            continue
        wall = time.perf_counter() - t0
        row: dict[str, Any] = _run_keys(job, v, cluster)
        s = summary(result)
        row.update({k: s[k] for k in SUMMARY_COLUMNS})
        if not v.timeline:  # held figures come from the timeline; without it they are unknown
            row["held_core_s"] = row["held_gpu_s"] = np.nan
        prices = cluster.prices
        row["held_cost_usd"] = (
            row["held_core_s"] / 3600 * prices.cpu_core_hour
            + row["held_gpu_s"] / 3600 * prices.gpu_hour
        )
        row["gpu_cost_usd"] = row["provisioned_gpu_s"] / 3600 * prices.gpu_hour
        traj = [t.end - t.start for t in result.trajectories if t.end is not None]
        row["traj_mean_s"] = float(np.mean(traj)) if traj else np.nan
        row["rollout_mean_s"] = float(
            np.mean([s.rollout_end - s.start for s in result.steps if s.rollout_end is not None])
        )
        row.update(_kind_columns(result))
        row["wall_s"] = wall
        row["decisions"] = result.decisions
        if timer is not None:
            lat = np.array(timer.samples)
            row["sched_seconds_driver"] = result.scheduler_seconds
            row["sched_calls"] = len(lat)
            row["sched_total_s"] = float(lat.sum())
            row["sched_mean_us"] = float(lat.mean() * 1e6) if len(lat) else np.nan
            row["sched_p50_us"] = float(np.quantile(lat, 0.5) * 1e6) if len(lat) else np.nan
            row["sched_p99_us"] = float(np.quantile(lat, 0.99) * 1e6) if len(lat) else np.nan
            row["sched_max_us"] = float(lat.max() * 1e6) if len(lat) else np.nan
            row["sched_per_action_us"] = float(lat.sum() / max(row["actions"], 1) * 1e6)
        if job.save_dir and v.name in job.save_variants:
            out = Path(job.save_dir)
            out.mkdir(parents=True, exist_ok=True)
            stem = f"{job.workload}_b{job.batch}_s{job.seed}_{v.name.replace(':', '-')}"
            _slim_actions(result).to_parquet(
                out / f"{stem}.actions.parquet",
                index=False,
                compression="zstd",
                compression_level=19,
            )
            if v.timeline:
                _slim_timeline(result).to_parquet(
                    out / f"{stem}.timeline.parquet", index=False, compression="zstd"
                )
        rows.append(row)
    return rows


def run_jobs(jobs: Sequence[Job], *, workers: int = 1, desc: str = "runs") -> pd.DataFrame:
    """Run the jobs (in a process pool when ``workers`` > 1), with a progress bar over variants."""
    total = sum(len(j.variants) for j in jobs)
    rows: list[dict[str, Any]] = []
    bar = tqdm(total=total, desc=desc, unit="run", file=sys.stderr, dynamic_ncols=True)
    if workers <= 1 or len(jobs) == 1:
        for job in jobs:
            bar.set_postfix_str(f"{job.workload} b{job.batch} s{job.seed}")
            rows.extend(execute(job))
            bar.update(len(job.variants))
    else:
        ctx = multiprocessing.get_context("fork")
        with ProcessPoolExecutor(max_workers=workers, mp_context=ctx) as pool:
            futures = {pool.submit(execute, job): job for job in jobs}
            for fut in as_completed(futures):
                rows.extend(fut.result())
                bar.update(len(futures[fut].variants))
    bar.close()
    return pd.DataFrame(rows)


# --------------------------------------------------------------------------- aggregation
def aggregate(df: pd.DataFrame, keys: list[str], metrics: Iterable[str]) -> pd.DataFrame:
    """Mean and std over seeds of ``metrics``, grouped by ``keys``: columns ``m_mean``, ``m_std``
    and ``seeds`` (the runs that gave figures), plus ``stalled`` (those that stalled, NaN
    figures) where the runs have that column: counting them in ``seeds`` read "mean over 2
    seeds" of one seed's figure."""
    metrics = [m for m in metrics if m in df.columns]
    g = df.groupby(keys, sort=False)
    out = g[metrics].agg(["mean", "std"])
    out.columns = [f"{m}_{stat}" for m, stat in out.columns]
    if "stalled" in df.columns:
        ran = df["stalled"].isna().rename("_ran")
        out["seeds"] = ran.groupby([df[k] for k in keys], sort=False).sum().astype(int)
        out["stalled"] = g.size() - out["seeds"]
    else:
        out["seeds"] = g.size()
    return out.reset_index()


def paired_ratio(
    df: pd.DataFrame,
    keys: list[str],
    metric: str,
    base: str,
    ours: str,
    *,
    by: str = "variant",
) -> pd.DataFrame:
    """Per seed, ``metric`` of the ``base`` variant over that of ``ours`` (on the same trace),
    then mean and std over seeds, grouped by ``keys``. Columns: keys, ratio_mean, ratio_std, seeds."""
    a = df[df[by] == base].set_index(keys + ["seed"])[metric]
    b = df[df[by] == ours].set_index(keys + ["seed"])[metric]
    r = (a / b).dropna().rename("ratio").reset_index()
    if r.empty:
        return pd.DataFrame(columns=keys + ["ratio_mean", "ratio_std", "seeds"])
    out = r.groupby(keys, sort=False)["ratio"].agg(["mean", "std", "size"]).reset_index()
    return out.rename(columns={"mean": "ratio_mean", "std": "ratio_std", "size": "seeds"})


def pm(mean: float, std: float | None = None, digits: int = 3, unit: str = "") -> str:
    """``mean ± std`` (std omitted when unknown, e.g. one seed)."""
    if mean is None or (isinstance(mean, float) and math.isnan(mean)):
        return "n/a"
    if std is None or (isinstance(std, float) and math.isnan(std)):
        return f"{mean:.{digits}f}{unit}"
    return f"{mean:.{digits}f} ± {std:.{digits}f}{unit}"


def mean_std(values: Iterable[float]) -> tuple[float, float]:
    v = np.asarray([x for x in values if x is not None and not np.isnan(x)], dtype=float)
    if v.size == 0:
        return float("nan"), float("nan")
    return float(v.mean()), float(v.std(ddof=1)) if v.size > 1 else float("nan")


# --------------------------------------------------------------------------- output
def md_table(rows: pd.DataFrame | list[dict[str, Any]], floatfmt: str = ".3f") -> str:
    """A GitHub markdown table (no tabulate dependency)."""
    df = rows if isinstance(rows, pd.DataFrame) else pd.DataFrame(rows)
    cols = [str(c) for c in df.columns]

    def cell(v: Any) -> str:
        if isinstance(v, float | np.floating):
            return "n/a" if np.isnan(v) else format(float(v), floatfmt)
        return str(v).replace("|", "\\|")

    lines = ["| " + " | ".join(cols) + " |", "|" + "|".join("---" for _ in cols) + "|"]
    for rec in df.itertuples(index=False):
        lines.append("| " + " | ".join(cell(v) for v in rec) + " |")
    return "\n".join(lines)


@dataclass
class Claim:
    """One key row: what the paper says, what we measured."""

    claim: str
    metric: str
    paper: str
    ours: str
    ours_mean: float = float("nan")
    ours_std: float = float("nan")
    #: The default policy's figure, where a script runs both policies itself (else ``run_all``
    #: takes it from the script's run under ``--policy tangram``).
    default: str = ""
    default_mean: float = float("nan")


@dataclass
class Report:
    """What a script writes besides its CSVs: the markdown summary and the claims table."""

    name: str
    title: str
    claim: str
    command: str
    setup: list[str] = field(default_factory=list)
    claims: list[Claim] = field(default_factory=list)
    sections: list[tuple[str, str]] = field(default_factory=list)
    differences: list[str] = field(default_factory=list)
    runtime_s: float = 0.0
    settings: dict[str, Any] = field(default_factory=dict)
    #: Say which elastic policy the `tangram` variants ran (off where policies are named).
    elastic_note: bool = True

    def write(self, out: Path) -> Path:
        out.mkdir(parents=True, exist_ok=True)
        lines = [f"# {self.title}", "", f"**Paper's claim.** {self.claim}", ""]
        lines += [f"Command: `{self.command}`", ""]
        lines += (
            []
            if not self.elastic_note
            else [
                f"Elastic policy of this run: `{ELASTIC}` (the variants labelled `tangram` below run it;"
                " `results/` holds the paper's `tangram-paper`, `results/default/` the default"
                " `tangram`).",
                "",
            ]
        )
        if self.setup:
            lines += ["## Setup", ""] + [f"- {s}" for s in self.setup] + [""]
        both = any(c.default for c in self.claims)
        if self.claims:
            lines += [
                "## Paper vs ours",
                "",
                md_table(
                    [
                        # (A script that runs both policies says which column is which.)
                        {"claim": c.claim, "metric": c.metric, "paper": c.paper}
                        | (
                            {"ours, `tangram-paper`": c.ours, "ours, default `tangram`": c.default}
                            if both
                            else {"ours": c.ours}
                        )
                        for c in self.claims
                    ]
                ),
                "",
            ]
        lines += [f"![{self.name}]({self.name}.png)", ""]
        for heading, body in self.sections:
            lines += [f"## {heading}", "", body.rstrip(), ""]
        if self.differences:
            lines += ["## Where we differ from the paper, and why", ""]
            lines += [f"- {d}" for d in self.differences] + [""]
        lines += [
            "## Files",
            "",
            f"- `{self.name}.csv`: mean and std over seeds; `{self.name}_runs.csv`: one row per run;",
            f"  `{self.name}.png`: the figure; `{self.name}.claims.csv`: the rows above.",
            "",
            f"Run time: {self.runtime_s:.0f} s of wall time on this machine"
            + (f" ({self.settings})" if self.settings else "")
            + ".",
            "",
        ]
        path = out / f"{self.name}.md"
        path.write_text("\n".join(lines), encoding="utf-8")
        pd.DataFrame(
            [
                {
                    **asdict(c),
                    "experiment": self.name,
                    "command": self.command,
                    "policy": ELASTIC if self.elastic_note else "",
                }
                for c in self.claims
            ]
        ).to_csv(out / f"{self.name}.claims.csv", index=False)
        record_time(out, self.name, self.runtime_s, self.settings)
        return path


def record_time(out: Path, name: str, wall_s: float, settings: dict[str, Any]) -> None:
    """Keep ``run_times.csv`` in ``out``: one row per experiment, the latest run."""
    path = out / "run_times.csv"
    old = pd.read_csv(path) if path.exists() else pd.DataFrame(columns=["experiment"])
    row = pd.DataFrame([{"experiment": name, "wall_s": round(wall_s, 1), **settings}])
    pd.concat([old[old.experiment != name], row], ignore_index=True).to_csv(path, index=False)


def save_figure(fig, out: Path, name: str) -> Path:
    out.mkdir(parents=True, exist_ok=True)
    path = out / f"{name}.png"
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)
    return path


def write_tables(out: Path, name: str, runs: pd.DataFrame, agg: pd.DataFrame) -> None:
    out.mkdir(parents=True, exist_ok=True)
    runs.to_csv(out / f"{name}_runs.csv", index=False, float_format="%.6g")
    agg.to_csv(out / f"{name}.csv", index=False, float_format="%.6g")


# --------------------------------------------------------------------------- command line
@dataclass
class Args:
    seeds: list[int]
    workers: int
    out: Path
    smoke: bool
    argv: list[str]
    policy: str = PAPER_POLICY


def parse_args(description: str, argv: Sequence[str] | None = None) -> Args:
    from tangram.report import path_arg, positive_int  # --seeds 0: an error naming it

    p = argparse.ArgumentParser(description=description)
    p.add_argument(
        "--seeds", type=positive_int, default=DEFAULT_SEEDS, help="seeds 0..N-1 (default 3)"
    )
    p.add_argument(
        "--workers",
        type=positive_int,
        default=None,  # $TANGRAM_WORKERS, checked below, or 2
        help="processes (default $TANGRAM_WORKERS or 2)",
    )
    p.add_argument("--out", type=path_arg, default=RESULTS, help="output folder")
    p.add_argument(
        "--smoke",
        action="store_true",
        default=os.environ.get("TANGRAM_SMOKE", "") not in ("", "0"),
        help="tiny configuration for tests: batch 32, one seed",
    )
    p.add_argument(
        "--policy",
        default=PAPER_POLICY,
        help="the elastic policy the `tangram` variants run (default: the paper's, tangram-paper)",
    )
    a = p.parse_args(argv)
    if a.workers is None:  # int() of a bad value was a traceback; 0 or -2 bypassed the check
        env = os.environ.get("TANGRAM_WORKERS")
        try:
            a.workers = min(2, os.cpu_count() or 1) if env is None else positive_int(env)
        except argparse.ArgumentTypeError as exc:
            p.error(f"TANGRAM_WORKERS={env!r} (the default of --workers): {exc}")
    from tangram.core.policies import make_policy

    try:  # an unknown name failed inside the first run, as a traceback
        make_policy(a.policy)
    except ValueError as exc:
        p.error(f"--policy {a.policy}: {exc}")
    global ELASTIC
    ELASTIC = a.policy
    seeds = list(range(1 if a.smoke else a.seeds))
    return Args(
        seeds, 1 if a.smoke else a.workers, a.out, a.smoke, list(argv or sys.argv[1:]), a.policy
    )


def command(script: str) -> str:
    """The command that reproduces a script's run (``--policy`` when not the paper's)."""
    policy = "" if ELASTIC == PAPER_POLICY else f" --policy {ELASTIC}"
    return f"python experiments/{script}{policy}"
