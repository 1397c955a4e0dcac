"""The action table: every accepted action's live record, keyed by id, and its phase.

A phase says where an action is from the core's point of view, so what may still happen to it
(withdrawn, started, finished). ``move`` is the only place a phase changes, and it refuses any
move that is not in ``MOVES``: an action that skips a phase is a runtime bug, and it fails
loudly where it happens instead of leaving units held or an outcome missing.
"""

from __future__ import annotations

import asyncio
import math
from collections import Counter, deque
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from enum import Enum
from typing import TYPE_CHECKING

from tangram.core.action import Action
from tangram.core.decision import Start
from tangram.exec.runtime.records import ActionSpec, ErrorInfo, Outcome

if TYPE_CHECKING:
    from tangram.exec.runtime.executor import Executor


class Phase(Enum):
    """Where an action is, from the core's point of view."""

    ARRIVING = "arriving"  #: accepted; waits in the driver loop for the next pass
    QUEUED = "queued"  #: in the core's queue
    RUNNING = "running"  #: started on its units: its executor has it
    FINISHING = "finishing"  #: ended; its units return to the core at the next pass
    OUT = "out"  #: the core holds nothing of it


#: Every move the table allows, with when it happens. Any other move raises ``PhaseError``.
MOVES: dict[tuple[Phase, Phase], str] = {
    (Phase.ARRIVING, Phase.QUEUED): "a pass handed it to the core",
    (Phase.ARRIVING, Phase.OUT): "withdrawn before any pass saw it",
    (Phase.QUEUED, Phase.RUNNING): "the core started it",
    (Phase.QUEUED, Phase.OUT): "rejected, withdrawn from the queue, or its pass failed",
    (Phase.RUNNING, Phase.FINISHING): "its executor returned (or it had ended before its start)",
    (Phase.FINISHING, Phase.OUT): "a pass took its finish: its units are free",
}

#: Phases of an action the core has not started: a deadline or a cancel withdraws it.
WAITING = frozenset({Phase.ARRIVING, Phase.QUEUED})
#: Phases of an action the core started (reported as ``running`` until its outcome).
STARTED = frozenset({Phase.RUNNING, Phase.FINISHING})


class PhaseError(RuntimeError):
    """A phase change the table does not allow (a bug in the runtime, never a client's)."""


@dataclass(eq=False, slots=True)
class LiveAction:
    """Mutable state of one accepted action (event-loop thread only)."""

    id: str
    seq: int
    spec: ActionSpec
    action: Action
    #: The trajectory label: the client's, or ``~<id>`` for work without one.
    traj: str
    fingerprint: str
    arrival: float
    deadline: float
    future: asyncio.Future[Outcome]
    max_units: int
    size_gb: float
    memory_gb: float
    #: The executor that runs it (found by its kind of work at admission).
    executor: Executor
    #: Its open trajectory's actions not yet out of the core (None without a trajectory).
    active: dict[str, LiveAction] | None = None
    phase: Phase = Phase.ARRIVING
    start: Start | None = None
    started_at: float | None = None
    task: asyncio.Task[None] | None = None
    timers: list[asyncio.TimerHandle] = field(default_factory=list)
    outcome: Outcome | None = None
    #: The mean cores it held while it ran, when its grant was resized (the CPU executor's
    #: ``held_units``): the trace records it as the observed units.
    held_units: float | None = None
    #: Set before cancelling its executor's task: how it ends (timeout or cancelled).
    interrupt: tuple[str, ErrorInfo] | None = None
    deferrals: int = 0


def move(rec: LiveAction, to: Phase) -> None:
    """The one transition function: ``rec`` enters phase ``to`` or ``PhaseError`` is raised.

    Entering ``OUT`` also takes the action off its trajectory's active set (the core holds
    nothing of it any more, so closing the trajectory need not wait for it).
    """
    if (rec.phase, to) not in MOVES:
        allowed = [b.value for a, b in MOVES if a is rec.phase] or ["nothing"]
        raise PhaseError(
            f"action {rec.id}: {rec.phase.value} -> {to.value} is not a move of the action "
            f"table ({rec.phase.value} goes to {' or '.join(allowed)})"
        )
    rec.phase = to
    if to is Phase.OUT and rec.active is not None:
        rec.active.pop(rec.id, None)


