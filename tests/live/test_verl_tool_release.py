"""``release`` of the verl tool never raises: verl's agent loop calls it in a ``finally``
with no guard of its own (``tool_agent_loop``), so an error out of it (the service gone, a
503 while it shuts down) failed the whole rollout over a container the service removes at
its own end anyway. It raised every error but a 404; each is now logged and released."""

from __future__ import annotations

import asyncio
import json
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


def test_create_after_a_lost_answer_returns_the_trajectory_it_opened() -> None:
    """``create`` made the instance id up itself, so to the client it was the caller's own:
    the open's retry after a lost answer, answered 409 (the first attempt had opened it), was
    raised, verl never learnt the instance and never released it, and its container held
    the node's memory until the service stopped. The client makes it up now, and reads its
    409 as its own first attempt."""
    tool = TangramSandboxTool({"tangram_url": "http://127.0.0.1:9", "image": "fake"})
    opened: list[str] = []

    def handler(request: httpx.Request) -> httpx.Response:
        if request.method == "POST" and request.url.path == "/v1/trajectories":
            traj = json.loads(request.content)["id"]
            if opened:
                assert traj == opened[0]  # (the retry is the same open)
                conflict = {"code": "conflict", "message": f"trajectory {traj!r} is open"}
                return httpx.Response(409, json={"error": {**conflict, "retryable": False}})
            opened.append(traj)
            raise httpx.ReadError("the answer was lost", request=request)
        if request.method == "GET" and opened and request.url.path.endswith(opened[0]):
            return httpx.Response(200, json={"id": opened[0], "memory_gb": 1.0})
        return httpx.Response(404, json={"error": {"code": "unknown", "message": "?"}})

    async def create() -> str:
        tool._client = AsyncClient(
            "http://127.0.0.1:9", retries=2, transport=httpx.MockTransport(handler)
        )
        tool._client_loop = asyncio.get_running_loop()
        instance, _ = await tool.create()
        return instance

    instance = asyncio.run(create())
    assert opened == [instance] and tool._calls == {instance: 0}
