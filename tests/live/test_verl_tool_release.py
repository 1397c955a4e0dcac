"""``release`` of the verl tool never raises: verl's agent loop calls it in a ``finally``
with no guard of its own (``tool_agent_loop``), so an error out of it (the service gone, a
503 while it shuts down) failed the whole rollout over a container the service removes at
its own end anyway. It raised every error but a 404; each is now logged and released."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable
from typing import Any

import httpx
import pytest

from tangram.exec.integrations.verl_tool import TangramSandboxTool
from tangram.exec.service.client import AsyncClient


def refused(request: httpx.Request) -> httpx.Response:
    raise httpx.ConnectError("connection refused", request=request)


def shutting_down(request: httpx.Request) -> httpx.Response:
    error = {"code": "shutting_down", "message": "the runtime is shutting down"}
    return httpx.Response(503, json={"error": {**error, "retryable": True}})


def bad_id(request: httpx.Request) -> httpx.Response:
    return httpx.Response(400, json={"error": {"code": "bad_request", "message": "bad id"}})


@pytest.mark.parametrize(
    "answer", [refused, shutting_down, bad_id], ids=["transport", "503", "400"]
)
def test_release_logs_an_error_and_does_not_raise(
    answer: Callable[[httpx.Request], httpx.Response], caplog: pytest.LogCaptureFixture
) -> None:
    tool = TangramSandboxTool({"tangram_url": "http://127.0.0.1:9", "image": "fake"})
    tool._calls["t-1"] = 2
    sent: list[Any] = []

    def handler(request: httpx.Request) -> httpx.Response:
        sent.append(request.url.path)
        return answer(request)

    async def release() -> None:
        tool._client = AsyncClient(
            "http://127.0.0.1:9", retries=0, transport=httpx.MockTransport(handler)
        )
        tool._client_loop = asyncio.get_running_loop()
        await tool.release("t-1")

    with caplog.at_level(logging.WARNING, logger="tangram.exec.integrations.verl_tool"):
        asyncio.run(release())
    assert sent and all(p.endswith("/t-1") for p in sent), sent
    assert "t-1" not in tool._calls
    assert any("t-1" in r.getMessage() for r in caplog.records), caplog.records
