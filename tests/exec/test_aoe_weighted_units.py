"""Weighted grants without Docker (a policy whose CPU grants lend idle cycles,
``Capabilities.cpu_lends_idle``): each ``CpuControl``'s writes on fake cgroup trees and a
stand-in engine, the resize of a weighted ``RunningGrant`` (one write, the weight; the ledger's
grow-before/shrink-after order), the checks of a weighted plan, and the flag's way down from
the runtime to AOE's ``run_action``."""

from __future__ import annotations

from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest

from tangram.core.resources import CpuNodeSpec
from tangram.exec.aoe.cgroups import (
    CgroupV1,
    CgroupV2,
    DockerUpdate,
    direct_control,
    shares_of,
    weight_of,
)
from tangram.exec.aoe.config import AoeConfig
from tangram.exec.aoe.errors import AoeError
from tangram.exec.aoe.execution import action_env, plan_action
from tangram.exec.aoe.ledger import CoreLedger
from tangram.exec.aoe.resize import RunningGrant
from tangram.exec.aoe.topology import as_topology

# --- the weight of a grant -----------------------------------------------------------------


def test_the_weight_is_proportional_to_the_units_within_the_kernels_range() -> None:
    assert [weight_of(u) for u in (1, 2, 0.5, 64)] == [100, 200, 50, 6400]
    assert weight_of(0.001) == 1 and weight_of(1000) == 10_000  # cpu.weight's [1, 10000]
    assert [shares_of(u) for u in (1, 3, 0.5)] == [1024, 3072, 512]
    assert shares_of(0.0001) == 2 and shares_of(10_000) == 262_144  # cpu.shares' [2, 262144]


# --- cgroup v1 -----------------------------------------------------------------------------


def _v1(tmp_path: Path) -> tuple[CgroupV1, dict[str, Path]]:
    dirs = {c: tmp_path / c for c in ("cpu", "cpuacct", "cpuset", "memory", "freezer")}
    for d in dirs.values():
        d.mkdir()
    files = {
        "quota": dirs["cpu"] / "cpu.cfs_quota_us",
        "shares": dirs["cpu"] / "cpu.shares",
        "cpus": dirs["cpuset"] / "cpuset.cpus",
        "state": dirs["freezer"] / "freezer.state",
    }
    (dirs["cpu"] / "cpu.cfs_period_us").write_text("100000")
    files["quota"].write_text("1000")
    files["shares"].write_text("1024")
    files["cpus"].write_text("0-7")
    files["state"].write_text("FROZEN")
    return CgroupV1(dirs, 100_000, 1_000, tuple(range(8))), files


def _texts(files: dict[str, Path]) -> dict[str, str]:
    return {k: p.read_text() for k, p in files.items()}


def test_v1_weighted_grant_resize_and_park(tmp_path: Path) -> None:
    control, f = _v1(tmp_path)
    control.grant_weighted((0, 1, 2, 3), 2.0)
    assert _texts(f) == {"quota": "-1", "shares": "2048", "cpus": "0-3", "state": "THAWED"}
    before = _texts(f)
    control.reweigh(3.0)  # a resize: the weight alone
    assert _texts(f) == {**before, "shares": "3072"}
    control.park()
    assert _texts(f) == {"quota": "1000", "shares": "1024", "cpus": "0-7", "state": "FROZEN"}


def test_v1_exclusive_grant_and_its_park_leave_the_weight_alone(tmp_path: Path) -> None:
    control, f = _v1(tmp_path)
    f["shares"].write_text("777")  # whatever it is, an exclusive grant never writes it
    control.grant((2, 3), 1.5)
    assert _texts(f) == {"quota": "150000", "shares": "777", "cpus": "2-3", "state": "THAWED"}
    control.park()
    assert _texts(f) == {"quota": "1000", "shares": "777", "cpus": "0-7", "state": "FROZEN"}


