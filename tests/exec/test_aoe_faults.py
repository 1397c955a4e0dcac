"""Faults give the action a clear error, never a hang, and free its cores: a container that
dies mid-action, a command that does not exist, a time-out, too much output, out of memory."""

from __future__ import annotations

import base64
import contextlib
import shlex
import threading
import time
from typing import Any

import pytest

from tangram.exec.aoe import AoeError, GrantError, UnknownTrajectory

pytestmark = pytest.mark.docker


def test_container_dying_mid_action_errors_frees_cores_and_can_be_recreated(
    any_manager: Any, trajectory: Any, docker_client: Any
) -> None:
    mgr = any_manager
    traj = trajectory(mgr)
    first = mgr.handle(traj)
    box: dict[str, Any] = {}
    worker = threading.Thread(
        target=lambda: box.setdefault("out", mgr.run_action(traj, "sleep 60", (0,), timeout_s=60))
    )
    t0 = time.monotonic()
    worker.start()
    time.sleep(0.5)
    docker_client.api.kill(first.container_id)
    worker.join(15)
    assert not worker.is_alive(), "the action hung after its container died"
    out = box["out"]
    assert time.monotonic() - t0 < 10
    assert out.status == "error" and "died" in out.error, out
    assert mgr.free_cores() == mgr.topology.cores
    again = mgr.run_action(traj, "echo hi", (0,))
    assert again.status == "error" and "recreate" in again.error
    fresh = mgr.recreate(traj)
    assert fresh.generation == 2 and fresh.container_id != first.container_id
    ok = mgr.run_action(traj, "echo back", (0,))
    assert ok.ok and ok.text == "back\n"


def test_missing_command_is_a_clear_error(any_manager: Any, trajectory: Any) -> None:
    traj = trajectory(any_manager)
    for command in ("no-such-tool --flag", ["no-such-tool", "--flag"]):
        out = any_manager.run_action(traj, command, 1)
        assert out.status == "error" and out.exit_code == 127
        assert "command not found" in out.error and "no-such-tool" in out.error


def test_timeout_kills_the_action_but_keeps_the_container(
    any_manager: Any, trajectory: Any
) -> None:
    traj = trajectory(any_manager)
    keep = any_manager.run_action(traj, "sleep 600 >/dev/null 2>&1 & echo $! > /work/keeper", 1)
    assert keep.ok
    t0 = time.monotonic()
    out = any_manager.run_action(
        traj,
        "echo started; echo mark > /work/mark; sleep 31 & sleep 32; echo never",
        1,
        timeout_s=0.7,
    )
    took = time.monotonic() - t0
    assert out.status == "timeout" and "timed out after 0.7 s" in out.error
    # Killed at the time-out, not when the command would have ended (32 s); the slack is for
    # a loaded machine (docker exec and the kill take longer there).
    assert out.text == "started\n" and 0.7 <= took < 20
    after = any_manager.run_action(
        traj,
        "cat /work/mark; ps -o args | grep '^sleep 3[12]' || echo no-sleepers; "
        "kill -0 $(cat /work/keeper) && echo keeper-alive",
        1,
    )
    assert after.ok, after
    assert after.text.split() == ["mark", "no-sleepers", "keeper-alive"]
    assert any_manager.free_cores() == any_manager.topology.cores


@pytest.mark.parametrize("stream", ["stdout", "stderr"])
def test_oversize_output_is_cut_and_the_action_killed(
    any_manager: Any, trajectory: Any, stream: str
) -> None:
    traj = trajectory(any_manager)
    redirect = "" if stream == "stdout" else " >&2"
    t0 = time.monotonic()
    out = any_manager.run_action(traj, f"yes{redirect}", 1, max_output_bytes=4096, timeout_s=60)
    assert time.monotonic() - t0 < 30, "killed for its output, not at the time-out"
    assert out.status == "error" and "output too large" in out.error and stream in out.error
    assert len(getattr(out, stream)) == 4096 and getattr(out, stream).startswith(b"y\ny\n")
    fine = any_manager.run_action(traj, "printf 1234", 1, max_output_bytes=4)
    assert fine.ok and fine.stdout == b"1234"


