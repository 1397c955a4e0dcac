"""The GPU call model checked on a recorded fidelity run, one seed left out at a time.

    python experiments/fidelity_gpu_loo.py [--runs DIR] [--out DIR]

Reads a fidelity run (``fidelity.json`` and ``fidelity-trace-seed<N>.jsonl.gz``; by default
``experiments/results/fidelity-issue11/``, the quiet run of issue 11, load 0.6-1.7). For each
seed, its GPU calibration record is built from live measurements only: its own idle call
times per cell size (``calibration_idle``) and the slow-down per busy host core measured in
the *other* seeds' live runs (``tangram.trace.host_load.contention_points``: median observed /
idle per level, averaged over those seeds). The seed's GPU calls are re-declared at their idle
times (what clients declare when the simulator prices the host load) and the trace is replayed
from declared curves with and without the record. The overhead is the seed's own median
live GPU overhead; restores do not occur (the service stays resident).

This is a check on quiet data, not the experiment itself: the live policy decided with the
curves declared then (the idle times scaled by the warm-up's slow-down, flat over cell sizes
in seeds 0 and 2), the replayed policy with the idle times.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import statistics
import sys
import tempfile
from pathlib import Path

HERE = Path(__file__).resolve().parent
DEFAULT_RUNS = HERE / "results" / "fidelity-issue11"
HOST, GPU_NODE, CORES = "vm", "local-gpu", 2
#: The replays: every action from its declared curve (one pooled noise, or each resource's
#: own), or the GPU calls only with the rest as observed (the GPU call model alone).
MODES = {
    "curve": {"durations": "curve"},
    "curve, noise per resource": {"durations": "curve", "noise": "per-resource"},
    "GPU curve, CPU observed": {"durations": "gpu-curve"},
}


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--runs", type=Path, default=DEFAULT_RUNS)
    p.add_argument("--out", type=Path, default=HERE / "results")
    args = p.parse_args(argv)
    sys.path.insert(0, str(HERE.parent))
    from tangram.sim.replay_cli import replay
    from tangram.trace import Trace, load_trace
    from tangram.trace.files import write_trace
    from tangram.trace.gpu_calibration import CallTime, GpuCalibration
    from tangram.trace.host_load import contention_points

    doc = json.loads((args.runs / "fidelity.json").read_text())
    idle = {
        r["seed"]: {int(k): v for k, v in r["live"]["calibration_idle"]["gpu_s"].items()}
        for r in doc["runs"]
    }
    traces = {s: load_trace(args.runs / f"fidelity-trace-seed{s}.jsonl.gz") for s in idle}

    def record(seed: int, points: tuple = ()) -> GpuCalibration:
        gpu = [r.obs_overhead_s or 0.0 for r in traces[seed].rows if r.resource == "gpu"]
        base = tuple(CallTime(d, 0.0, t) for d, t in sorted(idle[seed].items()))
        return GpuCalibration(
            "reward", "cpu", statistics.median(gpu), 1.0, 0.0, CORES, base + points, HOST, GPU_NODE
        )

    results = []
    tmp = Path(tempfile.mkdtemp())
    for seed in sorted(idle):
        ratios: dict[tuple[int, float], list[float]] = {}
        for other in sorted(idle):
            if other == seed:
                continue
            for pt in contention_points(traces[other].rows, record(other), CORES):
                ratios.setdefault((pt.dop, pt.busy_cores), []).append(
                    pt.seconds / idle[other][pt.dop]
                )
        points = tuple(
            CallTime(d, b, idle[seed][d] * statistics.fmean(xs))
            for (d, b), xs in sorted(ratios.items())
        )
        rec = record(seed, points)
        g1 = idle[seed][1]
        curve = {"kind": "tabulated", "points": [[1, g1], [2, min(idle[seed][2], g1)]]}
        rows = tuple(
            dataclasses.replace(r, t1_s=g1, curve=curve) if r.resource == "gpu" else r
            for r in traces[seed].rows
        )
        path = write_trace(Trace(rows, dict(traces[seed].meta)), tmp / f"seed{seed}.jsonl.gz")
        row = {"seed": seed, "record": rec.to_dict()}
        for mode, kw in MODES.items():
            for name, recs in (("without", ()), ("with", (rec,))):
                rep = replay(path, gpu_calibrations=recs, **kw)
                row[f"{mode}, {name} record"] = rep.by_resource["gpu"]["error"]
        results.append(row)
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "fidelity-gpu-loo.json").write_text(json.dumps(results, indent=2))
    lines = [
        "# GPU call model, one seed left out (quiet recorded run)",
        "",
        f"Command: `python experiments/fidelity_gpu_loo.py` on `{args.runs.name}/` "
        "(see the script's docstring). GPU calls' ACT error (sim - live) / live, replayed from "
        "declared curves (the idle call times), without and with the record.",
        "",
        "| seed | replay | without: P50 | P95 | with the record: P50 | P95 | slow-down at 1 / 2 "
        "busy cores, DoP 1 (DoP 2) |",
        "|---|---|---|---|---|---|---|",
    ]
    for row in results:
        rec = GpuCalibration.from_dict(row["record"])
        slow = " / ".join(
            f"{rec.slowdown(1, b):.2f} ({rec.slowdown(2, b):.2f})" for b in range(1, CORES + 1)
        )
        for mode in MODES:
            a, b = row[f"{mode}, without record"], row[f"{mode}, with record"]
            lines.append(
                f"| {row['seed']} | {mode} | {a['p50']:+.1%} | {a['p95']:+.1%} | "
                f"{b['p50']:+.1%} | {b['p95']:+.1%} | {slow} |"
            )
    (args.out / "fidelity-gpu-loo.md").write_text("\n".join(lines) + "\n")
    print("\n".join(lines))
    return 0


if __name__ == "__main__":
    sys.exit(main())
