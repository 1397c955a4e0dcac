"""The live host of the driver loop: carries accepted actions, on asyncio, to their one outcome.

``tangram.core.loop.DriverLoop`` owns the cycle (an instant's events -> ``Scheduler.advance``
-> decisions -> the next wake-up); this module is the live runtime's side of it:

- events in: ``accept`` (an arrival, with its deadline timer) and ``finish`` (its executor
  returned); the first of an event-loop iteration schedules ``flush`` with ``call_soon``, so
  the iteration's events are one scheduling pass;
- decisions out: a ``Start`` runs the action on its executor as a task, a ``Reject`` ends it
  with the core's reason, a ``Defer`` is counted, a ``Resize`` (only when the scheduler is
  ``resizable``: its CPU executor applies resizes) goes to the running action's executor
  (``resize``: AOE rewrites its container's cpuset and quota) and is logged in ``resizes``;
  one that finds the action ended is a no-op, one that fails leaves it on its old cores; a wake-up the core asks for (an API rate
  token frees then) is a ``call_at`` timer that ticks it;
- outcomes: ``end`` gives an action its one outcome (later calls are ignored) and hands it to
  the runtime (journal, trace, listeners); ``before_start`` runs before every start (the
  journal's write-ahead) and keeps the action from running if it fails. A deadline or a
  cancel ends a waiting action at once, withdrawn from the loop or the core's queue; a
  running one as its executor's ``on_deadline`` says.

Phases change only through ``actions.move``.
"""

from __future__ import annotations

import asyncio
import logging
from collections import Counter, deque
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

from tangram.core.action import Action
from tangram.core.decision import Defer, Reject, Resize, Start
from tangram.core.loop import DriverLoop
from tangram.core.scheduler import Scheduler
from tangram.exec.runtime.actions import WAITING, ActionTable, LiveAction, Phase, move
from tangram.exec.runtime.config import RuntimeConfig
from tangram.exec.runtime.errors import NotCancellable
from tangram.exec.runtime.executor import OnDeadline
from tangram.exec.runtime.outcomes import outcome_of
from tangram.exec.runtime.records import ErrorInfo, Outcome
from tangram.exec.runtime.result import ExecResult, NeverRan, failed

log = logging.getLogger(__name__)

#: A wake-up timer fires this long after the core's time, so the core's clock has passed it.
WAKE_SLACK_S = 1e-4

#: The least time between two age expiries of the action table while actions end: one per
#: second at most, not a timer per ended action (each action's own end expires by count).
EXPIRY_EVERY_S = 1.0

#: How many resizes ``LiveHost.resizes`` keeps (the latest).
KEEP_RESIZES = 1000


@dataclass(frozen=True)
class ResizeRecord:
    """One ``Resize`` the core decided and what became of it (``LiveHost.resizes``).

    ``status``: ``applied``/``unchanged`` (the action runs on ``cores`` now), ``pending``
    (applied when AOE grants its first cores), ``ended`` (it had ended: a no-op) or
    ``failed`` (it runs on, on its old cores; ``error`` says why)."""

    action_id: str
    time: float
    #: The new core set the core decided (its numbering) and the units it had before.
    cores: tuple[int, ...]
    previous: int
    status: str
    #: Seconds of the cgroup (or engine) writes.
    write_s: float = 0.0
    error: str | None = None


