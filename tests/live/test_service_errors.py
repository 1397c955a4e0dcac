"""The runtime's error registry across the HTTP layer: every error reaches both clients as
itself (status, code, retryable, hint, class), is retried exactly when its class says so, and
``docs/live.md`` lists the statuses the classes declare."""

from __future__ import annotations

import asyncio
import re
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from tangram.core.resources import ApiEndpointSpec, ClusterSpec
from tangram.exec.runtime import ApiExecutor, Runtime, RuntimeConfig
from tangram.exec.runtime.api import echo
from tangram.exec.runtime.errors import ERRORS, LiveError, Overloaded
from tangram.exec.service import (
    AsyncClient,
    Client,
    OverloadedError,
    ServeOptions,
    ServiceError,
    ServiceThread,
)

DOCS = Path(__file__).resolve().parents[2] / "docs" / "live.md"


@pytest.fixture(scope="module")
def svc() -> Iterator[ServiceThread]:
    cluster = ClusterSpec(name="errors", apis=(ApiEndpointSpec("echo", concurrency=8),))

    def make() -> Runtime:
        return Runtime(cluster, RuntimeConfig(max_pending=50), api=ApiExecutor({"echo": echo}))

    with ServiceThread(make, ServeOptions(port=0)) as service:
        yield service


class Raiser:
    """Stands in for ``Runtime.status``: raises ``error`` and counts the calls."""

    def __init__(self, error: LiveError) -> None:
        self.error, self.calls = error, 0

    def __call__(self) -> Any:
        self.calls += 1
        raise self.error


def seen(err: ServiceError) -> tuple[Any, ...]:
    return (
        type(err),
        err.status,
        err.code,
        err.message,
        err.retryable,
        err.retry_after_s,
        err.error_class,
    )


def status_error_of_both_clients(url: str, retries: int) -> tuple[ServiceError, ServiceError]:
    with Client(url, retries=retries) as c, pytest.raises(ServiceError) as sync:
        c.status()

    async def main() -> ServiceError:
        async with AsyncClient(url, retries=retries) as c:
            with pytest.raises(ServiceError) as info:
                await c.status()
            return info.value

    return sync.value, asyncio.run(main())


@pytest.mark.parametrize("code", sorted(ERRORS))
def test_every_registered_error_reaches_both_clients_as_itself(
    svc: ServiceThread, monkeypatch: pytest.MonkeyPatch, code: str
) -> None:
    cls = ERRORS[code]
    error = cls(f"{code} raised on purpose")
    raiser = Raiser(error)
    monkeypatch.setattr(svc.runtime, "status", raiser)
    r = httpx.get(f"{svc.url}/v1/status")
    assert r.status_code == cls.http_status
    assert r.json() == {
        "error": {"code": code, "message": error.message, "retryable": cls.retryable}
    }
    assert ("Retry-After" in r.headers) == (error.retry_after_s is not None)
    sync, async_ = status_error_of_both_clients(svc.url, retries=0)
    assert seen(sync) == seen(async_)
    assert sync.status == cls.http_status and sync.code == code and sync.error_class is cls
    assert sync.retryable == cls.retryable and sync.message == error.message
    assert sync.retry_after_s == pytest.approx(error.retry_after_s)
    assert isinstance(sync, OverloadedError) == (cls is Overloaded)


@pytest.mark.parametrize("code", sorted(ERRORS))
def test_both_clients_retry_an_error_exactly_when_its_class_is_retryable(
    svc: ServiceThread, monkeypatch: pytest.MonkeyPatch, code: str
) -> None:
    error = ERRORS[code](f"{code} raised on purpose")
    error.retry_after_s = 0.01 if error.retry_after_s is not None else None  # a quick back-off
    raiser = Raiser(error)
    monkeypatch.setattr(svc.runtime, "status", raiser)
    sync, async_ = status_error_of_both_clients(svc.url, retries=2)
    assert seen(sync) == seen(async_) and sync.code == code
    assert raiser.calls == (2 * 3 if ERRORS[code].retryable else 2 * 1)


