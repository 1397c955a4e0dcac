"""An ``Outcome`` as JSON text and back, for the journal (``journal.py``).

The journal must give a resent id the outcome its client would have seen, after a restart,
so an outcome is stored whole. Values are stored as the HTTP API shows them: a
``CommandResult`` keeps its fields (and comes back as one), anything else becomes plain JSON
(tensors and arrays as lists, tuples as lists, what JSON cannot hold as its ``repr``). The
runtime cannot use the service's codec (the service is the layer above it), so this is the
runtime's own, kept to what an outcome holds.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import asdict
from typing import Any

from tangram.exec.runtime.plain import to_json
from tangram.exec.runtime.records import CommandResult, ErrorInfo, Outcome, Timings

#: Marks a stored ``CommandResult`` (any other value is stored as plain JSON).
_COMMAND = "command_result"


def outcome_to_json(o: Outcome) -> str:
    """``o`` as compact JSON text (its value as the HTTP API would show it)."""
    doc = {
        "action_id": o.action_id,
        "trajectory": o.trajectory,
        "resource": o.resource,
        "status": o.status,
        "value": _value(o.value),  # not asdict(o): it would deep-copy the value first
        "error": _error(o.error),
        "timings": _timings(o.timings),
        "arrival_s": o.arrival_s,
        "start_s": o.start_s,
        "end_s": o.end_s,
        "units": o.units,
        "node": o.node,
        "cores": list(o.cores),
        "gpus": list(o.gpus),
        "reason": o.reason,
    }
    return json.dumps(doc, separators=(",", ":"), allow_nan=False)


def outcome_from_json(text: str) -> Outcome:
    """The outcome stored by ``outcome_to_json`` (a ``CommandResult`` comes back as one)."""
    doc = json.loads(text)
    value = doc["value"]
    if isinstance(value, Mapping) and set(value) == {_COMMAND}:
        value = CommandResult(**value[_COMMAND])
    elif isinstance(value, Mapping) and set(value) == {"json"}:
        value = value["json"]
    err = doc["error"]
    return Outcome(
        action_id=doc["action_id"],
        trajectory=doc["trajectory"],
        resource=doc["resource"],
        status=doc["status"],
        value=value,
        error=ErrorInfo(**err) if err else None,
        timings=Timings(**doc["timings"]),
        arrival_s=doc["arrival_s"],
        start_s=doc["start_s"],
        end_s=doc["end_s"],
        units=doc["units"],
        node=doc["node"],
        cores=tuple(doc["cores"]),
        gpus=tuple(doc["gpus"]),
        reason=doc["reason"],
    )


def _error(e: ErrorInfo | None) -> dict[str, Any] | None:
    """(Not ``asdict``: it is several times slower, and this runs once per action.)"""
    return None if e is None else {"code": e.code, "message": e.message, "retryable": e.retryable}


def _timings(t: Timings) -> dict[str, float]:
    return {"queue_s": t.queue_s, "overhead_s": t.overhead_s, "exec_s": t.exec_s, "act_s": t.act_s}


def _value(value: Any) -> dict[str, Any]:
    """The stored form: a tagged ``CommandResult`` or ``{"json": plain}``."""
    if isinstance(value, CommandResult):
        return {_COMMAND: asdict(value)}
    return {"json": to_json(value)}
