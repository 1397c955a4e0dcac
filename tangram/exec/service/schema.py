"""The JSON of the HTTP API: requests to ``ActionSpec``s, outcomes and errors to documents.

Requests are checked strictly (unknown fields are refused, types are checked) so that a typo
fails with a message naming the field rather than being silently ignored. GPU inputs arrive
as JSON (nested lists of numbers become tensors, see ``codec``) and results leave as JSON.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping
from dataclasses import asdict
from typing import Any

from tangram.exec.runtime.errors import BadRequest
from tangram.exec.runtime.records import (
    ActionSpec,
    ApiWork,
    CommandResult,
    CpuWork,
    ErrorInfo,
    GpuWork,
    Outcome,
    Timings,
    TrajectoryInfo,
    check_image,
    check_memory_gb,
    check_trajectory_id,
    is_finite_number,
)
from tangram.exec.service.codec import decode_inputs, to_json

#: Fields of ``POST /v1/actions``, by what they belong to.
COMMON_FIELDS = {
    "id",
    "trajectory",
    "resource",
    "max_units",
    "t1_s",
    "serial_fraction",
    "curve",
    "timeout_s",
    "task",
    "kind",
    "malleable",
    "wait",
}
WORK_FIELDS = {
    "cpu": {"command", "env", "max_output_bytes"},
    "gpu": {"service", "inputs"},
    "api": {"endpoint", "payload"},
}
TRAJECTORY_FIELDS = {"id", "memory_gb", "image", "wait_s"}


def require_object(body: Any, what: str) -> Mapping[str, Any]:
    if not isinstance(body, Mapping):
        raise BadRequest(f"{what} must be a JSON object, got {type(body).__name__}")
    for name in body:  # (JSON's are; a Ray caller's dict may hold any key)
        if not isinstance(name, str):
            raise BadRequest(f"{what}: field names must be strings, got {name!r}"[:300])
    return body


def _typed(body: Mapping[str, Any], name: str, kind: type | tuple[type, ...], what: str) -> Any:
    value = body.get(name)
    if value is None:
        return None
    kinds = kind if isinstance(kind, tuple) else (kind,)
    bad_bool = isinstance(value, bool) and bool not in kinds
    if bad_bool or not isinstance(value, kind):
        raise BadRequest(f"field {name!r}: expected {what}, got {type(value).__name__} {value!r}")
    if float in kinds and not is_finite_number(value):
        raise BadRequest(f"field {name!r}: must be a finite number a float holds, got {value!r}")
    return value


#: Every field an action may have, whatever its resource.
ACTION_FIELDS = COMMON_FIELDS.union(*WORK_FIELDS.values())


def resource_of(body: Mapping[str, Any]) -> str:
    """The resource: given, or inferred from the one work field present (a field sent as
    null is absent: ``"service": null`` beside a ``command`` says nothing)."""
    given = body.get("resource")
    if given is not None:
        if not isinstance(given, str) or given not in WORK_FIELDS:
            raise BadRequest(f"field 'resource': must be cpu, gpu or api, got {given!r}")
        return str(given)
    present = {k for k, v in body.items() if v is not None}
    found = [r for r, names in WORK_FIELDS.items() if names & present - {"env"}]
    if len(found) != 1:
        raise BadRequest(
            "say what to run: exactly one of 'command' (cpu), 'service' + 'inputs' (gpu) or "
            f"'endpoint' + 'payload' (api); got fields {sorted(body)}"
        )
    return found[0]


def parse_action(body: Any, *, max_output_bytes: int) -> tuple[ActionSpec, float | None]:
    """``POST /v1/actions`` body -> (spec, how long to wait for the outcome: None = not).

    A field that is absent gets ``ActionSpec``'s default; a field that is present is taken as
    given or refused naming it (0, "" or a negative number are never read as "absent").
    ``max_output_bytes`` is the service's cap on a CPU action's output per stream: also the
    default when the action gives none.
    """
    body = require_object(body, "an action")
    resource = resource_of(body)
    allowed = COMMON_FIELDS | WORK_FIELDS[resource]
    # (Another resource's field sent as null is absent, as every null is: a client writing
    # each field of its schema, null when unset, was refused its every action.)
    unknown = sorted(
        k for k, v in body.items() if k not in allowed and (v is not None or k not in ACTION_FIELDS)
    )
    if unknown:
        raise BadRequest(
            f"unknown field {unknown[0]!r} for {_a(resource)} action; allowed: {sorted(allowed)}"
        )
    work = WORK_PARSERS[resource](body, max_output_bytes)
    number = (int, float)
    given = {
        "id": _typed(body, "id", str, "a string"),
        "trajectory": _typed(body, "trajectory", str, "a string"),
        "max_units": _typed(body, "max_units", int, "an integer"),
        "t1_s": _typed(body, "t1_s", number, "a number"),
        "serial_fraction": _typed(body, "serial_fraction", number, "a number"),
        "curve": _typed(body, "curve", dict, "a curve object"),
        "timeout_s": _typed(body, "timeout_s", number, "a number"),
        "task": _typed(body, "task", str, "a string"),
        "kind": _typed(body, "kind", str, "a string"),
        "malleable": _typed(body, "malleable", bool, "true or false"),
    }
    spec = ActionSpec(work=work, **{k: v for k, v in given.items() if v is not None})
    if given["t1_s"] is not None and given["curve"] is not None:
        # The curve's t1 is the action's time on one unit (the scheduler's, the trace's
        # t1_s): a different t1_s sent with it was dropped without a word.
        t1 = spec.elasticity().t1
        if not math.isclose(t1, given["t1_s"], rel_tol=1e-9):
            raise BadRequest(
                f"field 't1_s' ({given['t1_s']!r}) differs from its curve's t1 ({t1!r}): the "
                "curve's time on one unit is the action's; send one of them, or the same"
            )
    return spec, parse_wait(body.get("wait"))


def _cpu_work(body: Mapping[str, Any], cap: int) -> CpuWork:
    command = body.get("command")
    if isinstance(command, list):
        if not command or not all(isinstance(a, str) for a in command):
            raise BadRequest("field 'command': a list must hold strings only")
        command = tuple(command)
    elif not isinstance(command, str):
        raise BadRequest("field 'command': expected a string or a list of strings")
    env = _typed(body, "env", dict, "an object of strings")
    limit = _typed(body, "max_output_bytes", int, "an integer")
    if limit is not None and limit > cap:
        raise BadRequest(
            f"field 'max_output_bytes': at most {cap} here (the service's cap, "
            f"--max-output-bytes), got {limit}"
        )
    return CpuWork(command, {} if env is None else env, cap if limit is None else limit)


def _gpu_work(body: Mapping[str, Any], cap: int) -> GpuWork:
    service = _typed(body, "service", str, "a string")
    if not service:
        raise BadRequest("field 'service': required for a gpu action")
    if "inputs" not in body:
        raise BadRequest("field 'inputs': required for a gpu action")
    return GpuWork(service, decode_inputs(body["inputs"]))


def _api_work(body: Mapping[str, Any], cap: int) -> ApiWork:
    endpoint = _typed(body, "endpoint", str, "a string")
    if not endpoint:
        raise BadRequest("field 'endpoint': required for an api action")
    return ApiWork(endpoint, body.get("payload"))


#: Each resource's work, from the body and the service's output cap.
WORK_PARSERS: dict[str, Callable[[Mapping[str, Any], int], CpuWork | GpuWork | ApiWork]] = {
    "cpu": _cpu_work,
    "gpu": _gpu_work,
    "api": _api_work,
}


def parse_wait(value: Any) -> float | None:
    """``wait``: true (until the outcome), false/absent (do not), or seconds."""
    if value is None or value is False:
        return None
    if value is True:
        return math.inf
    if is_finite_number(value) and value >= 0:
        return float(value)
    raise BadRequest(f"field 'wait': expected true, false or seconds >= 0, got {value!r}")


def parse_trajectory(body: Any) -> dict[str, Any]:
    """``POST /v1/trajectories`` body -> ``Runtime.open_trajectory``'s arguments; an absent
    field gets the runtime's default, a present one is checked (never read as absent)."""
    body = require_object(body if body is not None else {}, "a trajectory")
    unknown = sorted(set(body) - TRAJECTORY_FIELDS)
    if unknown:
        raise BadRequest(
            f"unknown field {unknown[0]!r} for a trajectory; allowed: {sorted(TRAJECTORY_FIELDS)}"
        )
    traj = body.get("id")
    memory = body.get("memory_gb")
    image = body.get("image")
    wait = _typed(body, "wait_s", (int, float), "a number")
    if wait is not None and wait < 0:
        raise BadRequest(f"field 'wait_s': must be >= 0 seconds, got {wait!r}")
    return {
        "trajectory": None
        if traj is None
        else check_trajectory_id("field 'id' (the trajectory id)", traj),
        "memory_gb": None if memory is None else check_memory_gb("field 'memory_gb'", memory),
        "image": None if image is None else check_image("field 'image'", image),
        "wait_s": 0.0 if wait is None else float(wait),
    }


