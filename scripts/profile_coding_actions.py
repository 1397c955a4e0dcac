#!/usr/bin/env python3
"""Profile typical coding-agent actions at 1..N cores and fit each one's Amdahl serial fraction.

Each action kind (a ``pytest -n`` suite, ``python -m compileall``, ``grep -r``, ``pip install``
from a local wheel directory, a ``make -j`` C build) runs in the ``tangram-profile`` sandbox
image (``scripts/ensure-profile-image.sh``) through ``tangram profile-cpu``'s own function
(``tangram.exec.aoe.profile.profile_command``: one container, the action granted 1..N cores,
``--repeat`` timed runs per core count after ``--warmup`` untimed ones). The whole set is run
``--rounds`` times, the kinds in a seeded order each round, so a burst of load from other work
on the machine lands on one round, not on one kind. While it runs, a sampler reads
``/proc/stat`` (runnable threads, per-core busy time) and ``/proc/loadavg``; a run during which
the machine had more runnable threads than cores (the sampler's own left out) is flagged
disturbed, since then some thread, maybe the action's, waited for a core; the pooled fit uses
the undisturbed runs when each core count has at least three.

Per kind the document gives the raw run times per core count and round, each round's fit, the
pooled fit (median of the pooled runs per core count, ``tangram.core.curves.fit_amdahl``), its
relative RMS error, the spread of the serial fraction (across rounds, and a seeded bootstrap
over runs), and suggested Beta(alpha, beta) for the coding workload's ``env_serial_*`` and
``reward_serial_*`` (``docs/profiles.md`` says how). With two core counts the fit is exactly
determined: the error is 0 by construction and the repeats alone measure the uncertainty.

Usage: scripts/profile_coding_actions.py [--rounds 3] [--repeat 3] [--json] [--out DIR]
"""

from __future__ import annotations

import argparse
import json
import math
import os
import platform
import random
import signal
import statistics
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from tangram.core.curves import fit_amdahl  # noqa: E402

IMAGE = "tangram-profile"
OUT_DIR = ROOT / "experiments" / "results" / "profiles"
PIP = "/opt/profile/wheels/pip-26.3-py3-none-any.whl/pip"
#: The env-action mix of the suggested Beta: grep stands for every serial command (file reads,
#: searches, listings, edits, one-off scripts: all 33 command records of the agent samples in
#: shared/real-traces), the rest for the heavy, parallel kinds (builds, test runs, installs).
ENV_WEIGHTS: Mapping[str, float] = {
    "grep": 0.8,
    "pytest": 0.05,
    "compileall": 0.05,
    "pip-install": 0.05,
    "make": 0.05,
}


@dataclass(frozen=True)
class ActionKind:
    """One coding-agent action: a shell command run in the sandbox, and its workload role."""

    name: str
    role: str  # "env" (an agent command), "reward" (the test suite), "part" (see part_of)
    command: str
    what: str
    #: For a "part" kind: the kind whose serial part it runs alone (startup, collection, the
    #: up-to-date walk, the links), measured right after that kind in every round.
    part_of: str | None = None


# Every command copies what it writes into /work (the image is read-only) on its first run,
# which is a warm-up run, so the timed runs do the action's work alone.
ACTIONS: Mapping[str, ActionKind] = {
    a.name: a
    for a in (
        ActionKind(
            "pytest",
            "reward",
            "[ -d /work/suite ] || cp -r /opt/profile/suite /work/suite; cd /work/suite && "
            "CI=1 PYTHONPATH=/opt/profile/site python3 -m pytest -q -p no:cacheprovider "
            "-n $TANGRAM_CORES tests/core >/dev/null",
            "pytest -n <cores> (pytest-xdist) of Tangram's tests/core: 117 tests, hypothesis "
            "derandomized",
        ),
        ActionKind(
            "compileall",
            "env",
            "[ -d /work/pkgs ] || cp -r /opt/profile/site /work/pkgs; "
            "python3 -m compileall -q -f -j $TANGRAM_CORES /work/pkgs >/dev/null",
            "python -m compileall -f -j <cores> of numpy, scipy, hypothesis, pytest (2,069 files)",
        ),
        ActionKind(
            "grep",
            "env",
            "grep -rnI 'def \\|import' /usr /opt/profile | wc -l >/dev/null",
            "grep -r over /usr and /opt/profile (~100k matching lines); grep has no -j",
        ),
        ActionKind(
            "pip-install",
            "env",
            "rm -rf /work/venv /work/tmp; mkdir /work/tmp; "
            f"TMPDIR=/work/tmp python3 {PIP} install -q --no-index --no-cache-dir "
            "--disable-pip-version-check --find-links /opt/profile/wheels --target /work/venv "
            "pytest pytest-xdist hypothesis numpy",
            "pip install --no-index from a local directory of 12 wheels (with numpy); pip has "
            "no -j",
        ),
        ActionKind(
            "make",
            "env",
            "[ -d /work/lua ] || cp -r /opt/profile/lua /work/lua; cd /work/lua/src && "
            "make -s clean && make -s -j$TANGRAM_CORES linux >/dev/null 2>&1",
            "make clean && make -j <cores> of Lua 5.4 (Debian's source: 34 C files, gcc -O2)",
        ),
        ActionKind(
            "pytest-startup",
            "part",
            "[ -d /work/suite ] || cp -r /opt/profile/suite /work/suite; cd /work/suite && "
            "CI=1 PYTHONPATH=/opt/profile/site python3 -m pytest -q -p no:cacheprovider "
            "-n $TANGRAM_CORES --collect-only tests/core >/dev/null",
            "the pytest kind's serial part: start, spawn the workers, import and collect "
            "(--collect-only), no test run",
            part_of="pytest",
        ),
        ActionKind(
            "compileall-walk",
            "part",
            "[ -d /work/pkgs ] || { cp -r /opt/profile/site /work/pkgs && python3 -m compileall "
            "-q -j $TANGRAM_CORES /work/pkgs >/dev/null; }; "
            "python3 -m compileall -q -j 1 /work/pkgs >/dev/null",
            "the compileall kind's serial part: start and walk the tree with every file up to "
            "date (one process), no compiling",
            part_of="compileall",
        ),
        ActionKind(
            "make-link",
            "part",
            "[ -d /work/lua ] || cp -r /opt/profile/lua /work/lua; cd /work/lua/src && "
            "{ [ -f lvm.o ] || make -s linux >/dev/null 2>&1; }; "
            "rm -f liblua.a lua luac && make -s linux >/dev/null 2>&1",
            "the make kind's serial part: the archive and the two links, every object up to date",
            part_of="make",
        ),
    )
}


