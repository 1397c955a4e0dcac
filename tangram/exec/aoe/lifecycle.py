"""A trajectory's container from its making to its removal: named and labelled from a
``Blueprint``, created sandboxed, its runner warmed up, parked; retired (or discarded unused)
at the end; and noticed when it dies. The manager holds the locks; this module does the work.

The seams: ``container_name`` and ``labels`` are the one place a container's identity is
decided; ``Lifecycle.start`` the one place one is made (with a warm pool, ``pool.py``, it hands
out a parked one of the same image, memory and sandbox when there is one); ``retire`` the one
place one that served actions goes (a pooled one goes back to the pool, which resets it in the
background or removes it, never reuses it dirty) and ``discard`` one that never served.
"""

from __future__ import annotations

import contextlib
import hashlib
import logging
import math
import numbers
import time
from dataclasses import dataclass, replace
from pathlib import Path
from typing import TYPE_CHECKING, Any

from tangram.exec.aoe import containers, guarded
from tangram.exec.aoe.cgroups import CpuControl, DockerUpdate, direct_control
from tangram.exec.aoe.config import MAX_MEMORY_GB, AoeConfig, SandboxConfig
from tangram.exec.aoe.errors import AoeError
from tangram.exec.aoe.kill import ActionGroup, action_group
from tangram.exec.aoe.pool import PoolKey, PoolStats, WarmPool
from tangram.exec.aoe.records import ContainerHandle
from tangram.exec.aoe.reset import KEEPER_USER, reset
from tangram.exec.aoe.topology import NumaTopology
from tangram.exec.aoe.transport import ActionRequest, ExecTransport, RunnerTransport

if TYPE_CHECKING:
    from tangram.exec.aoe.ledger import CoreLedger

log = logging.getLogger(__name__)

Transport = ExecTransport | RunnerTransport

#: The transports by ``AoeConfig.transport``.
TRANSPORTS: dict[str, type[Transport]] = {"runner": RunnerTransport, "exec": ExecTransport}

#: How much of a trajectory id a container's name shows (the hash makes it unique).
NAME_PREFIX_CHARS = 24

#: What a pool container's trajectory label says while it waits for one.
POOL_TRAJ = "(warm pool)"

#: The action that proves a new container's runner answers (while it is not yet parked).
_WARM_UP = ActionRequest("warm-up", "true", {}, 30.0, 1024)


@dataclass(frozen=True)
class Blueprint:
    """What a trajectory's container is made from; ``recreate`` makes the next generation."""

    traj_id: str
    image: str
    memory_gb: float
    sandbox: SandboxConfig
    #: How many containers this trajectory has had, this one included, counting the
    #: recreates that failed (each tries a generation, so a name of its own).
    generation: int = 1

    def next_generation(self, after: int = 0) -> Blueprint:
        """The same container again, one generation on (for a trajectory whose container died);
        ``after``: the last generation already tried (a failed recreate's), to go past it."""
        return replace(self, generation=max(self.generation, after) + 1)


@dataclass
class Container:
    """One live container: its handle, grant mechanism and transport. Mutable: the transport
    reconnects, and ``dead`` records why the container stopped once that is noticed."""

    blueprint: Blueprint
    handle: ContainerHandle
    control: CpuControl
    transport: Transport
    #: Where an action's processes are kept, so its kill takes them all and nothing else.
    group: ActionGroup
    #: Host pid of the container's init when the engine is local (None otherwise).
    init_pid: int | None
    dead: str | None = None
    #: The warm pool's key when the container belongs to the pool (goes back there at retire).
    pool_key: PoolKey | None = None
    #: Its runner runs from the exec-only shell (``guarded.py``): a reset may keep it.
    guarded_runner: bool = False


def container_name(session: str, blueprint: Blueprint) -> str:
    """The engine-wide name of a blueprint's container: session, trajectory, generation.

    Unique by construction: the trajectory is named by a readable prefix of its id *and* a hash
    of the whole id, so ids that read alike once made "safe" (``a!``/``a?``, two CJK ids) or
    that differ past the prefix still get two names. The full id is in a label."""
    readable = containers.safe_name(blueprint.traj_id)[:NAME_PREFIX_CHARS]
    return (
        f"tangram-aoe-{session[:8]}-{readable}-{id_digest(blueprint.traj_id)}"
        f"-{blueprint.generation}"
    )


