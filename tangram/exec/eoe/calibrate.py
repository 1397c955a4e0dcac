"""Measure a registered service's GPU call model live, for the simulator (``GpuCalibration``).

``calibrate_gpu(manager, service, inputs)`` measures on an ``EoeManager``:

- **per-call overhead**: a resident call submitted from an asyncio loop to a worker thread, as
  the live runtime's GPU executor does, minus its execution: the hand-off both ways, admission,
  pinning and release;
- **restore**: the service evicted, then called cold on cells of each size; restore time vs
  bytes copied per GPU (shards copied concurrently), fitted as bytes / bandwidth + fixed (one
  size measured: all of it is bandwidth);
- **call time vs cell size vs host load**: the median call time at each DoP with 0..N of the
  host's cores kept busy by spinning processes. A CPU-backed device computes on the host's
  cores, so a call slows down as the CPU sandboxes take them (1.45-1.7x with both of this
  machine's 2 cores busy in the fidelity experiment); a CUDA call mostly does not, and its
  record then shows slow-downs near 1. A CPU-backed device's other calls load the host too
  (one thread per GPU: ``host_cores_per_gpu`` = 1 in its record, and the default levels go
  up to the host's cores plus the other GPUs).

The host load is plain processes (``python -c 'while True: pass'``), started and killed here.
"""

from __future__ import annotations

import asyncio
import os
import statistics
import subprocess
import sys
import time
from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor
from typing import Any

from tangram.trace.gpu_calibration import CallTime, GpuCalibration
from tangram.trace.host_load import max_level

GB = 1 << 30

#: Seconds the spinning processes run before a busy level's calls (to be scheduled).
SETTLE_S = 0.2


def spin(n: int) -> list[subprocess.Popen]:
    """``n`` processes that keep one core busy each until killed; if one fails to start,
    those started before it are killed (they would spin for ever) and the error raised.
    They are handed back inside the try: returned after it, an interrupt (a
    KeyboardInterrupt) at the return left them spinning for ever, the caller never having
    them to stop."""
    code = "while True: pass"
    procs: list[subprocess.Popen] = []
    try:
        for _ in range(n):
            procs.append(subprocess.Popen([sys.executable, "-c", code]))
        return procs
    except BaseException:
        stop(procs)
        raise


def stop(procs: Sequence[subprocess.Popen]) -> None:
    """Kill the processes ``spin`` started and reap them, each one killed past an interrupt
    (a second Ctrl-C) killing another: in a plain loop, an interrupt killing the first left
    the rest spinning for ever. (Killing one that exited already does nothing.)"""
    try:
        for p in procs:
            p.kill()
    finally:
        for p in procs:
            p.kill()
            p.wait()


def _call(manager: Any, service: str, inputs: Any, dop: int) -> Any:
    """One call on the first aligned cell of ``dop`` GPUs; raises on a failed call."""
    out = manager.call(service, inputs, gpus=tuple(range(dop)))
    if not out.ok:
        raise RuntimeError(f"calibration call of {service!r} at DoP {dop} failed: {out.message}")
    return out


def measure_overhead(manager: Any, service: str, inputs: Any, reps: int, dop: int = 1) -> float:
    """Median of (round trip from an asyncio loop through a worker thread) - execution, of
    calls at DoP ``dop``."""
    pool = ThreadPoolExecutor(1, thread_name_prefix="tangram-calibrate")

    async def trips() -> list[float]:
        loop = asyncio.get_running_loop()
        out = []
        for _ in range(reps):
            t0 = time.perf_counter()
            res = await loop.run_in_executor(pool, _call, manager, service, inputs, dop)
            out.append(time.perf_counter() - t0 - res.exec_s)
        return out

    try:
        _call(manager, service, inputs, dop)  # resident first
        return statistics.median(asyncio.run(trips()))
    finally:
        pool.shutdown()


def measure_restores(
    manager: Any, service: str, inputs: Any, dops: Sequence[int], reps: int
) -> tuple[float, float]:
    """(bandwidth GB/s, fixed s) from cold calls on cells of each size in ``dops``."""
    info = manager.info(service)
    points: list[tuple[float, float]] = []  # (GB copied per GPU, restore seconds)
    for dop in dops:
        for _ in range(reps):
            manager.evict(service)
            out = _call(manager, service, inputs, dop)
            if out.restore_s > 0:
                points.append((info.resident_bytes / GB, out.restore_s))
    if not points:
        raise RuntimeError(f"no restore of {service!r} was measured")
    return fit_restore(points)


