"""Weighted grants on a real engine, as a specification: a weighted grant's container runs on
the whole pool (the manager's cores) with no CFS quota at a CPU weight of 100 x units (v2) or
1024 x units (v1, docker), while the ledger holds only its nominal cores; a resize changes the
weight and nothing else; park brings back the default weight; an exclusive grant is as it
always was. Read from the kernel's cgroup files of the container (found from its init), with
both direct writes and ``docker update``; no timing is asserted."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tangram.exec.aoe.cgroups import find_cgroup_dirs
from tangram.exec.aoe.resize import RunningGrant
from tangram.exec.aoe.topology import format_cpulist

SHOW = 'echo "$TANGRAM_CORES $TANGRAM_CPUSET"; grep Cpus_allowed_list /proc/self/status | cut -f2'


@pytest.fixture(scope="module", params=["direct", "docker"])
def mgr(request: pytest.FixtureRequest, docker_client: Any) -> Iterator[Any]:
    """A manager granting by direct cgroup writes, then one granting by ``docker update``."""
    from tangram.exec.aoe import AoeConfig, AoeManager

    config = AoeConfig(cgroup_mode=request.param, kill_grace_s=3.0)
    with AoeManager(config, client=docker_client) as m:
        yield m


def cgroup_state(manager: Any, traj: str) -> dict[str, Any]:
    """What the kernel holds for the container: its cpuset, its quota in cores (None: no
    quota), its CPU weight in cores (v1 ``cpu.shares`` / 1024, v2 ``cpu.weight`` / 100) and
    whether it is frozen or freezing (the freeze was written)."""
    pid = manager.client.api.inspect_container(manager.handle(traj).container_id)["State"]["Pid"]
    version, dirs = find_cgroup_dirs(int(pid))

    def read(d: Path, name: str) -> str:
        return (d / name).read_text().strip()

    if version == 1:
        quota = int(read(dirs["cpu"], "cpu.cfs_quota_us"))
        period = int(read(dirs["cpu"], "cpu.cfs_period_us"))
        return {
            "cpus": read(dirs["cpuset"], "cpuset.cpus"),
            "quota": None if quota < 0 else quota / period,
            "weight": int(read(dirs["cpu"], "cpu.shares")) / 1024,
            # (FREEZING: frozen, processes in the kernel not yet stopped; it lags the write)
            "frozen": read(dirs["freezer"], "freezer.state") in ("FROZEN", "FREEZING"),
        }
    d = dirs["unified"]
    q, p = read(d, "cpu.max").split()
    return {
        "cpus": read(d, "cpuset.cpus"),
        "quota": None if q == "max" else int(q) / int(p),
        "weight": int(read(d, "cpu.weight")) / 100,
        "frozen": read(d, "cgroup.freeze") == "1",  # asked (cgroup.events says when done)
    }


def test_a_weighted_grant_runs_on_the_pool_at_its_weight(mgr: Any, trajectory: Any) -> None:
    cores = mgr.topology.cores
    pool = format_cpulist(cores)
    c0 = cores[0]
    traj = trajectory(mgr)
    seen: dict[str, Any] = {}

    def on_grant(grant: RunningGrant) -> None:
        seen["granted"] = cgroup_state(mgr, traj)
        seen["free_at_grant"] = mgr.free_cores()
        resized = grant.resize(cores[:2])  # grown to two nominal cores
        seen["resize"] = resized.status
        seen["resized"] = cgroup_state(mgr, traj)
        seen["free_after_resize"] = mgr.free_cores()

    out = mgr.run_action(traj, SHOW, (c0,), weighted=True, on_grant=on_grant)
    assert out.ok, out
    # Told its grant (one core), running on the whole pool.
    assert out.text.split() == ["1", pool, pool]
    assert out.cores == (c0,)
    assert seen["granted"] == {"cpus": pool, "quota": None, "weight": 1.0, "frozen": False}
    assert seen["free_at_grant"] == tuple(c for c in cores if c != c0)  # the nominal core held
    assert seen["resize"] == "applied"
    assert seen["resized"] == {**seen["granted"], "weight": 2.0}  # the weight alone changed
    assert seen["free_after_resize"] == cores[2:]
    # Parked: frozen, on the parking quota, the cpuset the whole node, the default weight.
    parked = cgroup_state(mgr, traj)
    assert parked["frozen"] and parked["cpus"] == pool and parked["weight"] == 1.0
    assert parked["quota"] is not None and parked["quota"] < 0.05
    assert mgr.free_cores() == cores


def test_an_exclusive_grant_after_a_weighted_one_is_unchanged(mgr: Any, trajectory: Any) -> None:
    cores = mgr.topology.cores
    c0, c1 = cores[:2]
    traj = trajectory(mgr)
    seen: list[dict[str, Any]] = []
    hook = lambda grant: seen.append(cgroup_state(mgr, traj))  # noqa: E731
    assert mgr.run_action(traj, "true", (c0, c1), weighted=True, on_grant=hook).ok
    assert seen[-1]["weight"] == 2.0
    out = mgr.run_action(traj, SHOW, (c1,), quota_cores=0.5, on_grant=hook)
    assert out.ok, out
    assert out.text.split() == ["1", str(c1), str(c1)]
    assert seen[-1] == {"cpus": str(c1), "quota": 0.5, "weight": 1.0, "frozen": False}


def test_a_weighted_grant_outside_the_ledger_or_pool_is_refused(mgr: Any, trajectory: Any) -> None:
    from tangram.exec.aoe.errors import AoeError, GrantError

    cores = mgr.topology.cores
    traj = trajectory(mgr)
    with pytest.raises(GrantError):
        mgr.run_action(traj, "true", (cores[0],), weighted=True, pool=(cores[0], 10_000))
    with pytest.raises(AoeError, match="lie in its pool"):
        mgr.run_action(traj, "true", (cores[1],), weighted=True, pool=(cores[0],))
    with pytest.raises(AoeError, match="weighted=True"):
        mgr.run_action(traj, "true", (cores[0],), pool=cores)
    assert mgr.free_cores() == cores
