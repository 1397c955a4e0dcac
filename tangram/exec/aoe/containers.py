"""Container lifecycle through the docker SDK: create (sandboxed, parked), inspect, remove.

Every container carries labels naming the manager session and the owning process
(``host/pid/start-time/pid-namespace``), so containers of a manager that died can be told
from those of a live one and removed (``remove_orphans``), and a watchdog can remove a
session's containers when its process disappears (``reaper.py``).
"""

from __future__ import annotations

import contextlib
import logging
import os
import re
import socket
import uuid
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

from tangram.exec.aoe.config import SandboxConfig
from tangram.exec.aoe.errors import AoeError, ImageMissing
from tangram.exec.aoe.topology import format_cpulist

log = logging.getLogger(__name__)

LABEL = "tangram.aoe"
LABEL_SESSION = "tangram.aoe.session"
LABEL_OWNER = "tangram.aoe.owner"
LABEL_TRAJ = "tangram.aoe.trajectory"
#: A random value per creation: the one container a failed ``create`` may remove is the one
#: carrying its own value.
LABEL_INSTANCE = "tangram.aoe.instance"


def process_start_time(pid: int) -> str | None:
    """The kernel's start time of ``pid`` (clock ticks since boot), to detect pid reuse."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    return stat.rsplit(")", 1)[1].split()[19]


def local_pid(pid: int, container_id: str) -> int | None:
    """``pid`` when this machine's /proc shows it as the container's init (a local engine)."""
    try:
        return pid if container_id in Path(f"/proc/{pid}/cgroup").read_text() else None
    except OSError:
        return None


#: The kernel's flag of a task in ``do_exit`` (``/proc/PID/stat`` field 9).
PF_EXITING = 0x4


def pid_running(pid: int) -> bool:
    """True while ``pid`` exists, is not a zombie and is not exiting. A container's init is
    exiting (its pid namespace being emptied) before the container's other processes die and
    well before it is a zombie: that is when a dying container must be told from a live one."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return False
    fields = stat.rsplit(")", 1)[1].split()
    return fields[0] not in ("Z", "X") and not int(fields[6]) & PF_EXITING


def init_running(pid: int, container_id: str) -> bool:
    """Whether the container's init, host pid ``pid``, still runs: ``pid_running``, and the
    pid still the container's (in its cgroup). Once the init died the kernel may give its
    pid to any process, and the dead container was taken for alive."""
    return pid_running(pid) and local_pid(pid, container_id) is not None


def pid_namespace(pid: int | None = None) -> str:
    """The PID namespace of ``pid`` (this process by default) as the kernel numbers it, '?'
    when it cannot be read."""
    try:
        return _namespace_read(str(pid) if pid is not None else "self")
    except OSError:
        return "?"


def _namespace_read(pid: str) -> str:
    """The kernel's number of ``/proc/<pid>``'s PID namespace (``OSError`` when unreadable)."""
    return os.readlink(f"/proc/{pid}/ns/pid").removeprefix("pid:[").removesuffix("]")


def owner_label(pid: int | None = None) -> str:
    """``host/pid/start-time/pid-namespace`` of the current (or given) process."""
    pid = os.getpid() if pid is None else pid
    return (
        f"{socket.gethostname()}/{pid}/{process_start_time(pid) or '?'}/"
        f"{pid_namespace(None if pid == os.getpid() else pid)}"
    )


#: The kernel's number for the host's (initial) PID namespace (``PROC_PID_INIT_INO``).
INIT_PID_NAMESPACE = "4026531836"


def owner_alive(owner: str) -> bool | None:
    """True/False for an owner on this host; None when it cannot be told (another host).

    An owner in another PID namespace (a service in a container with the host's network has
    the host's name, but its pids mean nothing here: read here, a live one looked dead and
    its containers were swept as orphans) is alive while its namespace is, as seen from the
    host's namespace, which sees every process (``namespace_alive``); from inside another
    one it cannot be told (None: left alone). Told dead, a service restarted in a new
    container sweeps its last run's containers, which nothing else removes (their reaper
    died with them). A label without a namespace (an older manager's) is read in this one.
    """
    host, _, rest = owner.partition("/")
    pid_s, _, rest = rest.partition("/")
    start, _, namespace = rest.partition("/")
    if host != socket.gethostname() or not pid_s.isdigit():
        return None
    here = pid_namespace()
    if namespace and namespace != here:
        return namespace_alive(namespace) if here == INIT_PID_NAMESPACE else None
    now = process_start_time(int(pid_s))
    return now is not None and (start == "?" or now == start)


