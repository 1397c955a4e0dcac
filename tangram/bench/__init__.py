"""``tangram bench NAME``: the benchmarks, registered in ``cli.BENCHMARKS``.

Each lives beside what it measures; the core's (``tangram bench scheduler``) lives here, in
``tangram.bench.scheduler``, so that the core holds no benchmark code.
"""

from __future__ import annotations

import argparse
import importlib


def register(sub: argparse._SubParsersAction) -> None:
    from tangram.cli import BENCHMARKS, _available

    parser = sub.add_parser(
        "bench", help="run a benchmark and print its figures (--json for machines)"
    )
    bench_sub = parser.add_subparsers(dest="bench", metavar="BENCHMARK")
    for module in _available(BENCHMARKS).values():
        importlib.import_module(module).register(bench_sub)
