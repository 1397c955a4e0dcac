"""The one driver loop: an instant's events in, one scheduling pass, decisions out, the next
wake-up armed. The simulator, the live runtime and the core's test harness all run it.

A driver (the *host*) owns its clock and its way of waiting; the loop owns the cycle:

1. events are buffered as they happen (``arrive``, ``finish``); the first of an instant asks
   the host for a flush (``request_flush``), which the host runs once the instant has no
   event left (the simulator: no SimPy event at this time; asyncio: the next loop iteration);
2. ``flush`` hands every buffered completion and arrival to ``Scheduler.advance`` together,
   so simultaneous events are one pass (a batch's first actions compete as candidates);
3. the decisions go to the host, one handler per decision type (``start``, ``reject``,
   ``defer``), then ``settled`` (the simulator samples usage there);
4. when the core wants a wake-up (an API rate token frees later), the host is asked for a
   timer at that time, once per distinct time; the timer calls ``wake``, whose tick may want
   the next one.

Like the rest of the core it never reads a clock: every call that acts takes ``now``.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Protocol

from tangram.core.action import Action
from tangram.core.decision import Decision, Defer, Reject, Resize, Start
from tangram.core.resources import CpuNodeSpec, GpuNodeSpec
from tangram.core.scheduler import Scheduler


class Host(Protocol):
    """What a driver gives the loop: where decisions go and how it waits.

    ``request_flush``, ``handed`` and ``settled`` may be ``None`` on a host that needs no such
    call (the simulator polls ``flush_requested`` instead of being asked): the loop then skips
    the call, which it would otherwise make for every event.
    """

    def start(self, start: Start) -> None:
        """Carry out a start (run the action on its units)."""

    def reject(self, reject: Reject) -> None:
        """The action can never run as asked: end it with the reason."""

    def defer(self, defer: Defer) -> None:
        """The action stays queued although it could have started (count it)."""

    def resize(self, resize: Resize) -> None:
        """A running malleable action's cores changed (apply the new cpuset; a host whose
        scheduler is not ``resizable`` never gets one and may leave it out)."""

    def handed(self, arrived: Sequence[Action], finished: Sequence[str]) -> None:
        """These events go to the core now, in one pass (the runtime moves their phases)."""

    def settled(self, now: float) -> None:
        """A batch of decisions has been carried out (the core's state is current)."""

    def request_flush(self) -> None:
        """Call ``flush`` once the current instant has no event left."""

    def arm_wakeup(self, when: float) -> None:
        """Call ``wake(when, now)`` at time ``when`` (or as soon after as the driver can)."""

    def pass_failed(
        self, arrived: Sequence[Action], finished: Sequence[str], error: Exception
    ) -> None:
        """The scheduler raised on this pass's events: end them or re-raise (a core bug)."""


class DriverLoop:
    """Batches a driver's events into scheduling passes and routes the decisions back."""

    __slots__ = (
        "scheduler",
        "host",
        "timer",
        "arrivals",
        "finishes",
        "flush_requested",
        "armed",
        "decisions",
        "passes",
        "core_seconds",
        "_handlers",
        "_handed",
        "_settled",
        "_request_flush",
        "_pending",
    )

    def __init__(
        self, scheduler: Scheduler, host: Host, *, timer: Callable[[], float] | None = None
    ) -> None:
        self.scheduler = scheduler
        self.host = host
        #: A wall clock to measure the time spent in the scheduler (profiling only; optional).
        self.timer = timer
        self.arrivals: list[Action] = []
        self.finishes: list[str] = []
        self.flush_requested = False
        #: Wake-up times a host timer is armed for (each distinct time armed once).
        self.armed: set[float] = set()
        self.decisions = 0
        self.passes = 0
        self.core_seconds = 0.0
        self._handlers: dict[type, Callable[[Decision], None]] = {
            Start: host.start,  # type: ignore[dict-item]
            Reject: host.reject,  # type: ignore[dict-item]
            Defer: host.defer,  # type: ignore[dict-item]
        }
        if scheduler.resizable:
            self._handlers[Resize] = host.resize  # type: ignore[assignment]
        self._request_flush = host.request_flush
        self._handed = host.handed
        self._settled = host.settled
        #: While a batch is being applied, decisions a handler's own call produced (a reject
        #: whose handler closes the trajectory): they run after the batch (None: not applying).
        self._pending: list[Decision] | None = None

    # ------------------------------------------------------------------ events in
    def arrive(self, action: Action) -> None:
        """An action arrived; the core sees it at the instant's flush."""
        self.arrivals.append(action)
        if not self.flush_requested:  # the instant's first event: ask the host for a flush
            self.flush_requested = True
            if self._request_flush is not None:  # (None: the host polls flush_requested)
                self._request_flush()

    def finish(self, action_id: str) -> None:
        """A running action ended (whatever its outcome); its units return at the flush."""
        self.finishes.append(action_id)
        if not self.flush_requested:  # the instant's first event: ask the host for a flush
            self.flush_requested = True
            if self._request_flush is not None:  # (None: the host polls flush_requested)
                self._request_flush()

    def retract(self, action_id: str) -> bool:
        """Drop an arrival the core has not seen yet (withdrawn before the flush)."""
        for i, action in enumerate(self.arrivals):
            if action.id == action_id:
                del self.arrivals[i]
                return True
        return False

    # ------------------------------------------------------------------ passes
    def flush(self, now: float) -> None:
        """Hand the instant's completions and arrivals to the core in one pass; apply."""
        self.flush_requested = False
        arrived, finished = self.arrivals, self.finishes
        if self.host is None:  # detached: the events are dropped, the core never sees them
            if arrived or finished:
                self.arrivals, self.finishes = [], []
            return
        if arrived:
            self.arrivals = []
        elif not finished:
            return
        if finished:
            self.finishes = []
        if self._handed is not None:
            self._handed(arrived, finished)
        timer = self.timer
        try:
            if timer is None:
                decisions = self.scheduler.advance(now, finished=finished, arrived=arrived)
            else:
                t0 = timer()
                decisions = self.scheduler.advance(now, finished=finished, arrived=arrived)
                self.core_seconds += timer() - t0
        except Exception as exc:
            self.host.pass_failed(arrived, finished, exc)
            return
        self.passes += 1
        self.apply(decisions, now)

    def wake(self, when: float, now: float) -> None:
        """The timer armed for ``when`` fired: tick the core (rate tokens may be free now)."""
        self.armed.discard(when)
        if self.host is not None:  # (detached: dropped)
            self.apply(self.scheduler.tick(now), now)

    def close_trajectory(self, trajectory: str, now: float, *, opened: bool = True) -> None:
        """The trajectory ended: its queued actions are rejected, its container freed
        (``opened`` False: a failed open is undone, the actions labelled with it stay).
        Its actions whose finish is buffered here have ended (``Scheduler.close_trajectory``'s
        ``ended``): the simulator closes a trajectory as its last action ends, before the
        instant's flush hands that finish over."""
        if self.host is not None:  # (detached: dropped)
            decisions = self.scheduler.close_trajectory(
                trajectory, now, opened=opened, ended=self.finishes
            )
            self.apply(decisions, now)

    def add_node(self, node: CpuNodeSpec | GpuNodeSpec, now: float) -> None:
        """A node joined the running cluster: work waiting for room may start there."""
        if self.host is not None:  # (detached: dropped)
            self.apply(self.scheduler.add_node(node, now), now)

    def unfence_node(self, node: str, now: float) -> None:
        """A fenced node's capacity is back (``Scheduler.unfence_node``): queued work may
        start there."""
        self.apply(self.scheduler.unfence_node(node, now), now)

    def withdraw(self, action_id: str, now: float) -> bool:
        """Take back a waiting action: buffered or queued in the core (False: not waiting).
        Taken from the core's queue, the actions it held back may start now (a pass)."""
        if self.retract(action_id):
            return True
        if not self.scheduler.withdraw(action_id, now):
            return False
        if self.host is not None:
            self.apply(self.scheduler.after_withdrawals(now), now)
        return True

    def detach(self) -> None:
        """Forget the host (the driver is done): the host holds the loop, so this breaks the
        reference cycle and lets reference counting free both. Later events are dropped: the
        core never sees them (a flush, wake, close or node join does nothing), since no host
        would carry out what they decide."""
        self.host = None  # type: ignore[assignment]
        self._handlers = {}
        self._handed = self._settled = self._request_flush = None

    def apply(self, decisions: list[Decision], now: float) -> None:
        """Route each decision to the host's handler for its type, then arm the next wake-up.

        Decisions that a handler's call into the loop returns (a reject whose handler closes
        its trajectory) go after the rest of the batch, in order: the pass that made them saw
        the whole batch as done, so one of them may resize an action whose start is still in
        the batch (hypothesis found one: a resize before its start)."""
        pending = self._pending
        if pending is not None:  # (inside a handler: the outer call applies them)
            pending.extend(decisions)
            return
        if decisions:
            self._pending = pending = []
            try:
                handlers = self._handlers
                batch: list[Decision] = decisions
                while batch:
                    self.decisions += len(batch)
                    for d in batch:
                        handlers[type(d)](d)
                    batch = pending[:]  # (what the handlers' own calls returned)
                    pending.clear()
            finally:
                self._pending = None
        if self._settled is not None:
            self._settled(now)
        wake = self.scheduler.wakeup
        if wake is not None and wake > now and wake not in self.armed:
            self.armed.add(wake)
            self.host.arm_wakeup(wake)
