"""Rebuild the bundled traces in this folder from the workload generators.

    python traces/regenerate.py          # write traces/<workload>.jsonl.gz
    python traces/regenerate.py --check  # exit 1 if a bundled file differs from a fresh one

Each bundled trace is one RL step of 256 trajectories with seed 0: small enough to keep the
repository light (each file < 1 MB), large enough to show each workload's shape.
``tangram sim`` with no arguments replays ``traces/coding.jsonl.gz``.
"""

from __future__ import annotations

import argparse
import sys
import tempfile
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent))  # run from a checkout without installing

from tangram.sim.workloads import WORKLOADS, generate  # noqa: E402
from tangram.trace import write_trace  # noqa: E402

#: What is bundled: file name -> (workload, batch, steps, seed).
BUNDLED: dict[str, tuple[str, int, int, int]] = {
    f"{name}.jsonl.gz": (name, 256, 1, 0) for name in WORKLOADS
}


def build(directory: Path) -> list[Path]:
    written = []
    for filename, (name, batch, steps, seed) in BUNDLED.items():
        trace = generate(name, batch=batch, steps=steps, seed=seed)
        written.append(write_trace(trace, directory / filename))
    return written


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--check", action="store_true", help="compare instead of writing")
    args = parser.parse_args(argv)
    if not args.check:
        for path in build(HERE):
            print(f"{path.relative_to(HERE.parent)}: {path.stat().st_size / 1024:.0f} KiB")
        return 0
    with tempfile.TemporaryDirectory() as tmp:
        stale = [
            p.name
            for p in build(Path(tmp))
            if not (HERE / p.name).exists() or (HERE / p.name).read_bytes() != p.read_bytes()
        ]
    for name in stale:
        print(f"traces/{name} is out of date; run python traces/regenerate.py")
    return 1 if stale else 0


if __name__ == "__main__":
    sys.exit(main())
