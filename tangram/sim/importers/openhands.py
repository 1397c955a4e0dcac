"""Import OpenHands event streams into trace format v1.

OpenHands records a conversation as events with an integer ``id``, a ``timestamp`` (ISO-8601,
no zone) and a ``source``; an action (``"action": "run" | "read" | "edit" | ...``) is answered
by an observation whose ``cause`` is the action's id. Each agent action that the sandbox ran
(not messages, thoughts or the final ``finish``) becomes a CPU row with
``t1_s`` = observation time - action time. Two layouts are read:

- a JSON list of events (``tests/runtime/trajs/*.json`` in the OpenHands repository): one
  trajectory named after the file;
- an evaluation ``output.jsonl``: one record per task instance with ``instance_id``,
  ``history`` (the event list) and ``metrics.response_latencies`` (seconds per LLM call).

Generation before an action (``gen``): ``"gap"`` (default) takes the time from the end of the
previous imported action (or the task message) to this action, i.e. LLM time plus agent
overhead; ``"latency"`` sums the LLM ``response_latencies`` of the responses in that interval
(``output.jsonl`` only); a number uses that constant.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import replace
from datetime import datetime
from pathlib import Path
from typing import Any

from tangram.sim.importers.base import (
    TraceImportError,
    located,
    parse_timestamp,
    read_json,
    read_jsonl,
    seconds,
)
from tangram.trace import Trace, TraceRow, is_nonnegative_number

WHAT = (
    "an OpenHands trajectory: a JSON list of events, or an output.jsonl whose records carry a "
    "'history' event list"
)

#: Agent actions that do not run in the sandbox: conversation, reasoning, control.
DEFAULT_SKIP_KINDS: tuple[str, ...] = (
    "message",
    "system",
    "think",
    "recall",
    "finish",
    "reject",
    "change_agent_state",
    "condensation",
    "null",
)


def import_openhands(
    path: str | Path,
    *,
    step: int = 0,
    task: str = "openhands",
    gen: str | float = "gap",
    max_units: int = 1,
    serial_fraction: float | None = None,
    memory_gb: float = 0.0,
    min_t1_s: float = 0.001,
    skip_kinds: Iterable[str] = DEFAULT_SKIP_KINDS,
) -> Trace:
    """Import an OpenHands event list (``.json``) or evaluation output (``.jsonl``).

    ``gen`` is ``"gap"``, ``"latency"`` or a constant in seconds (see the module docstring);
    ``step``, ``task``, ``max_units``, ``serial_fraction`` and ``memory_gb`` fill fields the
    file does not have; ``min_t1_s`` floors zero-length actions; ``skip_kinds`` are the action
    types that are not sandbox work. Observed times go to ``obs_arrival_s`` (since the task
    message), ``obs_exec_s`` and ``obs_outcome`` (``timeout`` for a ``run`` whose exit code is
    -1, ``error`` for an error observation, else ``result``).
    """
    file = Path(path)
    if not (isinstance(gen, str) and gen in ("gap", "latency")) and not is_nonnegative_number(gen):
        raise ValueError(f"gen must be 'gap', 'latency' or finite seconds >= 0, got {gen!r}")
    records = _records(file)
    skip = frozenset(skip_kinds)
    rows: list[TraceRow] = []
    skipped_unanswered = 0
    for traj, events, latencies, where in records:
        if gen == "latency" and latencies is None:
            raise TraceImportError(
                file,
                f"{where}: gen='latency' needs metrics.response_latencies (an OpenHands "
                "output.jsonl record); this one has none; use gen='gap'",
            )
        new, unanswered = _trajectory_rows(
            file, where, traj, events, latencies, gen, skip,
            step=step, task=task, max_units=max_units,
            serial_fraction=serial_fraction, memory_gb=memory_gb, min_t1_s=min_t1_s,
        )  # fmt: skip
        rows.extend(new)
        skipped_unanswered += unanswered
    if not rows:
        raise TraceImportError(
            file, "no agent action with an answering observation ('cause'): nothing to import"
        )
    meta = {
        "source": "openhands",
        "importer": "openhands",
        "file": file.name,
        "trajectories": [traj for traj, *_ in records],
        "unanswered_actions": skipped_unanswered,
        "params": {
            "step": step,
            "task": task,
            "gen": gen,
            "max_units": max_units,
            "serial_fraction": serial_fraction,
            "memory_gb": memory_gb,
            "min_t1_s": min_t1_s,
            "skip_kinds": sorted(skip),
        },
    }
    return Trace(tuple(rows), meta)


# ---------------------------------------------------------------------------------------------


def _records(file: Path) -> list[tuple[str, list[Any], dict[str, float] | None, str]]:
    """(trajectory id, events, response latencies by id or None, location) per trajectory."""
    if file.name.endswith(".jsonl"):
        out = []
        seen: dict[str, str] = {}  # trajectory -> the line that named it first
        for lineno, record in read_jsonl(file, WHAT):
            where = f"line {lineno}"
            events = _history(record, file, where)
            traj = _instance_id(record, file, where) or f"{file.stem}-{lineno}"
            if traj in seen:
                raise TraceImportError(
                    file,
                    f"{where}: instance_id {traj!r} repeats {seen[traj]}'s: one record per "
                    "task instance (import a second run of it from another file: it gets ~K)",
                )
            seen[traj] = where
            out.append((traj, events, _latencies(record, file, where), where))
        if not out:
            raise TraceImportError(file, f"empty file; expected {WHAT}")
        return out
    data = read_json(file, WHAT)
    if isinstance(data, list):
        return [(file.stem, data, None, "events")]
    if isinstance(data, dict) and "history" in data:
        events = _history(data, file, "record")
        return [
            (
                _instance_id(data, file, "record") or file.stem,
                events,
                _latencies(data, file, "record"),
                "record",
            )
        ]
    kind = (
        f"an object with keys {list(data)[:8]}" if isinstance(data, dict) else type(data).__name__
    )
    raise TraceImportError(file, f"found {kind}; expected {WHAT}")


def _history(record: Any, file: Path, where: str) -> list[Any]:
    if not isinstance(record, dict) or not isinstance(record.get("history"), list):
        keys = list(record)[:8] if isinstance(record, dict) else type(record).__name__
        hint = ""
        if isinstance(record, dict) and {"timing_events", "tools"} & set(record):
            hint = " (this looks like a TraceLab round trace, not OpenHands)"
        raise TraceImportError(
            file, f"{where}: no 'history' event list (keys: {keys}){hint}; expected {WHAT}"
        )
    return record["history"]


def _instance_id(record: dict[str, Any], file: Path, where: str) -> str | None:
    """The record's ``instance_id`` (the trajectory's name): a string or an integer, or None
    where it has none."""
    value = record.get("instance_id")
    if value is None or value == "":
        return None
    if isinstance(value, bool) or not isinstance(value, str | int):
        raise TraceImportError(
            file, f"{where}: 'instance_id' must be a string, got {type(value).__name__} {value!r}"
        )
    return str(value)


def _latencies(record: dict[str, Any], file: Path, where: str) -> dict[str, float] | None:
    metrics = record.get("metrics")
    if not isinstance(metrics, dict) or not isinstance(metrics.get("response_latencies"), list):
        return None
    out: dict[str, float] = {}
    for i, item in enumerate(metrics["response_latencies"]):
        if not isinstance(item, dict) or "latency" not in item or "response_id" not in item:
            raise TraceImportError(
                file, f"{where}: metrics.response_latencies[{i}] lacks 'latency' or 'response_id'"
            )
        latency = item["latency"]
        if not is_nonnegative_number(latency):
            raise TraceImportError(
                file,
                f"{where}: metrics.response_latencies[{i}].latency must be seconds >= 0, "
                f"got {latency!r}",
            )
        out[str(item["response_id"])] = float(latency)
    return out


def _trajectory_rows(
    file: Path,
    where: str,
    traj: str,
    events: list[Any],
    latencies: dict[str, float] | None,
    gen: str | float,
    skip: frozenset[str],
    **fixed: Any,
) -> tuple[list[TraceRow], int]:
    times = _event_times(file, where, events)
    answer = {
        ev["cause"]: i for i, ev in enumerate(events) if "observation" in ev and "cause" in ev
    }
    start = next((i for i, ev in enumerate(events) if ev.get("source") == "user"), 0)
    rows: list[TraceRow] = []
    unanswered = 0
    prev_end = start  # index of the event that released the agent before the next action
    pending: list[int] = []  # agent actions (any kind) since prev_end, for LLM latencies
    for i, ev in enumerate(events):
        if ev.get("source") != "agent" or "action" not in ev:
            continue
        pending.append(i)
        if ev["action"] in skip:
            continue
        j = answer.get(ev["id"])
        if j is None:
            unanswered += 1
            continue
        duration = seconds(times[j], times[i])
        if duration < 0:
            raise TraceImportError(
                file, f"{where}, event {i}: observation {events[j]['id']} precedes its action"
            )
        with located(file, f"{where}, event {i}"):
            row = TraceRow(
                action_id=f"{traj}-a{len(rows):03d}",
                trajectory=traj,
                step=fixed["step"],
                position=len(rows),
                task=fixed["task"],
                kind=str(ev["action"]),
                gen_before_s=_gen(gen, times, prev_end, i, pending, events, latencies),
                resource="cpu",
                t1_s=max(duration, fixed["min_t1_s"]),
                max_units=fixed["max_units"],
                serial_fraction=fixed["serial_fraction"],
                memory_gb=fixed["memory_gb"],
                obs_arrival_s=max(seconds(times[i], times[start]), 0.0),
                obs_exec_s=duration,
                obs_outcome=_outcome(events[j]),
            )
        rows.append(row)
        prev_end, pending = j, []
    if rows:
        tail = [i for i in pending if i > prev_end]
        after = _gen_after(gen, times, prev_end, tail, events, latencies)
        if after:
            with located(file, f"{where}, event {tail[-1]}"):
                rows[-1] = replace(rows[-1], gen_after_s=after)
    return rows, unanswered


def _event_times(file: Path, where: str, events: list[Any]) -> list[datetime]:
    """Each event's time, once every event is checked (``_check_event``), its id unique and
    the timestamps all with a time zone or all without (the two cannot be subtracted)."""
    times: list[datetime] = []
    first_id: dict[Any, int] = {}
    for i, ev in enumerate(events):
        _check_event(file, f"{where}, event {i}", ev)
        if ev["id"] in first_id:
            raise TraceImportError(
                file, f"{where}, event {i}: id {ev['id']!r} repeats event {first_id[ev['id']]}'s"
            )
        first_id[ev["id"]] = i
        times.append(parse_timestamp(ev["timestamp"], file, f"{where}, event {i}"))
        if (times[i].tzinfo is None) != (times[0].tzinfo is None):
            this, first = ("a", "no") if times[i].tzinfo is not None else ("no", "a")
            raise TraceImportError(
                file,
                f"{where}, event {i}: timestamp {ev['timestamp']!r} has {this} time zone, "
                f"event 0's {events[0]['timestamp']!r} {first}: give every timestamp a zone "
                "or none",
            )
    return times


#: Optional event keys that hold an object (null: absent), and the nested ones checked too.
_EVENT_OBJECTS: tuple[tuple[str, ...], ...] = (
    ("extras",),
    ("extras", "metadata"),
    ("tool_call_metadata",),
    ("tool_call_metadata", "model_response"),
)


def _check_event(file: Path, where: str, ev: Any) -> None:
    """An event as the importer reads it: ``id`` and ``timestamp``; ``id`` and ``cause`` an
    integer or a string; ``action`` a string; ``extras``, its ``metadata``,
    ``tool_call_metadata`` and its ``model_response`` objects; that response's ``id`` a
    string. Anything else is refused naming the key, not left to fail as a TypeError."""
    if not isinstance(ev, dict) or "id" not in ev or "timestamp" not in ev:
        got = list(ev)[:8] if isinstance(ev, dict) else type(ev).__name__
        raise TraceImportError(
            file, f"{where}: an OpenHands event needs 'id' and 'timestamp' (got {got})"
        )
    for key, value in (("id", ev["id"]), ("cause", ev.get("cause", 0))):
        if key == "cause" and value is None:
            continue  # an observation no action caused
        if isinstance(value, bool) or not isinstance(value, int | str):
            raise TraceImportError(
                file,
                f"{where}: {key!r} must be an integer or a string, "
                f"got {type(value).__name__} {value!r}",
            )
    if "action" in ev and not isinstance(ev["action"], str):
        raise TraceImportError(
            file,
            f"{where}: 'action' must be a string (the action's type), "
            f"got {type(ev['action']).__name__} {ev['action']!r}",
        )
    for path in _EVENT_OBJECTS:
        value = _nested(ev, path)
        if value is not None and not isinstance(value, dict):
            raise TraceImportError(
                file,
                f"{where}: {'.'.join(path)!r} must be an object, "
                f"got {type(value).__name__} {value!r}",
            )
    rid = _nested(ev, ("tool_call_metadata", "model_response", "id"))
    if rid is not None and not isinstance(rid, str):
        raise TraceImportError(
            file,
            f"{where}: 'tool_call_metadata.model_response.id' must be a string, "
            f"got {type(rid).__name__} {rid!r}",
        )


def _nested(ev: dict[str, Any], path: tuple[str, ...]) -> Any:
    """``ev[path[0]][path[1]]...``, None where a level is absent, null or not an object."""
    value: Any = ev
    for key in path:
        if not isinstance(value, dict):
            return None
        value = value.get(key)
    return value


def _gen(
    gen: str | float,
    times: list[datetime],
    prev_end: int,
    i: int,
    pending: list[int],
    events: list[Any],
    latencies: dict[str, float] | None,
) -> float:
    if gen == "gap":
        return max(seconds(times[i], times[prev_end]), 0.0)
    if gen == "latency":
        return _latency_sum(pending, events, latencies or {})
    return float(gen)


def _gen_after(
    gen: str | float,
    times: list[datetime],
    prev_end: int,
    tail: list[int],
    events: list[Any],
    latencies: dict[str, float] | None,
) -> float:
    """Generation after the last imported action: up to the agent's final action (finish)."""
    if not tail or not isinstance(gen, str):
        return 0.0
    if gen == "gap":
        return max(seconds(times[tail[-1]], times[prev_end]), 0.0)
    return _latency_sum(tail, events, latencies or {})


def _latency_sum(indices: list[int], events: list[Any], latencies: dict[str, float]) -> float:
    """Sum of the LLM latencies of the distinct responses behind these agent actions."""
    seen: set[str] = set()
    total = 0.0
    for i in indices:
        rid = _nested(events[i], ("tool_call_metadata", "model_response", "id"))
        if rid is not None and rid not in seen and rid in latencies:
            seen.add(rid)
            total += latencies[rid]
    return round(total, 6)


def _outcome(obs: dict[str, Any]) -> str:
    if obs.get("observation") == "error":
        return "error"
    exit_code = _nested(obs, ("extras", "metadata", "exit_code"))
    return "timeout" if exit_code == -1 else "result"
