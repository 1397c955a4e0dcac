"""``AoeManager``: Allocate-on-Execution for CPU, one Docker container per trajectory.

A trajectory's container lives from ``open_trajectory`` to ``close_trajectory`` and keeps its
memory, files and background processes all that time, but it holds CPU only while one of its
actions runs: between actions it is parked on a 1%-of-a-core quota. ``run_action`` takes the
cores (waiting, first come first served, if another action holds them), writes the grant into
the container's cgroup, runs the command, and revokes the grant however the command ended.

Blocking and thread-safe: the live runtime calls it from worker threads. Actions of one
trajectory run one at a time (a lock per container); actions of different trajectories run
in parallel on disjoint cores.
"""

from __future__ import annotations

import atexit
import contextlib
import logging
import os
import shlex
import signal
import subprocess
import sys
import threading
import time
import uuid
import weakref
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from tangram.exec.aoe import containers
from tangram.exec.aoe.cgroups import CgroupGone, CpuControl, DockerUpdate, direct_control
from tangram.exec.aoe.config import AoeConfig, SandboxConfig
from tangram.exec.aoe.errors import AoeError, UnknownTrajectory
from tangram.exec.aoe.images import connect
from tangram.exec.aoe.ledger import CoreLedger
from tangram.exec.aoe.records import ActionOutcome, ContainerHandle, GrantRecord, Status
from tangram.exec.aoe.topology import NumaTopology, as_topology, format_cpulist, read_host_topology
from tangram.exec.aoe.transport import (
    ACTION_ENV,
    ActionRequest,
    ExecTransport,
    RawResult,
    RunnerTransport,
)

log = logging.getLogger(__name__)

#: status, exit code, stdout, stderr, error message: an outcome before its timings.
_Verdict = tuple[Status, int | None, bytes, bytes, str | None]

#: The directory holding the ``tangram`` package, so the watchdog imports this same code.
_ROOT = str(Path(__file__).resolve().parents[3])


@dataclass
class _Trajectory:
    """Mutable per-trajectory state, guarded by ``lock``."""

    handle: ContainerHandle
    sandbox: SandboxConfig
    control: CpuControl
    transport: ExecTransport | RunnerTransport
    #: Host pid of the container's init when the engine is local (None otherwise).
    init_pid: int | None
    lock: threading.Lock = field(default_factory=threading.Lock)
    dead: str | None = None
    closed: bool = False


