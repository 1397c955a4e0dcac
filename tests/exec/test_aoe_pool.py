"""The warm pool: a container that served a trajectory is reset before the next one gets it
(never reused dirty), a failed reset retires it, and the pool stays within its bounds."""

from __future__ import annotations

import logging
import os
import shlex
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from tangram.exec.aoe.config import PYTHON_IMAGE, AoeConfig, SandboxConfig, WarmPoolConfig
from tangram.exec.aoe.errors import AoeError
from tangram.exec.aoe.pool import PoolKey, WarmPool
from tests.interrupts import interrupted_at, interruptible_lines

# -- the pool's bookkeeping, on fake containers -------------------------------------------


@dataclass(eq=False)
class FakeContainer:
    n: int
    dirty: bool = False

    @property
    def handle(self) -> Any:
        return type("H", (), {"short_id": f"fake{self.n}"})()


class Fakes:
    """create/reset/remove callbacks that record what the pool did."""

    def __init__(self, failing_resets: set[int] = frozenset()) -> None:
        self.made: list[FakeContainer] = []
        self.removed: list[FakeContainer] = []
        self.failing = failing_resets

    def create(self, key: PoolKey) -> Any:
        c = FakeContainer(len(self.made))
        self.made.append(c)
        return c

    def reset(self, c: Any) -> str | None:
        if c.n in self.failing:
            return "a process survived"
        c.dirty = False
        return None

    def remove(self, c: Any) -> None:
        self.removed.append(c)


KEY = PoolKey("img", 0.5, SandboxConfig())


def settle(pool: WarmPool) -> None:
    """Let the worker threads finish what was submitted."""
    deadline = time.monotonic() + 5
    while pool.stats().resetting or any(pool._filling.values()):
        assert time.monotonic() < deadline, "the pool's jobs did not finish"
        time.sleep(0.002)


def test_a_failed_reset_retires_the_container_and_a_clean_one_is_handed_out_again() -> None:
    fakes = Fakes(failing_resets={0})
    pool = WarmPool(WarmPoolConfig(max_per_key=4), fakes.create, fakes.reset, fakes.remove)
    try:
        assert pool.take(KEY) is None  # cold: the caller makes one
        first, second = fakes.create(KEY), fakes.create(KEY)
        pool.take(KEY)
        first.dirty = second.dirty = True
        pool.give_back(KEY, first)
        pool.give_back(KEY, second)
        settle(pool)
        # The worker removes a retired container just after it counted the reset as ended
        # (outside the pool's lock): the removal may still be on its way.
        deadline = time.monotonic() + 5
        while first not in fakes.removed:
            assert time.monotonic() < deadline, "the container whose reset failed was not removed"
            time.sleep(0.002)
        again = pool.take(KEY)
        assert again is second and not again.dirty
        assert pool.take(KEY) is not first
        assert pool.stats().counters["reset_failed"] == 1
    finally:
        pool.close()


def test_containers_parked_for_keys_no_longer_in_demand_make_room_for_one_that_is() -> None:
    """Parked containers were removed only when one came back: keys nobody asks for any more
    (a client's /run_code requests with memory limits of their own, one key each) kept the
    pool's total full for ever, and every other key's container coming back was removed as
    surplus: the warm pool served no one again. Past its window such a key's parked containers
    are surplus and go when another key needs the room."""
    now = [0.0]
    fakes = Fakes()
    cfg = WarmPoolConfig(max_per_key=4, max_total=2, window_s=60.0, workers=1)
    pool = WarmPool(cfg, fakes.create, fakes.reset, fakes.remove, clock=lambda: now[0])
    odd = [PoolKey("img", 0.25 + i, SandboxConfig()) for i in range(2)]
    try:
        for key in odd:  # one request each, then never again
            assert pool.take(key) is None
            pool.give_back(key, fakes.create(key))
        settle(pool)
        assert sum(pool.stats().parked.values()) == 2  # the total, all of it stale soon
        now[0] += 61.0
        assert pool.take(KEY) is None
        mine = fakes.create(KEY)
        pool.give_back(KEY, mine)
        settle(pool)
        assert pool.take(KEY) is mine, pool.stats()
        stats = pool.stats()  # as few stale ones went as made the room, the oldest first
        assert stats.counters["removed_stale"] == 1 and "removed_surplus" not in stats.counters
        assert stats.parked.get(odd[0].describe(), 0) == 0
        assert stats.parked[odd[1].describe()] == 1
        pool.close()  # (joins the worker: the stale one's removal is done)
        assert fakes.removed[0].n == 0
    finally:
        pool.close()


def test_a_key_idle_past_its_window_is_forgotten() -> None:
    """Every key the pool ever saw stayed in its tables and in /metrics' gauges (one label
    each): a client's /run_code requests with memory limits of their own, one key each,
    grew the service's memory and every scrape without bound. A key with nothing parked,
    busy or being made, and no demand within its window, is forgotten."""
    now = [0.0]
    fakes = Fakes()
    cfg = WarmPoolConfig(max_per_key=4, max_total=2, window_s=60.0, workers=1)
    pool = WarmPool(cfg, fakes.create, fakes.reset, fakes.remove, clock=lambda: now[0])
    try:
        for i in range(50):  # one request each, then never again
            key = PoolKey("img", 0.25 + i, SandboxConfig())
            assert pool.take(key) is None
            pool.give_back(key, fakes.create(key))
            settle(pool)
        assert len(pool.stats().target) == 50
        now[0] += 61.0
        pool.take(KEY)
        assert len(pool.stats().target) <= 1 + cfg.max_total, pool.stats()
    finally:
        pool.close()


