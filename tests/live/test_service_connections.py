"""Slow and idle clients cannot hold the service (issue 16, defect 10): a connection that does
not finish its headers, or its body, in time is closed; beyond ``max_connections`` a new one
is answered 429 at once; the others are served meanwhile. Loopback only; every loop is
bounded in count and time.
"""

from __future__ import annotations

import contextlib
import json
import logging
import socket
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import httpx
import pytest

from tangram.core.resources import ApiEndpointSpec, ClusterSpec
from tangram.exec.runtime import ApiExecutor, Runtime, RuntimeConfig
from tangram.exec.runtime.api import echo
from tangram.exec.service import Client, ServeOptions, ServiceThread
from tangram.exec.service.limits import ConnectionLimits

CLUSTER = ClusterSpec(name="conns", apis=(ApiEndpointSpec("echo", concurrency=64),))
#: How long the tests give the service to close what it must close (the limits are 1 s).
DEADLINE_S = 20.0

HEAD = (
    b"POST /v1/actions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
    b"Content-Length: 100\r\n\r\n"
)


@contextmanager
def served(limits: ConnectionLimits) -> Iterator[ServiceThread]:
    def make() -> Runtime:
        return Runtime(CLUSTER, RuntimeConfig(max_pending=100), api=ApiExecutor({"echo": echo}))

    with ServiceThread(make, ServeOptions(port=0, limits=limits)) as service:
        yield service


def address(service: ServiceThread) -> tuple[str, int]:
    host, port = service.url.removeprefix("http://").rsplit(":", 1)
    return host, int(port)


def connect(service: ServiceThread, count: int, first_bytes: bytes) -> list[socket.socket]:
    socks = []
    for _ in range(count):
        s = socket.create_connection(address(service), timeout=5.0)
        if first_bytes:
            s.sendall(first_bytes)
        socks.append(s)
    return socks


def wait_closed(socks: list[socket.socket], deadline_s: float) -> tuple[list[socket.socket], bytes]:
    """Read each socket until the service closes it or the deadline passes: (still open, one
    answer seen)."""
    for s in socks:
        s.setblocking(False)
    open_left, seen = list(socks), b""
    end = time.monotonic() + deadline_s
    while open_left and time.monotonic() < end:
        for s in list(open_left):
            try:
                data = s.recv(65536)
            except BlockingIOError:
                continue
            except OSError:
                open_left.remove(s)
                continue
            if not data:
                open_left.remove(s)
            else:
                seen = seen or data
        time.sleep(0.05)
    return open_left, seen


def served_meanwhile(service: ServiceThread) -> None:
    with Client(service.url, retries=0) as c:
        assert c.run(endpoint="echo", payload="still here").value == "still here"


LIMITS = ConnectionLimits(header_timeout_s=1.0, body_timeout_s=1.0, max_connections=1024)


def test_connections_that_sent_headers_and_one_body_byte_are_closed() -> None:
    with served(LIMITS) as service:
        socks = connect(service, 200, HEAD + b"{")
        try:
            served_meanwhile(service)
            left, seen = wait_closed(socks, DEADLINE_S)
            assert not left, f"{len(left)} of 200 slow-body connections still open"
            assert seen.startswith(b"HTTP/1.1 408"), seen[:200]
            body = json.loads(seen.split(b"\r\n\r\n", 1)[1])
            assert body["error"]["code"] == "request_timeout", body
            served_meanwhile(service)
        finally:
            for s in socks:
                s.close()


@pytest.mark.parametrize(
    "first_bytes",
    [b"", b"POST /v1/actions HTTP/1.1\r\nHost: x\r\n", b"GET /healthz HTT"],
    ids=["idle", "half the headers", "half the request line"],
)
def test_connections_that_do_not_finish_their_headers_are_closed(first_bytes: bytes) -> None:
    with served(LIMITS) as service:
        socks = connect(service, 100, first_bytes)
        try:
            served_meanwhile(service)
            left, _ = wait_closed(socks, DEADLINE_S)
            assert not left, f"{len(left)} of 100 connections still open"
        finally:
            for s in socks:
                s.close()


def test_connections_beyond_the_bound_are_refused_at_once_and_the_rest_served() -> None:
    limits = ConnectionLimits(header_timeout_s=60.0, body_timeout_s=60.0, max_connections=8)
    with served(limits) as service:
        held = connect(service, 8, b"")
        try:
            time.sleep(0.2)  # the service has accepted them
            extra = socket.create_connection(address(service), timeout=10.0)
            extra.sendall(b"GET /healthz HTTP/1.1\r\nHost: x\r\n\r\n")
            answer = b""
            for _ in range(100):  # bounded: the answer is small and comes at once
                chunk = extra.recv(65536)
                if not chunk:
                    break
                answer += chunk
            extra.close()
            assert answer.startswith(b"HTTP/1.1 429"), answer[:200]
            assert b"Retry-After: 1" in answer
            doc = json.loads(answer.split(b"\r\n\r\n", 1)[1])
            assert doc["error"]["code"] == "overloaded" and doc["error"]["retryable"] is True
            assert "8 connections" in doc["error"]["message"]
        finally:
            for s in held:
                s.close()
        end = time.monotonic() + DEADLINE_S
        while time.monotonic() < end:  # the held ones are gone once the service saw them close
            try:
                served_meanwhile(service)
                break
            except Exception:  # noqa: BLE001 - refused while the closes are processed
                time.sleep(0.1)
        served_meanwhile(service)