# -- documents out -------------------------------------------------------------------------


def error_doc(code: str, message: str, retryable: bool = False) -> dict[str, Any]:
    return {"error": {"code": code, "message": message, "retryable": retryable}}


def timings_doc(t: Timings) -> dict[str, float]:
    """``t`` to the microsecond, still adding up: the parts are rounded and ``act_s`` is
    their sum as sent, added in order, so ``act_s == queue_s + overhead_s + exec_s`` holds
    exactly in a client's floats (each rounded alone, ``act_s`` could differ from the sum
    of the others by 1e-6)."""
    queue, overhead, exec_s = (round(v, 6) for v in (t.queue_s, t.overhead_s, t.exec_s))
    return {
        "queue_s": queue,
        "overhead_s": overhead,
        "exec_s": exec_s,
        "act_s": queue + overhead + exec_s,
    }


def outcome_doc(o: Outcome) -> dict[str, Any]:
    """An ``Outcome`` as JSON (``result`` holds the value: for CPU work stdout, stderr and
    exit_code; for GPU and API work what the service returned)."""
    value = o.value
    if isinstance(value, CommandResult):
        result: Any = asdict(value)
    else:
        result = to_json(value)
    return {
        "id": o.action_id,
        "trajectory": o.trajectory,
        "resource": o.resource,
        "status": o.status,
        "result": result,
        "error": asdict(o.error) if o.error else None,
        "timings": timings_doc(o.timings),
        "arrival_s": round(o.arrival_s, 6),
        "start_s": None if o.start_s is None else round(o.start_s, 6),
        "end_s": round(o.end_s, 6),
        "units": o.units,
        "node": o.node,
        "cores": list(o.cores),
        "gpus": list(o.gpus),
        "reason": o.reason,
    }


