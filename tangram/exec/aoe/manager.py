"""``AoeManager``: Allocate-on-Execution for CPU, one Docker container per trajectory.

A trajectory's container lives from ``open_trajectory`` to ``close_trajectory`` and keeps its
memory, files and background processes all that time, but it holds CPU only while one of its
actions runs: between actions it is parked (frozen, on a 1%-of-a-core quota). ``run_action``
takes the cores (waiting, first come first served, if another action holds them), writes the
grant into the container's cgroup, runs the command, and revokes the grant however it ended.

This class is the front: it holds the locks and wires the parts. ``lifecycle`` makes, retires
and watches containers; ``execution`` carries an action through cores, grant, run and revoke;
``judge`` (pure) decides what the action's end means; ``kill`` ends one action's processes;
``reaper`` is the watchdog; the ``CoreLedger`` says which action holds which core.

Blocking and thread-safe: the live runtime calls it from worker threads. Actions of one
trajectory run one at a time (a lock per trajectory); actions of different trajectories run
in parallel on disjoint cores.
"""

from __future__ import annotations

import atexit
import contextlib
import logging
import subprocess
import threading
import time
import uuid
import weakref
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from tangram.exec.aoe import containers, environment, reaper
from tangram.exec.aoe.cgroups import CpuControl
from tangram.exec.aoe.config import AoeConfig, SandboxConfig
from tangram.exec.aoe.errors import AoeError, UnknownTrajectory
from tangram.exec.aoe.execution import ActionRunner, OnGrant, check_deadline, plan_action
from tangram.exec.aoe.images import connect
from tangram.exec.aoe.ledger import CoreLedger
from tangram.exec.aoe.lifecycle import Blueprint, Container, Lifecycle
from tangram.exec.aoe.pool import PoolStats, prewarm_count
from tangram.exec.aoe.records import ActionOutcome, ContainerHandle, GrantRecord
from tangram.exec.aoe.topology import NumaTopology, as_topology, read_host_topology

log = logging.getLogger(__name__)


@dataclass
class Trajectory:
    """An open trajectory: its current container (replaced by ``recreate``) and the lock its
    actions, close and recreate take in turn. Mutable, guarded by ``lock``."""

    container: Container
    lock: threading.Lock = field(default_factory=threading.Lock)
    closed: bool = False
    #: Why the trajectory has no container: a ``recreate`` retired ``container`` (a pooled
    #: one is then the pool's, soon another trajectory's) and could not start a new one. Its
    #: actions are refused and its close retires nothing until a recreate succeeds.
    retired: str | None = None
    #: The last generation a recreate tried (0: none yet). Each try takes a generation of
    #: its own, so a container a failed try left in the engine (its removal failed too) never
    #: holds the name a later try asks for: all of them were refused 'already taken'.
    tried: int = 0