# --- fitting and aggregation (pure: tests/scripts/test_profile_coding_actions.py) -------------


def fit_points(points: Mapping[int, Sequence[float]]) -> dict[str, float]:
    """Amdahl fit of the median run per core count: serial fraction, one-core time, error."""
    fit = fit_amdahl([(m, statistics.median(runs)) for m, runs in points.items()])
    return {
        "serial_fraction": fit.curve.serial_fraction,
        "t1_s": fit.curve.t1_seconds,
        "rel_rms_error": fit.rel_rms_error,
    }


def pool_runs(
    rounds: Sequence[Mapping[int, Sequence[tuple[float, bool]]]], *, min_clean: int = 3
) -> tuple[dict[int, list[float]], bool]:
    """All rounds' runs per core count, given as (seconds, disturbed): the undisturbed ones, or
    every run when some core count has fewer than ``min_clean`` undisturbed runs (then the
    second value, ``clean``, is False)."""
    if not rounds:
        raise ValueError("no rounds to pool")
    clean: dict[int, list[float]] = {}
    every: dict[int, list[float]] = {}
    for r in rounds:
        for m, runs in r.items():
            every.setdefault(m, []).extend(t for t, _ in runs)
            clean.setdefault(m, []).extend(t for t, bad in runs if not bad)
    if all(len(runs) >= min_clean for runs in clean.values()):
        return dict(sorted(clean.items())), True
    return dict(sorted(every.items())), False


def bootstrap_serial_fraction(
    points: Mapping[int, Sequence[float]], *, samples: int, seed: int
) -> list[float]:
    """Serial fractions fitted to ``samples`` resamplings (with replacement, per core count) of
    the runs: the spread the repeats allow, seeded."""
    rng = random.Random(seed)
    out = []
    for _ in range(samples):
        resampled = {m: rng.choices(list(runs), k=len(runs)) for m, runs in points.items()}
        out.append(fit_points(resampled)["serial_fraction"])
    return out


def percentile(values: Sequence[float], q: float) -> float:
    """The q-th percentile (0..100) of ``values``, linear between order statistics."""
    if not values:
        raise ValueError("percentile of no values")
    xs = sorted(values)
    pos = (len(xs) - 1) * q / 100.0
    lo, hi = math.floor(pos), math.ceil(pos)
    return xs[lo] + (xs[hi] - xs[lo]) * (pos - lo)


def two_point_serial_fraction(t1: float, t2: float) -> float:
    """Amdahl's serial fraction from one- and two-core times: s = 2 * t2 / t1 - 1, in [0, 1]."""
    return min(1.0, max(0.0, 2.0 * t2 / t1 - 1.0))


def beta_from_moments(mean: float, var: float) -> tuple[float, float]:
    """Beta(alpha, beta) with this mean and variance (method of moments)."""
    if not 0.0 < mean < 1.0:
        raise ValueError(f"a Beta's mean lies in (0, 1), got {mean}")
    if not 0.0 < var < mean * (1.0 - mean):
        raise ValueError(f"a Beta with mean {mean} needs 0 < variance < {mean * (1 - mean)}")
    k = mean * (1.0 - mean) / var - 1.0
    return mean * k, (1.0 - mean) * k


def mixture_moments(components: Sequence[tuple[float, float, float]]) -> tuple[float, float]:
    """Mean and variance of a mixture of (weight, mean, variance) components (weights normed)."""
    total = sum(w for w, _, _ in components)
    if total <= 0 or any(w < 0 for w, _, _ in components):
        raise ValueError("mixture weights must be >= 0 with a positive sum")
    mean = sum(w * m for w, m, _ in components) / total
    second = sum(w * (v + m * m) for w, m, v in components) / total
    return mean, max(0.0, second - mean * mean)


