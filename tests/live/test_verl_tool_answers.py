"""What the verl tool answers the model for calls and outputs at the edges: arguments that are
no JSON object, a ``language`` that is no string, and an output longer than
``max_output_chars`` (the model must still learn that its call timed out, and that what it
reads was cut). On a mock transport: no service, no Docker."""

from __future__ import annotations

import asyncio
import json
from typing import Any

import httpx
import pytest

from tangram.exec.integrations.verl_tool import TangramSandboxTool
from tangram.exec.runtime.records import CommandResult, ErrorInfo, Outcome, Timings
from tangram.exec.service.client import AsyncClient
from tangram.exec.service.schema import outcome_doc


def answered(status: str, stdout: str, stderr: str = "") -> Any:
    """A mock service that answers every action with ``status`` and that output; the
    commands it was sent are in ``handler.sent``."""
    sent: list[str] = []

    def handler(request: httpx.Request) -> httpx.Response:
        body = json.loads(request.content)
        sent.append(body["command"])
        error = ErrorInfo("timeout", "timed out after 2 s") if status == "timeout" else None
        outcome = Outcome(
            action_id=body["id"],
            trajectory=body.get("trajectory"),
            resource="cpu",
            status=status,  # type: ignore[arg-type]
            value=CommandResult(stdout, stderr, None if error else 0),
            error=error,
            timings=Timings(0.0, 0.0, 2.0, 2.0),
            arrival_s=0.0,
            start_s=0.0,
            end_s=2.0,
        )
        return httpx.Response(200, json={"id": body["id"], "outcome": outcome_doc(outcome)})

    handler.sent = sent  # type: ignore[attr-defined]
    return handler


def execute(config: dict[str, Any], handler: Any, parameters: Any) -> str:
    """The text the tool answers ``parameters`` with, on a mock service."""
    tool = TangramSandboxTool({"tangram_url": "http://127.0.0.1:9", "image": "fake", **config})

    async def call() -> str:
        tool._client = AsyncClient(
            "http://127.0.0.1:9", retries=0, transport=httpx.MockTransport(handler)
        )
        tool._client_loop = asyncio.get_running_loop()
        response, _, _ = await tool.execute("t-1", parameters)
        return response.text or ""

    return asyncio.run(call())


def test_a_timed_out_call_with_a_long_output_still_says_it_timed_out() -> None:
    """The time-out's note came after the output and ``max_output_chars`` cut the whole
    text: a call that printed more than the bound and timed out read as one that printed
    and ended, its note cut off, and nothing told the model its output was cut."""
    handler = answered("timeout", "x" * 500)
    text = execute({"max_output_chars": 100, "timeout_s": 2}, handler, {"code": "loop()"})
    assert len(text) <= 100, len(text)
    assert "[timed out after 2 s]" in text, text
    assert "truncated" in text and "500" in text, text
    assert text.startswith("x"), text


def test_an_output_within_the_bound_is_given_whole() -> None:
    text = execute({"max_output_chars": 100}, answered("result", "hello\n"), {"code": "p()"})
    assert text == "hello\n"


def test_a_long_output_says_it_was_cut_within_the_bound() -> None:
    text = execute({"max_output_chars": 60}, answered("result", "y" * 200, "z" * 50), {"code": "p"})
    assert len(text) <= 60 and text.startswith("y") and "truncated" in text, text


@pytest.mark.parametrize("language", [["python"], {"name": "bash"}, 3])
def test_a_language_that_is_no_string_is_answered_not_raised(language: Any) -> None:
    """``language`` was looked up in a dict as given: a list or a dict from the model's JSON
    raised ``TypeError: unhashable type`` out of the tool (verl's loop answered its bare
    text), where any other bad language is told which ones are supported."""
    handler = answered("result", "")
    text = execute({}, handler, {"code": "print(1)", "language": language})
    assert text.startswith("Error:") and "python" in text and "bash" in text, text
    assert handler.sent == []