class AoeManager:
    """CPU executor: containers per trajectory, cores per action.

    ``AoeManager(config)`` connects to the engine (``EngineUnavailable`` if none answers),
    removes containers of dead managers, and starts the crash watchdog. Use it as a context
    manager, or call ``shutdown()``; containers are also removed at interpreter exit and, if
    the process is killed, by the watchdog.
    """

    def __init__(self, config: AoeConfig | None = None, *, client: Any = None) -> None:
        self.config = config or AoeConfig()
        self.client = client or connect(self.config.docker_base_url)
        self.topology: NumaTopology = (
            as_topology(self.config.topology) if self.config.topology else read_host_topology()
        )
        self.ledger = CoreLedger(self.topology)
        self.session = uuid.uuid4().hex
        self._trajs: dict[str, _Trajectory] = {}
        self._lock = threading.Lock()
        self._closed = False
        self._action_seq = 0
        self._warned_fallback = False
        self._reaper: subprocess.Popen[bytes] | None = None
        if self.config.cleanup_orphans:
            containers.remove_orphans(self.client)
        if self.config.sandbox.relaxations():
            log.warning(
                "AOE default sandbox relaxed: %s", "; ".join(self.config.sandbox.relaxations())
            )
        if self.config.reaper:
            self._reaper = subprocess.Popen(
                [
                    sys.executable,
                    "-m",
                    "tangram.exec.aoe.reaper",
                    self.session,
                    self.config.docker_base_url or "",
                ],
                stdin=subprocess.PIPE,
                stdout=subprocess.DEVNULL,
                stderr=subprocess.DEVNULL,
                start_new_session=True,  # Ctrl-C and the manager's own death spare it
                env={
                    **os.environ,
                    "PYTHONPATH": os.pathsep.join(
                        filter(None, (_ROOT, os.environ.get("PYTHONPATH")))
                    ),
                },
            )
        atexit.register(_shutdown_ref, weakref.ref(self))

    # -- context manager ------------------------------------------------------------------

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
        if self._closed:
            raise AoeError("the AOE manager is shut down")
        with self._lock:
            if traj_id in self._trajs:
                raise AoeError(
                    f"trajectory {traj_id!r} already has a container "
                    f"({self._trajs[traj_id].handle.short_id})"
                )
        sb = sandbox or self.config.sandbox
        if sandbox is not None and sandbox.relaxations():
            log.warning(
                "sandbox of trajectory %s relaxed: %s", traj_id, "; ".join(sandbox.relaxations())
            )
        mem = self.config.memory_gb if memory_gb is None else memory_gb
        if mem <= 0:
            raise AoeError(f"memory_gb of trajectory {traj_id!r} must be positive, got {mem}")
        traj = self._start(traj_id, image or self.config.image, mem, sb, generation=1)
        with self._lock:
            if traj_id in self._trajs or self._closed:
                containers.remove(self.client, traj.handle.container_id)
                raise AoeError(f"trajectory {traj_id!r} was opened twice at once")
            self._trajs[traj_id] = traj
        return traj.handle

    def _start(
        self, traj_id: str, image: str, memory_gb: float, sb: SandboxConfig, generation: int
    ) -> _Trajectory:
        name = f"tangram-aoe-{self.session[:8]}-{containers.safe_name(traj_id)}-{generation}"
        spec = containers.ContainerSpec(
            name=name,
            image=image,
            memory_gb=memory_gb,
            sandbox=sb,
            cpu_period_us=self.config.cfs_period_us,
            start_quota_us=self.config.cfs_period_us * len(self.topology.cores),
            park_cores=self.topology.cores,
            use_init=self.config.use_init,
            labels={
                containers.LABEL: "1",
                containers.LABEL_SESSION: self.session,
                containers.LABEL_OWNER: containers.owner_label(),
                containers.LABEL_TRAJ: traj_id,
            },
        )
        container = containers.create(self.client, spec)
        try:
            pid = int(container.attrs["State"]["Pid"])
            control = self._control(container.id, pid)
            handle = ContainerHandle(traj_id, container.id, name, image, memory_gb, generation)
            cls = RunnerTransport if self.config.transport == "runner" else ExecTransport
            transport = cls(
                self.client.api, container.id, sb.user, sb.work_dir, self.config.kill_grace_s
            )
            if isinstance(transport, RunnerTransport):
                self._warm_up(transport, name)
            control.park()
        except BaseException:
            containers.remove(self.client, container.id)
            raise
        return _Trajectory(handle, sb, control, transport, containers.local_pid(pid, container.id))

    @staticmethod
    def _warm_up(transport: RunnerTransport, name: str) -> None:
        """Start the runner and see it answer, while the new container is not yet parked."""
        request = ActionRequest("warm-up", "true", {}, 30.0, 1024)
        result = transport.run(request, lambda why: None)
        if result.exit_code != 0:
            raise AoeError(
                f"the runner shell of {name} did not start ({result.ended}, exit "
                f"{result.exit_code}): {result.stderr.decode(errors='replace').strip()}"
            )

    def _control(self, container_id: str, pid: int) -> CpuControl:
        cfg = self.config
        args = (cfg.cfs_period_us, cfg.park_quota_us, self.topology.cores)
        if cfg.cgroup_mode == "docker":
            return DockerUpdate(self.client.api, container_id, *args)
        try:
            return direct_control(pid, *args)
        except AoeError as exc:
            if cfg.cgroup_mode == "direct":
                raise
            if not self._warned_fallback:
                log.warning("AOE falls back to docker update (milliseconds per grant): %s", exc)
                self._warned_fallback = True
            return DockerUpdate(self.client.api, container_id, *args)

    def close_trajectory(self, traj_id: str) -> None:
        """Remove the trajectory's container (after its running action, if any, ends)."""
        traj = self._get(traj_id)
        with traj.lock:
            self._check_open(traj)
            traj.closed = True
            self._destroy(traj)
            with self._lock:
                self._trajs.pop(traj_id, None)

    def recreate(self, traj_id: str) -> ContainerHandle:
        """Replace the trajectory's container with a fresh one (same image, memory, sandbox).

        For a trajectory whose container died; its files and processes are gone (unless the
        sandbox's ``work_volume`` kept the work dir).
        """
        traj = self._get(traj_id)
        with traj.lock:
            self._check_open(traj)
            self._destroy(traj)
            h = traj.handle
            fresh = self._start(traj_id, h.image, h.memory_gb, traj.sandbox, h.generation + 1)
            # Same object, same lock: actions waiting on it now run in the new container.
            traj.handle, traj.control, traj.transport = fresh.handle, fresh.control, fresh.transport
            traj.init_pid, traj.dead = fresh.init_pid, None
        return fresh.handle

    def handle(self, traj_id: str) -> ContainerHandle:
        return self._get(traj_id).handle

    def trajectories(self) -> tuple[str, ...]:
        with self._lock:
            return tuple(self._trajs)

    def cpu_usage_s(self, traj_id: str) -> float:
        """CPU seconds the trajectory's container has used (from its cgroup)."""
        return self._get(traj_id).control.usage_ns() / 1e9

    def control(self, traj_id: str) -> CpuControl:
        """The container's grant mechanism (the benchmark times it directly)."""
        return self._get(traj_id).control

    def free_cores(self) -> tuple[int, ...]:
        return self.ledger.free_cores()

    def grant_log(self) -> tuple[GrantRecord, ...]:
        """Every grant so far (cores, quota, monotonic start and end)."""
        return self.ledger.log()

    @staticmethod
    def _check_open(traj: _Trajectory) -> None:
        if traj.closed:
            raise UnknownTrajectory(f"trajectory {traj.handle.traj_id!r} was closed")

    def _get(self, traj_id: str) -> _Trajectory:
        with self._lock:
            traj = self._trajs.get(traj_id)
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
    ) -> ActionOutcome:
        """Run ``command`` in the trajectory's container on ``cores`` and return its outcome.

        ``cores`` is the scheduler's explicit core list, or a count for the manager to choose
        NUMA-locally. ``quota_cores`` caps CPU time below the cpuset (e.g. 0.5 of one core);
        default: one core per granted core. ``command`` is a shell string or an argv list. The
        action sees ``TANGRAM_CORES``/``OMP_NUM_THREADS`` (cores granted), ``TANGRAM_CPUSET``
        and ``TANGRAM_CPU_QUOTA``. Every call returns exactly one ``ActionOutcome``; bad
        arguments and unknown trajectories raise.
        """
        t0 = time.perf_counter()
        traj = self._get(traj_id)
        self.ledger.validate(cores)
        n = cores if isinstance(cores, int) else len(cores)
        quota = float(n if quota_cores is None else quota_cores)
        if not 0 < quota <= n:
            raise AoeError(
                f"quota_cores must be in (0, {n}] for {n} granted core(s), got {quota_cores}"
            )
        timeout = self.config.default_timeout_s if timeout_s is None else timeout_s
        if timeout <= 0:
            raise AoeError(f"timeout_s must be positive, got {timeout_s}")
        limit = self.config.max_output_bytes if max_output_bytes is None else max_output_bytes
        if limit < 1:
            raise AoeError(f"max_output_bytes must be positive, got {max_output_bytes}")
        script = command if isinstance(command, str) else shlex.join(command)
        if not script.strip():
            raise AoeError("command is empty")
        with self._lock:
            self._action_seq += 1
            aid = action_id or f"{containers.safe_name(traj_id)}.{self._action_seq}"
        times: dict[str, float] = {}

        def outcome(verdict: _Verdict, granted: tuple[int, ...]) -> ActionOutcome:
            times["total_s"] = time.perf_counter() - t0
            times["overhead_s"] = (
                times["total_s"] - times.get("queue_s", 0.0) - times.get("exec_s", 0.0)
            )
            return ActionOutcome(traj_id, aid, *verdict, granted, quota, times)

        with traj.lock:
            self._check_open(traj)  # a close may have come first
            if traj.dead:
                times["queue_s"] = time.perf_counter() - t0
                why = f"container {traj.handle.short_id} is dead ({traj.dead}); call recreate()"
                return outcome(("error", None, b"", b"", why), ())
            granted = self.ledger.acquire(aid, cores)
            times["queue_s"] = time.perf_counter() - t0
            env_all = {
                "TANGRAM_CORES": str(len(granted)),
                "OMP_NUM_THREADS": str(len(granted)),
                "TANGRAM_CPUSET": format_cpulist(granted),
                "TANGRAM_CPU_QUOTA": f"{quota:g}",
                **(env or {}),
            }
            request = ActionRequest(aid, script, env_all, timeout, limit)
            oom_before = traj.control.oom_kills()
            try:
                raw, failure = self._granted_run(traj, granted, quota, request, times)
            finally:
                t_revoke = time.perf_counter()
                with contextlib.suppress(CgroupGone):
                    traj.control.park()
                times["revoke_s"] = time.perf_counter() - t_revoke
                self.ledger.release(aid, traj_id, quota)
            if raw is not None and failure is None:
                failure = self._container_failure(traj, raw)
            if failure is not None:
                out, err = (raw.stdout, raw.stderr) if raw else (b"", b"")
                code = raw.exit_code if raw else None
                return outcome(("error", code, out, err, f"container failure: {failure}"), granted)
            assert raw is not None
            return outcome(self._judge(raw, limit, timeout, traj, oom_before), granted)

    def _granted_run(
        self,
        traj: _Trajectory,
        granted: tuple[int, ...],
        quota: float,
        request: ActionRequest,
        times: dict[str, float],
    ) -> tuple[RawResult | None, str | None]:
        """Grant, then run; the result, or why the container could not run it."""
        t_grant = time.perf_counter()
        try:
            traj.control.grant(granted, quota)
        except CgroupGone:
            return None, self._mark_dead(traj, suspect=True) or "its cgroup vanished"
        except AoeError as exc:
            return None, f"the grant could not be written: {exc}"
        finally:
            times["grant_s"] = time.perf_counter() - t_grant
        t_exec = time.perf_counter()
        try:
            aid = request.action_id
            return traj.transport.run(request, lambda why: self._kill_action(traj, aid, why)), None
        except Exception as exc:  # noqa: BLE001 - engine errors become the action's error
            traj.transport.close()
            return None, self._mark_dead(traj, suspect=True) or f"{type(exc).__name__}: {exc}"
        finally:
            times["exec_s"] = time.perf_counter() - t_exec

    def _container_failure(self, traj: _Trajectory, raw: RawResult) -> str | None:
        """Why the container (not the command) failed the action, or None."""
        signalled = raw.exit_code is None or raw.exit_code >= 128
        if raw.ended not in ("eof", "stuck") and not signalled:
            return None
        suspect = raw.ended in ("eof", "stuck") or raw.exit_code is None
        dead = self._mark_dead(traj, suspect)
        if dead is not None:
            return dead
        if raw.ended == "stuck":
            return (
                "the action's runner stopped answering after it was killed; a fresh runner "
                "will serve the next action"
            )
        if raw.ended == "eof":
            return "the action's runner ended unexpectedly (killed from outside?)"
        return None

    def _judge(
        self, raw: RawResult, limit: int, timeout: float, traj: _Trajectory, oom_before: int | None
    ) -> _Verdict:
        """Status and error message of a finished action."""
        code = raw.exit_code
        if raw.ended == "timeout":
            return (
                "timeout",
                code,
                raw.stdout,
                raw.stderr,
                f"timed out after {timeout:g} s; the action's processes were killed, "
                "the container was kept",
            )
        if raw.ended == "overflow" or raw.stdout_bytes > limit or raw.stderr_bytes > limit:
            which = "stdout" if raw.stdout_bytes > limit else "stderr"
            size = max(raw.stdout_bytes, raw.stderr_bytes)
            return (
                "error",
                code,
                raw.stdout,
                raw.stderr,
                f"output too large: {which} passed max_output_bytes={limit} "
                f"({size}+ bytes); the action was killed and its output truncated",
            )
        if code == 0:
            return "ok", 0, raw.stdout, raw.stderr, None
        first = raw.stderr.decode(errors="replace").strip().splitlines()
        detail = f": {first[-1]}" if first else ""
        if code == 127:
            msg = f"command not found (exit 127){detail}"
        elif code == 126:
            msg = f"command not executable (exit 126){detail}"
        elif (
            code == 137 and oom_before is not None and (traj.control.oom_kills() or 0) > oom_before
        ):
            msg = f"killed by the out-of-memory killer (memory limit {traj.handle.memory_gb:g} GB)"
        elif code is not None and code > 128:
            msg = f"killed by signal {code - 128} (exit {code}){detail}"
        else:
            msg = f"exit code {code}{detail}"
        return "error", code, raw.stdout, raw.stderr, msg

    def _destroy(self, traj: _Trajectory) -> None:
        """Remove the container, quota lifted first so its processes can die promptly."""
        traj.transport.close()
        with contextlib.suppress(AoeError):
            traj.control.unthrottle()
        containers.remove(self.client, traj.handle.container_id)

    def _mark_dead(self, traj: _Trajectory, suspect: bool = False) -> str | None:
        """If the container is no longer running, remember why (and return it).

        ``suspect``: a stream ended without an answer, so the container probably died; the
        engine may not know yet, so look for up to a second (the init process's exit, seen in
        this machine's /proc, settles it at once).
        """
        deadline = time.monotonic() + (1.0 if suspect else 0.0)
        while True:
            st = containers.state(self.client, traj.handle.container_id)
            init_gone = traj.init_pid is not None and not containers.pid_running(traj.init_pid)
            running = st is not None and bool(st.get("Running"))
            if not running or init_gone:
                break
            if time.monotonic() >= deadline:
                return None
            time.sleep(0.05)
        why = containers.describe_death(st) if not running else "its init process exited"
        traj.dead = f"container {traj.handle.short_id} died: {why}"
        traj.transport.close()
        return traj.dead

    def _kill_action(self, traj: _Trajectory, aid: str, why: str) -> None:
        """Kill every process of action ``aid`` (found by its environment), keep the rest."""
        marker = f"{ACTION_ENV}={aid}".encode()
        try:
            pids = traj.control.pids()
        except CgroupGone:
            return
        killed = 0
        if pids:
            for pid in pids:
                try:
                    with open(f"/proc/{pid}/environ", "rb") as f:
                        environ = f.read().split(b"\0")
                except OSError:
                    continue
                if marker in environ:
                    with contextlib.suppress(ProcessLookupError):
                        os.kill(pid, signal.SIGKILL)
                        killed += 1
        if not killed:
            self._kill_inside(traj, aid)
        log.info("killed action %s in %s (%s)", aid, traj.handle.short_id, why)

    def _kill_inside(self, traj: _Trajectory, aid: str) -> None:
        """Fallback when the container's processes are not visible from here: kill from inside."""
        script = (
            "for p in /proc/[0-9]*; do "
            f"if tr '\\0' '\\n' < $p/environ 2>/dev/null | grep -qx '{ACTION_ENV}={aid}'; "
            "then kill -9 ${p#/proc/} 2>/dev/null; fi; done"
        )
        with contextlib.suppress(Exception):
            self.client.api.exec_start(
                self.client.api.exec_create(
                    traj.handle.container_id, ["/bin/sh", "-c", script], user=traj.sandbox.user
                )["Id"]
            )

    # -- shutdown -------------------------------------------------------------------------

    def shutdown(self) -> None:
        """Remove every container of this manager and stop its watchdog. Idempotent."""
        if self._closed:
            return
        self._closed = True
        self.ledger.close("the AOE manager is shut down")
        with self._lock:
            trajs = list(self._trajs.values())
            self._trajs.clear()
        for traj in trajs:
            try:
                self._destroy(traj)
            except AoeError as exc:
                log.warning("%s", exc)
        for leftover in containers.session_containers(self.client, self.session):
            containers.remove(self.client, leftover.id)
        if self._reaper is not None and self._reaper.stdin is not None:
            self._reaper.stdin.close()  # the reaper finds nothing left and exits
        self._reaper = None


def _shutdown_ref(ref: weakref.ref[AoeManager]) -> None:
    manager = ref()
    if manager is not None:
        with contextlib.suppress(Exception):
            manager.shutdown()
