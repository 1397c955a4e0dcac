"""Run every experiment, then rebuild the results table of ``docs/experiments.md``.

    python experiments/run_all.py                 # all of them, 3 seeds each (~25 min on 2 cores)
    python experiments/run_all.py --only coding_act fixed_dop
    python experiments/run_all.py --docs-only     # just regather results/*.claims.csv into the doc
    python experiments/run_all.py --smoke --out /tmp/x   # tiny configuration (tests)

Each script runs as its own process (its tqdm bar shows progress) and records its run time in
``results/run_times.csv``. The table in ``docs/experiments.md`` sits between the markers
``<!-- results:begin -->`` and ``<!-- results:end -->``; the prose around it is hand-written.
"""

from __future__ import annotations

import argparse
import subprocess
import sys
import time
from pathlib import Path

import pandas as pd

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent
DOC = ROOT / "docs" / "experiments.md"
EXPERIMENTS = [
    "coding_act",
    "cpu_scaling",
    "mopd_gpu_savings",
    "step_time",
    "fixed_dop",
    "scheduler_overhead",
    "sensitivity",
    "fidelity",  # live: needs the Docker engine (scripts/ensure-docker.sh), ~4 min
]
BEGIN, END = "<!-- results:begin -->", "<!-- results:end -->"


def gather(out: Path) -> pd.DataFrame:
    frames = []
    for name in EXPERIMENTS:
        path = out / f"{name}.claims.csv"
        if path.exists():
            frames.append(pd.read_csv(path, keep_default_na=False))
    return pd.concat(frames, ignore_index=True) if frames else pd.DataFrame()


def results_table(claims: pd.DataFrame, times: pd.DataFrame | None) -> str:
    lines = [
        "| # | claim | paper | ours (mean ± std over seeds) | command |",
        "|---|---|---|---|---|",
    ]
    number = {name: i + 1 for i, name in enumerate(EXPERIMENTS)}
    for rec in claims.itertuples(index=False):
        lines.append(
            f"| {number.get(rec.experiment, '')} | {rec.claim} ({rec.metric}) | {rec.paper} | "
            f"{rec.ours} | `{rec.command}` |"
        )
    if times is not None and not times.empty:
        order = {name: i for i, name in enumerate(EXPERIMENTS)}
        times = times.sort_values("experiment", key=lambda c: c.map(order))
        lines += [
            "",
            "Run times on this machine (2 shared cores), seconds: "
            + ", ".join(f"{r.experiment} {r.wall_s:.0f}" for r in times.itertuples(index=False))
            + ".",
        ]
    return "\n".join(lines)


def update_doc(out: Path, doc: Path = DOC) -> bool:
    claims = gather(out)
    if claims.empty or not doc.exists():
        return False
    times_path = out / "run_times.csv"
    times = pd.read_csv(times_path) if times_path.exists() else None
    text = doc.read_text()
    if BEGIN not in text or END not in text:
        return False
    head, rest = text.split(BEGIN, 1)
    _, tail = rest.split(END, 1)
    doc.write_text(head + BEGIN + "\n" + results_table(claims, times) + "\n" + END + tail)
    return True


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--only", nargs="*", choices=EXPERIMENTS, help="run these experiments only")
    p.add_argument("--seeds", type=int, help="seeds per experiment (default: each script's, 3)")
    p.add_argument("--workers", type=int, help="processes per experiment")
    p.add_argument("--out", type=Path, default=HERE / "results")
    p.add_argument("--smoke", action="store_true", help="tiny configuration, for tests")
    p.add_argument("--docs-only", action="store_true", help="only rebuild docs/experiments.md")
    a = p.parse_args(argv)
    if not a.docs_only:
        for name in a.only or EXPERIMENTS:
            cmd = [sys.executable, str(HERE / f"{name}.py"), "--out", str(a.out)]
            if a.seeds:
                cmd += ["--seeds", str(a.seeds)]
            if a.workers:
                cmd += ["--workers", str(a.workers)]
            if a.smoke:
                cmd.append("--smoke")
            print(f"== {name}: {' '.join(cmd[1:])}", flush=True)
            t0 = time.perf_counter()
            subprocess.run(cmd, check=True, cwd=ROOT)
            print(f"== {name}: {time.perf_counter() - t0:.0f} s", flush=True)
    if not a.smoke and a.out.resolve() == (HERE / "results").resolve():
        print(
            "docs/experiments.md updated"
            if update_doc(a.out)
            else "docs/experiments.md not updated"
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