@pytest.mark.parametrize(
    "kwargs",
    [{"header_timeout_s": 0}, {"body_timeout_s": -1}, {"max_connections": 0}],
    ids=str,
)
def test_limits_must_be_positive(kwargs: dict[str, float]) -> None:
    with pytest.raises(ValueError, match=next(iter(kwargs))):
        ConnectionLimits(**kwargs)


def test_tangram_serve_takes_the_limits_with_their_defaults() -> None:
    from tangram.cli import build_parser
    from tangram.exec.service.limits import DEFAULT_MAX_OUTPUT_BYTES

    args = build_parser().parse_args(["serve"])
    defaults = ConnectionLimits()
    assert (args.header_timeout_s, args.body_timeout_s, args.max_connections) == (
        defaults.header_timeout_s,
        defaults.body_timeout_s,
        defaults.max_connections,
    )
    assert args.max_output_bytes == DEFAULT_MAX_OUTPUT_BYTES
    given = ["serve", "--header-timeout-s", "2", "--body-timeout-s", "3", "--max-connections", "9"]
    args = build_parser().parse_args([*given, "--max-output-bytes", "4096"])
    assert (args.header_timeout_s, args.body_timeout_s, args.max_connections) == (2.0, 3.0, 9)
    assert args.max_output_bytes == 4096


@pytest.mark.parametrize(
    ("request_line", "family"),
    [
        (b"POST /run_code HTTP/1.1", "sandbox"),
        (b"POST /v1/completions HTTP/1.1", "openai"),
        (b"POST /pooling?x=1 HTTP/1.1", "openai"),
        (b"POST /v1/actions HTTP/1.1", "tangram"),
        # An absolute-form target (RFC 9112 3.2.2, as a proxy forwards): its path decides.
        (b"POST http://x/run_code HTTP/1.1", "sandbox"),
        (b"POST http://x:8080/v1/completions?y=2 HTTP/1.1", "openai"),
        (b"POST https://x/v1/actions HTTP/1.1", "tangram"),
        # A percent-encoded path (routed by its decoded path): its decoded path decides.
        (b"POST /run%5Fcode HTTP/1.1", "sandbox"),
    ],
)
def test_a_connection_beyond_the_bound_is_refused_in_its_routes_shape(
    request_line: bytes, family: str
) -> None:
    """The refusal was Tangram's error document on every path: a SandboxFusion client read no
    ``status`` from ``/run_code``'s, an OpenAI client no ``type`` from the OpenAI routes'."""
    limits = ConnectionLimits(header_timeout_s=60.0, body_timeout_s=60.0, max_connections=2)
    with served(limits) as service:
        held = connect(service, 2, b"")
        try:
            time.sleep(0.2)  # the service has accepted them
            extra = socket.create_connection(address(service), timeout=10.0)
            extra.sendall(request_line + b"\r\nHost: x\r\nContent-Length: 0\r\n\r\n")
            answer = b""
            for _ in range(100):  # bounded: the answer is small and comes at once
                chunk = extra.recv(65536)
                if not chunk:
                    break
                answer += chunk
            extra.close()
        finally:
            for s in held:
                s.close()
    assert answer.startswith(b"HTTP/1.1 429") and b"Retry-After: 1" in answer, answer[:200]
    doc = json.loads(answer.split(b"\r\n\r\n", 1)[1])
    assert "2 connections" in doc["error"]["message"]
    if family == "sandbox":
        assert doc["status"] == "SandboxError" and doc["run_result"] is None, doc
        assert doc["error"]["code"] == "overloaded" and doc["error"]["retryable"] is True
    elif family == "openai":
        assert doc["error"]["type"] == "rate_limit_error" and "status" not in doc, doc
        assert doc["error"]["code"] == "overloaded"
    else:
        assert doc["error"]["retryable"] is True and "status" not in doc, doc


def refused_answer(service: ServiceThread, request: bytes) -> bytes:
    """What a connection beyond the bound reads after sending ``request`` whole (in one
    ``sendall``, as a client writes a request before it reads the answer)."""
    extra = socket.create_connection(address(service), timeout=10.0)
    try:
        extra.sendall(request)
        answer = b""
        for _ in range(100):  # bounded: the answer is small and comes at once
            chunk = extra.recv(65536)
            if not chunk:
                break
            answer += chunk
        return answer
    finally:
        extra.close()


def test_a_connection_beyond_the_bound_reads_its_429_while_it_still_sends_its_body() -> None:
    """The refusal was written and the socket closed with the client's body unread: the
    kernel reset the connection, and a client still writing its body failed with a reset or
    a broken pipe, never reading the 429 it retries on (it is drained now, then closed)."""
    limits = ConnectionLimits(header_timeout_s=60.0, body_timeout_s=60.0, max_connections=2)
    body = json.dumps({"endpoint": "echo", "payload": "x" * (16 << 20)}).encode()
    head = b"POST /v1/actions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
    with served(limits) as service:
        held = connect(service, 2, b"")
        try:
            time.sleep(0.2)  # the service has accepted them
            for _ in range(3):
                request = head + b"Content-Length: %d\r\n\r\n" % len(body) + body
                answer = refused_answer(service, request)
                assert answer.startswith(b"HTTP/1.1 429"), answer[:200]
                doc = json.loads(answer.split(b"\r\n\r\n", 1)[1])
                assert doc["error"]["code"] == "overloaded", doc
        finally:
            for s in held:
                s.close()


