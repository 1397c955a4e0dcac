"""Counterexamples of a second probe of the service (auth, request limits, labels, paths,
odd inputs): each test once failed. The CPU executor runs on a stand-in for AOE (no Docker)."""

from __future__ import annotations

import json
import logging
import socket
import time
import urllib.parse
from collections.abc import Iterator
from typing import Any

import httpx
import pytest

from tangram.exec.runtime.records import MAX_ID_CHARS
from tangram.exec.service import ServeOptions, ServiceThread, sandbox_fusion
from tangram.exec.service.sandbox_fusion import RunCodeSettings, parse_run_code
from tests.live.test_service_ids import FakeAoe, fake_cpu_runtime

TOKEN = "probe-token"


@pytest.fixture(scope="module")
def svc() -> Iterator[ServiceThread]:
    with ServiceThread(fake_cpu_runtime, ServeOptions(port=0, token=TOKEN)) as service:
        yield service


def auth(value: str) -> dict[str, str]:
    return {"Authorization": value}


@pytest.mark.parametrize("scheme", ["Bearer", "bearer", "BEARER", "bEaReR"])
def test_the_bearer_scheme_is_matched_in_any_case(svc: ServiceThread, scheme: str) -> None:
    """RFC 7235: the auth scheme is case-insensitive; ``bearer TOKEN`` was a 401."""
    r = httpx.get(f"{svc.url}/v1/status", headers=auth(f"{scheme} {TOKEN}"))
    assert r.status_code == 200, r.text


def test_a_wrong_token_or_scheme_is_still_refused(svc: ServiceThread) -> None:
    for value in (f"bearer {TOKEN}x", f"Basic {TOKEN}", f"Bearer{TOKEN}", "bearer", ""):
        r = httpx.get(f"{svc.url}/v1/status", headers=auth(value))
        assert r.status_code == 401, (value, r.text)


class _CountingAoe(FakeAoe):
    """A ``FakeAoe`` that counts the containers it was asked to open."""

    def __init__(self) -> None:
        super().__init__()
        self.opened = 0

    def open_trajectory(self, traj: str, memory_gb: float, *, image: str | None = None) -> Any:
        self.opened += 1
        return super().open_trajectory(traj, memory_gb, image=image)


@pytest.mark.parametrize(
    ("extra", "field"),
    [
        ({"max_units": 2**63}, "max_units"),
        ({"max_units": 10**30}, "max_units"),
    ],
)
def test_run_code_refuses_before_it_opens_a_container(extra: dict[str, Any], field: str) -> None:
    """A ``max_units`` past the trace's int64 was refused by the run's action, after the
    request's container was made (and removed): every limit is checked before any side
    effect, and the refusal is the usual 400 naming the field."""
    aoe = _CountingAoe()
    with ServiceThread(lambda: fake_cpu_runtime(aoe), ServeOptions(port=0)) as service:
        r = httpx.post(f"{service.url}/run_code", json={"code": "print(1)", **extra}, timeout=30)
    assert r.status_code == 400, r.text
    assert r.json()["status"] == "SandboxError" and field in r.json()["error"]["message"], r.text
    assert aoe.opened == 0, "a container was opened for a request refused as written"


@pytest.mark.parametrize("field", ["task", "kind"])
def test_a_label_longer_than_an_id_is_refused_naming_the_field(
    svc: ServiceThread, field: str
) -> None:
    """``task`` and ``kind`` had no bound: a megabyte label went into every trace row and
    the journal. They are bounded as ids are (128 characters); 128 is still taken."""
    headers = auth(f"Bearer {TOKEN}")
    url = f"{svc.url}/v1/actions"
    body = {"endpoint": "echo", "payload": 1, field: "x" * (MAX_ID_CHARS + 1)}
    r = httpx.post(url, json=body, headers=headers)
    assert r.status_code == 400, r.text
    message = r.json()["error"]["message"]
    assert field in message and str(MAX_ID_CHARS) in message, message
    r = httpx.post(url, json={**body, field: "x" * MAX_ID_CHARS, "wait": 5}, headers=headers)
    assert r.status_code == 200, r.text


def test_fetch_files_is_bounded_before_anything_runs() -> None:
    """``fetch_files`` had no bound: a body naming 100,000 paths ran the program, then one
    container round trip per path (hours). Past ``MAX_FETCH_PATHS`` it is a 400 naming the
    field and the bound, before any container; the bound itself is still taken."""
    aoe = _CountingAoe()
    limit = 256  # (sandbox_fusion.MAX_FETCH_PATHS, as docs/live.md has it)
    with ServiceThread(lambda: fake_cpu_runtime(aoe), ServeOptions(port=0)) as service:
        url = f"{service.url}/run_code"
        body = {"code": "print(1)", "fetch_files": [f"f{i}" for i in range(limit + 1)]}
        r = httpx.post(url, json=body, timeout=30)
        assert r.status_code == 400, r.text[:300]
        message = r.json()["error"]["message"]
        assert "fetch_files" in message and str(limit) in message, message
        assert aoe.opened == 0
        body["fetch_files"] = body["fetch_files"][:limit]
        assert parse_run_code(body, RunCodeSettings()).fetch_files == tuple(body["fetch_files"])
    assert limit == sandbox_fusion.MAX_FETCH_PATHS


def _post_half(url: str, path: str, body: bytes, missing: int) -> None:
    """Send ``body`` under a Content-Length ``missing`` bytes longer, then hang up."""
    parts = urllib.parse.urlparse(url)
    with socket.create_connection((parts.hostname, parts.port)) as s:
        head = (
            f"POST {path} HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer {TOKEN}\r\n"
            f"Content-Type: application/json\r\nContent-Length: {len(body) + missing}\r\n\r\n"
        )
        s.sendall(head.encode() + body)
        time.sleep(0.2)


@pytest.mark.parametrize("path", ["/v1/actions", "/run_code", "/v1/trajectories"])
def test_a_client_gone_mid_body_is_one_quiet_line_and_nothing_accepted(
    svc: ServiceThread, caplog: pytest.LogCaptureFixture, path: str
) -> None:
    """A client that hung up before its body arrived whole made aiohttp log a stack trace
    ("Error handling request", ERROR). It is now one INFO line naming the request and how
    much came; a body whose JSON happens to be whole is still not read as a request."""
    action = {"id": f"half{path.replace('/', '-')}", "endpoint": "echo", "payload": 1}
    caplog.set_level(logging.INFO)
    _post_half(svc.url, path, json.dumps(action).encode(), missing=10)
    deadline = time.monotonic() + 5
    while time.monotonic() < deadline and not any("went away" in r.message for r in caplog.records):
        time.sleep(0.05)
    loud = [r for r in caplog.records if r.levelno >= logging.WARNING or r.exc_info]
    assert not loud, [(r.name, r.message) for r in loud]
    gone = [r for r in caplog.records if "went away" in r.message]
    assert len(gone) == 1 and gone[0].levelno == logging.INFO, [r.message for r in gone]
    assert path in gone[0].message and "of" in gone[0].message, gone[0].message
    r = httpx.get(f"{svc.url}/v1/actions/{action['id']}", headers=auth(f"Bearer {TOKEN}"))
    assert r.status_code == 404, r.text
    r = httpx.get(f"{svc.url}/v1/trajectories", headers=auth(f"Bearer {TOKEN}"))
    assert r.json()["trajectories"] == [], r.text
