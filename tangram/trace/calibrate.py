"""Replay calibration: what turns a recorded live trace into the simulator's input and
parameters, and the ACT statistics that compare the two.

``measure`` reads the overheads a live run had (CPU grant, API call, a GPU call's dispatch,
EOE's restore rate and eviction cost) and the spread of its execution times around the
declared curves; ``replay_trace`` keeps the actions that started, renumbers their positions,
drops container memory and sets each action's curve to the durations to replay (observed, or
declared); ``percentiles`` and ``relative_error`` summarise live against simulated ACTs.
Running the simulator on the result is ``tangram.sim.replay_cli``'s job.
"""

from __future__ import annotations

import dataclasses
import math
import statistics
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from tangram.core.curves import curve_from_dict
from tangram.core.resources import H2D_GBPS_MIN
from tangram.trace.errors import TraceError
from tangram.trace.gpu_calibration import GpuCalibration
from tangram.trace.host_load import busy_for
from tangram.trace.row import TraceRow, is_nonnegative_number
from tangram.trace.trace import Trace

#: The ACT percentiles compared (with the mean).
PERCENTILES = (50, 90, 95, 99)
#: Where replayed execution times come from: observed live, the declared curves, or the
#: declared curves for GPU calls only (the others observed: the GPU call model alone).
DURATIONS = ("observed", "curve", "gpu-curve")
#: Shortest duration a replayed row may have (the trace format needs t1_s > 0).
MIN_SECONDS = 1e-6


@dataclass(frozen=True)
class Measured:
    """Overhead parameters measured from the live trace (seconds)."""

    cpu_overhead_s: float
    api_overhead_s: float
    gpu_call_overhead_s: float
    h2d_gbps: float | None
    restore_fixed_s: float | None
    eviction_s: float
    #: Spread of the observed execution times around the declared curves: the standard
    #: deviation of log(observed / declared) (the simulator's ``exec_noise_sigma``).
    exec_noise_sigma: float = 0.0
    #: The same spread of the GPU calls alone and of the other actions alone (None: fewer than
    #: two such actions). GPU calls spread more than CPU work (a model sharing the host's cores
    #: with the containers): one pooled sigma gives them too little spread and CPU work too much.
    gpu_exec_noise_sigma: float | None = None
    other_exec_noise_sigma: float | None = None


def percentiles(values: Sequence[float]) -> dict[str, float]:
    """p50, p90, p95, p99 (linear interpolation, as numpy's default) and the mean."""
    import numpy as np

    arr = np.asarray(values, dtype=float)
    out = {f"p{p}": float(np.percentile(arr, p)) for p in PERCENTILES}
    out["mean"] = float(arr.mean())
    return out


def relative_error(sim: Mapping[str, float], live: Mapping[str, float]) -> dict[str, float]:
    """(sim - live) / live per statistic; NaN where the live figure is not positive."""
    return {k: (sim[k] - live[k]) / live[k] if live[k] > 0 else math.nan for k in live}