def test_v1_discovered_control_grants_weighted(tmp_path: Path) -> None:
    # The same through discovery (``direct_control`` on a fake /proc and mountinfo).
    proc = tmp_path / "proc"
    (proc / "42").mkdir(parents=True)
    (proc / "42" / "cgroup").write_text(
        "4:freezer:/docker/abc\n3:cpuset:/docker/abc\n2:cpuacct:/docker/abc\n1:cpu:/docker/abc\n"
    )
    lines = []
    for i, ctrl in enumerate(("cpu", "cpuacct", "cpuset", "freezer")):
        (tmp_path / "cg" / ctrl / "docker" / "abc").mkdir(parents=True)
        lines.append(
            f"{30 + i} 1 0:{30 + i} / {tmp_path / 'cg' / ctrl} rw - cgroup cgroup rw,{ctrl}"
        )
    cpu = tmp_path / "cg/cpu/docker/abc"
    for name, text in (("cpu.cfs_quota_us", "1000"), ("cpu.cfs_period_us", "100000")):
        (cpu / name).write_text(text)
    (cpu / "cpu.shares").write_text("1024")
    (tmp_path / "cg/cpuset/docker/abc/cpuset.cpus").write_text("0-1")
    (tmp_path / "cg/freezer/docker/abc/freezer.state").write_text("FROZEN")
    (tmp_path / "mountinfo").write_text("\n".join(lines) + "\n")
    control = direct_control(42, 100_000, 1_000, (0, 1), proc, tmp_path / "mountinfo")
    control.grant_weighted((0, 1), 1.0)
    assert (cpu / "cpu.shares").read_text() == "1024"
    assert (cpu / "cpu.cfs_quota_us").read_text() == "-1"
    assert (tmp_path / "cg/cpuset/docker/abc/cpuset.cpus").read_text() == "0-1"


# --- cgroup v2 -----------------------------------------------------------------------------


def _v2(tmp_path: Path) -> tuple[CgroupV2, dict[str, Path]]:
    files = {
        "max": tmp_path / "cpu.max",
        "weight": tmp_path / "cpu.weight",
        "cpus": tmp_path / "cpuset.cpus",
        "freeze": tmp_path / "cgroup.freeze",
    }
    for key, text in (("max", "1000 100000"), ("weight", "100"), ("cpus", "0-7"), ("freeze", "1")):
        files[key].write_text(text)
    return CgroupV2(tmp_path, 100_000, 1_000, tuple(range(8))), files


def test_v2_weighted_grant_resize_and_park(tmp_path: Path) -> None:
    control, f = _v2(tmp_path)
    control.grant_weighted((0, 1, 2, 3, 4, 5), 4.0)
    assert _texts(f) == {"max": "max 100000", "weight": "400", "cpus": "0-5", "freeze": "0"}
    before = _texts(f)
    control.reweigh(1.0)
    assert _texts(f) == {**before, "weight": "100"}
    control.reweigh(200.0)  # clamped to the kernel's maximum
    assert _texts(f) == {**before, "weight": "10000"}
    control.park()
    assert _texts(f) == {"max": "1000 100000", "weight": "100", "cpus": "0-7", "freeze": "1"}


def test_v2_exclusive_grant_and_its_park_leave_the_weight_alone(tmp_path: Path) -> None:
    control, f = _v2(tmp_path)
    f["weight"].write_text("77")
    control.grant((1,), 0.5)
    assert _texts(f) == {"max": "50000 100000", "weight": "77", "cpus": "1", "freeze": "0"}
    control.park()
    assert _texts(f) == {"max": "1000 100000", "weight": "77", "cpus": "0-7", "freeze": "1"}


# --- docker update -------------------------------------------------------------------------


class Api:
    """A stand-in engine API: records ``update_container`` keyword sets and pauses."""

    def __init__(self) -> None:
        self.calls: list[Any] = []

    def update_container(self, cid: str, **kw: Any) -> None:
        self.calls.append(kw)

    def pause(self, cid: str) -> None:
        self.calls.append("pause")

    def unpause(self, cid: str) -> None:
        self.calls.append("unpause")


def test_docker_update_weighted_grant_resize_and_park() -> None:
    api = Api()
    control = DockerUpdate(api, "abc", 100_000, 1_000, (0, 1, 2, 3))
    control.grant_weighted((0, 1, 2, 3), 2.0)
    control.reweigh(1.0)
    control.park()
    assert api.calls == [
        {"cpu_quota": -1, "cpuset_cpus": "0-3", "cpu_shares": 2048},  # one engine call
        "unpause",
        {"cpu_shares": 1024},  # the resize: the weight alone
        "pause",
        {"cpu_quota": 1_000, "cpuset_cpus": "0-3", "cpu_shares": 1024},
    ]


