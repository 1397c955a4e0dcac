"""AOE pieces that need no Docker engine: topology, core choice, the ledger, stream parsing,
cgroup discovery and writes on fake cgroup trees, and the sandbox configuration."""

from __future__ import annotations

import os
import socket
import struct
import threading
import time
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest

from tangram.core.resources import CpuNodeSpec
from tangram.exec.aoe.cgroups import CgroupV1, CgroupV2, direct_control, find_cgroup_dirs
from tangram.exec.aoe.config import AoeConfig, SandboxConfig, WarmPoolConfig
from tangram.exec.aoe.containers import ContainerSpec, create_kwargs, owner_alive, owner_label
from tangram.exec.aoe.errors import AoeError, GrantError
from tangram.exec.aoe.ledger import CoreLedger
from tangram.exec.aoe.topology import (
    NumaTopology,
    choose_cores,
    format_cpulist,
    parse_cpulist,
    read_host_topology,
)
from tangram.exec.aoe.transport import Capture, FrameReader, collect

# --- topology and core choice -------------------------------------------------------------


def test_cpulist_round_trip() -> None:
    assert parse_cpulist("0-3,8,10-11\n") == (0, 1, 2, 3, 8, 10, 11)
    assert format_cpulist((11, 10, 8, 3, 2, 1, 0)) == "0-3,8,10-11"
    assert format_cpulist([5]) == "5"
    with pytest.raises(ValueError, match="not a cpu list"):
        parse_cpulist("3-1")


def test_host_topology_from_fake_sysfs(tmp_path: Path) -> None:
    for node, cpus in (("node0", "0-1"), ("node1", "2-3")):
        (tmp_path / node).mkdir()
        (tmp_path / node / "cpulist").write_text(cpus)
    topo = read_host_topology(tmp_path)
    usable = set(os.sched_getaffinity(0))
    expected = tuple(
        d
        for d in (tuple(c for c in (0, 1) if c in usable), tuple(c for c in (2, 3) if c in usable))
        if d
    )
    assert topo.domains == expected
    assert read_host_topology(tmp_path / "missing").domains == (tuple(sorted(usable)),)


def test_choose_cores_prefers_one_numa_domain_best_fit() -> None:
    topo = NumaTopology(((0, 1, 2, 3), (4, 5, 6, 7)))
    # Domain 1 has 2 free cores, domain 0 has 4: a 2-core grant goes to the tighter domain.
    assert choose_cores(topo, {0, 1, 2, 3, 6, 7}, 2) == (6, 7)
    assert choose_cores(topo, {0, 1, 2, 3, 6, 7}, 3) == (0, 1, 2)
    # No domain can hold 5: the fewest domains, the fuller domain first.
    assert choose_cores(topo, {0, 1, 2, 3, 6, 7}, 5) == (0, 1, 2, 3, 6)
    assert choose_cores(topo, {1}, 2) is None
    with pytest.raises(GrantError, match="asked for 9 cores"):
        choose_cores(topo, topo.cores, 9)


def test_choose_cores_accepts_the_cores_node_spec() -> None:
    spec = CpuNodeSpec("n", cores=8, numa_domains=2, memory_gb=16)
    assert choose_cores(spec, range(8), 4) == (0, 1, 2, 3)
    assert NumaTopology.from_spec(spec).to_spec("n", 16) == spec


def test_topology_rejects_a_core_in_two_domains() -> None:
    with pytest.raises(GrantError, match="two NUMA domains"):
        NumaTopology(((0, 1), (1, 2)))


@pytest.mark.parametrize("domains", [((-1, 0),), ((0, 1), (-2,)), ((0, True),), ((0, 1.0),)])
def test_topology_rejects_a_core_id_that_is_not_a_whole_number_from_0(domains: object) -> None:
    """A negative core id was accepted: the ledger granted core -1 and the container's cpuset
    was written as '-1-0' (``format_cpulist``), refused by the engine only at the first
    container's create, far from the topology that caused it; True and 1.0 equal core 1
    in the ledger but were written 'True' and '1.0'."""
    with pytest.raises(GrantError, match="core ids must be whole numbers from 0"):
        NumaTopology(domains)


# --- ledger -------------------------------------------------------------------------------


def test_ledger_validates_requests() -> None:
    ledger = CoreLedger(NumaTopology(((0, 1),)))
    with pytest.raises(GrantError, match=r"cores \[5\] are not on this node"):
        ledger.acquire("a", (0, 5))
    with pytest.raises(GrantError, match="names a core twice"):
        ledger.acquire("a", (1, 1))
    with pytest.raises(GrantError, match="asked for 3 cores"):
        ledger.acquire("a", 3)
    with pytest.raises(GrantError, match="empty"):
        ledger.acquire("a", ())


@pytest.mark.parametrize("cores", [(True,), (1.0,), (0, "1")])
def test_ledger_refuses_core_ids_that_are_no_whole_numbers(cores: tuple) -> None:
    """(True,) and (1.0,) passed as core 1 (equal to 1 in a set): the cpuset was written as
    'True' / '1.0', which the kernel refused, and the action came back as a 'container
    failure: the grant could not be written'."""
    ledger = CoreLedger(NumaTopology(((0, 1),)))
    with pytest.raises(GrantError, match="core ids"):
        ledger.validate(cores)


def test_ledger_waits_for_busy_cores_in_arrival_order() -> None:
    ledger = CoreLedger(NumaTopology(((0, 1),)))
    assert ledger.acquire("first", (0,)) == (0,)
    order: list[str] = []

    def want(name: str, cores: tuple[int, ...] | int) -> None:
        got = ledger.acquire(name, cores)
        order.append(name)
        time.sleep(0.05)
        ledger.release(name, "t", float(len(got)))

    def waiting(n: int) -> None:  # until n requests wait in the ledger (threads start late
        deadline = time.monotonic() + 10  # on a busy machine: a fixed sleep may be too short)
        while len(ledger._waiting) < n:
            assert time.monotonic() < deadline, f"{n} requests never waited: {order}"
            time.sleep(0.005)

    both = threading.Thread(target=want, args=("both", (0, 1)))
    both.start()
    waiting(1)
    # Core 1 is free, but "both" waits for it first: a later request for core 1 must not pass.
    later = threading.Thread(target=want, args=("later", (1,)))
    later.start()
    waiting(2)
    assert order == []
    ledger.release("first", "t", 1.0)
    both.join(2)
    later.join(2)
    assert order == ["both", "later"]
    assert ledger.free_cores() == (0, 1)


def test_ledger_refuses_an_action_id_that_is_already_waiting() -> None:
    """Two requests of one action id (a caller's action_id, in two trajectories) that both
    waited were both granted: the first release freed both's cores while the second still
    ran (a third action was then granted a core it was running on), and the second release
    raised 'holds no cores' instead of giving an outcome."""
    ledger = CoreLedger(NumaTopology(((0, 1, 2),)))
    ledger.acquire("blocker", (0, 1))
    errors: list[Exception] = []

    def want(cores: tuple[int, ...]) -> None:
        try:
            ledger.acquire("same", cores)
        except AoeError as exc:
            errors.append(exc)

    first = threading.Thread(target=want, args=((0,),))
    first.start()
    deadline = time.monotonic() + 10
    while len(ledger._waiting) < 1:
        assert time.monotonic() < deadline, "the first request never waited"
        time.sleep(0.005)
    second = threading.Thread(target=want, args=((1,),))
    second.start()
    try:
        second.join(5)
        assert not second.is_alive(), "the second request of the same id waited"
        assert errors and "'same'" in str(errors[0]) and "already" in str(errors[0])
        ledger.release("blocker", "t", 2.0)
        first.join(5)
        assert ledger.busy() == {0: "same"}
    finally:
        ledger.close("the test is over")  # wakes any request still waiting
        first.join(5)
        second.join(5)


