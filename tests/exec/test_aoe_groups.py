"""The action cgroup (``tangram.exec.aoe.kill``) on fake cgroup trees, without Docker: the
launcher is written into it before an action, the kill freezes it while it signals every
process but the runner and reports survivors truthfully, and what an action leaves running goes
back to the container's cgroup. The real kernel's side is in ``test_aoe_environment.py``."""

from __future__ import annotations

import io
import os
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest

from tangram.exec.aoe import kill as kill_mod
from tangram.exec.aoe.cgroups import FREEZERS
from tangram.exec.aoe.judge import Facts, judge
from tangram.exec.aoe.kill import GROUP_NAME, CgroupGroup
from tangram.exec.aoe.records import KillReport
from tangram.exec.aoe.transport import RawResult

RUNNER, CHILD, GRANDCHILD = 101, 202, 303


@pytest.fixture(autouse=True)
def pidfds_by_pid(monkeypatch: pytest.MonkeyPatch) -> None:
    """The fake trees' pids are no processes: a pidfd "holds" its pid and is signalled by
    ``os.kill``, which the tests replace (the real pidfds are in the pid-reuse tests)."""
    monkeypatch.setattr(kill_mod, "_pidfd_open", lambda pid: pid)
    monkeypatch.setattr(kill_mod, "_pidfd_send_signal", lambda fd, sig: kill_mod.os.kill(fd, sig))
    monkeypatch.setattr(kill_mod, "_close_fd", lambda fd: None)


@pytest.fixture(params=[1, 2], ids=["v1", "v2"])
def group(request: pytest.FixtureRequest, tmp_path: Path) -> CgroupGroup:
    freezer = FREEZERS[request.param]
    for d in (tmp_path, tmp_path / GROUP_NAME):
        d.mkdir(exist_ok=True)
        (d / "cgroup.procs").write_text("")
        (d / freezer.file).write_text(freezer.thawed)
    # The launchers start in the container's own cgroup (docker exec puts them there).
    (tmp_path / "cgroup.procs").write_text(f"{RUNNER}\n{RUNNER + 1}\n{CHILD}\n")
    made = CgroupGroup(tmp_path, freezer)
    # A fake freezer file is its own state; v2 reports it in cgroup.events.
    if request.param == 2:
        (tmp_path / GROUP_NAME / "cgroup.events").write_text("populated 1\nfrozen 1\n")
    return made


def test_the_launcher_is_written_into_the_action_cgroup(group: CgroupGroup) -> None:
    group.enter("a1", RUNNER, launcher_stays=True)
    assert (group.dir / "cgroup.procs").read_text() == str(RUNNER)


def test_a_kill_freezes_signals_all_but_the_runner_thaws_and_counts_survivors(
    group: CgroupGroup, monkeypatch: pytest.MonkeyPatch
) -> None:
    group.enter("a1", RUNNER, launcher_stays=True)
    (group.dir / "cgroup.procs").write_text(f"{RUNNER}\n{CHILD}\n{GRANDCHILD}\n")
    killed: list[tuple[int, str]] = []
    state = group.dir / group.freezer.file
    monkeypatch.setattr(
        kill_mod.os, "kill", lambda pid, sig: killed.append((pid, state.read_text()))
    )
    monkeypatch.setattr(kill_mod, "GONE_WAIT_S", 0.01)
    report = group.kill()
    assert sorted(pid for pid, _ in killed) == [
        CHILD,
        CHILD,
        CHILD,
        GRANDCHILD,
        GRANDCHILD,
        GRANDCHILD,
    ]
    assert {frozen for _, frozen in killed} == {group.freezer.frozen}  # signalled while frozen
    assert state.read_text() == group.freezer.thawed
    # The fake processes never leave the fake file: the report says two could not be killed.
    assert report == KillReport("cgroup", 2)