def trajectory_volume(blueprint: Blueprint) -> str | None:
    """The trajectory's own work volume (``work_volume``-<digest>), or None without one: one
    name set on the manager's sandbox must not give every trajectory the same files. It lasts
    across the trajectory's ``recreate``s and is removed when the trajectory closes."""
    base = blueprint.sandbox.work_volume
    return None if not base else f"{base}-{id_digest(blueprint.traj_id)}"


def id_digest(traj_id: str) -> str:
    """64 bits of SHA-256 of the id: a collision is as likely as two random 64-bit draws
    agreeing, and even then ``containers.create`` refuses rather than takes the name."""
    return hashlib.sha256(traj_id.encode("utf-8", "surrogatepass")).hexdigest()[:16]


def labels(session: str, blueprint: Blueprint) -> dict[str, str]:
    """The labels that say whose a container is (the orphan sweep and the reaper read them)."""
    return {
        containers.LABEL: "1",
        containers.LABEL_SESSION: session,
        containers.LABEL_OWNER: containers.owner_label(),
        containers.LABEL_TRAJ: blueprint.traj_id,
    }


def park(container: Container) -> None:
    """Park a container after an action: frozen, on the parking quota. One whose init has
    exited is thawed instead: runc takes a frozen cgroup for a paused container, and the
    engine would never delete a dead one (its cgroups would be left behind)."""
    cid = container.handle.container_id
    if container.init_pid is not None and not containers.init_running(container.init_pid, cid):
        with contextlib.suppress(AoeError):
            container.control.unthrottle()
        return
    container.control.park()


def keeper_user(sandbox: SandboxConfig) -> str | None:
    """The uid:gid of a new unpooled container's init and keeper: ``KEEPER_USER``, except for
    a root sandbox that gives capabilities back under ``no-new-privileges`` (None: the
    sandbox's own user). There, an exec as root into a container of a non-root user gets no
    capability at all (CapEff 0), so ``cap_add`` and ``drop_all_capabilities=False``, the
    documented relaxations, did nothing; such a sandbox's root actions are not kept from
    init and the keeper (both relaxations are logged)."""
    gives_back = bool(sandbox.cap_add) or not sandbox.drop_all_capabilities
    if sandbox.runs_as_root and gives_back and sandbox.no_new_privileges:
        return None
    return KEEPER_USER


def warm_up(transport: Transport, name: str) -> None:
    """Start the runner and see it answer, while the new container is not yet parked."""
    if not isinstance(transport, RunnerTransport):
        return  # one exec per action: nothing runs between actions
    result = transport.run(_WARM_UP, lambda why: None)
    if result.exit_code != 0:
        raise AoeError(
            f"the runner shell of {name} did not start ({result.ended}, exit "
            f"{result.exit_code}): {result.stderr.decode(errors='replace').strip()}"
        )


