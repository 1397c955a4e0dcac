#!/usr/bin/env python3
"""Fingerprint the scheduler's decisions over a fixed set of replays, to prove a refactor
changed no behaviour.

Each case replays a generated trace in the simulator and hashes, separately:
- ``actions``: every action's start, finish, units, node, overhead, execution, outcome,
  restore, evictions and deferrals (floats by ``repr``, so bit for bit);
- ``reasons``: every action's decision reason (a reworded reason changes only this one);
- ``steps``: every RL step's start, rollout end and end, and every trajectory's bounds;
- ``timeline``: the usage timeline (time, held cores, held GPUs, API calls after each event).

The cases cover closed and open loop, every bundled policy, the ``paper`` and ``local``
clusters, arrival ties (open-loop arrivals rounded to whole seconds), execution noise,
rejections, memory waits and API rate limits.

    python scripts/decision_fingerprint.py --write before.json    # on the old commit
    python scripts/decision_fingerprint.py --check before.json    # on the new one: exit 1 on a difference
"""

from __future__ import annotations

import argparse
import dataclasses
import hashlib
import json
import sys
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from pathlib import Path

from tangram.core.cluster_file import load_cluster
from tangram.core.resources import ClusterSpec, CpuNodeSpec
from tangram.sim.config import Overheads, RolloutConfig, SimConfig
from tangram.sim.driver import SimResult, simulate
from tangram.sim.workloads import generate
from tangram.trace import Trace


@dataclass(frozen=True)
class Case:
    """One replay: a workload, a cluster, a policy and how arrivals are driven."""

    name: str
    workload: str
    batch: int
    cluster: str
    policy: str
    open_loop: bool = False
    noise: float = 0.0
    steps: int = 1
    seed: int = 0
    #: Shrink the cluster's CPU nodes to this many GB of memory (containers then wait for memory).
    memory_gb: float | None = None
    #: Shrink the cluster to this many GPUs (services contend, restore and evict).
    gpus: int | None = None
    #: Limit every API endpoint to this many call starts per second (burst 1): the scheduler
    #: then asks its driver for wake-ups (``next_wakeup`` / ``tick``).
    api_rate: float | None = None


CASES: tuple[Case, ...] = (
    # Closed loop on the paper's testbed: each workload under the policies it exercises.
    Case("coding-paper-tangram", "coding", 1280, "paper", "tangram"),
    Case("coding-paper-k8s", "coding", 1280, "paper", "k8s-static"),
    Case("coding-paper-fixed4", "coding", 1280, "paper", "fixed:4"),
    Case("coding-paper-lower", "coding", 512, "paper", "lower-bound"),
    Case("mopd-paper-tangram", "mopd", 1024, "paper", "tangram"),
    Case("mopd-paper-sglang", "mopd", 1024, "paper", "sglang-static"),
    Case("mopd-paper-fixed4", "mopd", 512, "paper", "fixed:4"),
    Case("deepsearch-paper-tangram", "deepsearch", 1024, "paper", "tangram"),
    Case("deepsearch-paper-k8s", "deepsearch", 512, "paper", "k8s-static:8"),
    # The 2-core local cluster: contention everywhere, models that do not fit (rejections).
    Case("coding-local-tangram", "coding", 48, "local", "tangram", steps=2),
    Case("coding-local-fixed16", "coding", 32, "local", "fixed:16"),
    Case("mopd-local-tangram", "mopd", 32, "local", "tangram"),
    Case("deepsearch-local-tangram", "deepsearch", 48, "local", "tangram:4"),
    Case("deepsearch-local-sglang", "deepsearch", 32, "local", "sglang-static:1"),
    # A small GPU pool: nine teachers contend for 8 GPUs (restores, evictions, waits).
    Case("mopd-gpu8-tangram", "mopd", 1024, "paper", "tangram", steps=2, gpus=8),
    Case("mopd-gpu8-fixed1", "mopd", 1024, "paper", "fixed:1", gpus=8),
    Case("mopd-gpu16-sglang", "mopd", 1024, "paper", "sglang-static:2", gpus=16),
    # A rate-limited search API: starts wait for tokens, the driver ticks the core.
    Case("deepsearch-rate-tangram", "deepsearch", 256, "paper", "tangram", api_rate=5.0),
    Case(
        "deepsearch-rate-open-k8s",
        "deepsearch",
        256,
        "paper",
        "k8s-static",
        True,
        0.2,
        api_rate=3.0,
    ),
    # Open loop: arrivals at whole seconds (ties), 20% execution noise.
    Case("coding-open-tangram", "coding", 512, "paper", "tangram", open_loop=True, noise=0.2),
    Case("mopd-open-tangram", "mopd", 1024, "paper", "tangram", True, 0.2, gpus=8),
    Case("deepsearch-open-fixed4", "deepsearch", 512, "paper", "fixed:4", True, 0.2),
    Case("coding-open-local-k8s", "coding", 32, "local", "k8s-static:1", True, 0.2),
    # Memory pressure: containers wait for memory on a small node.
    Case("coding-memory-tangram", "coding", 64, "local", "tangram", memory_gb=24.0),
    Case("coding-memory-k8s", "coding", 64, "local", "k8s-static:2", memory_gb=24.0),
)
#: Every default-policy case again under the paper's policy (issue 11 kept it as
#: ``tangram-paper``: these must decide as the default did before issue 11).
CASES += tuple(
    dataclasses.replace(
        c, name=f"{c.name}-paper", policy=c.policy.replace("tangram", "tangram-paper")
    )
    for c in CASES
    if c.policy.startswith("tangram")
)


