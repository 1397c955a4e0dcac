"""An action's ``task`` and ``kind`` labels are printable text, as ids are: a NUL byte, a
newline or another control character (they went into the trace and the journal as given) is
refused with a 400 naming the field, before anything is accepted; a label with spaces or
non-ASCII letters inside is kept."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import httpx
import pytest

from tangram.core.resources import ApiEndpointSpec, ClusterSpec
from tangram.exec.runtime import ApiExecutor, Runtime, RuntimeConfig
from tangram.exec.runtime.api import echo
from tangram.exec.runtime.errors import BadRequest
from tangram.exec.runtime.records import ActionSpec, ApiWork
from tangram.exec.service import ServeOptions, ServiceThread

BAD = ["a\x00b", "line\nbreak", "tab\there", "bell\x07", "del\x7f", "c1\x85", "sep\u2028"]


@pytest.fixture(scope="module")
def svc() -> Iterator[ServiceThread]:
    cluster = ClusterSpec(name="labels", apis=(ApiEndpointSpec("echo", concurrency=8),))

    def make() -> Runtime:
        return Runtime(cluster, RuntimeConfig(max_pending=50), api=ApiExecutor({"echo": echo}))

    with ServiceThread(make, ServeOptions(port=0)) as service:
        yield service


@pytest.mark.parametrize("field", ["task", "kind"])
@pytest.mark.parametrize("label", BAD, ids=repr)
def test_a_label_with_a_control_character_is_refused_naming_the_field(
    svc: ServiceThread, field: str, label: str
) -> None:
    body: dict[str, Any] = {"endpoint": "echo", "payload": 1, field: label}
    r = httpx.post(f"{svc.url}/v1/actions", json=body, timeout=30)
    assert r.status_code == 400, r.text[:300]
    error = r.json()["error"]
    assert error["code"] == "bad_request" and field in error["message"], error
    with pytest.raises(BadRequest, match=field):
        ActionSpec(ApiWork("echo"), **{field: label})


def test_printable_labels_are_kept(svc: ServiceThread) -> None:
    body = {"endpoint": "echo", "payload": 1, "task": "math eval / é", "kind": "搜索 call"}
    r = httpx.post(f"{svc.url}/v1/actions", json={**body, "wait": 30}, timeout=60)
    assert r.status_code == 200, r.text[:300]
    assert r.json()["outcome"]["status"] == "result"
