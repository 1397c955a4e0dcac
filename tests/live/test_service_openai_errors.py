"""Every error of the OpenAI-style routes comes back in OpenAI's error shape
(``{"error": {"message", "type", "param", "code"}}``), whatever raised it: a body aiohttp
refused (413 past 64 MiB) or an unexpected exception while the request was parsed (500) came
back in Tangram's shape (``code``, ``message``, ``retryable``), which OpenAI's clients do not
read. No model is needed: both happen before a model is looked up."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import httpx
import pytest

from tangram.core.resources import ApiEndpointSpec, ClusterSpec
from tangram.exec.runtime import ApiExecutor, Runtime, RuntimeConfig
from tangram.exec.runtime.api import echo
from tangram.exec.service import ServeOptions, ServiceThread, openai_routes


@pytest.fixture(scope="module")
def svc() -> Iterator[ServiceThread]:
    cluster = ClusterSpec(name="openai-errors", apis=(ApiEndpointSpec("echo", concurrency=4),))

    def make() -> Runtime:
        return Runtime(cluster, RuntimeConfig(max_pending=8), api=ApiExecutor({"echo": echo}))

    with ServiceThread(make, ServeOptions(port=0)) as service:
        yield service


def openai_error(r: httpx.Response, status: int) -> dict[str, Any]:
    """The answer's OpenAI error object (asserting the status and the shape)."""
    assert r.status_code == status, r.text[:300]
    error = r.json()["error"]
    assert set(error) == {"message", "type", "param", "code"}, error
    assert isinstance(error["message"], str) and error["message"], error
    return error


@pytest.mark.parametrize("path", ["/v1/completions", "/pooling", "/get_reward"])
def test_an_oversized_body_is_refused_in_the_openai_shape(svc: ServiceThread, path: str) -> None:
    body = b'{"prompt": "' + b"x" * (65 << 20) + b'"}'
    headers = {"Content-Type": "application/json"}
    r = httpx.post(svc.url + path, content=body, headers=headers, timeout=120)
    error = openai_error(r, 413)
    assert error["type"] == "invalid_request_error", error


def test_an_unexpected_exception_while_parsing_is_a_500_in_the_openai_shape(
    svc: ServiceThread, monkeypatch: pytest.MonkeyPatch
) -> None:
    def broken(body: Any) -> Any:
        raise ZeroDivisionError("a parser's own bug")

    monkeypatch.setattr(openai_routes, "reward_texts", broken)
    r = httpx.post(svc.url + "/get_reward", json={"query": ["a"]}, timeout=30)
    error = openai_error(r, 500)
    assert error["type"] == "server_error" and "ZeroDivisionError" in error["message"], error
    ok = httpx.post(svc.url + "/pooling", json={"model": "none", "input": "a"}, timeout=30)
    assert openai_error(ok, 404)["code"] == "model_not_found"  # (the routes still serve)