@pytest.mark.parametrize("body_bytes", [0, 70_000, 1 << 20])
def test_a_refusals_shape_follows_its_path_whatever_comes_after_the_headers(
    body_bytes: int,
) -> None:
    """The refusal kept the last 64 KiB it read to find the request's path: when the headers
    and more than 64 KiB of body came in one read, the request line was dropped and a
    ``/run_code`` client got Tangram's document, with no ``status`` to read."""
    limits = ConnectionLimits(header_timeout_s=60.0, body_timeout_s=60.0, max_connections=2)
    body = b"{" + b" " * max(0, body_bytes - 2) + b"}" if body_bytes else b""
    head = b"POST /run_code HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
    with served(limits) as service:
        held = connect(service, 2, b"")
        try:
            time.sleep(0.2)  # the service has accepted them
            request = head + b"Content-Length: %d\r\n\r\n" % len(body) + body
            answer = refused_answer(service, request)
        finally:
            for s in held:
                s.close()
    assert answer.startswith(b"HTTP/1.1 429"), answer[:200]
    doc = json.loads(answer.split(b"\r\n\r\n", 1)[1])
    assert doc["status"] == "SandboxError" and doc["run_result"] is None, doc
    assert doc["error"]["code"] == "overloaded", doc


@pytest.mark.parametrize(
    "bad_head",
    [
        b"POST /v1/actions HTTP/1.1\r\nHost: x\r\nBad Header\r\nContent-Length: %d\r\n\r\n",
        b"POST /v1/actions HTTP/1.1\r\nHost: x\r\nContent-Length: %d\r\nContent-Length: 5\r\n\r\n",
    ],
    ids=["a header without a colon", "two lengths"],
)
def test_a_malformed_request_still_sending_its_body_reads_its_400(bad_head: bytes) -> None:
    """aiohttp closed a malformed request's connection with its body unread: the kernel reset
    it, and the client, still writing the body, failed with a reset or a broken pipe, never
    reading the 400 naming what was wrong. The drained connections are forgotten too: with a
    bound of 2, the service still serves after three of them."""
    limits = ConnectionLimits(header_timeout_s=60.0, body_timeout_s=60.0, max_connections=2)
    body = b"x" * (16 << 20)
    with served(limits) as service:
        for _ in range(3):
            s = socket.create_connection(address(service), timeout=10.0)
            try:
                s.sendall(bad_head % len(body) + body)
                answer = b""
                for _ in range(100):  # bounded: the answer is small and comes at once
                    chunk = s.recv(65536)
                    if not chunk:
                        break
                    answer += chunk
            finally:
                s.close()
            assert answer.startswith(b"HTTP/1.0 400") or answer.startswith(b"HTTP/1.1 400"), answer[
                :200
            ]
            doc = json.loads(answer.split(b"\r\n\r\n", 1)[1])
            assert doc["error"]["code"] == "bad_request", doc
        end = time.monotonic() + DEADLINE_S
        while time.monotonic() < end:  # the drained ones are gone once their closes are seen
            try:
                served_meanwhile(service)
                break
            except Exception:  # noqa: BLE001 - refused while the closes are processed
                time.sleep(0.1)
        served_meanwhile(service)


@pytest.mark.parametrize("path", [b"/v1/actions", b"/run_code", b"/v1/completions"])
@pytest.mark.parametrize(
    "bad_chunk",
    [b"zz\r\nabc\r\n", b"3\r\nabcdef\r\n0\r\n\r\n"],
    ids=["a chunk size not hexadecimal", "a chunk longer than its size"],
)
@pytest.mark.parametrize("pause_s", [0.0, 0.3], ids=["in one write", "after a pause"])
def test_a_malformed_chunked_body_is_a_400_at_once_and_the_only_answer(
    path: bytes, bad_chunk: bytes, pause_s: float
) -> None:
    """aiohttp's parser, failing on a body that came after the handler began reading it,
    dropped the body's reader without a word: the handler waited out the body time-out and
    answered 408 blaming a slow client, and aiohttp's own 400 followed on the same
    connection, a second answer to one request. It is one 400 at once now, naming the
    broken framing, in the route's shape."""
    limits = ConnectionLimits(header_timeout_s=60.0, body_timeout_s=30.0, max_connections=64)
    head = b"POST " + path + b" HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
    head += b'Transfer-Encoding: chunked\r\n\r\n5\r\n{"a":\r\n'
    with served(limits) as service:
        s = socket.create_connection(address(service), timeout=10.0)
        try:
            started = time.monotonic()
            if pause_s:
                s.sendall(head)
                time.sleep(pause_s)  # the handler reads the body by now
                s.sendall(bad_chunk)
            else:
                s.sendall(head + bad_chunk)
            answer = b""
            for _ in range(100):  # bounded: the answer is small and comes at once
                chunk = s.recv(65536)
                if not chunk:
                    break
                answer += chunk
            took = time.monotonic() - started
        finally:
            s.close()
        served_meanwhile(service)
    assert answer.count(b"HTTP/1.") == 1, answer  # one answer, then the connection closes
    assert answer.split(b" ", 2)[1] == b"400", answer[:300]
    assert took < 10.0, took
    doc = json.loads(answer.split(b"\r\n\r\n", 1)[1])
    assert "chunk" in json.dumps(doc).lower() or "LF" in json.dumps(doc), doc


