"""Summary statistics of a trace: what the workload docs and the calibration tests check.

Kept apart from the generators so that imported and recorded traces can be summarised the
same way (e.g. to compare a generated workload with a real one).
"""

from __future__ import annotations

from typing import Any

import numpy as np

from tangram.trace import Trace


def summarize(trace: Trace) -> dict[str, Any]:
    """Counts, per-kind mean ``t1_s``, generation time and busy share of a trace.

    ``busy_share`` is sum(t1) / (sum(t1) + sum(gen_before) + sum(gen_after)) over the whole
    trace; ``busy_share_mean`` the mean of the same ratio per trajectory. Both use the time on
    one unit, i.e. the share a trajectory-bound container with one core would be busy.
    """
    groups = trace.trajectories()
    per_traj_t1 = np.array([sum(r.t1_s for r in g) for g in groups.values()])
    per_traj_gen = np.array(
        [sum(r.gen_before_s for r in g) + g[-1].gen_after_s for g in groups.values()]
    )
    counts = np.array([len(g) for g in groups.values()])
    by_kind: dict[str, list[float]] = {}
    by_resource: dict[str, int] = {}
    for row in trace.rows:
        by_kind.setdefault(row.kind, []).append(row.t1_s)
        by_resource[row.resource] = by_resource.get(row.resource, 0) + 1
    gens = np.array([r.gen_before_s for r in trace.rows])
    life = per_traj_t1 + per_traj_gen
    return {
        "trajectories": len(groups),
        "actions": len(trace.rows),
        "actions_per_trajectory_mean": float(counts.mean()),
        "actions_per_trajectory_p50": float(np.percentile(counts, 50)),
        "actions_per_trajectory_p90": float(np.percentile(counts, 90)),
        "actions_by_resource": dict(sorted(by_resource.items())),
        "actions_by_kind": {k: len(v) for k, v in sorted(by_kind.items())},
        "t1_mean_s": float(np.mean([r.t1_s for r in trace.rows])),
        "t1_mean_s_by_kind": {k: float(np.mean(v)) for k, v in sorted(by_kind.items())},
        "gen_before_mean_s": float(gens.mean()),
        "gen_before_p50_s": float(np.percentile(gens, 50)),
        "gen_per_trajectory_mean_s": float(per_traj_gen.mean()),
        "trajectory_life_mean_s": float(life.mean()),
        "busy_share": float(per_traj_t1.sum() / life.sum()),
        "busy_share_mean": float(np.mean(per_traj_t1 / life)),
    }
