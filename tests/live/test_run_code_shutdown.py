"""``/run_code`` when the service's shutdown cuts a step: the program that started running is
the client's final answer (``Failed``, ``run_result`` ``Error``), never a ``SandboxError``,
which SandboxFusion's client retries, running the program a second time on a restarted
service; a step that never started (queued when the service stopped) is a ``SandboxError``,
safe to retry, as nothing of it ran. A stand-in runtime answers each step as the real one
does at shutdown (``Runtime.close``), so no container is needed."""

from __future__ import annotations

import asyncio
from typing import Any

from sandbox_fusion.models import RunCodeResponse, RunStatus

from tangram.exec.runtime import Outcome
from tangram.exec.runtime.errors import ShuttingDown
from tangram.exec.runtime.records import ErrorInfo, Timings
from tangram.exec.service import sandbox_fusion
from tangram.exec.service.sandbox_fusion import RunCodeSettings, parse_run_code

CUT = ErrorInfo(ShuttingDown.code, "the runtime shut down while the action ran (30 s grace)")
REFUSED = ErrorInfo(ShuttingDown.code, ShuttingDown().message, retryable=True)


def ended(error: ErrorInfo, *, started: bool, status: str = "error") -> Outcome:
    """An action's outcome as ``Runtime.close`` gives it: cut while running or ended queued
    (``status`` "timeout": as its deadline ends it)."""
    exec_s = 2.0 if started else 0.0
    return Outcome(
        action_id="a",
        trajectory="t",
        resource="cpu",
        status=status,  # type: ignore[arg-type]
        value=None,
        error=error,
        timings=Timings(queue_s=0.0, overhead_s=0.0, exec_s=exec_s, act_s=exec_s),
        arrival_s=0.0,
        start_s=0.0 if started else None,
        end_s=exec_s,
    )


class StoppingRuntime:
    """Opens and closes trajectories; each action ends with ``outcome`` (counted)."""

    cpu = None

    def __init__(self, outcome: Outcome) -> None:
        self.outcome, self.kinds = outcome, []

    async def open_trajectory(self, *args: Any, **kwargs: Any) -> None:
        return None

    async def close_trajectory(self, traj: str) -> None:
        return None

    async def run(self, spec: Any) -> Outcome:
        self.kinds.append(spec.kind)
        return self.outcome


def answer(outcome: Outcome, **body: Any) -> tuple[dict[str, Any], list[str]]:
    settings = RunCodeSettings()
    req = parse_run_code({"code": "print(1)", **body}, settings)
    runtime = StoppingRuntime(outcome)
    doc = asyncio.run(sandbox_fusion.run_code(runtime, req, settings, max_output_bytes=1 << 20))
    return doc, runtime.kinds


def test_a_program_cut_by_the_shutdown_is_a_final_failed_answer() -> None:
    doc, kinds = answer(ended(CUT, started=True))
    assert kinds == ["run_code"]
    assert doc["status"] == "Failed", doc  # SandboxFusion's client does not retry it
    run = doc["run_result"]
    assert run["status"] == "Error" and run["return_code"] is None, run
    assert run["execution_time"] == 2.0
    assert "shut down" in doc["message"], doc["message"]
    # The official client reads it as the program's failure: it retries only SandboxError.
    assert RunCodeResponse(**doc).status == RunStatus.Failed


def test_a_run_that_never_started_before_the_shutdown_is_a_sandbox_error() -> None:
    doc, _ = answer(ended(REFUSED, started=False))
    assert doc["status"] == "SandboxError", doc  # nothing ran: the client's retry is safe
    assert doc["run_result"] is None


def test_a_compile_cut_by_the_shutdown_is_a_sandbox_error_the_program_never_ran() -> None:
    doc, kinds = answer(ended(CUT, started=True), language="cpp")
    assert kinds == ["run_code_compile"]
    assert doc["status"] == "SandboxError", doc