def test_a_malformed_request_is_one_log_line_not_a_stack_trace(
    caplog: pytest.LogCaptureFixture,
) -> None:
    """aiohttp logged each malformed request at ERROR with its traceback (some 15 lines): any
    client could fill the service's log with them. It is one INFO line, as a client's hang-up
    is."""
    with served(LIMITS) as service, caplog.at_level(logging.DEBUG):
        for _ in range(3):
            s = socket.create_connection(address(service), timeout=10.0)
            try:
                s.sendall(b"POST /v1/actions HTTP/1.1\r\nHost: x\r\nBad Header\r\n\r\n")
                assert s.recv(65536).split(b" ", 2)[1] == b"400"
            finally:
                s.close()
        served_meanwhile(service)
    traced = [r for r in caplog.records if r.exc_info or r.levelno >= logging.WARNING]
    assert not traced, [(r.name, r.levelname, r.getMessage()) for r in traced]
    lines = [r for r in caplog.records if "malformed request" in r.getMessage()]
    assert len(lines) == 3 and all(r.levelno == logging.INFO for r in lines), lines
    assert "Invalid header token" in lines[0].getMessage()


def test_the_service_loads_with_an_aiohttp_without_the_private_error_record(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """``connections`` imported aiohttp's private ``_ErrInfo`` by name (cbb849a): an aiohttp
    without it (``aiohttp>=3.9`` is all the project asks) failed the service's import. It
    is looked up, and without it a broken body is left to aiohttp, as before."""
    import importlib

    from aiohttp import web_protocol

    import tangram.exec.service.connections as connections

    monkeypatch.delattr(web_protocol, "_ErrInfo")
    try:
        reloaded = importlib.reload(connections)
        assert reloaded._ERR_INFO is None
    finally:
        monkeypatch.undo()
        importlib.reload(connections)
    assert connections._ERR_INFO is web_protocol._ErrInfo


def test_connections_refused_beyond_the_bound_are_counted_in_the_metrics() -> None:
    """An operator saw no refusal of ``--max-connections`` anywhere in ``/metrics``."""
    limits = ConnectionLimits(header_timeout_s=60.0, body_timeout_s=60.0, max_connections=2)
    line = 'tangram_actions_refused_total{reason="connections"} '
    with served(limits) as service:
        held = connect(service, 2, b"")
        try:
            time.sleep(0.2)  # the service has accepted them
            for _ in range(3):
                answer = refused_answer(service, b"GET /healthz HTTP/1.1\r\nHost: x\r\n\r\n")
                assert answer.startswith(b"HTTP/1.1 429"), answer[:200]
        finally:
            for s in held:
                s.close()
        time.sleep(0.2)  # (the held connections closed: the scrape gets a place)
        text = httpx.get(f"{service.url}/metrics", timeout=30).text
    assert line + "3.0" in text, [t for t in text.splitlines() if "refused" in t]


@pytest.mark.parametrize(
    ("request_line", "family"),
    [
        (b"POST /run_code HTTP/1.1", "sandbox"),
        (b"POST /v1/completions HTTP/1.1", "openai"),
        (b"POST /get_reward?x=1 HTTP/1.1", "openai"),
        (b"POST /v1/actions HTTP/1.1", "tangram"),
        (b"POST http://x/run_code HTTP/1.1", "sandbox"),
        (b"POST http://x:8080/v1/completions HTTP/1.1", "openai"),
    ],
)
@pytest.mark.parametrize("after_one", [False, True], ids=["first", "after a good request"])
def test_a_malformed_request_is_answered_in_its_routes_shape(
    request_line: bytes, family: str, after_one: bool
) -> None:
    """A request aiohttp could not parse (a header without a colon) never reaches the route,
    and its 400 was Tangram's error document on every path: a SandboxFusion client read no
    ``status`` from ``/run_code``'s, an OpenAI client no ``type`` from the OpenAI routes'."""
    limits = ConnectionLimits(header_timeout_s=60.0, body_timeout_s=60.0, max_connections=8)
    good = b"GET /healthz HTTP/1.1\r\nHost: x\r\n\r\n" if after_one else b""
    with served(limits) as service:
        s = socket.create_connection(address(service), timeout=10.0)
        try:
            answer = b""
            if after_one:  # (answered before the bad one is sent: one read holding both
                # failed as a whole in aiohttp's parser, the good one unanswered)
                s.sendall(good)
                while not answer.endswith(b"}"):
                    answer += s.recv(65536)
            s.sendall(request_line + b"\r\nHost: x\r\nBad Header\r\nContent-Length: 2\r\n\r\n{}")
            for _ in range(100):  # bounded: the answers are small and come at once
                chunk = s.recv(65536)
                if not chunk:
                    break
                answer += chunk
        finally:
            s.close()
    if after_one:
        assert answer.startswith(b"HTTP/1.1 200"), answer[:200]
        answer = answer[answer.index(b"HTTP/1.", 1) :]
    assert answer.startswith((b"HTTP/1.0 400", b"HTTP/1.1 400")), answer[:200]
    doc = json.loads(answer.split(b"\r\n\r\n", 1)[1])
    assert "header" in doc["error"]["message"].lower(), doc
    if family == "sandbox":
        assert doc["status"] == "SandboxError" and doc["run_result"] is None, doc
        assert doc["error"]["code"] == "bad_request", doc
    elif family == "openai":
        assert doc["error"]["type"] == "invalid_request_error" and "status" not in doc, doc
        assert doc["error"]["code"] == "bad_request", doc
    else:
        assert doc["error"]["code"] == "bad_request" and "status" not in doc, doc
        assert "type" not in doc["error"], doc


def closed_for_good(s: socket.socket, deadline_s: float) -> bool:
    """Whether the service closed ``s`` whole (not only its sending side, as a drain does):
    bytes sent to a closed socket are answered with a reset."""
    s.settimeout(0.2)
    end = time.monotonic() + deadline_s
    while time.monotonic() < end:
        try:
            s.sendall(b"x" * 1024)
            while s.recv(65536):  # (the answer, then the drain's end of sending)
                pass
        except (ConnectionResetError, BrokenPipeError):
            return True
        except TimeoutError:
            pass
        time.sleep(0.05)
    return False


def test_refused_and_draining_connections_are_closed_at_shutdown() -> None:
    """A connection refused beyond the bound (and one answered 400, draining its body) was
    left open when the service stopped: its drain's 5-s timer never ran once the loop had
    stopped, and the socket stayed open until the garbage collector found it."""
    import gc

    limits = ConnectionLimits(header_timeout_s=60.0, body_timeout_s=60.0, max_connections=2)
    gc.disable()  # (the collector would close the forgotten sockets at some later time)
    try:
        with served(limits) as service:
            bad = socket.create_connection(address(service), timeout=10.0)
            bad.sendall(b"POST /v1/actions HTTP/1.1\r\nBad Header\r\nContent-Length: 900\r\n\r\n")
            held = connect(service, 1, b"")
            time.sleep(0.3)  # the service has accepted them
            refused = socket.create_connection(address(service), timeout=10.0)
            refused.sendall(HEAD)
            for s in (bad, refused):  # each has its answer, the rest of its body pending
                s.settimeout(10.0)
                assert s.recv(65536).startswith((b"HTTP/1.0 4", b"HTTP/1.1 4"))
            service.stop()
            started = time.monotonic()
            assert closed_for_good(bad, 2.0), "the draining connection is still open"
            assert closed_for_good(refused, 2.0), "the refused connection is still open"
            assert time.monotonic() - started < 3.0
            for s in (bad, refused, *held):
                s.close()
    finally:
        gc.enable()


def test_a_slow_upload_answered_before_its_body_reads_its_answer() -> None:
    """aiohttp, answering before it read a body (a wrong token's 401, a 413, a tenant's
    429 on the OpenAI routes), read and dropped the rest for 2 s only, then closed with the
    rest unread: the kernel reset the connection, and a client still uploading (a large body
    at a modest rate) failed with a reset, never reading the answer. The rest is drained for
    as long as a body may take to arrive (--body-timeout-s), at most 64 MiB."""
    limits = ConnectionLimits(header_timeout_s=60.0, body_timeout_s=60.0, max_connections=8)

    def make() -> Runtime:
        return Runtime(CLUSTER, RuntimeConfig(max_pending=100), api=ApiExecutor({"echo": echo}))

    chunk, count = b" " * 65536, 40  # 2.5 MiB in 4 s
    opts = ServeOptions(port=0, limits=limits, token="secret")
    with ServiceThread(make, opts) as service:
        s = socket.create_connection(address(service), timeout=10.0)
        try:
            head = (
                b"POST /v1/actions HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer wrong\r\n"
                b"Content-Type: application/json\r\nContent-Length: %d\r\n\r\n"
            )
            s.sendall(head % (len(chunk) * count))
            for _ in range(count):
                s.sendall(chunk)
                time.sleep(0.1)
            answer = b""
            for _ in range(100):  # bounded: the answer is small
                part = s.recv(65536)
                if not part:
                    break
                answer += part
        finally:
            s.close()
        assert answer.startswith(b"HTTP/1.1 401"), answer[:200]
        assert b'"unauthorized"' in answer, answer


def test_an_answer_before_its_body_arrived_says_the_connection_closes() -> None:
    """Such a connection ends after its answer (the rest of its body drained), but the
    answer said keep-alive, so a client sent its next request to be dropped unanswered."""
    limits = ConnectionLimits(header_timeout_s=60.0, body_timeout_s=60.0, max_connections=8)

    def make() -> Runtime:
        return Runtime(CLUSTER, RuntimeConfig(max_pending=100), api=ApiExecutor({"echo": echo}))

    with ServiceThread(make, ServeOptions(port=0, limits=limits, token="secret")) as service:
        s = socket.create_connection(address(service), timeout=10.0)
        try:
            s.sendall(HEAD.replace(b"Host: x\r\n", b"Host: x\r\nAuthorization: Bearer no\r\n"))
            answer = s.recv(65536)
        finally:
            s.close()
    head = answer.split(b"\r\n\r\n", 1)[0].lower()
    assert head.startswith(b"http/1.1 401") and b"connection: close" in head, answer


@pytest.mark.parametrize("each", [0, -1, True, 1.5])
def test_the_per_client_bound_must_be_a_positive_integer(each: object) -> None:
    with pytest.raises(ValueError, match="max_connections_per_client"):
        ConnectionLimits(max_connections_per_client=each)  # type: ignore[arg-type]


def test_tangram_serve_takes_a_per_client_bound_off_by_default() -> None:
    from tangram.cli import build_parser
    from tangram.exec.service_cli import serve_options

    for given, each in (([], None), (["--max-connections-per-client", "4"], 4)):
        args = build_parser().parse_args(["serve", *given])
        args.clients = {}  # (resolved from --clients-file when the service starts)
        assert serve_options(args, None).limits.max_connections_per_client == each


def test_one_client_cannot_take_every_connection() -> None:
    """There was no bound per client: one client (one peer address) could hold all of
    --max-connections, and every other client was refused. With
    --max-connections-per-client, one more of its own is refused (429, in its route's
    shape), while another client is still served."""
    limits = ConnectionLimits(
        header_timeout_s=60.0, body_timeout_s=60.0, max_connections=16, max_connections_per_client=2
    )
    with served(limits) as service:
        held = connect(service, 2, b"")
        try:
            time.sleep(0.2)  # the service has accepted them
            answer = refused_answer(
                service, b"POST /run_code HTTP/1.1\r\nHost: x\r\nContent-Length: 0\r\n\r\n"
            )
            assert answer.startswith(b"HTTP/1.1 429") and b"Retry-After: 1" in answer, answer
            doc = json.loads(answer.split(b"\r\n\r\n", 1)[1])
            assert doc["status"] == "SandboxError" and doc["error"]["code"] == "overloaded", doc
            assert "--max-connections-per-client" in doc["error"]["message"], doc
            other = socket.create_connection(
                address(service), timeout=10.0, source_address=("127.0.0.2", 0)
            )
            with other:  # another client (address) is served
                other.sendall(b"GET /healthz HTTP/1.1\r\nHost: x\r\n\r\n")
                assert other.recv(65536).startswith(b"HTTP/1.1 200")
        finally:
            for s in held:
                s.close()
        end = time.monotonic() + DEADLINE_S  # its closed ones are forgotten: served again
        while True:
            try:
                served_meanwhile(service)
                break
            except Exception:  # noqa: BLE001 - refused until the closes are seen
                if time.monotonic() > end:
                    raise
                time.sleep(0.1)
        metrics = httpx.get(service.url + "/metrics", timeout=10).text
        assert 'tangram_actions_refused_total{reason="connections"} 1' in metrics


def test_a_refused_connection_may_send_its_body_for_the_body_time_out() -> None:
    """A connection refused beyond the bound was drained for 5 s (hard-coded), whatever
    --body-timeout-s said: a client uploading a large body at a modest rate was reset after
    5 s and never read its 429, though the service would have waited 60 s for that body.
    It is drained for the body time-out now. (The check only fails if the service closes it
    too early: a loaded machine closes it later, never sooner.)"""
    limits = ConnectionLimits(header_timeout_s=60.0, body_timeout_s=60.0, max_connections=1)
    with served(limits) as service:
        held = connect(service, 1, b"")
        time.sleep(0.2)  # the service has accepted the held one
        extra = socket.create_connection(address(service), timeout=10.0)
        try:
            extra.sendall(HEAD.replace(b"Content-Length: 100", b"Content-Length: 100000"))
            answer = extra.recv(65536)
            assert answer.startswith(b"HTTP/1.1 429"), answer[:200]
            end = time.monotonic() + 7.0  # past the old 5 s, well within the 60 s
            sent = 0
            while time.monotonic() < end and sent < 90_000:  # bounded in time and bytes
                extra.sendall(b"x" * 1000)  # raises once the service closed it (a reset)
                sent += 1000
                time.sleep(0.25)
        finally:
            extra.close()
            for s in held:
                s.close()


def request_on(s: socket.socket, request: bytes) -> bytes:
    """Send ``request`` on ``s`` and read one answer (its head and a Content-Length body)."""
    s.sendall(request)
    answer = b""
    for _ in range(100):  # bounded: the answers are small
        if b"\r\n\r\n" in answer:
            head, body = answer.split(b"\r\n\r\n", 1)
            length = [ln for ln in head.split(b"\r\n") if ln.lower().startswith(b"content-length:")]
            if length and len(body) >= int(length[0].split(b":")[1]):
                break
        chunk = s.recv(65536)
        if not chunk:
            break
        answer += chunk
    return answer


def tenant_get(token: str, path: str = "/v1/trajectories") -> bytes:
    return f"GET {path} HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer {token}\r\n\r\n".encode()


def test_one_tenant_cannot_take_every_connection_from_many_addresses() -> None:
    """There was no bound per tenant: --max-connections-per-client counts peer addresses,
    so one tenant's workers on many hosts could hold all of --max-connections (keep-alive
    connections, long polls) and every other tenant was refused. With
    --tenant-max-connections, its request on one connection more is refused (429, in its
    route's shape, the connection closed), from any address, while its own connections and
    other tenants are served; counted under ``reason="tenant_connections"``."""
    limits = ConnectionLimits(
        header_timeout_s=60.0, body_timeout_s=60.0, max_connections=64, tenant_max_connections=2
    )

    def make() -> Runtime:
        return Runtime(CLUSTER, RuntimeConfig(max_pending=100), api=ApiExecutor({"echo": echo}))

    opts = ServeOptions(port=0, limits=limits, token="op", clients={"alice": "ta", "bob": "tb"})
    with ServiceThread(make, opts) as service:
        held = [
            socket.create_connection(address(service), timeout=10.0, source_address=(ip, 0))
            for ip in ("127.0.0.1", "127.0.0.2")
        ]
        try:
            for s in held:  # alice's two, from two addresses
                assert request_on(s, tenant_get("ta")).startswith(b"HTTP/1.1 200")
            for ip, path in (("127.0.0.3", "/v1/trajectories"), ("127.0.0.4", "/run_code")):
                with socket.create_connection(
                    address(service), timeout=10.0, source_address=(ip, 0)
                ) as third:
                    answer = request_on(third, tenant_get("ta", path))
                    head, body = answer.split(b"\r\n\r\n", 1)
                    assert head.startswith(b"HTTP/1.1 429"), answer[:300]
                    assert b"Connection: close" in head, head
                    doc = json.loads(body)
                    assert doc["error"]["code"] == "overloaded", doc
                    assert "--tenant-max-connections" in doc["error"]["message"], doc
                    if path == "/run_code":
                        assert doc["status"] == "SandboxError", doc
                    assert third.recv(65536) == b"", "the refused connection stays open"
            for s in held:  # its own connections still serve it
                assert request_on(s, tenant_get("ta")).startswith(b"HTTP/1.1 200")
            with socket.create_connection(address(service), timeout=10.0) as other:
                for _ in range(3):  # another tenant, and the operator, are served
                    assert request_on(other, tenant_get("tb")).startswith(b"HTTP/1.1 200")
                    assert request_on(other, tenant_get("op")).startswith(b"HTTP/1.1 200")
        finally:
            for s in held:
                s.close()
        end = time.monotonic() + DEADLINE_S  # its closed ones are forgotten: served again
        while True:
            with socket.create_connection(address(service), timeout=10.0) as again:
                if request_on(again, tenant_get("ta")).startswith(b"HTTP/1.1 200"):
                    break
            assert time.monotonic() < end, "alice's closed connections were never forgotten"
            time.sleep(0.1)
        metrics = httpx.get(
            service.url + "/metrics", timeout=10, headers={"Authorization": "Bearer op"}
        ).text
        assert 'tangram_actions_refused_total{reason="tenant_connections"} 2.0' in metrics, [
            t for t in metrics.splitlines() if "refused_total" in t
        ]


@pytest.mark.parametrize("each", [0, -1, True, 1.5])
def test_the_per_tenant_bound_must_be_a_positive_integer(each: object) -> None:
    with pytest.raises(ValueError, match="tenant_max_connections"):
        ConnectionLimits(tenant_max_connections=each)  # type: ignore[arg-type]


def test_tangram_serve_takes_a_per_tenant_connection_bound_off_by_default() -> None:
    from tangram.cli import build_parser
    from tangram.exec.service_cli import serve_options

    for given, each in (([], None), (["--tenant-max-connections", "4"], 4)):
        args = build_parser().parse_args(["serve", *given])
        args.clients = {}  # (resolved from --clients-file when the service starts)
        assert serve_options(args, None).limits.tenant_max_connections == each


@pytest.mark.parametrize(
    ("path", "family"),
    [("/v1/actions", "tangram"), ("/run_code", "sandbox"), ("/v1/completions", "openai")],
)
def test_an_expectation_the_service_cannot_meet_is_a_417_in_its_routes_shape(
    path: str, family: str
) -> None:
    """An ``Expect`` header other than ``100-continue`` was answered by aiohttp before any
    middleware, as the plain text "Unknown Expect: ...": the one refusal that was not the
    error document (nor SandboxFusion's or OpenAI's on their routes)."""
    limits = ConnectionLimits(header_timeout_s=60.0, body_timeout_s=60.0, max_connections=16)
    body = b'{"endpoint": "echo", "payload": 1}'
    request = (
        f"POST {path} HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
        f"Expect: 200-ok\r\nContent-Length: {len(body)}\r\n\r\n"
    ).encode() + body
    with served(limits) as service, socket.create_connection(address(service), 10.0) as s:
        answer = request_on(s, request)
        head, doc_bytes = answer.split(b"\r\n\r\n", 1)
        assert head.startswith(b"HTTP/1.1 417"), answer[:300]
        assert b"Content-Type: application/json" in head, head
        doc = json.loads(doc_bytes)
        assert "200-ok" in json.dumps(doc), doc
        if family == "sandbox":
            assert doc["status"] == "SandboxError" and doc["error"]["code"] == "http_417", doc
        elif family == "openai":
            assert doc["error"]["type"] == "invalid_request_error", doc
        else:
            assert doc["error"]["code"] == "http_417", doc
        with socket.create_connection(address(service), 10.0) as ok:  # (100-continue still)
            ok.sendall(request.replace(b"200-ok", b"100-continue"))
            answer = ok.recv(65536)
            assert answer.startswith(b"HTTP/1.1 100 Continue"), answer[:300]


def test_refusals_past_the_bound_in_number_get_the_short_drain() -> None:
    """Refused connections are not bounded in number: a flood of them trickling their
    bodies would each hold a socket for the body time-out. Only as many as
    --max-connections drain that long; one more is drained for 5 s and closed. (Checked
    by its closing well before the 60-s body time-out; a loaded machine closes it later,
    within the bound checked.)"""
    limits = ConnectionLimits(header_timeout_s=60.0, body_timeout_s=60.0, max_connections=1)
    head = HEAD.replace(b"Content-Length: 100", b"Content-Length: 100000")
    with served(limits) as service:
        held = connect(service, 1, b"")
        time.sleep(0.2)  # the service has accepted the held one
        refused = []
        try:
            for _ in range(2):
                s = socket.create_connection(address(service), timeout=10.0)
                refused.append(s)
                s.sendall(head)
                assert s.recv(65536).startswith(b"HTTP/1.1 429")
            start = time.monotonic()
            closed = None
            while closed is None and time.monotonic() - start < 40.0:  # bounded
                for i, s in enumerate(refused):
                    try:
                        s.sendall(b"x" * 100)
                    except OSError:  # (reset: the service closed it)
                        closed = i
                        break
                time.sleep(0.25)
            assert closed == 1, "the second refusal was drained for the body time-out too"
        finally:
            for s in refused + held:
                s.close()


@pytest.mark.parametrize(
    ("token", "status"), [("wrong", b"401"), ("ta", b"100 Continue")], ids=["wrong", "right"]
)
def test_a_wrong_token_asking_100_continue_is_refused_before_its_body(
    token: str, status: bytes
) -> None:
    """A client sending ``Expect: 100-continue`` waits before its body so that a refusal
    comes first; it was told to continue whatever its token, uploaded its body (up to
    64 MiB), and only then read its 401. A right token is still told to continue."""
    limits = ConnectionLimits(header_timeout_s=60.0, body_timeout_s=60.0, max_connections=16)

    def make() -> Runtime:
        return Runtime(CLUSTER, RuntimeConfig(max_pending=100), api=ApiExecutor({"echo": echo}))

    request = (
        "POST /v1/actions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
        f"Authorization: Bearer {token}\r\nExpect: 100-continue\r\n"
        "Content-Length: 1000000\r\n\r\n"
    ).encode()
    opts = ServeOptions(port=0, limits=limits, clients={"alice": "ta"})
    with (
        ServiceThread(make, opts) as service,
        socket.create_connection(address(service), timeout=10.0) as s,
    ):
        s.sendall(request)  # (the body is never sent: the client waits for the 100)
        answer = s.recv(65536)
        assert answer.startswith(b"HTTP/1.1 " + status), answer[:300]
        if status == b"401":
            doc = json.loads(answer.split(b"\r\n\r\n", 1)[1])
            assert doc["error"]["code"] == "unauthorized", doc


def test_a_client_that_never_reads_its_answer_is_cut_off(
    caplog: pytest.LogCaptureFixture,
) -> None:
    """An answer waits in its connection's buffer until the client reads it, and aiohttp
    sets no limit: a client that asked for a large result and never read it held its
    connection and the answer's memory for good (a thousand such, a thousand results).
    One that reads nothing of its answer for --body-timeout-s is cut off now, and the
    service goes on serving."""
    big = 16 << 20
    cluster = ClusterSpec(name="big", apis=(ApiEndpointSpec("big", concurrency=2),))

    async def answer(n: int) -> str:
        return "x" * n

    def make() -> Runtime:
        return Runtime(cluster, RuntimeConfig(), api=ApiExecutor({"big": answer}))

    limits = ConnectionLimits(header_timeout_s=60.0, body_timeout_s=1.0, max_connections=16)
    caplog.set_level(logging.INFO, logger="tangram.exec.service.connections")
    with ServiceThread(make, ServeOptions(port=0, limits=limits)) as service:
        with Client(service.url, retries=0) as c:
            aid = c.submit(endpoint="big", payload=big)
            assert c.result(aid, wait_s=30) is not None
        s = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        s.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
        s.settimeout(10.0)
        s.connect(address(service))
        with s:
            s.sendall(f"GET /v1/actions/{aid} HTTP/1.1\r\nHost: x\r\n\r\n".encode())
            end = time.monotonic() + DEADLINE_S  # bounded: the cut is logged
            while "read nothing of its answer" not in caplog.text and time.monotonic() < end:
                time.sleep(0.1)
            got = 0
            with contextlib.suppress(OSError):
                for _ in range(100_000):  # bounded: what the service sent before the cut
                    chunk = s.recv(1 << 20)
                    if not chunk:
                        break
                    got += len(chunk)
            assert got < big, "the whole answer came: the connection was not cut"
        served_meanwhile_api(service)


def served_meanwhile_api(service: ServiceThread) -> None:
    r = httpx.get(f"{service.url}/v1/status", timeout=30)
    assert r.status_code == 200, r.text[:300]


def test_a_client_that_never_reads_the_trace_is_cut_off(
    caplog: pytest.LogCaptureFixture, monkeypatch: pytest.MonkeyPatch
) -> None:
    """``GET /v1/trace`` streams the trace's copy on disk in 1-MiB chunks, each write waiting
    for the client with no time limit: one that never read held its connection and the copy
    for good. One that takes nothing of a chunk for --body-timeout-s is cut off now."""
    big = 16 << 20
    limits = ConnectionLimits(header_timeout_s=60.0, body_timeout_s=1.0, max_connections=16)
    caplog.set_level(logging.INFO, logger="tangram.exec.service.app")
    with served(limits) as service:
        assert service.runtime is not None

        def fake_trace(path: Any) -> Any:
            Path(path).write_bytes(b"x" * big)
            return Path(path)

        monkeypatch.setattr(service.runtime, "write_trace", fake_trace)
        s = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        s.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
        s.settimeout(10.0)
        s.connect(address(service))
        with s:
            s.sendall(b"GET /v1/trace HTTP/1.1\r\nHost: x\r\n\r\n")
            end = time.monotonic() + DEADLINE_S  # bounded: the cut is logged
            while "read nothing of its answer" not in caplog.text and time.monotonic() < end:
                time.sleep(0.1)
            got = 0
            with contextlib.suppress(OSError):
                for _ in range(100_000):  # bounded: what the service sent before the cut
                    chunk = s.recv(1 << 20)
                    if not chunk:
                        break
                    got += len(chunk)
            assert got < big, "the whole trace came: the connection was not cut"
        served_meanwhile_api(service)
