"""Residency changes for ``on_residency_change``: queued in the order they happen (under the
manager's condition) and delivered later, outside every manager lock, so a callback may call
back into the manager.
"""

from __future__ import annotations

import logging
import threading
from collections import deque
from collections.abc import Callable, Iterable

log = logging.getLogger(__name__)

ResidencyCallback = Callable[[str, tuple[int, ...], bool], None]
Change = tuple[str, tuple[int, ...], bool]


class ResidencyFeed:
    """The queue of residency changes and their one-at-a-time delivery to the callback."""

    def __init__(self, callback: ResidencyCallback | None) -> None:
        self._callback = callback
        self._changes: deque[Change] = deque()
        self._lock = threading.Lock()
        #: Held while delivering; re-entrant so a callback's own call delivers in order too.
        self._delivering = threading.RLock()
        #: How many changes at the head of the queue are being delivered now (one per nested
        #: deliver: a callback's own call into the manager delivers the changes after its
        #: own). They stay queued until their callback returns, so an interrupt loses none.
        self._in_flight = 0
        #: Queue a change ``(service, gpus, resident)``, ``gpus`` a sorted non-empty tuple
        #: (the caller holds the manager's condition, which orders them). The queue's own
        #: append, which runs no line of Python: a change to the books and its queuing are
        #: one statement in the ledger. Through ``push``, an interrupt (a KeyboardInterrupt)
        #: landing on push's own first lines lost a change already made to the books, and
        #: the callback's view of what is resident stayed stale. Nowhere, without a callback.
        self.queue: Callable[[Change], None] = (
            self._changes.append if callback is not None else deque(maxlen=0).append
        )

    def push(self, service: str, gpus: Iterable[int], resident: bool) -> None:
        """Queue a change (the caller holds the manager's condition, which orders them)."""
        gpus = tuple(sorted(gpus))
        if gpus:
            self.queue((service, gpus, resident))

    def deliver(self) -> None:
        """Deliver the queued changes in order; a callback that raises is logged and skipped,
        a sys.exit() in it too (the scheduler's own code, as a service's is in its call:
        ``execution.FAILURES``). A SystemExit went through the delivery in ``call``'s
        finally: the call that ran ended with no outcome and was never counted.

        A change leaves the queue only once its callback has returned: taken out before, an
        interrupt (KeyboardInterrupt) before or in the callback lost it for good, and the
        scheduler's view of what is resident stayed wrong. It is delivered again by the next
        delivery (at least once); a nested delivery skips those being delivered."""
        if self._callback is None:
            return
        with self._delivering:
            while True:
                claimed = delivered = False
                try:
                    with self._lock:
                        if len(self._changes) <= self._in_flight:
                            return
                        change = self._changes[self._in_flight]
                        # Counted in flight and marked claimed (what the finally undoes) in
                        # one statement: on two lines, an interrupt in between kept the
                        # change counted in flight for good, and no delivery sent it, nor any
                        # change after it, again (the callback's view stayed stale).
                        self._in_flight, claimed = self._in_flight + 1, True
                    try:
                        self._callback(*change)
                    except (Exception, SystemExit):
                        log.exception("on_residency_change%r raised", change)
                    delivered = True
                finally:
                    if claimed:
                        with self._lock:
                            self._in_flight -= 1
                            if delivered:
                                del self._changes[self._in_flight]
