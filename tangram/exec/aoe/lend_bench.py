"""What a weighted grant lends: two actions on a 2-core pool, granted one core each.

Action A is single-threaded: idle (``sleep``), busy half the time (50 ms on, 50 ms off) or a
busy loop. Action B is a 2-thread busy loop. Each case runs with exclusive grants (cpuset =
the granted core, a one-core quota) and with weighted grants (cpuset = both cores, no quota,
equal weights); the figure is B's CPU seconds per second over a window while both run, read
from its container's cgroup, with the host's other load over the same window (the numbers are
only as quiet as the machine). Not a test: ``python -m tangram.exec.aoe.lend_bench``.
"""

from __future__ import annotations

import argparse
import json
import math
import threading
import time
from typing import Any

from tangram.report import int_in, seconds_in

#: A's single thread (Python), by case: what it leaves idle of its core.
_A_LOOP = (
    "import time\nend = time.monotonic() + {d}\nwhile time.monotonic() < end:\n"
    "    t = time.monotonic() + {on}\n    while time.monotonic() < t: pass\n"
    "    time.sleep({off})\n"
)
A_CASES = {
    "idle": "sleep {d}",
    "half": "python3 -c '" + _A_LOOP.replace("{on}", "0.05").replace("{off}", "0.05") + "'",
    "busy": "python3 -c '" + _A_LOOP.replace("{on}", "0.05").replace("{off}", "0") + "'",
}
#: B: two busy threads (two shells) for ``d`` seconds.
B_SCRIPT = (
    "(timeout {d} sh -c 'while :; do :; done') & "
    "timeout {d} sh -c 'while :; do :; done'; wait; true"
)


def _host_busy_s() -> float:
    import os

    with open("/proc/stat") as stat:
        fields = [int(x) for x in stat.readline().split()[1:]]
    return (sum(fields[:8]) - fields[3] - fields[4]) / os.sysconf("SC_CLK_TCK")


def wait_quiet(below: float, max_wait_s: float) -> float:
    """Wait until the host's load (over half a second) is under ``below`` cores, at most
    ``max_wait_s``; the last level seen (the machine may be shared)."""
    deadline = time.monotonic() + max_wait_s
    while True:
        b0, t0 = _host_busy_s(), time.monotonic()
        time.sleep(0.5)
        level = (_host_busy_s() - b0) / (time.monotonic() - t0)
        if level < below or time.monotonic() >= deadline:
            return level


def measure(aoe: Any, case: str, weighted: bool, window_s: float, settle_s: float) -> dict:
    """B's CPU seconds per second (and the host's, less A's and B's) over ``window_s``."""
    c0, c1 = aoe.topology.cores[:2]
    pool = (c0, c1)
    d = int(settle_s + window_s + 2)
    granted = threading.Barrier(3)
    out: dict[str, Any] = {}

    def run(traj: str, script: str, core: int) -> None:
        out[traj] = aoe.run_action(
            traj,
            script,
            (core,),
            timeout_s=d + 30,
            weighted=weighted,
            pool=pool if weighted else None,
            on_grant=lambda _grant: granted.wait(30),
        )

    threads = [
        threading.Thread(target=run, args=("lend-a", A_CASES[case].format(d=d), c0)),
        threading.Thread(target=run, args=("lend-b", B_SCRIPT.format(d=d), c1)),
    ]
    for t in threads:
        t.start()
    granted.wait(30)
    time.sleep(settle_s)
    a0, b0, h0, t0 = (
        aoe.cpu_usage_s("lend-a"),
        aoe.cpu_usage_s("lend-b"),
        _host_busy_s(),
        time.monotonic(),
    )
    time.sleep(window_s)
    a1, b1, h1, t1 = (
        aoe.cpu_usage_s("lend-a"),
        aoe.cpu_usage_s("lend-b"),
        _host_busy_s(),
        time.monotonic(),
    )
    for t in threads:
        t.join()
    span = t1 - t0
    return {
        "case": case,
        "grants": "weighted" if weighted else "exclusive",
        "a_cores": round((a1 - a0) / span, 3),
        "b_cores": round((b1 - b0) / span, 3),
        "other_cores": round(((h1 - h0) - (a1 - a0) - (b1 - b0)) / span, 3),
        "ok": all(o.status == "ok" for o in out.values()),
    }


#: The longest --window, --settle or --quiet-wait, and the most --repeats: each case runs
#: for its window and settle, six cases a repeat (a negative window failed in time.sleep and
#: NaN or inf in int(), once the containers were opened; 1e9 ran for ever).
HOUR_S = 3600.0
REPEATS_MAX = 100


def _seconds_from_0(text: str) -> float:
    """An argparse type: a finite number of seconds from 0 to an hour."""
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a number") from None
    if not (math.isfinite(value) and 0 <= value <= HOUR_S):
        raise argparse.ArgumentTypeError(
            f"must be a finite number of seconds from 0 to {HOUR_S:g}, got {text}"
        )
    return value


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument(
        "--window",
        type=seconds_in(0.0, HOUR_S),
        default=4.0,
        help="seconds measured (default 4, at most an hour)",
    )
    p.add_argument(
        "--settle",
        type=_seconds_from_0,
        default=0.5,
        help="seconds before it (default 0.5, at most an hour)",
    )
    p.add_argument(
        "--repeats",
        type=int_in(1, REPEATS_MAX, "each is six cases of --window seconds"),
        default=1,
    )
    p.add_argument(
        "--quiet-wait",
        type=_seconds_from_0,
        default=60.0,
        help="before each case, wait up to this many seconds for the host's other load to "
        "fall under 0.3 cores (default 60)",
    )
    p.add_argument("--json", action="store_true")
    args = p.parse_args(argv)
    from tangram.exec.aoe import AoeConfig, AoeManager

    rows = []
    with AoeManager(AoeConfig()) as aoe:
        if len(aoe.topology.cores) < 2:
            raise SystemExit("needs 2 cores")
        from tangram.exec.aoe.config import PYTHON_IMAGE

        aoe.open_trajectory("lend-a", image=PYTHON_IMAGE)
        aoe.open_trajectory("lend-b")
        for _ in range(args.repeats):
            for case in A_CASES:
                for weighted in (False, True):
                    wait_quiet(0.3, args.quiet_wait)
                    rows.append(measure(aoe, case, weighted, args.window, args.settle))
                    if not args.json:
                        r = rows[-1]
                        print(
                            f"A {r['case']:<5} {r['grants']:<9}  B {r['b_cores']:.2f} cores/s  "
                            f"A {r['a_cores']:.2f}  other load {r['other_cores']:.2f}"
                            + ("" if r["ok"] else "  (an action failed)"),
                            flush=True,
                        )
    if args.json:
        print(json.dumps(rows, indent=1))


if __name__ == "__main__":
    main()
