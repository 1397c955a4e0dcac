"""Counterexamples of a second probe of the service (auth, request limits, labels, paths,
odd inputs): each test once failed. The CPU executor runs on a stand-in for AOE (no Docker)."""

from __future__ import annotations

from collections.abc import Iterator

import httpx
import pytest

from tangram.exec.service import ServeOptions, ServiceThread
from tests.live.test_service_ids import fake_cpu_runtime

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
