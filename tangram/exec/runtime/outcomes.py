"""An ended action's ``Outcome``: where its time went (queue, overhead, execution) and on what.

Kept apart from the runtime because it is pure arithmetic on the action's record and the
executor's own timings, and every outcome (result, error, time-out, refusal) goes through it;
``unknown_outcome`` is the one outcome no action record backs (a journal's, after a restart).
"""

from __future__ import annotations

import time
from typing import Any

from tangram.exec.runtime.actions import LiveAction
from tangram.exec.runtime.records import ErrorInfo, Outcome, Resource, Timings

#: The error code of an ``unknown`` outcome.
UNKNOWN_CODE = "outcome_unknown"


def outcome_of(
    rec: LiveAction,
    status: str,
    now: float,
    *,
    value: Any = None,
    error: ErrorInfo | None = None,
    exec_s: float = 0.0,
    wait_s: float = 0.0,
) -> Outcome:
    """The outcome of ``rec`` ending at ``now``.

    Queueing is arrival to start, plus ``wait_s`` the executor spent waiting; execution is the
    executor's ``exec_s``, capped by what is left; overhead is the rest. An action that never
    started queued all its life.
    """
    act = max(0.0, now - rec.arrival)
    if rec.started_at is None:
        queue, exec_s = act, 0.0
    else:
        queue = min(act, rec.started_at - rec.arrival + max(0.0, wait_s))
        exec_s = min(max(0.0, exec_s), act - queue)
    timings = Timings(queue, max(0.0, act - queue - exec_s), exec_s, act)
    start = rec.start if rec.started_at is not None else None
    return Outcome(
        action_id=rec.id,
        trajectory=rec.spec.trajectory,
        resource=rec.spec.resource,
        status=status,  # type: ignore[arg-type]
        value=value,
        error=error,
        timings=timings,
        arrival_s=rec.arrival,
        start_s=rec.started_at,
        end_s=now,
        units=start.units if start else None,
        node=start.node if start else None,
        cores=start.cores if start else (),
        gpus=start.gpus if start else (),
        reason=start.reason if start else (error.message if error else ""),
    )


def unknown_outcome(
    action_id: str, resource: Resource, trajectory: str | None, accepted_unix: float
) -> Outcome:
    """The outcome of an action a previous run of the service accepted and never ended.

    Whether it ran is unknown (the service stopped while it was queued or running), so it is
    never run again: its timings are zero and its times are this run's start (0 s), because
    none was observed; the message gives when it was accepted (wall clock).
    """
    when = time.strftime("%Y-%m-%d %H:%M:%S UTC", time.gmtime(accepted_unix))
    message = (
        f"the service stopped after accepting action {action_id} (at {when}) and before its "
        "outcome was recorded; it may have run, in part or in full, or not at all, and it will "
        "not run again: submit it under a new id to run it"
    )
    return Outcome(
        action_id=action_id,
        trajectory=trajectory,
        resource=resource,
        status="unknown",
        value=None,
        error=ErrorInfo(UNKNOWN_CODE, message),
        timings=Timings(0.0, 0.0, 0.0, 0.0),
        arrival_s=0.0,
        start_s=None,
        end_s=0.0,
        reason=message,
    )