@pytest.mark.parametrize("parameters", [["print(1)"], "print(1)", None, 7])
def test_arguments_that_are_no_object_are_answered_not_raised(parameters: Any) -> None:
    """verl passes the model's arguments as ``json.loads`` gave them: a list or a string
    raised ``AttributeError: ... has no attribute 'get'`` out of the tool."""
    handler = answered("result", "")
    text = execute({}, handler, parameters)
    assert text.startswith("Error:") and "'code'" in text, text
    assert handler.sent == []


def hung(sent: list[str]) -> Any:
    """A mock service that takes each request and never answers (a hung process)."""

    async def handler(request: httpx.Request) -> httpx.Response:
        sent.append(request.url.path)
        await asyncio.sleep(3600)
        raise AssertionError("unreachable")

    return handler


@pytest.mark.parametrize("call", ["create", "execute", "release"])
def test_a_hung_service_costs_a_call_its_time_out_not_an_hour(
    monkeypatch: pytest.MonkeyPatch, call: str
) -> None:
    """A service that took a request and never answered held the tool call for the client's
    read time-out (its max_wait_s, 300 s, plus 60) on each of its 9 attempts: 54 minutes of
    a rollout on one tool call. Each call is bounded by what it may take (the action's
    ``timeout_s``, an open's wait for room) plus ``ANSWER_MARGIN_S``: ``execute`` answers an
    error text, ``create`` raises (verl answers it), ``release`` logs it."""
    from tangram.exec.integrations import verl_tool

    monkeypatch.setattr(verl_tool, "ANSWER_MARGIN_S", 0.3)
    monkeypatch.setattr(verl_tool, "OPEN_WAIT_S", 0.2)
    tool = TangramSandboxTool({"tangram_url": "http://127.0.0.1:9", "image": "f", "timeout_s": 0.2})
    sent: list[str] = []

    async def main() -> Any:
        tool._client = AsyncClient(
            "http://127.0.0.1:9", retries=8, transport=httpx.MockTransport(hung(sent))
        )
        tool._client_loop = asyncio.get_running_loop()
        if call == "create":
            with pytest.raises(TimeoutError, match="did not answer"):
                await tool.create()
            return None
        if call == "execute":
            return (await tool.execute("t-1", {"code": "print(1)"}))[0].text
        return await tool.release("t-1")

    text = asyncio.run(asyncio.wait_for(main(), 10))  # (bounded: it hung for an hour)
    assert sent, "the request went out"
    if call == "execute":
        assert text.startswith("Error:") and "did not answer" in text, text


@pytest.mark.parametrize(
    ("field", "value"),
    [("timeout_s", 30 * 86400.0 + 1), ("timeout_s", 1e12), ("t1_s", 2e9), ("max_units", 2**63)],
    ids=repr,
)
def test_a_setting_past_what_the_service_takes_is_refused_at_load(field: str, value: Any) -> None:
    """A ``timeout_s`` over 30 days, a ``t1_s`` over the trace's longest time or a
    ``max_units`` past int64 passed the tool's checks (positive, finite) and the service
    refused every call with a 400, raised out of ``execute`` mid-rollout."""
    with pytest.raises(ValueError, match=field):
        TangramSandboxTool({"tangram_url": "http://127.0.0.1:8765", "image": "f", field: value})
    ok = {"timeout_s": 30 * 86400.0, "t1_s": 1e9, "max_units": 64}[field]
    TangramSandboxTool({"tangram_url": "http://127.0.0.1:8765", "image": "f", field: ok})


@pytest.mark.parametrize(
    ("field", "value"), [("image", "Tangram Python"), ("image", "x:"), ("memory_gb", 0.001)]
)
def test_a_container_setting_every_open_would_refuse_is_refused_at_load(
    field: str, value: Any
) -> None:
    """An image that is no image reference, or less memory than the smallest container,
    passed the tool's checks (a non-empty string, a positive number): every ``create`` was
    refused with a 400 mid-rollout."""
    with pytest.raises(ValueError, match=field):
        TangramSandboxTool({"tangram_url": "http://127.0.0.1:8765", field: value})
