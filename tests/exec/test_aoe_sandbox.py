"""The default sandbox on a real container, its relaxations (always logged), and the
container lifecycle: nothing is left behind at exit, at a crash, or by a dead manager."""

from __future__ import annotations

import contextlib
import logging
import os
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest

from tangram.exec.aoe import AoeConfig, AoeError, AoeManager, SandboxConfig
from tangram.exec.aoe.containers import (
    INIT_PID_NAMESPACE,
    LABEL,
    LABEL_OWNER,
    LABEL_SESSION,
    owner_alive,
    owner_label,
    pid_namespace,
)

pytestmark = pytest.mark.docker

REPO = Path(__file__).resolve().parents[2]


def test_default_sandbox_is_enforced(manager: Any, trajectory: Any, docker_client: Any) -> None:
    traj = trajectory(manager, memory_gb=0.5)
    out = manager.run_action(
        traj,
        "id -u; grep -E '^(CapEff|NoNewPrivs)' /proc/self/status | tr -s '\\t' ' '; "
        "tail -n +3 /proc/net/dev | cut -d: -f1 | tr -d ' '; "
        "touch /etc/x 2>&1 || true; touch /work/w && echo work-writable; "
        "touch /tmp/t && echo tmp-writable",
        1,
    )
    assert out.ok, out
    lines = out.text.splitlines()
    assert lines[0] == "1000"
    assert "CapEff: 0000000000000000" in lines and "NoNewPrivs: 1" in lines
    assert [ln for ln in lines if ln in ("lo", "eth0")] == ["lo"]  # no network but loopback
    assert any("Read-only file system" in ln for ln in lines)
    assert "work-writable" in lines and "tmp-writable" in lines
    host = docker_client.api.inspect_container(manager.handle(traj).container_id)["HostConfig"]
    assert host["Memory"] == 512 * 2**20 and host["PidsLimit"] == 256
    assert host["NetworkMode"] == "none" and host["ReadonlyRootfs"] and host["CapDrop"] == ["ALL"]
    assert host["NanoCpus"] == 0 and host["CpuPeriod"] == 100_000


#: From an action: try to open the memory, stdin and stdout of the runner (the shell that
#: reads the actions and writes their end markers) and of init, and to signal them.
REACH = (
    "for who in runner:$PPID init:1; do pid=${who#*:}; line=${who%%:*}; "
    'for f in mem fd/0; do (: < /proc/$pid/$f) 2>/dev/null && line="$line $f:open" '
    '|| line="$line $f:denied"; done; '
    '(: > /proc/$pid/fd/1) 2>/dev/null && line="$line fd/1:open" || line="$line fd/1:denied"; '
    'kill -CONT $pid 2>/dev/null && line="$line signal:sent" || line="$line signal:denied"; '
    "echo $line; done"
)


def test_no_action_can_reach_the_runner_or_init_of_its_container(
    manager: Any, trajectory: Any, docker_client: Any
) -> None:
    """A process an action leaves behind must not read the runner's end-marker token from its
    memory, take its stdin or write its stdout (it would answer the trajectory's later actions,
    a grader's tests among them, with output and exit codes of its own), nor write into init's
    stdout (docker's log file on the host's disk), in every container, pooled or not."""
    traj = trajectory(manager, memory_gb=0.5)
    assert manager._trajs[traj].container.guarded_runner
    out = manager.run_action(traj, REACH, 1)
    assert out.ok, out
    # The runner is the actions' uid (it is the action's parent), so it can be signalled: at
    # worst an action stalls its own trajectory until its time-out.
    assert out.text.splitlines() == [
        "runner mem:denied fd/0:denied fd/1:denied signal:sent",
        "init mem:denied fd/0:denied fd/1:denied signal:denied",
    ], out
    host = docker_client.api.inspect_container(manager.handle(traj).container_id)["HostConfig"]
    assert host["LogConfig"] == {"Type": "json-file", "Config": {"max-file": "1", "max-size": "1m"}}


