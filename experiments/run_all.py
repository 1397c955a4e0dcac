"""Run every experiment, then rebuild the results table of ``docs/experiments.md``.

    python experiments/run_all.py                 # all of them, 3 seeds each (~35-40 min on 2 cores)
    python experiments/run_all.py --only coding_act fixed_dop
    python experiments/run_all.py --docs-only     # just regather results/*.claims.csv into the doc
    python experiments/run_all.py --smoke --out /tmp/x   # tiny configuration (tests)

Each reproduction (``SIDE_BY_SIDE``) runs twice: under the paper's policy ``tangram-paper``
(``--policy tangram-paper``, into ``results/``: the paper's claims are reproduced with it) and
under the default ``tangram`` (``--policy tangram``, into ``results/default/``); the table shows
both. Each script runs as its own process (its tqdm bar shows progress) and records its run time in
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

sys.path.insert(0, str(Path(__file__).resolve().parent))
import side_by_side  # noqa: E402

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
    "bound_gap",
    "robustness",  # issue 11: both policies against every baseline, random instances (~6 min)
]
#: Seeds (seed sets) a script runs when ``--seeds`` is not given, where not the scripts' 3: the
#: robustness record uses four seed sets (2000 and 3000 held out from the CPU rule's choice).
SEED_SETS = {"robustness": 4}
#: Run under both elastic policies: the paper's into ``--out``, the default into ``--out/default``.
SIDE_BY_SIDE = EXPERIMENTS[:7]
PAPER_POLICY, DEFAULT_POLICY = "tangram-paper", "tangram"
BEGIN, END = "<!-- results:begin -->", "<!-- results:end -->"


def gather(out: Path) -> pd.DataFrame:
    """Every experiment's claims; ``default``: the same claim under the default policy (from
    ``out/default/``, matched by claim and metric), unless the experiment reports it itself."""
    frames = []
    for name in EXPERIMENTS:
        path = out / f"{name}.claims.csv"
        if not path.exists():
            continue
        claims = pd.read_csv(path, keep_default_na=False)
        other = out / "default" / f"{name}.claims.csv"
        has_default = "default" in claims.columns and (claims["default"] != "").any()
        if not has_default and other.exists():
            claims = claims.drop(columns=["default", "default_mean"], errors="ignore")
            theirs = pd.read_csv(other, keep_default_na=False)
            theirs = theirs[["claim", "metric", "ours", "ours_mean"]].rename(
                columns={"ours": "default", "ours_mean": "default_mean"}
            )
            claims = claims.merge(theirs, on=["claim", "metric"], how="left")
        frames.append(claims)
    out_frame = pd.concat(frames, ignore_index=True) if frames else pd.DataFrame()
    if not out_frame.empty:
        out_frame["default"] = out_frame.get("default", pd.Series(dtype=str)).fillna("")
    return out_frame


def results_table(claims: pd.DataFrame, times: pd.DataFrame | None) -> str:
    lines = [
        f"| # | claim | paper | ours, `{PAPER_POLICY}` (mean ± std over seeds) "
        f"| ours, default `{DEFAULT_POLICY}` | command |",
        "|---|---|---|---|---|---|",
    ]
    number = {name: i + 1 for i, name in enumerate(EXPERIMENTS)}
    for rec in claims.itertuples(index=False):
        lines.append(
            f"| {number.get(rec.experiment, '')} | {rec.claim} ({rec.metric}) | {rec.paper} | "
            f"{rec.ours} | {rec.default or '-'} | `{rec.command}` |"
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


def run_times(out: Path) -> pd.DataFrame | None:
    """Seconds per experiment, both policies' runs added where there are two."""
    paths = [p for p in (out / "run_times.csv", out / "default" / "run_times.csv") if p.exists()]
    frames = [pd.read_csv(p)[["experiment", "wall_s"]] for p in paths]
    if not frames:
        return None
    return pd.concat(frames).groupby("experiment", as_index=False, sort=False).wall_s.sum()


def side_by_side_figures(out: Path, claims: pd.DataFrame) -> list[Path]:
    """Each reproduction's figure under both policies, and the ratio claims as bars."""
    number = {name: i + 1 for i, name in enumerate(EXPERIMENTS)}
    paths = [side_by_side.stack(out, name) for name in SIDE_BY_SIDE]
    paths.append(side_by_side.claims_figure(claims, out, number))
    return [p for p in paths if p is not None]


def update_doc(out: Path, doc: Path = DOC) -> bool:
    claims = gather(out)
    if claims.empty or not doc.exists():
        return False
    side_by_side_figures(out, claims)
    times = run_times(out)
    text = doc.read_text(encoding="utf-8")
    if BEGIN not in text or END not in text:
        return False
    head, rest = text.split(BEGIN, 1)
    _, tail = rest.split(END, 1)
    doc.write_text(
        head + BEGIN + "\n" + results_table(claims, times) + "\n" + END + tail, encoding="utf-8"
    )
    return True


def main(argv=None) -> int:
    from tangram.report import path_arg, positive_int  # --seeds 0: an error, not "the default"

    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument(
        "--only", nargs="+", choices=EXPERIMENTS, help="run these experiments only (one or more)"
    )
    p.add_argument(
        "--seeds", type=positive_int, help="seeds per experiment (default: each script's, 3)"
    )
    p.add_argument("--workers", type=positive_int, help="processes per experiment")
    p.add_argument("--out", type=path_arg, default=HERE / "results")
    p.add_argument("--smoke", action="store_true", help="tiny configuration, for tests")
    p.add_argument("--docs-only", action="store_true", help="only rebuild docs/experiments.md")
    a = p.parse_args(argv)
    if not a.docs_only:
        for name in a.only or EXPERIMENTS:
            runs = [(a.out, [])]
            if name in SIDE_BY_SIDE:
                runs = [
                    (a.out, ["--policy", PAPER_POLICY]),
                    (a.out / "default", ["--policy", DEFAULT_POLICY]),
                ]
            for out, policy in runs:
                cmd = [sys.executable, str(HERE / f"{name}.py"), "--out", str(out), *policy]
                if a.seeds:
                    cmd += ["--seeds", str(a.seeds)]
                elif name in SEED_SETS:
                    cmd += ["--seeds", str(SEED_SETS[name])]
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
