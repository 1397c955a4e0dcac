"""``tangram replay TRACE``: replay a recorded live run in the simulator and compare ACTs.

A live trace (``tangram serve`` / the live runtime) carries, for every action, its observed
submission time and the queueing, overhead and execution times it had. The replay:

1. keeps the actions that started (an action refused or ended while queued held nothing);
2. replays them **open loop at their observed arrivals**, on the cluster and under the
   policy recorded in the trace header (``--cluster`` / ``--policy`` override);
3. sets the simulator's overheads from what was measured live: ``aoe_grant_s`` = mean
   observed overhead of CPU actions, ``api_call_s`` = mean observed overhead of API actions,
   the GPU restore cost from EOE's restore figures in the header; the median observed GPU
   overhead (a hit's dispatch cost) is folded into each GPU call's duration, except for the
   services of a ``--gpu-calibration`` record (``tangram calibrate gpu``), whose measured
   dispatch overhead, restore and slow-down for the host cores busy at the call's start
   (declared curves only: observed times already hold it) price their calls;
4. takes execution times either from what was observed (``--durations observed``, default:
   each action's curve rescaled so that T(units granted live) = observed execution) or from
   the curves the clients declared (``--durations curve``: the simulator's own prediction),
   then with the spread of the observed times around the curves as the simulator's
   log-normal execution noise (``exec_noise_sigma``, measured; ``--exec-noise`` overrides),
   since queues grow with the variance of service times, not only with their mean (one
   spread for all actions; ``--noise per-resource``: GPU calls and the other actions each
   their own, measured); with
   noise the simulation runs ``--runs`` times (seeds) and its percentiles are averaged;
5. reports ACT percentiles (p50, p90, p95, p99, mean) live and simulated, and the relative
   error (sim - live) / live of each, overall and per resource.

GPUs start cold, as EOE does, unless the header lists services resident when the recording
began (``gpu_residency_at_start``, after a warm-up): then the simulator starts warm.
Trajectory memory is left out of the replay: live, a container's memory is reserved when the
trajectory opens, before its actions arrive, so it never delays an action; the open-loop
simulator would reserve it at the first action instead. An action that ended with a result
live but not in the simulation (rejected there, e.g. a service no cell of ``--cluster`` holds)
is left out of the comparison and counted with its reason (``left_out``).
"""

from __future__ import annotations

import argparse
import dataclasses
import math
import statistics
import sys
import textwrap
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from tangram.report import add_json_flag, emit, path_arg, positive_int
from tangram.sim.config import policy_arg
from tangram.trace import TraceError, load_trace
from tangram.trace.calibrate import (
    DURATIONS,
    MIN_SECONDS,
    PERCENTILES,
    Measured,
    measure,
    percentiles,
    relative_error,
    replay_trace,
    warm_at_start,
)
from tangram.trace.gpu_calibration import GpuCalibration, load_gpu_calibration

#: How the replay spreads execution times around the declared curves.
NOISE_MODELS = ("per-resource", "pooled")
#: Most noisy simulations one replay averages (``--runs``). The average's seed-to-seed error
#: falls as 1/sqrt(runs): at 1,000 it is about 3% of one run's, below what any more runs could
#: show; past it runs only multiply the time (10**9 runs of a trace ran for days, unbounded).
RUNS_MAX = 1_000

