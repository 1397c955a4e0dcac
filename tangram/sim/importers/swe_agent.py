"""Import SWE-agent trajectories (``.traj``) into trace format v1.

A ``.traj`` is one JSON object per task instance; its ``trajectory`` list holds one entry per
agent step with the command (``action``) and, since SWE-agent 1.0, the wall time of running it
in the container (``execution_time``, seconds, measured with ``time.perf_counter``). Each step
becomes a CPU row: ``t1_s`` = ``execution_time``, ``kind`` = the command's first token
(``find_file``, ``open``, ``edit``, ``python3``, ``submit``...). The file records no LLM
timings, so the generation before each action is a parameter (default 0: actions back to
back). Older ``.traj`` files without ``execution_time`` are refused with a clear error.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from tangram.sim.importers.base import TraceImportError, located, read_json
from tangram.trace import Trace, TraceRow, is_nonnegative_number

WHAT = "a SWE-agent .traj file (a JSON object with a 'trajectory' list of steps)"


def import_swe_agent(
    path: str | Path,
    *,
    step: int = 0,
    task: str = "swe-agent",
    gen_before_s: float = 0.0,
    max_units: int = 1,
    serial_fraction: float | None = None,
    memory_gb: float = 0.0,
    min_t1_s: float = 0.001,
) -> Trace:
    """Import one ``.traj`` file, or every ``*.traj`` under a directory (one trajectory each).

    Parameters (none is in the file): ``step`` the RL step to put the trajectories in;
    ``task`` the rows' task; ``gen_before_s`` the generation before every action (SWE-agent
    records none; e.g. 2.9 s is the median LLM call in the OpenHands sample); ``max_units`` and
    ``serial_fraction`` the elasticity to assume (default: one core, inelastic, as measured);
    ``memory_gb`` the container memory; ``min_t1_s`` a floor for steps recorded as taking 0 s
    (a trace needs t1_s > 0). The raw time is kept in ``obs_exec_s``.
    """
    root = Path(path)
    if root.is_dir():
        files = sorted(root.rglob("*.traj"))
        if not files:
            raise TraceImportError(root, "directory holds no *.traj file")
        names = [str(f.relative_to(root).with_suffix("")) for f in files]
    else:
        files, names = [root], [root.stem]
    rows: list[TraceRow] = []
    exit_status: dict[str, Any] = {}
    for file, traj in zip(files, names, strict=True):
        data = read_json(file, WHAT)
        steps = _steps(data, file)
        exit_status[traj] = _exit_status(data, file)
        for pos, entry in enumerate(steps):
            seconds = _execution_time(entry, pos, file)
            with located(file, f"trajectory step {pos}"):
                row = TraceRow(
                    action_id=f"{traj}-a{pos:03d}",
                    trajectory=traj,
                    step=step,
                    position=pos,
                    task=task,
                    kind=_kind(entry.get("action")),
                    gen_before_s=gen_before_s,
                    resource="cpu",
                    t1_s=max(seconds, min_t1_s),
                    max_units=max_units,
                    serial_fraction=serial_fraction,
                    memory_gb=memory_gb,
                    obs_exec_s=seconds,
                )
            rows.append(row)
    meta = {
        "source": "swe-agent",
        "importer": "swe-agent",
        "files": names,
        "exit_status": exit_status,
        "params": {
            "step": step,
            "task": task,
            "gen_before_s": gen_before_s,
            "max_units": max_units,
            "serial_fraction": serial_fraction,
            "memory_gb": memory_gb,
            "min_t1_s": min_t1_s,
        },
    }
    return Trace(tuple(rows), meta)


def _steps(data: Any, file: Path) -> list[dict[str, Any]]:
    if not isinstance(data, dict) or not isinstance(data.get("trajectory"), list):
        keys = list(data)[:8] if isinstance(data, dict) else type(data).__name__
        raise TraceImportError(file, f"not a SWE-agent .traj: no 'trajectory' list (found {keys})")
    steps = data["trajectory"]
    if not steps:
        raise TraceImportError(file, "the 'trajectory' list is empty: no action to import")
    for i, entry in enumerate(steps):
        if not isinstance(entry, dict) or "action" not in entry:
            raise TraceImportError(file, f"trajectory step {i} has no 'action'")
        action = entry["action"]
        if not isinstance(action, str):  # (its kind, the command's first token, was "empty")
            raise TraceImportError(
                file,
                f"trajectory step {i}: 'action' must be a string (the command run), "
                f"got {type(action).__name__} {action!r}",
            )
    return steps


def _exit_status(data: dict[str, Any], file: Path) -> Any:
    """The run's ``info.exit_status`` (kept in the meta): a string, or None where ``info``
    has none."""
    info = data.get("info")
    if info is None:
        return None
    if not isinstance(info, dict):
        raise TraceImportError(
            file, f"'info' must be an object (with 'exit_status'), got {type(info).__name__}"
        )
    status = info.get("exit_status")
    if status is not None and not isinstance(status, str):
        # (kept in the trace's header: a NaN there made it a file no strict reader takes,
        # refused at the writing as the output's header, not as this file's)
        raise TraceImportError(
            file,
            f"'info.exit_status' must be a string (how the run ended) or null, "
            f"got {type(status).__name__} {status!r}",
        )
    return status


def _execution_time(entry: dict[str, Any], pos: int, file: Path) -> float:
    if "execution_time" not in entry:
        raise TraceImportError(
            file,
            f"trajectory step {pos} ({_kind(entry.get('action'))!r}) has no 'execution_time': "
            "this .traj is from an older SWE-agent that did not record per-step timings, so "
            "there is no action duration to import",
        )
    value = entry["execution_time"]
    if not is_nonnegative_number(value):
        raise TraceImportError(
            file, f"trajectory step {pos}: 'execution_time' must be seconds >= 0, got {value!r}"
        )
    return float(value)


def _kind(action: Any) -> str:
    """The tool a step ran: the first whitespace-separated token of its command."""
    if not isinstance(action, str) or not action.split():
        return "empty"
    return action.split()[0]
