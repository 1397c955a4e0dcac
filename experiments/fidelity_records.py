"""What the offline checks of the GPU record share (``fidelity_gpu_loo.py``,
``fidelity_gpu_sparse.py``): a recorded seed's idle measurements, a record built from them,
and the seed's trace with its GPU calls declared at their idle times."""

from __future__ import annotations

import dataclasses
import statistics
from pathlib import Path
from typing import Any

#: The host, GPU node, host cores and GPUs of the recorded fidelity runs (this machine).
HOST, GPU_NODE, CORES, GPUS = "vm", "local-gpu", 2, 2


def idle_measurements(
    runs: Path, doc: dict, trace: Any, seed: int
) -> tuple[dict[int, float], float]:
    """The seed's idle call time per DoP and its per-call overhead: from its record
    (``fidelity-gpu-calibration-seed<N>.json``) where the run has one, else ``calibration_idle``
    and the seed's median live GPU overhead."""
    from tangram.trace.gpu_calibration import load_gpu_calibration

    path = runs / f"fidelity-gpu-calibration-seed{seed}.json"
    if path.exists():
        rec = load_gpu_calibration(path)
        return {d: rec.call_s(d, 0.0) for d in rec.dops}, rec.call_overhead_s
    run = next(r for r in doc["runs"] if r["seed"] == seed)
    gpu = [r.obs_overhead_s or 0.0 for r in trace.rows if r.resource == "gpu"]
    idle = {int(k): v for k, v in run["live"]["calibration_idle"]["gpu_s"].items()}
    return idle, statistics.median(gpu)


def idle_record(
    idle: dict[int, float],
    overhead: float,
    per_gpu: float,
    points: tuple = (),
    overheads: tuple = (),
) -> Any:
    """A record of the reward service on this machine: the idle call times, then ``points``
    (slow-downs per busy level) and ``overheads`` (overhead per busy level)."""
    from tangram.trace.gpu_calibration import CallTime, GpuCalibration

    base = tuple(CallTime(d, 0.0, t) for d, t in sorted(idle.items()))
    return GpuCalibration(
        "reward", "cpu", overhead, 1.0, 0.0, CORES, base + points, HOST, GPU_NODE, per_gpu,
        overheads,
    )  # fmt: skip


def declared_at_idle(trace: Any, idle: dict[int, float], path: Path) -> Path:
    """``trace`` with its GPU calls declared at their idle times (a larger cell never
    slower), written to ``path``: what clients declare when the simulator prices host load."""
    from tangram.trace import Trace
    from tangram.trace.files import write_trace

    g1 = idle[1]
    curve = {"kind": "tabulated", "points": [[1, g1], [2, min(idle.get(2, g1), g1)]]}
    rows = tuple(
        dataclasses.replace(r, t1_s=g1, curve=curve) if r.resource == "gpu" else r
        for r in trace.rows
    )
    return write_trace(Trace(rows, dict(trace.meta)), path)
