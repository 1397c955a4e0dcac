"""The journal's writer: a thread that commits batches to SQLite, off the event loop.

Why a thread: a commit of one event-loop span's entries (tens of rows, a WAL write, the
expiry, a checkpoint now and then) took 0.4-0.7 ms on the loop, a stall for every action in
flight then. SQLite releases the GIL while it works, so on the thread it costs the loop
almost nothing. The loop hands over one batch at a time (``submit``) with the rows already
encoded, so the thread runs no Python-heavy code that would hold the GIL against the loop.

After a batch is committed, its write-ahead log (the file its acceptances were logged to
before they could start) is truncated: SQLite holds them now. A batch that fails is retried
every ``RETRY_S`` (its log kept), and no other is taken meanwhile.
"""

from __future__ import annotations

import logging
import os
import sqlite3
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

from tangram.exec.runtime import journal_store as store

log = logging.getLogger(__name__)

#: Expiry runs inside a commit after this many acceptances, or this long, since the last.
EXPIRE_EVERY = 1000
EXPIRE_PERIOD_S = 60.0
#: How often the WAL is copied into the database while idle (it grows meanwhile, and is
#: reused from its start after each full checkpoint).
CHECKPOINT_EVERY_S = 0.5
#: How long a failed batch waits before it is tried again.
RETRY_S = 0.5


@dataclass(frozen=True)
class Batch:
    """Rows to insert and to update (outcomes encoded), and the log their acceptances are in
    (a file descriptor, truncated once they are committed)."""

    inserts: Sequence[Sequence[Any]]
    updates: Sequence[Sequence[Any]]
    log_fd: int


class Writer:
    """Commits batches to ``db`` on its own thread, one at a time; checkpoints when idle."""

    def __init__(
        self,
        db: sqlite3.Connection,
        *,
        keep: int,
        keep_s: float,
        clock: Callable[[], float] = time.time,
    ) -> None:
        self.db, self.keep, self.keep_s, self.clock = db, keep, keep_s, clock
        self._cond = threading.Condition()
        self._batch: Batch | None = None
        self._stopping = False
        #: The last commit's error (None after a success), and how many commits failed.
        self.error: BaseException | None = None
        self.failures = 0
        self._since_expire = 0
        self._last_expire = clock()
        self._thread = threading.Thread(target=self._run, name="tangram-journal", daemon=True)
        self._thread.start()

    @property
    def busy(self) -> bool:
        """A batch is being committed (or waits to be retried)."""
        with self._cond:
            return self._batch is not None

    def submit(self, batch: Batch) -> bool:
        """Hand over ``batch``; False (and nothing taken) while another is in hand."""
        with self._cond:
            if self._batch is not None or self._stopping:
                return False
            self._batch = batch
            self._cond.notify()
            return True

    def wait(self, timeout_s: float) -> bool:
        """Until no batch is in hand, or a commit failed meanwhile (True; ``busy`` and
        ``error`` tell which), or ``timeout_s`` passed (False)."""
        deadline = time.monotonic() + timeout_s
        with self._cond:
            failures = self.failures
            while self._batch is not None and self.failures == failures:
                left = deadline - time.monotonic()
                if left <= 0:
                    return False
                self._cond.wait(left)
            return True

    def stop(self, timeout_s: float = 30.0) -> None:
        """Finish the batch in hand (tried once more if it failed), then end the thread."""
        with self._cond:
            self._stopping = True
            self._cond.notify_all()
        self._thread.join(timeout_s)

    # ------------------------------------------------------------------ the thread
    def _run(self) -> None:
        next_checkpoint = time.monotonic() + CHECKPOINT_EVERY_S
        while True:
            with self._cond:
                while self._batch is None and not self._stopping:
                    left = next_checkpoint - time.monotonic()
                    if left <= 0:
                        break
                    self._cond.wait(left)
                batch, stopping = self._batch, self._stopping
            if batch is not None:
                if self._commit(batch):
                    with self._cond:
                        self._batch = None
                        self._cond.notify_all()
                elif not stopping:
                    time.sleep(RETRY_S)
                    continue
            if stopping:
                with self._cond:
                    self._batch = None  # (a batch that failed twice stays in its log)
                    self._cond.notify_all()
                return
            if time.monotonic() >= next_checkpoint:
                try:
                    store.checkpoint(self.db)
                except sqlite3.Error:  # busy or a failing disk: the next one tries again
                    log.warning("journal checkpoint failed", exc_info=True)
                next_checkpoint = time.monotonic() + CHECKPOINT_EVERY_S

    def _commit(self, batch: Batch) -> bool:
        now = self.clock()
        self._since_expire += len(batch.inserts)
        due = self._since_expire >= EXPIRE_EVERY or now - self._last_expire >= EXPIRE_PERIOD_S
        try:
            store.write(self.db, batch.inserts, batch.updates)
            if due:
                self._since_expire, self._last_expire = 0, now
                store.expire(self.db, now, self.keep, self.keep_s)
            os.ftruncate(batch.log_fd, 0)  # committed: its acceptances are in SQLite now
        except (sqlite3.Error, OSError) as exc:
            with self._cond:
                self.error = exc
                self.failures += 1
                self._cond.notify_all()
            log.exception("journal commit failed; retried in %g s (its log is kept)", RETRY_S)
            return False
        self.error = None
        return True
