"""The CPU executor adapter: trajectories' containers and actions on granted cores, via AOE.

The scheduler core numbers a node's cores 0..n-1; AOE speaks host core ids. This adapter maps
one to the other (core i of the node is the i-th core of the host topology), runs the blocking
AOE calls on its own thread pools (one for actions, one for container lifecycle, so slow
container starts never hold up actions), and turns ``ActionOutcome`` into an ``ExecResult``.
As the runtime's ``Executor`` for ``CpuWork``: an action runs in its trajectory's container,
AOE kills it at its deadline, and a running action cannot be cancelled (AOE has no public
per-action kill).
"""

from __future__ import annotations

import asyncio
import itertools
import threading
from collections.abc import Mapping
from concurrent.futures import ThreadPoolExecutor
from typing import Any, ClassVar

from tangram.core.decision import Start
from tangram.core.resources import ClusterSpec, CpuNodeSpec, ResourceKind
from tangram.exec.runtime.errors import BadRequest, UnknownTrajectory
from tangram.exec.runtime.executor import Admission, OnDeadline
from tangram.exec.runtime.records import ActionSpec, CommandResult, CpuWork, ErrorInfo
from tangram.exec.runtime.result import ExecResult, failed
from tangram.exec.runtime.trajectories import Trajectory

#: AOE messages that mean the executor failed, not the command: the action gets an error.
_EXECUTOR_FAILURES = ("container failure", "output too large")


class CpuExecutor:
    """Runs CPU actions in AOE containers. ``aoe`` is an ``AoeManager``."""

    work: ClassVar[type] = CpuWork
    on_deadline: ClassVar[OnDeadline] = OnDeadline.AWAIT_KILL
    deadline_note: ClassVar[str] = "; the executor did not report the kill"
    cancellable: ClassVar[bool] = False

    def __init__(
        self,
        aoe: Any,
        node: CpuNodeSpec,
        *,
        threads: int | None = None,
        lifecycle_threads: int = 8,
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
        workers = threads or node.cores * 4 + 8
        self._actions = ThreadPoolExecutor(workers, thread_name_prefix="tangram-cpu")
        self._lifecycle = ThreadPoolExecutor(lifecycle_threads, thread_name_prefix="tangram-ctr")
        self._seq = itertools.count(1)
        self._seq_lock = threading.Lock()

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
                "timeout", error=ErrorInfo("timeout", "the time-out passed at its start")
            )
        return await self.run(
            trajectory,
            work.command,
            start.cores,
            timeout_s=time_left_s,
            env=work.env,
            max_output_bytes=work.max_output_bytes,
        )

    async def run(
        self,
        traj: str,
        command: str | tuple[str, ...],
        cores: tuple[int, ...],
        *,
        timeout_s: float,
        env: Mapping[str, str] | None = None,
        max_output_bytes: int | None = None,
    ) -> ExecResult:
        """Run ``command`` on the node's ``cores`` (scheduler numbering) until it ends."""
        loop = asyncio.get_running_loop()
        return await loop.run_in_executor(
            self._actions,
            lambda: self.run_blocking(
                traj,
                command,
                cores,
                timeout_s=timeout_s,
                env=env,
                max_output_bytes=max_output_bytes,
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
    ) -> ExecResult:
        """``run`` on the calling thread, for a caller with threads of its own (the node
        agents of ``tangram.exec.ray``, whose calls arrive on Ray's threads)."""
        host_cores = tuple(self.core_map[c] for c in cores)
        with self._seq_lock:
            aid = f"live{next(self._seq)}"  # AOE's kill marker: keep it shell-safe
        return self._run_blocking(traj, command, host_cores, timeout_s, env, max_output_bytes, aid)

    def _run_blocking(
        self,
        traj: str,
        command: str | tuple[str, ...],
        cores: tuple[int, ...],
        timeout_s: float,
        env: Mapping[str, str] | None,
        max_output_bytes: int | None,
        aid: str,
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
            return ExecResult("timeout", value, error, exec_s=exec_s, wait_s=wait_s)
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
        self.aoe.shutdown()