@given(st.lists(st.sampled_from(["take", "back"]), max_size=40), st.integers(1, 3))
def test_the_pool_never_holds_more_than_its_bounds(ops: list[str], max_total: int) -> None:
    fakes = Fakes()
    cfg = WarmPoolConfig(max_per_key=2, max_total=max_total, workers=1)
    pool = WarmPool(cfg, fakes.create, fakes.reset, fakes.remove)
    out: list[Any] = []
    try:
        for op in ops:
            if op == "take":
                got = pool.take(KEY)
                out.append(got if got is not None else fakes.create(KEY))
            elif out:
                pool.give_back(KEY, out.pop())
            settle(pool)
            s = pool.stats()
            parked = sum(s.parked.values())
            assert parked <= cfg.max_per_key and parked + s.resetting <= max_total
            assert not set(map(id, out)) & {id(c) for c in pool._parked.get(KEY, [])}
    finally:
        pool.close()


# -- real containers ----------------------------------------------------------------------


@pytest.fixture(scope="module")
def pooled(docker_client: Any) -> Iterator[Any]:
    """A manager with a warm pool of at most two containers per kind."""
    from tangram.exec.aoe import AoeManager

    cfg = AoeConfig(image=PYTHON_IMAGE, kill_grace_s=3.0, warm_pool=WarmPoolConfig(2))
    with AoeManager(cfg, client=docker_client) as m:
        yield m


def wait_parked(manager: Any, n: int = 1) -> None:
    deadline = time.monotonic() + 30
    while sum(manager.pool_stats().parked.values()) < n:
        assert time.monotonic() < deadline, f"no container parked: {manager.pool_stats()}"
        time.sleep(0.02)


DIRTY = (
    "echo secret > left.txt; echo 'export EVIL=1' > .profile; mkdir -p locked/in; "
    "echo x > locked/in/f; chmod 000 locked; echo t > /tmp/t; echo s > /dev/shm/s; "
    "(exec -a tangram-leftover sleep 1000 &); nohup sh -c 'exec sleep 999' >/dev/null 2>&1 & "
    "export EVIL=1; echo done"
)
CHECK = (
    "echo files=$(ls -A /work /tmp /dev/shm | grep -v :$ | tr -d '\\n'); "
    "echo procs=$(for p in /proc/[0-9]*; do tr '\\0' ' ' < $p/cmdline; echo; done "
    "| grep -c 'sleep [1]000\\|sleep [9]99\\|tangram-leftove[r]'); echo evil=${EVIL:-none}"
)


def test_a_dirty_container_is_reset_before_the_next_trajectory_gets_it(
    pooled: Any, tmp_path: Any
) -> None:
    # Canaries on the host: symlinks to them from the work dir must not lead the reset (which
    # empties the dirs from the host) out of the container.
    canary_dir = tmp_path / "canary"
    canary_dir.mkdir()
    (canary_dir / "keep.txt").write_text("host file")
    first = pooled.open_trajectory("dirty")
    links = f"ln -s {canary_dir} dirlink; ln -s {canary_dir / 'keep.txt'} filelink; "
    out = pooled.run_action("dirty", links + DIRTY)
    assert out.status == "ok" and out.stdout.strip().endswith(b"done"), out
    before = pooled.run_action("dirty", CHECK).stdout.decode()
    assert "procs=0" not in before and "files=\n" not in before  # the mess is there
    pooled.close_trajectory("dirty")
    wait_parked(pooled)
    second = pooled.open_trajectory("clean")
    try:
        assert second.container_id == first.container_id, "the pool did not reuse it"
        assert second.traj_id == "clean"
        after = pooled.run_action("clean", CHECK)
        assert after.stdout.decode().split() == ["files=", "procs=0", "evil=none"], after
        assert (canary_dir / "keep.txt").read_text() == "host file"
    finally:
        pooled.close_trajectory("clean")
        idle(pooled)


@pytest.mark.parametrize("user", ["65534:65534", "65534", "nobody"])
def test_a_sandbox_whose_actions_run_as_the_keepers_uid_is_never_pooled(
    pooled: Any, user: str
) -> None:
    """A reset spares the processes of the keeper's uid (65534, ``nobody``), and a sandbox
    may name that uid for its actions: every process the last user left then survived the
    reset, and the next trajectory, another client's, got the container with them running
    in it (and its actions could signal and ptrace the keeper and init). Such a sandbox is
    not pooled: its containers are its trajectory's alone."""
    sandbox = SandboxConfig(user=user)
    pooled.open_trajectory("as-keeper", sandbox=sandbox)
    try:
        out = pooled.run_action("as-keeper", DIRTY)
        assert out.status == "ok", out
    finally:
        pooled.close_trajectory("as-keeper")
    idle(pooled)
    pooled.open_trajectory("after-keeper", sandbox=sandbox)
    try:
        after = pooled.run_action("after-keeper", CHECK)
        assert after.stdout.decode().split() == ["files=", "procs=0", "evil=none"], after
    finally:
        pooled.close_trajectory("after-keeper")
        idle(pooled)
    assert not pooled.prewarm(1, sandbox=sandbox)