class AoeManager:
    """CPU executor: containers per trajectory, cores per action.

    ``AoeManager(config)`` connects to the engine (``EngineUnavailable`` if none answers),
    removes containers of dead managers, and starts the crash watchdog. Use it as a context
    manager, or call ``shutdown()``; containers are also removed at interpreter exit and, if
    the process is killed, by the watchdog.
    """

    #: Opens and recreates past their check that the manager is open, one token each
    #: (replaced whole, never changed in place): the shutdown leaves its watchdog's release
    #: to the last of them (``_start_in_flight``).
    _in_flight: frozenset[object] = frozenset()
    #: The shutdown has swept (its watchdog released, or left to the last start in flight).
    _swept: bool = False
    _reaper: subprocess.Popen[bytes] | None = None

    def __init__(self, config: AoeConfig | None = None, *, client: Any = None) -> None:
        self.config = config or AoeConfig()
        if client is None:
            client = connect(self.config.docker_base_url)
        else:  # a caller's client gets the one pool too (engine_pool.py says why)
            from tangram.exec.aoe.engine_pool import share_one_pool

            share_one_pool(client)
        self.client = client
        self.topology: NumaTopology = (
            as_topology(self.config.topology) if self.config.topology else read_host_topology()
        )
        self.ledger = CoreLedger(self.topology)
        self.session = uuid.uuid4().hex
        self._containers = Lifecycle(
            self.config, self.client, self.topology, self.session, self.ledger
        )
        self._actions = ActionRunner(self.client, self.ledger, self._containers)
        self._trajs: dict[str, Trajectory] = {}
        #: Closed trajectories whose work volume could not be removed (still in use: the
        #: container outlived its retire), by id: a reopen removes it first or is refused, so a
        #: new trajectory never mounts a closed one's files.
        self._stale_volumes: dict[str, Container] = {}
        #: Trajectories whose close could not remove their container, or whose open failed
        #: (its container perhaps not removed): the last generation they named, by id. Such a
        #: container stays under that name (until the shutdown's sweep), so a reopen goes past
        #: it: at generation 1 every reopen was refused 'already taken'.
        self._left_generation: dict[str, int] = {}
        self._lock = threading.Lock()  # guards _trajs and _action_seq
        self._closed = False
        self._action_seq = 0
        self._reaper: subprocess.Popen[bytes] | None = None
        if self.config.cleanup_orphans:
            containers.remove_orphans(self.client)
        if self.config.sandbox.relaxations():
            log.warning(
                "AOE default sandbox relaxed: %s", "; ".join(self.config.sandbox.relaxations())
            )
        if self.config.reaper:
            self._reaper = reaper.spawn(self.session, self.config.docker_base_url)
        atexit.register(_shutdown_ref, weakref.ref(self))

    def __enter__(self) -> AoeManager:
        return self

    def __exit__(self, *exc: object) -> None:
        self.shutdown()

    # -- trajectories ---------------------------------------------------------------------

    def open_trajectory(
        self,
        traj_id: str,
        memory_gb: float | None = None,
        *,
        image: str | None = None,
        sandbox: SandboxConfig | None = None,
    ) -> ContainerHandle:
        """Create the trajectory's container (sandboxed, parked) and return its handle.

        ``sandbox`` overrides the manager's default for this task; any relaxation is logged.
        """
        problem = traj_id_problem(traj_id)
        if problem is not None:
            raise AoeError(problem)
        if self._closed:
            raise AoeError("the AOE manager is shut down")
        with self._lock:
            if traj_id in self._trajs:
                raise AoeError(
                    f"trajectory {traj_id!r} already has a container "
                    f"({self._trajs[traj_id].container.handle.short_id})"
                )
            stale = self._stale_volumes.get(traj_id)
        if stale is not None:
            try:
                self._containers.remove_volume(stale)
            except AoeError as exc:
                raise AoeError(
                    f"trajectory {traj_id!r} cannot be opened again yet: the work volume of its "
                    f"earlier close is still there ({exc}); it would hold the closed trajectory's "
                    "files"
                ) from exc
            with self._lock:
                self._stale_volumes.pop(traj_id, None)
        blueprint = self._containers.blueprint(traj_id, memory_gb, image, sandbox)
        with self._lock:
            left = self._left_generation.get(traj_id)
        if left is not None:
            blueprint = blueprint.next_generation(after=left)
        with self._start_in_flight():
            try:
                container = self._containers.start(blueprint)
            except BaseException:
                # A container that failed to start and could not be removed keeps its name
                # (logged by the lifecycle): the next open of the id goes past it.
                with self._lock:
                    self._left_generation[traj_id] = max(
                        blueprint.generation, self._left_generation.get(traj_id, 0)
                    )
                raise
            try:
                with self._lock:
                    why = (
                        "the AOE manager was shut down while it was opened"
                        if self._closed
                        else "it was opened twice at once"
                        if traj_id in self._trajs
                        else None
                    )
                    if why is None:
                        self._trajs[traj_id] = Trajectory(container)
                        return container.handle
                raise AoeError(f"trajectory {traj_id!r} cannot be opened: {why}")
            except BaseException:
                # Not handed over (lost a race, or an interrupt: a KeyboardInterrupt between
                # the start and the books): discarded, and the next open of the id goes past
                # its generation, which a failed removal leaves taken. An interrupt here left
                # it running, unknown, its name refusing every reopen 'already taken'.
                self._unopened(traj_id, blueprint, container)
                raise

    @contextlib.contextmanager
    def _start_in_flight(self) -> Iterator[None]:
        """Around an open's or a recreate's start until its container is handed over or
        discarded: ``AoeError`` when the manager is shut down, else counted, and the
        shutdown's watchdog released only once none is in flight (by the last one). Released
        at the shutdown, a container such a start made after the shutdown's sweep and then
        failed to discard (the engine refused the removal) stayed for good."""
        token = object()
        # Counted inside the try: counted before it, an interrupt (a KeyboardInterrupt) as
        # the lock was let go kept the count up for good, and the shutdown's watchdog was
        # never released. A token's removal is a no-op when it was never counted.
        try:
            with self._lock:
                if self._closed:
                    raise AoeError("the AOE manager is shut down")
                self._in_flight = self._in_flight | {token}
            yield
        finally:
            with self._lock:
                self._in_flight = self._in_flight - {token}
                watchdog = self._reaper if self._swept and not self._in_flight else None
                if watchdog is not None:
                    self._reaper = None
            reaper.release(watchdog)  # it sweeps what a failed discard left

    def _unopened(self, traj_id: str, blueprint: Blueprint, container: Container) -> None:
        """Discard ``container``, started for ``traj_id`` and not handed over (unless the
        trajectory holds it after all); its removal's failure is logged."""
        with self._lock:
            traj = self._trajs.get(traj_id)
            if traj is not None and traj.container is container:
                return  # (interrupted after the books took it: it is the trajectory's)
            self._left_generation[traj_id] = max(
                blueprint.generation, self._left_generation.get(traj_id, 0)
            )
        self._discard_quietly(container)

    def _discard_quietly(self, container: Container) -> None:
        """Discard a container that was never the trajectory's; its removal's failure is
        logged (raised, it hid why the container was not taken)."""
        try:
            self._containers.discard(container)
        except Exception as exc:  # noqa: BLE001 - AoeError or the engine's own errors
            log.warning(
                "container %s, never a trajectory's, was not removed: %s",
                container.handle.short_id,
                exc,
            )

    def close_trajectory(self, traj_id: str) -> None:
        """Remove the trajectory's container (after its running action, if any, ends) and its
        work volume, if it has one (its files go with it, as a tmpfs work dir's do)."""
        traj = self._get(traj_id)
        with traj.lock:
            self._check_open(traj)
            traj.closed = True
            try:
                if traj.retired is None:  # (else a failed recreate retired it already)
                    self._containers.retire(traj.container)
            except BaseException:
                with self._lock:  # its name may stay taken: a reopen goes past it
                    self._left_generation[traj_id] = max(
                        traj.tried, traj.container.blueprint.generation
                    )
                raise
            finally:
                # Before the id is free again: a trajectory reopened under it would mount the
                # same volume (its name is the id's), with the closed one's files in it. Tried
                # even when the retire raised: the volume would otherwise stay on the host disk.
                try:
                    self._containers.remove_volume(traj.container)
                except AoeError as exc:  # the trajectory is closed either way
                    log.warning("%s (closing trajectory %r)", exc, traj_id)
                    with self._lock:
                        self._stale_volumes[traj_id] = traj.container
                finally:
                    with self._lock:
                        self._trajs.pop(traj_id, None)

    def recreate(self, traj_id: str) -> ContainerHandle:
        """Replace the trajectory's container with a fresh one (same image, memory, sandbox).

        For a trajectory whose container died; its files and processes are gone (unless the
        sandbox's ``work_volume`` kept the work dir).
        """
        traj = self._get(traj_id)
        with traj.lock:
            self._check_open(traj)  # (a shutdown while we waited closed it)
            if traj.retired is None:
                # From the retire on the old container is not the trajectory's (a pooled one
                # is reset and handed to the next trajectory): never used again, even when
                # no new one can be started below. Said before the retire: said after it, an
                # interrupt (a KeyboardInterrupt) in between left the trajectory running its
                # actions in a container the pool gave another trajectory. (Interrupted
                # before the retire runs, the old container stays until the shutdown's sweep.)
                traj.retired = (
                    f"trajectory {traj_id!r} has no container: a recreate retired container "
                    f"{traj.container.handle.short_id} and could not start a new one; call "
                    "recreate() again"
                )
                try:
                    self._containers.retire(traj.container)
                except Exception:
                    traj.retired = None  # not retired (its removal failed): still the trajectory's
                    raise
            # Same trajectory, same lock: actions waiting on it now run in the new container.
            blueprint = traj.container.blueprint.next_generation(after=traj.tried)
            traj.tried = blueprint.generation
            with self._start_in_flight():
                fresh = self._containers.start(blueprint)
                try:
                    self._put_in_place(traj, fresh)
                except BaseException:
                    # A shutdown meanwhile, or an interrupt (a KeyboardInterrupt) before it
                    # was in place, which left it running, nobody's, until the shutdown's
                    # sweep (a pooled one counted busy for good).
                    if traj.container is fresh:
                        traj.retired = None  # (in place, interrupted before this was said)
                    else:
                        self._discard_quietly(fresh)
                    raise
        return fresh.handle

    def _put_in_place(self, traj: Trajectory, fresh: Container) -> None:
        """Make ``fresh`` the trajectory's container, unless the manager was shut down while it
        was made: the shutdown then passed this trajectory by (its old container retired, the
        new one not yet in place) and released the reaper, so ``AoeError`` is raised (and
        ``recreate`` discards ``fresh``). Checked and set under ``_lock``, where ``shutdown`` sets
        ``_closed``: either the shutdown finds ``fresh`` in place, or this finds it closed."""
        with self._lock:
            live = not self._closed
            if live:
                traj.container = fresh
                traj.retired = None
        if not live:  # (``recreate`` discards it)
            raise AoeError(
                f"the AOE manager was shut down while trajectory "
                f"{fresh.blueprint.traj_id!r} was recreated"
            )

    def prewarm(
        self,
        count: int,
        *,
        image: str | None = None,
        memory_gb: float | None = None,
        sandbox: SandboxConfig | None = None,
    ) -> bool:
        """Have ``count`` parked containers of this kind made in the background for the warm
        pool (``AoeConfig.warm_pool``); False when there is no pool for it. A ``count`` that is
        no whole number from 0 is an ``AoeError`` naming it, pool or not, and so is a prewarm
        once the manager is shut down (its pool closed, nothing is made: True said it was)."""
        count = prewarm_count(count)
        if self._closed:
            raise AoeError("the AOE manager is shut down: nothing can be prewarmed")
        blueprint = self._containers.blueprint("(prewarm)", memory_gb, image, sandbox)
        return self._containers.prewarm(blueprint, count)

    def pool_stats(self) -> PoolStats | None:
        """The warm pool's parked, in-use and target counts per key and its counters (None
        without a pool)."""
        return self._containers.pool_stats()

    def handle(self, traj_id: str) -> ContainerHandle:
        return self._container(traj_id).handle

    def trajectories(self) -> tuple[str, ...]:
        with self._lock:
            return tuple(self._trajs)

    def cpu_usage_s(self, traj_id: str) -> float:
        """CPU seconds the trajectory's container has used (from its cgroup)."""
        return self._container(traj_id).control.usage_ns() / 1e9

    def control(self, traj_id: str) -> CpuControl:
        """The container's grant mechanism (the benchmark times it directly)."""
        return self._container(traj_id).control

    def free_cores(self) -> tuple[int, ...]:
        return self.ledger.free_cores()

    def parked_reserve_cores(self) -> float:
        """CPU the parked containers may take outside any grant, in cores: what the node's
        grants must leave free. Zero: a parked container is frozen (docs/aoe.md, "Parking")."""
        with self._lock:
            trajs = list(self._trajs.values())
        return sum(t.container.control.parked_cores for t in trajs)

    def grant_log(self) -> tuple[GrantRecord, ...]:
        """Every grant so far (cores, quota, monotonic start and end)."""
        return self.ledger.log()

    def _check_open(self, traj: Trajectory) -> None:
        """``UnknownTrajectory`` when ``traj`` was closed (by its close or the shutdown)."""
        if traj.closed:
            why = " (the AOE manager is shut down)" if self._closed else ""
            raise UnknownTrajectory(f"trajectory {traj.container.handle.traj_id!r} was closed{why}")

    def _container(self, traj_id: str) -> Container:
        """The trajectory's container; ``AoeError`` when a failed recreate left it none (the
        one it had may be another trajectory's now)."""
        traj = self._get(traj_id)
        if traj.retired is not None:
            raise AoeError(traj.retired)
        return traj.container

    def _get(self, traj_id: str) -> Trajectory:
        if not isinstance(traj_id, str):  # (an unhashable one raised a bare TypeError here)
            raise UnknownTrajectory(traj_id_problem(traj_id) or f"trajectory id {traj_id!r}")
        with self._lock:
            traj = self._trajs.get(traj_id)
            closed = self._closed
        if traj is None and closed:  # (not "call open_trajectory first": an open is refused)
            raise UnknownTrajectory(
                f"no open container for trajectory {traj_id!r}: the AOE manager is shut down"
            )
        if traj is None:
            raise UnknownTrajectory(
                f"no open container for trajectory {traj_id!r}; call open_trajectory first"
            )
        return traj

    # -- actions --------------------------------------------------------------------------

    def run_action(
        self,
        traj_id: str,
        command: str | Sequence[str],
        cores: tuple[int, ...] | int = 1,
        *,
        quota_cores: float | None = None,
        timeout_s: float | None = None,
        max_output_bytes: int | None = None,
        env: Mapping[str, str] | None = None,
        action_id: str | None = None,
        on_grant: OnGrant | None = None,
        threads: int = 0,
        weighted: bool = False,
        pool: tuple[int, ...] | None = None,
        deadline: float | None = None,
    ) -> ActionOutcome:
        """Run ``command`` in the trajectory's container on ``cores`` and return its outcome.

        ``cores`` is the scheduler's explicit core list, or a count for the manager to choose
        NUMA-locally. ``quota_cores`` caps CPU time below the cpuset (e.g. 0.5 of one core);
        default: one core per granted core. ``command`` is a shell string or an argv list. The
        action sees ``TANGRAM_CORES``/``OMP_NUM_THREADS`` (cores granted), ``TANGRAM_CPUSET``
        and ``TANGRAM_CPU_QUOTA``. Every call returns exactly one ``ActionOutcome``; bad
        arguments and unknown trajectories raise. ``on_grant`` is called (on this thread) with
        the action's ``RunningGrant`` once its cores are granted: ``RunningGrant.resize``
        grows or shrinks them while the command runs (docs/aoe.md, "Resizing a running grant").
        ``threads`` (at least the cores): the thread count the action is told instead of its
        cores (a non-malleable program the scheduler may later grow to that count).

        ``weighted``: the grant is a CFS weight, not an exclusive cpuset (docs/aoe.md,
        "Weighted grants"): the ledger still takes ``cores`` (explicit ones), but the
        container runs on every core of ``pool`` (default: all the manager's cores) with no
        quota, at a CPU weight of ``quota_cores`` (default: its cores) cores; a resize
        rewrites only the weight. ``TANGRAM_CPUSET`` is then the pool.

        ``deadline`` (``time.monotonic``): when the action's whole time is up, however long it
        waits for the trajectory's previous action or its cores: the command's time-out is cut
        to what is left when it starts, and one with nothing left then ends ``timeout``
        without running (the live runtime's action has ended at its deadline by then).
        """
        t0 = time.perf_counter()
        traj = self._get(traj_id)
        self.ledger.validate(cores)
        check_deadline(deadline)
        if not isinstance(weighted, bool):  # ('no', a string, was truthy: a weighted grant)
            raise AoeError(f"weighted must be True or False, got {weighted!r}")
        if weighted:
            pool = _core_list("pool", self.topology.cores if pool is None else pool)
            self.ledger.validate(pool)
        elif pool is not None:
            raise AoeError("a pool is for weighted grants (weighted=True)")
        plan = plan_action(
            self.config,
            command,
            cores,
            quota_cores,
            timeout_s,
            max_output_bytes,
            env=env,
            action_id=action_id,
            threads=threads,
            pool=pool,
        )
        with self._lock:
            self._action_seq += 1
            aid = action_id or auto_action_id(traj_id, self._action_seq)
        if not _acquire_by(traj.lock, deadline):
            return self._actions.late(traj_id, aid, plan, t0)
        try:
            self._check_open(traj)  # a close may have come first
            if traj.retired is not None:
                raise AoeError(traj.retired)
            return self._actions.run(traj.container, aid, plan, env, t0, on_grant, deadline)
        finally:
            traj.lock.release()

    # -- shutdown -------------------------------------------------------------------------

    def shutdown(self) -> None:
        """Remove every container of this manager and stop its watchdog. Idempotent."""
        with self._lock:  # (``_put_in_place`` reads it under the lock)
            if self._closed:
                return
            self._closed = True
        try:
            self._containers.close_pool()  # resets end, parked containers go
            self.ledger.close("the AOE manager is shut down")
            with self._lock:
                trajs = list(self._trajs.values())
                self._trajs.clear()
            for traj in trajs:
                self._retire_at_shutdown(traj)
            try:
                self._containers.remove_leftovers()
            except Exception as exc:  # noqa: BLE001 - the engine's errors; the reaper is next
                log.warning("the shutdown could not sweep this session's containers: %s", exc)
            self._remove_stale_volumes()
        finally:
            # The reaper finds nothing left and exits; while an open or recreate is still in
            # flight, released by the last of them (``_start_in_flight``), once what it made
            # is handed over (then removed above or by the reaper) or discarded.
            with self._lock:
                self._swept = True
                watchdog = None if self._in_flight else self._reaper
                if watchdog is not None:
                    self._reaper = None
            reaper.release(watchdog)

    def _remove_stale_volumes(self) -> None:
        """At the shutdown, once the containers are gone, remove the work volumes closes could
        not (their container outlived its retire); each failure is logged. Only a reopen tried
        them again, so they stayed on the host's disk for good, and a later manager's (a
        restarted service's) trajectory of the same id mounted the closed one's files."""
        with self._lock:
            stale = list(self._stale_volumes.items())
            self._stale_volumes.clear()
        for traj_id, container in stale:
            try:
                self._containers.remove_volume(container)
            except Exception as exc:  # noqa: BLE001 - AoeError or the engine's own errors
                log.warning("shutdown: %s (closed trajectory %r)", exc, traj_id)

    def _retire_at_shutdown(self, traj: Trajectory) -> None:
        """Close ``traj`` and retire its container; any error is logged, not raised: one
        container the engine failed to remove (a ConnectionError, an APIError) stopped the
        shutdown there, every later one left running."""
        # A close, recreate or action waiting for the trajectory's lock finds it closed,
        # rather than retiring its container again or starting a new one after us.
        traj.closed = True
        if traj.retired is not None:
            return  # (a failed recreate retired it already)
        try:
            self._containers.retire(traj.container)
        except Exception as exc:  # noqa: BLE001 - AoeError or the engine's own errors
            log.warning("shutdown: %s", exc)