def fit_restore(points: Sequence[tuple[float, float]]) -> tuple[float, float]:
    """Least squares for seconds = fixed + gb / bandwidth over (gb, seconds) points; with one
    size only, fixed 0 and the bandwidth of the median time (both > 0 always)."""
    sizes = {round(gb, 12) for gb, _ in points}
    if len(sizes) < 2:
        gb = points[0][0]
        return gb / statistics.median(t for _, t in points), 0.0
    mx = statistics.fmean(gb for gb, _ in points)
    my = statistics.fmean(t for _, t in points)
    slope = sum((gb - mx) * (t - my) for gb, t in points) / sum((gb - mx) ** 2 for gb, _ in points)
    fixed = my - slope * mx
    if slope <= 0 or fixed < 0:  # noise: fall back to bandwidth only
        return mx / my, 0.0
    return 1.0 / slope, fixed


def measure_call_times(
    manager: Any,
    service: str,
    inputs: Any,
    dops: Sequence[int],
    busy_levels: Sequence[int],
    reps: int,
) -> tuple[CallTime, ...]:
    """Median call time at each DoP with each number of host cores kept busy."""
    points = []
    for busy in busy_levels:
        procs = spin(busy)
        try:
            time.sleep(SETTLE_S if busy else 0.0)
            for dop in dops:
                _call(manager, service, inputs, dop)  # resident on this cell, warm
                times = [_call(manager, service, inputs, dop).exec_s for _ in range(reps)]
                points.append(CallTime(dop, float(busy), statistics.median(times)))
        finally:
            stop(procs)
    return tuple(points)


def _check_counts(reps: object, busy_levels: Sequence[object] | None, most: int) -> None:
    """``ValueError`` naming the argument, before any call or spinning process, for ``reps``
    that is no positive int (0 failed as statistics' 'no median for empty data') or a busy
    level that is no whole number from 0 to ``most`` (the host's cores, or the default
    levels' top): -1 was measured whole and then refused by the record, and 10**6 set out
    to start a million spinning processes (the CLI's --busy stops at the host's cores)."""
    if isinstance(reps, bool) or not isinstance(reps, int) or reps < 1:
        raise ValueError(f"reps must be a positive int, got {reps!r}"[:200])
    if busy_levels is None:
        return
    levels = list(busy_levels)
    if not all(isinstance(n, int) and not isinstance(n, bool) and 0 <= n <= most for n in levels):
        raise ValueError(
            f"busy_levels must be whole numbers from 0 to {most} (host cores kept busy), "
            f"got {levels!r}"[:300]
        )


def calibrate_gpu(
    manager: Any,
    service: str,
    inputs: Any,
    *,
    dops: Sequence[int] | None = None,
    busy_levels: Sequence[int] | None = None,
    reps: int = 5,
    host_cpu_node: str | None = None,
    gpu_node: str | None = None,
) -> GpuCalibration:
    """Measure ``service`` on ``manager`` (see the module docstring) into a record.

    ``dops``: cell sizes to measure (default: the service's, up to the manager's devices);
    ``busy_levels``: host cores kept busy (default 0..the host's cores); ``host_cpu_node`` /
    ``gpu_node``: the cluster nodes the record applies to (with a CPU-backed device: the CPU
    node whose cores the calls share). ``ValueError`` when no DoP (or a given one) can run
    on the manager's devices, naming the service's DoPs and the devices."""
    info = manager.info(service)
    devices = len(manager.devices)
    if dops is None:
        dops = [d for d in info.dops if d <= devices]
    if info.shards > 1:
        dops = [info.shards]
    dops = list(dops)
    bad = [d for d in dops if d not in info.dops or d > devices]
    if not dops or bad:
        what = f"DoPs {bad} cannot be measured" if bad else "no DoP can be measured"
        raise ValueError(
            f"calibrating {service!r}: {what}: the service runs at DoPs {info.dops} "
            f"(a call at DoP k needs a cell of k devices) and the manager has {devices} "
            f"device{'s' if devices != 1 else ''}"
        )
    cores = os.cpu_count() or 1
    # A CPU-backed device computes each GPU's share of a call on one host thread.
    per_gpu = 1.0 if manager.backend == "cpu" and host_cpu_node is not None else 0.0
    top = max_level(per_gpu, cores, len(manager.devices))
    busy_levels = None if busy_levels is None else list(busy_levels)  # (read once: an iterator)
    _check_counts(reps, busy_levels, max(top, cores))
    # Each level once, from 0 up: a level given twice was measured twice, and the record
    # then refused its two points, after the whole measurement.
    levels = sorted({0, *(range(top + 1) if busy_levels is None else busy_levels)})
    overhead = measure_overhead(manager, service, inputs, reps, min(dops))
    gbps, fixed = measure_restores(manager, service, inputs, dops, max(1, reps // 2))
    times = measure_call_times(manager, service, inputs, dops, levels, reps)
    return GpuCalibration(
        service=service,
        backend=manager.backend,
        call_overhead_s=overhead,
        restore_gbps=gbps,
        restore_fixed_s=fixed,
        host_cores=cores,
        call_times=times,
        host_cpu_node=host_cpu_node,
        gpu_node=gpu_node,
        host_cores_per_gpu=per_gpu,
    )