#: Leaves a SysV shared-memory segment (4 MiB, charged to the container's memory), a SysV
#: message queue, a semaphore set and a POSIX message queue, each holding a secret; they
#: outlive the process that made them.
PLANT_IPC = """
import ctypes, ctypes.util, os
libc = ctypes.CDLL(None, use_errno=True)
rt = ctypes.CDLL(ctypes.util.find_library('rt') or None, use_errno=True)
secret = b'secret-of-the-last-user'
libc.shmat.restype = ctypes.c_void_p
addr = libc.shmat(libc.shmget(0x7A11, 4 << 20, 0o1666), None, 0)
ctypes.memmove(addr, secret, len(secret))
class Msg(ctypes.Structure):
    _fields_ = [('mtype', ctypes.c_long), ('mtext', ctypes.c_char * 64)]
assert libc.msgsnd(libc.msgget(0x7A12, 0o1666), ctypes.byref(Msg(1, secret)), len(secret), 0) == 0
assert libc.semget(0x7A13, 1, 0o1666) >= 0
q = rt.mq_open(b'/left-behind', os.O_CREAT | os.O_RDWR, 0o666, None)
assert q >= 0 and rt.mq_send(q, secret, len(secret), 0) == 0
print('planted')
"""
#: What the next user sees of them: one line per SysV object, one name per POSIX queue.
SEE_IPC = (
    'for k in shm msg sem; do tail -n +2 /proc/sysvipc/$k | sed "s/^/$k /"; done; '
    "ls -A /dev/mqueue; echo end"
)


def test_a_reset_removes_the_ipc_objects_the_last_user_left(pooled: Any) -> None:
    """SysV shared memory, message queues and semaphores live in the container's IPC
    namespace, not in a directory, and POSIX queues in /dev/mqueue: the next user of a pooled
    container could read them (and a segment's memory stayed charged to the container)."""
    failed = pooled.pool_stats().counters.get("reset_failed", 0)
    first = pooled.open_trajectory("ipc-dirty")
    out = pooled.run_action("ipc-dirty", f"python3 -c {shlex.quote(PLANT_IPC)}; {SEE_IPC}")
    assert out.ok and out.text.startswith("planted\n"), out
    seen = out.text.splitlines()[1:]
    assert {ln.split()[0] for ln in seen[:-2]} == {"shm", "msg", "sem"} and "left-behind" in seen
    pooled.close_trajectory("ipc-dirty")
    assert first.container_id in parked_ids(pooled), "the reset failed: the container retired"
    assert pooled.pool_stats().counters.get("reset_failed", 0) == failed
    # The next users get the parked containers (two at most): one of them is this one.
    users = [f"ipc-clean-{i}" for i in range(len(parked_ids(pooled)))]
    try:
        handles = {u: pooled.open_trajectory(u) for u in users}
        reused = next(u for u, h in handles.items() if h.container_id == first.container_id)
        after = pooled.run_action(reused, SEE_IPC)
        assert after.ok and after.text == "end\n", after
    finally:
        for u in users:
            pooled.close_trajectory(u)
        parked_ids(pooled)  # the resets done: the next test finds them parked


def idle(manager: Any) -> None:
    """Wait until the manager's pool runs no reset and no fill: a test returns only then
    (conftest fails one that leaves them running on into the next test)."""
    pool = manager._containers.pool
    deadline = time.monotonic() + 30
    while pool.stats().resetting or any(pool._filling.values()):
        assert time.monotonic() < deadline, f"resets did not end: {manager.pool_stats()}"
        time.sleep(0.02)


def parked_ids(manager: Any) -> set[str]:
    """Container ids the manager's pool holds parked, once no reset or fill is running."""
    idle(manager)
    pool = manager._containers.pool
    with pool._lock:
        return {c.handle.container_id for cs in pool._parked.values() for c in cs}


def test_an_action_cannot_kill_a_pooled_containers_keeper(pooled: Any) -> None:
    failed = pooled.pool_stats().counters.get("reset_failed", 0)
    handle = pooled.open_trajectory("killer")
    out = pooled.run_action("killer", "kill -9 -1; kill -9 1; sleep 1")
    assert out.status in ("ok", "error")
    pooled.close_trajectory("killer")
    assert handle.container_id in parked_ids(pooled), "the container died or was retired"
    assert pooled.pool_stats().counters.get("reset_failed", 0) == failed


def test_prewarmed_containers_serve_opens_without_a_create(pooled: Any) -> None:
    assert pooled.prewarm(2)
    wait_parked(pooled, 2)
    hits = pooled.pool_stats().counters.get("hits", 0)
    pooled.open_trajectory("warm")
    try:
        assert pooled.pool_stats().counters["hits"] == hits + 1
        assert pooled.run_action("warm", "python3 -c 'print(6*7)'").stdout == b"42\n"
    finally:
        pooled.close_trajectory("warm")
        idle(pooled)


