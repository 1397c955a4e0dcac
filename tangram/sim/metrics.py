"""Tables from a simulation: per action, per trajectory, per step, the usage timeline, a summary.

Definitions (docs/metrics.md gives them with symbols):
- ACT = finish - arrival = queue + overhead + execution, for actions that ran.
- busy resource-seconds = sum over actions of units x execution time (per resource type).
- held resource-seconds = integral over time of the units taken from the free pool (by running
  actions, their overheads, and static reservations such as pods and dedicated GPUs).
- provisioned resource-seconds = the cluster's capacity x makespan: what a dedicated pool costs.
- cost = provisioned core-hours and GPU-hours at the cluster's prices (plus API calls).
"""

from __future__ import annotations

import dataclasses
from typing import Any

import numpy as np
import pandas as pd

from tangram.sim.driver import SimResult, StepRecord, TrajectoryRecord


def actions_frame(result: SimResult) -> pd.DataFrame:
    rows = []
    for r in result.actions:
        ran = r.outcome == "result"
        rows.append(
            {
                "action_id": r.row.action_id,
                "trajectory": r.row.trajectory,
                "step": r.row.step,
                "position": r.row.position,
                "task": r.row.task,
                "kind": r.row.kind,
                "resource": r.row.resource,
                "service": r.row.service,
                "arrival": r.arrival,
                "start": r.start,
                "finish": r.finish,
                "queue_s": (r.start - r.arrival) if ran else np.nan,
                "overhead_s": r.overhead if ran else np.nan,
                "exec_s": r.execution if ran else np.nan,
                "act_s": (r.finish - r.arrival) if ran else np.nan,
                "units": r.units,
                "node": r.node,
                "restored": r.restored,
                "evictions": r.evictions,
                "deferrals": r.deferrals,
                "outcome": r.outcome,
                "reason": r.reason,
                "t1_s": r.row.t1_s,
                "max_units": r.row.max_units,
            }
        )
    # (The columns are named even with no row: a frame without them, for a run of no action,
    # failed in summary and by_kind with KeyError 'outcome' and wrote a Parquet file of none.)
    return pd.DataFrame(rows, columns=ACTION_COLUMNS)


#: The columns of :func:`actions_frame`, in order.
ACTION_COLUMNS = [
    "action_id",
    "trajectory",
    "step",
    "position",
    "task",
    "kind",
    "resource",
    "service",
    "arrival",
    "start",
    "finish",
    "queue_s",
    "overhead_s",
    "exec_s",
    "act_s",
    "units",
    "node",
    "restored",
    "evictions",
    "deferrals",
    "outcome",
    "reason",
    "t1_s",
    "max_units",
]


def trajectories_frame(result: SimResult) -> pd.DataFrame:
    columns = [f.name for f in dataclasses.fields(TrajectoryRecord)]
    df = pd.DataFrame([vars(t) for t in result.trajectories], columns=columns)
    df["duration_s"] = df["end"] - df["start"]
    return df


def steps_frame(result: SimResult) -> pd.DataFrame:
    columns = [f.name for f in dataclasses.fields(StepRecord)]
    df = pd.DataFrame([vars(s) for s in result.steps], columns=columns)
    df["rollout_s"] = df["rollout_end"] - df["start"]
    df["duration_s"] = df["end"] - df["start"]
    return df


def timeline_frame(result: SimResult) -> pd.DataFrame:
    """Cluster usage as a step function: each row holds from its time until the next row's.

    Held units come from the scheduler's state after each event; busy units (executing, after
    any overhead) from the action records, so execution starts that are not scheduler events
    get rows of their own. Where held units were not sampled (``SimResult.held_sampled``:
    the timeline off, or a policy that ignores capacity) they are NaN, not 0: the Parquet
    file and the figure showed ``lower-bound`` holding nothing while it ran its actions.
    """
    held = pd.DataFrame(result.timeline.columns())
    held = held.drop_duplicates("time", keep="last").astype(float)
    changes = {}
    for resource, column in (("cpu", "busy_cores"), ("gpu", "busy_gpus")):
        runs = [r for r in result.actions if r.outcome == "result" and r.row.resource == resource]
        changes[column] = [(r.start + r.overhead, r.units) for r in runs] + [
            (r.finish, -r.units) for r in runs
        ]
    times = np.unique(
        np.concatenate([held["time"].to_numpy(), [t for c in changes.values() for t, _ in c]])
    )
    df = pd.DataFrame({"time": times.astype(float)})
    df = pd.merge_asof(df, held, on="time", direction="backward").fillna(0)
    for column, deltas in changes.items():
        step = (
            pd.Series(dict(pd.DataFrame(deltas, columns=["t", "d"]).groupby("t")["d"].sum()))
            if deltas
            else pd.Series(dtype=float)
        )
        df[column] = df["time"].map(step).fillna(0).cumsum()
    if not result.held_sampled:  # (a policy that ignores capacity: nothing was sampled)
        df[["held_cores", "held_gpus", "api_in_flight"]] = np.nan
    return df


