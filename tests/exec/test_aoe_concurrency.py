"""Many trajectories at once on a small machine: every action completes with its own output,
and no core is ever granted to two actions at the same time."""

from __future__ import annotations

from concurrent.futures import ThreadPoolExecutor
from typing import Any

import pytest

from tangram.exec.aoe.topology import format_cpulist

pytestmark = pytest.mark.docker

TRAJECTORIES = 20
ACTIONS_EACH = 5


def test_100_actions_of_20_trajectories_at_once(manager: Any, trajectory: Any) -> None:
    cores = manager.topology.cores
    with ThreadPoolExecutor(8) as pool:
        trajs = list(pool.map(lambda _: trajectory(manager, memory_gb=0.25), range(TRAJECTORIES)))
    # Explicit core lists (as the scheduler core sends), counts to choose, and whole-node grants.
    wanted: list[tuple[int, ...] | int] = [(cores[0],), (cores[-1],), 1, tuple(cores), 1]
    jobs = [
        (t, k, wanted[(i + k) % len(wanted)])
        for i, t in enumerate(trajs)
        for k in range(ACTIONS_EACH)
    ]
    command = (
        "echo {label}; grep Cpus_allowed_list /proc/self/status | cut -f2; "
        "echo $TANGRAM_CPUSET; echo {label} >> /work/done; wc -l < /work/done"
    )

    def run(job: tuple[str, int, Any]) -> Any:
        traj, k, want = job
        label = f"{traj}/a{k}"
        return label, manager.run_action(traj, command.format(label=label), want, action_id=label)

    with ThreadPoolExecutor(len(jobs)) as pool:
        results = list(pool.map(run, jobs))

    assert len(results) == TRAJECTORIES * ACTIONS_EACH
    counts: dict[str, set[int]] = {}
    for (label, out), (_, _, want) in zip(results, jobs, strict=True):
        # (The status, error and output first: the outcome's repr is cut off in reports.)
        assert out.ok, (label, out.status, out.error, out.exit_code, out.stderr[-500:], out)
        echoed, allowed, told, count = out.text.split()
        assert echoed == label
        assert allowed == told == format_cpulist(out.cores)
        if isinstance(want, tuple):
            assert out.cores == want
        else:
            assert len(out.cores) == want
        counts.setdefault(out.traj_id, set()).add(int(count))
    # Each trajectory's actions ran one at a time in its own container: counts 1..5 exactly.
    assert all(c == set(range(1, ACTIONS_EACH + 1)) for c in counts.values())

    log = [r for r in manager.grant_log() if r.action_id in {label for label, _ in results}]
    assert len(log) == len(results)
    for core in cores:
        spans = sorted((r.granted_at, r.revoked_at) for r in log if core in r.cores)
        overlaps = [(a, b) for a, b in zip(spans, spans[1:], strict=False) if b[0] < a[1]]
        assert not overlaps, f"core {core} granted twice at once: {overlaps[:3]}"
    assert manager.free_cores() == cores