def with_tied_arrivals(trace: Trace) -> Trace:
    """The trace open loop: each action arrives at its trajectory's generation and one-unit
    times so far, rounded to whole seconds, so many actions arrive at the same instant."""
    rows = []
    for (_step, _traj), items in trace.trajectories().items():
        clock = 0.0
        for row in items:
            clock += row.gen_before_s
            rows.append(dataclasses.replace(row, arrival_s=float(round(clock))))
            clock += row.t1_s
    rows.sort(key=lambda r: (r.arrival_s, r.action_id))
    return Trace(tuple(rows), dict(trace.meta))


def cluster_for(case: Case) -> ClusterSpec:
    spec = load_cluster(case.cluster)
    if case.gpus is not None:
        spec = spec.scaled_gpus(case.gpus)
    if case.api_rate is not None:
        apis = tuple(dataclasses.replace(a, rate_per_s=case.api_rate, burst=1) for a in spec.apis)
        spec = dataclasses.replace(spec, apis=apis)
    if case.memory_gb is None:
        return spec
    nodes = tuple(
        CpuNodeSpec(n.name, n.cores, n.numa_domains, case.memory_gb) for n in spec.cpu_nodes
    )
    return dataclasses.replace(spec, cpu_nodes=nodes)


def replay(case: Case) -> SimResult:
    trace = generate(case.workload, batch=case.batch, steps=case.steps, seed=case.seed)
    if case.open_loop:
        trace = with_tied_arrivals(trace)
    config = SimConfig(
        policy=case.policy,
        seed=case.seed,
        overheads=Overheads(exec_noise_sigma=case.noise),
        rollout=RolloutConfig(mode="open" if case.open_loop else "closed"),
    )
    return simulate(trace, cluster_for(case), config)


def _digest(lines: Iterable[object]) -> str:
    h = hashlib.sha256()
    for line in lines:
        h.update(repr(line).encode())
        h.update(b"\n")
    return h.hexdigest()[:16]


def fingerprint(result: SimResult) -> dict[str, object]:
    actions = sorted(result.actions, key=lambda r: r.row.action_id)
    return {
        "actions": _digest(
            (
                r.row.action_id,
                r.arrival,
                r.start,
                r.finish,
                r.units,
                r.node,
                r.overhead,
                r.execution,
                r.restored,
                r.evictions,
                r.outcome,
                r.deferrals,
            )
            for r in actions
        ),
        "reasons": _digest((r.row.action_id, r.reason) for r in actions),
        "steps": _digest(
            [(s.step, s.start, s.rollout_end, s.end, s.trajectories) for s in result.steps]
            + [(t.step, t.trajectory, t.start, t.end, t.actions) for t in result.trajectories]
        ),
        "timeline": _digest(result.timeline.rows()),
        "n_actions": len(actions),
        "outcomes": dict(sorted(_count(r.outcome for r in actions).items())),
        "decisions": result.decisions,
        "makespan": repr(result.makespan),
    }


def _count(values: Iterable[str]) -> dict[str, int]:
    out: dict[str, int] = {}
    for v in values:
        out[v] = out.get(v, 0) + 1
    return out


def run_all(cases: Iterable[Case], say: Callable[[str], None]) -> dict[str, dict]:
    out = {}
    for case in cases:
        t0 = time.perf_counter()
        out[case.name] = fingerprint(replay(case))
        say(f"{case.name}: {out[case.name]['n_actions']} actions, {time.perf_counter() - t0:.1f} s")
    return out


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    group = parser.add_mutually_exclusive_group(required=True)
    group.add_argument("--write", type=Path, help="write the fingerprints to this JSON file")
    group.add_argument("--check", type=Path, help="compare with fingerprints written before")
    parser.add_argument("--only", nargs="*", help="case names to run (default: all)")
    parser.add_argument(
        "--as",
        dest="renames",
        action="append",
        default=[],
        metavar="OLD=NEW",
        help="replay the cases of policy OLD under NEW (e.g. tangram=tangram-paper: the paper's "
        "policy, renamed, must decide as the old default did)",
    )
    args = parser.parse_args(argv)
    renames = dict(r.split("=", 1) for r in args.renames)
    cases = [
        dataclasses.replace(c, policy=renames.get(c.policy, c.policy))
        for c in CASES
        if not args.only or c.name in args.only
    ]
    say = lambda s: print(s, file=sys.stderr, flush=True)  # noqa: E731
    got = run_all(cases, say)
    if args.write:
        args.write.write_text(json.dumps(got, indent=1, sort_keys=True) + "\n")
        print(f"{len(got)} fingerprints written to {args.write}")
        return 0
    want = json.loads(args.check.read_text())
    differ = 0
    for name, fp in got.items():
        ref = want.get(name)
        if ref is None:
            print(f"{name}: not in {args.check}")
            differ += 1
            continue
        bad = [k for k in fp if fp[k] != ref.get(k)]
        print(f"{name}: {'identical' if not bad else 'DIFFERENT in ' + ', '.join(bad)}")
        differ += bool(bad)
    print(f"{len(got) - differ} of {len(got)} replays identical")
    return 1 if differ else 0


if __name__ == "__main__":
    sys.exit(main())
