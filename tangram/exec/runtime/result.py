"""``ExecResult``: what an executor adapter hands back to the runtime for one started action."""

from __future__ import annotations

import asyncio
from dataclasses import dataclass
from typing import Any

from tangram.exec.runtime.records import ErrorInfo, Status


@dataclass(frozen=True)
class ExecResult:
    """One executor run: the status, the value or error, and the executor's own timings.

    ``exec_s`` is the command or call itself; ``wait_s`` time the executor spent waiting
    (container lock, busy GPUs) which the runtime counts as queueing; everything else between
    the scheduler's start and the completion is overhead.
    """

    status: Status
    value: Any = None
    error: ErrorInfo | None = None
    exec_s: float = 0.0
    wait_s: float = 0.0
    #: Executor facts for the trace and metrics (e.g. ``restored`` GPUs, ``evicted``).
    detail: dict[str, Any] | None = None
    #: False when the executor did not run it at all (its deadline passed while it waited
    #: there: AOE for its trajectory's previous action or its cores, EOE for its cell): the
    #: outcome then says it never started (no start time, no units), so a client knows a
    #: resend is safe. Said started, ``/run_code`` blamed the program (TimeLimitExceeded) and
    #: the OpenAI-style routes said 'it started and is not run again'.
    ran: bool = True


class NeverRan(asyncio.CancelledError):
    """An executor's cancel (a deadline, a client's cancel) that came before it began the
    work (a plain API call still waiting for a thread): the runtime ends the action as never
    started (``ExecResult.ran`` False: no start time, no units, no execution time). Raised as
    a plain cancel, the outcome showed a start and an ``exec_s`` equal to the wait."""


def failed(code: str, message: str, *, exec_s: float = 0.0, retryable: bool = False) -> ExecResult:
    return ExecResult("error", None, ErrorInfo(code, message, retryable), exec_s=exec_s)