def test_docker_update_exclusive_grant_is_unchanged() -> None:
    api = Api()
    control = DockerUpdate(api, "abc", 100_000, 1_000, (0, 1, 2, 3))
    control.grant((1, 2), 2.0)
    control.resize((1,), 1.0)
    control.park()
    assert api.calls == [
        {"cpu_quota": 200_000, "cpuset_cpus": "1-2"},
        "unpause",
        {"cpu_quota": 100_000, "cpuset_cpus": "1"},
        "pause",
        {"cpu_quota": 1_000, "cpuset_cpus": "0-3"},
    ]


# --- a weighted running grant --------------------------------------------------------------


def ledger_of(cores: int = 4) -> CoreLedger:
    return CoreLedger(as_topology(CpuNodeSpec("n", cores=cores, numa_domains=1, memory_gb=1.0)))


class WeightControl:
    """A stand-in cgroup of a weighted grant: each write records the weight and what the
    ledger held at that moment; ``fail`` makes the next write raise; exclusive writes fail
    the test."""

    def __init__(self, ledger: CoreLedger) -> None:
        self.ledger = ledger
        self.writes: list[tuple[float, dict[int, str]]] = []
        self.fail: str | None = None

    def reweigh(self, units: float) -> None:
        if self.fail:
            why, self.fail = self.fail, None
            raise AoeError(why)
        self.writes.append((units, self.ledger.busy()))

    def resize(self, cores: tuple[int, ...], quota: float) -> None:
        raise AssertionError("a weighted grant's resize wrote the cpuset and quota")


def weighted_grant(cores: tuple[int, ...], pool: tuple[int, ...] = (0, 1, 2, 3)) -> RunningGrant:
    ledger = ledger_of()
    ledger.acquire("a", cores)
    container = SimpleNamespace(control=WeightControl(ledger))
    return RunningGrant(container, ledger, "a", cores, float(len(cores)), pool)  # type: ignore[arg-type]


def test_a_weighted_resize_writes_the_weight_once_growing_before_and_shrinking_after() -> None:
    grant = weighted_grant((0,))
    control = grant.container.control
    assert grant.weighted and grant.resize((0, 1, 2)).status == "applied"
    # Grown: the new cores were held in the ledger before the weight was written.
    assert control.writes == [(3.0, {0: "a", 1: "a", 2: "a"})]
    assert grant.resize((2,)).status == "applied"
    # Shrunk: the cores it lost were still held while the weight was written, freed after.
    assert control.writes[1] == (1.0, {0: "a", 1: "a", 2: "a"})
    assert grant.ledger.busy() == {2: "a"} and grant.cores == (2,)
    assert grant.resize((2,)).status == "unchanged" and len(control.writes) == 2


def test_a_weighted_resize_outside_the_pool_or_failing_changes_nothing() -> None:
    grant = weighted_grant((0,), pool=(0, 1))
    control = grant.container.control
    outside = grant.resize((0, 2))
    assert outside.status == "failed" and "outside" in (outside.error or "")
    assert control.writes == [] and grant.ledger.busy() == {0: "a"}
    control.fail = "cpu.shares: device busy"
    failed = grant.resize((0, 1))
    assert failed.status == "failed" and "device busy" in (failed.error or "")
    assert grant.cores == (0,) and grant.ledger.busy() == {0: "a"}
    assert [units for units, _ in control.writes] == [1.0]  # the old weight written back


def test_a_weighted_plan_needs_its_cores_in_its_pool() -> None:
    cfg = AoeConfig()
    plan = plan_action(cfg, "true", (1, 2), None, 5.0, None, pool=(3, 0, 1, 2))
    assert plan.pool == (0, 1, 2, 3) and plan.quota == 2.0
    with pytest.raises(AoeError, match="lie in its pool"):
        plan_action(cfg, "true", (1, 4), None, 5.0, None, pool=(0, 1, 2, 3))
    with pytest.raises(AoeError, match="must be given"):
        plan_action(cfg, "true", 2, None, 5.0, None, pool=(0, 1, 2, 3))
    assert plan_action(cfg, "true", (1, 2), None, 5.0, None).pool is None