def test_pids_limit_stops_a_fork_storm(manager: Any, trajectory: Any) -> None:
    traj = trajectory(manager)
    out = manager.run_action(
        traj, "i=0; while [ $i -lt 400 ]; do sleep 5 & i=$((i+1)); done", 1, timeout_s=30
    )
    assert out.status == "error" and "can't fork" in out.error


def test_relaxations_are_applied_and_logged(
    manager: Any, trajectory: Any, docker_client: Any, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.WARNING, logger="tangram.exec.aoe")
    loose = SandboxConfig(network=True, user="0:0", pids_limit=None)
    traj = trajectory(manager, sandbox=loose)
    warned = [r.getMessage() for r in caplog.records if traj in r.getMessage()]
    assert warned and all(w in warned[0] for w in ("network enabled", "root", "no pids limit"))
    assert manager.run_action(traj, "id -u", 1).text == "0\n"
    host = docker_client.api.inspect_container(manager.handle(traj).container_id)["HostConfig"]
    assert host["NetworkMode"] != "none" and not host["PidsLimit"]


@pytest.mark.parametrize(
    ("sandbox", "cap_eff"),
    [
        (SandboxConfig(user="0:0", cap_add=("NET_RAW",)), "0000000000002000"),
        (SandboxConfig(user="0:0"), "0000000000000000"),
        (SandboxConfig(cap_add=("NET_RAW",)), "0000000000000000"),
    ],
)
def test_capabilities_given_back_reach_a_root_sandboxs_actions(
    any_manager: Any, trajectory: Any, sandbox: SandboxConfig, cap_eff: str
) -> None:
    """``cap_add`` (the documented relaxation) gave a root sandbox's actions nothing: every
    container runs as the keeper (uid 65534), and under ``no-new-privileges`` an exec as root
    into a container of a non-root user gets no capability (CapEff 0). A root sandbox that
    gives capabilities back runs its container as its own user; a non-root user never gets
    any (Linux clears them at its exec)."""
    traj = trajectory(any_manager, sandbox=sandbox)
    out = any_manager.run_action(traj, "grep CapEff /proc/self/status | cut -f2", 1)
    assert out.ok and out.text == f"{cap_eff}\n", out


def test_an_empty_user_runs_the_actions_as_the_images_user_not_the_keepers(
    any_manager: Any, trajectory: Any
) -> None:
    """``user=""`` is the image's user (root in ours, logged as a relaxation), but an exec
    given no user runs as the container's, and every container runs as the keeper (uid
    65534, so no action can signal init or the keeper): the actions ran as the keeper, which
    they could then signal, not as root."""
    traj = trajectory(any_manager, sandbox=SandboxConfig(user=""))
    out = any_manager.run_action(traj, "id -u", 1)
    assert out.ok and out.text == "0\n", out


@pytest.fixture
def image_of_user(docker_client: Any) -> Any:
    """Makes ``tangram-busybox`` with a given ``Config.User`` (``USER`` of a Dockerfile)
    under a tag of its own; removes the tags made at the end."""
    made: list[str] = []

    def make(user: str) -> str:
        tag = f"tangram-test-user-{len(made)}-{os.getpid()}"
        holder = docker_client.containers.create("tangram-busybox", command=["true"])
        try:
            holder.commit(repository=tag, conf={"User": user})
        finally:
            holder.remove(force=True)
        made.append(tag)
        return tag

    yield make
    for tag in made:
        with contextlib.suppress(Exception):
            docker_client.images.remove(tag, force=True)