def test_ledger_never_grants_a_core_twice_under_threads() -> None:
    topo = NumaTopology(((0, 1), (2, 3)))
    ledger = CoreLedger(topo)

    def worker(i: int) -> None:
        for j in range(30):
            got = ledger.acquire(f"{i}.{j}", 1 + (i + j) % 3)
            ledger.release(f"{i}.{j}", str(i), 1.0)
            assert got

    threads = [threading.Thread(target=worker, args=(i,)) for i in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(10)
    log = ledger.log()
    assert len(log) == 240
    for core in topo.cores:
        spans = sorted((r.granted_at, r.revoked_at) for r in log if core in r.cores)
        assert all(a[1] <= b[0] for a, b in zip(spans, spans[1:], strict=False))


def test_ledger_close_wakes_waiters_with_an_error() -> None:
    ledger = CoreLedger(NumaTopology(((0,),)))
    ledger.acquire("a", (0,))
    errors: list[Exception] = []

    def wait() -> None:
        try:
            ledger.acquire("b", (0,))
        except AoeError as exc:
            errors.append(exc)

    t = threading.Thread(target=wait)
    t.start()
    time.sleep(0.05)
    ledger.close("shutting down")
    t.join(2)
    assert errors and "shutting down" in str(errors[0])


def test_a_waiter_granted_just_before_the_close_keeps_its_grant_and_can_release_it() -> None:
    """A waiter's request is granted by whichever thread runs the ledger's assignment (here
    another request's acquire, after a release): when the close came before the waiter woke,
    it raised "core ledger closed" with the cores recorded as its own, which nobody would
    ever release (the caller got no grant to give back). A granted request now returns its
    grant; only one still ungranted is refused."""
    ledger = CoreLedger(NumaTopology(((0, 1),)))
    ledger.acquire("a", (0,))
    got: list[object] = []

    def wait() -> None:
        try:
            got.append(ledger.acquire("b", (0,)))
        except AoeError as exc:
            got.append(exc)

    waiter = threading.Thread(target=wait)
    waiter.start()
    deadline = time.monotonic() + 10
    while not ledger._waiting:
        assert time.monotonic() < deadline, "the request never waited"
        time.sleep(0.005)
    with ledger._cond:  # the waiter cannot wake before all three are done
        ledger.release("a", "t", 1.0)
        assert ledger.acquire("c", (1,)) == (1,)  # its assignment grants "b" too
        ledger.close("shutting down")
    waiter.join(10)
    assert not waiter.is_alive() and got == [(0,)], got
    ledger.release("b", "t", 1.0)
    assert ledger.busy() == {1: "c"}
    with pytest.raises(AoeError, match="closed"):
        ledger.acquire("d", (0,))  # free, but the ledger is closed: nothing granted after
    assert ledger.busy() == {1: "c"}


def test_a_closed_ledger_lets_no_running_action_grow() -> None:
    """``take`` (a running action's resize growing it) never looked at the close: after the
    shutdown a resize still took free cores and wrote them into a container being removed,
    where every new request was refused."""
    ledger = CoreLedger(NumaTopology(((0, 1),)))
    ledger.acquire("a", (0,))
    ledger.close("shutting down")
    with pytest.raises(AoeError, match="closed"):
        ledger.take("a", (0, 1))
    assert ledger.busy() == {0: "a"}


# --- stream parsing -----------------------------------------------------------------------


def _frame(stream: int, data: bytes) -> bytes:
    return bytes([stream, 0, 0, 0]) + struct.pack(">I", len(data)) + data


def test_frame_reader_reassembles_split_frames() -> None:
    a, b = socket.socketpair()
    data = _frame(1, b"hello ") + _frame(2, b"oops") + _frame(1, b"world")
    a.sendall(data[:5])
    reader = FrameReader(b)
    assert reader.next_frame(0.05) is None  # half a header: wait, do not misparse
    a.sendall(data[5:])
    got = [reader.next_frame(1) for _ in range(3)]
    assert got == [(1, b"hello "), (2, b"oops"), (1, b"world")]
    a.close()
    assert reader.next_frame(1) is None and reader.eof


def test_frame_reader_drain_is_bounded_when_output_never_stops() -> None:
    """``drain`` (the runner's output printed between actions, discarded before the next
    one is sent) read until the socket was empty: a background process an earlier action
    left printing faster than it is read kept it reading for ever, and the next action was
    never sent, its time-out never armed, its cores and its trajectory's lock held. It now
    stops after ``DRAIN_MAX_BYTES``; the rest is read with the action's output."""
    from tangram.exec.aoe.transport import DRAIN_MAX_BYTES

    chunk = _frame(1, b"spam\n" * 1000)
    calls = 0

    class Endless:
        def settimeout(self, timeout: float | None) -> None:
            pass

        def recv(self, n: int) -> bytes:
            nonlocal calls
            calls += 1
            if calls > 100_000:
                raise AssertionError("drain never stopped reading")
            return chunk

    dropped = FrameReader(Endless()).drain()  # type: ignore[arg-type]
    assert DRAIN_MAX_BYTES <= dropped < DRAIN_MAX_BYTES + len(chunk)


def test_capture_finds_the_end_marker_across_chunks_and_keeps_memory_bounded() -> None:
    cap = Capture(limit=10, marker=b"\n@@end ", with_code=True)
    for chunk in (b"0123456789" * 1000, b"abc\n@@e", b"nd 3", b"7\nafter"):
        cap.feed(chunk)
        assert len(cap.buf) <= 10 + len(b"\n@@end ") + 16 + len(chunk)
    assert cap.done and cap.code == 37
    assert cap.total == 10003 and cap.overflow
    assert cap.content() == b"0123456789"


def test_capture_exactly_at_the_limit_is_not_overflow() -> None:
    cap = Capture(limit=5, marker=b"\n@@end ", with_code=True)
    cap.feed(b"12345\n@@end 0\n")
    assert cap.done and not cap.overflow and cap.content() == b"12345"


def test_collect_kills_at_the_deadline_and_reports_timeout() -> None:
    a, b = socket.socketpair()
    out, err = Capture(100, None, False), Capture(100, None, False)
    killed: list[str] = []

    def kill(why: str) -> None:
        killed.append(why)
        a.close()  # the killed command's stream ends

    reader = FrameReader(b)
    ended = collect(reader, out, err, time.monotonic() + 0.1, 1.0, kill, lambda: reader.eof)
    assert ended == "timeout" and killed == ["timeout"]


def test_collect_gives_the_kill_its_grace_after_the_kill_not_from_its_start() -> None:
    """The grace after a kill was counted from before the kill: a kill that took longer than
    the grace (the marker fallback's, two ``docker exec`` on a loaded engine) had the action
    "stuck" (its runner replaced, its outcome an error) though its end came as the kill
    returned."""
    for why in ("timeout", "overflow"):
        a, b = socket.socketpair()

        def slow_kill(why: str, ours: socket.socket = a) -> None:
            time.sleep(2.5)  # longer than the grace
            ours.close()  # the killed command's stream ends as the kill returns

        if why == "overflow":
            a.sendall(b"\x01\x00\x00\x00" + (200).to_bytes(4, "big") + b"x" * 200)
        reader = FrameReader(b)
        out, err = Capture(100, None, False), Capture(100, None, False)
        deadline = time.monotonic() + (0.1 if why == "timeout" else 60)
        ended = collect(reader, out, err, deadline, 2.0, slow_kill, lambda r=reader: r.eof)
        b.close()
        assert ended == why


def test_collect_gives_up_when_nothing_ends_after_a_kill() -> None:
    a, b = socket.socketpair()
    out, err = Capture(100, b"\n@@x ", True), Capture(100, b"\n@@x", False)
    t0 = time.monotonic()
    ended = collect(FrameReader(b), out, err, t0 + 0.05, 0.2, lambda why: None, lambda: False)
    assert ended == "stuck" and 0.2 < time.monotonic() - t0 < 2
    a.close()


# --- cgroups on fake trees ----------------------------------------------------------------


def _fake_v1(tmp_path: Path) -> tuple[Path, Path]:
    proc = tmp_path / "proc"
    (proc / "42").mkdir(parents=True)
    (proc / "42" / "cgroup").write_text(
        "5:freezer:/docker/abc\n4:memory:/docker/abc\n3:cpuset:/docker/abc\n"
        "2:cpuacct:/docker/abc\n1:cpu:/docker/abc\n0::/docker/abc\n"
    )
    root = tmp_path / "cg"
    lines = []
    for i, ctrl in enumerate(("cpu", "cpuacct", "cpuset", "memory", "freezer")):
        d = root / ctrl / "docker" / "abc"
        d.mkdir(parents=True)
        lines.append(f"{30 + i} 1 0:{30 + i} / {root / ctrl} rw - cgroup cgroup rw,{ctrl}")
    lines.append(f"40 1 0:40 / {root / 'unified'} rw - cgroup2 cgroup2 rw")
    (root / "cpu/docker/abc/cpu.cfs_quota_us").write_text("1000")
    (root / "cpu/docker/abc/cpu.cfs_period_us").write_text("100000")
    (root / "cpu/docker/abc/cgroup.procs").write_text("42\n43\n")
    (root / "cpuset/docker/abc/cpuset.cpus").write_text("0-3")
    (root / "freezer/docker/abc/freezer.state").write_text("THAWED")
    (root / "cpuacct/docker/abc/cpuacct.usage").write_text("123456789")
    (root / "memory/docker/abc/memory.oom_control").write_text(
        "oom_kill_disable 0\nunder_oom 0\noom_kill 2\n"
    )
    mountinfo = tmp_path / "mountinfo"
    mountinfo.write_text("\n".join(lines) + "\n")
    return proc, mountinfo


def test_cgroup_v1_discovery_and_writes(tmp_path: Path) -> None:
    proc, mountinfo = _fake_v1(tmp_path)
    version, dirs = find_cgroup_dirs(42, proc, mountinfo)
    assert version == 1 and dirs["cpu"] == tmp_path / "cg/cpu/docker/abc"
    control = direct_control(42, 100_000, 1_000, (0, 1, 2, 3), proc, mountinfo)
    assert isinstance(control, CgroupV1)
    control.grant((2, 3), 1.5)
    cpu, cpuset = tmp_path / "cg/cpu/docker/abc", tmp_path / "cg/cpuset/docker/abc"
    state = tmp_path / "cg/freezer/docker/abc/freezer.state"
    assert (cpuset / "cpuset.cpus").read_text() == "2-3"
    assert (cpu / "cpu.cfs_quota_us").read_text() == "150000"
    assert state.read_text() == "THAWED"
    control.park()
    assert state.read_text() == "FROZEN" and control.parked_cores == 0.0
    assert (cpu / "cpu.cfs_quota_us").read_text() == "1000"
    assert (cpuset / "cpuset.cpus").read_text() == "0-3"
    control.unthrottle()
    assert state.read_text() == "THAWED" and (cpu / "cpu.cfs_quota_us").read_text() == "-1"
    assert control.usage_ns() == 123456789 and control.pids() == [42, 43]
    assert control.oom_kills() == 2


def test_cgroup_v2_discovery_and_writes(tmp_path: Path) -> None:
    proc = tmp_path / "proc"
    (proc / "7").mkdir(parents=True)
    (proc / "7" / "cgroup").write_text("0::/system.slice/docker-abc.scope\n")
    d = tmp_path / "cg" / "system.slice" / "docker-abc.scope"
    d.mkdir(parents=True)
    for name, text in (
        ("cpu.max", "1000 100000"),
        ("cpuset.cpus", ""),
        ("cgroup.procs", "7\n"),
        ("cpu.stat", "usage_usec 2500\nuser_usec 2000\n"),
        ("memory.events", "low 0\noom 1\noom_kill 1\n"),
        ("cgroup.freeze", "0"),
    ):
        (d / name).write_text(text)
    mountinfo = tmp_path / "mountinfo"
    mountinfo.write_text(f"30 1 0:30 / {tmp_path / 'cg'} rw - cgroup2 cgroup2 rw,nsdelegate\n")
    control = direct_control(7, 100_000, 1_000, (0, 1), proc, mountinfo)
    assert isinstance(control, CgroupV2)
    control.grant((1,), 0.5)
    assert (d / "cpu.max").read_text() == "50000 100000"
    assert (d / "cpuset.cpus").read_text() == "1"
    assert (d / "cgroup.freeze").read_text() == "0"
    control.park()
    assert (d / "cgroup.freeze").read_text() == "1" and control.parked_cores == 0.0
    assert (d / "cpu.max").read_text() == "1000 100000"
    assert (d / "cpuset.cpus").read_text() == "0-1"
    assert control.usage_ns() == 2_500_000 and control.oom_kills() == 1


def test_direct_control_names_the_file_it_cannot_write(tmp_path: Path) -> None:
    proc, mountinfo = _fake_v1(tmp_path)
    (tmp_path / "cg/cpuset/docker/abc/cpuset.cpus").unlink()
    with pytest.raises(AoeError, match=r"cpuset\.cpus is missing"):
        direct_control(42, 100_000, 1_000, (0,), proc, mountinfo)


def test_direct_control_needs_the_freezer_to_park(tmp_path: Path) -> None:
    proc, mountinfo = _fake_v1(tmp_path)
    (tmp_path / "cg/freezer/docker/abc/freezer.state").unlink()
    with pytest.raises(AoeError, match=r"freezer\.state is missing"):
        direct_control(42, 100_000, 1_000, (0,), proc, mountinfo)


def test_quota_never_below_the_kernel_minimum(tmp_path: Path) -> None:
    proc, mountinfo = _fake_v1(tmp_path)
    control = direct_control(42, 100_000, 1_000, (0,), proc, mountinfo)
    assert control.quota_us(0.001) == 1_000 and control.quota_us(2) == 200_000


# --- configuration ------------------------------------------------------------------------


def _spec(sandbox: SandboxConfig) -> ContainerSpec:
    return ContainerSpec("n", "img", 0.5, sandbox, 100_000, 200_000, (0, 1), True, {"a": "b"})


def test_default_sandbox_is_strict() -> None:
    kw = create_kwargs(_spec(SandboxConfig()))
    assert SandboxConfig().relaxations() == ()
    assert kw["network_mode"] == "none" and kw["user"] == "1000:1000" and kw["read_only"]
    assert kw["cap_drop"] == ["ALL"] and kw["security_opt"] == ["no-new-privileges"]
    assert kw["mem_limit"] == "512m" and kw["memswap_limit"] == "512m" and kw["pids_limit"] == 256
    assert "uid=1000" in kw["tmpfs"]["/work"] and kw["cpu_period"] == 100_000
    assert "nano_cpus" not in kw  # NanoCPUs would make later quota updates fail


def test_every_relaxation_is_named() -> None:
    loose = SandboxConfig(
        network=True,
        user="root",
        read_only_root=False,
        memory_limit=False,
        pids_limit=None,
        no_new_privileges=False,
        drop_all_capabilities=False,
        cap_add=("SYS_PTRACE",),
    )
    names = " | ".join(loose.relaxations())
    for word in (
        "network",
        "root",
        "writable root",
        "memory",
        "pids",
        "privileges",
        "capabilities kept",
        "SYS_PTRACE",
    ):
        assert word in names
    kw = create_kwargs(_spec(loose))
    assert "network_mode" not in kw and "cap_drop" not in kw and "mem_limit" not in kw
    assert kw["cap_add"] == ["SYS_PTRACE"]


def test_bad_configuration_is_refused_with_the_field_named() -> None:
    with pytest.raises(AoeError, match="work_dir must be an absolute path"):
        SandboxConfig(work_dir="work")
    with pytest.raises(AoeError, match="pids_limit"):
        SandboxConfig(pids_limit=2)
    with pytest.raises(AoeError, match="park_quota_us"):
        AoeConfig(park_quota_us=10)
    with pytest.raises(AoeError, match="transport must be runner or exec"):
        AoeConfig(transport="ssh")  # type: ignore[arg-type]


@pytest.mark.parametrize(
    ("kw", "field"),
    [
        ({"network": "no"}, "network"),
        ({"network": 0}, "network"),
        ({"read_only_root": "false"}, "read_only_root"),
        ({"memory_limit": None}, "memory_limit"),
        ({"no_new_privileges": 1}, "no_new_privileges"),
        ({"drop_all_capabilities": "yes"}, "drop_all_capabilities"),
        ({"user": 1000}, "user"),
        ({"user": None}, "user"),
        ({"work_dir": None}, "work_dir"),
        ({"work_volume": 7}, "work_volume"),
        ({"work_size_mb": True}, "work_size_mb"),
        ({"cap_add": (1,)}, "cap_add"),
    ],
)
def test_a_sandbox_field_of_the_wrong_type_is_refused_naming_it(
    kw: dict[str, object], field: str
) -> None:
    """SandboxConfig took any value: network='no' (a string, truthy) gave the container a
    network, a user or work_dir that is no string raised a bare AttributeError far from
    here (at the manager's start), True passed as a size of 1 MB, a capability that is no
    string a bare TypeError. Each is now an AoeError naming the field."""
    with pytest.raises(AoeError, match=f"SandboxConfig.{field}"):
        SandboxConfig(**kw)  # type: ignore[arg-type]


@pytest.mark.parametrize(
    ("kw", "field"),
    [
        ({"max_output_bytes": 1.5}, "max_output_bytes"),
        ({"cfs_period_us": 100_000.0}, "cfs_period_us"),
        ({"park_quota_us": True}, "park_quota_us"),
        ({"memory_gb": "2"}, "memory_gb"),
        ({"memory_gb": True}, "memory_gb"),
        ({"kill_grace_s": None}, "kill_grace_s"),
        ({"reaper": "no"}, "reaper"),
        ({"cleanup_orphans": 0}, "cleanup_orphans"),
        ({"use_init": "yes"}, "use_init"),
        ({"image": 5}, "image"),
        ({"image": ""}, "image"),
        ({"sandbox": {}}, "sandbox"),
        ({"warm_pool": 4}, "warm_pool"),
        ({"docker_base_url": 2375}, "docker_base_url"),
    ],
)
def test_a_manager_setting_of_the_wrong_type_is_refused_naming_it(
    kw: dict[str, object], field: str
) -> None:
    """AoeConfig took most fields of any type: max_output_bytes=1.5 failed every action
    naming the action's own argument, cfs_period_us=100000.0 every open (the engine's JSON
    refusal), reaper='no' (truthy) started the watchdog, a sandbox given as a dict raised a
    bare AttributeError at the manager's start, memory_gb='2' a bare TypeError. Each is now
    an AoeError naming the field."""
    with pytest.raises(AoeError, match=f"AoeConfig.{field}"):
        AoeConfig(**kw)  # type: ignore[arg-type]


@pytest.mark.parametrize(
    ("kw", "field"),
    [
        ({"window_s": "60"}, "window_s"),
        ({"prewarm_s": None}, "prewarm_s"),
        ({"window_s": True}, "window_s"),
        ({"workers": True}, "workers"),
    ],
)
def test_a_warm_pool_setting_of_the_wrong_type_is_refused_naming_it(
    kw: dict[str, object], field: str
) -> None:
    """WarmPoolConfig's window_s='60' or prewarm_s=None raised a bare TypeError from its own
    check, naming neither the field nor the fault, and True passed as one worker or one
    second. Each is now an AoeError naming the field."""
    with pytest.raises(AoeError, match=f"WarmPoolConfig.{field}"):
        WarmPoolConfig(**kw)  # type: ignore[arg-type]


@pytest.mark.parametrize("work_dir", ["/tmp", "/work/../tmp", "/work/..", "/", "/work/", "/proc"])
def test_a_work_dir_that_is_no_plain_place_of_its_own_is_refused_naming_it(work_dir: str) -> None:
    """SandboxConfig held work_dir only to start with '/': '/work/../tmp' had the engine
    mount a second tmpfs over /tmp, '/tmp' replaced /tmp's own tmpfs (mode 1777, 64 MB)
    with the work dir's without a word, and '/work/..' failed every open with the engine's
    "destination can't be '/'". A work dir must now be a plain absolute path of its own."""
    with pytest.raises(AoeError, match="SandboxConfig.work_dir"):
        SandboxConfig(work_dir=work_dir)
    assert SandboxConfig(work_dir="/home/sandbox/work").work_dir == "/home/sandbox/work"


@pytest.mark.parametrize("user", ["0:1000", "root:1000", "00", "+0", "0000:0", "", ":1000"])
def test_every_spelling_of_root_is_a_relaxation_and_never_pooled(user: str) -> None:
    """Docker runs each of these as uid 0 (``docker run --user 0:1000 ... id``: uid=0(root);
    an empty user is the image's, root in ours), but only the exact spellings 0, root, 0:0 and
    root:root were seen as root: the sandbox counted as strict, no relaxation was logged, and
    the warm pool took its containers."""
    from tangram.exec.aoe.pool import WarmPool

    sandbox = SandboxConfig(user=user)
    assert sandbox.runs_as_root
    # (an empty uid part is the image's user: root in ours, named as the image's)
    said = "runs as the image's user" if not user.partition(":")[0] else "runs as root"
    assert any(said in r for r in sandbox.relaxations())
    assert not WarmPool.poolable(sandbox)
    assert not SandboxConfig(user="1000:0").runs_as_root  # gid 0 alone is no root
    assert not SandboxConfig(user="10:1000").runs_as_root


@pytest.mark.parametrize(
    "user",
    [
        "a:b:c",
        "1000:1000:1000",
        " 1000",
        "1000 ",
        "user name",
        "1000:\tusers",
        "sand\x01box",
        "-1",
        "1000:-5",
        "2147483648",
        "4294967296",
        "-x",
        "+x",
        "x" * 257,
    ],
)
def test_a_user_the_engine_could_never_run_as_is_refused_naming_it(user: str) -> None:
    """``SandboxConfig.user`` was only type-checked: a malformed user (a second ':', a
    space, an id out of the engine's range) was taken and failed at the container's start,
    the first open or the warm pool's first fill, with the engine's message ('unable to
    find user  1000', 'uids and gids must be in range 0-2147483647'). It is refused at the
    configuration, naming the field."""
    with pytest.raises(AoeError, match="SandboxConfig.user"):
        SandboxConfig(user=user)


@pytest.mark.parametrize(
    "user",
    [
        "1000:1000",
        "1000",
        "1000:",
        ":1000",
        "sandbox",
        "sandbox:users",
        "root",
        "0:0",
        "+1000",
        "-0",
        "x$",
        "2147483647:2147483647",
        "",
    ],
)
def test_every_user_the_engine_takes_is_taken(user: str) -> None:
    """What the engine runs (a name or an id in its range, each part optional; docker run
    --user on the busybox image: '+1000' and '1000:' are uid 1000, '-0' root) stays taken."""
    assert SandboxConfig(user=user).user == user


@pytest.mark.parametrize("user", ["\u00b2", "\u00b2:1000", "\u0661\u0660\u0660\u0660"])
def test_a_user_of_non_ascii_digits_is_a_name_never_a_crash(user: str) -> None:
    """``str.isdigit`` takes '²' and other non-ASCII digits, which ``int`` refuses (a
    ValueError out of ``runs_as_root``, ``numeric_uid`` and so ``WarmPool.poolable`` at an
    open) or reads as a uid docker would not ('١٠٠٠' as 1000): docker reads them as a name,
    so a uid unknown here, never pooled."""
    from tangram.exec.aoe.pool import WarmPool

    sandbox = SandboxConfig(user=user)
    assert sandbox.numeric_uid is None and not sandbox.runs_as_root
    assert not WarmPool.poolable(sandbox)
    assert SandboxConfig(user="1000:1000").numeric_uid == 1000
    assert WarmPool.poolable(SandboxConfig(user="1000:1000"))


@pytest.mark.parametrize("limit", [(1 << 30) + 1, 10**12])
def test_a_configured_output_limit_past_the_maximum_is_refused_naming_it(limit: int) -> None:
    """AoeConfig.max_output_bytes had no upper bound: 10**12 as the default let every chatty
    action grow the manager's memory without limit."""
    with pytest.raises(AoeError, match="AoeConfig.max_output_bytes must be .*at most"):
        AoeConfig(max_output_bytes=limit)
    assert AoeConfig(max_output_bytes=1 << 30).max_output_bytes == 1 << 30


@pytest.mark.parametrize("name", ["memory_gb", "default_timeout_s", "kill_grace_s"])
@pytest.mark.parametrize("value", [float("nan"), float("inf")])
def test_a_configured_time_or_size_that_is_no_finite_number_is_refused(
    name: str, value: float
) -> None:
    """NaN and inf passed '<= 0': kill_grace_s=inf left an action that outlives its kill
    waited on for ever (never 'stuck'), a NaN default time-out failed each action later."""
    with pytest.raises(AoeError, match=f"AoeConfig.{name} must be"):
        AoeConfig(**{name: value})
    for pool_name in ("window_s", "prewarm_s"):
        with pytest.raises(AoeError, match=f"WarmPoolConfig.{pool_name} must be"):
            WarmPoolConfig(**{pool_name: value})


@pytest.mark.parametrize("value", ["0-3", 4, [(0, 1)], {"cores": 4}])
def test_a_topology_that_is_no_topology_is_refused_naming_it(value: object) -> None:
    """AoeConfig took any topology: a string, a count or a list of domains passed, and the
    manager's start raised a bare AttributeError ("'str' object has no attribute 'cores'")
    naming no setting."""
    with pytest.raises(AoeError, match="AoeConfig.topology must be"):
        AoeConfig(topology=value)  # type: ignore[arg-type]
    assert AoeConfig(topology=NumaTopology(((0, 1),))).topology is not None


@pytest.mark.parametrize("value", [2**22 + 1, 2**63, 2**70])
def test_a_pids_limit_past_the_kernels_largest_is_refused_naming_it(value: int) -> None:
    """SandboxConfig.pids_limit took any whole number from 8: 2**70 passed, and every open
    failed at the engine ('json: cannot unmarshal number ... into Go struct field'), naming
    no setting; past the kernel's largest pid count (2**22) a limit limits nothing."""
    with pytest.raises(AoeError, match="SandboxConfig.pids_limit must be"):
        SandboxConfig(pids_limit=value)
    assert SandboxConfig(pids_limit=2**22).pids_limit == 2**22


@pytest.mark.parametrize("value", [3600.5, 1e9, 1e300])
def test_a_kill_grace_past_an_hour_is_refused(value: float) -> None:
    """kill_grace_s took any finite number: 1e9 s held the caller of an action that
    outlived its kill for ever (never 'stuck'), as inf did before it was refused."""
    with pytest.raises(AoeError, match="AoeConfig.kill_grace_s must be at most 3600"):
        AoeConfig(kill_grace_s=value)
    assert AoeConfig(kill_grace_s=3600).kill_grace_s == 3600


def test_owner_label_tells_live_from_dead_processes() -> None:
    assert owner_alive(owner_label()) is True
    host, pid, start, namespace = owner_label().split("/")
    assert owner_alive(f"{host}/{pid}/not-{start}/{namespace}") is False  # another process
    assert owner_alive(f"other-host-xyz/{pid}/{start}/{namespace}") is None
    # Another namespace, with no process left in it (read from the host's namespace): dead.
    assert owner_alive(f"{host}/{pid}/not-{start}/1{namespace}") is False
    assert owner_alive(f"{host}/{pid}/not-{start}") is False  # an older label: read here


def test_package_imports_without_touching_docker() -> None:
    import subprocess
    import sys

    code = (
        "import sys; sys.modules['docker'] = None; import tangram.exec.aoe as a; "
        "import tangram.exec.aoe.cli, tangram.exec.aoe.bench; print(a.SandboxConfig().user)"
    )
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=False)
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "1000:1000"