def namespace_alive(namespace: str) -> bool | None:
    """Whether any process on this machine is in PID namespace ``namespace`` (read from the
    host's namespace, where /proc lists every process); None when some process's namespace
    could not be read and none found was in it."""
    unread = False
    for entry in os.scandir("/proc"):
        if not entry.name.isdigit() or entry.name == "1":
            continue  # (pid 1 here is this namespace's init: never in another one)
        try:
            if _namespace_read(entry.name) == namespace:
                return True
        except FileNotFoundError:
            continue  # (the process ended meanwhile)
        except OSError:
            unread = True
    return None if unread else False


@dataclass(frozen=True)
class ContainerSpec:
    """What one trajectory's container is created with."""

    name: str
    image: str
    memory_gb: float | None
    sandbox: SandboxConfig
    cpu_period_us: int
    #: Quota while the container starts (all its cores: a start at the 1% parking quota takes
    #: seconds instead of a fraction of one); the manager parks it right after.
    start_quota_us: int
    park_cores: tuple[int, ...]
    use_init: bool
    labels: dict[str, str]
    #: The uid:gid of the container's init and keeper process, when not ``sandbox.user``: a
    #: warm pool's containers keep them out of the actions' reach (no signal, no ptrace).
    keeper_user: str | None = None
    #: Host files bind-mounted read-only into the container: (host path, container path).
    read_only_binds: tuple[tuple[str, str], ...] = ()
    #: The (uid, gid) of a ``sandbox.user`` given by name, resolved in the image.
    work_owner: tuple[int, int] | None = None


def _uid_gid(user: str) -> tuple[int, int | None] | None:
    """The uid ``user`` runs as, and its gid when given as a number, read as the engine reads
    them (a sign and leading zeros allowed: '+1000' is uid 1000); None when the uid is a
    name or left to the image (only the image knows it)."""
    uid, _, gid = user.partition(":")
    if not _NUMBER.match(uid):
        return None
    return int(uid), int(gid) if _NUMBER.match(gid) else None


#: An id as the engine reads it (``config.user_problem`` has held it to its range).
_NUMBER = re.compile(r"[+-]?[0-9]+\Z")
#: Users resolved in an image: (image id, user) -> (uid, gid) (an image rebuilt has a new id).
_RESOLVED: dict[tuple[str, str], tuple[int, int]] = {}
_RESOLVED_MAX = 256


def _image_file(
    client: Any, image: str, path: str, labels: dict[str, str] | None = None
) -> str | None:
    """The text of ``path`` in ``image`` (None when the image lacks it): read from a
    container created, never started, from it and removed at once; ``labels``: its
    manager's session and owner, so the sweeps remove it if its removal failed."""
    import io
    import tarfile

    made = client.api.create_container(
        image=image, command=["true"], network_disabled=True, labels={LABEL: "1", **(labels or {})}
    )
    cid = made["Id"] if isinstance(made, dict) else made
    try:
        try:
            stream, _ = client.api.get_archive(cid, path)
        except Exception as exc:  # noqa: BLE001 - a missing file is the engine's 404
            if getattr(getattr(exc, "response", None), "status_code", None) == 404:
                return None
            raise
        with tarfile.open(fileobj=io.BytesIO(b"".join(stream))) as tar:
            for member in tar:
                if member.isfile():
                    data = tar.extractfile(member)
                    return data.read().decode("utf-8", "replace") if data else None
        return None
    finally:
        with contextlib.suppress(Exception):
            client.api.remove_container(cid, force=True)


def _lookup(text: str | None, name: str, field: int) -> int | None:
    """Field ``field`` (a number) of the entry called ``name`` in a passwd or group file."""
    for line in (text or "").splitlines():
        parts = line.split(":")
        if parts[0] == name and len(parts) > field and _NUMBER.match(parts[field]):
            return int(parts[field])
    return None


