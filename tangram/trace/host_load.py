"""The host's CPU load around each GPU call of a recorded live run, and the call times it gave.

A CPU-backed device (or a model whose call needs the host's CPU) computes on the cores the CPU
sandboxes are granted. ``busy_at_start`` reads, for every GPU call of a live trace, how many
cores of the host's CPU node were held by CPU actions when the call started, plus, for a
device whose calls compute on the host (``GpuCalibration.host_cores_per_gpu``), the cores the
other calls then running on the GPU node kept busy (the quantity the simulator prices,
``tangram.sim.gpu_model``); ``contention_points`` turns a live run into the call times of a
``GpuCalibration`` per cell size and busy cores (median of observed / idle), and
``overhead_points`` into its per-call overheads per busy cores (mean observed).
"""

from __future__ import annotations

import math
import statistics
from collections.abc import Iterable, Sequence

from tangram.trace.gpu_calibration import CallOverhead, CallTime, GpuCalibration
from tangram.trace.row import TraceRow

#: Fewest calls at a (DoP, busy cores) level for its median to become a point.
MIN_CALLS = 3


def _ran(rows: Iterable[TraceRow]) -> list[TraceRow]:
    return [
        r
        for r in rows
        if r.obs_units is not None and r.obs_outcome is not None and r.arrival_s is not None
    ]


def busy_at_start(
    rows: Iterable[TraceRow],
    host_cpu_node: str,
    gpu_node: str | None = None,
    host_cores_per_gpu: float = 0.0,
) -> dict[str, float]:
    """GPU action id -> cores of ``host_cpu_node`` busy when its call started: those held by
    CPU actions (from their start to their end, overhead included) plus
    ``host_cores_per_gpu`` per GPU of ``gpu_node`` held by another call then (from its start,
    restore included, to its end)."""
    ran = _ran(rows)
    held = [
        (r.arrival_s + (r.obs_queue_s or 0.0), r.arrival_s + _act(r), float(r.obs_units), "")
        for r in ran
        if r.resource == "cpu" and r.obs_node == host_cpu_node
    ]
    if host_cores_per_gpu and gpu_node is not None:
        held += [
            (
                r.arrival_s + (r.obs_queue_s or 0.0),
                r.arrival_s + _act(r),
                host_cores_per_gpu * r.obs_units,
                r.action_id,
            )
            for r in ran
            if r.resource == "gpu" and r.obs_node == gpu_node
        ]
    out = {}
    for r in ran:
        if r.resource != "gpu":
            continue
        start = r.arrival_s + (r.obs_queue_s or 0.0) + (r.obs_overhead_s or 0.0)
        out[r.action_id] = sum(
            units for a, b, units, who in held if a <= start < b and who != r.action_id
        )
    return out


def busy_for(rows: Iterable[TraceRow], record: GpuCalibration) -> dict[str, float]:
    """``busy_at_start`` as ``record`` counts it (its host, its GPU node, its cores per GPU)."""
    if record.host_cpu_node is None:
        raise ValueError(f"calibration of {record.service!r} names no host CPU node")
    return busy_at_start(rows, record.host_cpu_node, record.gpu_node, record.host_cores_per_gpu)


def _act(r: TraceRow) -> float:
    return (r.obs_queue_s or 0.0) + (r.obs_overhead_s or 0.0) + (r.obs_exec_s or 0.0)


def max_level(host_cores_per_gpu: float, host_cores: int, gpus: int) -> int:
    """The most busy cores a call can see on a host of ``host_cores`` beside a GPU node of
    ``gpus`` when each other call keeps ``host_cores_per_gpu`` per GPU busy: the host's cores,
    plus the other GPUs' when calls load the host."""
    return host_cores + math.ceil(host_cores_per_gpu * max(0, gpus - 1))