def test_a_weighted_action_is_told_its_grant_and_sees_the_pool() -> None:
    env = action_env((1, 2), 2.0, {}, 0, (0, 1, 2, 3))
    assert env["TANGRAM_CORES"] == env["OMP_NUM_THREADS"] == "2"
    assert env["TANGRAM_CPUSET"] == "0-3" and env["TANGRAM_CPU_QUOTA"] == "max"
    told = action_env((1,), 1.0, {}, 3, (0, 1, 2, 3))
    assert told["TANGRAM_CORES"] == "3"  # the told thread count, as with exclusive grants
    exclusive = action_env((1, 2), 2.0, {}, 0)
    assert exclusive["TANGRAM_CPUSET"] == "1-2" and exclusive["TANGRAM_CPU_QUOTA"] == "2"


# --- the flag from the runtime down to AOE -------------------------------------------------


class FakeAoe:
    """A stand-in ``AoeManager`` of 4 host cores 10-13: records ``run_action``'s keywords."""

    def __init__(self) -> None:
        self.topology = SimpleNamespace(cores=(10, 11, 12, 13))
        self.calls: list[dict[str, Any]] = []

    def run_action(self, traj: str, command: Any, cores: Any, **kw: Any) -> Any:
        self.calls.append({"cores": cores, **kw})
        return SimpleNamespace(
            status="ok", stdout=b"", stderr=b"", exit_code=0, error=None, timings={}
        )

    def shutdown(self) -> None:
        pass


def test_the_cpu_executor_asks_aoe_for_a_weighted_grant_over_its_pool() -> None:
    from tangram.exec.runtime.cpu import CpuExecutor

    aoe = FakeAoe()
    cpu = CpuExecutor(aoe, CpuNodeSpec("n", cores=3, numa_domains=1, memory_gb=1.0))
    try:
        cpu.run_blocking("t", "true", (1,), timeout_s=5)
        cpu.weighted = True
        cpu.run_blocking("t", "true", (1, 2), timeout_s=5)
        cpu.run_blocking("t", "true", (0,), timeout_s=5, weighted=False)  # the caller's say
    finally:
        cpu.shutdown()
    plain, weighted, forced = aoe.calls
    assert plain["cores"] == (11,) and "weighted" not in plain and "pool" not in plain
    # The pool: the cores this executor manages (the node's 3 of the host's 4), not the host's.
    assert weighted["cores"] == (11, 12)
    assert weighted["weighted"] is True and weighted["pool"] == (10, 11, 12)
    assert "weighted" not in forced


@pytest.mark.parametrize(
    ("policy", "exclusive", "weighted"),
    [
        ("tangram", False, True),
        ("tangram", True, False),
        ("tangram-paper", False, False),
        ("fixed:2", False, False),
    ],
)
def test_the_runtime_decides_the_grant_mode_once_from_its_policy(
    policy: str, exclusive: bool, weighted: bool
) -> None:
    from tangram.core.policies import make_policy
    from tangram.core.resources import ClusterSpec
    from tangram.exec.runtime import RuntimeConfig
    from tangram.exec.runtime.cpu import CpuExecutor
    from tangram.exec.runtime.runtime import Runtime

    lends = getattr(make_policy(policy).capabilities, "cpu_lends_idle", False)
    node = CpuNodeSpec("n", cores=4, numa_domains=1, memory_gb=8.0)
    cpu = CpuExecutor(FakeAoe(), node)
    try:
        rt = Runtime(
            ClusterSpec("c", cpu_nodes=(node,)),
            RuntimeConfig(policy=policy, exclusive_cores=exclusive),
            cpu=cpu,
        )
        assert rt.weighted_cpu is cpu.weighted is (weighted and lends)
    finally:
        cpu.shutdown()


def test_serve_exclusive_cores_reaches_the_runtime_config() -> None:
    import argparse
    import contextlib

    from tangram.exec import service_cli

    sub = argparse.ArgumentParser().add_subparsers()
    service_cli.register(sub)
    parser = sub.choices["serve"]
    for argv, exclusive in (
        (["--no-journal"], False),
        (["--no-journal", "--exclusive-cores"], True),
    ):
        with contextlib.ExitStack() as scratch:
            config = service_cli.runtime_config(parser.parse_args(argv), scratch)
        assert config.exclusive_cores is exclusive