def resolve_user(
    client: Any, image_id: str, user: str, labels: dict[str, str] | None = None
) -> tuple[int, int] | None:
    """The (uid, gid) a ``user`` whose uid is a name runs as in the image (its group, a name
    or number, else the account's own); None when its uid is a number or the image's
    default. ``AoeError`` when the image has no such account or group: the work dir's
    tmpfs cannot be owned by a name (the engine takes only numbers), and left root's, mode
    0755, the actions could not write in it."""
    name, _, group = user.partition(":")
    if not name or _NUMBER.match(name):
        return None
    key = (image_id, user)
    if key in _RESOLVED:
        return _RESOLVED[key]
    passwd = _image_file(client, image_id, "/etc/passwd", labels)
    uid = _lookup(passwd, name, 2)
    if uid is None:
        raise AoeError(
            f"SandboxConfig.user {user!r}: the image has no account {name!r} in its "
            "/etc/passwd; give the uid (e.g. '1000:1000')"
        )
    if not group:
        gid = _lookup(passwd, name, 3)
    elif _NUMBER.match(group):
        gid = int(group)
    else:
        gid = _lookup(_image_file(client, image_id, "/etc/group", labels), group, 2)
    if gid is None:
        raise AoeError(
            f"SandboxConfig.user {user!r}: the image has no group {group or name!r}; give the "
            "gid (e.g. '1000:1000')"
        )
    if len(_RESOLVED) >= _RESOLVED_MAX:
        _RESOLVED.clear()
    _RESOLVED[key] = (uid, gid)
    return uid, gid


def work_tmpfs_options(sb: SandboxConfig, owner: tuple[int, int] | None = None) -> str:
    """The work dir's tmpfs options: owned by the sandbox's uid (its gid when given as a
    number, else the uid's number), mode 0755. Read only when made of plain digits, the
    uid of '+1000' (1000 to the engine) or '1000:users' was never given: the work dir stayed
    root's, where the actions could not write a file. ``owner``: the (uid, gid) a user
    given by name has in the image (``resolve_user``): without it, such a work dir stayed
    root's too."""
    # exec: a compiled program runs from the work dir (docker's tmpfs is noexec by default,
    # which guards nothing here: the sandbox's interpreters run any file anyway).
    opts = f"rw,exec,size={sb.work_size_mb}m,mode=0755"
    if owner is not None:
        return opts + f",uid={owner[0]},gid={owner[1]}"
    numeric = _uid_gid(sb.user)
    if numeric is None:
        return opts
    uid, gid = numeric
    return opts + f",uid={uid},gid={uid if gid is None else gid}"


def create_kwargs(spec: ContainerSpec) -> dict[str, Any]:
    """The ``containers.run`` arguments of a sandboxed container (parked once started)."""
    sb = spec.sandbox
    work_opts = work_tmpfs_options(sb, spec.work_owner)
    kwargs: dict[str, Any] = {
        "image": spec.image,
        # A do-nothing PID 1: actions come in through exec; docker's init reaps orphans.
        "command": ["sleep", "infinity"],
        "name": spec.name,
        "detach": True,
        "init": spec.use_init,
        "labels": spec.labels,
        "user": spec.keeper_user or sb.user,
        "working_dir": sb.work_dir,
        "read_only": sb.read_only_root,
        "tmpfs": {"/tmp": f"rw,size={sb.tmp_size_mb}m,mode=1777"},
        # Explicit period and quota: a container started with NanoCPUs refuses quota updates.
        "cpu_period": spec.cpu_period_us,
        "cpu_quota": spec.start_quota_us,
        "cpuset_cpus": format_cpulist(spec.park_cores),
        # What the container's processes write to PID 1's stdout or stderr lands in the
        # engine's log file on the host's disk, unbounded by default: cap it (the last MiB is
        # all a start failure's message needs).
        "log_config": {"type": "json-file", "config": {"max-size": "1m", "max-file": "1"}},
    }
    if sb.work_volume:
        kwargs["volumes"] = {sb.work_volume: {"bind": sb.work_dir, "mode": "rw"}}
    else:
        kwargs["tmpfs"][sb.work_dir] = work_opts
    for host, inside in spec.read_only_binds:
        kwargs.setdefault("volumes", {})[host] = {"bind": inside, "mode": "ro"}
    if not sb.network:
        kwargs["network_mode"] = "none"
    if sb.memory_limit and spec.memory_gb:
        mem = f"{max(6, int(spec.memory_gb * 1024))}m"
        kwargs["mem_limit"] = mem
        kwargs["memswap_limit"] = mem  # no swap: the limit is the limit
    if sb.pids_limit is not None:
        kwargs["pids_limit"] = sb.pids_limit
    if sb.no_new_privileges:
        kwargs["security_opt"] = ["no-new-privileges"]
    if sb.drop_all_capabilities:
        kwargs["cap_drop"] = ["ALL"]
    if sb.cap_add:
        kwargs["cap_add"] = list(sb.cap_add)
    return kwargs