def test_the_pool_says_why_a_sandbox_is_not_pooled() -> None:
    """A sandbox left out of the warm pool costs a cold start per open (~325 ms against
    ~22 ms): the reason is named (and logged once per sandbox), never silent."""
    from tangram.exec.aoe.pool import WarmPool

    assert WarmPool.unpooled_because(SandboxConfig()) is None
    assert "is a name" in (WarmPool.unpooled_because(SandboxConfig(user="sandbox")) or "")
    assert "keeper" in (WarmPool.unpooled_because(SandboxConfig(user="65534:65534")) or "")
    assert "work_volume" in (WarmPool.unpooled_because(SandboxConfig(work_volume="v")) or "")
    assert not WarmPool.poolable(SandboxConfig(user="sandbox"))


class _StartedButUnreadable:
    """A container the engine started, whose ``reload`` (its inspect) then fails, or (``at``
    ``logs``) which exited at once and whose ``logs`` fail."""

    id = "f" * 64
    status = "exited"

    def __init__(self, error: Exception, at: str) -> None:
        self.error, self.at = error, at

    def reload(self) -> None:
        if self.at == "reload":
            raise self.error

    def logs(self, tail: int) -> bytes:
        raise self.error


@pytest.mark.parametrize("at", ["reload", "logs"])
@pytest.mark.parametrize("error", ["api", "connection"])
def test_a_create_whose_inspect_fails_after_the_start_removes_the_container(
    error: str, at: str
) -> None:
    """``containers.create`` started the container, then its ``reload`` (or the ``logs`` of
    one that exited at once) failed: the error went out and the running container stayed in
    the engine, unknown to the manager, until the shutdown's sweep of its session. It is now
    removed, and the failure is an ``AoeError`` naming it."""
    import docker.errors

    from tangram.exec.aoe import containers

    exc = (
        docker.errors.APIError("500 Server Error: inspect failed")
        if error == "api"
        else ConnectionError("the engine's socket closed")
    )
    made = _StartedButUnreadable(exc, at)
    removed: list[str] = []

    class Api:
        def remove_container(self, cid: str, force: bool, v: bool) -> None:
            removed.append(cid)

    class Client:
        api = Api()

        class images:  # noqa: N801 - the SDK's attribute name
            @staticmethod
            def get(name: str) -> None:
                return None

        class containers:  # noqa: N801 - the SDK's attribute name
            @staticmethod
            def run(**kwargs: object) -> _StartedButUnreadable:
                return made

    spec = ContainerSpec("n", "img", 1.0, SandboxConfig(), 100_000, 100_000, (0,), True, {})
    with pytest.raises(AoeError, match="n"):
        containers.create(Client(), spec)
    assert removed == [made.id]


