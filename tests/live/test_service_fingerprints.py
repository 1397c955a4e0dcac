"""An action's fingerprint (what makes a resend of its id the same action) reads JSON numbers
as numbers: ``1`` and ``1.0`` are the same ``t1_s``, the same payload value, so a resend from a
client library that writes numbers differently is the first submission, not a 409. A boolean
is not a number here: ``true`` and ``1`` stay different actions."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import httpx
import pytest

from tangram.core.resources import ApiEndpointSpec, ClusterSpec
from tangram.exec.runtime import ApiExecutor, Runtime, RuntimeConfig
from tangram.exec.runtime.api import echo
from tangram.exec.runtime.records import ActionSpec, ApiWork, GpuWork
from tangram.exec.service import ServeOptions, ServiceThread


@pytest.fixture(scope="module")
def svc() -> Iterator[ServiceThread]:
    cluster = ClusterSpec(name="fingerprints", apis=(ApiEndpointSpec("echo", concurrency=8),))

    def make() -> Runtime:
        return Runtime(cluster, RuntimeConfig(max_pending=50), api=ApiExecutor({"echo": echo}))

    with ServiceThread(make, ServeOptions(port=0)) as service:
        yield service


def submit(url: str, body: dict[str, Any]) -> httpx.Response:
    return httpx.post(f"{url}/v1/actions", json=body, timeout=30)


@pytest.mark.parametrize(
    ("first", "again"),
    [
        ({"t1_s": 1}, {"t1_s": 1.0}),
        ({"timeout_s": 30.0}, {"timeout_s": 30}),
        ({"payload": {"n": 2, "xs": [1, 2.5]}}, {"payload": {"n": 2.0, "xs": [1.0, 2.5]}}),
        ({"payload": 0}, {"payload": -0.0}),
    ],
    ids=["t1_s", "timeout_s", "payload", "zero"],
)
def test_a_resend_with_equal_numbers_written_otherwise_is_the_same_action(
    svc: ServiceThread, first: dict[str, Any], again: dict[str, Any], request: Any
) -> None:
    action = f"fp-{request.node.callspec.id}"
    base = {"id": action, "endpoint": "echo", "payload": None}
    r1 = submit(svc.url, {**base, **first})
    assert r1.status_code in (200, 202), r1.text[:300]
    r2 = submit(svc.url, {**base, **again})
    assert r2.status_code in (200, 202), r2.text[:300]  # was 409 conflict
    assert r2.json()["id"] == action


def test_a_boolean_is_not_the_number_one(svc: ServiceThread) -> None:
    base = {"id": "fp-bool", "endpoint": "echo"}
    assert submit(svc.url, {**base, "payload": {"x": 1}}).status_code in (200, 202)
    r = submit(svc.url, {**base, "payload": {"x": True}})
    assert r.status_code == 409, r.text[:300]


def test_equal_numbers_fingerprint_equal_and_distinct_values_do_not() -> None:
    def fp(**kw: Any) -> str:
        return ActionSpec(ApiWork("echo", kw.pop("payload", None)), **kw).fingerprint()

    assert fp(t1_s=2) == fp(t1_s=2.0)
    gpu_spec = [ActionSpec(GpuWork("rm", None), serial_fraction=f) for f in (0, 0.0)]
    assert gpu_spec[0].fingerprint() == gpu_spec[1].fingerprint()
    assert fp(payload=[3]) == fp(payload=[3.0])
    assert fp(payload={"a": 10**30}) != fp(payload={"a": 1e30})  # (not equal as numbers)
    assert fp(payload=[1]) != fp(payload=[True]) and fp(payload=[0]) != fp(payload=[False])
    assert fp(payload=[2**53 + 1]) != fp(payload=[float(2**53)])
    gpu = GpuWork("rm", {"x": [1, 2]}).identity()
    assert gpu == GpuWork("rm", {"x": [1.0, 2.0]}).identity()
    # The default float fields keep the fingerprints already journaled (1.0 stays 1.0).
    assert fp() == fp(t1_s=1)
