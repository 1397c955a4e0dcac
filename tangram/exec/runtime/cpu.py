"""The CPU executor adapter: trajectories' containers and actions on granted cores, via AOE.

The scheduler core numbers a node's cores 0..n-1; AOE speaks host core ids. This adapter maps
one to the other (core i of the node is the i-th core of the host topology), runs the blocking
AOE calls on its own thread pools (one for actions, one for container lifecycle, so slow
container starts never hold up actions), and turns ``ActionOutcome`` into an ``ExecResult``.
As the runtime's ``Executor`` for ``CpuWork``: an action runs in its trajectory's container,
AOE kills it at its deadline, and a running action cannot be cancelled (AOE has no public
per-action kill). A running malleable action's cores are resized in place (``resize``: AOE
rewrites its container's cpuset and quota), one resize at a time in decision order.

Grants are exclusive (cpuset = the start's cores, CFS quota) or, with ``weighted`` (the runtime
sets it once, from its policy's ``Capabilities.cpu_lends_idle`` unless
``RuntimeConfig.exclusive_cores``), CFS weights: AOE's ledger still takes the start's nominal
cores, but the container runs on every core of this executor's pool (``core_map``) with no
quota, at a weight of its units, so the cycles one action leaves idle go to the others; a
resize rewrites only the weight (docs/aoe.md, "Weighted grants").
"""

from __future__ import annotations

import asyncio
import itertools
import logging
import numbers
import threading
import time
from collections.abc import Callable, Mapping
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field, replace
from functools import partial
from typing import Any, ClassVar

from tangram.core.decision import Start
from tangram.core.resources import ClusterSpec, CpuNodeSpec, ResourceKind
from tangram.exec.aoe.resize import ResizeResult, RunningGrant
from tangram.exec.runtime.errors import BadRequest, UnknownTrajectory
from tangram.exec.runtime.executor import Admission, OnDeadline
from tangram.exec.runtime.records import ActionSpec, CommandResult, CpuWork, ErrorInfo
from tangram.exec.runtime.result import ExecResult, failed
from tangram.exec.runtime.trajectories import Trajectory

#: AOE messages that mean the executor failed, not the command: the action gets an error.
_EXECUTOR_FAILURES = ("container failure", "output too large")

log = logging.getLogger(__name__)


@dataclass(eq=False)
class _Grant:
    """A started action's cores as the executor knows them (guarded by ``_grants_lock``)."""

    #: The cores it should run on (host ids): its start's, then each resize's.
    cores: tuple[int, ...]
    #: AOE's handle once the cores are granted (None before: a resize waits for it).
    running: RunningGrant | None = None
    #: (monotonic time, cores) from the grant on, one entry per applied resize: the mean
    #: cores it held (``held_units``) is what the trace records of a resized action. Nominal
    #: cores, the grant history, also under weighted grants (whose threads may use more).
    history: list[tuple[float, int]] = field(default_factory=list)