__all__ = [
    "DURATIONS",
    "MIN_SECONDS",
    "PERCENTILES",
    "Measured",
    "ReplayReport",
    "main",
    "measure",
    "percentiles",
    "register",
    "relative_error",
    "replay",
    "replay_trace",
]


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser(
        "replay",
        help="replay a recorded live trace in the simulator and report the ACT error",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    p.add_argument("trace", type=path_arg, help="a live trace (.jsonl, .jsonl.gz, .parquet)")
    p.add_argument(
        "--policy",
        type=policy_arg,  # (an unknown one failed after the trace was read, naming no flag)
        help="policy (default: the one recorded in the trace)",
    )
    p.add_argument("--cluster", help="bundled name or TOML path (default: the recorded one)")
    p.add_argument(
        "--durations",
        choices=DURATIONS,
        default="observed",
        help="execution times: observed live (default), the declared curves, or the "
        "declared curves for GPU calls only (gpu-curve: the GPU call model alone)",
    )
    p.add_argument("--grant-s", type=float, help="override the CPU overhead per action (s)")
    p.add_argument("--api-call-s", type=float, help="override the API overhead per call (s)")
    p.add_argument(
        "--runs",
        type=runs_count,
        default=None,
        help=f"simulations averaged when execution noise is on (default 10; 1 to {RUNS_MAX:,}); "
        "without noise the simulation is deterministic and runs once",
    )
    p.add_argument(
        "--exec-noise",
        type=float,
        help="log-normal sigma of execution around the curves (default: measured with "
        "--durations curve, 0 with observed)",
    )
    p.add_argument(
        "--noise",
        choices=NOISE_MODELS,
        default="pooled",
        help="with --durations curve: one measured spread for all actions (default) or each "
        "resource's own (GPU calls spread more than CPU work)",
    )
    p.add_argument(
        "--gpu-calibration",
        type=path_arg,
        action="append",
        default=[],
        metavar="PATH",
        help="a GPU call model measured by `tangram calibrate gpu` (JSON/TOML; repeatable, "
        "one per service): prices that service's calls in the simulation",
    )
    add_json_flag(p)
    p.set_defaults(func=main)


def runs_count(text: str) -> int:
    """An argparse type for ``--runs``: an integer in [1, ``RUNS_MAX``]."""
    runs = positive_int(text)
    if runs > RUNS_MAX:
        raise argparse.ArgumentTypeError(_runs_reason(runs))
    return runs


def _runs_reason(runs: object) -> str:
    """Why ``runs`` is refused: the bound and its reason, for the flag and the API alike."""
    return (
        f"must be an integer in [1, {RUNS_MAX:,}] (more seeds change the averaged "
        f"percentiles by less than their seed-to-seed error; they only take longer), "
        f"got {runs!r}"
    )


@dataclass(frozen=True)
class ReplayReport:
    """Live vs simulated ACT for the actions that ended with a result in both."""

    trace: str
    policy: str
    cluster: str
    durations: str
    actions: int
    measured: Measured
    live: dict[str, float]
    sim: dict[str, float]
    error: dict[str, float]
    by_resource: dict[str, dict[str, dict[str, float]]] = field(default_factory=dict)
    parts: dict[str, dict[str, float]] = field(default_factory=dict)
    #: Simulations averaged (several seeds when execution noise is on).
    sim_runs: int = 1
    #: Actions that ended with a result live but not in a simulation (rejected there: e.g. a
    #: service that fits no cell of ``--cluster``), left out of the comparison: reason ->
    #: count (the first run's reasons).
    left_out: dict[str, int] = field(default_factory=dict)

    def as_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)