def test_non_zero_exit_and_stderr_are_reported(manager: Any, trajectory: Any) -> None:
    traj = trajectory(manager)
    out = manager.run_action(traj, "echo partial; echo 'bad input' >&2; exit 3", 1)
    assert out.status == "error" and out.exit_code == 3
    assert out.error == "exit code 3: bad input" and out.stdout == b"partial\n"


def test_out_of_memory_is_named(manager: Any, trajectory: Any) -> None:
    traj = trajectory(manager, memory_gb=0.0625)
    out = manager.run_action(traj, "dd if=/dev/zero of=/dev/null bs=256M count=1", 1, timeout_s=30)
    assert out.status == "error" and out.exit_code == 137
    assert "out-of-memory" in out.error
    assert manager.run_action(traj, "echo alive", 1).ok  # the container itself survived


def test_bad_requests_raise_naming_the_problem(manager: Any, trajectory: Any) -> None:
    traj = trajectory(manager)
    with pytest.raises(UnknownTrajectory, match="no-such-trajectory"):
        manager.run_action("no-such-trajectory", "true", 1)
    with pytest.raises(GrantError, match="not on this node"):
        manager.run_action(traj, "true", (999,))
    with pytest.raises(AoeError, match="quota_cores must be in"):
        manager.run_action(traj, "true", (0,), quota_cores=2)
    with pytest.raises(AoeError, match="already has a container"):
        manager.open_trajectory(traj)
    with pytest.raises(AoeError, match="not in the local Docker engine"):
        manager.open_trajectory("img", image="tangram-no-such-image")
    assert manager.free_cores() == manager.topology.cores


def test_an_action_that_kills_its_runner_does_not_outlive_its_time_out(
    manager: Any, trajectory: Any
) -> None:
    """The runner has the actions' uid, so an action can SIGKILL it: its processes were then
    moved out of the action cgroup, alive, past their time-out (stop 27's security hunt)."""
    traj = trajectory(manager)
    escape = (
        "exec >&- 2>&- <&-; kill -9 $PPID; "
        "i=0; while [ $i -lt 60 ]; do sleep 0.25; i=$((i+1)); done"
    )
    out = manager.run_action(traj, escape, 1, timeout_s=2.0)
    assert out.status == "error", out
    left = manager.run_action(traj, "ps -o args | grep -c '[s]leep 0.25'", 1, timeout_s=10)
    assert left.text == "0\n", left


def test_an_exec_launcher_takes_no_action_line_from_an_earlier_actions_process(
    docker_client: Any,
) -> None:
    """With the exec transport, a process an earlier action left wrote a forged action line
    into the next launcher's stdin (/proc/PID/fd/0: the image's /bin/sh had the actions' uid)
    and the grader's exit 1 came back as exit 0 (4 times in 4 before stop 27). The launcher
    is the exec-only busybox now; the planted writer gives up after 20 s."""
    from tangram.exec.aoe import AoeConfig, AoeManager

    forged = base64.b64encode(b"echo 'grader: 10/10 passed'; exit 0").decode()
    daemon = (
        "X=$(sh -c 'echo $$'); : > /tmp/ready; p=$((X+1)); "
        "while [ ! -e /proc/$p/fd/0 ]; do :; done; "
        f"printf '%s\\n' 'forged {forged}' > /proc/$p/fd/0"
    )
    plant = (
        f"setsid timeout 20 sh -c {shlex.quote(daemon)} >/dev/null 2>&1 </dev/null & "
        "while [ ! -e /tmp/ready ]; do :; done; echo planted"
    )
    with AoeManager(AoeConfig(transport="exec", kill_grace_s=3.0), client=docker_client) as m:
        m.open_trajectory("forge", memory_gb=0.25)
        try:
            assert m.run_action("forge", plant, 1, timeout_s=20).text == "planted\n"
            out = m.run_action("forge", "echo 'grader: 3/10 passed'; exit 1", 1, timeout_s=20)
            assert (out.exit_code, out.text) == (1, "grader: 3/10 passed\n"), out
        finally:
            m.close_trajectory("forge")