class ActionTable:
    """Accepted actions by id. Ended ones are kept for polling, at most ``keep`` of them and
    for ``keep_s`` seconds after they ended (on the runtime's clock): oldest dropped first,
    never while the core still holds them (such a one is kept until it is out, and the
    others are dropped meanwhile). Both bounds, because the count alone let a busy
    service hold every outcome of the last ``keep`` actions and an idle one hold old ones
    forever (issue 16); a journal answers for the ones dropped."""

    __slots__ = ("keep", "keep_s", "forget", "_by_id", "_ended", "_held")

    def __init__(self, keep: int, keep_s: float = math.inf) -> None:
        self.keep, self.keep_s = keep, keep_s
        #: Called with the id of each ended action the table drops (None: nothing to tell).
        self.forget: Callable[[str], None] | None = None
        self._by_id: dict[str, LiveAction] = {}
        #: Ended actions, oldest first, with when they ended.
        self._ended: deque[tuple[LiveAction, float]] = deque()
        #: Ended actions past the bounds that the core still held when they came due (a
        #: call that never returns): dropped once out, never blocking the others' drop.
        self._held: list[LiveAction] = []

    def __contains__(self, action_id: object) -> bool:
        return action_id in self._by_id

    def __len__(self) -> int:
        return len(self._by_id)

    def __iter__(self) -> Iterator[LiveAction]:
        return iter(self._by_id.values())

    def get(self, action_id: str) -> LiveAction | None:
        return self._by_id.get(action_id)

    def add(self, rec: LiveAction) -> None:
        if rec.id in self._by_id:
            raise ValueError(f"action {rec.id} is already in the table")
        self._by_id[rec.id] = rec

    def records(self) -> list[LiveAction]:
        """A snapshot of the records (safe to iterate while actions end)."""
        return list(self._by_id.values())

    def retire(self, rec: LiveAction) -> None:
        """``rec`` has its outcome: remember it, and forget the oldest beyond ``keep`` or
        ended more than ``keep_s`` before it."""
        now = rec.outcome.end_s if rec.outcome is not None else 0.0
        self._ended.append((rec, now))
        self.expire(now)

    def due(self) -> float | None:
        """When the oldest ended action comes of age (``keep_s`` after its end, on the
        runtime's clock), None when none will: the host arms its ``expire`` for then, so an
        idle runtime lets its outcomes go too (``retire`` alone ran only as others ended)."""
        if not self._ended or not math.isfinite(self.keep_s):
            return None
        return self._ended[0][1] + self.keep_s

    def expire(self, now: float) -> None:
        """Forget the ended actions beyond ``keep``, or ended more than ``keep_s`` before
        ``now`` (those the core still holds are set aside until they are out)."""
        ended = self._ended
        if self._held:  # (few: actions whose executor never returned)
            out = [old for old in self._held if old.phase is Phase.OUT]
            if out:
                self._held = [old for old in self._held if old.phase is not Phase.OUT]
                for old in out:
                    self._drop(old)
        cutoff = now - self.keep_s
        while ended and (len(ended) > self.keep or ended[0][1] < cutoff):
            old, _ = ended.popleft()
            if old.phase is not Phase.OUT:
                # The core still holds it: kept until it is out, set aside so that the
                # actions after it are dropped all the same (one call that never returned
                # kept every later outcome in memory).
                self._held.append(old)
                continue
            self._drop(old)

    def _drop(self, old: LiveAction) -> None:
        """Forget the ended, out action ``old``."""
        if self._by_id.get(old.id) is old:  # (a later action may reuse a forgotten id)
            del self._by_id[old.id]
            if self.forget is not None:
                self.forget(old.id)

    def waiting(self) -> dict[str, int]:
        """Actions without an outcome, counted by phase name (for status)."""
        return dict(Counter(r.phase.value for r in self._by_id.values() if r.outcome is None))