def _core_list(name: str, cores: object) -> tuple[int, ...]:
    """``cores`` as a sorted tuple without repeats; ``AoeError`` naming ``name`` when it is no
    collection of core ids (``set``/``sorted`` raised a bare TypeError naming nothing)."""
    try:
        return tuple(sorted(set(cores)))  # type: ignore[call-overload]
    except TypeError:
        raise AoeError(f"{name} must be a list of core ids, got {cores!r}") from None


def _acquire_by(lock: threading.Lock, deadline: float | None) -> bool:
    """Take ``lock``, waiting no later than ``deadline`` (``time.monotonic``; None: as long
    as it takes); False when the deadline passed first. An action waiting for its
    trajectory's previous one went on waiting past its deadline, its caller's thread held,
    as long as that action ran (up to its own time-out)."""
    if deadline is None:
        return lock.acquire()
    return lock.acquire(timeout=max(0.0, deadline - time.monotonic()))


def traj_id_problem(traj_id: object) -> str | None:
    """Why ``traj_id`` cannot name a trajectory (None when it can): it must be non-empty
    text without NUL and valid Unicode, as it goes into its container's name and labels. A
    number or None raised a bare TypeError from the naming, naming nothing."""
    if not isinstance(traj_id, str):
        return f"a trajectory id must be a string, got {type(traj_id).__name__} {traj_id!r}"
    if not traj_id:
        return "a trajectory id must not be empty"
    if "\x00" in traj_id:
        return f"trajectory id {traj_id!r} contains a NUL byte"
    return environment.text_problem(f"trajectory id {traj_id!r}", traj_id)


def auto_action_id(traj_id: str, seq: int) -> str:
    """The id of an action the caller gave none: ``<trajectory>~<n>``. The ``~`` is outside
    ``execution.ACTION_ID``, so no caller's id can equal it (``<trajectory>.<n>`` could, and
    the ledger then refused the other trajectory's action: "already holds cores"); like the
    callers' ids it needs no quoting on the runner's line or in the fallback kill's script."""
    return f"{containers.safe_name(traj_id)}~{seq}"


def _shutdown_ref(ref: weakref.ref[AoeManager]) -> None:
    manager = ref()
    if manager is not None:
        with contextlib.suppress(Exception):
            manager.shutdown()