def safe_name(text: str) -> str:
    """A docker-legal container name fragment of ``text``."""
    cleaned = re.sub(r"[^a-zA-Z0-9_.-]+", "-", text).strip("-.") or "t"
    return cleaned[:48]


def create(client: Any, spec: ContainerSpec) -> Any:
    """Create and start the container; raise ``ImageMissing``/``AoeError`` naming the cause.

    Never removes a container it did not make: each creation carries its own random
    ``LABEL_INSTANCE``, and a failed start removes the container holding the name only when
    that label is this creation's (a name already taken is reported, its holder left alone).
    """
    import docker.errors

    try:
        image = client.images.get(spec.image)
    except docker.errors.NotFound:  # (a name with '..' in it reaches another of its paths)
        raise ImageMissing(
            f"image {spec.image!r} is not in the local Docker engine (nothing can be pulled "
            "here): build it with scripts/ensure-docker.sh"
        ) from None
    except Exception as exc:  # noqa: BLE001 - a name the engine cannot parse (its 400), a
        # lost connection: raised bare, out of open_trajectory, naming neither the argument
        # nor the fault in AOE's terms
        raise AoeError(f"image {spec.image!r} could not be looked up in the engine: {exc}") from exc
    spec = _with_work_owner(client, spec, getattr(image, "id", None) or spec.image)
    instance = uuid.uuid4().hex
    kwargs = create_kwargs(spec)
    kwargs["labels"] = {**spec.labels, LABEL_INSTANCE: instance}
    try:
        container = client.containers.run(**kwargs)
    except Exception as exc:  # noqa: BLE001 - the engine's refusal, or a read time-out or lost
        # connection after it made (and maybe started) the container: looked for either way
        holder = _holder(client, spec.name)
        if holder is not None and holder.labels.get(LABEL_INSTANCE) == instance:
            # The engine created it before failing to start it: do not leave it behind (a
            # failed removal is logged: raised, it hid why the start failed).
            _remove_started(client, holder.id, spec.name)
        elif holder is not None:
            raise AoeError(
                f"could not create container {spec.name}: the name is already taken by "
                f"container {holder.short_id} ({describe_owner(holder.labels)}), which was "
                "left alone"
            ) from exc
        if "Requested CPUs are not available" in str(exc):
            # (the cpuset is the manager's topology: every open failed so, naming no setting)
            raise AoeError(
                f"could not start container {spec.name}: AoeConfig.topology "
                f"({format_cpulist(spec.park_cores)}) names cores the engine's machine lacks: "
                f"{exc}"
            ) from exc
        raise AoeError(f"could not start container {spec.name} from {spec.image}: {exc}") from exc
    try:
        _check_running(container, spec.name)
    except BaseException:
        _remove_started(client, container.id, spec.name)
        raise
    _own_work_volume(client, container.id, spec)
    return container


def _work_owner(spec: ContainerSpec) -> tuple[int, int] | None:
    """The (uid, gid) the work dir is given to (as ``work_tmpfs_options`` gives the tmpfs):
    the resolved name's or image user's, else the numeric user's (its uid as gid when it
    names none); None for root or a user only the image knows."""
    if spec.work_owner is not None:
        return spec.work_owner
    numeric = _uid_gid(spec.sandbox.user)
    if numeric is None or numeric[0] == 0:
        return None
    uid, gid = numeric
    return uid, uid if gid is None else gid