def measure(trace: Trace, calibrations: Sequence[GpuCalibration] = ()) -> Measured:
    """Overheads from the observed rows and EOE's restore figures in the header. The spread
    of a calibrated service's calls is measured around what its record predicts (the
    declared time times its slow-down for the host cores busy at the call's start live)."""
    ran = [r for r in trace.rows if r.obs_units is not None and r.obs_outcome == "result"]
    predicted = _predictions(trace, calibrations)

    def expected(r: TraceRow) -> float:
        return r.curve_object().duration(r.obs_units) * predicted.get(r.action_id, 1.0)

    def overheads(resource: str) -> list[float]:
        return [r.obs_overhead_s or 0.0 for r in ran if r.resource == resource]

    cpu, api, gpu = overheads("cpu"), overheads("api"), overheads("gpu")
    eoe = eoe_figures(trace.meta)
    h2d = fixed = None
    # Restores of no bytes (a 0-GB service) measure no rate: the cluster's stays.
    if eoe.get("restores") and eoe.get("restore_s", 0) > 0 and eoe.get("bytes_restored", 0) > 0:
        h2d = restore_gbps(eoe)
        fixed = 0.0
    evictions = eoe.get("evictions") or 0
    logs = [
        math.log(r.obs_exec_s / expected(r))
        for r in ran
        if (r.obs_exec_s or 0.0) > 0 and r.obs_units is not None
    ]
    logs_of = {
        gpu_rows: [
            math.log(r.obs_exec_s / expected(r))
            for r in ran
            if (r.obs_exec_s or 0.0) > 0
            and r.obs_units is not None
            and (r.resource == "gpu") == gpu_rows
        ]
        for gpu_rows in (True, False)
    }
    spread = {k: statistics.pstdev(v) if len(v) > 1 else None for k, v in logs_of.items()}
    return Measured(
        cpu_overhead_s=statistics.fmean(cpu) if cpu else 0.0,
        api_overhead_s=statistics.fmean(api) if api else 0.0,
        gpu_call_overhead_s=statistics.median(gpu) if gpu else 0.0,
        h2d_gbps=h2d,
        restore_fixed_s=fixed,
        eviction_s=(eoe.get("evict_s", 0.0) / evictions) if evictions else 0.01,
        exec_noise_sigma=statistics.pstdev(logs) if len(logs) > 1 else 0.0,
        gpu_exec_noise_sigma=spread[True],
        other_exec_noise_sigma=spread[False],
    )


#: The numeric figures of a recorded trace's ``eoe`` header object (the live runtime's EOE
#: counters: ``tangram.exec.runtime.reporting``); each absent one counts as 0.
EOE_FIGURES = ("restores", "bytes_restored", "restore_s", "evictions", "evict_s")


def eoe_figures(meta: Mapping[str, Any]) -> dict[str, float]:
    """The header's EOE counters, each a number >= 0 (absent: 0), or a TraceError naming the
    header key: a measured restore rate or eviction cost from a string, a null or a negative
    count would be a crash or a silently wrong calibration."""
    eoe = meta.get("eoe")
    if eoe is None:
        return {}
    if not isinstance(eoe, Mapping):
        raise TraceError(
            f"expected an object of EOE counters, got {type(eoe).__name__} {eoe!r}",
            field="eoe",
            where="header",
        )
    out: dict[str, float] = {}
    for key in EOE_FIGURES:
        if key not in eoe:
            continue
        value = eoe[key]
        if not is_nonnegative_number(value):
            raise TraceError(
                f"must be a finite number >= 0, got {value!r}", field=f"eoe.{key}", where="header"
            )
        out[key] = value
    return out


#: The header key listing the GPU services resident when a live recording began (the live
#: runtime writes EOE's residency then: service name -> GPU indices holding it).
RESIDENCY_KEY = "gpu_residency_at_start"


def warm_at_start(meta: Mapping[str, Any]) -> bool:
    """Whether the header lists a GPU service resident when the recording began (absent or
    null: none), or a TraceError naming the header key. The key must be an object of service
    names to lists of GPU indices, as the live runtime writes it: a bare truthiness test made
    the string ``"false"`` (or a bare list like ``[0]``) start the replay warm, silently."""
    residency = meta.get(RESIDENCY_KEY)
    if residency is None:
        return False
    if not isinstance(residency, Mapping):
        raise TraceError(
            f"expected an object of service name -> list of GPU indices, got "
            f"{type(residency).__name__} {residency!r}",
            field=RESIDENCY_KEY,
            where="header",
        )
    for service, gpus in residency.items():
        if not (isinstance(service, str) and service and _gpu_indices(gpus)):
            raise TraceError(
                f"expected a service name mapped to a list of GPU indices (integers >= 0), "
                f"got {service!r}: {gpus!r}",
                field=RESIDENCY_KEY,
                where="header",
            )
    return any(residency.values())


def _gpu_indices(value: Any) -> bool:
    """A list of integers >= 0 (not bools): the GPUs a service was resident on."""
    return isinstance(value, list) and all(
        isinstance(i, int) and not isinstance(i, bool) and i >= 0 for i in value
    )