def contention_points(
    rows: Sequence[TraceRow], idle: GpuCalibration, host_cores: int, gpus: int = 1
) -> tuple[CallTime, ...]:
    """Call times at 1..``max_level`` busy cores for each DoP of ``idle`` (a record whose
    busy-0 points are the idle call times; ``gpus``: its GPU node's), from the calls of
    ``idle.service`` that ended with a result in a live run: the idle time times the median
    observed / idle ratio of the calls started at that many busy cores (rounded; more than
    ``max_level`` count as ``max_level``). A level with fewer than ``MIN_CALLS`` calls at a
    DoP takes the median of all DoPs' calls at that level, each call's time carried to this
    DoP by the ratio of their speed-ups there (``_speedup``: a CPU-backed call's speed-up over
    one GPU is at most the host cores left free, so on a host with one core free or none a
    DoP-2 call takes about as long as a DoP-1 call, not its idle share); with fewer still it is
    left out (the record interpolates over it), except above ``host_cores`` (other calls' load
    on a fully held host: seen rarely), where the highest level measured is carried up by
    processor sharing (``_shared``)."""
    busy = busy_for(rows, idle)
    top = max_level(idle.host_cores_per_gpu, host_cores, gpus)
    times: dict[tuple[int, int], list[float]] = {}
    for r in _ran(rows):
        if r.action_id not in busy or r.service != idle.service or r.obs_outcome != "result":
            continue
        if r.obs_node != idle.gpu_node:  # the record's node only
            continue
        if not (r.obs_exec_s or 0.0) > 0:
            continue
        level = min(round(busy[r.action_id]), top)
        times.setdefault((r.obs_units, level), []).append(r.obs_exec_s)
    points = []
    for dop in idle.dops:
        last: CallTime | None = None
        for level in range(1, top + 1):
            use = times.get((dop, level), [])
            if len(use) < MIN_CALLS:  # too few at this DoP: every DoP's calls, carried over
                mine = _speedup(idle, dop, level, host_cores)
                use = [
                    t * _speedup(idle, d, level, host_cores) / mine
                    for (d, b), ts in times.items()
                    if b == level
                    for t in ts
                ]
            if len(use) >= MIN_CALLS:
                last = CallTime(dop, float(level), statistics.median(use))
            elif level > host_cores and last is not None:
                threads = max(1.0, dop * idle.host_cores_per_gpu)
                factor = _shared(threads, level, host_cores) / _shared(
                    threads, last.busy_cores, host_cores
                )
                last = CallTime(dop, float(level), last.seconds * factor)
            else:
                continue
            points.append(last)
    return tuple(points)


def _speedup(idle: GpuCalibration, dop: int, busy: float, cores: int) -> float:
    """A call's speed-up at ``dop`` over one GPU with ``busy`` of the host's ``cores`` busy:
    its idle one (the record's idle call times), at most the free cores over the host cores
    a GPU's thread keeps busy (at least 1) when the calls compute on the host."""
    ideal = idle.call_s(1, 0.0) / idle.call_s(dop, 0.0)
    per_gpu = idle.host_cores_per_gpu
    if dop == 1 or not per_gpu:
        return ideal
    return min(ideal, max(1.0, (cores - busy) / per_gpu))


def _shared(threads: float, busy: float, cores: int) -> float:
    """How much longer ``threads`` runnable threads take beside ``busy`` busy ones on
    ``cores`` cores shared fairly than on cores of their own."""
    return max(1.0, (threads + busy) / cores)


def overhead_points(
    rows: Sequence[TraceRow], record: GpuCalibration, host_cores: int, gpus: int = 1
) -> tuple[CallOverhead, ...]:
    """The mean observed overhead (hand-off, admission, any restore) of ``record.service``'s
    calls on its GPU node that ended with a result in a live run, per busy-core level at their
    start (0 to ``max_level``, rounded), where ``MIN_CALLS`` calls or more saw the level."""
    busy = busy_for(rows, record)
    top = max_level(record.host_cores_per_gpu, host_cores, gpus)
    seen: dict[int, list[float]] = {}
    for r in _ran(rows):
        if r.action_id not in busy or r.service != record.service or r.obs_outcome != "result":
            continue
        if r.obs_node != record.gpu_node:  # the record's node only
            continue
        seen.setdefault(min(round(busy[r.action_id]), top), []).append(r.obs_overhead_s or 0.0)
    return tuple(
        CallOverhead(float(level), statistics.fmean(xs))
        for level, xs in sorted(seen.items())
        if len(xs) >= MIN_CALLS
    )
