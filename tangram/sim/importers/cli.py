"""``tangram import SOURCE FILES... -o TRACE``: real agent runs as a trace, optionally tiled.

Each file (or directory, for SWE-agent) is imported with the importer registered as SOURCE
(``tangram.sim.importers.IMPORTERS``); ``--set NAME=VALUE`` passes any of the importer's keyword
parameters (``gen_before_s``, ``max_units``, ``serial_fraction``, ``gen``, ``step``...), typed by
its signature. The files are merged (``tile.merge``); ``--batch N --seed S`` then tiles the
imported trajectories into one RL step of N (``tile.tile``: round-robin over a seeded
permutation, each slot after a seeded start offset). The trace format follows ``-o``'s suffix
(``.jsonl``, ``.jsonl.gz``, ``.parquet``).
"""

from __future__ import annotations

import argparse
import os
from pathlib import Path
from typing import Any

from tangram.report import add_json_flag, emit, path_arg, positive_int
from tangram.sim.importers import IMPORTERS, import_trace
from tangram.sim.importers.tile import merge, tile
from tangram.sim.overrides import Setting, add_set_flag, kwargs_for


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser(
        "import",
        help="import SWE-agent or OpenHands runs as a trace; --batch N tiles them into a step",
        description=__doc__.split("\n\n", 1)[1],
    )
    p.add_argument("source", choices=sorted(IMPORTERS), help="the files' format")
    p.add_argument("files", nargs="+", type=path_arg, help="files (or a directory for swe-agent)")
    p.add_argument("-o", "--out", type=path_arg, required=True, help="trace file to write")
    p.add_argument(
        "--batch",
        type=positive_int,
        help="tile into one RL step of N trajectories (round-robin over a seeded permutation)",
    )
    p.add_argument("--seed", type=int, help="seed of the tiling (with --batch; default 0)")
    p.add_argument(
        "--max-offset-s",
        type=float,
        help="start offsets are uniform in [0, this) (default: the mean gen_before_s + t1_s "
        "of an imported action; 0: lockstep)",
    )
    add_set_flag(
        p,
        "an importer parameter, e.g. gen_before_s=2.9, max_units=4, serial_fraction=0.2",
    )
    add_json_flag(p)
    p.set_defaults(func=main)


#: The importers' parameters copied into every row as the field of their name, and a valid
#: CPU row such a ``--set`` is tried on.
_COPIED = ("step", "task", "gen_before_s", "max_units", "serial_fraction", "memory_gb")
_PROBE = dict(
    action_id="a0",
    trajectory="t0",
    step=0,
    position=0,
    task="probe",
    kind="env",
    gen_before_s=0.0,
    resource="cpu",
    t1_s=1.0,
    max_units=16,
)


def check_row_settings(settings: list[Setting], params: dict[str, Any]) -> None:
    """Refuse a ``--set`` the trace format refuses as the field it fills in every row
    (``step=-1``, ``max_units=0``, ``serial_fraction=1.5``), before anything is imported: it
    failed on the first record as "FILE: trajectory step 0: field 'step': must be >= 0", as if
    the file held the bad value. Raises ValueError naming the ``--set``."""
    from tangram.trace import TraceError, TraceRow

    last = {s.name: s for s in settings}  # (given twice, the last one holds)
    for name, setting in last.items():
        if name not in _COPIED:
            continue
        try:
            TraceRow(**{**_PROBE, name: params[name]})
        except TraceError as exc:
            if exc.field == name:
                raise ValueError(
                    f"{setting.where}: {exc.reason} (the trace field {name!r} of every "
                    "imported row)"
                ) from None


def check_out(out: Path) -> None:
    """Refuse an ``-o`` that cannot become a trace file, before anything is imported: a
    directory, or a path below a file (``mkdir`` and the writer failed there with a bare
    FileExistsError or IsADirectoryError traceback). Raises ValueError naming the path."""
    if out.is_dir():
        raise ValueError(f"-o {out}: is a directory; give a trace file (.jsonl, .parquet...)")
    from tangram.trace.files import check_trace_suffix

    check_trace_suffix(out)  # (it failed only once all was imported and -o's dirs made)
    for parent in out.parents:
        if parent.exists():
            if not parent.is_dir():
                raise ValueError(f"-o {out}: {parent} exists and is not a directory")
            if not os.access(parent, os.W_OK | os.X_OK):
                raise ValueError(f"-o {out}: directory {parent} is not writable")
            return


