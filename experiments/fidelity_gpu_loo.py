"""The GPU call model checked on a recorded fidelity run, one seed left out at a time.

    python experiments/fidelity_gpu_loo.py [--runs DIR] [--out DIR]

Reads a fidelity run (``fidelity.json`` and ``fidelity-trace-seed<N>.jsonl.gz``; by default
``experiments/results/fidelity-issue11/``, the quiet run of issue 11, load 0.6-1.7;
``--runs experiments/results`` the committed run). For each seed, its GPU calibration record is
built from live measurements only: its own idle call times per cell size and per-call overhead
(its ``fidelity-gpu-calibration-seed<N>.json`` where the run has one, else
``calibration_idle`` and the seed's median live GPU overhead) and the slow-down per busy host
core measured in the *other* seeds' live runs (``tangram.trace.host_load.contention_points``:
median observed / idle per level, averaged over those seeds). The seed's GPU calls are
re-declared at their idle times (what clients declare when the simulator prices the host load)
and the trace is replayed from declared curves with and without the record; restores do not
occur (the service stays resident). Each record is built twice: busy cores counting the CPU
actions' only and one per-call overhead (``host_cores_per_gpu`` 0, the model before), and
also one per GPU running another call (1: a CPU-backed device's calls share the host's cores
with each other) with the other seeds' mean overhead per busy-core level
(``host_load.overhead_points``).

This is a check on quiet data, not the experiment itself: the live policy decided with the
curves declared then (the idle times scaled by the warm-up's slow-down, flat over cell sizes
in seeds 0 and 2), the replayed policy with the idle times.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import tempfile
from pathlib import Path

HERE = Path(__file__).resolve().parent
DEFAULT_RUNS = HERE / "results" / "fidelity-issue11"
#: Host cores a running call keeps busy per GPU: the model before (0) and now (1).
PER_GPU = (0.0, 1.0)
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
    sys.path[:0] = [str(HERE.parent), str(HERE)]
    from fidelity_records import CORES, GPUS, declared_at_idle, idle_measurements, idle_record

    from tangram.sim.replay_cli import replay
    from tangram.trace import load_trace
    from tangram.trace.gpu_calibration import CallOverhead, CallTime, GpuCalibration
    from tangram.trace.host_load import contention_points, overhead_points

    doc = json.loads((args.runs / "fidelity.json").read_text(encoding="utf-8"))
    seeds = [r["seed"] for r in doc["runs"]]
    traces = {s: load_trace(args.runs / f"fidelity-trace-seed{s}.jsonl.gz") for s in seeds}

    def measured(seed: int) -> tuple[dict[int, float], float]:
        """The seed's idle call time per DoP and its per-call overhead."""
        return idle_measurements(args.runs, doc, traces[seed], seed)

    def record(
        seed: int, per_gpu: float, points: tuple = (), overheads: tuple = ()
    ) -> GpuCalibration:
        return idle_record(*measured(seed), per_gpu, points, overheads)

    results = []
    tmp = Path(tempfile.mkdtemp())
    for seed in seeds:
        idle = measured(seed)[0]
        path = declared_at_idle(traces[seed], idle, tmp / f"seed{seed}.jsonl.gz")
        row: dict = {"seed": seed, "records": {}}
        for per_gpu in PER_GPU:
            ratios: dict[tuple[int, float], list[float]] = {}
            spent: dict[float, list[float]] = {}
            for other in seeds:
                if other == seed:
                    continue
                base = measured(other)[0]
                for pt in contention_points(
                    traces[other].rows, record(other, per_gpu), CORES, GPUS
                ):
                    ratios.setdefault((pt.dop, pt.busy_cores), []).append(pt.seconds / base[pt.dop])
                if per_gpu:  # the model now: overheads per level too
                    for o in overhead_points(traces[other].rows, record(other, 1.0), CORES, GPUS):
                        spent.setdefault(o.busy_cores, []).append(o.seconds)
            points = tuple(
                CallTime(d, b, idle[d] * statistics.fmean(xs))
                for (d, b), xs in sorted(ratios.items())
                if d in idle
            )
            overheads = tuple(
                CallOverhead(b, statistics.fmean(xs)) for b, xs in sorted(spent.items())
            )
            rec = record(seed, per_gpu, points, overheads)
            row["records"][str(per_gpu)] = rec.to_dict()
            for mode, kw in MODES.items():
                if per_gpu == PER_GPU[0]:
                    rep = replay(path, **kw)
                    row[f"{mode}, without record"] = rep.by_resource["gpu"]["error"]
                rep = replay(path, gpu_calibrations=(rec,), **kw)
                row[f"{mode}, record {per_gpu:g}"] = rep.by_resource["gpu"]["error"]
        results.append(row)
    args.out.mkdir(parents=True, exist_ok=True)
    runs = args.runs.resolve()
    named = {DEFAULT_RUNS.resolve(): "", (HERE / "results").resolve(): "-latest"}
    stem = "fidelity-gpu-loo" + named.get(runs, f"-{runs.name}")
    where = runs.relative_to(HERE.parent) if runs.is_relative_to(HERE.parent) else runs
    (args.out / f"{stem}.json").write_text(json.dumps(results, indent=2), encoding="utf-8")
    lines = [
        f"# GPU call model, one seed left out ({where}/)",
        "",
        f"Command: `python experiments/fidelity_gpu_loo.py --runs {where}` (see the "
        "script's docstring). GPU calls' ACT error (sim - live) / live, replayed from declared "
        "curves (the idle call times): without the record; with it, busy cores counting the CPU "
        "actions only and one overhead (record 0, the model before); and also each GPU "
        "running another call, and the overhead per busy-core level (record 1).",
        "",
        "| seed | replay | without: P50 | P95 | record 0: P50 | P95 | record 1: P50 | P95 "
        "| slow-down (record 1) at 1 / 2 / 3 busy, DoP 1 |",
        "|---|---|---|---|---|---|---|---|---|",
    ]
    for row in results:
        rec = GpuCalibration.from_dict(row["records"][str(PER_GPU[1])])
        slow = " / ".join(f"{rec.slowdown(1, b):.2f}" for b in range(1, CORES + GPUS))
        for mode in MODES:
            cells = [row[f"{mode}, without record"]] + [
                row[f"{mode}, record {g:g}"] for g in PER_GPU
            ]
            errs = " | ".join(f"{e['p50']:+.1%} | {e['p95']:+.1%}" for e in cells)
            lines.append(f"| {row['seed']} | {mode} | {errs} | {slow} |")
    (args.out / f"{stem}.md").write_text("\n".join(lines) + "\n", encoding="utf-8")
    print("\n".join(lines))
    return 0


if __name__ == "__main__":
    sys.exit(main())
