"""An ended action's ``Outcome``: where its time went (queue, overhead, execution) and on what.

Kept apart from the runtime because it is pure arithmetic on the action's record and the
executor's own timings, and every outcome (result, error, time-out, refusal) goes through it.
"""

from __future__ import annotations

from typing import Any

from tangram.exec.runtime.actions import LiveAction
from tangram.exec.runtime.records import ErrorInfo, Outcome, Timings


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