def _own_work_volume(client: Any, container_id: str, spec: ContainerSpec) -> None:
    """Give a work volume's root to the actions' user. A tmpfs work dir is made theirs by
    its options; a fresh volume took the owner of the image's directory at its path (root's
    when the image lacks it, the image's user's otherwise), so every action of another uid
    could not write a file in its work dir. The sandboxed container cannot change it (no
    capability, no new privileges: a privileged exec is refused), so a short-lived container
    of the image does, as root with ``CAP_CHOWN`` alone and no network, once the sandboxed
    one is up (its mount has copied the image's directory in: done before, that copy into an
    empty volume took the image's owner back). A failure (an image without ``chown``) is
    logged: the volume may be writable all the same."""
    owner = _work_owner(spec) if spec.sandbox.work_volume else None
    if owner is None:
        return
    sb = spec.sandbox
    tags = {k: v for k, v in spec.labels.items() if k in (LABEL_SESSION, LABEL_OWNER)}
    try:
        client.containers.run(
            spec.image,
            [f"{owner[0]}:{owner[1]}", sb.work_dir],
            entrypoint=["chown"],
            user="0",
            volumes={sb.work_volume: {"bind": sb.work_dir, "mode": "rw"}},
            network_mode="none",
            cap_drop=["ALL"],
            cap_add=["CHOWN"],
            security_opt=["no-new-privileges"],
            labels={LABEL: "1", **tags},
            remove=True,
            stdout=True,
            stderr=True,
        )
    except Exception as exc:  # noqa: BLE001 - its non-zero exit, the engine's errors
        log.warning(
            "the work volume of %s (SandboxConfig.work_volume at %s) could not be given to "
            "uid %d: %s; its actions may not write in it",
            spec.name,
            sb.work_dir,
            owner[0],
            exc,
        )


def exec_user(client: Any, image_id: str, user: str) -> str:
    """The user the actions' execs run as: ``user``, or for an empty one (the image's user,
    ``SandboxConfig.user``) the image's own (its ``Config.User``; root, ``0``, when it names
    none). Given as empty, an exec runs as the container's user, which is the keeper's
    (``ContainerSpec.keeper_user``): the actions ran as the keeper's uid, not root, and could
    signal the container's init and keeper."""
    if user:
        return user
    try:
        config = client.api.inspect_image(image_id).get("Config") or {}
    except Exception as exc:  # noqa: BLE001 - the engine's refusal or a lost connection
        raise AoeError(f"the user of image {image_id[:19]} could not be read: {exc}") from exc
    return config.get("User") or "0"


def _image_user_owner(
    client: Any, image_id: str, labels: dict[str, str] | None = None
) -> tuple[int, int] | None:
    """The (uid, gid) of the image's own user (``exec_user``'s, a ``SandboxConfig.user`` of
    ``""``), None when it is root (the tmpfs's own owner): the work dir was owned by the
    sandbox's ``user`` only, so an empty one left it root's, mode 0755, where an image's
    non-root user (its ``Config.User``) could not write. A number without a group takes the
    uid as gid, as ``work_tmpfs_options`` does for a numeric ``user``."""
    user = exec_user(client, image_id, "")
    numeric = _uid_gid(user)
    if numeric is not None:
        uid, gid = numeric
        owner = (uid, uid if gid is None else gid)
    else:
        try:
            owner = resolve_user(client, image_id, user, labels)
        except AoeError as exc:  # (it named a SandboxConfig.user the caller never gave)
            raise AoeError(
                f"SandboxConfig.user '' is the image's user {user!r} (its Config.User), which "
                f"the image cannot resolve ({exc}): give the sandbox's user"
            ) from None
    return None if owner is None or owner[0] == 0 else owner


def _with_work_owner(client: Any, spec: ContainerSpec, image_id: str) -> ContainerSpec:
    """``spec`` with its sandbox user's (uid, gid) when the user is a name: resolved in the
    image, so the work dir's tmpfs is the actions' (a name left it root's, mode 0755, where
    they could not write). A name that is uid 0 in the image is refused unless the sandbox
    asks for root (``runs_as_root``, the documented relaxation)."""
    sb = spec.sandbox
    try:
        tags = {k: v for k, v in spec.labels.items() if k in (LABEL_SESSION, LABEL_OWNER)}
        owner = _image_user_owner(client, image_id, tags) if not sb.user else None
        owner = owner or resolve_user(client, image_id, sb.user, tags)
    except AoeError:
        raise
    except Exception as exc:  # noqa: BLE001 - the engine's refusal or a lost connection
        raise AoeError(
            f"SandboxConfig.user {sb.user!r} could not be looked up in image {spec.image!r}: {exc}"
        ) from exc
    if owner is None:
        return spec
    if owner[0] == 0 and not sb.runs_as_root:
        raise AoeError(
            f"SandboxConfig.user {sb.user!r} is uid 0 (root) in image {spec.image!r}: a "
            "sandbox runs as root only when asked for by name ('root' or '0:0')"
        )
    return replace(spec, work_owner=owner)