@pytest.mark.parametrize("image_user", ["sandbox", "1000", "sandbox:sandbox"])
def test_an_empty_user_gets_a_work_dir_of_the_images_user(
    manager: Any, trajectory: Any, image_of_user: Any, image_user: str
) -> None:
    """``user=""`` runs the actions as the image's ``Config.User``, but the work dir's tmpfs
    was owned by the sandbox's ``user`` only: an empty one left it root's, mode 0755, where
    an image's non-root user could not write a file. The image's user now owns it."""
    image = image_of_user(image_user)
    traj = trajectory(manager, image=image, sandbox=SandboxConfig(user=""))
    out = manager.run_action(traj, "id -u; touch /work/x && echo wrote", 1)
    assert out.ok and out.text == "1000\nwrote\n", out


def test_an_empty_user_is_logged_as_the_user_the_image_names(
    manager: Any, trajectory: Any, image_of_user: Any, caplog: pytest.LogCaptureFixture
) -> None:
    """``user=""``'s relaxation said 'runs as root' whatever the image's ``Config.User``:
    an image of user ``sandbox`` was logged as root. The open now logs the user the image
    names, the one its actions run as."""
    caplog.set_level(logging.INFO, logger="tangram.exec.aoe")
    traj = trajectory(manager, image=image_of_user("sandbox"), sandbox=SandboxConfig(user=""))
    said = " | ".join(r.getMessage() for r in caplog.records if traj in r.getMessage())
    assert "runs as the image's user 'sandbox'" in said and "runs as root" not in said, said
    assert manager.run_action(traj, "id -un", 1).text == "sandbox\n"


def test_an_empty_user_whose_image_user_the_image_lacks_is_refused_naming_both(
    manager: Any, image_of_user: Any
) -> None:
    """An image whose ``Config.User`` names no account of its own /etc/passwd is refused at
    the open, saying the user is the image's (``user=""``), not a ``SandboxConfig.user`` the
    caller never gave."""
    image = image_of_user("ghost")
    with pytest.raises(AoeError, match=r"SandboxConfig.user '' is the image's user 'ghost'"):
        manager.open_trajectory("ghost-user", image=image, sandbox=SandboxConfig(user=""))
    assert "ghost-user" not in manager.trajectories()


@pytest.mark.parametrize("user", ["+1000", "01000", "1000:sandbox", "+1000:+1000"])
def test_the_work_dir_is_writable_by_every_spelling_of_a_numeric_user(
    manager: Any, trajectory: Any, user: str
) -> None:
    """The work dir's tmpfs was chowned only to a user of plain digits: a user the engine
    runs as uid 1000 all the same ('+1000', '01000', a group given by name) got a work dir
    of root's, mode 0755, where its actions could not write a file. The uid, given as a
    number, now owns it whatever its spelling."""
    traj = trajectory(manager, sandbox=SandboxConfig(user=user))
    out = manager.run_action(traj, "id -u; touch /work/x && echo wrote", 1)
    assert out.ok and out.text == "1000\nwrote\n", out


@pytest.mark.parametrize("user", ["sandbox", "sandbox:sandbox", "sandbox:1000"])
def test_the_work_dir_is_writable_by_a_user_given_by_name(
    manager: Any, trajectory: Any, docker_client: Any, user: str
) -> None:
    """A tmpfs cannot be owned by a name (the engine takes numbers), so a user given by name
    got a work dir of root's, mode 0755, where its actions could not write a file. The name
    is resolved in the image's /etc/passwd (and /etc/group), and its uid owns it; the
    container it was read from is gone."""
    traj = trajectory(manager, sandbox=SandboxConfig(user=user))
    out = manager.run_action(traj, "id -u; touch /work/x && echo wrote", 1)
    assert out.ok and out.text == "1000\nwrote\n", out
    ours = docker_client.api.containers(
        all=True, filters={"label": f"tangram.aoe.session={manager.session}"}
    )
    assert all("tangram.aoe.trajectory" in (c.get("Labels") or {}) for c in ours), ours


@pytest.mark.parametrize(("user", "missing"), [("nosuch", "account"), ("sandbox:nogroup", "group")])
def test_a_user_name_the_image_lacks_is_refused_naming_it(
    manager: Any, user: str, missing: str
) -> None:
    with pytest.raises(AoeError, match=f"no {missing} .*give the"):
        manager.open_trajectory("named-missing", sandbox=SandboxConfig(user=user))
    assert "named-missing" not in manager.trajectories()


