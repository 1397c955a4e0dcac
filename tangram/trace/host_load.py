"""The host's CPU load around each GPU call of a recorded live run, and the call times it gave.

A CPU-backed device (or a model whose call needs the host's CPU) computes on the cores the CPU
sandboxes are granted. ``busy_at_start`` reads, for every GPU call of a live trace, how many
cores of the host's CPU node were held by CPU actions when the call started (the quantity the
simulator prices, ``tangram.sim.gpu_model``); ``contention_points`` turns a live run into the
call times of a ``GpuCalibration`` per cell size and busy cores (median of observed / idle).
"""

from __future__ import annotations

import statistics
from collections.abc import Iterable, Sequence

from tangram.trace.gpu_calibration import CallTime, GpuCalibration
from tangram.trace.row import TraceRow

#: Fewest calls at a (DoP, busy cores) level for its median to become a point.
MIN_CALLS = 3


def _ran(rows: Iterable[TraceRow]) -> list[TraceRow]:
    return [
        r
        for r in rows
        if r.obs_units is not None and r.obs_outcome is not None and r.arrival_s is not None
    ]


def busy_at_start(rows: Iterable[TraceRow], host_cpu_node: str) -> dict[str, int]:
    """GPU action id -> cores of ``host_cpu_node`` held by CPU actions when its call started
    (a CPU action holds its cores from its start to its end, overhead included)."""
    ran = _ran(rows)
    held = [
        (r.arrival_s + (r.obs_queue_s or 0.0), r.arrival_s + _act(r), r.obs_units)
        for r in ran
        if r.resource == "cpu" and r.obs_node == host_cpu_node
    ]
    out = {}
    for r in ran:
        if r.resource != "gpu":
            continue
        start = r.arrival_s + (r.obs_queue_s or 0.0) + (r.obs_overhead_s or 0.0)
        out[r.action_id] = sum(units for a, b, units in held if a <= start < b)
    return out


def _act(r: TraceRow) -> float:
    return (r.obs_queue_s or 0.0) + (r.obs_overhead_s or 0.0) + (r.obs_exec_s or 0.0)


def contention_points(
    rows: Sequence[TraceRow], idle: GpuCalibration, host_cores: int
) -> tuple[CallTime, ...]:
    """Call times at 1..``host_cores`` busy cores for each DoP of ``idle`` (a record whose
    busy-0 points are the idle call times), from the calls of ``idle.service`` that ended with
    a result in a live run: the idle time times the median observed / idle ratio of the calls
    started at that many busy cores. A level with fewer than ``MIN_CALLS`` calls at a DoP
    takes the ratio of all DoPs' calls at that level; with fewer still it is left out (the
    record interpolates over it)."""
    if idle.host_cpu_node is None:
        raise ValueError(f"calibration of {idle.service!r} names no host CPU node")
    busy = busy_at_start(rows, idle.host_cpu_node)
    ratios: dict[tuple[int, int], list[float]] = {}
    for r in _ran(rows):
        if r.action_id not in busy or r.service != idle.service or r.obs_outcome != "result":
            continue
        if not (r.obs_exec_s or 0.0) > 0:
            continue
        level = min(busy[r.action_id], host_cores)
        ratio = r.obs_exec_s / idle.call_s(r.obs_units, 0.0)
        ratios.setdefault((r.obs_units, level), []).append(ratio)
    points = []
    for dop in idle.dops:
        for level in range(1, host_cores + 1):
            own = ratios.get((dop, level), [])
            pooled = [x for (_, b), xs in ratios.items() if b == level for x in xs]
            use = own if len(own) >= MIN_CALLS else pooled
            if len(use) >= MIN_CALLS:
                seconds = idle.call_s(dop, 0.0) * statistics.median(use)
                points.append(CallTime(dop, float(level), seconds))
    return tuple(points)
