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
from tangram.exec.service.retry import ServiceError


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


def test_create_whose_answer_never_came_releases_the_trajectory_it_asked_for(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The client made the open's id up inside its HTTP call, so when ``create`` gave up
    waiting for the answer (a service that took the open and hung), the tool knew no id to
    release: the container the service did open held the node's memory until it stopped.
    The tool makes the id up now, before the request, and closes it when the open fails."""
    monkeypatch.setattr("tangram.exec.integrations.verl_tool.OPEN_WAIT_S", 0.05)
    monkeypatch.setattr("tangram.exec.integrations.verl_tool.ANSWER_MARGIN_S", 0.05)
    tool = TangramSandboxTool({"tangram_url": "http://127.0.0.1:9", "image": "fake"})
    opened: list[str] = []
    closed: list[str] = []

    async def handler(request: httpx.Request) -> httpx.Response:
        if request.method == "POST" and request.url.path == "/v1/trajectories":
            opened.append(json.loads(request.content)["id"])
            await asyncio.sleep(5)  # (took the open, never answers in time)
        if request.method == "DELETE":
            closed.append(request.url.path.rsplit("/", 1)[-1])
            return httpx.Response(200, json={"id": closed[-1], "memory_gb": 1.0})
        return httpx.Response(404, json={"error": {"code": "unknown", "message": "?"}})

    async def create() -> None:
        tool._client = AsyncClient(
            "http://127.0.0.1:9", retries=0, transport=httpx.MockTransport(handler)
        )
        tool._client_loop = asyncio.get_running_loop()
        with pytest.raises(TimeoutError):
            await tool.create()

    asyncio.run(create())
    assert len(opened) == 1 and closed == opened, (opened, closed)
    assert tool._calls == {}


def test_create_refused_by_a_conflict_on_the_callers_id_closes_nothing() -> None:
    """A 409 on an id verl gave may be another client's open trajectory: never closed."""
    tool = TangramSandboxTool({"tangram_url": "http://127.0.0.1:9", "image": "fake"})
    sent: list[str] = []

    def handler(request: httpx.Request) -> httpx.Response:
        sent.append(request.method)
        conflict = {"code": "conflict", "message": "trajectory 'mine' is open"}
        return httpx.Response(409, json={"error": {**conflict, "retryable": False}})

    async def create() -> None:
        tool._client = AsyncClient(
            "http://127.0.0.1:9", retries=0, transport=httpx.MockTransport(handler)
        )
        tool._client_loop = asyncio.get_running_loop()
        with pytest.raises(ServiceError):
            await tool.create("mine")

    asyncio.run(create())
    assert sent == ["POST"], sent


def test_a_cancelled_create_still_closes_the_trajectory_it_asked_for() -> None:
    """verl's rollout cut short cancels ``create`` while the open waits: the service may have
    opened the container, so its close goes on (shielded) though the caller is gone."""
    tool = TangramSandboxTool({"tangram_url": "http://127.0.0.1:9", "image": "fake"})
    opened: list[str] = []
    closed: list[str] = []
    taken = asyncio.Event()

    async def handler(request: httpx.Request) -> httpx.Response:
        if request.method == "POST":
            opened.append(json.loads(request.content)["id"])
            taken.set()
            await asyncio.sleep(5)  # (bounded: the test cancels it first)
        closed.append(request.url.path.rsplit("/", 1)[-1])
        return httpx.Response(200, json={"id": closed[-1], "memory_gb": 1.0})

    async def create() -> None:
        tool._client = AsyncClient(
            "http://127.0.0.1:9", retries=0, transport=httpx.MockTransport(handler)
        )
        tool._client_loop = asyncio.get_running_loop()
        task = asyncio.ensure_future(tool.create())
        await asyncio.wait_for(taken.wait(), 5)
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task
        for _ in range(100):  # bounded: 1 s for the shielded close
            if closed:
                break
            await asyncio.sleep(0.01)

    asyncio.run(create())
    assert len(opened) == 1 and closed == opened, (opened, closed)
