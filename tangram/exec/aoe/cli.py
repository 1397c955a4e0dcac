"""``tangram profile-cpu -- CMD``: measure CMD's duration at 1..N cores and fit its curve."""

from __future__ import annotations

import argparse
import json
import math
import os
import sys

from tangram.report import (
    add_json_flag,
    check_out_file,
    emit,
    int_in,
    path_arg,
    positive_int,
    seconds_in,
    write_out_file,
)

#: Runs per core count, timed or warm-up: a median of 5-10 settles; 100 at 16 core counts of a
#: minute-long program is already a day.
RUNS_PER_COUNT_MAX = 100
#: One run's time-out: a day (a profile of longer runs is no profile).
RUN_TIMEOUT_MAX_S = 86_400.0


def register(sub: argparse._SubParsersAction) -> None:
    parser = sub.add_parser(
        "profile-cpu",
        help="run a command in an AOE container at 1..N cores and fit its elasticity curve",
        description=(
            "Runs CMD in a sandboxed container at 1..N granted cores (TANGRAM_CORES and "
            "OMP_NUM_THREADS tell it how many), takes the median of --repeat runs per core "
            "count, and fits an Amdahl curve (tangram.core.curves.fit_amdahl). One argument "
            "is a shell command; several are an argv."
        ),
    )
    parser.add_argument(
        "--image", type=image_arg, default=None, help="image (default: tangram-python)"
    )
    parser.add_argument(
        "--max-cores", type=positive_int, default=None, help="largest core count (default: all)"
    )
    parser.add_argument(
        "--repeat",
        type=int_in(1, RUNS_PER_COUNT_MAX, "a median of more runs moves no further"),
        default=3,
        help=f"timed runs per core count (default 3, at most {RUNS_PER_COUNT_MAX})",
    )
    parser.add_argument(
        "--warmup",
        type=int_in(0, RUNS_PER_COUNT_MAX, "warm-up runs past a few only add time"),
        default=1,
        help=f"untimed runs per core count (default 1, at most {RUNS_PER_COUNT_MAX})",
    )
    parser.add_argument(
        "--timeout",
        type=seconds_in(0.0, RUN_TIMEOUT_MAX_S),
        default=600.0,
        help="seconds per run (default 600, at most a day)",
    )
    parser.add_argument(
        "--memory-gb",
        type=_memory_gb,
        default=2.0,
        help="container memory (default 2; from 16 MiB to this machine's memory)",
    )
    parser.add_argument(
        "--network", action="store_true", help="give the container a network (relaxes the sandbox)"
    )
    parser.add_argument(
        "--out", type=path_arg, default=None, help="also write the JSON document to FILE"
    )
    add_json_flag(parser)
    # (dest "program": the top-level parser's "command" names the subcommand in its errors)
    parser.add_argument("program", nargs=argparse.REMAINDER, metavar="CMD", help="-- CMD [ARGS...]")
    parser.set_defaults(func=run)


def image_arg(text: str) -> str:
    """An argparse type: an image name, not empty. ``--image ''`` (an unset shell variable:
    ``--image "$IMAGE"``) was taken for no image, the default one measured without a word."""
    if not text.strip():
        raise argparse.ArgumentTypeError(
            f"an empty image name ({text!r}: an unset shell variable?); give an image, or leave "
            "the flag out for the default"
        )
    return text


def _memory_gb(text: str) -> float:
    """An argparse type: a container's memory in GB, from ``MIN_MEMORY_GB`` (Docker refuses
    less) to this machine's memory (more is no limit at all), finite."""
    from tangram.exec.runtime.records import MIN_MEMORY_GB

    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a number") from None
    host_gb = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES") / (1 << 30)
    if not (math.isfinite(value) and MIN_MEMORY_GB <= value <= host_gb):
        raise argparse.ArgumentTypeError(
            f"must be from {MIN_MEMORY_GB:g} to {host_gb:.1f} (this machine), got {text}"
        )
    return value


def run(args: argparse.Namespace) -> int:
    from tangram.exec.aoe.config import PYTHON_IMAGE, AoeConfig, SandboxConfig
    from tangram.exec.aoe.errors import AoeError
    from tangram.exec.aoe.manager import AoeManager
    from tangram.exec.aoe.profile import profile_command

    command = list(args.program)
    if command and command[0] == "--":
        command = command[1:]
    if not command:
        print(
            "tangram profile-cpu: no command given (usage: tangram profile-cpu [options] -- CMD)",
            file=sys.stderr,
        )
        return 2
    cmd: str | list[str] = command[0] if len(command) == 1 else command
    if args.out is not None:
        check_out_file("--out", args.out)
    config = AoeConfig(
        image=args.image or PYTHON_IMAGE, sandbox=SandboxConfig(network=args.network)
    )
    try:
        with AoeManager(config) as manager:
            profile = profile_command(
                manager,
                cmd,
                max_cores=args.max_cores,
                repeat=args.repeat,
                warmup=args.warmup,
                timeout_s=args.timeout,
                memory_gb=args.memory_gb,
            )
    except AoeError as exc:
        print(f"tangram profile-cpu: {exc}", file=sys.stderr)
        return 1
    document = profile.to_dict()
    if args.out:
        write_out_file("--out", args.out, json.dumps(document, indent=2) + "\n")
    curve = [{"curve": json.dumps(document["curve"]), "rel_rms_error": profile.fit.rel_rms_error}]
    emit(
        args.json,
        document,
        {f"profile of {cmd!r} in {profile.image}": profile.rows(), "fitted curve": curve},
    )
    return 0