def _check_running(container: Any, name: str) -> None:
    """``AoeError`` unless the started container runs: one that exited at once (with the tail
    of its log), or one whose inspect or logs the engine did not give (the error named)."""
    try:
        container.reload()
        if container.status == "running":
            return
        logs = container.logs(tail=20).decode(errors="replace").strip()
    except Exception as exc:  # noqa: BLE001 - docker's APIError, a lost connection alike
        raise AoeError(
            f"container {name} was started but could not be looked at: {type(exc).__name__}: {exc}"
        ) from exc
    raise AoeError(f"container {name} exited at once ({container.status}): {logs}")


def death_of(container: Any, name: str) -> AoeError | None:
    """An ``AoeError`` saying ``container`` is no longer running (its state, the tail of its
    log), None when it runs or cannot be looked at (the caller's own error then stands): a
    container that exited just after ``create`` saw it running made the next step fail with
    the engine's bare 'is not running' (409), naming neither its fate nor why."""
    try:
        container.reload()
        if container.status == "running":
            return None
        logs = container.logs(tail=20).decode(errors="replace").strip()
    except Exception:  # noqa: BLE001 - gone already, a lost connection: nothing more to say
        return None
    return AoeError(f"container {name} exited right after its start ({container.status}): {logs}")


def _remove_started(client: Any, container_id: str, name: str) -> None:
    """Remove a container ``create`` started but will not hand out (else it stayed in the
    engine, unknown to the manager, until its session's sweep); a failure is logged."""
    try:
        remove(client, container_id)
    except Exception as exc:  # noqa: BLE001 - the creation's own error is the one to raise
        log.warning("container %s, started but not handed out, could not be removed: %s", name, exc)


def _holder(client: Any, name: str) -> Any | None:
    """The container that holds ``name`` now, if any."""
    import docker.errors

    try:
        return client.containers.get(name)
    except docker.errors.NotFound:
        return None
    except Exception as exc:  # noqa: BLE001 - the engine's errors, a lost connection alike
        log.warning("could not look up container %s: %s", name, exc)
        return None


def describe_owner(labels: dict[str, str]) -> str:
    """Whose a container is, from its labels, in words (for refusals)."""
    if labels.get(LABEL) != "1":
        return "not an AOE container"
    return (
        f"AOE session {labels.get(LABEL_SESSION, '?')[:8]}, trajectory "
        f"{labels.get(LABEL_TRAJ, '?')!r}, owner {labels.get(LABEL_OWNER, '?')}"
    )


def foreign_volume_user(client: Any, volume: str, session: str) -> dict[str, Any] | None:
    """A container that mounts ``volume`` and is not ``session``'s, unless it is an orphan (an
    AOE container whose owner on this host is dead: a restarted service takes its volume
    over); None when there is none. Its labels say whose it is (``describe_owner``)."""
    try:
        users = client.api.containers(all=True, filters={"volume": volume})
    except Exception as exc:  # noqa: BLE001 - the engine's refusal or a lost connection alike
        raise AoeError(f"could not list the containers of work volume {volume}: {exc}") from exc
    for user in users:
        tags = user.get("Labels") or {}
        if tags.get(LABEL_SESSION) == session:
            continue
        if tags.get(LABEL) == "1" and owner_alive(tags.get(LABEL_OWNER, "")) is False:
            continue
        return user
    return None


def remove_volume(client: Any, name: str) -> bool:
    """Remove the named docker volume; False when it was already gone (a container still
    using it is an ``AoeError``: the caller removes the container first)."""
    import docker.errors

    try:
        client.api.remove_volume(name, force=True)
        return True
    except docker.errors.NotFound:
        return False
    except Exception as exc:  # noqa: BLE001 - the engine's refusal or a lost connection alike
        raise AoeError(f"could not remove work volume {name}: {exc}") from exc


def remove(client: Any, container_id: str) -> bool:
    """Force-remove a container (its tmpfs goes with it); False when it was already gone.

    Processes throttled by a parking quota die slowly, and the engine gives up waiting for
    them ("did not receive an exit event"): then lift the quota, thaw, and try again.
    """
    import docker.errors

    for attempt in range(3):
        try:
            client.api.remove_container(container_id, force=True, v=True)
            return True
        except docker.errors.NotFound:
            return False
        except docker.errors.APIError as exc:
            if "already in progress" in str(exc):
                return True
            if attempt == 2:
                raise AoeError(f"could not remove container {container_id[:12]}: {exc}") from exc
            with contextlib.suppress(docker.errors.APIError):
                client.api.update_container(container_id, cpu_quota=-1)
            thaw(client, container_id)
    return False