def replay(
    trace_path: str | Path,
    *,
    policy: str | None = None,
    cluster: str | None = None,
    durations: str = "observed",
    grant_s: float | None = None,
    api_call_s: float | None = None,
    exec_noise: float | None = None,
    runs: int = 10,
    noise: str = "pooled",
    gpu_calibrations: Sequence[GpuCalibration] = (),
) -> ReplayReport:
    """Replay a live trace and compare its ACTs with the simulation's.

    With execution noise the simulation is run ``runs`` times (seeds 0..runs-1) and its
    percentiles are averaged: a prediction, not one random draw. ``gpu_calibrations``
    (``tangram calibrate gpu``) price their services' GPU calls in the simulator: dispatch
    overhead, restore, call time vs cell size and host load (see ``tangram.sim.gpu_model``)."""
    from tangram.core.cluster_file import load_cluster, parse_cluster
    from tangram.sim.config import Overheads, RolloutConfig, SimConfig
    from tangram.sim.driver import simulate
    from tangram.sim.metrics import actions_frame

    if isinstance(runs, bool) or not isinstance(runs, int) or not 1 <= runs <= RUNS_MAX:
        raise ValueError(f"runs {_runs_reason(runs)}")
    for flag, name, value in (
        ("--grant-s", "aoe_grant_s", grant_s),
        ("--api-call-s", "api_call_s", api_call_s),
        ("--exec-noise", "exec_noise_sigma", exec_noise),
    ):
        if value is None:
            continue
        try:  # (the error named overheads.aoe_grant_s, a setting the user never gave, and
            # only once the trace was read and measured)
            Overheads(**{name: value})
        except ValueError as exc:
            raise ValueError(f"{flag} {value!r}: {exc}") from None
    trace = load_trace(trace_path)
    meta = trace.meta
    if policy is not None and not policy.strip():  # it fell back to the header's, silently
        raise ValueError("--policy is empty; give a policy name, or leave it out for the header's")
    if policy is None:
        policy = meta.get("policy")
    if not policy:
        raise ValueError(f"{trace_path}: the header names no policy; give --policy")
    if not isinstance(policy, str):  # a number there was an AttributeError in the parser
        raise ValueError(
            f"{trace_path}: the header's 'policy' must be a policy name, got {policy!r}; "
            "give --policy"
        )
    if cluster is not None:
        spec = load_cluster(cluster)
    elif "cluster" in meta:
        spec = parse_cluster(meta["cluster"], f"{trace_path} (header)")
    else:
        raise ValueError(f"{trace_path}: the header carries no cluster; give --cluster")
    gpu_calibrations = tuple(gpu_calibrations)
    if durations == "observed":  # observed times already include the host's load
        gpu_calibrations = tuple(
            dataclasses.replace(c, host_cpu_node=None, gpu_node=None) for c in gpu_calibrations
        )
    try:
        warm = warm_at_start(meta)
        measured = measure(trace, gpu_calibrations)
    except TraceError as e:  # the header's keys: named, as every trace error is, with the file
        raise e.located(path=trace_path) from None
    if measured.h2d_gbps is not None and spec.gpu_nodes:
        nodes = tuple(
            dataclasses.replace(
                n, h2d_gbps=measured.h2d_gbps, restore_fixed_s=measured.restore_fixed_s or 0.0
            )
            for n in spec.gpu_nodes
        )
        spec = dataclasses.replace(spec, gpu_nodes=nodes)
    calibrated = frozenset(c.service for c in gpu_calibrations)
    sim_trace = replay_trace(trace, measured, durations, calibrated)
    if not sim_trace.rows:
        raise ValueError(f"{trace_path}: no action of this trace ever started")
    if exec_noise is None:
        _require_replayable_spread(trace_path, measured, durations, noise)
    overheads = Overheads(
        aoe_grant_s=measured.cpu_overhead_s if grant_s is None else grant_s,
        container_start_s=0.0,
        eviction_s=measured.eviction_s,
        api_call_s=measured.api_overhead_s if api_call_s is None else api_call_s,
        exec_noise_sigma=(
            exec_noise
            if exec_noise is not None
            # --noise per-resource draws the groups' spreads (below), never the pooled one
            else (measured.exec_noise_sigma if durations == "curve" and noise == "pooled" else 0.0)
        ),
    )
    if noise not in NOISE_MODELS:
        raise ValueError(f"noise must be one of {NOISE_MODELS}, got {noise!r}")
    if noise != "pooled" and (durations != "curve" or exec_noise is not None):
        # It chooses between measured spreads, which only --durations curve draws from and
        # --exec-noise replaces: elsewhere it changed nothing, silently.
        raise ValueError(f"--noise {noise} applies with --durations curve and without --exec-noise")
    traced = {r.service for r in trace.rows if r.resource == "gpu"}
    stray = sorted(calibrated - traced)
    if stray:
        raise ValueError(
            f"--gpu-calibration: no GPU call of {stray} in {trace_path} (its services: "
            f"{sorted(s for s in traced if s)}); a calibration for another service prices nothing"
        )
    if durations == "gpu-curve":  # the others observed: the GPU calls' own spread only
        gpu_sigma = measured.gpu_exec_noise_sigma if exec_noise is None else exec_noise
        overheads = dataclasses.replace(
            overheads, exec_noise_sigma=0.0, gpu_exec_noise_sigma=gpu_sigma or 0.0
        )
    elif noise == "per-resource" and exec_noise is None and durations == "curve":
        other, gpu = measured.other_exec_noise_sigma, measured.gpu_exec_noise_sigma
        overheads = dataclasses.replace(
            overheads,
            exec_noise_sigma=measured.exec_noise_sigma if other is None else other,
            gpu_exec_noise_sigma=gpu,
        )
    noisy = overheads.exec_noise_sigma > 0 or (overheads.gpu_exec_noise_sigma or 0.0) > 0
    frames = []
    rejected: dict[str, int] = {}
    for seed in range(runs if noisy else 1):
        config = SimConfig(
            policy=policy,
            seed=seed,
            overheads=overheads,
            rollout=RolloutConfig(mode="open"),
            timeline=False,
            # Live, EOE starts with no service resident unless the recording began after a
            # warm-up (the header says which services were resident then).
            warm_gpus=warm,
            # Containers where the live run put them (at their opens, which the trace lacks).
            placement="observed",
            gpu_calibrations=gpu_calibrations,
        )
        frame = actions_frame(simulate(sim_trace, spec, config))
        frames.append(frame[frame["outcome"] == "result"].set_index("action_id"))
        if seed == 0:
            rejected = {
                str(row.action_id): str(row.reason)
                for row in frame[frame["outcome"] != "result"].itertuples()
            }
    live_rows = {
        r.action_id: r
        for r in trace.rows
        if r.obs_outcome == "result"
        and r.obs_units is not None
        and all(r.action_id in f.index for f in frames)
    }
    if not live_rows:
        raise ValueError(f"{trace_path}: no action ended with a result both live and simulated")
    left_out = _left_out(trace, live_rows, rejected)
    ids = sorted(live_rows)

    def live_act(r: Any) -> float:
        return (r.obs_queue_s or 0.0) + (r.obs_overhead_s or 0.0) + (r.obs_exec_s or 0.0)

    def sim_stats(sub: list[str]) -> dict[str, float]:
        """Percentiles of the simulated ACTs, averaged over the noise seeds."""
        each = [percentiles([float(f.at[i, "act_s"]) for i in sub]) for f in frames]
        return {k: statistics.fmean(e[k] for e in each) for k in each[0]}

    live = percentiles([live_act(live_rows[i]) for i in ids])
    sim = sim_stats(ids)
    by_resource = {}
    for resource in ("cpu", "gpu", "api"):
        sub = [i for i in ids if live_rows[i].resource == resource]
        if sub:
            lv = percentiles([live_act(live_rows[i]) for i in sub])
            sv = sim_stats(sub)
            by_resource[resource] = {
                "actions": {"n": float(len(sub))},
                "live": lv,
                "sim": sv,
                "error": relative_error(sv, lv),
            }
    parts = {
        "live": {
            "queue_mean_s": statistics.fmean(live_rows[i].obs_queue_s or 0.0 for i in ids),
            "overhead_mean_s": statistics.fmean(live_rows[i].obs_overhead_s or 0.0 for i in ids),
            "exec_mean_s": statistics.fmean(live_rows[i].obs_exec_s or 0.0 for i in ids),
        },
        "sim": {
            f"{part}_mean_s": statistics.fmean(
                float(f.loc[ids, f"{part}_s"].mean()) for f in frames
            )
            for part in ("queue", "overhead", "exec")
        },
    }
    return ReplayReport(
        trace=str(trace_path),
        policy=policy,
        cluster=spec.name,
        durations=durations,
        actions=len(ids),
        measured=measured,
        live=live,
        sim=sim,
        error=relative_error(sim, live),
        by_resource=by_resource,
        parts=parts,
        sim_runs=len(frames),
        left_out=left_out,
    )