def check_files(files: list[Path]) -> None:
    """Refuse a file given twice, or inside a directory also given (``runs/*.traj runs/a.traj``,
    ``runs/ runs/a.traj``): its runs were imported twice, the copy silently renamed ``~K``
    (the merge keeps two runs of one task instance apart), doubling them in the trace.
    Raises ValueError naming both arguments."""
    seen: list[tuple[Path, Path]] = []  # (as given, resolved)
    for given in files:
        path = given.resolve()
        for earlier, other in seen:
            if path == other or other in path.parents or path in other.parents:
                raise ValueError(
                    f"{given} and {earlier} name the same runs (a file given twice, or a "
                    "file inside a directory also given): each would be imported twice"
                )
        seen.append((given, path))


def check_not_an_input(out: Path, files: list[Path]) -> None:
    """Refuse an ``-o`` that is one of the files imported (``tangram import openhands
    output.jsonl -o output.jsonl``): the trace was written over the run it came from, the
    source lost without a word. Raises ValueError naming the path."""
    target = out.resolve()
    for given in files:
        if given.resolve() == target:
            raise ValueError(
                f"-o {out} is the file imported ({given}): writing the trace would overwrite "
                "the run it comes from; give another output path"
            )


def main(args: argparse.Namespace) -> int:
    params = kwargs_for(IMPORTERS[args.source], args.settings, f"importer {args.source!r}")
    check_row_settings(args.settings, params)
    if args.batch is None:  # (refused before the import; they were ignored, or refused after)
        for flag, value in (("--seed", args.seed), ("--max-offset-s", args.max_offset_s)):
            if value is not None:
                raise ValueError(f"{flag} applies to tiling: give --batch N")
    seed = 0 if args.seed is None else args.seed
    if seed < 0:
        raise ValueError(f"--seed must be >= 0, got {seed}")
    check_files(args.files)
    check_out(args.out)
    check_not_an_input(args.out, args.files)
    traces = [import_trace(args.source, path, **params) for path in args.files]
    unanswered = sum(int(t.meta.get("unanswered_actions", 0)) for t in traces)
    trace = merge(traces, [str(p) for p in args.files])
    imported = len(trace.trajectories())
    if args.batch is not None:
        trace = tile(trace, args.batch, seed, args.max_offset_s)
    from tangram.trace import write_trace

    try:
        args.out.parent.mkdir(parents=True, exist_ok=True)
        write_trace(trace, args.out)
    except OSError as exc:  # (no permission, a full disk: a traceback, after all the import)
        where = exc.filename or args.out
        raise ValueError(f"-o {args.out}: cannot write {where}: {exc.strerror or exc}") from None
    tiling = trace.meta.get("tiling", {})
    doc = {
        "out": str(args.out),
        "files": [str(p) for p in args.files],
        "imported_trajectories": imported,
        "trajectories": len(trace.trajectories()),
        "actions": len(trace),
        "tiling": tiling or None,
        "unanswered_actions": unanswered,
    }
    how = (
        f"tiled from {imported} imported trajectories, seed {seed}, start offsets "
        f"uniform in [0, {tiling['max_offset_s']:.3g}) s"
        if tiling
        else f"from {len(args.files)} file{'s' if len(args.files) > 1 else ''}"
    )
    if args.json:
        emit(True, doc, {})
    else:
        print(f"wrote {args.out}: {doc['trajectories']} trajectories, {len(trace)} actions ({how})")
        if unanswered:
            print(unanswered_line(unanswered))
    return 0


def unanswered_line(n: int) -> str:
    """The agent actions left out for want of an answering observation (OpenHands): only the
    trace's meta counted them, so a run cut short lost its last actions without a word."""
    return (
        f"left out {n} agent action{'s' if n > 1 else ''} that no observation answered "
        "(no 'cause' naming it: the run ended before it did); the meta counts them as "
        "unanswered_actions"
    )
