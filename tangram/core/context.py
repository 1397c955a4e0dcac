"""What a policy sees and does during one scheduling pass.

A policy reads the queues, options, running actions and free capacity through the ``Context``
and acts through it: ``start`` (the one way an action starts), ``defer`` and ``reject``. Each
act applies at once, so a later decision in the same pass sees the capacity an earlier one took.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import TYPE_CHECKING

from tangram.core.action import Action
from tangram.core.backlog import Domain
from tangram.core.decision import Decision, Defer, Reject, Start
from tangram.core.options import Options, option_index
from tangram.core.resources import ResourceKind
from tangram.core.running import Running
from tangram.core.state import CapacityError

if TYPE_CHECKING:
    from tangram.core.scheduler import Scheduler

_EMPTY: tuple[Action, ...] = ()
_NONE: dict[str, Action] = {}


class Context:
    """One pass: its time, the events since the last pass, and the decisions it makes.

    ``arrived`` and ``finished`` are the events since the last pass; ``dirty`` the domains
    whose queue or free capacity changed; ``fast`` the scheduler's shortcut switch.
    """

    __slots__ = ("scheduler", "state", "now", "fast", "decisions", "arrived", "finished")
    __slots__ += ("closed", "dirty", "_backlog", "_runs")

    def __init__(self, scheduler: Scheduler, now: float) -> None:
        self.scheduler = scheduler
        self.state = scheduler.state
        self.now = now
        self.fast = scheduler.fast
        self.decisions: list[Decision] = []
        self.arrived: list[Action] = []
        self.finished: list[Running] = []
        self.closed: list[str] = []
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
        return self._runs.in_domain(domain)

    def options(self, action: Action) -> Options:
        return self._backlog.options[action.id]

    def node_of(self, action: Action) -> str | None:
        """The CPU node an action is bound to (its trajectory's container)."""
        traj = self.scheduler.admission.trajectories.get(action.trajectory)
        return traj.node if traj else None

    def restore_cost(self, action: Action, node: str, cell_size: int = 1) -> float:
        """EOE restore estimate: each GPU of the cell loads its 1/k shard over its own
        host-to-GPU link, so k GPUs restore k times faster (plus the fixed cost)."""
        spec = self.state.gpu[node].spec
        return action.service_size_gb / (cell_size * spec.h2d_gbps) + spec.restore_fixed_s

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
    ) -> Start:
        """Start a queued action on ``node`` with ``units`` of its options.

        A CPU action runs on ``cores`` when given (a static pod's), else on NUMA-local cores
        the core picks and takes (``tangram.core.numa``); a GPU call on the aligned cell
        ``gpus``. ``in_slot``: the units are a reservation its trajectory or service already
        holds. Capacity is checked and taken here; a policy asking for what is not free, or
        for units that are not one of the action's options, gets a ``CapacityError``.
        """
        backlog = self._backlog
        return self._start(
            action,
            node,
            units,
            reason,
            backlog.options[action.id],
            backlog.domain_of[action.id],
            cores,
            gpus,
            in_slot,
            True,
        )

    def start_on_cores(self, action: Action, node: str, units: int, reason: str) -> Start:
        """``start`` a CPU action on ``units`` cores the core picks (the same as ``start``
        without ``cores``; kept for the policies written against it)."""
        return self.start(action, node, units, reason)

    def _start(
        self,
        action: Action,
        node: str,
        units: int,
        reason: str,
        opts: Options,
        domain: Domain,
        cores: tuple[int, ...] | None,
        gpus: tuple[int, ...],
        in_slot: bool,
        queued: bool,
    ) -> Start:
        """The one way an action starts: check its option, take its capacity, record it as
        running (out of the queue when ``queued``), and return the decision."""
        option = option_index(action, opts, units)
        kind = action.resource
        bounded = self.scheduler.respects_capacity
        restore, overhead = False, 0.0
        if kind is ResourceKind.CPU:
            if (cores is None or (bounded and not in_slot)) and (
                domain[1] != node or domain[0] != "cpu"
            ):
                raise CapacityError(
                    f"{action.id}: CPU action started on {node}, its container is on {domain[1]}"
                )
            if cores is None:
                # An unbounded policy holds nothing (its starts are never given back): no cores.
                cores = self.state.cpu[node].grant_cores(units) if bounded else ()
            elif bounded and not in_slot:
                if len(cores) != units:
                    raise CapacityError(f"{action.id}: {units} units but {len(cores)} cores")
                self.state.cpu[node].take_cores(cores)
        elif kind is ResourceKind.GPU:
            cores = ()
            if bounded:
                restore = not self.state.gpu[node].is_resident(action.service or "", gpus)
                overhead = self.restore_cost(action, node, len(gpus)) if restore else 0.0
                if not in_slot:
                    if len(gpus) != units:
                        raise CapacityError(f"{action.id}: {units} units but cell {gpus}")
                    self.state.gpu[node].take(gpus, action.id)
        else:
            cores = ()
            if bounded and not in_slot:
                self.state.api[action.service or ""].take(self.now)
        start = Start(  # positional, in field order: the hot path of every replay
            self.now,
            action,
            node,
            units,
            reason,
            cores,
            gpus,
            restore,
            in_slot,
            opts.durations[option],
            overhead,
        )
        if queued:
            self._backlog.remove(action)
        self._runs.add(start, domain)
        self.decisions.append(start)
        return start

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