def test_an_error_raised_as_the_base_class_is_an_internal_500(
    svc: ServiceThread, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(svc.runtime, "status", Raiser(LiveError("no container")))
    sync, async_ = status_error_of_both_clients(svc.url, retries=3)
    assert seen(sync) == seen(async_)
    assert (sync.status, sync.code, sync.retryable, sync.error_class) == (500, "error", False, None)


def test_the_registry_holds_every_error_class_once_under_its_own_code() -> None:
    def subclasses(cls: type[LiveError]) -> set[type[LiveError]]:
        return {s for c in cls.__subclasses__() for s in {c, *subclasses(c)}}

    assert set(ERRORS.values()) == subclasses(LiveError)
    assert all(cls.code == code for code, cls in ERRORS.items())
    with pytest.raises(TypeError, match="own code"):
        type("Nameless", (LiveError,), {})
    with pytest.raises(TypeError, match="'overloaded' is Overloaded's"):
        type("Twin", (LiveError,), {"code": "overloaded"})
    assert ERRORS["overloaded"] is Overloaded


def test_the_docs_list_the_status_each_error_class_declares() -> None:
    text = DOCS.read_text()
    start = text.index("**HTTP statuses and error documents.**")
    table = text[start : text.index("\n## ", start)]
    documented: dict[str, tuple[int, bool]] = {}
    for status, codes in re.findall(r"^\| (\d{3}) \| ([^|]+) \|", table, flags=re.M):
        for code in re.findall(r"`(\w+)`", codes):
            documented[code] = (int(status), "(retryable)" in codes)
    documented.pop("unauthorized")  # the token middleware's, not a runtime error
    assert documented == {c: (cls.http_status, cls.retryable) for c, cls in ERRORS.items()}


def test_an_unexpected_failure_of_run_code_answers_in_sandbox_fusions_shape_too(
    svc: ServiceThread, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A bug inside ``/run_code`` answered Tangram's 500 alone: SandboxFusion's clients read
    its ``status`` and ``message``, and found neither."""
    from tangram.exec.service import app

    async def broken(*args: Any, **kwargs: Any) -> Any:
        raise RuntimeError("a bug")

    monkeypatch.setattr(app, "run_code", broken)
    r = httpx.post(f"{svc.url}/run_code", json={"code": "print(1)"}, timeout=30)
    assert r.status_code == 500, r.text
    doc = r.json()
    assert doc["status"] == "SandboxError" and doc["run_result"] is None, doc
    assert doc["compile_result"] is None and doc["files"] == {}, doc
    assert "RuntimeError: a bug" in doc["message"], doc
    assert doc["error"]["code"] == "internal" and doc["error"]["retryable"] is False, doc


def test_the_services_own_refusals_of_run_code_answer_in_sandbox_fusions_shape_too() -> None:
    """A missing token (401) and a method ``/run_code`` does not take (405) were answered in
    Tangram's shape alone, before the route's handler: SandboxFusion's clients read no
    ``status``, where every other refusal of the route carries both shapes."""
    cluster = ClusterSpec(name="errors", apis=(ApiEndpointSpec("echo", concurrency=8),))

    def make() -> Runtime:
        return Runtime(cluster, RuntimeConfig(max_pending=50), api=ApiExecutor({"echo": echo}))

    with ServiceThread(make, ServeOptions(port=0, token="op")) as service:
        url = f"{service.url}/run_code"
        answers = [
            (httpx.post(url, json={"code": "print(1)"}, timeout=30), 401, "unauthorized"),
            (httpx.get(url, headers={"Authorization": "Bearer op"}, timeout=30), 405, "http_405"),
        ]
    for r, status, code in answers:
        assert r.status_code == status, r.text
        doc = r.json()
        assert doc["status"] == "SandboxError" and doc["run_result"] is None, doc
        assert doc["error"]["code"] == code and doc["message"] == doc["error"]["message"], doc
    assert answers[0][0].headers["WWW-Authenticate"] == "Bearer"
    assert answers[1][0].headers["Allow"] == "POST"


def strict_json(text: str) -> Any:
    """``text`` parsed as JSON proper: ``NaN``, ``Infinity`` and ``-Infinity`` refused (as Go,
    Rust and JavaScript parsers refuse them; Python's ``json`` takes them by default)."""
    import json

    def refuse(name: str) -> Any:
        raise AssertionError(f"not JSON: {name} in {text[:300]}")

    return json.loads(text, parse_constant=refuse)


@pytest.mark.parametrize(
    ("path", "where"),
    [("/v1/status", "uptime_s"), ("/v1/status", "held.api_in_flight.echo")],
)
def test_a_number_json_cannot_carry_is_a_500_naming_where_it_is(
    svc: ServiceThread, monkeypatch: pytest.MonkeyPatch, path: str, where: str
) -> None:
    """The service wrote its answers with Python's ``json.dumps``, which writes a NaN or an
    infinity as ``NaN``/``Infinity``: a 200 no strict client could read. Every answer is
    strict JSON now, and one holding such a number is a 500 naming its path."""
    real = svc.runtime.status

    def odd() -> Any:
        doc = real()
        if where == "uptime_s":
            doc["uptime_s"] = float("nan")
        else:
            doc["held"]["api_in_flight"]["echo"] = float("-inf")
        return doc

    monkeypatch.setattr(svc.runtime, "status", odd)
    r = httpx.get(f"{svc.url}{path}", timeout=30)
    doc = strict_json(r.text)
    assert r.status_code == 500, (r.status_code, r.text[:300])
    assert doc["error"]["code"] == "internal" and where in doc["error"]["message"], doc


def test_run_code_answer_with_a_number_json_cannot_carry_is_a_500_in_its_shape(
    svc: ServiceThread, monkeypatch: pytest.MonkeyPatch
) -> None:
    """(As above, for ``/run_code``: SandboxFusion's clients read its shape.)"""
    from tangram.exec.service import app

    async def odd(*args: Any, **kwargs: Any) -> Any:
        return {"status": "Success", "run_result": {"execution_time": float("inf")}}

    monkeypatch.setattr(app, "run_code", odd)
    r = httpx.post(f"{svc.url}/run_code", json={"code": "print(1)"}, timeout=30)
    doc = strict_json(r.text)
    assert r.status_code == 500 and doc["status"] == "SandboxError", doc
    assert "run_result.execution_time" in doc["message"], doc


def test_a_result_holding_nan_or_infinity_is_strict_json_with_them_as_strings() -> None:
    """A GPU or API result's NaN or infinity goes out as the string ``"nan"``, ``"inf"`` or
    ``"-inf"`` (``to_json``; ``float()`` reads each back), never as ``NaN``: the answer is
    strict JSON, and the same after a restart (the journal stores the same)."""
    import numpy as np

    cluster = ClusterSpec(name="odd", apis=(ApiEndpointSpec("odd", concurrency=2),))

    async def odd(payload: Any) -> Any:
        return {"a": float("nan"), "b": [float("inf"), 1.5], "c": np.array([-np.inf])}

    def make() -> Runtime:
        return Runtime(cluster, RuntimeConfig(), api=ApiExecutor({"odd": odd}))

    with ServiceThread(make, ServeOptions(port=0)) as service:
        r = httpx.post(
            f"{service.url}/v1/actions", json={"endpoint": "odd", "payload": 1, "wait": 30}
        )
    doc = strict_json(r.text)
    assert r.status_code == 200 and doc["outcome"]["status"] == "result", doc
    assert doc["outcome"]["result"] == {"a": "nan", "b": ["inf", 1.5], "c": ["-inf"]}, doc


def test_an_oversized_body_is_a_413_naming_the_limit(svc: ServiceThread) -> None:
    """aiohttp's 413 said only "Request Entity Too Large": a client could not tell how much
    less to send. It names the service's limit now (the same on every route)."""
    body = b'{"endpoint": "echo", "payload": "' + b"x" * (65 << 20) + b'"}'
    for path in ("/v1/actions", "/run_code"):
        r = httpx.post(
            svc.url + path, content=body, headers={"Content-Type": "application/json"}, timeout=120
        )
        doc = r.json()
        assert r.status_code == 413 and doc["error"]["code"] == "http_413", doc
        assert "67,108,864 bytes (64 MiB)" in doc["error"]["message"], doc


def test_a_path_that_is_no_route_is_a_404_naming_it(svc: ServiceThread) -> None:
    """A typo'd path was answered "Not Found" alone, naming neither it nor the method."""
    r = httpx.post(f"{svc.url}/v1/action", json={"endpoint": "echo", "payload": 1})
    doc = r.json()
    assert r.status_code == 404 and doc["error"]["code"] == "http_404", doc
    assert "POST '/v1/action'" in doc["error"]["message"], doc


@pytest.mark.parametrize("path", ["/v1/actions", "/run_code"])
def test_a_body_its_content_encoding_does_not_describe_is_a_400(
    svc: ServiceThread, path: str, caplog: pytest.LogCaptureFixture
) -> None:
    """A body sent with ``Content-Encoding: gzip`` that was not gzip was a 500 ``internal``
    with a stack trace in the log (aiohttp's ``RequestPayloadError``), any client's to cause."""
    import logging

    caplog.set_level(logging.ERROR)
    r = httpx.post(
        svc.url + path,
        content=b'{"endpoint": "echo", "payload": 1}',
        headers={"Content-Type": "application/json", "Content-Encoding": "gzip"},
        timeout=30,
    )
    doc = r.json()
    assert r.status_code == 400 and doc["error"]["code"] == "bad_request", doc
    assert "content-encoding: gzip" in doc["error"]["message"], doc
    assert "Traceback" not in caplog.text and not caplog.records, caplog.text


@pytest.mark.parametrize("coding", ["xyz", "x-gzip", "gzip, br"])
def test_a_content_encoding_the_service_does_not_decode_is_a_400_naming_it(
    svc: ServiceThread, coding: str
) -> None:
    """A Content-Encoding aiohttp does not decode was ignored: the body was read as it came,
    a plain one accepted as if the header said nothing, a compressed one refused as "not
    valid UTF-8". It is a 400 naming the header, and nothing is accepted."""
    r = httpx.post(
        svc.url + "/v1/actions",
        content=b'{"endpoint": "echo", "payload": 1}',
        headers={"Content-Type": "application/json", "Content-Encoding": coding},
        timeout=30,
    )
    doc = r.json()
    assert r.status_code == 400 and doc["error"]["code"] == "bad_request", doc
    assert "Content-Encoding" in doc["error"]["message"] and coding in doc["error"]["message"]
