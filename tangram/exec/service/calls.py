"""The clients' operations, sans I/O: each builds its requests and reads their answers once.

An operation is a generator: it yields the ``Call``s it needs, is sent each answer
(``httpx.Response``) and returns its result; ``run`` polls, so it may yield many. ``steps``
wraps one in the retries of ``retry.attempts``, leaving a transport only two things to do:
send a call, sleep a pause. ``AsyncClient`` and ``Client`` are those two transports.
"""

from __future__ import annotations

import math
import time
import uuid
from collections.abc import Generator, Mapping
from pathlib import Path
from typing import Any, TypeVar
from urllib.parse import quote

import httpx

from tangram.exec.runtime.records import Outcome
from tangram.exec.service.retry import Call, Pause, attempts
from tangram.exec.service.schema import outcome_from_doc

T = TypeVar("T")

#: An operation: yields calls, is sent their answers, returns its result.
Operation = Generator[Call, httpx.Response, T]

#: An operation with its retries: also yields pauses (and is sent None after them).
Steps = Generator[Call | Pause, httpx.Response | None, T]


def steps(operation: Operation[T], retries: int) -> Steps[T]:
    """``operation`` with each of its calls sent through ``attempts`` (retries, back-off)."""
    call = next(operation)
    while True:
        response = yield from attempts(call, retries)
        try:
            call = operation.send(response)
        except StopIteration as done:
            return done.value


def segment(id: str) -> str:
    """``id`` as one URL path segment: every character but letters, digits, '-', '_' and '~'
    percent-encoded (UTF-8), dots too, so that ``?``, ``#``, ``%xx``, ``.`` and ``..`` stay part
    of the id instead of becoming a query, a fragment, an escape or a step up the path.

    ``ValueError`` naming ``id`` unless it is a non-empty string, before anything is sent:
    "" made the path ``/v1/actions/`` (the service's 404, naming nothing of the call), and
    another type a ``TypeError`` from ``quote``."""
    if not isinstance(id, str) or not id:
        raise ValueError(f"id must be a non-empty string, not {id!r}")
    return quote(id, safe="").replace(".", "%2E")


def wait_seconds(wait_s: float) -> float:
    """``wait_s``, seconds >= 0 (``math.inf``: until the outcome), or ``ValueError`` naming
    it before anything is sent: NaN or -1 was sent as the query ``wait`` and refused by the
    service naming only its query, ``True`` waited 1 s, a string failed in the arithmetic."""
    if (
        isinstance(wait_s, bool)
        or not isinstance(wait_s, (int, float))
        or math.isnan(wait_s)
        or wait_s < 0
    ):
        raise ValueError(f"wait_s must be a number of seconds >= 0, not {wait_s!r}")
    return float(wait_s)


def action_body(
    *,
    command: str | list[str] | None = None,
    service: str | None = None,
    inputs: Any = None,
    endpoint: str | None = None,
    payload: Any = None,
    trajectory: str | None = None,
    id: str | None = None,
    max_units: int | None = None,
    t1_s: float | None = None,
    serial_fraction: float | None = None,
    curve: Mapping[str, Any] | None = None,
    timeout_s: float | None = None,
    task: str | None = None,
    kind: str | None = None,
    env: Mapping[str, str] | None = None,
    wait: bool | float | None = None,
) -> dict[str, Any]:
    """The JSON of ``POST /v1/actions`` (an id is made up when none is given)."""
    given = [x is not None for x in (command, service, endpoint)]
    if sum(given) != 1:
        raise ValueError("give exactly one of command (cpu), service (gpu) or endpoint (api)")
    # (Only a missing id is made up: ``id or ...`` replaced an empty one too, silently, and
    # the caller's id was another; the service refuses it, naming the field.)
    body: dict[str, Any] = {"id": f"c-{uuid.uuid4().hex}" if id is None else id}
    if command is not None:
        body["command"] = command
        if env:
            body["env"] = dict(env)
    elif service is not None:
        body.update(service=service, inputs=inputs)
    else:
        body.update(endpoint=endpoint, payload=payload)
    optional = {
        "trajectory": trajectory,
        "max_units": max_units,
        "t1_s": t1_s,
        "serial_fraction": serial_fraction,
        "curve": dict(curve) if curve is not None else None,
        "timeout_s": timeout_s,
        "task": task,
        "kind": kind,
        "wait": wait,
    }
    body.update({k: v for k, v in optional.items() if v is not None})
    return body


def poll(id: str, wait_s: float) -> Call:
    """``GET /v1/actions/{id}``, waiting up to ``wait_s`` seconds for the outcome."""
    return Call("GET", f"/v1/actions/{segment(id)}", params={"wait": f"{wait_s:g}"})


# -- trajectories ----------------------------------------------------------------------------