def outcome_from_doc(doc: Mapping[str, Any]) -> Outcome:
    """The client's view: an ``Outcome`` rebuilt from its JSON (value = the JSON result)."""
    err = doc.get("error")
    result = doc.get("result")
    if doc.get("resource") == "cpu" and isinstance(result, Mapping) and "exit_code" in result:
        result = CommandResult(
            result["stdout"], result["stderr"], result["exit_code"], result.get("message")
        )
    return Outcome(
        action_id=doc["id"],
        trajectory=doc.get("trajectory"),
        resource=doc["resource"],
        status=doc["status"],
        value=result,
        error=ErrorInfo(**err) if err else None,
        timings=Timings(**doc["timings"]),
        arrival_s=doc["arrival_s"],
        start_s=doc.get("start_s"),
        end_s=doc["end_s"],
        units=doc.get("units"),
        node=doc.get("node"),
        cores=tuple(doc.get("cores") or ()),
        gpus=tuple(doc.get("gpus") or ()),
        reason=doc.get("reason", ""),
    )


def trajectory_doc(t: TrajectoryInfo) -> dict[str, Any]:
    return asdict(t)


def state_doc(action_id: str, state: str, outcome: Outcome | None) -> dict[str, Any]:
    return {
        "id": action_id,
        "state": state,
        "outcome": outcome_doc(outcome) if outcome is not None else None,
    }


def _a(word: str) -> str:
    """``word`` with its indefinite article ("an api", "a gpu")."""
    return f"an {word}" if word[:1] in "aeiou" else f"a {word}"