def test_a_kill_whose_processes_are_gone_reports_none_left(
    group: CgroupGroup, monkeypatch: pytest.MonkeyPatch
) -> None:
    group.enter("a1", RUNNER, launcher_stays=True)
    procs = group.dir / "cgroup.procs"
    procs.write_text(f"{RUNNER}\n{CHILD}\n")
    monkeypatch.setattr(kill_mod.os, "kill", lambda pid, sig: procs.write_text(f"{RUNNER}\n"))
    assert group.kill() == KillReport("cgroup", 0)


def test_an_exec_launcher_is_the_action_and_is_killed_too(
    group: CgroupGroup, monkeypatch: pytest.MonkeyPatch
) -> None:
    group.enter("a1", CHILD, launcher_stays=False)
    procs = group.dir / "cgroup.procs"
    procs.write_text(f"{CHILD}\n")
    killed: list[int] = []
    monkeypatch.setattr(
        kill_mod.os, "kill", lambda pid, sig: (killed.append(pid), procs.write_text(""))
    )
    assert group.kill() == KillReport("cgroup", 0) and killed == [CHILD]


def _recorded_moves(group: CgroupGroup) -> list[str]:
    moved: list[str] = []
    real_move = group._move
    group._move = lambda pid, to: (moved.append(f"{pid}->{to.name}"), real_move(pid, to))  # type: ignore[method-assign]
    return moved


def test_the_runner_is_moved_in_once_and_stays(group: CgroupGroup) -> None:
    moved = _recorded_moves(group)
    for action in ("a1", "a2", "a3"):
        group.enter(action, RUNNER, launcher_stays=True)
        group.leave()
    assert moved == [f"{RUNNER}->{GROUP_NAME}"]  # one write, not two per action
    group.enter("a4", RUNNER + 1, launcher_stays=True)  # a fresh runner is moved in too
    assert moved[-1] == f"{RUNNER + 1}->{GROUP_NAME}"


def test_what_an_action_left_running_goes_back_to_the_container(group: CgroupGroup) -> None:
    group.enter("a1", RUNNER, launcher_stays=True)
    (group.dir / "cgroup.procs").write_text(f"{RUNNER}\n{CHILD}\n")
    moved = _recorded_moves(group)
    group.leave()
    assert moved == [f"{CHILD}->{group.parent.name}"]  # the runner stays
    assert (group.dir / group.freezer.file).read_text() == group.freezer.thawed


def test_close_removes_the_action_cgroup(group: CgroupGroup) -> None:
    for f in group.dir.iterdir():
        f.unlink()
    group.close()
    assert not group.dir.exists()


def _timed_out() -> RawResult:
    return RawResult(None, b"", b"", "timeout", 0, 0)


@pytest.mark.parametrize(
    "report,says",
    [
        (None, "the action's processes were killed, the container was kept"),
        (KillReport("cgroup", 0), "the action's processes were killed, the container was kept"),
        (KillReport("cgroup", 2), "killed but 2 of its processes could not be"),
        (KillReport("marker", None), "that still carried its marker"),
        (KillReport("cgroup", None), "whether all of its processes died is not known"),
    ],
)
def test_a_timeout_says_what_the_kill_did(report: KillReport | None, says: str) -> None:
    verdict = judge(_timed_out(), Facts(100, 0.5, 1.0, kill=report))
    assert verdict.status == "timeout" and says in (verdict.error or "")