def test_a_user_name_that_is_root_in_the_image_is_refused(
    manager: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A name the image maps to uid 0 ran the sandbox as root without the relaxation (only
    'root' and uid 0 spelled as a number were known as root)."""
    from tangram.exec.aoe import containers

    monkeypatch.setattr(
        containers, "_image_file", lambda *_: "root:x:0:0::/:/bin/sh\ntoor:x:0:0::/:/bin/sh\n"
    )
    monkeypatch.setattr(containers, "_RESOLVED", {})
    with pytest.raises(AoeError, match="uid 0"):
        manager.open_trajectory("named-root", sandbox=SandboxConfig(user="toor"))
    assert "named-root" not in manager.trajectories()


def _gone(client: Any, container_id: str, within_s: float) -> bool:
    import docker.errors

    deadline = time.monotonic() + within_s
    while time.monotonic() < deadline:
        try:
            client.api.inspect_container(container_id)
        except docker.errors.NotFound:
            return True
        time.sleep(0.2)
    return False


@pytest.mark.parametrize("ending", ["exit", "sigkill"])
def test_nothing_is_left_behind_when_the_process_ends(docker_client: Any, ending: str) -> None:
    end = "os.kill(os.getpid(), signal.SIGKILL)" if ending == "sigkill" else "sys.exit(0)"
    code = (
        "import os, signal, sys\n"
        "from tangram.exec.aoe import AoeManager\n"
        "m = AoeManager()\n"
        "print(m.open_trajectory('doomed').container_id, flush=True)\n"
        f"{end}\n"
    )
    done = subprocess.run(
        [sys.executable, "-c", code],
        capture_output=True,
        text=True,
        cwd=REPO,
        timeout=60,
        check=False,
    )
    container_id = done.stdout.strip()
    assert len(container_id) == 64, done.stderr
    assert _gone(docker_client, container_id, 20), f"container left behind after {ending}"


def test_orphans_of_dead_managers_are_removed_on_start(docker_client: Any) -> None:
    host, pid, start, namespace = owner_label().split("/")
    dead_owner = f"{host}/{pid}/{start}0/{namespace}"  # this pid, not this process: dead
    orphan = docker_client.containers.create(
        "tangram-busybox",
        ["sleep", "infinity"],
        labels={LABEL: "1", LABEL_SESSION: "dead-session", LABEL_OWNER: dead_owner},
    )
    live = docker_client.containers.create(
        "tangram-busybox",
        ["sleep", "infinity"],
        labels={LABEL: "1", LABEL_SESSION: "live-session", LABEL_OWNER: owner_label()},
    )
    try:
        with AoeManager(AoeConfig(reaper=False), client=docker_client):
            pass
        assert _gone(docker_client, orphan.id, 1)
        assert not _gone(docker_client, live.id, 0.3)  # a live manager's container stays
    finally:
        live.remove(force=True)
        if os.environ.get("TANGRAM_KEEP"):
            pass


#: A manager's owner label as a process in a PID namespace of its own sees it (a service in a
#: container with the host's network, so the host's name, and the engine's socket).
OTHER_NAMESPACE_OWNER = (
    "import sys\n"
    "from tangram.exec.aoe.containers import owner_label\n"
    "print(owner_label(), flush=True)\n"
    "sys.stdin.read()\n"
)


def _swept_by_a_start(docker_client: Any, owner: str) -> bool:
    """Whether a manager's start removes a container labelled as ``owner``'s (its start
    sweeps the orphans, synchronously); the container is removed either way."""
    import docker.errors

    theirs = docker_client.containers.create(
        "tangram-busybox",
        ["sleep", "infinity"],
        labels={LABEL: "1", LABEL_SESSION: "another-session", LABEL_OWNER: owner},
    )
    try:
        with AoeManager(AoeConfig(reaper=False), client=docker_client):
            pass
        return theirs.id not in {c.id for c in docker_client.containers.list(all=True)}
    finally:
        with contextlib.suppress(docker.errors.NotFound):
            theirs.remove(force=True)


def _other_namespace_cmd() -> tuple[list[str], dict[str, str]]:
    """A Python child in a PID namespace of its own (``unshare``), and its environment."""
    cmd = ["unshare", "--pid", "--fork", "--mount-proc", sys.executable, "-c"]
    return [*cmd, OTHER_NAMESPACE_OWNER], {**os.environ, "PYTHONPATH": str(REPO)}


def test_a_live_manager_in_another_pid_namespace_keeps_its_containers(docker_client: Any) -> None:
    """The orphan sweep read a container's owner (host/pid/start time) in this PID namespace:
    a live manager on the same host name in another one (a container with the host's network
    and the engine's socket) looked dead, its pid absent here or another process's, and a
    second service's start removed its containers under its running actions."""
    cmd, env = _other_namespace_cmd()
    other = subprocess.Popen(cmd, stdin=subprocess.PIPE, stdout=subprocess.PIPE, env=env)
    assert other.stdin is not None and other.stdout is not None
    try:
        owner = other.stdout.readline().decode().strip()
        assert owner.split("/")[:2] == [owner_label().split("/")[0], "1"], owner
        assert not _swept_by_a_start(docker_client, owner), (
            "a live manager's container was removed as an orphan's"
        )
    finally:
        other.stdin.close()
        other.wait(30)


def test_a_dead_manager_in_another_pid_namespace_has_its_containers_swept(
    docker_client: Any,
) -> None:
    """A service restarted in a new container is in a new PID namespace: its last run's
    containers (their reaper died with that run) were left for ever once an owner in another
    namespace was never read as dead, their memory and cores held, their work volumes
    refused to the restarted service. Read from the host's namespace, an owner whose
    namespace has no process left is dead, and the next start sweeps its containers."""
    assert pid_namespace() == INIT_PID_NAMESPACE, "the suite runs in the host's PID namespace"
    cmd, env = _other_namespace_cmd()
    other = subprocess.run(cmd, input=b"", capture_output=True, env=env, timeout=60)
    owner = other.stdout.decode().strip()
    assert other.returncode == 0 and owner.count("/") == 3, (owner, other.stderr)
    assert owner_alive(owner) is False  # its namespace ended with it
    assert _swept_by_a_start(docker_client, owner), "a dead manager's container was left behind"


def test_two_managers_on_one_work_volume_never_share_a_trajectorys_files(
    manager: Any, docker_client: Any
) -> None:
    """Volume names are ``work_volume``-<digest of the trajectory id>, with no session in them
    (so a restarted service finds its trajectories' files): two live managers (two services
    on one host) with one ``work_volume`` gave their trajectories of the same id (RL workers
    number them from 0) one /work, each reading and overwriting the other's files. The
    second open is refused, naming the volume and its holder; the first one's files stay."""
    name = f"tangram-test-shared-{os.getpid()}"
    sandbox = SandboxConfig(work_volume=name)
    manager.open_trajectory("0", sandbox=sandbox)
    try:
        assert manager.run_action("0", "echo mine > /work/f.txt", 1).ok
        with AoeManager(AoeConfig(reaper=False), client=docker_client) as other:
            with pytest.raises(AoeError, match=f"work volume {name}-.* is in use by container"):
                other.open_trajectory("0", sandbox=sandbox)
                other.run_action("0", "echo theirs > /work/f.txt", 1)  # (what it could do)
            assert other.trajectories() == ()
        assert manager.run_action("0", "cat /work/f.txt", 1).text == "mine\n"
    finally:
        manager.close_trajectory("0")
        for vol in docker_client.volumes.list():  # (whatever a failure left)
            if vol.name.startswith(name):
                with contextlib.suppress(Exception):
                    vol.remove(force=True)


def test_a_work_volume_is_each_trajectorys_own_and_never_a_host_path(
    manager: Any, trajectory: Any, docker_client: Any
) -> None:
    """One ``work_volume`` name on the sandbox gave every trajectory (and later sessions) the
    same /work, and a host path was bind-mounted read-write (stop 27's security hunt)."""
    name = f"tangram-test-vol-{os.getpid()}"
    sandbox = SandboxConfig(work_volume=name)
    a, b = trajectory(manager, sandbox=sandbox), trajectory(manager, sandbox=sandbox)
    try:
        assert manager.run_action(a, "echo secret > /work/a.txt", 1).ok
        seen = manager.run_action(b, "ls -A /work; echo end", 1)
        assert seen.text == "end\n", seen
        manager.recreate(a)  # its own volume survives its recreate
        assert manager.run_action(a, "cat /work/a.txt", 1).text == "secret\n"
        mine = {v.name for v in docker_client.volumes.list() if v.name.startswith(name)}
        assert len(mine) == 2  # one per trajectory
        manager.close_trajectory(a)  # its volume goes with it, as a tmpfs work dir would
        left = {v.name for v in docker_client.volumes.list() if v.name.startswith(name)}
        assert len(left) == 1 and left < mine
        assert any("work dir on docker volumes" in r for r in sandbox.relaxations())
        with pytest.raises(AoeError, match="docker volume name"):
            SandboxConfig(work_volume="/etc")
    finally:
        for t in (a, b):
            with contextlib.suppress(AoeError):  # (a is closed unless an assertion failed first)
                manager.close_trajectory(t)
        for vol in docker_client.volumes.list():  # (whatever a failure left)
            if vol.name.startswith(name):
                with contextlib.suppress(Exception):
                    vol.remove(force=True)


@pytest.mark.parametrize(
    ("user", "work_dir", "uid"),
    [("1000:1000", "/home/x", "1000"), ("2000:2000", "/work", "2000"), ("sandbox", "/w", "1000")],
)
def test_a_work_volume_is_writable_by_the_actions_user(
    manager: Any, trajectory: Any, docker_client: Any, user: str, work_dir: str, uid: str
) -> None:
    """A tmpfs work dir is made the actions' user's (``work_tmpfs_options``), a work volume
    was not: a fresh volume takes the owner of the image's directory at its path, so a
    work dir the image lacks (root's) or one of another uid than the sandbox's user left
    every action unable to write a file in its work dir. The volume's root is now given to
    the actions' user when the container starts."""
    name = f"tangram-test-own-{os.getpid()}"
    sandbox = SandboxConfig(work_volume=name, user=user, work_dir=work_dir)
    try:
        traj = trajectory(manager, sandbox=sandbox)
        out = manager.run_action(traj, "id -u; touch x && echo wrote", 1)
        assert out.ok and out.text == f"{uid}\nwrote\n", out
        manager.recreate(traj)  # the same volume, again its user's
        out = manager.run_action(traj, "ls; touch y && echo wrote", 1)
        assert out.ok and out.text == "x\nwrote\n", out
        manager.close_trajectory(traj)
    finally:
        for vol in docker_client.volumes.list():  # (whatever a failure left)
            if vol.name.startswith(name):
                with contextlib.suppress(Exception):
                    vol.remove(force=True)


def test_a_released_watchdog_is_waited_for_not_left_a_zombie(docker_client: Any) -> None:
    """``release`` closed the watchdog's stdin and dropped its ``Popen`` unwaited: the
    watchdog, which exits once it finds nothing left, stayed a zombie, and the dropped
    ``Popen`` warned "subprocess N is still running" (ResourceWarning) at every shutdown."""
    from tangram.exec.aoe import reaper

    watchdog = reaper.spawn(f"test-release-{os.getpid()}", None)
    reaper.release(watchdog)
    assert watchdog.returncode is not None  # waited: no zombie, no warning