def restore_gbps(eoe: Mapping[str, float]) -> float:
    """EOE's restore rate (GB/s) from the header's counters, a positive finite number or a
    TraceError naming them: counters each valid alone can divide to 0 or overflow to inf
    (1e300 bytes in 1e-300 s), which the GPU node then refused without naming the header."""
    gbps = (eoe.get("bytes_restored", 0) / (1 << 30)) / eoe["restore_s"]
    if not (math.isfinite(gbps) and gbps >= H2D_GBPS_MIN):  # (a GPU node's floor)
        raise TraceError(
            f"bytes_restored / restore_s must give a finite restore rate >= {H2D_GBPS_MIN:g} "
            "GB/s (a GPU node's h2d_gbps floor), got "
            f"{eoe.get('bytes_restored', 0)!r} bytes in {eoe['restore_s']!r} s = {gbps!r} GB/s",
            field="eoe",
            where="header",
        )
    return gbps


def _predictions(trace: Trace, calibrations: Sequence[GpuCalibration]) -> dict[str, float]:
    """GPU action id -> its record's slow-down for the host cores busy at its start live."""
    out: dict[str, float] = {}
    for cal in calibrations:
        if cal.host_cpu_node is None:
            continue
        busy = busy_for(trace.rows, cal)
        for r in trace.rows:
            if r.action_id in busy and r.service == cal.service and r.obs_node == cal.gpu_node:
                out[r.action_id] = cal.slowdown(r.obs_units or 1, busy[r.action_id])
    return out


def _rescaled(row: TraceRow, target: float) -> dict[str, Any]:
    """The row's elasticity fields with T(obs_units) = target."""
    units = row.obs_units or 1
    target = max(target, MIN_SECONDS)
    if row.curve is not None:
        curve = curve_from_dict(row.curve)
        factor = target / curve.duration(units)
        kind = row.curve["kind"]
        if kind == "tabulated":
            # Points in any order are valid: sorted, the first is the one-unit time.
            points = sorted(row.curve["points"])
            scaled = {"kind": kind, "points": [[u, t * factor] for u, t in points]}
            return {"t1_s": scaled["points"][0][1], "curve": scaled}
        scaled = {**row.curve, "t1": row.curve["t1"] * factor}
        return {"t1_s": scaled["t1"], "curve": scaled}
    if row.serial_fraction is not None:
        s = row.serial_fraction
        return {"t1_s": target / (s + (1 - s) / units)}
    return {"t1_s": target}


def replay_trace(
    trace: Trace,
    measured: Measured,
    durations: str = "observed",
    calibrated: frozenset[str] = frozenset(),
) -> Trace:
    """The trace the simulator replays: started actions only, positions renumbered, no
    container memory, durations observed or declared (GPU calls plus their dispatch cost,
    except calls of the ``calibrated`` services, whose measured record prices it)."""
    if durations not in DURATIONS:
        raise ValueError(f"durations must be one of {DURATIONS}, got {durations!r}")
    missing = [r.action_id for r in trace.rows if r.obs_outcome is None or r.arrival_s is None]
    if missing:
        raise ValueError(
            f"not a recorded live trace: action {missing[0]!r} has no observed outcome or "
            "arrival (record one with tangram serve or the live runtime)"
        )
    ran = [r for r in trace.rows if r.obs_units is not None]
    positions: dict[tuple[int, str], int] = {}
    rows = []
    for r in sorted(ran, key=lambda r: (r.trajectory, r.position)):
        key = (r.step, r.trajectory)
        pos = positions.get(key, 0)
        positions[key] = pos + 1
        changes: dict[str, Any] = {
            "position": pos,
            "memory_gb": 0.0,
            "gen_after_s": 0.0,
        }
        gpu = r.resource == "gpu" and r.service not in calibrated
        extra = measured.gpu_call_overhead_s if gpu else 0.0
        if durations == "observed" or (durations == "gpu-curve" and r.resource != "gpu"):
            changes.update(_rescaled(r, (r.obs_exec_s or 0.0) + extra))
        elif extra:
            curve = r.curve_object()
            changes.update(_rescaled(r, curve.duration(r.obs_units or 1) + extra))
        rows.append(dataclasses.replace(r, **changes))
    rows.sort(key=lambda r: (r.arrival_s, r.action_id))
    return Trace(tuple(TraceRow(**dataclasses.asdict(r)) for r in rows), dict(trace.meta))
