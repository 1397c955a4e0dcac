"""What a policy sees and does during one scheduling pass.

A policy reads the queues, options, running actions and free capacity through the ``Context``
and acts through it: ``start`` (the one way an action starts), ``defer`` and ``reject``. Each
act applies at once, so a later decision in the same pass sees the capacity an earlier one took.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from typing import TYPE_CHECKING

from tangram.core.action import Action
from tangram.core.backlog import Domain
from tangram.core.decision import Decision, Defer, Reject, Resize, Start
from tangram.core.fastpaths import FastPaths
from tangram.core.options import Options
from tangram.core.resize import resize_action
from tangram.core.running import Running
from tangram.core.starts import start_action

if TYPE_CHECKING:
    from tangram.core.scheduler import Scheduler

_EMPTY: tuple[Action, ...] = ()
_NONE: dict[str, Action] = {}
_NO_RUNS: dict[str, Running] = {}


class Context:
    """One pass: its time, the events since the last pass, and the decisions it makes.

    ``arrived`` and ``finished`` are the events since the last pass; ``dirty`` the domains
    whose queue or free capacity changed; ``fast`` the scheduler's shortcut switch.
    """

    __slots__ = ("scheduler", "state", "now", "decisions", "arrived", "finished")
    __slots__ += ("closed", "dirty", "_backlog", "_runs")

    def __init__(self, scheduler: Scheduler, now: float) -> None:
        self.scheduler = scheduler
        self.state = scheduler.state
        self.now = now
        self.decisions: list[Decision] = []
        self.arrived: list[Action] = []
        self.finished: list[Running] = []
        self.closed: Sequence[str] = ()  # (a close's pass sets it)
        self.dirty: dict[Domain, None] = {}
        self._backlog = scheduler.backlog
        self._runs = scheduler.runs

    # --- reading ---------------------------------------------------------------------------
    def queue(self, domain: Domain) -> Iterator[Action]:
        """Queued actions of a domain in FCFS order (safe to start/reject while iterating)."""
        return iter(self._backlog.queues.get(domain, _EMPTY))

    def queue_len(self, domain: Domain) -> int:
        queue = self._backlog.queues.get(domain)
        return len(queue.live) if queue is not None else 0

    def queue_head(self, domain: Domain) -> Action | None:
        """The oldest queued action of a domain (None when the queue is empty)."""
        queue = self._backlog.queues.get(domain)
        return next(iter(queue.live.values()), None) if queue is not None else None

    @property
    def fast(self) -> FastPaths:
        """The scheduler's speed-shortcut switch (``tangram.core.fastpaths``)."""
        return self.scheduler.fast

    def services_waiting(self) -> list[str]:
        """The GPU services with a queue (some may be empty now), in first-call order."""
        return list(self._backlog.gpu_by_service)

    def queued_of_service(self, service: str) -> Iterator[Action]:
        return iter(self._backlog.gpu_by_service.get(service, _EMPTY))

    def queued_of_trajectory(self, trajectory: str) -> Iterator[Action]:
        """A trajectory's queued actions in FCFS order (safe to start/reject while iterating)."""
        by_trajectory = self._backlog.by_trajectory
        for action in tuple(by_trajectory.get(trajectory, _NONE).values()):
            if action.id in by_trajectory.get(trajectory, _NONE):
                yield action

    def running_in(self, domain: Domain) -> Iterator[Running]:
        return iter(self._runs.by_domain.get(domain, _NO_RUNS).values())

    def options(self, action: Action) -> Options:
        return self._backlog.options[action.id]

    def node_of(self, action: Action) -> str | None:
        """The CPU node an action is bound to (its trajectory's container)."""
        traj = self.scheduler.admission.trajectories.get(action.trajectory)
        return traj.node if traj else None

    def restore_cost(self, action: Action, node: str, cell_size: int = 1) -> float:
        """EOE restore estimate of the action's service onto a cell of ``node``
        (``GpuNodeSpec.restore_s``)."""
        return self.state.gpu[node].spec.restore_s(
            action.service_size_gb, cell_size, replicas=action.service_replicas
        )

    # --- acting ------------------------------------------------------------------------------
    def start(
        self,
        action: Action,
        node: str,
        units: int,
        reason: str,
        *,
        cores: tuple[int, ...] | None = None,
        gpus: tuple[int, ...] = (),
        in_slot: bool = False,
        slot_since: float | None = None,
        threads: int = 0,
    ) -> Start:
        """Start a queued action on ``node`` with ``units`` of its options.

        A CPU action runs on ``cores`` when given (a static pod's), else on NUMA-local cores
        the core picks and takes (``tangram.core.numa``); a GPU call on the aligned cell
        ``gpus``. ``in_slot``: the units are a reservation its trajectory or service already
        holds. ``threads``: a non-malleable CPU action told to run more threads than its
        units (``Start.threads``; only where the driver resizes). Capacity is checked and taken here; a policy asking for what is not free, or
        for units that are not one of the action's options, gets a ``CapacityError``.
        (``tangram.core.starts.start_action`` is the one way an action starts.)
        """
        backlog = self._backlog
        start = start_action(
            self.scheduler,
            action,
            node,
            units,
            reason,
            backlog.options[action.id],
            backlog.domain_of[action.id],
            self.now,
            cores,
            gpus,
            in_slot,
            slot_since=slot_since,
            threads=threads,
        )
        self.decisions.append(start)
        return start

    #: ``start`` a CPU action on cores the core picks: the same call as ``start`` without
    #: ``cores``, kept under this name for the policies written against it.
    start_on_cores = start

    def resize(self, running: Running, units: int, reason: str) -> Resize:
        """Grow or shrink a running malleable CPU action to ``units`` cores
        (``tangram.core.resize``); only a scheduler whose driver applies resizes allows it."""
        if not self.scheduler.resizable:
            raise RuntimeError("this scheduler's driver cannot resize running actions")
        resize = resize_action(self.scheduler, running, units, reason, self.now)
        self.decisions.append(resize)
        self.dirty[running.domain] = None
        return resize

    def defer(self, action: Action, reason: str) -> None:
        self.decisions.append(Defer(self.now, action, reason))

    def reject(self, action: Action, reason: str) -> None:
        self._backlog.remove(action)
        self.decisions.append(Reject(self.now, action, reason))

    def hold_cores(self, node: str, cores: tuple[int, ...]) -> None:
        """Take cores out of the free pool without an action (a static baseline's reservation)."""
        self.state.cpu[node].take_cores(cores)

    def unhold_cores(self, node: str, cores: tuple[int, ...]) -> None:
        self.state.cpu[node].give_cores(cores)
        self.dirty[("cpu", node)] = None

    def hold_cell(self, node: str, cell: tuple[int, ...], holder: str) -> None:
        """Take a GPU cell for a holder that is not an action (a dedicated service)."""
        self.state.gpu[node].take(cell, holder)

    def wake_at(self, when: float) -> None:
        """Ask the driver to call ``tick`` at ``when`` (a rate limit frees a token then)."""
        sched = self.scheduler
        sched.wakeup = when if sched.wakeup is None else min(sched.wakeup, when)