def _left_out(
    trace: Any, compared: Mapping[str, Any], rejected: Mapping[str, str]
) -> dict[str, int]:
    """Why the live results not compared were left out (reason -> count): rejected by the
    simulation (its reason), or a result in some noisy runs only. The comparison covered
    the others without a word, its title counting only those."""
    out: dict[str, int] = {}
    for r in trace.rows:
        if r.obs_outcome != "result" or r.obs_units is None or r.action_id in compared:
            continue
        why = rejected.get(r.action_id, "not a result in every simulated run")
        out[why] = out.get(why, 0) + 1
    return dict(sorted(out.items(), key=lambda kv: (-kv[1], kv[0])))


def _require_replayable_spread(
    trace_path: str | Path, measured: Measured, durations: str, noise: str
) -> None:
    """Refuse, naming the trace, a measured spread the simulator's noise cannot draw from
    (past ``EXEC_NOISE_SIGMA_MAX``: its draws shrink nearly every duration to nothing). Such a
    spread says the declared curves are far from what ran: the error said only
    ``overheads.exec_noise_sigma``, a setting the user never gave."""
    from tangram.sim.config import EXEC_NOISE_SIGMA_MAX

    used: dict[str, float | None] = {}
    if durations == "curve" and noise == "pooled":
        used["all actions"] = measured.exec_noise_sigma
    elif durations == "curve":
        used["GPU calls"] = measured.gpu_exec_noise_sigma
        other = measured.other_exec_noise_sigma
        used["other actions"] = measured.exec_noise_sigma if other is None else other
    elif durations == "gpu-curve":
        used["GPU calls"] = measured.gpu_exec_noise_sigma
    for what, sigma in used.items():
        if sigma is not None and sigma > EXEC_NOISE_SIGMA_MAX:
            raise ValueError(
                f"{trace_path}: the observed execution times of {what} spread around their "
                f"declared curves with sigma {sigma:.3g}, past the simulator's noise bound "
                f"{EXEC_NOISE_SIGMA_MAX:g} (its draws would shrink nearly every duration to "
                f"nothing); the curves are far from what ran: replay with --durations "
                f"observed, or give --exec-noise"
            )