def test_a_kill_whose_freezer_cannot_be_written_still_kills_and_counts(
    group: CgroupGroup, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A freezer write refused for another reason than the cgroup being gone (EBUSY, EACCES,
    here a directory in the file's place: EISDIR) raised out of the kill: no process was
    signalled, and the error came out of the transport, so the action's processes were then
    moved out of the group (``leave``) and outlived its time-out. The kill now signals them
    unfrozen and counts what is left."""
    group.enter("a1", RUNNER, launcher_stays=True)
    procs = group.dir / "cgroup.procs"
    procs.write_text(f"{RUNNER}\n{CHILD}\n")
    state = group.dir / group.freezer.file
    state.unlink()
    state.mkdir()  # open(O_WRONLY) fails with IsADirectoryError, not FileNotFoundError
    killed: list[int] = []
    monkeypatch.setattr(
        kill_mod.os, "kill", lambda pid, sig: (killed.append(pid), procs.write_text(f"{RUNNER}\n"))
    )
    assert group.kill() == KillReport("cgroup", 0)
    assert killed == [CHILD]


def test_a_kill_refused_a_signal_reports_the_survivor(
    group: CgroupGroup, monkeypatch: pytest.MonkeyPatch
) -> None:
    """``os.kill`` refused with EPERM (not ESRCH) raised out of the kill between freeze and
    thaw: the outcome was a container failure; now the survivor is counted."""
    group.enter("a1", RUNNER, launcher_stays=True)
    (group.dir / "cgroup.procs").write_text(f"{RUNNER}\n{CHILD}\n")

    def refuse(pid: int, sig: int) -> None:
        raise PermissionError(1, "Operation not permitted")

    monkeypatch.setattr(kill_mod.os, "kill", refuse)
    monkeypatch.setattr(kill_mod, "GONE_WAIT_S", 0.01)
    assert group.kill() == KillReport("cgroup", 1)
    assert (group.dir / group.freezer.file).read_text() == group.freezer.thawed


def test_a_move_back_that_is_refused_does_not_raise_out_of_leave(group: CgroupGroup) -> None:
    """``leave`` runs in the transport's ``finally`` after every action: a write to the
    container's ``cgroup.procs`` refused for another reason than the cgroup being gone
    (EBUSY, EACCES; here EISDIR) raised there, replacing the finished action's result with a
    "container failure" and closing its runner. The survivor now stays in the action group
    (the next kill takes it) and the group is thawed."""
    group.enter("a1", RUNNER, launcher_stays=True)
    (group.dir / "cgroup.procs").write_text(f"{RUNNER}\n{CHILD}\n")
    (group.parent / "cgroup.procs").unlink()
    (group.parent / "cgroup.procs").mkdir()
    group.leave()
    assert (group.dir / group.freezer.file).read_text() == group.freezer.thawed


def test_a_kill_survivor_stays_in_the_action_cgroup_after_leave(
    group: CgroupGroup, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A process the kill could not kill (stuck in the kernel, or one it may not signal) was
    moved by ``leave`` to the container's cgroup like any background process: no later
    action's kill reached it there, so it outlived its time-out until the container's
    removal. It now stays in the action cgroup, and each later ``leave`` signals it again."""
    group.enter("a1", RUNNER, launcher_stays=True)
    (group.dir / "cgroup.procs").write_text(f"{RUNNER}\n{CHILD}\n")
    signalled: list[int] = []
    monkeypatch.setattr(kill_mod.os, "kill", lambda pid, sig: signalled.append(pid))
    monkeypatch.setattr(kill_mod, "GONE_WAIT_S", 0.01)
    assert group.kill() == KillReport("cgroup", 1)
    moved = _recorded_moves(group)
    group.leave()
    assert moved == []
    signalled.clear()
    group.enter("a2", RUNNER, launcher_stays=True)
    group.leave()  # the next action ended: the survivor is still kept, and signalled again
    assert moved == [] and signalled == [CHILD]


def test_what_is_left_after_a_failed_kill_stays_in_the_action_cgroup(
    group: CgroupGroup, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A kill that raised (its cgroup unreadable) killed nobody knows what: ``leave`` moved
    everything left to the container's cgroup, out of every later kill's reach. It now
    keeps them in the action cgroup."""
    group.enter("a1", RUNNER, launcher_stays=True)
    (group.dir / "cgroup.procs").write_text(f"{RUNNER}\n{CHILD}\n")

    def unreadable() -> set[int]:
        raise kill_mod.AoeError("the cgroup could not be read")

    monkeypatch.setattr(group, "_procs", unreadable)
    with pytest.raises(kill_mod.AoeError):
        group.kill()
    monkeypatch.undo()
    monkeypatch.setattr(kill_mod.os, "kill", lambda pid, sig: None)
    moved = _recorded_moves(group)
    group.leave()
    assert moved == []


class _ThawRefused:
    """A freezer whose thaw is refused (EBUSY, EACCES) while ``refuse`` holds."""

    def __init__(self, real: Any) -> None:
        self.real, self.refuse, self.thaws = real, True, 0

    def freeze(self, directory: Path) -> None:
        self.real.freeze(directory)

    def thaw(self, directory: Path) -> None:
        self.thaws += 1
        if self.refuse:
            raise kill_mod.AoeError(f"writing to {directory} failed: Device or resource busy")
        self.real.thaw(directory)

    def is_frozen(self, directory: Path) -> bool:
        return self.real.is_frozen(directory)


def test_an_action_cgroup_left_frozen_by_a_kill_fails_the_container(
    group: CgroupGroup, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A thaw refused after a kill was logged and forgotten: the action cgroup stayed frozen,
    the runner with it, and the next action hung in it until its own time-out. The thaw is
    now retried; when it still fails the container is marked dead (the next action is
    refused, the trajectory recreates it), the outcome says so, and the group refuses
    an action until a thaw succeeds."""
    group.enter("a1", RUNNER, launcher_stays=True)
    procs = group.dir / "cgroup.procs"
    procs.write_text(f"{RUNNER}\n{CHILD}\n")
    freezer = _ThawRefused(group.freezer)
    group.freezer = freezer  # type: ignore[assignment]
    monkeypatch.setattr(kill_mod.os, "kill", lambda pid, sig: procs.write_text(f"{RUNNER}\n"))
    container = SimpleNamespace(group=group, handle=SimpleNamespace(short_id="c" * 12), dead=None)
    report = kill_mod.kill_action(container, "a1", "timeout")  # type: ignore[arg-type]
    assert freezer.thaws > 1  # retried
    assert container.dead is not None and "frozen" in container.dead
    verdict = judge(_timed_out(), Facts(100, 0.5, 1.0, kill=report))
    assert "could not be thawed" in (verdict.error or "")
    group.leave()
    with pytest.raises(kill_mod.AoeError, match="frozen"):
        group.enter("a2", RUNNER, launcher_stays=True)
    freezer.refuse = False  # a later thaw that works: the group serves again
    group.enter("a3", RUNNER, launcher_stays=True)
    assert (group.dir / freezer.real.file).read_text() == freezer.real.thawed


def test_close_thaws_an_action_cgroup_left_frozen(group: CgroupGroup) -> None:
    """An action cgroup left frozen (a thaw refused after a kill) stayed frozen at the
    container's removal: runc thaws the container's own cgroup for its kill, not this
    child, and v1's frozen processes do not die of SIGKILL, so the removal failed ("did not
    receive an exit event") and the container stayed. ``close`` now thaws it first."""
    state = group.dir / group.freezer.file
    state.write_text(group.freezer.frozen)
    group.close()
    assert state.read_text() == group.freezer.thawed


@pytest.mark.parametrize("version", [1, 2])
def test_the_thaw_before_a_retried_removal_thaws_the_action_cgroup_too(
    version: int, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """``containers.thaw`` (before a removal is retried, for a container this process did not
    park: an orphan, the watchdog's) thawed the container's cgroup only. A manager killed
    between a kill's freeze and its thaw left the action cgroup frozen, and v1's frozen
    processes do not die of SIGKILL: every removal failed and the container stayed for
    ever. The action cgroup is now thawed too."""
    from tangram.exec.aoe import cgroups, containers

    freezer = FREEZERS[version]
    cgroup = tmp_path / ("c" * 64)  # the container's cgroup (its id in the path)
    for d in (cgroup, cgroup / GROUP_NAME):
        d.mkdir(parents=True, exist_ok=True)
        (d / freezer.file).write_text(freezer.frozen)
    key = "freezer" if version == 1 else "unified"
    monkeypatch.setattr(cgroups, "find_cgroup_dirs", lambda pid, *a: (version, {key: cgroup}))
    monkeypatch.setattr(containers, "state", lambda client, cid: {"Pid": 4242})
    monkeypatch.setattr(containers, "local_pid", lambda pid, cid: pid)
    client = SimpleNamespace(api=SimpleNamespace(unpause=lambda cid: None))
    containers.thaw(client, "c" * 64)
    assert (cgroup / freezer.file).read_text() == freezer.thawed
    assert (cgroup / GROUP_NAME / freezer.file).read_text() == freezer.thawed


@pytest.mark.parametrize("version", [1, 2])
def test_the_thaw_before_a_retried_removal_never_thaws_a_cgroup_not_the_containers(
    version: int, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """``containers.thaw`` saw the container's init by its pid (``local_pid``) and then read
    that pid's cgroups again to thaw them: an init that died in between (the container being
    removed), its pid given to another process, had that process's cgroup (a host service's,
    frozen on purpose) and its child thawed. A cgroup whose path lacks the container's id is
    now left alone."""
    from tangram.exec.aoe import cgroups, containers

    freezer = FREEZERS[version]
    foreign = tmp_path / "system.slice" / "frozen-on-purpose.service"
    for d in (foreign, foreign / GROUP_NAME):
        d.mkdir(parents=True, exist_ok=True)
        (d / freezer.file).write_text(freezer.frozen)
    key = "freezer" if version == 1 else "unified"
    monkeypatch.setattr(cgroups, "find_cgroup_dirs", lambda pid, *a: (version, {key: foreign}))
    monkeypatch.setattr(containers, "state", lambda client, cid: {"Pid": 4242})
    monkeypatch.setattr(containers, "local_pid", lambda pid, cid: pid)
    client = SimpleNamespace(api=SimpleNamespace(unpause=lambda cid: None))
    containers.thaw(client, "c" * 64)
    assert (foreign / freezer.file).read_text() == freezer.frozen
    assert (foreign / GROUP_NAME / freezer.file).read_text() == freezer.frozen


def test_a_new_runner_that_reuses_the_old_ones_pid_is_moved_in(group: CgroupGroup) -> None:
    """The runner was known by its pid alone: a fresh runner (the last one died or was
    closed) that the kernel gave the old one's pid was taken for the resident one and never
    moved in, so its actions were born in the container's cgroup, where their time-out's
    kill never looked ("killed", 0 survivors, while they ran on). A runner not in the group
    is now moved in whatever its pid."""
    group.enter("a1", RUNNER, launcher_stays=True)
    group.leave()
    (group.dir / "cgroup.procs").write_text("")  # the runner died; a new one has its pid
    moved = _recorded_moves(group)
    group.enter("a2", RUNNER, launcher_stays=True)
    assert moved == [f"{RUNNER}->{GROUP_NAME}"]


def test_a_later_kill_is_not_blamed_for_an_earlier_actions_survivor(
    group: CgroupGroup, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A process an earlier kill could not kill, kept in the action cgroup, is signalled
    again by every later kill, but is not that action's: counted as its survivor, each later
    time-out in the container said its own processes could not be killed (and waited all its
    rounds for it). A later kill now counts only what it found new."""
    procs = group.dir / "cgroup.procs"
    group.enter("a1", RUNNER, launcher_stays=True)
    procs.write_text(f"{RUNNER}\n{CHILD}\n")
    monkeypatch.setattr(kill_mod, "GONE_WAIT_S", 0.01)
    monkeypatch.setattr(kill_mod.os, "kill", lambda pid, sig: None)
    assert group.kill() == KillReport("cgroup", 1)  # CHILD is stuck for good
    group.leave()
    group.enter("a2", RUNNER, launcher_stays=True)
    procs.write_text(f"{RUNNER}\n{CHILD}\n{GRANDCHILD}\n")
    signalled: list[int] = []

    def dies_unless_stuck(pid: int, sig: int) -> None:
        signalled.append(pid)
        if pid == GRANDCHILD:
            procs.write_text(f"{RUNNER}\n{CHILD}\n")

    monkeypatch.setattr(kill_mod.os, "kill", dies_unless_stuck)
    assert group.kill() == KillReport("cgroup", 0)
    assert CHILD in signalled  # still signalled, still kept
    moved = _recorded_moves(group)
    group.leave()
    assert moved == []


@pytest.mark.parametrize("stays", [True, False], ids=["runner", "exec launcher"])
def test_a_launcher_pid_that_is_not_the_containers_is_never_moved_in(
    group: CgroupGroup, stays: bool
) -> None:
    """The launcher's pid (the engine's word, read before its line is sent) was written into
    the action cgroup unchecked: a launcher that had died meanwhile (an earlier action's
    background process may signal it: same uid) could have its pid reused by another
    container's or the host's process, which was then moved into this container's cgroup,
    frozen with it at its park and killed at its time-out. Only a process of the container
    is moved in; another pid fails the action before anything is sent."""
    (group.parent / "cgroup.procs").write_text(f"{CHILD}\n")
    moved = _recorded_moves(group)
    with pytest.raises(kill_mod.AoeError, match="not the container's"):
        group.enter("a1", RUNNER, launcher_stays=stays)
    assert moved == []


def test_the_marker_kill_never_signals_a_process_that_took_a_dead_ones_pid(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The marker fallback read a pid's environment, then SIGKILLed the pid: an action's
    process that ended between the two, its pid given at once to another process (another
    container's, the host's), had that process killed. The process is now held by a pidfd
    before its environment is read, and the signal goes through the pidfd (never to a
    newcomer)."""
    import subprocess

    from tangram.exec.aoe import kill

    if not Path("/proc/sys/kernel/ns_last_pid").exists() or os.geteuid() != 0:
        pytest.skip("needs root and ns_last_pid to hand a pid on")
    action = subprocess.Popen(["sleep", "60"], env={kill.ACTION_ENV: "a1", "PATH": "/bin:/usr/bin"})
    newcomer: list[subprocess.Popen[bytes]] = []
    real_open = open

    def open_then_hand_on(path: Any, *args: Any, **kwargs: Any) -> Any:
        if path != f"/proc/{action.pid}/environ":
            return real_open(path, *args, **kwargs)
        with real_open(path, *args, **kwargs) as f:
            data = f.read()
        action.kill()  # the action's process ends here, after its environment was read
        action.wait()
        for _ in range(50):  # its pid to a newcomer (bounded: other forks may take it first)
            Path("/proc/sys/kernel/ns_last_pid").write_text(str(action.pid - 1))
            other = subprocess.Popen(["sleep", "60"])
            if other.pid == action.pid:
                newcomer.append(other)
                break
            other.kill()
            other.wait()
        return io.BytesIO(data)

    monkeypatch.setattr(kill, "open", open_then_hand_on, raising=False)
    try:
        kill._kill_visible([action.pid], f"{kill.ACTION_ENV}=a1".encode())
        if not newcomer:
            pytest.skip("the pid was taken by another fork every time")
        with pytest.raises(subprocess.TimeoutExpired):  # (a SIGKILL ends it at once)
            newcomer[0].wait(timeout=2)
    finally:
        for p in (action, *newcomer):
            p.kill()
            p.wait()


def _hand_pid_on(gone: Any) -> Any:
    """End process ``gone`` and start a newcomer with its pid (None when another fork took
    it every time)."""
    import subprocess

    gone.kill()
    gone.wait()
    for _ in range(50):  # bounded: other forks may take the pid first
        Path("/proc/sys/kernel/ns_last_pid").write_text(str(gone.pid - 1))
        other = subprocess.Popen(["sleep", "60"])
        if other.pid == gone.pid:
            return other
        other.kill()
        other.wait()
    return None


@pytest.mark.parametrize("when", ["kill", "leave"])
def test_the_action_cgroup_never_signals_a_process_that_took_a_listed_ones_pid(
    group: CgroupGroup, monkeypatch: pytest.MonkeyPatch, when: str
) -> None:
    """The action cgroup's kill (each round) and ``leave`` (what an earlier kill left) read
    the group's processes and then SIGKILLed each by pid: one that ended between the two (a
    kept survivor dying at last, a process killed in a round before), its pid given at once
    to another process (another container's, the host's), had that process killed. Each is
    now held by a pidfd, seen still in the group after the open, and signalled through it."""
    import subprocess

    if not Path("/proc/sys/kernel/ns_last_pid").exists() or os.geteuid() != 0:
        pytest.skip("needs root and ns_last_pid to hand a pid on")
    monkeypatch.setattr(kill_mod, "_pidfd_open", os.pidfd_open)
    monkeypatch.setattr(kill_mod, "_pidfd_send_signal", kill_mod.signal.pidfd_send_signal)
    monkeypatch.setattr(kill_mod, "_close_fd", os.close)
    monkeypatch.setattr(kill_mod, "GONE_WAIT_S", 0.01)
    procs = group.dir / "cgroup.procs"
    group.enter("a1", RUNNER, launcher_stays=True)
    action = subprocess.Popen(["sleep", "60"])
    newcomer: list[Any] = []
    if when == "leave":  # an earlier kill could not kill it: kept in the group
        group._kept.add(action.pid)
    procs.write_text(f"{RUNNER}\n{action.pid}\n")
    real_procs = group._procs

    def listed_then_handed_on() -> set[int]:
        listed = real_procs()
        if not newcomer and action.pid in listed:
            procs.write_text(f"{RUNNER}\n")  # it ended right after it was listed
            other = _hand_pid_on(action)
            if other is not None:
                newcomer.append(other)
        return listed

    monkeypatch.setattr(group, "_procs", listed_then_handed_on)
    try:
        if when == "kill":
            group.kill()
        else:
            group.leave()
        if not newcomer:
            pytest.skip("the pid was taken by another fork every time")
        with pytest.raises(subprocess.TimeoutExpired):  # (a SIGKILL ends it at once)
            newcomer[0].wait(timeout=2)
    finally:
        for p in (action, *newcomer):
            p.kill()
            p.wait()


@pytest.mark.parametrize("version", [1, 2])
def test_the_action_cgroup_is_never_made_in_a_cgroup_not_the_containers(
    version: int, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """``action_group`` found the container's cgroup from its init's pid, seen the
    container's a moment before (``local_pid``): an init that died in between, its pid
    given to another process, had the action cgroup made in that process's cgroup (a host
    service's). A cgroup whose path lacks the container's id is now refused (the marker
    fallback, logged)."""
    from tangram.exec.aoe import cgroups

    freezer = FREEZERS[version]
    foreign = tmp_path / "system.slice" / "host.service"
    foreign.mkdir(parents=True)
    (foreign / freezer.file).write_text(freezer.thawed)
    key = "freezer" if version == 1 else "unified"
    found = lambda pid, *a: (version, {key: foreign})  # noqa: E731
    monkeypatch.setattr(cgroups, "find_cgroup_dirs", found)
    monkeypatch.setattr(kill_mod, "find_cgroup_dirs", found, raising=False)
    made = kill_mod.action_group(None, "c" * 64, 4242, "1000:1000", lambda: None)
    assert not isinstance(made, CgroupGroup)
    assert not (foreign / GROUP_NAME).exists()


class _SlowFreezer:
    """A freezer whose freezing completes only at the third look (processes still running
    meanwhile, as a real one's take a moment)."""

    def __init__(self, real: Any) -> None:
        self.real, self.looks = real, 0

    def freeze(self, directory: Path) -> None:
        self.looks = 0
        self.real.freeze(directory)

    def thaw(self, directory: Path) -> None:
        self.real.thaw(directory)

    def is_frozen(self, directory: Path) -> bool:
        self.looks += 1
        return self.looks >= 3


def test_what_an_action_left_is_read_for_its_move_only_once_the_group_is_frozen(
    group: CgroupGroup,
) -> None:
    """``leave`` moved what an action left back to the container's cgroup by pid, read right
    after the freeze was asked for, while its processes still ran: one that exited after the
    read, its pid given to another process (the container's init, which is not frozen,
    reaps it), had that process (a host's) moved into the container's cgroup, frozen at its
    park. The group is now seen frozen before it is read, as the kill does."""
    group.enter("a1", RUNNER, launcher_stays=True)
    (group.dir / "cgroup.procs").write_text(f"{RUNNER}\n{CHILD}\n")
    freezer = _SlowFreezer(group.freezer)
    group.freezer = freezer  # type: ignore[assignment]
    seen: list[int] = []
    real_procs = group._procs

    def procs() -> set[int]:
        seen.append(freezer.looks)
        return real_procs()

    group._procs = procs  # type: ignore[method-assign]
    moved = _recorded_moves(group)
    group.leave()
    assert moved == [f"{CHILD}->{group.parent.name}"]
    assert seen[-1] >= 3, seen  # the listing the moves went by came once it was frozen


def test_the_marker_kill_signals_every_process_when_one_refuses(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The marker fallback stops every process of the action, then kills them: a signal one
    of them refused (EPERM) raised out of the kill, leaving those stopped before it stopped
    for good and the rest unsignalled. Each is now tried, the refusal logged."""
    import signal
    import subprocess

    from tangram.exec.aoe import kill

    env = {kill.ACTION_ENV: "a1", "PATH": "/bin:/usr/bin"}
    procs = [subprocess.Popen(["sleep", "60"], env=env) for _ in range(2)]
    real = signal.pidfd_send_signal
    refused: list[int] = []

    def refuse_the_first(fd: int, sig: int, *args: Any) -> None:
        if not refused:
            refused.append(fd)
        if fd == refused[0]:
            raise PermissionError(1, "Operation not permitted")
        real(fd, sig, *args)

    monkeypatch.setattr(kill.signal, "pidfd_send_signal", refuse_the_first)
    try:
        kill._kill_visible([p.pid for p in procs], f"{kill.ACTION_ENV}=a1".encode())
        codes = [p.wait(timeout=10) if i else None for i, p in enumerate(procs)]
        assert codes[1] == -signal.SIGKILL
    finally:
        for p in procs:
            p.kill()
            p.wait()


def test_a_marker_kill_interrupted_before_its_revocation_revokes_on_the_next_kill(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The marker fallback's kill took its action's revocation for done before it was: an
    interrupt (a KeyboardInterrupt) inside the revocation's engine call, the transport's
    abort then killing again, skipped it there, and a launcher that had not read the action
    started it after the caller was told it was interrupted."""
    from unittest import mock

    from tangram.exec.aoe import kill

    calls: list[list[str]] = []

    def run_inside(client: Any, cid: str, user: str, command: list[str]) -> None:
        calls.append(command)
        if len(calls) == 1:
            raise KeyboardInterrupt

    monkeypatch.setattr(kill, "_run_inside", run_inside)
    group = kill.MarkerGroup(mock.MagicMock(), "c" * 64, "1000:1000", lambda: [])
    group.enter("a1", None, launcher_stays=True)
    with pytest.raises(KeyboardInterrupt):
        group.kill()
    group.kill()  # the abort's kill
    path = kill.TICKET_PREFIX + group.ticket
    assert calls == [["mkdir", path], ["mkdir", path]]