def _integral(df: pd.DataFrame, column: str, end: float) -> float:
    if df.empty:
        return 0.0
    t = df["time"].to_numpy()
    widths = np.diff(np.append(t, max(end, t[-1])))
    return float((df[column].to_numpy() * widths).sum())


def summary(
    result: SimResult, *, actions: pd.DataFrame | None = None, timeline: pd.DataFrame | None = None
) -> dict[str, Any]:
    """One row of figures for the comparison table."""
    acts = actions_frame(result) if actions is None else actions
    ran = acts[acts["outcome"] == "result"]
    steps = steps_frame(result)
    tl = timeline_frame(result) if timeline is None else timeline
    c = result.cluster
    horizon = result.makespan
    cpu, gpu = ran[ran["resource"] == "cpu"], ran[ran["resource"] == "gpu"]
    busy_core_s = float((cpu["units"] * cpu["exec_s"]).sum())
    busy_gpu_s = float((gpu["units"] * gpu["exec_s"]).sum())
    prov_core_s, prov_gpu_s = c.total_cores * horizon, c.total_gpus * horizon
    api_calls = int((ran["resource"] == "api").sum())
    cost = (
        prov_core_s / 3600 * c.prices.cpu_core_hour
        + prov_gpu_s / 3600 * c.prices.gpu_hour
        + api_calls * c.prices.api_call
    )
    act = ran["act_s"]
    return {
        "policy": result.policy,
        "actions": int(len(acts)),
        "rejected": int((acts["outcome"] == "rejected").sum()),
        "act_mean_s": float(act.mean()) if len(act) else np.nan,
        "act_p50_s": float(act.quantile(0.5)) if len(act) else np.nan,
        "act_p95_s": float(act.quantile(0.95)) if len(act) else np.nan,
        "act_p99_s": float(act.quantile(0.99)) if len(act) else np.nan,
        "queue_mean_s": float(ran["queue_s"].mean()) if len(ran) else np.nan,
        "overhead_mean_s": float(ran["overhead_s"].mean()) if len(ran) else np.nan,
        "exec_mean_s": float(ran["exec_s"].mean()) if len(ran) else np.nan,
        "step_mean_s": float(steps["duration_s"].mean()) if len(steps) else np.nan,
        "makespan_s": horizon,
        "busy_core_s": busy_core_s,
        "busy_gpu_s": busy_gpu_s,
        # Held units are sampled on the timeline; without it (or under a policy that ignores
        # capacity, which takes nothing from the pool) they are unknown, not zero.
        "held_core_s": _integral(tl, "held_cores", horizon) if result.held_sampled else np.nan,
        "held_gpu_s": _integral(tl, "held_gpus", horizon) if result.held_sampled else np.nan,
        "provisioned_core_s": prov_core_s,
        "provisioned_gpu_s": prov_gpu_s,
        "cost_usd": cost,
    }


def by_kind(result: SimResult) -> pd.DataFrame:
    """ACT and its breakdown per (task, kind)."""
    ran = actions_frame(result).query("outcome == 'result'")
    return (
        ran.groupby(["resource", "kind"])
        .agg(
            actions=("act_s", "size"),
            act_mean_s=("act_s", "mean"),
            act_p99_s=("act_s", lambda s: s.quantile(0.99)),
            queue_mean_s=("queue_s", "mean"),
            overhead_mean_s=("overhead_s", "mean"),
            exec_mean_s=("exec_s", "mean"),
            units_mean=("units", "mean"),
        )
        .reset_index()
    )


def check_out_dir(out_dir: Any) -> None:
    """Refuse an output directory :func:`write_results` could not create or write, before a
    run rather than after it: the path, or the first of its parents that exists, must be a
    writable directory. Raises ValueError naming the path."""
    import os
    from pathlib import Path

    out = Path(out_dir)
    for path in (out, *out.parents):
        if not path.exists():
            continue
        if not path.is_dir():
            raise ValueError(f"--out {out}: {path} exists and is not a directory")
        if not os.access(path, os.W_OK | os.X_OK):
            raise ValueError(f"--out {out}: directory {path} is not writable")
        return


def write_results(
    result: SimResult,
    out_dir: Any,
    *,
    actions: pd.DataFrame | None = None,
    timeline: pd.DataFrame | None = None,
) -> dict[str, str]:
    """Per-action, per-trajectory, per-step and timeline tables as Parquet in ``out_dir``."""
    from pathlib import Path

    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    tag = result.policy.replace(":", "-")
    paths = {}
    for name, frame in (
        ("actions", actions_frame(result) if actions is None else actions),
        ("trajectories", trajectories_frame(result)),
        ("steps", steps_frame(result)),
        ("timeline", timeline_frame(result) if timeline is None else timeline),
    ):
        path = out / f"{tag}.{name}.parquet"
        # Through a file Python opens: pyarrow encodes a path as strict UTF-8, so an --out
        # holding a byte the locale cannot decode (a surrogate escape) failed as "surrogates
        # not allowed" once the run was done.
        with open(path, "wb") as fh:
            frame.to_parquet(fh, index=False)
        paths[name] = str(path)
    return paths