class Lifecycle:
    """Makes, retires and watches the containers of one manager session."""

    def __init__(
        self,
        config: AoeConfig,
        client: Any,
        topology: NumaTopology,
        session: str,
        ledger: CoreLedger | None = None,
    ) -> None:
        self.config = config
        self.client = client
        self.topology = topology
        self.session = session
        self._warned_fallback = False
        #: The warm pool: on when configured, with a runner (resets run on idle cycles of
        #: the node's cores, at the lowest weight). ``ledger`` is accepted for callers that
        #: pass it; resets hold no core in it.
        self.pool: WarmPool | None = None
        #: Sandboxes whose containers were said not to be pooled (``pool_key``), once each.
        self._unpooled_told: set[SandboxConfig] = set()
        if config.warm_pool.enabled and config.transport == "runner":
            cores = tuple(topology.cores)
            self.pool = WarmPool(
                config.warm_pool,
                self._create_pooled,
                lambda c: reset(c, cores),
                self._remove,
                alive=self._alive,
            )

    def blueprint(
        self,
        traj_id: str,
        memory_gb: float | None,
        image: str | None,
        sandbox: SandboxConfig | None,
    ) -> Blueprint:
        """A new trajectory's blueprint, the manager's defaults filled in; a relaxed sandbox is
        logged; a memory size that is not positive, an image that is no name or a sandbox that is
        no ``SandboxConfig`` raises ``AoeError`` naming it."""
        if sandbox is not None and not isinstance(sandbox, SandboxConfig):
            raise AoeError(
                f"sandbox of trajectory {traj_id!r} must be a SandboxConfig, "
                f"got {type(sandbox).__name__}"
            )
        if image is not None and (not isinstance(image, str) or not image):
            raise AoeError(  # ("" was taken for no image: the default, silently)
                f"image of trajectory {traj_id!r} must be an image name (a non-empty string), "
                f"got {type(image).__name__} {image!r}"
            )
        if sandbox is not None and sandbox.relaxations():
            log.warning(
                "sandbox of trajectory %s relaxed: %s", traj_id, "; ".join(sandbox.relaxations())
            )
        mem = self.config.memory_gb if memory_gb is None else memory_gb
        if (
            isinstance(mem, bool)
            or not isinstance(mem, numbers.Real)
            or not (mem > 0 and math.isfinite(mem))  # NaN fails it too
            or mem > MAX_MEMORY_GB  # (1e15 failed at the engine, naming no setting)
        ):
            raise AoeError(
                f"memory_gb of trajectory {traj_id!r} must be a positive finite number, at "
                f"most {MAX_MEMORY_GB}, got {mem!r}"
            )
        return Blueprint(traj_id, image or self.config.image, mem, sandbox or self.config.sandbox)

    def pool_key(self, blueprint: Blueprint) -> PoolKey | None:
        """The blueprint's key in the warm pool, None when it is not pooled."""
        if self.pool is None:
            return None
        why = WarmPool.unpooled_because(blueprint.sandbox)
        if why is not None:
            if blueprint.sandbox not in self._unpooled_told:  # (once per sandbox)
                self._unpooled_told.add(blueprint.sandbox)
                log.warning("warm pool: containers of this sandbox are not pooled: %s", why)
            return None
        return PoolKey(blueprint.image, blueprint.memory_gb, blueprint.sandbox)

    def start(self, blueprint: Blueprint) -> Container:
        """The blueprint's container, parked: a warm one from the pool when one fits, else a
        new one (created, runner warmed up, parked; nothing left behind when a step fails)."""
        key = self.pool_key(blueprint)
        if key is None or self.pool is None:
            # Every container, pooled or not: init and keeper under another uid than the
            # actions' (no action can open their stdout, signal or ptrace them), and the
            # runner from the exec-only shell (non-dumpable: no action can read its memory,
            # its stdin or write its stdout, to forge a later action's output and exit code).
            return self._make(
                blueprint,
                container_name(self.session, blueprint),
                labels(self.session, blueprint),
                keeper_user(blueprint.sandbox),
                guarded.host_shell(),
            )
        found = self.pool.take(key)
        # Counted busy from the take on: an interrupt (a KeyboardInterrupt) before the
        # container was handed out lost it, running, and kept it counted busy (the key's
        # target one too high) for good; it goes back to the pool instead.
        try:
            if found is None:
                found = self._create_pooled(key)
            found.blueprint = blueprint
            found.handle = replace(
                found.handle, traj_id=blueprint.traj_id, generation=blueprint.generation
            )
            return found
        except BaseException:
            if found is None:
                self.pool.untake(key)
            else:
                self.retire(found)  # (reset in the background, or removed if dead)
            raise

    def prewarm(self, blueprint: Blueprint, count: int) -> bool:
        """Have ``count`` parked containers of the blueprint's kind made in the background;
        False when there is no pool for it."""
        key = self.pool_key(blueprint)
        if key is None or self.pool is None:
            return False
        self.pool.prewarm(key, count)
        return True

    def pool_stats(self) -> PoolStats | None:
        return None if self.pool is None else self.pool.stats()

    def _alive(self, container: Container) -> bool:
        """Whether a parked container still runs: its init in this machine's /proc when the
        engine is local (microseconds), else the engine's word."""
        if container.dead is not None:
            return False
        if container.init_pid is not None:
            return containers.init_running(container.init_pid, container.handle.container_id)
        try:
            st = containers.state(self.client, container.handle.container_id)
        except Exception:  # noqa: BLE001 - an engine that cannot tell: not handed out
            return False
        return st is not None and bool(st.get("Running"))

    def _create_pooled(self, key: PoolKey) -> Container:
        """A new container that belongs to the warm pool (named and labelled as the pool's)."""
        assert self.pool is not None
        blueprint = Blueprint(POOL_TRAJ, key.image, key.memory_gb, key.sandbox)
        name = f"tangram-aoe-{self.session[:8]}-{self.pool.next_name()}"
        made = self._make(
            blueprint, name, labels(self.session, blueprint), KEEPER_USER, guarded.host_shell()
        )
        made.pool_key = key
        return made

    def _make(
        self,
        blueprint: Blueprint,
        name: str,
        tags: dict[str, str],
        keeper: str | None = None,
        shell: Path | None = None,
    ) -> Container:
        """Create, warm up and park a container; ``keeper``: the uid of its init and keeper
        process; ``shell``: the host's exec-only shell for its runner (``guarded.py``)."""
        cfg = self.config
        sandbox = blueprint.sandbox
        volume = trajectory_volume(blueprint)
        if volume is not None:
            sandbox = replace(sandbox, work_volume=volume)
        spec = containers.ContainerSpec(
            name=name,
            image=blueprint.image,
            memory_gb=blueprint.memory_gb,
            sandbox=sandbox,
            cpu_period_us=cfg.cfs_period_us,
            start_quota_us=cfg.cfs_period_us * len(self.topology.cores),
            park_cores=self.topology.cores,
            use_init=cfg.use_init,
            labels=tags,
            keeper_user=keeper,
            read_only_binds=((str(shell), guarded.MOUNT),) if shell is not None else (),
        )
        made = containers.create(self.client, spec)
        try:
            if volume is not None:  # looked at once ours is made: two opens at once see each other
                self._refuse_shared(volume)
            pid = int(made.attrs["State"]["Pid"])
            control = self._control(made.id, pid)
            handle = ContainerHandle(
                blueprint.traj_id,
                made.id,
                name,
                blueprint.image,
                blueprint.memory_gb,
                blueprint.generation,
            )
            sb = blueprint.sandbox
            init_pid = containers.local_pid(pid, made.id)
            user = containers.exec_user(self.client, made.attrs["Image"], sb.user)
            if not sb.user:  # (the relaxation logged could not say whose: only the image knows)
                log.info(
                    "sandbox of trajectory %s runs as the image's user %r%s",
                    blueprint.traj_id,
                    user,
                    " (root: the image names none)" if user == "0" else "",
                )
            group = action_group(self.client, made.id, init_pid, user, control.pids)
            transport = TRANSPORTS[cfg.transport](
                self.client.api, made.id, user, sb.work_dir, cfg.kill_grace_s, group
            )
            if shell is not None:  # the runner, or each exec's launcher: non-dumpable
                transport.shell = guarded.shell_command()
            warm_up(transport, name)
            control.park()
        except Exception as exc:
            # Dead already (a step's error, the engine's bare 409, said only that the container
            # was not running): said so, with its log, read before it is removed.
            died = containers.death_of(made, name)
            containers.remove_logged(self.client, made.id, name)
            if died is not None:
                raise died from exc
            if isinstance(exc, AoeError):
                raise
            raise AoeError(
                f"container {name} could not be set up: {type(exc).__name__}: {exc}"
            ) from exc
        except BaseException:
            # Logged if it fails: raised, its error replaced the step's, which said why.
            containers.remove_logged(self.client, made.id, name)
            raise
        return Container(
            blueprint,
            handle,
            control,
            transport,
            group,
            init_pid,
            guarded_runner=shell is not None and isinstance(transport, RunnerTransport),
        )

    def _refuse_shared(self, volume: str) -> None:
        """``AoeError`` when another live manager's container mounts the trajectory's work
        volume. Its name has no session in it (a restarted service finds its files), so two
        services on one host with one ``work_volume`` would give their trajectories of the
        same id one /work: each would read and overwrite the other's files."""
        holder = containers.foreign_volume_user(self.client, volume, self.session)
        if holder is not None:
            names = ",".join(n.lstrip("/") for n in holder.get("Names") or ()) or "?"
            raise AoeError(
                f"work volume {volume} is in use by container {names} "
                f"({containers.describe_owner(holder.get('Labels') or {})}): another manager "
                "has a trajectory of this id on the same work_volume; give each service a "
                "work_volume of its own"
            )

    def _control(self, container_id: str, pid: int) -> CpuControl:
        """Direct cgroup writes when possible; ``docker update`` as asked, or as the fallback."""
        cfg = self.config
        args = (cfg.cfs_period_us, cfg.park_quota_us, self.topology.cores)
        if cfg.cgroup_mode == "docker":
            return DockerUpdate(self.client.api, container_id, *args)
        try:
            return direct_control(pid, *args, container_id=container_id)
        except AoeError as exc:
            if cfg.cgroup_mode == "direct":
                raise
            if not self._warned_fallback:
                log.warning("AOE falls back to docker update (milliseconds per grant): %s", exc)
                self._warned_fallback = True
            return DockerUpdate(self.client.api, container_id, *args)

    def retire(self, container: Container) -> None:
        """A container that served its trajectory: back to the warm pool (reset there in the
        background) when it is the pool's and alive, else removed, quota lifted first so its
        processes can die promptly."""
        key = container.pool_key
        if key is not None and self.pool is not None:
            if container.dead is None:
                self.pool.give_back(key, container)
                return
            self.pool.untake(key)
        self._remove(container)

    def remove_volume(self, container: Container) -> None:
        """Remove the trajectory's work volume, if it has one (its trajectory closed)."""
        volume = trajectory_volume(container.blueprint)
        if volume is not None:
            containers.remove_volume(self.client, volume)

    def discard(self, container: Container) -> None:
        """A container that never ran an action (its trajectory lost a race at open)."""
        self.retire(container)

    def _remove(self, container: Container) -> None:
        container.transport.close()
        container.group.close()
        with contextlib.suppress(AoeError):
            container.control.unthrottle()
        containers.remove(self.client, container.handle.container_id)

    def close_pool(self) -> None:
        """Stop the warm pool and remove its parked containers (at the manager's shutdown)."""
        if self.pool is not None:
            self.pool.close()

    def remove_leftovers(self) -> None:
        """Remove whatever container of this session is still in the engine; one the engine
        will not remove is logged and the sweep goes on (it stopped there, the later ones
        left to the watchdog, or for ever without one)."""
        for leftover in containers.session_containers(self.client, self.session):
            containers.remove_logged(self.client, leftover.id, leftover.name)

    def mark_dead(self, container: Container, suspect: bool = False) -> str | None:
        """If the container is no longer running, remember why (and return it).

        ``suspect``: a stream ended without an answer, so the container probably died; the
        engine may not know yet, so look for up to a second (the init process's exit, seen in
        this machine's /proc, settles it at once).
        """
        deadline = time.monotonic() + (1.0 if suspect else 0.0)
        while True:
            st = containers.state(self.client, container.handle.container_id)
            init_gone = container.init_pid is not None and not containers.init_running(
                container.init_pid, container.handle.container_id
            )
            running = st is not None and bool(st.get("Running"))
            if not running or init_gone:
                break
            if time.monotonic() >= deadline:
                return None
            time.sleep(0.05)
        why = containers.describe_death(st) if not running else "its init process exited"
        container.dead = f"container {container.handle.short_id} died: {why}"
        container.transport.close()
        with contextlib.suppress(AoeError):  # never leave a dead container frozen (see park)
            container.control.unthrottle()
        return container.dead
