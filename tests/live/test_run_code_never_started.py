"""A ``/run_code`` step whose action timed out before it started (it waited its whole
time-out, the run's limit and the queue allowance, for a container's memory or for cores)
never ran: the answer is a ``SandboxError`` (nothing ran, the client's retry is safe), not a
``Failed`` ``TimeLimitExceeded`` that blamed a program which never started for its time, and
which SandboxFusion's client does not retry (the request was lost as the program's failure)."""

from __future__ import annotations

from tangram.exec.runtime.records import ErrorInfo
from tests.live.test_run_code_shutdown import answer, ended

QUEUED = ErrorInfo("timeout", "the action timed out after 310 s (never started)")


def test_a_run_that_timed_out_before_it_started_is_a_sandbox_error() -> None:
    doc, kinds = answer(ended(QUEUED, started=False, status="timeout"))
    assert kinds == ["run_code"]
    assert doc["status"] == "SandboxError" and doc["run_result"] is None, doc
    assert "never started" in doc["message"], doc["message"]


def test_a_compile_that_timed_out_before_it_started_is_a_sandbox_error() -> None:
    doc, kinds = answer(ended(QUEUED, started=False, status="timeout"), language="cpp")
    assert kinds == ["run_code_compile"]
    assert doc["status"] == "SandboxError" and doc["compile_result"] is None, doc


def test_a_run_that_timed_out_while_running_is_the_programs_time_limit() -> None:
    ran = ErrorInfo("timeout", "the action timed out after 10 s")
    doc, _ = answer(ended(ran, started=True, status="timeout"))
    assert doc["status"] == "Failed", doc
    assert doc["run_result"]["status"] == "TimeLimitExceeded", doc