def clamp_open(x: float, eps: float = 1e-3) -> float:
    """``x`` moved into [eps, 1 - eps], so a fraction measured as 0 or 1 can be a Beta's mean."""
    return min(1.0 - eps, max(eps, x))


def serial_fraction_used(kind: Mapping[str, Any]) -> float:
    """A kind's serial fraction for the Betas: the decomposition of minima (the least contended
    runs) where the kind has one, else the wall-clock fit of the fastest run per core count
    (contention only adds time)."""
    dec = kind.get("decomposition")
    if dec:
        return dec["of_minima"]
    return kind["fit_of_minima"]["serial_fraction"]


def suggest_betas(
    kinds: Mapping[str, Mapping[str, Any]],
    env_weights: Mapping[str, float],
    reward_concentration: float,
    kind_sd: float = 0.05,
) -> dict[str, Any]:
    """Beta(alpha, beta) for env actions (a weighted mixture of the env kinds' fractions,
    ``serial_fraction_used``, each spread by ``kind_sd`` for the differences between one
    kind's actions in different projects, which no repeat measures) and for the reward (the test suite's fitted fraction as
    the mean, ``reward_concentration`` = alpha + beta for the spread across suites, which one
    suite cannot measure)."""
    comps, used = [], {}
    for name, w in env_weights.items():
        if w <= 0 or name not in kinds:
            continue
        comps.append((w, clamp_open(serial_fraction_used(kinds[name])), kind_sd**2))
        used[name] = serial_fraction_used(kinds[name])
    out: dict[str, Any] = {}
    if comps:
        mean, var = mixture_moments(comps)
        var = min(max(var, 1e-6), 0.999 * mean * (1 - mean))
        a, b = beta_from_moments(mean, var)
        out["env"] = {
            "weights": dict(zip(used, (w for w, _, _ in comps), strict=True)),
            "fractions": used,
            "kind_sd": kind_sd,
            "mean": mean,
            "sd": math.sqrt(var),
            "alpha": a,
            "beta": b,
        }
    rewards = [k for k in kinds.values() if k["role"] == "reward"]
    if rewards:
        mean = clamp_open(statistics.mean(serial_fraction_used(k) for k in rewards))
        out["reward"] = {
            "kinds": [k["name"] for k in rewards],
            "mean": mean,
            "concentration": reward_concentration,
            "alpha": mean * reward_concentration,
            "beta": (1 - mean) * reward_concentration,
        }
    return out


def summarize_kind(
    kind: ActionKind,
    rounds: Sequence[Mapping[str, Any]],
    *,
    bootstrap: int,
    seed: int,
) -> dict[str, Any] | None:
    """One kind's pooled points, pooled fit, per-round fits and the serial fraction's spread
    (rounds that failed are counted and left out; None when every round failed)."""
    errors = [r["error"] for r in rounds if "error" in r]
    rounds = [r for r in rounds if "error" not in r]
    if not rounds:
        return None
    runs_by_round = [
        {p["cores"]: list(zip(p["runs"], p["disturbed"], strict=True)) for p in r["points"]}
        for r in rounds
    ]
    pooled, clean = pool_runs(runs_by_round)
    fit = fit_points(pooled)
    fit_min = fit_amdahl([(m, min(runs)) for m, runs in pooled.items()])
    boot = bootstrap_serial_fraction(pooled, samples=bootstrap, seed=seed)
    per_round = [r["fit"]["serial_fraction"] for r in rounds]
    return {
        "name": kind.name,
        "role": kind.role,
        "what": kind.what,
        "command": kind.command,
        "runs_disturbed": sum(sum(p["disturbed"]) for r in rounds for p in r["points"]),
        "runs_total": sum(len(p["runs"]) for r in rounds for p in r["points"]),
        "pooled_clean_only": clean,
        "rounds_failed": len(errors),
        "errors": errors,
        "points": [
            {
                "cores": m,
                "runs": len(runs),
                "median_s": statistics.median(runs),
                "min_s": min(runs),
                "max_s": max(runs),
                "speedup": statistics.median(pooled[min(pooled)]) / statistics.median(runs),
            }
            for m, runs in pooled.items()
        ],
        "fit": fit,
        "fit_of_minima": {
            "serial_fraction": fit_min.curve.serial_fraction,
            "t1_s": fit_min.curve.t1_seconds,
            "rel_rms_error": fit_min.rel_rms_error,
        },
        "two_core_counts": len(pooled) == 2,
        "serial_fraction": {
            "fit": fit["serial_fraction"],
            "rounds": per_round,
            "rounds_min": min(per_round),
            "rounds_max": max(per_round),
            "bootstrap_p05": percentile(boot, 5),
            "bootstrap_p95": percentile(boot, 95),
            "bootstrap_sd": statistics.pstdev(boot),
        },
    }


# --- measuring ------------------------------------------------------------------------------