class CpuExecutor:
    """Runs CPU actions in AOE containers. ``aoe`` is an ``AoeManager``."""

    work: ClassVar[type] = CpuWork
    on_deadline: ClassVar[OnDeadline] = OnDeadline.AWAIT_KILL
    deadline_note: ClassVar[str] = "; the executor did not report the kill"
    cancellable: ClassVar[bool] = False
    #: It applies the core's resizes: AOE rewrites a running container's cpuset and quota (two
    #: cgroup writes, or one ``docker update`` where the files are out of reach), so the
    #: runtime's scheduler may resize malleable actions (``Scheduler(resizable=True)``).
    resizes: ClassVar[bool] = True

    def __init__(
        self,
        aoe: Any,
        node: CpuNodeSpec,
        *,
        threads: int | None = None,
        lifecycle_threads: int = 8,
        weighted: bool = False,
    ) -> None:
        host = tuple(sorted(aoe.topology.cores))
        if node.cores > len(host):
            raise ValueError(
                f"CPU node {node.name!r} has {node.cores} cores in the cluster file but this "
                f"host gives AOE only {len(host)} ({list(host)}); describe at most {len(host)}"
            )
        self.aoe = aoe
        self.node = node
        self.core_map: tuple[int, ...] = host[: node.cores]
        #: Grants are CFS weights over ``core_map`` (the pool this executor manages), not
        #: exclusive cpusets: set once by the runtime (``Runtime``: the policy lends idle
        #: cycles and ``RuntimeConfig.exclusive_cores`` is off).
        self.weighted = weighted
        workers = threads or node.cores * 4 + 8
        self._actions = ThreadPoolExecutor(workers, thread_name_prefix="tangram-cpu")
        self._lifecycle = ThreadPoolExecutor(lifecycle_threads, thread_name_prefix="tangram-ctr")
        self._seq = itertools.count(1)
        self._seq_lock = threading.Lock()
        #: Started actions by the runtime's id, from ``execute`` until AOE returns.
        self._grants: dict[str, _Grant] = {}
        self._grants_lock = threading.Lock()
        #: One thread: resizes are applied one at a time, in the order the core decided them.
        self._resizer = ThreadPoolExecutor(1, thread_name_prefix="tangram-resize")

    # -- containers -------------------------------------------------------------------------

    async def open(self, traj: str, memory_gb: float, image: str | None) -> Any:
        """Create the trajectory's container; returns AOE's ``ContainerHandle``."""
        loop = asyncio.get_running_loop()
        return await loop.run_in_executor(
            self._lifecycle, lambda: self.aoe.open_trajectory(traj, memory_gb, image=image)
        )

    async def close(self, traj: str) -> None:
        loop = asyncio.get_running_loop()
        await loop.run_in_executor(self._lifecycle, self.aoe.close_trajectory, traj)

    async def recreate(self, traj: str) -> Any:
        """A fresh container for the trajectory (its old one died); returns the new handle."""
        loop = asyncio.get_running_loop()
        return await loop.run_in_executor(self._lifecycle, self.aoe.recreate, traj)

    def container_of(self, traj: str) -> str | None:
        try:
            return self.aoe.handle(traj).container_id
        except Exception:  # noqa: BLE001 - closed or unknown: no container
            return None

    # -- actions ----------------------------------------------------------------------------

    def admit(
        self, spec: ActionSpec, trajectory: Trajectory | None, cluster: ClusterSpec
    ) -> Admission:
        """CPU work runs in an open trajectory's container, on that container's node."""
        if spec.trajectory is None:
            raise BadRequest("CPU work needs a trajectory (the container it runs in)")
        if trajectory is None:
            raise UnknownTrajectory(
                f"trajectory {spec.trajectory!r} is not open; open it before submitting "
                "CPU work to it"
            )
        return Admission(
            ResourceKind.CPU,
            spec.max_units,
            memory_gb=trajectory.memory_gb,
            node=trajectory.node,
        )

    async def execute(
        self, work: CpuWork, start: Start, *, trajectory: str, time_left_s: float
    ) -> ExecResult:
        """Run the command on the granted cores; AOE kills it when ``time_left_s`` runs out."""
        if time_left_s <= 0:
            return ExecResult(
                "timeout", error=ErrorInfo("timeout", "the time-out passed at its start"), ran=False
            )
        key = start.action.id
        try:
            host_cores = self._host_cores(start.cores)
        except ValueError as exc:
            return failed("executor_error", str(exc))
        # Known before the first await: a resize decided with (or just after) the start finds
        # it, and waits for the grant if AOE has not made it yet.
        with self._grants_lock:
            self._grants[key] = _Grant(host_cores)
        try:
            result = await self.run(
                trajectory,
                work.command,
                start.cores,
                timeout_s=time_left_s,
                env=work.env,
                max_output_bytes=work.max_output_bytes,
                key=key,
                threads=start.threads,
            )
        finally:
            with self._grants_lock:
                entry = self._grants.pop(key, None)
        held = held_units(entry.history, time.perf_counter()) if entry is not None else None
        if held is None:
            return result
        return replace(result, detail={**(result.detail or {}), "held_units": held})

    async def run(
        self,
        traj: str,
        command: str | tuple[str, ...],
        cores: tuple[int, ...],
        *,
        timeout_s: float,
        env: Mapping[str, str] | None = None,
        max_output_bytes: int | None = None,
        key: str | None = None,
        threads: int = 0,
    ) -> ExecResult:
        """Run ``command`` on the node's ``cores`` (scheduler numbering) until it ends;
        ``key``: the started action's id, under which ``execute`` registered it for resizes;
        ``threads``: the thread count it is told when more than its cores (``Start.threads``)."""
        loop = asyncio.get_running_loop()
        deadline = time.monotonic() + timeout_s  # (before the wait for a thread)
        return await loop.run_in_executor(
            self._actions,
            lambda: self.run_blocking(
                traj,
                command,
                cores,
                timeout_s=timeout_s,
                env=env,
                max_output_bytes=max_output_bytes,
                key=key,
                threads=threads,
                deadline=deadline,
            ),
        )

    def run_blocking(
        self,
        traj: str,
        command: str | tuple[str, ...],
        cores: tuple[int, ...],
        *,
        timeout_s: float,
        env: Mapping[str, str] | None = None,
        max_output_bytes: int | None = None,
        key: str | None = None,
        threads: int = 0,
        weighted: bool | None = None,
        deadline: float | None = None,
    ) -> ExecResult:
        """``run`` on the calling thread, for a caller with threads of its own (the node
        agents of ``tangram.exec.ray``, whose calls arrive on Ray's threads). ``weighted``:
        a weighted grant over ``core_map`` (None: this executor's ``weighted``).
        ``deadline`` (``time.monotonic``; None: ``timeout_s`` from now): the action's whole
        time, waits for its trajectory's previous action and its cores included."""
        if deadline is None:
            deadline = time.monotonic() + timeout_s
        try:
            host_cores = self._host_cores(cores)
        except ValueError as exc:
            return failed("executor_error", str(exc))
        on_grant = None
        if key is not None:
            with self._grants_lock:
                entry = self._grants.get(key)
            if entry is not None:
                host_cores = entry.cores  # resized before it got here: ask AOE for the new set
                on_grant = partial(self._granted, entry)
        with self._seq_lock:
            aid = f"live{next(self._seq)}"  # AOE's kill marker: keep it shell-safe
        weigh = self.weighted if weighted is None else weighted
        return self._run_blocking(
            traj,
            command,
            host_cores,
            timeout_s,
            env,
            max_output_bytes,
            aid,
            on_grant,
            threads,
            self.core_map if weigh else None,
            deadline,
        )

    def _host_cores(self, cores: tuple[int, ...]) -> tuple[int, ...]:
        """The scheduler's core numbers as host core ids; ``ValueError`` naming them when one
        is not a core of this node (0..n-1). Checked, not indexed blindly: core -1 was the
        node's last core (a silent wrong grant, maybe another action's core), True core 1."""
        n = len(self.core_map)
        if any(
            isinstance(c, bool) or not isinstance(c, numbers.Integral) or not 0 <= c < n
            for c in cores
        ):
            raise ValueError(
                f"cores {cores} are not on CPU node {self.node.name!r} (its cores are 0..{n - 1})"
            )
        return tuple(self.core_map[c] for c in cores)

    # -- resizes ----------------------------------------------------------------------------

    def _granted(self, entry: _Grant, running: RunningGrant) -> None:
        """AOE granted the cores (on the action's thread): resizes apply from now on; one
        decided since the request was made is applied at once."""
        with self._grants_lock:
            entry.running = running
            if entry.cores != running.cores:
                result = running.resize(entry.cores)
                if result.status == "failed":
                    log.warning(
                        "resize of %s at its grant failed: %s", running.action_id, result.error
                    )
                    entry.cores = running.cores  # it runs on, on the cores it was granted
            # The cores it runs on now (a failed resize's never counted as held).
            entry.history.append((time.perf_counter(), len(running.cores)))

    async def resize(self, action_id: str, cores: tuple[int, ...]) -> ResizeResult:
        """Move a running action onto ``cores`` (scheduler numbering, its whole new set).

        ``ended`` when it is no longer running here (its end and the resize crossed), ``pending``
        when AOE has not granted its first cores yet (they are asked for or applied at the
        grant), ``failed`` (it runs on, on its old cores) with the reason."""
        loop = asyncio.get_running_loop()
        return await loop.run_in_executor(self._resizer, self.resize_blocking, action_id, cores)

    def resize_blocking(self, action_id: str, cores: tuple[int, ...]) -> ResizeResult:
        """``resize`` on the calling thread."""
        try:
            host = self._host_cores(cores)
        except ValueError as exc:
            return ResizeResult("failed", (), error=str(exc))
        with self._grants_lock:
            entry = self._grants.get(action_id)
            if entry is None:
                return ResizeResult("ended", (), error="the action is no longer running")
            entry.cores = host
            if entry.running is None:
                return ResizeResult("pending", host)
            result = entry.running.resize(host)
            if result.status in ("applied", "unchanged"):
                entry.history.append((time.perf_counter(), len(host)))
            return result

    def _run_blocking(
        self,
        traj: str,
        command: str | tuple[str, ...],
        cores: tuple[int, ...],
        timeout_s: float,
        env: Mapping[str, str] | None,
        max_output_bytes: int | None,
        aid: str,
        on_grant: Callable[[RunningGrant], None] | None = None,
        threads: int = 0,
        pool: tuple[int, ...] | None = None,
        deadline: float | None = None,
    ) -> ExecResult:
        try:
            out = self.aoe.run_action(
                traj,
                command if isinstance(command, str) else list(command),
                cores,
                timeout_s=max(timeout_s, 1e-3),
                max_output_bytes=max_output_bytes,
                env=dict(env or {}),
                action_id=aid,
                **({} if on_grant is None else {"on_grant": on_grant}),
                **({"threads": threads} if threads else {}),
                **({} if pool is None else {"weighted": True, "pool": pool}),
                **({} if deadline is None else {"deadline": deadline}),
            )
        except Exception as exc:  # noqa: BLE001 - AOE raises for bad arguments / unknown trajectory
            return failed("executor_error", f"AOE refused the action: {type(exc).__name__}: {exc}")
        timings = out.timings
        value = CommandResult(
            out.stdout.decode("utf-8", "replace"),
            out.stderr.decode("utf-8", "replace"),
            out.exit_code,
            out.error,
        )
        exec_s = float(timings.get("exec_s", 0.0))
        wait_s = float(timings.get("queue_s", 0.0))
        if out.status == "timeout":
            error = ErrorInfo("timeout", out.error or "timed out")
            # No cores: AOE's deadline passed while the action waited for its trajectory's
            # previous action or its cores (its 'late' verdict), and nothing ran.
            ran = bool(out.cores)
            return ExecResult("timeout", value, error, exec_s=exec_s, wait_s=wait_s, ran=ran)
        if out.status == "ok" or (
            out.exit_code is not None and not (out.error or "").startswith(_EXECUTOR_FAILURES)
        ):
            return ExecResult("result", value, None, exec_s=exec_s, wait_s=wait_s)
        code = "container_failure" if (out.error or "").startswith("container") else "exec_failed"
        error = ErrorInfo(code, out.error or f"exit code {out.exit_code}")
        return ExecResult("error", value, error, exec_s=exec_s, wait_s=wait_s)

    def shutdown(self) -> None:
        """Stop the thread pools (running actions finish) and remove every container."""
        self._actions.shutdown(wait=False, cancel_futures=True)
        self._lifecycle.shutdown(wait=False, cancel_futures=True)
        self._resizer.shutdown(wait=False, cancel_futures=True)
        self.aoe.shutdown()


def held_units(history: list[tuple[float, int]], end: float) -> float | None:
    """The mean cores an action held from its grant to ``end`` (time-weighted), or None when
    its grant never changed (its start's units say it all).

    These are the grant's nominal cores (the grant history), what the core decided and the
    trace records as observed units, also under weighted grants, where the action's threads
    may have run on more of the node's cycles than it held."""
    if len({units for _, units in history}) < 2:
        return None
    total = held = 0.0
    for (t, units), (t_next, _) in zip(history, [*history[1:], (end, 0)], strict=True):
        span = max(0.0, t_next - t)
        held += units * span
        total += span
    return held / total if total > 0 else None
