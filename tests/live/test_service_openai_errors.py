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
    assert isinstance(error["code"], str) and error["code"], error
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


def test_a_refusal_before_the_handler_is_in_the_openai_shape_too() -> None:
    """A tenant at its bound is refused by the service's middleware, before the route's own
    handler (429 naming its bound), and a missing token there too (401): they came in
    Tangram's shape on the OpenAI-style routes as well."""
    import threading

    from tangram.exec.service import Client
    from tests.live.test_service_tenants import ALICE, CLUSTER, OPERATOR, _gated

    gate = threading.Event()

    def make() -> Runtime:
        api = ApiExecutor({"echo": echo, "gate": _gated(gate)})
        return Runtime(CLUSTER, RuntimeConfig(max_pending=8), api=api)

    opts = ServeOptions(port=0, token=OPERATOR, clients={"alice": ALICE}, tenant_max_pending=1)
    with ServiceThread(make, opts) as thread:
        try:
            with Client(thread.url, token=ALICE, retries=0) as alice:
                alice.submit(endpoint="gate", payload=0, id="mine")  # at her bound now
            headers = {"Authorization": f"Bearer {ALICE}"}
            body = {"model": "rm", "query": ["a"]}
            r = httpx.post(f"{thread.url}/get_reward", json=body, headers=headers, timeout=30)
            error = openai_error(r, 429)
            assert error["type"] == "rate_limit_error" and "tenant 'alice'" in error["message"]
            assert "Retry-After" in r.headers
            unknown = httpx.post(f"{thread.url}/v1/completions", json=body, timeout=30)
            assert openai_error(unknown, 401)["code"] == "invalid_api_key"
            wrong = httpx.get(f"{thread.url}/v1/completions", headers=headers, timeout=30)
            assert openai_error(wrong, 405)["code"] == "http_405"
            assert wrong.headers["Allow"] == "POST"
        finally:
            gate.set()


@pytest.mark.parametrize("path", ["/v1/completions", "/pooling", "/get_reward"])
@pytest.mark.parametrize(
    "body",
    [b"{", b"[1, 2]", b'{"a": 1, "a": 2}', b"", b'{"x": NaN}', b'{"input": "a"}'],
    ids=["not JSON", "not an object", "a key twice", "empty", "NaN", "no model"],
)
def test_a_bad_body_is_a_400_with_a_code(svc: ServiceThread, path: str, body: bytes) -> None:
    """A body the routes refused answered OpenAI's shape with ``code`` null, where every
    other error of theirs names one (``model_not_found``, ``overloaded``, ``http_413``) and
    vLLM's always carry one: a client branching on it read nothing."""
    headers = {"Content-Type": "application/json"}
    r = httpx.post(svc.url + path, content=body, headers=headers, timeout=30)
    error = openai_error(r, 400)
    assert error["type"] == "invalid_request_error" and error["code"] == "bad_request", error