def thaw(client: Any, container_id: str) -> None:
    """Thaw a parked container that this process did not park (an orphan, the reaper's): a
    frozen process cannot die on some kernels. Its freezer is written directly when the engine
    is local (docker does not know of that freeze, and runc then refuses to pause or unpause);
    ``docker unpause`` covers a container parked by ``docker pause``. Its action cgroup is
    thawed too, first: a manager killed between a kill's freeze and its thaw left it frozen,
    and v1's frozen processes do not die of SIGKILL (every removal failed). Best effort."""
    import docker.errors

    from tangram.exec.aoe.cgroups import FREEZER_DIR, FREEZERS, container_cgroup_dirs
    from tangram.exec.aoe.kill import GROUP_NAME

    with contextlib.suppress(docker.errors.APIError):
        client.api.unpause(container_id)
    try:
        st = state(client, container_id) or {}
    except Exception as exc:  # noqa: BLE001 - best effort: raised, it ended the removal's retries
        log.warning("could not inspect container %s to thaw it: %s", container_id[:12], exc)
        return
    pid = local_pid(int(st.get("Pid") or 0), container_id) if st.get("Pid") else None
    if pid is None:
        return
    with contextlib.suppress(AoeError, OSError):
        # Its id in the path (else AoeError): the init may have died since ``local_pid`` saw
        # it, its pid given to a host process, whose frozen cgroup was thawed here.
        version, dirs = container_cgroup_dirs(pid, container_id)
        directory = dirs.get(FREEZER_DIR[version])
        if directory is not None:
            with contextlib.suppress(AoeError, OSError):  # (none made: no action ran)
                FREEZERS[version].thaw(directory / GROUP_NAME)
            FREEZERS[version].thaw(directory)


def state(client: Any, container_id: str) -> dict[str, Any] | None:
    """The container's ``State`` (Running, ExitCode, OOMKilled, Pid...), None when gone."""
    import docker.errors

    try:
        return client.api.inspect_container(container_id)["State"]
    except docker.errors.NotFound:
        return None


def describe_death(st: dict[str, Any] | None) -> str:
    if st is None:
        return "it was removed"
    parts = [f"status {st.get('Status')}", f"exit code {st.get('ExitCode')}"]
    if st.get("OOMKilled"):
        parts.append("killed by the out-of-memory killer")
    if st.get("Error"):
        parts.append(str(st["Error"]))
    return ", ".join(parts)


@dataclass(frozen=True)
class Listed:
    """A container as the engine's list gives it: its id, name and labels."""

    id: str
    name: str
    labels: dict[str, str]


def session_containers(client: Any, session: str | None = None) -> list[Listed]:
    """Containers made by AOE managers (all, or one session's), running or not, from one
    call of the engine's list. The SDK's ``containers.list`` inspects each container it
    lists, and one removed in between (by another manager, a reaper: AOE's own churn) failed
    it with NotFound; five tries in a row failed under the churn of managers side by side,
    and the NotFound came out of a new manager's constructor (its orphan sweep)."""
    label = f"{LABEL_SESSION}={session}" if session else LABEL
    return [
        Listed(
            row["Id"],
            next(iter(row.get("Names") or ()), row["Id"][:12]).lstrip("/"),
            dict(row.get("Labels") or {}),
        )
        for row in client.api.containers(all=True, filters={"label": label})
    ]


def remove_orphans(client: Any) -> list[str]:
    """Remove AOE containers whose owning process on this host is gone; their names. One the
    engine will not remove is logged and the sweep goes on: raised, it left the later orphans
    and came out of every new manager's constructor while that container stuck."""
    removed = []
    for container in session_containers(client):
        owner = container.labels.get(LABEL_OWNER, "")
        if owner_alive(owner) is False and remove_logged(client, container.id, container.name):
            removed.append(container.name)
    if removed:
        log.warning(
            "removed %d orphaned AOE container(s) of dead managers: %s",
            len(removed),
            ", ".join(removed),
        )
    return removed


def remove_logged(client: Any, container_id: str, name: str) -> bool:
    """``remove``, whose failure (the engine's refusal, a lost connection) is logged, not
    raised, for sweeps that must go on to the next container; whether it was removed."""
    try:
        return remove(client, container_id)
    except Exception as exc:  # noqa: BLE001 - AoeError or the engine's own errors
        log.warning("container %s could not be removed: %s", name, exc)
        return False