def test_the_exec_transport_waits_for_the_exit_code_while_the_action_has_time(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The exit code lands in the engine's record a moment after the exec's stream closes: a
    loaded machine took more than the fixed 200 looks (about a second) to record it, and a
    command that had succeeded came back as ``exit_unknown``, a container failure. The look
    now goes on while the action has time left (a second at least)."""
    from types import SimpleNamespace

    from tangram.exec.aoe import transport as transport_mod
    from tangram.exec.aoe.transport import ActionRequest, ExecTransport

    ours, theirs = socket.socketpair()
    socket_mod = socket
    looks = {"n": 0}

    class Api:
        def exec_create(self, *args: object, **kwargs: object) -> dict:
            return {"Id": "e1"}

        def exec_start(self, exec_id: str, socket: bool) -> object:
            theirs.shutdown(socket_mod.SHUT_WR)  # the command ends: its stream closes
            return ours

        def exec_inspect(self, exec_id: str) -> dict:
            looks["n"] += 1
            if looks["n"] < 300:  # a loaded engine: not recorded yet
                return {"Running": True, "ExitCode": None}
            return {"Running": False, "ExitCode": 0}

    class Group:
        places = False
        ticket = "-"

        def enter(self, *args: object, **kwargs: object) -> None:
            pass

        def ended(self) -> None:
            pass

        def leave(self) -> None:
            pass

    monkeypatch.setattr(
        transport_mod, "time", SimpleNamespace(monotonic=time.monotonic, sleep=lambda s: None)
    )
    transport = ExecTransport(Api(), "c" * 64, "1000:1000", "/work", 1.0, Group())  # type: ignore[arg-type]
    raw = transport.run(ActionRequest("a1", "true", {}, 60.0, 100), lambda why: None)
    theirs.close()
    assert (raw.ended, raw.exit_code) == ("exit", 0)
    assert looks["n"] == 300


def test_the_runner_counts_the_sending_of_an_action_in_its_time_out(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The runner's deadline was taken after the action was sent: a send that took most of
    the time-out (a long script to a slow runner) left the command its whole time-out on
    top, twice its limit and past the caller's deadline. The send now counts: a send that
    took the whole time-out leaves the command none, and it is killed at once."""
    from types import SimpleNamespace

    from tangram.exec.aoe import transport as transport_mod
    from tangram.exec.aoe.transport import ActionRequest, RunnerTransport

    ours, theirs = socket.socketpair()
    clock = {"offset": 0.0}

    def answer() -> None:
        line = b""
        while not line.endswith(b"\n"):
            line += theirs.recv(1)
        token = line.split(b" ")[0]
        for stream, payload in ((1, b"\n" + token + b" 0\n"), (2, b"\n" + token + b"\n")):
            theirs.sendall(struct.pack(">BxxxI", stream, len(payload)) + payload)

    def slow_send(sock: socket.socket, data: bytes, timeout_s: float) -> None:
        sock.sendall(data)
        clock["offset"] += timeout_s  # it took all the time it was given

    class Group:
        places = False
        ticket = "-"

        def enter(self, *args: object, **kwargs: object) -> None:
            pass

        def ended(self) -> None:
            pass

        def leave(self) -> None:
            pass

    monkeypatch.setattr(
        transport_mod,
        "time",
        SimpleNamespace(monotonic=lambda: time.monotonic() + clock["offset"], sleep=time.sleep),
    )
    monkeypatch.setattr(transport_mod, "send", slow_send)
    runner = RunnerTransport(None, "c" * 64, "1000:1000", "/work", 5.0, Group())  # type: ignore[arg-type]
    runner._reader, runner._sock = FrameReader(ours), ours
    kills: list[str] = []
    replier = threading.Thread(target=answer)
    replier.start()
    try:
        raw = runner.run(ActionRequest("a1", "true", {}, 30.0, 100), kills.append)
    finally:
        replier.join(10)
        ours.close()
        theirs.close()
    assert kills == ["timeout"] and raw.ended == "timeout"


class _Stuck:
    """A listed AOE container; the engine refuses to remove the one named ``stuck``."""

    def __init__(self, name: str) -> None:
        self.id, self.name, self.labels = name * 8, name, {"tangram.aoe.owner": "gone"}


def _refusing_remove(removed: list[str]) -> Any:
    def remove(client: object, container_id: str) -> bool:
        if container_id.startswith("stuck"):
            raise AoeError(f"could not remove container {container_id[:12]}: did not exit")
        removed.append(container_id)
        return True

    return remove


def test_an_orphan_the_engine_will_not_remove_stops_neither_the_sweep_nor_the_manager(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """``remove_orphans`` (run by every new manager) raised at the first orphan the engine
    failed to remove: the later orphans stayed, and the AoeError came out of the manager's
    constructor, so no manager (no service) could start while that one container stuck.
    Each failure is now logged and the sweep goes on."""
    from tangram.exec.aoe import containers

    removed: list[str] = []
    listed = [_Stuck("stuck"), _Stuck("later")]
    monkeypatch.setattr(containers, "session_containers", lambda client, session=None: listed)
    monkeypatch.setattr(containers, "owner_alive", lambda owner: False)
    monkeypatch.setattr(containers, "remove", _refusing_remove(removed))
    assert containers.remove_orphans(object()) == ["later"]
    assert removed == ["later" * 8]


def test_the_reaper_removes_every_container_it_can(monkeypatch: pytest.MonkeyPatch) -> None:
    """The watchdog's sweep stopped at the first container the engine failed to remove,
    leaving the later ones running for ever (nothing else removes them once the manager is
    dead). Each failure is now reported and the sweep goes on."""
    import io
    import sys
    from types import SimpleNamespace

    import docker

    from tangram.exec.aoe import containers, reaper

    removed: list[str] = []
    listed = [_Stuck("stuck"), _Stuck("later")]
    monkeypatch.setattr(sys, "stdin", SimpleNamespace(buffer=io.BytesIO(b"")))
    monkeypatch.setattr(docker, "from_env", lambda: object())
    monkeypatch.setattr(containers, "session_containers", lambda client, session=None: listed)
    monkeypatch.setattr(containers, "remove", _refusing_remove(removed))
    monkeypatch.setattr(reaper.signal, "signal", lambda *a: None)
    assert reaper.main(["s1"]) == 1
    assert removed == ["later" * 8]


def test_the_shutdowns_sweep_goes_past_a_container_the_engine_will_not_remove(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """``Lifecycle.remove_leftovers`` (the shutdown's sweep of its session) stopped at the
    first container the engine failed to remove; the later ones waited for the watchdog, or
    (without one) stayed. Each failure is now logged and the sweep goes on."""
    from tangram.exec.aoe import containers
    from tangram.exec.aoe.lifecycle import Lifecycle

    removed: list[str] = []
    listed = [_Stuck("stuck"), _Stuck("later")]
    monkeypatch.setattr(containers, "session_containers", lambda client, session=None: listed)
    monkeypatch.setattr(containers, "remove", _refusing_remove(removed))
    lifecycle = Lifecycle(AoeConfig(), object(), NumaTopology(((0, 1),)), "s1")
    lifecycle.remove_leftovers()
    assert removed == ["later" * 8]


def test_a_failed_make_says_why_even_when_its_container_will_not_go(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A container made for a trajectory whose next step failed (its cgroup, its runner's
    warm-up) is removed; when that removal failed too, its AoeError replaced the step's, and
    the caller learnt only that a container could not be removed, not why the open failed.
    The removal's failure is now logged and the step's error raised."""
    from types import SimpleNamespace

    from tangram.exec.aoe import containers
    from tangram.exec.aoe.lifecycle import Blueprint, Lifecycle

    made = SimpleNamespace(id="stuck" * 13, attrs={"State": {"Pid": 0}})
    monkeypatch.setattr(containers, "create", lambda client, spec: made)
    monkeypatch.setattr(containers, "remove", _refusing_remove([]))
    lifecycle = Lifecycle(AoeConfig(), object(), NumaTopology(((0, 1),)), "s1")

    def no_cgroup(container_id: str, pid: int) -> Any:
        raise AoeError("the cgroup of the new container cannot be written")

    monkeypatch.setattr(lifecycle, "_control", no_cgroup)
    blueprint = Blueprint("t", "img", 1.0, SandboxConfig())
    with pytest.raises(AoeError, match="cgroup of the new container"):
        lifecycle._make(blueprint, "n", {})


def test_a_removal_whose_thaw_cannot_inspect_the_container_still_retries() -> None:
    """``containers.thaw`` (between a failed removal's attempts) is best effort, yet the
    engine's error from its inspect came out of it: the removal stopped after one attempt,
    raising the SDK's error instead of trying again (and instead of the AoeError its
    callers expect). The inspect's error is now ignored and the removal tried again."""
    import docker.errors

    from tangram.exec.aoe import containers

    attempts: list[str] = []

    class Api:
        def remove_container(self, cid: str, force: bool, v: bool) -> None:
            attempts.append(cid)
            if len(attempts) < 3:
                raise docker.errors.APIError("did not receive an exit event")

        def update_container(self, cid: str, **kw: object) -> None:
            pass

        def unpause(self, cid: str) -> None:
            pass

        def inspect_container(self, cid: str) -> dict:
            raise docker.errors.APIError("500 Server Error: inspect failed")

    assert containers.remove(SimpleNamespace(api=Api()), "c" * 64) is True
    assert len(attempts) == 3


def test_a_failed_start_says_why_even_when_its_container_will_not_go(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A container the engine created but failed to start is removed; when that removal
    failed too, its error replaced the start's, so the open said only that a container could
    not be removed, never why it did not start. The removal's failure is now logged and the
    start's error raised."""
    import docker.errors

    from tangram.exec.aoe import containers

    made: dict[str, Any] = {}

    class Containers:
        @staticmethod
        def run(**kwargs: Any) -> None:
            made["labels"] = kwargs["labels"]
            raise docker.errors.APIError("OCI runtime create failed: no such file")

        @staticmethod
        def get(name: str) -> Any:
            return SimpleNamespace(id="stuck" * 13, labels=made["labels"], short_id="stuck")

    client = SimpleNamespace(images=SimpleNamespace(get=lambda name: None), containers=Containers)
    monkeypatch.setattr(containers, "remove", _refusing_remove([]))
    spec = ContainerSpec("n", "img", 1.0, SandboxConfig(), 100_000, 100_000, (0,), True, {})
    with pytest.raises(AoeError, match="OCI runtime create failed"):
        containers.create(client, spec)


def test_the_exec_transport_does_not_count_its_launchers_start_in_the_time_out(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Since ca28dcf the exec transport took its deadline before waiting for the launcher's
    start (the engine's exec start: seconds on a loaded machine), so a slow start left the
    command less than its time-out, or none (killed at once, ``timeout``). The deadline is
    taken when the action is sent, as the runner's is."""
    from types import SimpleNamespace

    from tangram.exec.aoe import transport as transport_mod
    from tangram.exec.aoe.transport import ActionRequest, ExecTransport

    ours, theirs = socket.socketpair()
    socket_mod = socket
    clock = {"offset": 0.0}

    class Api:
        def exec_create(self, *args: object, **kwargs: object) -> dict:
            return {"Id": "e1"}

        def exec_start(self, exec_id: str, socket: bool) -> object:
            return ours

        def exec_inspect(self, exec_id: str) -> dict:
            if not clock["offset"]:  # the launcher's start took the whole time-out
                clock["offset"] += 30.0
                theirs.shutdown(socket_mod.SHUT_WR)  # the command runs and ends at once
                return {"Pid": 4242, "Running": True}
            return {"Pid": 4242, "Running": False, "ExitCode": 0}

    class Group:
        places = True
        ticket = "-"

        def enter(self, *args: object, **kwargs: object) -> None:
            pass

        def ended(self) -> None:
            pass

        def leave(self) -> None:
            pass

    monkeypatch.setattr(
        transport_mod,
        "time",
        SimpleNamespace(monotonic=lambda: time.monotonic() + clock["offset"], sleep=time.sleep),
    )
    kills: list[str] = []
    transport = ExecTransport(Api(), "c" * 64, "1000:1000", "/work", 1.0, Group())  # type: ignore[arg-type]
    raw = transport.run(ActionRequest("a1", "true", {}, 30.0, 100), kills.append)
    theirs.close()
    assert kills == [] and (raw.ended, raw.exit_code) == ("exit", 0)


def test_a_command_ending_at_its_deadline_gets_its_exit_code_from_a_slow_engine(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A command whose stream closed at its deadline had only ``EXIT_CODE_WAIT_S`` (a second)
    for the engine to record its exit: an engine that took longer (a loaded machine) made a
    command that had ended, maybe successfully, an ``exit_unknown`` container failure. The
    look now goes on for the kill's grace at least (bounded: an engine that never records it
    still ends the action)."""
    from tangram.exec.aoe import transport as transport_mod
    from tangram.exec.aoe.transport import ActionRequest, ExecTransport

    ours, theirs = socket.socketpair()
    socket_mod = socket
    now = [1000.0]
    recorded_at: list[float] = []

    class Api:
        def exec_create(self, *args: object, **kwargs: object) -> dict:
            return {"Id": "e1"}

        def exec_start(self, exec_id: str, socket: bool) -> object:
            return ours

        def exec_inspect(self, exec_id: str) -> dict:
            if not recorded_at:  # the stream closed (at the deadline): recorded 1.5 s later
                recorded_at.append(now[0] + 1.5)
                return {"Running": True, "ExitCode": None}
            if now[0] < recorded_at[0]:
                return {"Running": True, "ExitCode": None}
            return {"Running": False, "ExitCode": 0}

    class Group:
        places = False
        ticket = "-"

        def enter(self, *args: object, **kwargs: object) -> None:
            pass

        def ended(self) -> None:
            pass

        def leave(self) -> None:
            pass

    def sleep(s: float) -> None:
        now[0] += s

    monkeypatch.setattr(
        transport_mod, "time", SimpleNamespace(monotonic=lambda: now[0], sleep=sleep)
    )
    transport = ExecTransport(Api(), "c" * 64, "1000:1000", "/work", 5.0, Group())  # type: ignore[arg-type]
    theirs.shutdown(socket_mod.SHUT_WR)
    raw = transport.run(ActionRequest("a1", "true", {}, 0.0001, 100), lambda why: None)
    theirs.close()
    assert (raw.ended, raw.exit_code) == ("exit", 0)


def test_a_create_whose_run_call_fails_without_an_api_error_removes_what_it_made() -> None:
    """``containers.create`` handled only the engine's ``APIError`` from its run call: a read
    time-out or a lost connection (the engine slow on a loaded machine, having created and
    started the container all the same) went out as a bare error, the container left running
    in the engine, unknown to the manager, until the shutdown's sweep. Now the container
    holding the name is removed when it carries this creation's own label, and the failure
    is an ``AoeError`` naming it."""
    import requests

    from tangram.exec.aoe import containers

    removed: list[str] = []
    made: dict[str, Any] = {}

    class Api:
        def remove_container(self, cid: str, force: bool, v: bool) -> None:
            removed.append(cid)

    class Client:
        api = Api()

        class images:  # noqa: N801 - the SDK's attribute name
            @staticmethod
            def get(name: str) -> None:
                return None

        class containers:  # noqa: N801 - the SDK's attribute name
            @staticmethod
            def run(**kwargs: Any) -> Any:
                made["it"] = SimpleNamespace(
                    id="c" * 64, short_id="c" * 12, labels=dict(kwargs["labels"])
                )
                raise requests.exceptions.ReadTimeout("read timed out (60 s)")

            @staticmethod
            def get(name: str) -> Any:
                return made["it"]

    spec = ContainerSpec("n", "img", 1.0, SandboxConfig(), 100_000, 100_000, (0,), True, {})
    with pytest.raises(AoeError, match="could not start container n"):
        containers.create(Client(), spec)
    assert removed == ["c" * 64]


def test_an_exec_whose_exit_code_look_fails_keeps_the_commands_output() -> None:
    """The exec transport's look for the exit code, after the command's stream had closed,
    let the engine's error (an inspect refused, a lost connection) out of ``run``: the
    action, which had run, became a transport failure with its output thrown away. Its exit
    code is now unknown (``exit_unknown``: whether it succeeded is unknown) and its output
    kept."""
    from tangram.exec.aoe.transport import ActionRequest, ExecTransport

    ours, theirs = socket.socketpair()
    socket_mod = socket
    # What the command printed: one stdout frame of docker's multiplexed stream.
    theirs.sendall(struct.pack(">BxxxL", 1, 6) + b"ran 1\n")
    theirs.shutdown(socket_mod.SHUT_WR)

    class Api:
        def exec_create(self, *args: object, **kwargs: object) -> dict:
            return {"Id": "e1"}

        def exec_start(self, exec_id: str, socket: bool) -> object:
            return ours

        def exec_inspect(self, exec_id: str) -> dict:
            raise ConnectionError("the engine's socket closed")

    class Group:
        places = False
        ticket = "-"

        def enter(self, *args: object, **kwargs: object) -> None:
            pass

        def ended(self) -> None:
            pass

        def leave(self) -> None:
            pass

    transport = ExecTransport(Api(), "c" * 64, "1000:1000", "/work", 1.0, Group())  # type: ignore[arg-type]
    raw = transport.run(ActionRequest("a1", "true", {}, 60.0, 100), lambda why: None)
    theirs.close()
    assert (raw.ended, raw.exit_code, raw.stdout) == ("exit", None, b"ran 1\n")


def test_direct_control_refuses_a_pid_whose_cgroup_is_not_the_containers(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A new container's grant mechanism was found from its init's host pid alone: an init
    that had exited at once, its pid given to a host process (here one of sshd.service),
    made the manager park (freeze) and grant that process's cgroup, a host service's. The
    cgroup found must now be the container's (its id in the path), else direct writes are
    refused ('direct') or the engine's ``docker update`` is used ('auto')."""
    import functools

    from tangram.exec.aoe import cgroups, lifecycle
    from tangram.exec.aoe.cgroups import CgroupV2, DockerUpdate

    proc = tmp_path / "proc"
    (proc / "7").mkdir(parents=True)
    (proc / "7" / "cgroup").write_text("0::/system.slice/sshd.service\n")
    d = tmp_path / "cg" / "system.slice" / "sshd.service"
    d.mkdir(parents=True)
    for name in ("cpu.max", "cpuset.cpus", "cgroup.procs", "cgroup.freeze"):
        (d / name).write_text("")
    mountinfo = tmp_path / "mountinfo"
    mountinfo.write_text(f"30 1 0:30 / {tmp_path / 'cg'} rw - cgroup2 cgroup2 rw,nsdelegate\n")
    monkeypatch.setattr(
        lifecycle,
        "direct_control",
        functools.partial(cgroups.direct_control, proc=proc, mountinfo=mountinfo),
    )
    container_id = "abc" * 21 + "d"
    made = object.__new__(lifecycle.Lifecycle)
    made.topology = SimpleNamespace(cores=(0, 1))  # type: ignore[assignment]
    made._warned_fallback = False
    made.client = SimpleNamespace(api=None)
    made.config = AoeConfig(cgroup_mode="direct")
    with pytest.raises(AoeError, match="sshd.service"):
        made._control(container_id, 7)
    made.config = AoeConfig(cgroup_mode="auto")
    control = made._control(container_id, 7)
    assert not isinstance(control, CgroupV2) and isinstance(control, DockerUpdate)
    assert (d / "cgroup.freeze").read_text() == ""


def test_two_threads_making_the_runners_shell_at_once_both_get_it(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """``guarded.host_shell`` made its copy in a temporary file named by the pid alone: two
    threads making the first copy at once (a warm pool's fills at a service's start) wrote
    the same file, and the one that renamed it second found it gone: None, so its container
    ran an ordinary runner, whose memory its actions can read (to forge later actions'
    output). Each call now copies into a file of its own."""
    import shutil
    import threading

    from tangram.exec.aoe import guarded

    if os.geteuid() != 0 or not any(guarded._static(p) for p in guarded.SOURCES):
        pytest.skip("needs root and a static busybox")
    monkeypatch.setattr(guarded, "HOST_COPY", tmp_path / "run" / "runner-busybox")
    real_copy = shutil.copyfile
    got: list[Any] = []

    def copy_then_another(src: Any, dst: Any) -> Any:
        done = real_copy(src, dst)
        if not got:  # the first call: a second thread makes its copy meanwhile
            got.append("busy")
            other = threading.Thread(target=lambda: got.append(guarded.host_shell()))
            other.start()
            other.join(30)
        return done

    monkeypatch.setattr(guarded.shutil, "copyfile", copy_then_another)
    first = guarded.host_shell()
    assert got[1:] == [guarded.HOST_COPY]
    assert first == guarded.HOST_COPY
    assert sorted(p.name for p in guarded.HOST_COPY.parent.iterdir()) == ["runner-busybox"]


def test_a_manager_or_pool_setting_may_be_any_real_number() -> None:
    """numpy's numbers are real numbers: a time or a memory size given as one is taken."""
    import numpy as np

    assert AoeConfig(memory_gb=np.float32(2.0), default_timeout_s=np.int64(5)).memory_gb == 2.0
    assert WarmPoolConfig(window_s=np.float64(30.0)).window_s == 30.0


@pytest.mark.parametrize("name", ["work_size_mb", "tmp_size_mb"])
@pytest.mark.parametrize("value", [(1 << 30) + 1, 10**12, 2**70])
def test_a_tmpfs_size_past_the_largest_memory_limit_is_refused_naming_it(
    name: str, value: int
) -> None:
    """SandboxConfig.work_size_mb and tmp_size_mb took any whole number: 10**12 MB passed and
    the container's tmpfs showed 931P (past 2**63 bytes every open failed at the engine, naming
    no setting). A tmpfs counts against the memory limit, so neither may pass the largest
    one (``MAX_MEMORY_GB``, 1 PiB)."""
    with pytest.raises(AoeError, match=f"SandboxConfig.{name} must be .*at most"):
        SandboxConfig(**{name: value})
    assert getattr(SandboxConfig(**{name: 1 << 30}), name) == 1 << 30


@pytest.mark.parametrize("work_dir", ["/proc/w", "/sys/w", "/proc/self/x", "/sys/fs/cgroup/w"])
def test_a_work_dir_inside_proc_or_sys_is_refused_naming_it(work_dir: str) -> None:
    """Only /proc and /sys themselves were refused: a work dir inside them passed, and every
    open failed at the engine's start ('OCI runtime create failed ... mount ... proc'),
    naming no setting."""
    with pytest.raises(AoeError, match="SandboxConfig.work_dir must not be inside"):
        SandboxConfig(work_dir=work_dir)
    assert SandboxConfig(work_dir="/procs/w").work_dir == "/procs/w"


@pytest.mark.parametrize("cap", ["FOO", "CAP_FOO", "NET_RAWW", "CAP_"])
def test_a_capability_linux_lacks_is_refused_naming_it(cap: str) -> None:
    """SandboxConfig.cap_add took any upper-case name: 'FOO' passed, and every open failed at
    the engine ('invalid CapAdd: unknown capability: "CAP_FOO"'), naming no setting."""
    with pytest.raises(AoeError, match=f"SandboxConfig.cap_add: '{cap}' is not a capability"):
        SandboxConfig(cap_add=(cap,))
    for known in ("NET_RAW", "CAP_NET_RAW", "SYS_PTRACE", "CHECKPOINT_RESTORE", "ALL"):
        assert SandboxConfig(cap_add=(known,)).cap_add == (known,)


def test_a_quota_below_the_kernels_floor_is_refused_naming_it() -> None:
    """A quota under the kernel's 1 ms per CFS period (1000 / cfs_period_us cores: 0.01 at
    the default 100 ms) was raised to that floor when written (``quota_us``), but the
    action's outcome and ``TANGRAM_CPU_QUOTA`` still gave the asked-for 1e-06 cores: the
    report was not what ran. It is now refused naming ``quota_cores`` and the floor."""
    from tangram.exec.aoe.execution import plan_action

    cfg = AoeConfig()
    with pytest.raises(AoeError, match=r"quota_cores .*at least 0\.01"):
        plan_action(cfg, "true", (0,), 1e-6, None, None)
    assert plan_action(cfg, "true", (0,), 0.01, None, None).quota == 0.01
    slow = AoeConfig(cfs_period_us=1_000_000)  # a 1 s period: the floor is 0.001 cores
    assert plan_action(slow, "true", (0,), 0.001, None, None).quota == 0.001


@pytest.mark.parametrize("user", ["", ":1000"])
def test_an_empty_user_is_logged_as_the_images_not_as_root(user: str) -> None:
    """An empty user (the image's own, its ``Config.User``) was logged 'runs as root' even
    for an image whose user is not root; the relaxation now says it runs as the image's
    user, root only when the image names none."""
    names = " | ".join(SandboxConfig(user=user).relaxations())
    assert "runs as the image's user" in names and "runs as root" not in names, names
    assert "runs as root (user='0:0')" in SandboxConfig(user="0:0").relaxations()


@pytest.mark.parametrize(
    ("kw", "field"),
    [
        ({"max_per_key": 10**9}, "max_per_key"),
        ({"max_total": 10**9}, "max_total"),
        ({"workers": 10**6}, "workers"),
    ],
)
def test_a_warm_pool_size_past_its_bound_is_refused_naming_it(
    kw: dict[str, int], field: str
) -> None:
    """WarmPoolConfig's counts had no upper bound: max_total=10**9 kept every container a
    key ever wanted parked (each one memory and a process tree), workers=10**6 a thread
    pool of a million. Each is now refused naming the field."""
    with pytest.raises(AoeError, match=f"WarmPoolConfig.{field} must be .*at most"):
        WarmPoolConfig(**kw)
    assert WarmPoolConfig(max_per_key=64, max_total=1024, workers=64).workers == 64


@pytest.mark.parametrize("url", ["", "  "])
def test_an_empty_docker_base_url_is_refused_naming_it(url: str) -> None:
    """``docker_base_url=""`` passed, and ``connect`` took it for no URL: the manager used
    the default engine (from the environment) without a word. It is now refused naming
    the field; None is the way to ask for the default."""
    with pytest.raises(AoeError, match="AoeConfig.docker_base_url"):
        AoeConfig(docker_base_url=url)
    assert AoeConfig(docker_base_url=None).docker_base_url is None


@pytest.mark.parametrize(
    "work_dir", ["/etc", "/usr", "/lib", "/lib64", "/bin", "/sbin", "/usr/lib", "/var"]
)
def test_a_work_dir_over_a_system_directory_is_refused_naming_it(work_dir: str) -> None:
    """A work dir over /etc, /usr or /lib mounted its empty tmpfs there, hiding the image's
    own files (its passwd, its shell, its libraries): every action failed in ways naming no
    setting. A system directory is now refused, as /proc and /sys are."""
    with pytest.raises(AoeError, match="SandboxConfig.work_dir must not be a system"):
        SandboxConfig(work_dir=work_dir)
    for fine in ("/usr/src/app", "/etc-work", "/var/work", "/home/sandbox/work"):
        assert SandboxConfig(work_dir=fine).work_dir == fine


def test_a_weighted_grant_below_the_least_weight_is_refused_naming_it() -> None:
    """A weighted grant's ``quota_cores`` is a CPU weight (v2 ``cpu.weight`` = 100 x cores),
    whose least is 1: 0.001 cores ran at weight 1 (0.01 cores' worth) while the outcome
    said 0.001. It is now refused naming ``quota_cores`` and the least weight."""
    from tangram.exec.aoe.execution import plan_action

    cfg = AoeConfig()
    with pytest.raises(AoeError, match=r"quota_cores .*at least 0\.01"):
        plan_action(cfg, "true", (0,), 0.001, None, None, pool=(0, 1))
    assert plan_action(cfg, "true", (0,), 0.01, None, None, pool=(0, 1)).quota == 0.01