class LiveHost:
    """The driver loop's host in the live runtime, and the life of each accepted action."""

    def __init__(
        self,
        scheduler: Scheduler,
        config: RuntimeConfig,
        counters: Counter[str],
        on_end: Callable[[LiveAction, Outcome], None],
    ) -> None:
        self.config = config
        self.counters = counters
        #: Called once per action with its outcome (the runtime records and publishes it).
        self.on_end = on_end
        self.table = ActionTable(config.keep_outcomes, config.keep_outcomes_s)
        #: Run before any action starts; raising keeps it from running. The runtime writes
        #: its journal's acceptances here, so an action that may run is on disk first.
        self.before_start: Callable[[], None] | None = None
        self.loop = DriverLoop(scheduler, self)
        #: Actions accepted and not yet ended (what admission control bounds).
        self.pending = 0
        self._aio: asyncio.AbstractEventLoop | None = None
        self._time: Callable[[], float] = lambda: 0.0
        self._t0 = 0.0
        self._wakers: dict[float, asyncio.TimerHandle] = {}
        #: The timer of the action table's next age expiry (``_arm_expiry``).
        self._expiry: asyncio.TimerHandle | None = None
        #: The latest resizes and what became of them (oldest dropped first).
        self.resizes: deque[ResizeRecord] = deque(maxlen=KEEP_RESIZES)
        self._resizing: set[asyncio.Task[None]] = set()
        self._attached = True
        self._deadline_rules: dict[OnDeadline, Callable[[LiveAction, str], None]] = {
            OnDeadline.CANCEL: self._cancel_at_deadline,
            OnDeadline.END_NOW: self._end_at_deadline,
            OnDeadline.AWAIT_KILL: self._await_kill,
        }

    def bind(self, aio: asyncio.AbstractEventLoop, t0: float) -> None:
        """Run on ``aio``; the clock is seconds since ``t0`` on its monotonic time."""
        self._aio, self._time, self._t0 = aio, aio.time, t0

    def now(self) -> float:
        return self._time() - self._t0

    def close(self) -> None:
        """The runtime is closing: no more wake-ups or passes; the loop forgets its host."""
        for timer in self._wakers.values():
            timer.cancel()
        self._wakers.clear()
        if self._expiry is not None:
            self._expiry.cancel()
            self._expiry = None
        if self._attached:
            self._attached = False
            self.loop.detach()

    # ------------------------------------------------------------------ events in
    def accept(self, rec: LiveAction, timeout_s: float) -> None:
        """A new action: in the table, its deadline armed, to the core at the next pass."""
        assert self._aio is not None
        self.table.add(rec)
        self.pending += 1
        rec.timers.append(self._aio.call_later(timeout_s, self.on_deadline, rec))
        self.loop.arrive(rec.action)

    def finish(self, rec: LiveAction) -> None:
        """``rec`` left its executor: its units return to the core at the next pass."""
        move(rec, Phase.FINISHING)
        if self._attached:
            self.loop.finish(rec.id)

    def flush(self) -> None:
        """One scheduling pass over the events buffered so far (the loop's ``flush``)."""
        if self._attached:
            self.loop.flush(self.now())

    def handed(self, arrived: Sequence[Action], finished: Sequence[str]) -> None:
        """The pass's arrivals enter the core's queue; its finishes leave the core's books."""
        table = self.table
        for action in arrived:
            move(table.get(action.id), Phase.QUEUED)  # type: ignore[arg-type]
        for action_id in finished:
            rec = table.get(action_id)
            if rec is not None:
                move(rec, Phase.OUT)

    def close_trajectory(self, trajectory: str, *, opened: bool = True) -> None:
        """The core forgets the trajectory: its queued actions are rejected, its memory freed
        (``opened`` False: an open that failed; the actions labelled with it stay)."""
        if self._attached:
            self.loop.close_trajectory(trajectory, self.now(), opened=opened)

    # ------------------------------------------------------------------ the loop's host
    def request_flush(self) -> None:
        assert self._aio is not None
        self._aio.call_soon(self.flush)

    def arm_wakeup(self, when: float) -> None:
        assert self._aio is not None
        self._wakers[when] = self._aio.call_at(self._t0 + when + WAKE_SLACK_S, self._wake, when)

    def _wake(self, when: float) -> None:
        self._wakers.pop(when, None)
        if self._attached:
            self.loop.wake(when, self.now())

    def start(self, d: Start) -> None:
        rec = self.table.get(d.action.id)
        if rec is None:  # forgotten (keep_outcomes) and started now: give the units back
            log.warning("start of a forgotten action %s; finishing it", d.action.id)
            self.loop.finish(d.action.id)
            return
        rec.start, rec.started_at = d, self.now()
        move(rec, Phase.RUNNING)
        if rec.outcome is not None:  # it ended while queued: give the units back
            self.finish(rec)
            return
        if self.before_start is not None:
            try:
                self.before_start()
            except Exception as exc:  # noqa: BLE001 - the action must not run unrecorded
                log.exception("could not record %s before its start; it does not run", rec.id)
                self.finish(rec)
                rec.started_at = None  # (it never started: no start time, no units)
                message = f"the service could not record the action before running it: {exc}"
                self.end(rec, "error", error=ErrorInfo("journal_failed", message, True))
                return
        assert self._aio is not None
        rec.task = self._aio.create_task(self._execute(rec))
        rec.task.add_done_callback(lambda task: self._unstarted(rec, task))

    def resize(self, d: Resize) -> None:
        """Apply a resize to the running action's container, in decision order (its executor
        has one resize thread). The core may resize an action whose end it has not yet
        taken: that is a no-op (``ended``), as is one its executor cannot resize."""
        rec = self.table.get(d.action.id)
        apply = getattr(rec.executor, "resize", None) if rec is not None else None
        # (An action ended by its deadline may still run until AOE's kill: its executor has
        # it, so the resize goes on; the executor says ``ended`` once its run returned.)
        if rec is None or rec.phase is not Phase.RUNNING:
            self._resized(d, "ended", error="the action had ended")
            return
        if apply is None:  # (a scheduler is resizable only with a CPU executor that resizes)
            self._resized(d, "failed", error=f"{type(rec.executor).__name__} cannot resize")
            return
        assert self._aio is not None
        task = self._aio.create_task(self._resize(d, apply))
        self._resizing.add(task)
        task.add_done_callback(self._resizing.discard)

    async def _resize(self, d: Resize, apply: Callable[..., Any]) -> None:
        try:
            result = await apply(d.action.id, d.cores)
        except Exception as exc:  # noqa: BLE001 - a failed resize must not lose the action
            self._resized(d, "failed", error=f"{type(exc).__name__}: {exc}")
            return
        self._resized(d, result.status, write_s=result.write_s, error=result.error)

    def _resized(self, d: Resize, status: str, *, write_s: float = 0.0, error: str | None = None):
        """Count and log what became of a resize."""
        self.counters[f"resizes_{status}"] += 1
        self.resizes.append(
            ResizeRecord(d.action.id, d.time, d.cores, d.previous, status, write_s, error)
        )
        if status == "failed":
            log.warning(
                "resize of %s to cores %s failed; it runs on its old cores (the scheduler "
                "counts the new ones until it ends): %s",
                d.action.id,
                d.cores,
                error,
            )

    def reject(self, d: Reject) -> None:
        rec = self.table.get(d.action.id)
        if rec is None:
            return
        move(rec, Phase.OUT)
        if rec.outcome is None:
            self.end(rec, "error", error=ErrorInfo("rejected", d.reason))

    def defer(self, d: Defer) -> None:
        rec = self.table.get(d.action.id)
        if rec is not None:
            rec.deferrals += 1
            self.counters["deferrals"] += 1

    #: None: the live runtime samples no usage after a pass (status reads the core's state).
    settled = None

    def pass_failed(
        self, arrived: Sequence[Action], finished: Sequence[str], error: Exception
    ) -> None:
        """A core bug: the pass's arrivals end with an error rather than being lost (its
        finishes leave the core's books with the pass, in ``flush``)."""
        log.error("the scheduler failed on a pass; its actions end with an error", exc_info=error)
        info = ErrorInfo("scheduler_error", f"{type(error).__name__}: {error}")
        for action in arrived:
            rec = self.table.get(action.id)
            if rec is not None:
                move(rec, Phase.OUT)
                self.end(rec, "error", error=info)

    # ------------------------------------------------------------------ execution
    async def _execute(self, rec: LiveAction) -> None:
        start = rec.start
        assert start is not None and rec.started_at is not None
        time_left_s = rec.deadline - self.now()
        if time_left_s <= 0:
            self._never_ran(rec, f"timed out after {rec.deadline - rec.arrival:g} s")
            return
        try:
            result = await rec.executor.execute(
                rec.spec.work, start, trajectory=rec.traj, time_left_s=time_left_s
            )
        except NeverRan:  # (cancelled before its executor began it: it never started)
            result = self._cancelled_unrun(rec)
        except asyncio.CancelledError:
            status, error = rec.interrupt or (
                "error",
                ErrorInfo("cancelled", "the action was interrupted"),
            )
            result = ExecResult(status, error=error, exec_s=self.now() - rec.started_at)  # type: ignore[arg-type]
        except Exception as exc:
            log.exception("executor failed on %s", rec.id)
            result = failed("executor_error", f"the executor raised {type(exc).__name__}: {exc}")
        else:
            if rec.interrupt is not None:  # the call swallowed its cancel: the cancel stands
                status, error = rec.interrupt
                result = ExecResult(status, error=error, exec_s=result.exec_s, wait_s=result.wait_s)  # type: ignore[arg-type]
        if result.detail and "held_units" in result.detail:
            rec.held_units = result.detail["held_units"]
        self.finish(rec)
        if not result.ran:  # its executor never ran it: no start time, no units
            rec.started_at = None
        self.end(
            rec,
            result.status,
            value=result.value,
            error=result.error,
            exec_s=result.exec_s,
            wait_s=result.wait_s,
        )

    def _cancelled_unrun(self, rec: LiveAction) -> ExecResult:
        """The result of ``rec``, whose interrupt (its deadline, its client's cancel) came
        while its executor had not begun it (``NeverRan``): never started (``ran`` False), its
        message saying so. The deadline's own message said 'it started after N s'."""
        status, error = rec.interrupt or (
            "error",
            ErrorInfo("cancelled", "the action was interrupted"),
        )
        if status == "timeout":
            timeout = rec.deadline - rec.arrival
            message = f"timed out after {timeout:g} s before its executor could start it"
        else:
            message = error.message
        error = ErrorInfo(error.code, f"{message}; it never started", error.retryable)
        return ExecResult(status, error=error, ran=False)  # type: ignore[arg-type]

    def _never_ran(self, rec: LiveAction, why: str) -> None:
        """``rec`` was started with no time left (its start and its deadline came in one
        event-loop iteration): its executor is not called and it ends as a time-out that
        never started (no start time, no units), as one timed out in the queue does; not as
        a time-out of a started action (``/run_code`` answered ``TimeLimitExceeded`` for a
        command that never ran, which SandboxFusion's client does not retry)."""
        self.finish(rec)
        rec.started_at = None
        message = f"{why} before its executor could start it; it never started"
        self.end(rec, "timeout", error=ErrorInfo("timeout", message))

    def _unstarted(self, rec: LiveAction, task: asyncio.Task[None]) -> None:
        """``rec``'s task was cancelled before its first step (a deadline, a client's
        cancel or the shutdown right after the start): ``_execute`` never ran, so its units
        and its outcome are given here, as an action that never started (no start time: its
        executor was never called, so a client may safely send it again)."""
        if not task.cancelled() or rec.outcome is not None:
            return
        status, error = rec.interrupt or (
            "error",
            ErrorInfo("cancelled", "the action was interrupted"),
        )
        self.finish(rec)
        rec.started_at = None
        self.end(rec, status, error=error)

    # ------------------------------------------------------------------ deadlines, cancels
    def on_deadline(self, rec: LiveAction) -> None:
        """``rec``'s time-out passed: a waiting action ends now; a running one as its
        executor's rule says."""
        if rec.outcome is not None:
            return
        timeout = rec.deadline - rec.arrival
        if rec.phase in WAITING:
            message = f"timed out after {timeout:g} s in the queue; it never started"
            self.end_waiting(rec, "timeout", ErrorInfo("timeout", message))
            return
        assert rec.started_at is not None
        message = (
            f"timed out after {timeout:g} s (it started after {rec.started_at - rec.arrival:.3f} s)"
        )
        self._deadline_rules[rec.executor.on_deadline](rec, message)

    def _cancel_at_deadline(self, rec: LiveAction, message: str) -> None:
        if not self._interrupt(
            rec, "timeout", ErrorInfo("timeout", message + rec.executor.deadline_note)
        ):
            return  # a client's cancel came first: it stands, bounded by its own grace
        # A call that swallows its cancel is not waited for past the grace (its units stay
        # held until it returns: ``finish`` comes with its task's end).
        assert self._aio is not None
        grace = self.config.timeout_grace_s
        note = f"; the call was cancelled and had not returned {grace:g} s later"
        rec.timers.append(self._aio.call_later(grace, self._end_running, rec, message + note))

    def _end_at_deadline(self, rec: LiveAction, message: str) -> None:
        self._end_running(rec, message + rec.executor.deadline_note)

    def _await_kill(self, rec: LiveAction, message: str) -> None:
        assert self._aio is not None
        rec.timers.append(
            self._aio.call_later(
                self.config.timeout_grace_s,
                self._end_running,
                rec,
                message + rec.executor.deadline_note,
            )
        )

    def ran(self, rec: LiveAction) -> float:
        """Seconds ``rec`` has run since its start (0 if it never started): the execution
        time of an action ended while its executor still runs it."""
        return 0.0 if rec.started_at is None else max(0.0, self.now() - rec.started_at)

    def _end_running(self, rec: LiveAction, message: str) -> None:
        """End a running action with a time-out now, whatever its executor still does."""
        if rec.outcome is None:
            self.end(rec, "timeout", error=ErrorInfo("timeout", message), exec_s=self.ran(rec))

    def _end_cancelled(self, rec: LiveAction, error: ErrorInfo) -> None:
        """End a running action its client cancelled now, whatever its executor still does."""
        if rec.outcome is None:
            self.end(rec, "error", error=error, exec_s=self.ran(rec))

    def _interrupt(self, rec: LiveAction, status: str, error: ErrorInfo) -> bool:
        """Cancel the executor's task; ``rec`` ends with ``status`` and ``error`` as it unwinds.

        The first interruption (a deadline or a client's cancel) stands: a later one in its
        grace neither rewrites how the action ends nor arms another end, so False."""
        if rec.interrupt is not None:
            return False
        rec.interrupt = (status, error)
        if rec.task is not None:
            rec.task.cancel()
        return True

    async def cancel(self, rec: LiveAction) -> Outcome:
        """The client cancels ``rec``: a waiting one ends at once, a running one if its
        executor can interrupt it (else ``NotCancellable``); an ended one keeps its outcome."""
        if rec.outcome is None:
            error = ErrorInfo("cancelled", f"action {rec.id} was cancelled by the client")
            if rec.phase in WAITING:
                self.end_waiting(rec, "error", error)
            elif rec.executor.cancellable and rec.task is not None:
                if self._interrupt(rec, "error", error):
                    # As at a deadline, a call that swallows its cancel is not waited for
                    # past the grace (its units stay held until it returns).
                    assert self._aio is not None
                    grace = self.config.timeout_grace_s
                    note = f"; the call had not returned {grace:g} s later"
                    late = ErrorInfo("cancelled", error.message + note)
                    rec.timers.append(self._aio.call_later(grace, self._end_cancelled, rec, late))
                # (else its deadline, or an earlier cancel, interrupted it first: that one
                # stands and its grace bounds this wait)
                await asyncio.shield(rec.future)
            else:
                left = max(0.0, rec.deadline - self.now())
                raise NotCancellable(
                    f"action {rec.id} is already running on the {rec.spec.resource.upper()} "
                    f"executor, which cannot interrupt it; it ends by itself or at its "
                    f"time-out ({left:.1f} s left)"
                )
        assert rec.outcome is not None
        return rec.outcome

    # ------------------------------------------------------------------ outcomes
    def end_waiting(self, rec: LiveAction, status: str, error: ErrorInfo) -> None:
        """End an action the core has not started: withdrawn (from the loop's buffer or the
        core's queue) so it never holds units, then its outcome."""
        if self.loop.withdraw(rec.id, self.now()):
            move(rec, Phase.OUT)
        self.end(rec, status, error=error)

    def end_all_waiting(self, recs: Sequence[LiveAction], status: str, error: ErrorInfo) -> None:
        """End every action of ``recs`` the core has not started (a shutdown, a trajectory's
        close): all get their outcome before any is withdrawn. A withdrawal's pass may start
        the actions a queue's head held back; ended one by one, such an action started and
        ran instead of ending (``start`` now gives its units back unrun)."""
        waiting = [r for r in recs if r.outcome is None and r.phase in WAITING]
        for rec in waiting:
            self.end(rec, status, error=error)
        for rec in waiting:
            if rec.phase in WAITING and self.loop.withdraw(rec.id, self.now()):
                move(rec, Phase.OUT)

    def end(
        self,
        rec: LiveAction,
        status: str,
        *,
        value: Any = None,
        error: ErrorInfo | None = None,
        exec_s: float = 0.0,
        wait_s: float = 0.0,
    ) -> None:
        """Give the action its one outcome (later calls for it are ignored)."""
        if rec.outcome is not None:
            return
        outcome = outcome_of(
            rec, status, self.now(), value=value, error=error, exec_s=exec_s, wait_s=wait_s
        )
        rec.outcome = outcome
        self.pending -= 1
        for timer in rec.timers:
            timer.cancel()
        rec.timers.clear()
        if not rec.future.done():
            rec.future.set_result(outcome)
        self.counters["completed"] += 1
        self.counters[f"outcome_{status}"] += 1
        self.on_end(rec, outcome)
        self.table.retire(rec)
        self._arm_expiry()

    def _arm_expiry(self) -> None:
        """Arm the action table's next age expiry (one timer at a time, at most one per
        ``EXPIRY_EVERY_S``). Why: it ran only as other actions ended, so a runtime idle
        after a burst kept every outcome (each with its output) past ``keep_outcomes_s``."""
        if self._expiry is not None or self._aio is None or not self._attached:
            return
        due = self.table.due()
        if due is None:
            return
        when = max(due + WAKE_SLACK_S, self.now() + EXPIRY_EVERY_S)
        self._expiry = self._aio.call_at(self._t0 + when, self._expire)

    def _expire(self) -> None:
        self._expiry = None
        self.table.expire(self.now())
        self._arm_expiry()