PRESSURE = Path("/proc/pressure/cpu")


def cpu_pressure() -> tuple[float, int] | None:
    """The machine's CPU pressure (PSI "some"): the 10-s average share of time some runnable
    task waited for a CPU (percent), and the cumulative waiting microseconds; None without PSI."""
    try:
        fields = dict(f.split("=") for f in PRESSURE.read_text().splitlines()[0].split()[1:])
    except (OSError, ValueError, IndexError):
        return None
    return float(fields["avg10"]), int(fields["total"])


def wait_for_quiet(limit_pct: float, max_wait_s: float) -> tuple[float, float | None]:
    """Wait (at most ``max_wait_s``) until CPU pressure's 10-s average is at most ``limit_pct``;
    the seconds waited and the pressure then (None without PSI)."""
    t0 = time.monotonic()
    while True:
        now = cpu_pressure()
        waited = time.monotonic() - t0
        if now is None or now[0] <= limit_pct or waited >= max_wait_s:
            return waited, None if now is None else now[0]
        time.sleep(1.0)


def _read_stat() -> tuple[int, list[tuple[int, int]]]:
    """Runnable threads now, and (busy, total) jiffies per core, from /proc/stat."""
    running, cores = 0, []
    for line in Path("/proc/stat").read_text().splitlines():
        if line.startswith("cpu") and line[3:4].isdigit():
            v = [int(x) for x in line.split()[1:]]
            idle = v[3] + v[4]
            cores.append((sum(v) - idle, sum(v)))
        elif line.startswith("procs_running"):
            running = int(line.split()[1])
    return running, cores


class LoadSampler:
    """Samples the machine's load every ``interval_s`` on a thread: runnable threads, per-core
    busy jiffies, 1-minute load average; ``window`` summarises a time span."""

    def __init__(self, interval_s: float = 0.2) -> None:
        self.interval_s = interval_s
        self.samples: list[tuple[float, int, list[tuple[int, int]], float, int | None]] = []
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._loop, name="load-sampler", daemon=True)

    def __enter__(self) -> LoadSampler:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join()

    def _loop(self) -> None:
        while not self._stop.is_set():
            running, cores = _read_stat()
            load1 = float(Path("/proc/loadavg").read_text().split()[0])
            psi = cpu_pressure()
            self.samples.append((time.monotonic(), running, cores, load1, psi and psi[1]))
            self._stop.wait(self.interval_s)

    def window(self, start: float, end: float, cores: Sequence[int]) -> dict[str, Any]:
        """Load between monotonic ``start`` and ``end``: mean runnable threads (less the
        sampler), how many exceeded the machine's cores (``oversubscribed``), busy share of the
        granted ``cores`` and of the machine, the share of the time some task waited for a CPU
        (``cpu_pressure``, PSI), 1-minute load average at both ends."""
        inside = [s for s in self.samples if start <= s[0] <= end]
        before = [s for s in self.samples if s[0] <= start][-1:] or inside[:1]
        after = [s for s in self.samples if s[0] >= end][:1] or inside[-1:]
        if not before or not after:
            return {"samples": 0}
        around = inside or before + after
        running = statistics.mean(s[1] for s in around) - 1.0
        first, last = before[0], after[0]
        ncpu = len(first[2])

        def busy(ids: Sequence[int]) -> float:
            d_busy = sum(last[2][i][0] - first[2][i][0] for i in ids)
            d_total = sum(last[2][i][1] - first[2][i][1] for i in ids)
            return d_busy / d_total if d_total else float("nan")

        span = last[0] - first[0]
        pressure = (
            (last[4] - first[4]) / (span * 1e6)
            if span > 0 and last[4] is not None and first[4] is not None
            else None
        )
        return {
            "samples": len(inside),
            "running": running,
            "cpu_pressure": pressure,
            "oversubscribed": max(0.0, running - ncpu),
            "load1_start": first[3],
            "load1_end": last[3],
            "granted_busy": busy(cores),
            "machine_busy": busy(range(ncpu)),
        }


