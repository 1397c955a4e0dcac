"""A GPU or API action's ``trajectory`` label may not start with ``~``, as a trajectory to
open may not: ``~<action id>`` is the runtime's own label of work without a trajectory
(``~lost~...`` a lost node's fence). Accepted, an action labelled ``~x`` shared action ``x``'s
label: both rows were trajectory ``~x`` at position 0, and the trace, every client's actions
in it, could no longer be read (``TraceError``: two actions at one position)."""

from __future__ import annotations

import asyncio
from pathlib import Path

import httpx
import pytest

from tangram.core.resources import ApiEndpointSpec, ClusterSpec
from tangram.exec.runtime import ApiExecutor, Runtime, RuntimeConfig
from tangram.exec.runtime.api import echo
from tangram.exec.runtime.errors import BadRequest
from tangram.exec.runtime.records import ActionSpec, ApiWork
from tangram.exec.service import ServeOptions, ServiceThread
from tangram.trace import load_trace

CLUSTER = ClusterSpec(name="reserved", apis=(ApiEndpointSpec("echo", concurrency=8),))


def make() -> Runtime:
    return Runtime(CLUSTER, RuntimeConfig(max_pending=50), api=ApiExecutor({"echo": echo}))


def test_a_label_in_the_runtimes_namespace_is_refused_naming_the_field(tmp_path: Path) -> None:
    with ServiceThread(make, ServeOptions(port=0)) as svc:
        first = {"id": "x", "endpoint": "echo", "payload": 1, "wait": 30}
        assert httpx.post(f"{svc.url}/v1/actions", json=first, timeout=60).status_code == 200
        body = {"id": "y", "endpoint": "echo", "payload": 2, "trajectory": "~x", "wait": 30}
        r = httpx.post(f"{svc.url}/v1/actions", json=body, timeout=60)
        assert r.status_code == 400, r.text[:300]
        error = r.json()["error"]
        assert error["code"] == "bad_request" and "trajectory" in error["message"], error
        trace = tmp_path / "t.jsonl"
        assert svc.runtime is not None
        svc.call(lambda: svc.runtime.write_trace(trace))
    assert [row.action_id for row in load_trace(trace).rows] == ["x"]


@pytest.mark.parametrize("label", ["~x", "~lost~n0~1", "~"])
def test_an_action_spec_refuses_a_reserved_label(label: str) -> None:
    with pytest.raises(BadRequest, match="trajectory"):
        ActionSpec(ApiWork("echo", 1), trajectory=label)


def test_labels_that_only_hold_a_tilde_are_kept() -> None:
    async def main() -> str | None:
        runtime = make()
        await runtime.start()
        try:
            out = await runtime.run(ActionSpec(ApiWork("echo", 1), trajectory="a~b"))
            return out.trajectory
        finally:
            await runtime.close()

    assert asyncio.run(main()) == "a~b"
