"""Open trajectories: each one's place in the core (its container's memory on the CPU node),
its container (the CPU executor), and its closing.

A trajectory opens once the core has room for its container's memory (``CapacityShort``, or
a wait up to ``wait_s``) and its container runs. It closes in order: its waiting actions end,
its running ones finish, the core forgets it, its container is removed, and anyone waiting
for memory is woken.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import uuid
from collections import Counter
from dataclasses import dataclass, field
from enum import Enum
from typing import TYPE_CHECKING

from tangram.core.scheduler import Scheduler
from tangram.exec.runtime.actions import LiveAction
from tangram.exec.runtime.errors import (
    BadRequest,
    CapacityShort,
    Conflict,
    ExecutorMissing,
    LiveError,
    ShuttingDown,
    UnknownTrajectory,
)
from tangram.exec.runtime.records import (
    ErrorInfo,
    TrajectoryInfo,
    check_image,
    check_memory_gb,
    check_trajectory_id,
)

if TYPE_CHECKING:
    from tangram.exec.runtime.cpu import CpuExecutor
    from tangram.exec.runtime.host import LiveHost

log = logging.getLogger(__name__)


class TrajState(Enum):
    """A trajectory's life: its container is being created, it runs actions, it is closing."""

    OPENING = "opening"
    OPEN = "open"
    CLOSING = "closing"


@dataclass(eq=False)
class Trajectory:
    """An open trajectory: its container and the actions of it not yet out of the core."""

    id: str
    node: str | None
    memory_gb: float
    image: str | None
    opened_at: float
    ephemeral: bool
    state: TrajState = TrajState.OPENING
    container: str | None = None
    #: Resolved once the container runs (an exception if it could not be created).
    ready: asyncio.Future[None] | None = None
    #: Its actions the core still holds, by id (``actions.move`` drops them as they leave).
    active: dict[str, LiveAction] = field(default_factory=dict)

    def info(self) -> TrajectoryInfo:
        return TrajectoryInfo(
            self.id,
            self.node,
            self.container,
            self.memory_gb,
            self.image,
            round(self.opened_at, 6),
            self.ephemeral,
        )