def test_a_parked_container_that_died_is_never_handed_out(pooled: Any, docker_client: Any) -> None:
    """A parked container killed while it waited (an operator, the OOM killer, a sweep) was
    handed to the next trajectory as it was: its first action failed with "container ...
    died; call recreate()", blamed on a client that had done nothing but open it."""
    from tangram.exec.aoe import containers

    assert pooled.prewarm(1)
    wait_parked(pooled)
    victims = parked_ids(pooled)
    for victim in victims:  # thawed first: a frozen init would not die (cgroup v1)
        containers.thaw(docker_client, victim)
        docker_client.api.kill(victim)
        docker_client.api.wait(victim, timeout=30)
    died = pooled.pool_stats().counters.get("died_parked", 0)
    handle = pooled.open_trajectory("after-a-death")
    try:
        out = pooled.run_action("after-a-death", "echo alive")
        assert out.ok and out.text == "alive\n", out
        assert handle.container_id not in victims, "a dead parked container was handed out"
        assert pooled.pool_stats().counters["died_parked"] > died
    finally:
        pooled.close_trajectory("after-a-death")
        idle(pooled)


def test_a_trajectory_whose_recreate_failed_never_runs_in_the_container_it_gave_back(
    pooled: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    """``recreate`` retires the old container (a pooled one goes back to the pool, which
    resets it and hands it to the next trajectory) and then starts a new one. When the start
    failed, the trajectory kept the old container: its next action ran in it, by then parked
    in the pool or another trajectory's (that one's files, its processes), and its close gave
    it back to the pool a second time. Now the trajectory has no container until a recreate
    succeeds: its actions are refused, naming why, and its close gives back nothing."""
    from tangram.exec.aoe.errors import AoeError

    pooled.open_trajectory("recreate-fails")
    real_start = pooled._containers.start

    def broken(blueprint: Any) -> Any:
        raise AoeError("the engine refused the create")

    monkeypatch.setattr(pooled._containers, "start", broken)
    with pytest.raises(AoeError, match="refused the create"):
        pooled.recreate("recreate-fails")
    monkeypatch.setattr(pooled._containers, "start", real_start)
    idle(pooled)  # the old container is reset and parked, ready for the next trajectory
    other = pooled.open_trajectory("gets-it-next")
    try:
        pooled.run_action("gets-it-next", "echo mine > secret.txt")
        with pytest.raises(AoeError, match="recreate"):
            pooled.run_action("recreate-fails", "cat secret.txt; echo ran")
        for look in (pooled.handle, pooled.cpu_usage_s, pooled.control):  # not its container
            with pytest.raises(AoeError, match="has no container"):
                look("recreate-fails")
        pooled.close_trajectory("recreate-fails")  # gives back nothing: it holds nothing
        out = pooled.run_action("gets-it-next", "cat secret.txt")
        assert out.ok and out.text == "mine\n", out
        assert pooled.handle("gets-it-next").container_id == other.container_id
    finally:
        pooled.close_trajectory("gets-it-next")
        idle(pooled)


def test_a_relaxed_sandbox_is_never_pooled(pooled: Any) -> None:
    assert not pooled.prewarm(1, sandbox=SandboxConfig(user="0:0"))
    assert not pooled.prewarm(1, sandbox=SandboxConfig(read_only_root=False))


def test_no_pool_unless_configured(manager: Any) -> None:
    assert manager.pool_stats() is None and not manager.prewarm(1)


PROBE = """
import ctypes, os
libc = ctypes.CDLL(None, use_errno=True)
runner = [p for p in os.listdir('/proc') if p.isdigit()
          and b'.tangram/busybox' in open(f'/proc/{p}/cmdline', 'rb').read()]
pid = int(runner[0])
print('attach', libc.ptrace(16, pid, 0, 0), os.strerror(ctypes.get_errno()))
for what in ('mem', 'environ', 'fd'):
    try:
        (os.listdir if what == 'fd' else lambda p: open(p, 'rb').read(1))(f'/proc/{pid}/{what}')
        print(what, 'open')
    except PermissionError:
        print(what, 'denied')
"""


def test_no_action_can_reach_a_pooled_containers_runner_so_resets_keep_it(pooled: Any) -> None:
    handle = pooled.open_trajectory("prober")
    container = pooled._trajs["prober"].container
    assert container.guarded_runner, "the pool's containers run their runner from guarded.py"
    runner = container.transport.pid
    out = pooled.run_action("prober", f"python3 -c {shlex.quote(PROBE)}")
    assert out.stdout.decode().split("\n")[:4] == [
        "attach -1 Operation not permitted",
        "mem denied",
        "environ denied",
        "fd denied",
    ], out
    pooled.close_trajectory("prober")
    assert handle.container_id in parked_ids(pooled)
    assert container.transport.pid == runner, "the reset replaced a runner it could keep"


NONBLOCK = (
    "import fcntl, os; fcntl.fcntl(1, fcntl.F_SETFL, fcntl.fcntl(1, fcntl.F_GETFL) | os.O_NONBLOCK)"
)


def test_an_action_making_its_stdout_non_blocking_leaves_later_actions_alone(
    pooled: Any,
) -> None:
    """The runner's pipes are shared by every action it starts unless each action reopens
    them: Node (or this) sets O_NONBLOCK, and a later program's writes fail with EAGAIN."""
    pooled.open_trajectory("nonblock")
    try:
        assert pooled.run_action("nonblock", f"python3 -c {shlex.quote(NONBLOCK)}").status == "ok"
        out = pooled.run_action(
            "nonblock",
            "python3 -c \"import sys; sys.stdout.write('x' * 3_000_000)\"",
            max_output_bytes=4_000_000,
        )
        assert out.status == "ok" and len(out.stdout) == 3_000_000, (out.status, out.stderr)
    finally:
        pooled.close_trajectory("nonblock")
        idle(pooled)


def test_a_container_removed_during_a_listing_does_not_fail_it() -> None:
    """The SDK's ``containers.list`` inspects each container it lists, and one removed in
    between (by another manager, a reaper) failed it with NotFound: five tries in a row
    failed under the churn of managers side by side (seen in this suite), and the NotFound
    came out of a new manager's constructor (its orphan sweep). The listing is now the
    engine's one list call, nothing inspected."""
    import docker.errors

    from tangram.exec.aoe.containers import session_containers

    class Churning:
        def list(self, **kwargs: Any) -> list[str]:  # (always one removed mid-list)
            raise docker.errors.NotFound("No such container: abc")

    rows = [{"Id": "c" * 64, "Names": ["/tangram-aoe-x"], "Labels": {"tangram.aoe": "1"}}]
    api = SimpleNamespace(containers=lambda **kwargs: rows)
    client = SimpleNamespace(containers=Churning(), api=api)
    listed = session_containers(client, "s")
    assert [(c.id, c.name, c.labels) for c in listed] == [
        ("c" * 64, "tangram-aoe-x", {"tangram.aoe": "1"})
    ]


def test_a_host_without_nsenter_fails_each_reset_and_says_why_once(
    monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    from tangram.exec.aoe import reset

    def missing(*args: Any, **kwargs: Any) -> None:
        raise FileNotFoundError(2, "No such file or directory", "nsenter")

    # Only this test's stand-in container sees the stand-ins, and only through ``reset``'s own
    # names: patching ``os.stat``, ``subprocess.run`` or ``processes`` for the whole process
    # once let a reset still running in the background (an earlier test's pool) list this
    # process as its container's and SIGKILL the test run.
    stand_in = SimpleNamespace(name="stand-in")
    real_processes = reset.processes
    mine = {os.getpid()}

    class HostOs:
        """``os`` with this process's namespace seen as another's (a container's)."""

        def __getattr__(self, name: str) -> Any:
            return getattr(os, name)

        @staticmethod
        def stat(path: str, *args: Any, **kwargs: Any) -> Any:
            if path == "/proc/self/ns/ipc":
                return SimpleNamespace(st_ino=-1)
            return os.stat(path, *args, **kwargs)

    monkeypatch.setattr(reset, "os", HostOs())
    monkeypatch.setattr(
        reset, "subprocess", SimpleNamespace(run=missing, SubprocessError=Exception)
    )
    monkeypatch.setattr(reset, "processes", lambda c: mine if c is stand_in else real_processes(c))
    reset._warn_once.cache_clear()
    caplog.set_level(logging.WARNING, logger="tangram.exec.aoe.reset")
    for _ in range(3):
        why = reset._clear_sysv_ipc(os.getpid(), stand_in)
        assert why is not None and "could not be removed" in why and "nsenter" in why
    warned = [r.getMessage() for r in caplog.records if "every reset fails" in r.getMessage()]
    assert len(warned) == 1 and "nsenter and ipcrm" in warned[0]
    # A pid no longer the container's (its init gone, the pid reused) is never entered.
    mine.clear()
    assert "init is gone" in (reset._clear_sysv_ipc(os.getpid(), stand_in) or "")


def test_a_reset_whose_park_fails_is_no_clean_reset(monkeypatch: pytest.MonkeyPatch) -> None:
    """The reset's closing park (freeze, parking quota and cpuset) was in a ``finally`` that
    suppressed its error: a reset that had thawed the container and granted it the node's
    cores, then could not park it, still said "clean", and the pool kept it running
    unparked, handed to the next trajectory as a parked one. Now that reset fails (the pool
    removes the container)."""
    from tangram.exec.aoe import reset
    from tangram.exec.aoe.transport import RunnerTransport

    class Control:
        def pids(self) -> list[int]:
            return []

        def background(self, on: bool) -> None:
            pass

        def park(self) -> None:
            raise AoeError("writing 'FROZEN' to freezer.state failed: EBUSY")

    transport = RunnerTransport(None, "c" * 64, "1000:1000", "/work", 1.0, None)  # type: ignore[arg-type]
    stand_in = SimpleNamespace(
        dead=None,
        init_pid=os.getpid(),
        transport=transport,
        control=Control(),
        guarded_runner=False,
    )
    monkeypatch.setattr(reset, "_reset_on", lambda container, init, cores, runner: None)
    why = reset.reset(stand_in, (0, 1))  # type: ignore[arg-type]
    assert why is not None and "could not be parked" in why and "EBUSY" in why


def test_a_removal_that_fails_with_an_engine_error_is_logged_on_the_worker(
    caplog: pytest.LogCaptureFixture,
) -> None:
    """A pool removal logged only ``AoeError``: the engine's own errors (the SDK's
    ConnectionError, APIError) raised on the worker thread, where the executor kept them in a
    future nobody reads: the container stayed in the engine and nothing said so."""
    fakes = Fakes()

    def remove(c: Any) -> None:
        fakes.removed.append(c)
        raise ConnectionError("engine unreachable")

    pool = WarmPool(WarmPoolConfig(max_per_key=0), fakes.create, fakes.reset, remove)
    try:
        caplog.set_level(logging.WARNING, logger="tangram.exec.aoe.pool")
        pool.take(KEY)  # counted busy; nothing parked, no room to fill
        pool.give_back(KEY, FakeContainer(7))  # no room: removed on a worker
        deadline = time.monotonic() + 10
        while not any("engine unreachable" in r.getMessage() for r in caplog.records):
            assert time.monotonic() < deadline, "the failed removal was never logged"
            time.sleep(0.01)
        assert [c.n for c in fakes.removed] == [7]
    finally:
        pool.close()


@pytest.mark.parametrize("count", ["2", 2.0, True, -1, None, float("nan")])
def test_a_prewarm_count_that_is_no_whole_number_of_containers_is_refused(count: Any) -> None:
    """``prewarm(count)`` took any value: a string raised a bare TypeError from ``max``
    naming nothing, True made one container, a negative count passed as 0. It is now an
    ``AoeError`` naming the count, from the pool and from the manager (with a pool or not),
    before any container is made."""
    from tangram.exec.aoe.manager import AoeManager

    fakes = Fakes()
    pool = WarmPool(WarmPoolConfig(max_per_key=4), fakes.create, fakes.reset, fakes.remove)
    try:
        with pytest.raises(AoeError, match="count"):
            pool.prewarm(KEY, count)
    finally:
        pool.close()
    assert fakes.made == []
    asked: list[Any] = []
    lifecycle = SimpleNamespace(
        blueprint=lambda *a: asked.append(a), prewarm=lambda *a: asked.append(a) or False
    )
    with pytest.raises(AoeError, match="count"):
        AoeManager.prewarm(SimpleNamespace(_containers=lifecycle), count)  # type: ignore[arg-type]
    assert asked == []


def test_a_prewarm_of_zero_is_accepted() -> None:
    fakes = Fakes()
    pool = WarmPool(WarmPoolConfig(max_per_key=4), fakes.create, fakes.reset, fakes.remove)
    try:
        pool.prewarm(KEY, 0)
        settle(pool)
    finally:
        pool.close()
    assert fakes.made == []


def test_a_pool_closed_with_resets_and_removals_queued_removes_their_containers() -> None:
    """``close`` cancelled the queued jobs (``cancel_futures``): a container waiting for its
    reset or its removal on a busy worker was then never removed by the pool (only a
    manager's sweep of its session would find it), so a pool used alone leaked it."""
    import threading

    fakes = Fakes()
    started, release = threading.Event(), threading.Event()

    def reset(c: Any) -> str | None:
        started.set()
        assert release.wait(10), "the test never released the reset"
        return None

    pool = WarmPool(
        WarmPoolConfig(max_per_key=4, workers=1), fakes.create, fakes.reset, fakes.remove
    )
    pool._reset = reset  # type: ignore[method-assign]
    shutdown = pool._jobs.shutdown

    def shutdown_then_release(wait: bool = True, *, cancel_futures: bool = False) -> None:
        shutdown(wait=False, cancel_futures=cancel_futures)  # the queued jobs are cancelled now
        release.set()  # only then does the running reset end
        shutdown(wait=wait)

    pool._jobs.shutdown = shutdown_then_release  # type: ignore[method-assign]
    busy, queued = FakeContainer(100), FakeContainer(101)
    for _ in range(3):
        pool.take(KEY)
    settle_fills = time.monotonic() + 10
    while any(pool._filling.values()):  # the fills take the worker first
        assert time.monotonic() < settle_fills
        time.sleep(0.002)
    pool.give_back(KEY, busy)  # its reset holds the one worker
    assert started.wait(10)
    pool.give_back(KEY, queued)  # its reset waits in the queue
    pool.close()
    removed = {c.n for c in fakes.removed}
    assert {100, 101} <= removed, f"removed {sorted(removed)}"
    assert {c.n for c in fakes.made} <= removed


def test_a_reset_whose_init_died_meanwhile_never_empties_another_processes_dirs(
    tmp_path: Path,
) -> None:
    """The reset emptied the work dir, /tmp, /dev/shm and /dev/mqueue through
    ``/proc/<init>/root`` checking only that init was alive when the reset began: an init that
    died during the reset (the container killed from outside) and whose pid the kernel gave
    to another process (here: a process rooted at ``tmp_path``, as a host process is at /)
    had that process's files emptied. Now the root is opened first and init must still be the
    container's, after the open, or nothing is emptied."""
    import subprocess
    import sys

    from tangram.exec.aoe import reset
    from tangram.exec.aoe.reset import KEEPER_UID
    from tangram.exec.aoe.transport import RunnerTransport

    for d in ("work", "tmp"):
        (tmp_path / d).mkdir()
        (tmp_path / d / "precious").write_text("not the container's")
    # The process the pid went to: rooted at tmp_path, running as the keeper's uid.
    other = subprocess.Popen(
        [
            sys.executable,
            "-c",
            f"import os, sys, time; os.chroot({str(tmp_path)!r}); os.setgid({KEEPER_UID}); "
            f"os.setuid({KEEPER_UID}); print('ready', flush=True); time.sleep(60)",
        ],
        stdout=subprocess.PIPE,
    )
    try:
        assert other.stdout is not None and other.stdout.readline() == b"ready\n"
        init_alive = [True]

        class Control:
            def pids(self) -> list[int]:
                return [other.pid] if init_alive[0] else []

            def background(self, on: bool) -> None:
                pass

            def grant(self, cores: Any, quota: float) -> None:
                init_alive[0] = False  # the container is killed: its init leaves the cgroup

            def park(self) -> None:
                pass

        transport = RunnerTransport(None, "c" * 64, "1000:1000", "/work", 1.0, None)  # type: ignore[arg-type]
        stand_in = SimpleNamespace(
            dead=None,
            init_pid=other.pid,
            transport=transport,
            control=Control(),
            group=None,
            guarded_runner=False,
            blueprint=SimpleNamespace(sandbox=SandboxConfig()),
        )
        why = reset.reset(stand_in, (0,))  # type: ignore[arg-type]
        assert why is not None
        assert (tmp_path / "work" / "precious").exists(), why
        assert (tmp_path / "tmp" / "precious").exists(), why
    finally:
        other.kill()
        other.wait()


def test_a_resets_kill_never_signals_a_process_that_took_a_listed_ones_pid(
    tmp_path: Path,
) -> None:
    """The reset listed the container's processes and then SIGKILLed each by pid: one that
    ended between the two (the last user's program exiting), its pid given at once to another
    process (another container's, the host's), had that process killed. Each is now held by a
    pidfd, still the container's after the open, and signalled through it."""
    import subprocess
    import sys

    from tangram.exec.aoe import reset
    from tangram.exec.aoe.reset import KEEPER_UID
    from tangram.exec.aoe.transport import RunnerTransport

    if not Path("/proc/sys/kernel/ns_last_pid").exists() or os.geteuid() != 0:
        pytest.skip("needs root and ns_last_pid to hand a pid on")
    # The container's init (rooted at tmp_path, as the keeper) and a process of its last user.
    init = subprocess.Popen(
        [
            sys.executable,
            "-c",
            f"import os, time; os.chroot({str(tmp_path)!r}); os.setgid({KEEPER_UID}); "
            f"os.setuid({KEEPER_UID}); print('ready', flush=True); time.sleep(60)",
        ],
        stdout=subprocess.PIPE,
    )
    users = subprocess.Popen(["sleep", "60"])
    newcomer: list[subprocess.Popen[bytes]] = []
    calls = [0]

    def hand_on() -> None:
        users.kill()  # the user's process ends right after it was listed
        users.wait()
        for _ in range(50):  # its pid to a newcomer (bounded: other forks may take it first)
            Path("/proc/sys/kernel/ns_last_pid").write_text(str(users.pid - 1))
            other = subprocess.Popen(["sleep", "60"])
            if other.pid == users.pid:
                newcomer.append(other)
                return
            other.kill()
            other.wait()

    class Control:
        def pids(self) -> list[int]:
            calls[0] += 1
            if calls[0] == 3:  # the listing the kill goes by (after the None check, keepers)
                hand_on()
                return [init.pid, users.pid]
            return [init.pid, users.pid] if calls[0] < 3 else []

        def background(self, on: bool) -> None:
            pass

        def grant(self, cores: Any, quota: float) -> None:
            pass

        def park(self) -> None:
            pass

    try:
        assert init.stdout is not None and init.stdout.readline() == b"ready\n"
        transport = RunnerTransport(None, "c" * 64, "1000:1000", "/work", 1.0, None)  # type: ignore[arg-type]
        stand_in = SimpleNamespace(
            dead=None,
            init_pid=init.pid,
            transport=transport,
            control=Control(),
            group=None,
            guarded_runner=False,
            blueprint=SimpleNamespace(sandbox=SandboxConfig()),
        )
        reset.reset(stand_in, (0,))  # type: ignore[arg-type]
        if not newcomer:
            pytest.skip("the pid was taken by another fork every time")
        with pytest.raises(subprocess.TimeoutExpired):  # (a SIGKILL ends it at once)
            newcomer[0].wait(timeout=2)
    finally:
        for p in (init, users, *newcomer):
            p.kill()
            p.wait()


def test_a_reset_never_continues_a_process_that_took_its_kept_runners_pid(
    tmp_path: Path,
) -> None:
    """A reset that keeps the runner (the exec-only shell) sent it SIGCONT by pid, in case an
    action had stopped it: a runner gone since it was found alive (the container killed from
    outside), its pid given to another process (another container's, the host's) that was
    stopped, had that process continued. The runner is now held by a pidfd, seen the
    container's after the open, and signalled through it."""
    import signal
    import subprocess
    import sys

    from tangram.exec.aoe import reset
    from tangram.exec.aoe.reset import KEEPER_UID
    from tangram.exec.aoe.transport import RunnerTransport

    if not Path("/proc/sys/kernel/ns_last_pid").exists() or os.geteuid() != 0:
        pytest.skip("needs root and ns_last_pid to hand a pid on")
    init = subprocess.Popen(
        [
            sys.executable,
            "-c",
            f"import os, time; os.chroot({str(tmp_path)!r}); os.setgid({KEEPER_UID}); "
            f"os.setuid({KEEPER_UID}); print('ready', flush=True); time.sleep(60)",
        ],
        stdout=subprocess.PIPE,
    )
    runner = subprocess.Popen(["sleep", "60"])
    newcomer: list[subprocess.Popen[bytes]] = []
    runner_gone = [False]

    def hand_on() -> None:
        runner.kill()  # the container is killed from outside: its runner ends
        runner.wait()
        runner_gone[0] = True
        for _ in range(50):  # its pid to a newcomer (bounded: other forks may take it first)
            Path("/proc/sys/kernel/ns_last_pid").write_text(str(runner.pid - 1))
            other = subprocess.Popen(["sleep", "60"])
            if other.pid == runner.pid:
                os.kill(other.pid, signal.SIGSTOP)  # stopped, as the host's processes may be
                deadline = time.monotonic() + 10
                while state(other.pid) != "T":  # (the stop takes effect once it is scheduled)
                    assert time.monotonic() < deadline, "the newcomer never stopped"
                    time.sleep(0.01)
                newcomer.append(other)
                return
            other.kill()
            other.wait()

    class Control:
        def pids(self) -> list[int]:
            return [init.pid] + ([] if runner_gone[0] else [runner.pid])

        def background(self, on: bool) -> None:
            pass

        def grant(self, cores: Any, quota: float) -> None:
            hand_on()  # after the runner was found alive and spared, before its SIGCONT

        def park(self) -> None:
            pass

    def state(pid: int) -> str:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]

    try:
        assert init.stdout is not None and init.stdout.readline() == b"ready\n"
        transport = RunnerTransport(None, "c" * 64, "1000:1000", "/work", 1.0, None)  # type: ignore[arg-type]
        transport.pid = runner.pid
        transport._reader = SimpleNamespace(eof=False)  # type: ignore[assignment]
        stand_in = SimpleNamespace(
            dead=None,
            init_pid=init.pid,
            transport=transport,
            control=Control(),
            group=None,
            guarded_runner=True,
            blueprint=SimpleNamespace(sandbox=SandboxConfig()),
        )
        reset.reset(stand_in, (0,))  # type: ignore[arg-type]
        if not newcomer:
            pytest.skip("the pid was taken by another fork every time")
        assert state(newcomer[0].pid) == "T", "the stopped newcomer was continued"
    finally:
        for p in (init, runner, *newcomer):
            p.kill()
            p.wait()


def test_a_prewarm_after_the_pool_is_closed_is_refused() -> None:
    """A prewarm of a closed pool set its floor and made nothing, silently: its caller took
    it for done. It is now an ``AoeError`` saying the pool is closed."""
    fakes = Fakes()
    pool = WarmPool(WarmPoolConfig(max_per_key=4), fakes.create, fakes.reset, fakes.remove)
    pool.close()
    with pytest.raises(AoeError, match="closed"):
        pool.prewarm(KEY, 2)
    assert fakes.made == []


def test_a_prewarm_after_the_managers_shutdown_is_refused(docker_client: Any) -> None:
    """``AoeManager.prewarm`` after the shutdown returned True (containers on their way)
    while its closed pool made none. It is now an ``AoeError`` saying the manager is shut
    down."""
    from tangram.exec.aoe import AoeManager

    cfg = AoeConfig(image=PYTHON_IMAGE, warm_pool=WarmPoolConfig(2), cleanup_orphans=False)
    manager = AoeManager(cfg, client=docker_client)
    manager.shutdown()
    with pytest.raises(AoeError, match="shut down"):
        manager.prewarm(1)
    assert manager.pool_stats() is not None and not manager.pool_stats().parked


def test_an_interrupt_anywhere_taking_a_parked_container_loses_none() -> None:
    """``WarmPool.take`` counted the key busy and popped a parked container before it
    handed it out: an interrupt in between (a KeyboardInterrupt) lost the container,
    running, neither parked nor anyone's, and kept the key counted busy for good. An
    interrupt at any line of the take (but its handler's) now puts it back."""
    import inspect

    function = WarmPool.take
    source, first = inspect.getsourcelines(function)
    handlers = {
        ln
        for i, t in enumerate(source)
        if t.strip() == "except BaseException:"
        for ln in range(first + i, first + i + 6)
    }
    code = function.__code__
    lines = [ln for ln in interruptible_lines(code) if ln not in handlers]
    assert lines
    for line in lines:
        fakes = Fakes()
        pool = WarmPool(WarmPoolConfig(max_per_key=0), fakes.create, fakes.reset, fakes.remove)
        try:
            parked = FakeContainer(1)
            pool._parked[KEY] = [parked]
            got = None
            with interrupted_at(code, line):
                got = pool.take(KEY)
            if got is not None:
                assert got is parked, line
                pool.give_back(KEY, got)  # (its trajectory closed)
                settle(pool)
            else:
                assert pool._parked.get(KEY) == [parked], line
            assert pool._demand.busy[KEY] == 0, line
        finally:
            pool.close()