def main(args: argparse.Namespace) -> int:
    report = replay(
        args.trace,
        policy=args.policy,
        cluster=args.cluster,
        durations=args.durations,
        grant_s=args.grant_s,
        api_call_s=args.api_call_s,
        exec_noise=args.exec_noise,
        runs=10 if args.runs is None else args.runs,
        noise=args.noise,
        gpu_calibrations=load_gpu_calibrations(args.gpu_calibration),
    )
    rows = []
    for name, block in [("all", {"live": report.live, "sim": report.sim, "error": report.error})]:
        rows += _table_rows(name, block)
    for resource, block in report.by_resource.items():
        rows += _table_rows(resource, block)
    title = (
        f"{Path(report.trace).name}: {report.actions} actions, policy {report.policy}, "
        f"cluster {report.cluster}, durations {report.durations}"
    )
    emit(
        args.json,
        report.as_dict(),
        {title: rows, "overheads measured live (s)": [dataclasses.asdict(report.measured)]},
    )
    if report.left_out and not args.json:
        print("\n" + textwrap.fill(left_out_line(report.left_out, report.actions), 100))
    if args.runs is not None and report.sim_runs < args.runs:
        # --runs N was one run without a word (only sim_runs: 1 in --json said so).
        print(f"tangram replay: {runs_note(args.runs, report.durations)}", file=sys.stderr)
    return 0


def load_gpu_calibrations(paths: Sequence[Path]) -> list[Any]:
    """The records of ``--gpu-calibration``, one per service: a second for a service (the same
    file given twice, or two calibrations of one model) was refused after the trace was read
    as "gpu_calibrations: one record per service, got ['judge', 'judge']", naming neither the
    flag nor the files."""
    records, first = [], {}
    for path in paths:
        record = load_gpu_calibration(path)
        if record.service in first:
            raise ValueError(
                f"--gpu-calibration {path}: a second record of service {record.service!r} "
                f"(--gpu-calibration {first[record.service]} has one); give one per service"
            )
        first[record.service] = path
        records.append(record)
    return records


def runs_note(runs: int, durations: str) -> str:
    """Why ``--runs`` ran once: no execution noise, so every run would be the same."""
    why = (
        "the observed durations are replayed as they were"
        if durations == "observed"
        else "the execution noise is 0 (--exec-noise 0, or no spread measured)"
    )
    return (
        f"--runs {runs}: the simulation ran once; it has no execution noise ({why}), so it "
        "is deterministic and more runs would repeat it"
    )


def left_out_line(left_out: Mapping[str, int], compared: int) -> str:
    """The live results the comparison left out, and the main reason."""
    n = sum(left_out.values())
    why = next(iter(left_out))
    return (
        f"{n} of {n + compared} actions that ended with a result live are left out: the "
        f"simulation did not complete them ({left_out[why]} x {why})"
    )


def _table_rows(name: str, block: Mapping[str, Mapping[str, float]]) -> list[dict[str, Any]]:
    keys = [f"p{p}" for p in PERCENTILES] + ["mean"]
    out = []
    for what in ("live", "sim"):
        out.append(
            {"actions": name, "what": f"{what} ACT (s)", **{k: block[what][k] for k in keys}}
        )
    out.append(
        {
            "actions": name,
            "what": "error (sim-live)/live",
            **{k: _percent(block["error"][k]) for k in keys},
        }
    )
    return out


def _percent(error: float) -> str:
    """A relative error as the table prints it: a signed percentage, or ``-`` where it is
    undefined (NaN: the live figure is 0, e.g. actions observed to take no time), as every
    table prints NaN; it printed ``+nan%``."""
    return "-" if math.isnan(error) else f"{100 * error:+.1f}%"