class Trajectories:
    """The runtime's open trajectories, by id, and the way each opens and closes."""

    def __init__(
        self,
        scheduler: Scheduler,
        host: LiveHost,
        cpu: CpuExecutor | None,
        counters: Counter[str],
        *,
        default_memory_gb: float,
    ) -> None:
        self.scheduler = scheduler
        self.host = host
        self.cpu = cpu
        self.counters = counters
        self.default_memory_gb = default_memory_gb
        self.by_id: dict[str, Trajectory] = {}
        #: Set when the runtime stops: a trajectory waiting for memory gives up.
        self.stopping = False
        self._capacity = asyncio.Condition()
        #: Removals of containers whose open was cancelled (``_abandon``), held until done.
        self._abandoned: set[asyncio.Task[None]] = set()
        #: Closes under way (``close``), held until done.
        self._closing_tasks: set[asyncio.Task[TrajectoryInfo]] = set()

    def __len__(self) -> int:
        return len(self.by_id)

    def get(self, trajectory: str) -> Trajectory:
        traj = self.by_id.get(trajectory)
        if traj is None:
            raise UnknownTrajectory(f"trajectory {trajectory!r} is not open")
        return traj

    def closing(self, name: str | None) -> bool:
        """Whether ``name`` is a trajectory being closed (its running actions finishing)."""
        traj = self.by_id.get(name) if name is not None else None
        return traj is not None and traj.state is TrajState.CLOSING

    async def opened(self, trajectory: str) -> Trajectory:
        """``trajectory`` once its open has ended: a container being made is waited for (a
        client retrying a lost open answer reads it so); ``UnknownTrajectory`` if that open
        failed or was cancelled. (Not only while opening: a cancelled open leaves the id closing
        until the container AOE still makes is removed, its ``ready`` holding the error; read
        then, it was answered as if open, no container.)"""
        traj = self.get(trajectory)
        if traj.ready is not None:
            await asyncio.shield(traj.ready)  # (at once when done)
        return traj

    async def of(self, name: str | None) -> Trajectory | None:
        """A submission's trajectory once its container runs; None if ``name`` is None, not
        open, or closing."""
        traj = self.by_id.get(name) if name is not None else None
        if traj is not None and traj.state is TrajState.OPENING and traj.ready is not None:
            await asyncio.shield(traj.ready)
            self._check_running()
        if traj is not None and traj.state is TrajState.CLOSING:
            return None
        return traj

    async def open(
        self,
        trajectory: str | None,
        memory_gb: float | None,
        image: str | None,
        wait_s: float,
        ephemeral: bool,
    ) -> Trajectory:
        """Place the container's memory in the core (waiting up to ``wait_s`` for room), then
        create the container; the trajectory is open once it runs. A None id gets a fresh
        one, a None memory the default."""
        cpu = self.cpu
        if cpu is None:
            raise ExecutorMissing(
                "this runtime has no CPU executor (started without Docker): it cannot open "
                "trajectory containers"
            )
        # Absent fields get their defaults; given ones are checked, never rewritten (an empty
        # id is refused, not replaced by a fresh one): the same rules as over HTTP.
        traj_id = (
            check_trajectory_id("trajectory", trajectory)
            if trajectory is not None
            else f"t-{uuid.uuid4().hex[:12]}"
        )
        self._check_free(traj_id)
        memory = check_memory_gb(
            "memory_gb", self.default_memory_gb if memory_gb is None else memory_gb
        )
        if image is not None:
            check_image("image", image)
        node_spec = cpu.node  # (a multi-node executor's: its largest node)
        # A plain executor's containers go to its node; a multi-node one's where the core
        # places them (the roomiest node: ``Admission.bind``).
        pinned = None if getattr(cpu, "multi_node", False) else node_spec.name
        if memory > node_spec.memory_gb:
            raise BadRequest(
                f"memory_gb={memory:g} exceeds the CPU node {node_spec.name!r} "
                f"({node_spec.memory_gb:g} GB): it could never be placed"
            )
        loop = asyncio.get_running_loop()
        deadline = loop.time() + max(0.0, wait_s)
        while True:
            node = self.scheduler.open_trajectory(
                traj_id, self.host.now(), memory_gb=float(memory), node=pinned
            )
            if node is not None:
                break
            self.host.close_trajectory(traj_id, opened=False)  # forget it
            left = deadline - loop.time()
            if left <= 0:
                where = f"node {pinned!r} has" if pinned else "no CPU node has"
                raise CapacityShort(
                    f"{where} not {memory:g} GB free for trajectory {traj_id!r} now "
                    f"({len(self.by_id)} containers open); retry later"
                )
            async with self._capacity:
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(self._capacity.wait(), timeout=left)
            self._check_running()
            self._check_free(traj_id)
        traj = Trajectory(traj_id, node, float(memory), image, self.host.now(), ephemeral)
        traj.ready = loop.create_future()
        self.by_id[traj_id] = traj
        # Shielded: a cancelled open cannot stop the executor's thread, which makes the
        # container all the same; ``_abandon`` waits for it and removes it.
        making = asyncio.ensure_future(cpu.open(traj_id, float(memory), image))
        try:
            handle = await asyncio.shield(making)
        except asyncio.CancelledError:
            self._abandon(traj, making)
            raise
        except BaseException as exc:
            self.by_id.pop(traj_id, None)
            traj.ready.set_exception(
                UnknownTrajectory(f"trajectory {traj_id!r} failed to open: {exc}")
            )
            traj.ready.exception()  # retrieved: no "never retrieved" warning
            self.host.close_trajectory(traj_id, opened=False)
            await self._notify_capacity()
            if isinstance(exc, Exception) and not isinstance(exc, LiveError):
                raise LiveError(
                    f"could not create the container of trajectory {traj_id!r}: "
                    f"{type(exc).__name__}: {exc}"
                ) from exc
            raise
        traj.container = getattr(handle, "container_id", None)
        traj.state = TrajState.OPEN
        traj.ready.set_result(None)
        self.counters["trajectories_opened"] += 1
        return traj

    def _abandon(self, traj: Trajectory, making: asyncio.Future[object]) -> None:
        """An open cancelled while its container was being made (a caller's ``wait_for`` ran
        out): the id stays closing (an open of it meanwhile is a 409, where AOE, which
        would still have made the container, refused it with a 500) until the container the
        executor makes is removed; then the core forgets it. Forgetting it at once left
        that container in AOE, unknown to the runtime, until the service stopped."""
        traj.state = TrajState.CLOSING
        assert traj.ready is not None
        traj.ready.set_exception(UnknownTrajectory(f"the open of {traj.id!r} was cancelled"))
        traj.ready.exception()  # retrieved: no "never retrieved" warning
        task = asyncio.get_running_loop().create_task(self._remove_abandoned(traj, making))
        self._abandoned.add(task)
        task.add_done_callback(self._abandoned.discard)

    async def _remove_abandoned(self, traj: Trajectory, making: asyncio.Future[object]) -> None:
        try:
            await making
        except BaseException:  # noqa: BLE001 - not made: nothing to remove
            pass
        else:
            try:
                assert self.cpu is not None
                await self.cpu.close(traj.id)
            except Exception as exc:  # noqa: BLE001 - logged; the id is freed either way
                log.warning("removing the container of cancelled open %s failed: %s", traj.id, exc)
        finally:
            if self.by_id.get(traj.id) is traj:
                del self.by_id[traj.id]
            self.host.close_trajectory(traj.id, opened=False)
            await self._notify_capacity()

    async def stop(self) -> None:
        """The runtime stops: opens give up. One waiting for memory is woken to be refused
        (``ShuttingDown``) now; it waited out the rest of its ``wait_s`` after the shutdown."""
        self.stopping = True
        await self._notify_capacity()

    async def settle(self, timeout_s: float) -> None:
        """Wait (up to ``timeout_s``) for the closes under way and the removals of cancelled
        opens, at shutdown: left running, they closed trajectories on a host and executors
        already shut (exceptions never retrieved); the rest is cancelled."""
        pending = self._abandoned | self._closing_tasks
        if not pending:
            return
        _, late = await asyncio.wait(pending, timeout=timeout_s)
        for task in late:
            task.cancel()
        await asyncio.gather(*pending, return_exceptions=True)

    async def close(self, trajectory: str) -> TrajectoryInfo:
        """Its waiting actions end with ``trajectory_closed``, its running ones finish, then
        the core forgets it and its container is removed."""
        traj = self.by_id.get(trajectory)
        if traj is None or traj.state is TrajState.CLOSING:
            raise UnknownTrajectory(f"trajectory {trajectory!r} is not open")
        if traj.state is TrajState.OPENING and traj.ready is not None:
            await asyncio.shield(traj.ready)
            if self._closed_since(traj):  # another close took it while it opened
                raise UnknownTrajectory(f"trajectory {trajectory!r} is not open")
        traj.state = TrajState.CLOSING
        closed = ErrorInfo(
            "trajectory_closed", f"trajectory {trajectory!r} was closed while the action was queued"
        )
        self.host.end_all_waiting(list(traj.active.values()), "error", closed)
        # The rest runs as a task of its own: a close once begun completes even when its caller
        # is cancelled (a ``wait_for`` that ran out while a running action finished); cut
        # short, the trajectory stayed closing for ever, its container and memory held.
        task = asyncio.get_running_loop().create_task(self._finish_close(traj))
        self._closing_tasks.add(task)
        task.add_done_callback(self._closing_tasks.discard)
        return await asyncio.shield(task)

    async def _finish_close(self, traj: Trajectory) -> TrajectoryInfo:
        """The close of a trajectory now closing, its waiting actions ended: its running ones
        finish, the core forgets it and its container is removed."""
        trajectory = traj.id
        host = self.host
        running = [r.task for r in traj.active.values() if r.task is not None and not r.task.done()]
        if running:
            await asyncio.wait(running)
        host.flush()  # its finishes reach the core before the trajectory goes
        host.close_trajectory(trajectory)
        try:
            assert self.cpu is not None
            await self.cpu.close(trajectory)
        except Exception as exc:
            log.warning("removing the container of %s failed: %s", trajectory, exc)
        finally:
            # Closing until its container is gone: an open of the id meanwhile is a 409, not
            # AOE's 'already has a container' (a 500), and a tenant's place stays held.
            if self.by_id.get(trajectory) is traj:
                del self.by_id[trajectory]
            self.counters["trajectories_closed"] += 1
            await self._notify_capacity()
        return traj.info()

    async def recreate(self, trajectory: str) -> Trajectory:
        """A fresh container (same image and memory) for an open trajectory, e.g. after it
        died; its waiting actions run in the new one."""
        traj = self.by_id.get(trajectory)
        if traj is None or traj.state is not TrajState.OPEN:
            raise UnknownTrajectory(f"trajectory {trajectory!r} is not open")
        assert self.cpu is not None
        try:
            handle = await self.cpu.recreate(trajectory)
        except Exception as exc:
            if self._closed_since(traj):
                raise UnknownTrajectory(
                    f"trajectory {trajectory!r} was closed while its container was recreated"
                ) from exc
            if isinstance(exc, LiveError):  # (the executor's own answer: a 500 hid it)
                raise
            raise LiveError(
                f"could not recreate the container of {trajectory!r}: {type(exc).__name__}: {exc}"
            ) from exc
        traj.container = getattr(handle, "container_id", None)
        self.counters["trajectories_recreated"] += 1
        return traj

    def _closed_since(self, traj: Trajectory) -> bool:
        """Whether ``traj`` has been closed (or is closing) since it was looked up: a recreate
        that failed because a close removed its container raced that close, and its answer
        is the closed trajectory's 404, not a failure of the service (it was a 500)."""
        return traj.state is TrajState.CLOSING or self.by_id.get(traj.id) is not traj

    def _check_free(self, traj_id: str) -> None:
        """``Conflict`` when ``traj_id`` is open, or closing (its container not yet removed)."""
        traj = self.by_id.get(traj_id)
        if traj is None:
            return
        if traj.state is TrajState.CLOSING:
            raise Conflict(
                f"trajectory {traj_id!r} is closing (its container is being removed); open "
                "it again once its close has returned"
            )
        raise Conflict(f"trajectory {traj_id!r} is already open")

    def _check_running(self) -> None:
        if self.stopping:
            raise ShuttingDown()

    async def _notify_capacity(self) -> None:
        async with self._capacity:
            self._capacity.notify_all()