def open_trajectory(
    id: str | None = None,
    *,
    memory_gb: float | None = None,
    image: str | None = None,
    wait_s: float | None = None,
) -> Operation[dict[str, Any]]:
    """Open a trajectory (a container); ``wait_s`` waits for memory instead of a 503.

    An id is made up when none is given, as for actions: the open is retried after a lost
    answer, and without an id each attempt opened a container of its own (the first, whose
    id no one knew, held its memory until the service stopped). A retry whose first attempt
    did open it is answered 409 ``conflict``: with an id made up here that can only be the
    first attempt, so the trajectory is read and returned (a caller's own id may be another
    client's: its 409 is raised)."""
    made_up = id is None
    id = f"t-{uuid.uuid4().hex}" if id is None else id
    body = {"id": id, "memory_gb": memory_gb, "image": image, "wait_s": wait_s}
    call = Call(
        "POST",
        "/v1/trajectories",
        {k: v for k, v in body.items() if v is not None},
        done_before=frozenset({409}) if made_up else frozenset(),
    )
    response = yield call
    if response.status_code == 409:
        response = yield Call("GET", f"/v1/trajectories/{segment(id)}")
    return response.json()


def close_trajectory(id: str) -> Operation[dict[str, Any]]:
    """Close a trajectory: its container goes, its queued actions end."""
    return (yield Call("DELETE", f"/v1/trajectories/{segment(id)}", idempotent=False)).json()


def recreate_trajectory(id: str) -> Operation[dict[str, Any]]:
    """A fresh container for a trajectory whose container died."""
    return (yield Call("POST", f"/v1/trajectories/{segment(id)}/recreate", idempotent=False)).json()


def trajectories() -> Operation[list[dict[str, Any]]]:
    """The open trajectories."""
    return (yield Call("GET", "/v1/trajectories")).json()["trajectories"]


# -- actions ---------------------------------------------------------------------------------


def submit(action: Mapping[str, Any]) -> Operation[str]:
    """Submit without waiting; returns the action's id. Fields as ``action_body``."""
    body = action_body(**{**action, "wait": None})
    return (yield Call("POST", "/v1/actions", body)).json()["id"]


#: ``run``'s polls wait at least this long at the service: with a tiny ``max_wait_s`` (say 0)
#: each poll came back at once, and the client polled in a tight loop until the outcome.
POLL_FLOOR_S = 1.0


def run(action: Mapping[str, Any], max_wait_s: float) -> Operation[Outcome]:
    """Submit and wait for the outcome (polling past the service's ``max_wait_s``). The
    submission asks the service to wait ``max_wait_s``, the client's read time-out less its
    margin (``wait: true`` waited as long as the service's cap, which may be longer: the
    POST then timed out, and was resent, until the retries ran out)."""
    body = action_body(**{**action, "wait": max_wait_s if math.isfinite(max_wait_s) else True})
    doc = (yield Call("POST", "/v1/actions", body)).json()
    while doc["outcome"] is None:
        doc = (yield poll(body["id"], max(max_wait_s, POLL_FLOOR_S))).json()
    return outcome_from_doc(doc["outcome"])


def result(id: str, wait_s: float = 0.0, max_wait_s: float = math.inf) -> Operation[Outcome | None]:
    """The outcome if it came within ``wait_s`` seconds (``math.inf``: until it comes), else
    None. A longer wait than one poll may last (the client's ``max_wait_s``, which its read
    time-out allows; the service's cap, 300 s, after which it answers without the outcome)
    is polled in turns until ``wait_s`` has passed: in one poll, None came at the service's
    cap however long the caller asked to wait, and a wait past the read time-out timed out
    and was sent again until the retries ran out (``ReadTimeout``, not None)."""
    wait_s = wait_seconds(wait_s)
    end = time.monotonic() + wait_s
    ask = min(wait_s, max_wait_s)
    while True:
        doc = (yield poll(id, ask)).json()
        if doc["outcome"]:
            return outcome_from_doc(doc["outcome"])
        left = end - time.monotonic()
        if not left > 0:
            return None
        ask = min(left, max_wait_s)


def state(id: str) -> Operation[str]:
    """The action's state now (queued, running, done ...)."""
    return (yield poll(id, 0.0)).json()["state"]


def cancel(id: str) -> Operation[Outcome]:
    """Cancel an action; returns its outcome."""
    doc = (yield Call("DELETE", f"/v1/actions/{segment(id)}")).json()
    return outcome_from_doc(doc["outcome"])


# -- service ---------------------------------------------------------------------------------


def submissions_done(done: bool = True) -> Operation[dict[str, Any]]:
    """Tell the service the step's actions are all submitted (``done``), or that more come."""
    return (yield Call("POST", "/v1/submissions", {"done": done})).json()


def status() -> Operation[dict[str, Any]]:
    """The service's status document."""
    return (yield Call("GET", "/v1/status")).json()


def metrics() -> Operation[str]:
    """The Prometheus metrics (text)."""
    return (yield Call("GET", "/metrics")).text


def trace_text() -> Operation[str]:
    """The trace of the run so far (JSONL, format v1)."""
    return (yield Call("GET", "/v1/trace")).text


def write_trace(path: str | Path) -> Operation[Path]:
    """Download the trace and write it to ``path`` here (JSONL)."""
    path = Path(path)
    path.write_text((yield from trace_text()))
    return path


def save_trace() -> Operation[dict[str, Any]]:
    """Ask the service to write its trace to its own ``--trace`` path."""
    return (yield Call("POST", "/v1/trace")).json()


def run_code(code: str, language: str = "python", **fields: Any) -> Operation[dict]:
    """SandboxFusion's ``/run_code`` (fields: run_timeout, stdin, files, ...)."""
    body = {"code": code, "language": language, **fields}
    return (yield Call("POST", "/run_code", body, idempotent=False)).json()