def machine_info() -> dict[str, Any]:
    """The machine and software a profile was taken on."""

    def sh(cmd: list[str]) -> str:
        try:
            return subprocess.run(cmd, capture_output=True, text=True, timeout=30).stdout.strip()
        except (OSError, subprocess.SubprocessError):
            return ""

    model = next(
        (
            line.split(":", 1)[1].strip()
            for line in Path("/proc/cpuinfo").read_text().splitlines()
            if line.startswith("model name")
        ),
        platform.processor(),
    )
    return {
        "cpu_model": model,
        "cpus": os.cpu_count(),
        "memory_gb": round(os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES") / 2**30, 1),
        "kernel": platform.release(),
        "docker": sh(["docker", "version", "--format", "{{.Server.Version}}"]),
        "image_id": sh(["docker", "image", "inspect", "-f", "{{.Id}}", IMAGE]),
        "tangram_commit": sh(["git", "-C", str(ROOT), "rev-parse", "HEAD"]),
    }


def round_order(kinds: Sequence[ActionKind], rng: random.Random) -> list[ActionKind]:
    """The kinds of one round in a random order, each "part" kind right after its whole kind
    (so the two see the same load) or, when that kind is not profiled, on its own."""
    names = {k.name for k in kinds}
    heads = [k for k in kinds if k.part_of not in names]
    rng.shuffle(heads)
    out = []
    for head in heads:
        out.append(head)
        out += [k for k in kinds if k.part_of == head.name and head.part_of is None]
    return out


def measure(
    args: argparse.Namespace,
    kinds: Sequence[ActionKind],
    checkpoint: Callable[[dict[str, list[dict[str, Any]]]], None],
) -> dict[str, Any]:
    """Run every kind ``args.rounds`` times through profile_command; raw rounds per kind (a
    failed profile is kept as its error and the others go on); ``checkpoint`` gets them so far
    after each profile, so a run stopped early keeps what it measured.
    """
    from tqdm import tqdm

    from tangram.exec.aoe.config import AoeConfig, SandboxConfig
    from tangram.exec.aoe.errors import AoeError
    from tangram.exec.aoe.manager import AoeManager
    from tangram.exec.aoe.profile import profile_command
    from tangram.exec.aoe.topology import choose_cores

    rng = random.Random(args.seed)
    raw: dict[str, list[dict[str, Any]]] = {k.name: [] for k in kinds}
    config = AoeConfig(image=args.image, sandbox=SandboxConfig(work_size_mb=args.work_mb))
    with AoeManager(config) as manager, LoadSampler() as sampler:
        top = args.max_cores or len(manager.topology.cores)
        total = args.rounds * len(kinds) * top * args.repeat
        bar = tqdm(total=total, unit="run", file=sys.stderr, disable=args.no_progress)
        for rnd in range(args.rounds):
            order = round_order(kinds, rng)
            for kind in order:
                bar.set_description(f"round {rnd + 1}/{args.rounds} {kind.name}")
                ends: dict[int, list[tuple[float, float]]] = {}

                def progress(m: int, i: int, exec_s: float, ends: dict = ends) -> None:
                    ends.setdefault(m, []).append((time.monotonic(), exec_s))
                    bar.update(1)

                waited, pressure = (
                    wait_for_quiet(args.quiet_pressure, args.quiet_wait)
                    if args.quiet_wait > 0
                    else (0.0, None)
                )
                gate = {"waited_s": round(waited, 1), "pressure_avg10_at_start": pressure}
                started = datetime.now(UTC).isoformat(timespec="seconds")
                try:
                    profile = profile_command(
                        manager,
                        kind.command,
                        max_cores=top,
                        repeat=args.repeat,
                        warmup=args.warmup,
                        timeout_s=args.timeout,
                        memory_gb=args.memory_gb,
                        progress=progress,
                    )
                except AoeError as exc:
                    print(f"\n{kind.name}, round {rnd + 1}: {exc}", file=sys.stderr)
                    raw[kind.name].append(
                        {"round": rnd, "started_utc": started, **gate, "error": str(exc)}
                    )
                    bar.update(top * args.repeat - sum(len(v) for v in ends.values()))
                    checkpoint(raw)
                    continue
                points = []
                for p in profile.points:
                    granted = choose_cores(manager.topology, manager.topology.cores, p.cores)
                    loads = [sampler.window(end - t, end, granted) for end, t in ends[p.cores]]
                    points.append(
                        {
                            "cores": p.cores,
                            "runs": list(p.runs),
                            "median_s": p.median_s,
                            "load": loads,
                            "disturbed": [
                                w.get("oversubscribed", 0.0) > args.disturbed_above for w in loads
                            ],
                        }
                    )
                raw[kind.name].append(
                    {
                        "round": rnd,
                        "started_utc": started,
                        **gate,
                        "points": points,
                        "fit": {
                            "serial_fraction": profile.fit.curve.serial_fraction,
                            "t1_s": profile.fit.curve.t1_seconds,
                            "rel_rms_error": profile.fit.rel_rms_error,
                        },
                    }
                )
                checkpoint(raw)
        bar.close()
    return raw


def parse_weights(text: str) -> dict[str, float]:
    """``name=w,name=w`` into a dict, naming a malformed entry or an unknown kind."""
    out = {}
    for part in filter(None, (p.strip() for p in text.split(","))):
        name, sep, value = part.partition("=")
        if not sep or name not in ACTIONS:
            raise argparse.ArgumentTypeError(
                f"bad weight {part!r}: expected KIND=WEIGHT, KIND one of {sorted(ACTIONS)}"
            )
        try:
            out[name] = float(value)
        except ValueError:
            raise argparse.ArgumentTypeError(
                f"weight of {name!r} is not a number: {value!r}"
            ) from None
        if out[name] < 0:
            raise argparse.ArgumentTypeError(f"weight of {name!r} must be >= 0, got {value}")
    return out


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--actions", default=",".join(ACTIONS), help="kinds to profile, comma-separated")
    p.add_argument("--rounds", type=int, default=3, help="times the whole set runs (default 3)")
    p.add_argument("--repeat", type=int, default=3, help="timed runs per core count and round")
    p.add_argument("--warmup", type=int, default=1, help="untimed runs per core count and round")
    p.add_argument("--max-cores", type=int, default=None, help="largest core count (default all)")
    p.add_argument("--timeout", type=float, default=600.0, help="seconds per run")
    p.add_argument("--memory-gb", type=float, default=3.0, help="container memory (default 3)")
    p.add_argument("--work-mb", type=int, default=1536, help="/work tmpfs size (default 1536)")
    p.add_argument("--image", default=IMAGE, help=f"sandbox image (default {IMAGE})")
    p.add_argument("--seed", type=int, default=0, help="round order and bootstrap seed")
    p.add_argument(
        "--quiet-wait",
        type=float,
        default=0.0,
        help="before each profile, wait up to this many seconds for the machine's CPU pressure "
        "(PSI some avg10) to fall to --quiet-pressure (default 0: do not wait)",
    )
    p.add_argument(
        "--quiet-pressure", type=float, default=20.0, help="percent, for --quiet-wait (default 20)"
    )
    p.add_argument("--bootstrap", type=int, default=2000, help="bootstrap resamplings")
    p.add_argument(
        "--disturbed-above",
        type=float,
        default=0.5,
        help="flag a run during which runnable threads exceeded the cores by more than this "
        "on average (default 0.5)",
    )
    p.add_argument(
        "--env-weights",
        type=parse_weights,
        default=ENV_WEIGHTS,
        help="env-action mix for the suggested Beta, KIND=W,... (default: "
        + ",".join(f"{k}={v}" for k, v in ENV_WEIGHTS.items())
        + "; docs/profiles.md says why)",
    )
    p.add_argument(
        "--kind-sd",
        type=float,
        default=0.05,
        help="spread of s among one kind's actions in the env Beta (default 0.05, ours)",
    )
    p.add_argument(
        "--reward-concentration",
        type=float,
        default=7.0,
        help="alpha + beta of the reward's Beta (default 7, the spread of the old Beta(1, 6))",
    )
    p.add_argument("--out", type=Path, default=OUT_DIR, help=f"directory (default {OUT_DIR})")
    p.add_argument("--no-progress", action="store_true", help="no progress bar")
    p.add_argument(
        "--write-md", type=Path, default=None, help="with --from-raw: write the markdown report"
    )
    p.add_argument("--json", action="store_true", help="print the document as JSON")
    p.add_argument(
        "--from-raw",
        type=Path,
        nargs="+",
        default=None,
        help="re-aggregate saved documents' raw rounds instead of measuring (several: their "
        "rounds pooled, the first one's header kept and the others' dates listed)",
    )
    return p


def merge_raw(raws: Sequence[Mapping[str, Sequence[Mapping[str, Any]]]]) -> dict[str, list]:
    """Several documents' raw rounds as one, per kind; each document's rounds are renumbered
    past the previous documents' (by the most rounds any of their kinds has), so a round
    number still names the same sitting for every kind."""
    out: dict[str, list[dict[str, Any]]] = {}
    offset = 0
    for raw in raws:
        for name, rounds in raw.items():
            out.setdefault(name, []).extend({**r, "round": offset + r["round"]} for r in rounds)
        offset += max((r["round"] + 1 for rounds in raw.values() for r in rounds), default=0)
    return out


def decomposition(
    whole: Sequence[Mapping[str, Any]], part: Sequence[Mapping[str, Any]], *, part_name: str
) -> dict[str, Any] | None:
    """Amdahl's serial fraction as the serial part's share of the one-core time: per round,
    median(part at 1 core) / median(whole at 1 core), the two measured back to back (a
    contention that slows both alike cancels), and ``of_minima``, the fastest part run over the
    fastest whole run of every round (each the least contended of its kind). The rest is
    assumed to divide perfectly among the cores, so either is a lower bound on s. None when no
    round has both."""

    def one_core(r: Mapping[str, Any]) -> float | None:
        runs = [p["runs"] for p in r.get("points", []) if p["cores"] == 1]
        return statistics.median(runs[0]) if runs and runs[0] else None

    wholes = {r["round"]: one_core(r) for r in whole}
    ratios = []
    for r in part:
        t_part, t_whole = one_core(r), wholes.get(r["round"])
        if t_part is not None and t_whole:
            ratios.append(min(1.0, t_part / t_whole))
    if not ratios:
        return None
    mins = [min(p["runs"]) for r in part for p in r.get("points", []) if p["cores"] == 1]
    minw = [min(p["runs"]) for r in whole for p in r.get("points", []) if p["cores"] == 1]
    return {
        "part": part_name,
        "of_minima": min(1.0, min(mins) / min(minw)),
        "serial_fraction": statistics.median(ratios),
        "rounds": ratios,
        "min": min(ratios),
        "max": max(ratios),
        "sd": statistics.pstdev(ratios),
    }


def aggregate(args: argparse.Namespace, raw: Mapping[str, Sequence[Mapping[str, Any]]]) -> dict:
    """Each kind's summary and the suggested Betas from the raw rounds; kinds whose every round
    failed are listed apart."""
    summaries = {
        name: summarize_kind(ACTIONS[name], rounds, bootstrap=args.bootstrap, seed=args.seed)
        for name, rounds in raw.items()
        if rounds
    }
    kinds = {name: k for name, k in summaries.items() if k is not None}
    for name in list(kinds):
        whole = ACTIONS[name].part_of
        if whole in kinds:
            kinds[whole]["decomposition"] = decomposition(raw[whole], raw[name], part_name=name)
    return {
        "kinds": kinds,
        "failed_kinds": sorted(name for name, k in summaries.items() if k is None),
        "unmeasured_kinds": sorted(name for name, rounds in raw.items() if not rounds),
        "suggested_beta": suggest_betas(
            kinds, args.env_weights, args.reward_concentration, args.kind_sd
        ),
    }


def table(doc: Mapping[str, Any]) -> str:
    """The kinds' serial fractions as an aligned plain-text table."""
    from tangram.report import format_table

    rows = []
    for k in doc["kinds"].values():
        sf, pts = k["serial_fraction"], {p["cores"]: p for p in k["points"]}
        rows.append(
            {
                "kind": k["name"],
                "role": k["role"],
                "t1_s": pts[1]["median_s"],
                "speedup@max": k["points"][-1]["speedup"],
                "s": sf["fit"],
                "s_p05": sf["bootstrap_p05"],
                "s_p95": sf["bootstrap_p95"],
                "rounds_min": sf["rounds_min"],
                "rounds_max": sf["rounds_max"],
                "rms_err": k["fit"]["rel_rms_error"],
                "s_of_min": k["fit_of_minima"]["serial_fraction"],
                "s_decomp": (k.get("decomposition") or {}).get("serial_fraction", float("nan")),
                "s_dec_min": (k.get("decomposition") or {}).get("of_minima", float("nan")),
                "disturbed": f"{k['runs_disturbed']}/{k['runs_total']}",
                "pooled": "clean" if k["pooled_clean_only"] else "all",
            }
        )
    lines = [format_table(rows)]
    if doc.get("failed_kinds"):
        lines.append(f"every round failed (see the document's errors): {doc['failed_kinds']}")
    for role, b in doc["suggested_beta"].items():
        lines.append(f"{role}: Beta({b['alpha']:.2f}, {b['beta']:.2f}) (mean {b['mean']:.3f})")
    return "\n".join(lines)


def amdahl_speedup(s: float, m: int) -> float:
    """Amdahl's speedup at m cores for serial fraction s."""
    return 1.0 / (s + (1.0 - s) / m)


def markdown(doc: Mapping[str, Any]) -> str:
    """The document as a short markdown report: machine, load, per-kind points and fits."""
    from tangram.report import format_number as f

    mach = doc.get("machine", {})
    out = [
        f"# Coding-action profiles, {doc.get('date_utc', '?')}",
        "",
        f"Machine: {mach.get('cpus', '?')} x {mach.get('cpu_model', '?')}, "
        f"{mach.get('memory_gb', '?')} GB, kernel {mach.get('kernel', '?')}, Docker "
        f"{mach.get('docker', '?')}; image {mach.get('image_id', '?')[:19]}; Tangram "
        f"{mach.get('tangram_commit', '?')[:10]}. Load average (1/5/15 min) before "
        f"{doc.get('loadavg_before')}, after {doc.get('loadavg_after')}; "
        f"{doc.get('duration_s', '?')} s. Settings: {json.dumps(doc.get('settings', {}))}.",
        "",
        "| kind | cores | runs | median s | min s | max s | speedup | mean runnable | "
        "CPU pressure | disturbed |",
        "|---|---|---|---|---|---|---|---|---|---|",
    ]
    for name, k in doc["kinds"].items():
        loads: dict[int, list[dict[str, Any]]] = {}
        flags: dict[int, list[bool]] = {}
        for r in doc.get("raw", {}).get(name, []):
            for p in r.get("points", []):
                loads.setdefault(p["cores"], []).extend(p.get("load", []))
                flags.setdefault(p["cores"], []).extend(p["disturbed"])
        for p in k["points"]:
            runnable = [w["running"] for w in loads.get(p["cores"], []) if "running" in w]
            mean_run = f(statistics.mean(runnable)) if runnable else "-"
            psi = [w["cpu_pressure"] for w in loads.get(p["cores"], []) if w.get("cpu_pressure")]
            mean_psi = f"{statistics.mean(psi):.0%}" if psi else "-"
            bad = flags.get(p["cores"], [])
            out.append(
                f"| {name} | {p['cores']} | {p['runs']} | {f(p['median_s'])} | {f(p['min_s'])} | "
                f"{f(p['max_s'])} | {f(p['speedup'])} | {mean_run} | {mean_psi} | "
                f"{sum(bad)}/{len(bad)} |"
            )
    out += [
        "",
        "| kind | role | serial fraction | bootstrap p05-p95 | rounds min-max | of minima | "
        "rel RMS error | pooled | predicted speedup at 16 (p05-p95 s) | decomposition "
        "(rounds min-max); of minima |",
        "|---|---|---|---|---|---|---|---|---|---|",
    ]
    for name, k in doc["kinds"].items():
        sf = k["serial_fraction"]
        lo, hi = sf["bootstrap_p05"], sf["bootstrap_p95"]
        dec = k.get("decomposition")
        decomp = (
            f"{f(dec['serial_fraction'])} ({f(dec['min'])}-{f(dec['max'])}); of minima "
            f"{f(dec['of_minima'])} (`{dec['part']}`)"
            if dec
            else "-"
        )
        out.append(
            f"| {name} | {k['role']} | {f(sf['fit'])} | {f(lo)}-{f(hi)} | "
            f"{f(sf['rounds_min'])}-{f(sf['rounds_max'])} | "
            f"{f(k['fit_of_minima']['serial_fraction'])} | {f(k['fit']['rel_rms_error'])} | "
            f"{'undisturbed runs' if k['pooled_clean_only'] else 'all runs'} | "
            f"{f(amdahl_speedup(sf['fit'], 16))} ({f(amdahl_speedup(hi, 16))}-"
            f"{f(amdahl_speedup(lo, 16))}) | {decomp} |"
        )
    if doc.get("failed_kinds"):
        out += ["", f"Every round failed for {doc['failed_kinds']} (errors in the JSON)."]
    if doc.get("unmeasured_kinds"):
        out += ["", f"Not measured (the run stopped first): {doc['unmeasured_kinds']}."]
    out += ["", "Suggested Betas:", ""]
    for role, b in doc["suggested_beta"].items():
        src = b.get("weights") or b.get("kinds")
        out.append(
            f"- {role}: Beta({b['alpha']:.3g}, {b['beta']:.3g}), mean {b['mean']:.3f} (from {src})"
        )
    return "\n".join(out) + "\n"


def _interrupt(signum: int, frame: object) -> None:
    """SIGTERM as Ctrl-C, so the AOE manager's ``with`` removes the container on the way out."""
    raise KeyboardInterrupt


def main(argv: Sequence[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    names = [n.strip() for n in args.actions.split(",") if n.strip()]
    unknown = [n for n in names if n not in ACTIONS]
    if unknown:
        print(f"unknown action kind(s) {unknown}; known: {sorted(ACTIONS)}", file=sys.stderr)
        return 2
    if args.rounds < 1 or args.repeat < 1 or args.warmup < 1:
        print(
            "--rounds and --repeat must be >= 1, --warmup >= 1 (it copies inputs)", file=sys.stderr
        )
        return 2
    if args.from_raw:
        docs = [json.loads(path.read_text()) for path in args.from_raw]
        doc = {k: v for k, v in docs[0].items() if k not in ("kinds", "suggested_beta")}
        doc["raw"] = merge_raw([d["raw"] for d in docs])
        if len(docs) > 1:
            doc["pooled_from"] = [d.get("date_utc") for d in docs]
        doc.update(aggregate(args, doc["raw"]))
        if args.write_md:
            args.write_md.write_text(markdown(doc))
    else:
        signal.signal(signal.SIGTERM, _interrupt)
        subprocess.run([str(ROOT / "scripts" / "ensure-profile-image.sh")], check=True)
        started = datetime.now(UTC)
        path = args.out / f"coding_actions.{started.strftime('%Y%m%dT%H%MZ')}.json"
        args.out.mkdir(parents=True, exist_ok=True)
        t0 = time.monotonic()
        doc = {
            "date_utc": started.isoformat(timespec="seconds"),
            "machine": machine_info(),
            "loadavg_before": [float(x) for x in Path("/proc/loadavg").read_text().split()[:3]],
            "settings": {
                k: getattr(args, k)
                for k in (
                    "rounds",
                    "repeat",
                    "warmup",
                    "max_cores",
                    "seed",
                    "bootstrap",
                    "disturbed_above",
                    "quiet_wait",
                    "quiet_pressure",
                    "memory_gb",
                    "image",
                    "env_weights",
                    "kind_sd",
                    "reward_concentration",
                )
            },
            "equivalent_cli": {
                n: f"tangram profile-cpu --image {args.image} --repeat {args.repeat} "
                f"--warmup {args.warmup} -- {json.dumps(ACTIONS[n].command)}"
                for n in names
            },
        }

        def save(raw: Mapping[str, Any]) -> None:
            path.write_text(json.dumps({**doc, "raw": raw}, indent=1) + "\n")

        raw = measure(args, [ACTIONS[n] for n in names], save)
        doc["duration_s"] = round(time.monotonic() - t0, 1)
        doc["loadavg_after"] = [float(x) for x in Path("/proc/loadavg").read_text().split()[:3]]
        doc["raw"] = raw
        doc.update(aggregate(args, raw))
        path.write_text(json.dumps(doc, indent=1) + "\n")
        path.with_suffix(".md").write_text(markdown(doc))
        print(f"wrote {path} and its .md", file=sys.stderr)
    if args.json:
        print(json.dumps(doc, indent=1))
    else:
        print(table(doc))
    return 0


if __name__ == "__main__":
    sys.exit(main())
