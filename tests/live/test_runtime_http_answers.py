"""``--api NAME=URL`` endpoints (``HttpEndpoint``) and the answers they get: one larger than
the bound, one that is not JSON. On a mock transport: no network."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from typing import Any

import httpx
import pytest

from tangram.exec.runtime.api import MAX_ANSWER_BYTES, EndpointError, HttpEndpoint

CHUNK = 1 << 16


def call(endpoint: HttpEndpoint, handler: Any) -> Any:
    """``endpoint({"x": 1})`` with its client on ``handler``."""

    async def main() -> Any:
        endpoint._client = httpx.AsyncClient(transport=httpx.MockTransport(handler))
        try:
            return await endpoint({"x": 1})
        finally:
            await endpoint.aclose()

    return asyncio.run(main())


def test_an_answer_past_the_bound_fails_the_call_without_reading_it_all() -> None:
    """The answer was read whole into memory, then parsed, then kept as the outcome (10,000
    of them in memory, each in the journal): an endpoint answering without end took the
    service's memory. Past ``max_answer_bytes`` the call fails, naming the bound, and the
    rest is not read."""
    sent = [0]
    total = MAX_ANSWER_BYTES + 64 * CHUNK

    async def body() -> AsyncIterator[bytes]:
        for _ in range(total // CHUNK):  # bounded: a long answer, not an endless one
            sent[0] += CHUNK
            yield b" " * CHUNK

    def handler(request: httpx.Request) -> httpx.Response:
        return httpx.Response(200, headers={"content-type": "application/json"}, content=body())

    with pytest.raises(EndpointError, match=f"more than {MAX_ANSWER_BYTES:,} bytes") as info:
        call(HttpEndpoint("http://127.0.0.1:9/call?key=secret"), handler)
    assert "secret" not in str(info.value)
    assert sent[0] <= MAX_ANSWER_BYTES + 2 * CHUNK, sent[0]


def test_an_answer_within_the_bound_is_its_json() -> None:
    def handler(request: httpx.Request) -> httpx.Response:
        return httpx.Response(200, json={"ok": [1, 2]})

    assert call(HttpEndpoint("http://127.0.0.1:9/call"), handler) == {"ok": [1, 2]}
    small = HttpEndpoint("http://127.0.0.1:9/call", max_answer_bytes=4)
    with pytest.raises(EndpointError, match="more than 4 bytes"):
        call(small, handler)


def test_an_answer_that_is_not_json_says_so() -> None:
    """A non-JSON answer (an HTML error page under 200) failed with json's bare
    'Expecting value: line 1 column 1 (char 0)', naming neither the answer nor its type."""

    def handler(request: httpx.Request) -> httpx.Response:
        return httpx.Response(200, headers={"content-type": "text/html"}, content=b"<html>")

    with pytest.raises(EndpointError, match=r"not JSON.*text/html"):
        call(HttpEndpoint("http://127.0.0.1:9/call"), handler)


@pytest.mark.parametrize("value", [0, -1, 1.5, True, "10"])
def test_a_bound_that_is_no_positive_count_is_refused(value: Any) -> None:
    with pytest.raises(ValueError, match="max_answer_bytes"):
        HttpEndpoint("http://127.0.0.1:9/call", max_answer_bytes=value)


@pytest.mark.parametrize("value", [0, -1, float("nan"), float("inf"), "5"])
def test_a_time_out_that_is_no_positive_number_is_refused(value: Any) -> None:
    """``timeout_s`` was given to httpx as is: NaN or a negative one failed every call."""
    with pytest.raises(ValueError, match="timeout_s"):
        HttpEndpoint("http://127.0.0.1:9/call", timeout_s=value)