def test_a_recreate_whose_new_container_was_left_behind_does_not_stop_later_recreates(
    manager: Any, trajectory: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A recreate whose new container failed to start, and whose removal failed too, left it
    in the engine under the next generation's name; every later recreate asked for that same
    name and was refused 'already taken': the trajectory could never run again. Each recreate
    now tries a generation of its own."""
    from tangram.exec.aoe import lifecycle

    traj = trajectory(manager)
    real_create = lifecycle.containers.create
    left: list[str] = []

    def create_then_fail(client: Any, spec: Any) -> Any:
        made = real_create(client, spec)  # in the engine under the name, as a leftover is
        left.append(made.id)
        raise AoeError(f"could not start container {spec.name}: (the test's failure)")

    monkeypatch.setattr(lifecycle.containers, "create", create_then_fail)
    with pytest.raises(AoeError, match="the test's failure"):
        manager.recreate(traj)
    monkeypatch.setattr(lifecycle.containers, "create", real_create)
    try:
        fresh = manager.recreate(traj)
        assert fresh.container_id not in left
        out = manager.run_action(traj, "echo back", (0,))
        assert out.ok and out.text == "back\n"
    finally:
        for cid in left:
            lifecycle.containers.remove(manager.client, cid)


def test_a_trajectory_whose_close_could_not_remove_its_container_can_be_opened_again(
    manager: Any, trajectory: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A close whose removal the engine refused left the container under the trajectory's
    first-generation name; every later open of that id asked for the same name and was
    refused 'already taken' (by this very manager's leftover) until the manager's shutdown.
    A reopen now takes a generation past the one left behind."""
    from tangram.exec.aoe import lifecycle

    traj = trajectory(manager)
    first = manager.handle(traj)
    real_remove = lifecycle.containers.remove

    def refuse(client: Any, container_id: str) -> bool:
        raise AoeError(f"could not remove container {container_id[:12]}: (the test's refusal)")

    monkeypatch.setattr(lifecycle.containers, "remove", refuse)
    with pytest.raises(AoeError, match="the test's refusal"):
        manager.close_trajectory(traj)
    monkeypatch.setattr(lifecycle.containers, "remove", real_remove)
    try:
        again = manager.open_trajectory(traj)
        assert again.container_id != first.container_id
        out = manager.run_action(traj, "echo back", (0,))
        assert out.ok and out.text == "back\n"
        manager.close_trajectory(traj)
    finally:
        real_remove(manager.client, first.container_id)


def test_a_trajectory_whose_open_left_its_container_behind_can_be_opened_again(
    manager: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    """An open whose new container failed its warm-up, and whose removal failed too, left it
    in the engine under the trajectory's first-generation name: every later open of that id
    was refused 'already taken' by this manager's own leftover until its shutdown. A reopen
    now takes a generation past the failed open's."""
    from tangram.exec.aoe import lifecycle

    traj = "open-left-behind"
    real_remove = lifecycle.containers.remove
    real_warm_up = lifecycle.warm_up
    left: list[str] = []

    def fail_warm_up(transport: Any, name: str) -> None:
        left.append(transport.container_id)
        raise AoeError(f"the runner shell of {name} did not start (the test's failure)")

    def refuse(client: Any, container_id: str) -> bool:
        raise AoeError(f"could not remove container {container_id[:12]}: (the test's refusal)")

    monkeypatch.setattr(lifecycle, "warm_up", fail_warm_up)
    monkeypatch.setattr(lifecycle.containers, "remove", refuse)
    with pytest.raises(AoeError, match="the test's failure"):
        manager.open_trajectory(traj)
    monkeypatch.setattr(lifecycle, "warm_up", real_warm_up)
    monkeypatch.setattr(lifecycle.containers, "remove", real_remove)
    try:
        again = manager.open_trajectory(traj)
        assert again.container_id not in left
        out = manager.run_action(traj, "echo back", (0,))
        assert out.ok and out.text == "back\n"
        manager.close_trajectory(traj)
    finally:
        for cid in left:
            real_remove(manager.client, cid)


def _assert_old_never_ran(manager: Any, traj: str, wait_s: int) -> None:
    """After ``wait_s`` seconds (longer than the old action takes to reach its write, had it
    run), an action of ``traj`` finds no /work/old-ran: the old action never wrote it."""
    sleep = f"sleep {wait_s}; " if wait_s else ""
    later = manager.run_action(
        traj, f"{sleep}test -e /work/old-ran && echo ran || echo killed", 1, timeout_s=30
    )
    assert later.ok and later.stdout == b"killed\n", later


def test_an_action_interrupted_mid_run_is_killed_and_leaves_the_next_alone(
    any_manager: Any, trajectory: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    """An interrupt (a KeyboardInterrupt: a notebook's, a CLI's) while the transport read an
    action's output left the action running: moved out of the action cgroup by ``leave``,
    it went on past its time-out where no later kill took it, and the runner, still busy
    with it, gave its output and end marker to the next action as that one's stdout. The
    action is now killed on the way out, and the runner replaced."""
    from tangram.exec.aoe import transport

    traj = trajectory(any_manager)
    real = transport.collect

    def interrupted(*args: Any, **kwargs: Any) -> str:
        time.sleep(1.0)  # the action has started (a runner starts it within milliseconds)
        raise KeyboardInterrupt

    monkeypatch.setattr(transport, "collect", interrupted)
    with pytest.raises(KeyboardInterrupt):
        any_manager.run_action(traj, "sleep 3; echo old > /work/old-ran; echo old", 1)
    monkeypatch.setattr(transport, "collect", real)
    assert any_manager.free_cores() == any_manager.topology.cores
    out = any_manager.run_action(traj, "echo new", 1, timeout_s=30)
    assert out.ok and out.stdout == b"new\n", out
    _assert_old_never_ran(any_manager, traj, wait_s=4)


@pytest.mark.parametrize("image", ["Bad Name", "x:y:z", "UPPER", "../etc"])
def test_an_image_name_the_engine_cannot_read_is_refused_naming_it(
    manager: Any, image: str
) -> None:
    """An image name the engine cannot parse (its 400 "no such image" for a space, two
    tags, upper case) raised the SDK's bare APIError out of open_trajectory, and one
    reaching another engine path ('..': a 404 "page not found") a bare NotFound: neither
    the AoeError (or ImageMissing) AOE's callers expect. Each is now one, naming the image."""
    before = set(manager.trajectories())
    with pytest.raises(AoeError, match="image"):
        manager.open_trajectory("bad-image", image=image)
    assert set(manager.trajectories()) == before


def test_a_container_that_dies_right_after_its_start_check_is_an_aoe_error(
    any_manager: Any, monkeypatch: pytest.MonkeyPatch, docker_client: Any
) -> None:
    """A container that exited just after ``create`` saw it running (here: a work dir over
    /bin, so its init cannot exec ``sleep``; the check is skipped to land in that window)
    made the open raise the engine's bare APIError ('409 Conflict ... is not running') from
    the runner's exec, naming neither the container's fate nor why. It is an ``AoeError``
    saying the container exited, with its log, and nothing is left behind."""
    from tangram.exec.aoe import SandboxConfig, containers

    monkeypatch.setattr(containers, "_check_running", lambda container, name: None)
    dies = SandboxConfig()
    # (past the check, which now refuses a work dir over a system directory: only the
    # container's death at once is wanted here)
    object.__setattr__(dies, "work_dir", "/bin")
    with pytest.raises(AoeError, match="exited") as caught:
        any_manager.open_trajectory("dies-at-once", sandbox=dies)
    assert "sleep" in str(caught.value), caught.value
    assert "dies-at-once" not in any_manager.trajectories()
    left = docker_client.api.containers(
        all=True, filters={"label": f"tangram.aoe.session={any_manager.session}"}
    )
    assert not [c for c in left if "dies-at-once" in c["Names"][0]], left


def test_a_topology_with_a_core_the_engine_lacks_is_named_at_the_open(
    docker_client: Any,
) -> None:
    """``AoeConfig.topology`` naming a core the engine's machine lacks started a manager
    whose every open failed with the engine's 400 ('Requested CPUs are not available'),
    naming no setting. The open's ``AoeError`` now names ``AoeConfig.topology``."""
    from tangram.exec.aoe import AoeConfig, AoeManager
    from tangram.exec.aoe.topology import NumaTopology

    topology = NumaTopology(((0, 4095),))
    with AoeManager(AoeConfig(reaper=False, topology=topology), client=docker_client) as mgr:
        with pytest.raises(AoeError, match=r"AoeConfig.topology .*4095.*not available"):
            mgr.open_trajectory("no-such-core")
        assert mgr.trajectories() == ()


def _use_marker_kill(monkeypatch: pytest.MonkeyPatch, how: str) -> None:
    """Containers opened from now on get the marker fallback (``kill.MarkerGroup``), as
    without cgroup access: with the container's processes seen from here (``seen``, a local
    engine), or killed from inside (``inside``, a remote engine)."""
    from tangram.exec.aoe import kill, lifecycle

    def marker_group(client: Any, cid: str, init_pid: Any, user: str, pids: Any) -> Any:
        seen = pids if how == "seen" else (lambda: None)
        return kill.action_group(client, cid, None, user, seen)

    monkeypatch.setattr(lifecycle, "action_group", marker_group)


@pytest.fixture(params=["seen", "inside"])
def marker_kill(request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch) -> str:
    """The marker fallback (``_use_marker_kill``), seen from here or killed from inside."""
    _use_marker_kill(monkeypatch, request.param)
    return str(request.param)


@pytest.fixture(params=["cgroup", "seen", "inside"])
def kill_path(request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch) -> str:
    """How an action is killed: by its cgroup (``cgroup``, the default), or by the marker
    fallback without cgroup access (``seen``/``inside``, as ``marker_kill``). The tests a
    kill must keep an unstarted action from running take each path."""
    if request.param != "cgroup":
        _use_marker_kill(monkeypatch, request.param)
    return str(request.param)


def test_without_cgroup_access_a_time_out_kills_the_actions_shell_with_its_command(
    any_manager: Any, trajectory: Any, marker_kill: str
) -> None:
    """The marker fallback killed the action's processes one by one, in the order it found
    them (from inside: /proc/1012 sorts before /proc/25): the command died first, and its
    shell, not yet signalled, went on with the rest of its script (here a write) before
    the kill reached it. All are now stopped before any is killed."""
    traj = trajectory(any_manager)
    # Its shell's pid stays under 100 (a fresh container), its ``sleep``'s passes 1000.
    script = (
        "i=0; while [ $i -lt 1000 ]; do /bin/true; i=$((i + 1)); done; "
        "sleep 30; echo old > /work/old-ran"
    )
    out = any_manager.run_action(traj, script, 1, timeout_s=8)
    assert out.status == "timeout", out
    _assert_old_never_ran(any_manager, traj, wait_s=2)


def _held_runner(manager: Any, traj: str, kill_path: str) -> int:
    """A pidfd on the runner of ``traj``: its own pid under the cgroup kill, the engine's
    under the marker fallback (which keeps none)."""
    import os

    from tangram.exec.aoe import kill, transport

    container = manager._container(traj)
    runner = container.transport
    if kill_path == "cgroup":
        assert isinstance(runner, transport.RunnerTransport) and runner.pid is not None
        return os.pidfd_open(runner.pid)
    assert isinstance(container.group, kill.MarkerGroup), container.group
    assert isinstance(runner, transport.RunnerTransport) and runner.exec_id is not None
    return os.pidfd_open(int(manager.client.api.exec_inspect(runner.exec_id)["Pid"]))


def test_an_action_interrupted_before_the_runner_read_it_never_runs(
    manager: Any, trajectory: Any, monkeypatch: pytest.MonkeyPatch, kill_path: str
) -> None:
    """The runner transport, each kill path: an interrupt landing before the runner had
    started the action it was sent (the runner held here by SIGSTOP, as a loaded machine
    holds it) had the kill find nothing of the action and spare the runner, which started
    it afterwards (once continued), after the caller was told it was interrupted. The
    cgroup kill now kills the runner with the action's group, before it reads the line;
    the marker fallback (no process carried the action's marker, and the runner cannot be
    told from the container's processes) revokes the action's ticket first, and the
    action's shell checks it before its command runs."""
    import os
    import signal

    from tangram.exec.aoe import transport

    traj = trajectory(manager)
    assert manager.run_action(traj, "true", 1).ok  # the runner is up
    held = _held_runner(manager, traj, kill_path)
    real_send, real_collect = transport.send, transport.collect

    def stopped_then_sent(*args: Any, **kwargs: Any) -> None:
        signal.pidfd_send_signal(held, signal.SIGSTOP)
        real_send(*args, **kwargs)

    def interrupted(*args: Any, **kwargs: Any) -> str:
        raise KeyboardInterrupt

    monkeypatch.setattr(transport, "send", stopped_then_sent)
    monkeypatch.setattr(transport, "collect", interrupted)
    try:
        with pytest.raises(KeyboardInterrupt):
            manager.run_action(traj, "echo old > /work/old-ran", 1)
    finally:
        with contextlib.suppress(ProcessLookupError):
            signal.pidfd_send_signal(held, signal.SIGCONT)
        os.close(held)
    monkeypatch.setattr(transport, "send", real_send)
    monkeypatch.setattr(transport, "collect", real_collect)
    assert manager.free_cores() == manager.topology.cores
    _assert_old_never_ran(manager, traj, wait_s=2)
    if kill_path != "cgroup":  # (the runner lives on: it still takes actions)
        again = manager.run_action(traj, "echo fine", 1, timeout_s=30)
        assert again.ok and again.stdout == b"fine\n", again


def test_an_action_the_runner_had_not_read_by_its_time_out_never_runs(
    manager: Any, trajectory: Any, monkeypatch: pytest.MonkeyPatch, kill_path: str
) -> None:
    """The runner transport, each kill path: a runner held (here by SIGSTOP, on a loaded
    machine by the scheduler) until past the action's time-out had the kill find nothing of
    the action and spare the runner; once the runner went on it read the action and
    started it, after its outcome was given. The cgroup kill now kills the runner with
    what is left when no end came; the marker fallback revokes the action's ticket, and the
    runner finds it gone."""
    import os
    import signal

    from tangram.exec.aoe import transport

    traj = trajectory(manager)
    assert manager.run_action(traj, "true", 1).ok  # the runner is up
    held = _held_runner(manager, traj, kill_path)
    real_send = transport.send

    def stopped_then_sent(*args: Any, **kwargs: Any) -> None:
        signal.pidfd_send_signal(held, signal.SIGSTOP)
        real_send(*args, **kwargs)

    monkeypatch.setattr(transport, "send", stopped_then_sent)
    try:
        out = manager.run_action(traj, "echo old > /work/old-ran", 1, timeout_s=0.5)
    finally:
        with contextlib.suppress(ProcessLookupError):
            signal.pidfd_send_signal(held, signal.SIGCONT)
        os.close(held)
    monkeypatch.setattr(transport, "send", real_send)
    if kill_path == "cgroup":
        # A time-out now (the kill found nothing of the action in the group and took the
        # runner with it); "stopped answering" when no end came within the grace.
        assert out.status == "timeout" or "stopped answering" in (out.error or ""), out
    else:
        assert out.status in ("error", "timeout") and not out.ok, out
    _assert_old_never_ran(manager, traj, wait_s=2)
    if kill_path != "cgroup":
        again = manager.run_action(traj, "echo fine", 1, timeout_s=30)
        assert again.ok and again.stdout == b"fine\n", again


def test_an_action_interrupted_right_after_its_send_never_runs(
    any_manager: Any, trajectory: Any, monkeypatch: pytest.MonkeyPatch, kill_path: str
) -> None:
    """Both transports, each kill path: an interrupt (a KeyboardInterrupt) landing once the
    action was sent, before its output was read: the exec transport killed nothing (its
    launcher read the line and ran the action, moved out of the group by ``leave``), the
    runner transport neither (the runner, spared, read it and started it), and under the
    marker fallback the launcher carried no marker; the caller had been told it was
    interrupted. The launcher is now killed with the action (the runner frozen with it:
    either the action never started, or it is in the group, killed there)."""
    from tangram.exec.aoe import transport

    traj = trajectory(any_manager)
    real = transport.send

    def sent_then_interrupted(*args: Any, **kwargs: Any) -> None:
        real(*args, **kwargs)
        raise KeyboardInterrupt

    monkeypatch.setattr(transport, "send", sent_then_interrupted)
    with pytest.raises(KeyboardInterrupt):
        any_manager.run_action(traj, "sleep 2; echo old > /work/old-ran", 1)
    monkeypatch.setattr(transport, "send", real)
    assert any_manager.free_cores() == any_manager.topology.cores
    _assert_old_never_ran(any_manager, traj, wait_s=4)


def test_without_cgroup_access_a_time_out_leaves_no_ticket_behind(
    any_manager: Any, trajectory: Any, marker_kill: str
) -> None:
    """The marker fallback's kill revokes the action's ticket: an action that had taken it
    already (it ran, and was killed) never comes back for the revocation, which is removed
    once the action's end is seen; nothing of the tickets is left for later actions."""
    traj = trajectory(any_manager)
    out = any_manager.run_action(traj, "sleep 30", 1, timeout_s=1)
    assert out.status == "timeout", out
    later = any_manager.run_action(traj, "ls -A /tmp", 1, timeout_s=30)
    assert later.ok and later.stdout == b"", later


def test_without_cgroup_access_an_action_that_kills_its_runner_leaves_no_ticket_behind(
    manager: Any, trajectory: Any, marker_kill: str
) -> None:
    """The marker fallback's kill after the runner died mid-action ('runner lost') revokes
    the action's ticket; the action had taken it already and never came back for the
    revocation, and the end was not 'seen', so its empty directory was left in /tmp for
    every later action. The runner's stream closed, so it is done with its line: removed."""
    traj = trajectory(manager)
    escape = "exec >&- 2>&- <&-; kill -9 $PPID; sleep 30"
    out = manager.run_action(traj, escape, 1, timeout_s=10)
    assert out.status == "error", out
    later = manager.run_action(traj, "ls -A /tmp", 1, timeout_s=30)
    assert later.ok and later.stdout == b"", later


def test_an_action_a_slow_runner_reads_just_after_its_time_out_kill_never_runs(
    manager: Any, trajectory: Any, monkeypatch: pytest.MonkeyPatch, kill_path: str
) -> None:
    """A runner slow to read its action (held here until the time-out's kill returned, as a
    loaded machine holds it) read it within the kill's grace and ran it: the kill had found
    nothing of it and spared the runner, and the action, reported a time-out, had run after
    its kill (its write done). Under the marker fallback the runner finds the action's
    ticket revoked."""
    _slow_runner_reads_after_the_kill(manager, trajectory(manager), monkeypatch)


def _slow_runner_reads_after_the_kill(
    manager: Any, traj: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Hold the runner from the send until the time-out's kill has returned, then let it go
    on within the grace: the action must not have run."""
    import os
    import signal

    from tangram.exec.aoe import execution, transport

    assert manager.run_action(traj, "true", 1).ok  # the runner is up
    runner = manager._container(traj).transport
    assert isinstance(runner, transport.RunnerTransport) and runner.exec_id is not None
    held = os.pidfd_open(int(manager.client.api.exec_inspect(runner.exec_id)["Pid"]))
    real_send, real_kill = transport.send, execution.kill_action

    def stopped_then_sent(*args: Any, **kwargs: Any) -> None:
        signal.pidfd_send_signal(held, signal.SIGSTOP)
        real_send(*args, **kwargs)

    def kill_then_go_on(*args: Any, **kwargs: Any) -> Any:
        report = real_kill(*args, **kwargs)
        with contextlib.suppress(ProcessLookupError):  # (gone, if the kill took it)
            signal.pidfd_send_signal(held, signal.SIGCONT)  # it goes on, within the grace
        return report

    monkeypatch.setattr(transport, "send", stopped_then_sent)
    monkeypatch.setattr(execution, "kill_action", kill_then_go_on)
    try:
        out = manager.run_action(traj, "echo old > /work/old-ran", 1, timeout_s=0.5)
    finally:
        with contextlib.suppress(ProcessLookupError):
            signal.pidfd_send_signal(held, signal.SIGCONT)
        os.close(held)
    monkeypatch.setattr(transport, "send", real_send)
    monkeypatch.setattr(execution, "kill_action", real_kill)
    assert out.status == "timeout", out
    _assert_old_never_ran(manager, traj, wait_s=0)
