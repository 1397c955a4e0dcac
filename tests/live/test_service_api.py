"""The HTTP service without containers (API work only): back-pressure over HTTP, tokens,
malformed requests, the trace written at shutdown, the sync client."""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

import httpx
import pytest

from tangram.core.resources import ApiEndpointSpec, ClusterSpec
from tangram.exec.runtime import ApiExecutor, Runtime, RuntimeConfig
from tangram.exec.runtime.api import echo
from tangram.exec.service import (
    AsyncClient,
    Client,
    OverloadedError,
    ServeOptions,
    ServiceError,
    ServiceThread,
    check_binding,
)
from tests.live.conftest import CallLog, faulty_endpoints

CLUSTER = ClusterSpec(
    name="api-only",
    apis=(
        ApiEndpointSpec("echo", concurrency=256),
        ApiEndpointSpec("slow", concurrency=16),
        ApiEndpointSpec("counted", concurrency=3),
        ApiEndpointSpec("faulty", concurrency=4),
    ),
)


def api_service(log: CallLog, **opts: Any) -> ServiceThread:
    config = opts.pop("config", RuntimeConfig(max_pending=50))

    def make() -> Runtime:
        return Runtime(CLUSTER, config, api=ApiExecutor({"echo": echo, **faulty_endpoints(log)}))

    return ServiceThread(make, ServeOptions(port=0, **opts))


def test_over_quota_burst_is_refused_with_429_and_the_rest_complete() -> None:
    log = CallLog()
    with api_service(log) as svc:

        async def burst() -> tuple[list[str], list[OverloadedError]]:
            async with AsyncClient(svc.url, retries=0) as c:
                results = await asyncio.gather(
                    *(
                        c.submit(endpoint="counted", payload={"key": f"b{i}", "s": 0.05})
                        for i in range(200)
                    ),
                    return_exceptions=True,
                )
                accepted = [r for r in results if isinstance(r, str)]
                refused = [r for r in results if isinstance(r, OverloadedError)]
                assert len(accepted) + len(refused) == 200, results
                outs = await asyncio.gather(*(c.result(i, wait_s=60) for i in accepted))
                assert all(o is not None and o.ok for o in outs)
                return accepted, refused

        accepted, refused = asyncio.run(burst())
        # 50 fit max_pending at once; a call that ends during the burst (0.05 s, 3 at a time)
        # frees a place, so a slow or loaded machine may accept a few more. What always holds:
        # at least 50 accepted, the rest refused, every accepted one run exactly once.
        assert len(accepted) >= 50 and refused and len(accepted) + len(refused) == 200
        err = refused[0]
        assert err.status == 429 and err.code == "overloaded" and err.retryable
        assert err.retry_after_s and err.retry_after_s > 0
        assert "max_pending" in err.message
        assert log.peak <= 3, "the endpoint's concurrency quota (3) was exceeded"
        assert sum(log.calls.values()) == len(accepted)

        async def with_retries() -> list[Any]:
            async with AsyncClient(svc.url, retries=50) as c:
                return await asyncio.gather(
                    *(
                        c.run(endpoint="counted", payload={"key": f"r{i}", "s": 0.01})
                        for i in range(200)
                    )
                )

        outs = asyncio.run(with_retries())
        assert all(o.ok for o in outs)
        assert all(log.calls[f"r{i}"] == 1 for i in range(200))
        status = Client(svc.url).status()
        assert status["counters"]["refused_overloaded"] >= 150
        assert status["pending"] == 0


def test_token_is_required_when_configured() -> None:
    with api_service(CallLog(), token="s3cret") as svc:
        r = httpx.get(f"{svc.url}/v1/status")
        assert r.status_code == 401 and r.json()["error"]["code"] == "unauthorized"
        assert httpx.get(f"{svc.url}/healthz").status_code == 200
        r = httpx.get(f"{svc.url}/metrics", headers={"Authorization": "Bearer wrong"})
        assert r.status_code == 401
        with Client(svc.url, token="s3cret") as c:
            assert c.run(endpoint="echo", payload=[1, 2]).value == [1, 2]
            assert "tangram_actions_completed_total" in c.metrics()
    with pytest.raises(ValueError, match="token"):
        check_binding("0.0.0.0", None)
    check_binding("0.0.0.0", "t")
    check_binding("127.0.0.1", None)
    check_binding("::1", None)


def test_malformed_requests_get_clear_400s() -> None:
    with api_service(CallLog()) as svc:
        url = svc.url
        cases = [
            (b"{not json", "not valid JSON"),
            (b"[1, 2]", "must be a JSON object"),
            (b"", "body is empty"),
            (b'{"endpoint": "echo", "colour": 1}', "unknown field 'colour'"),
            (b'{"endpoint": 5}', "field 'endpoint'"),
            (b'{"endpoint": "echo", "max_units": "2"}', "field 'max_units'"),
            (b'{"endpoint": "echo", "wait": "soon"}', "field 'wait'"),
            (b'{"endpoint": "echo", "t1_s": -1}', "t1_s"),
            (b'{"endpoint": "nope"}', "unknown API endpoint 'nope'"),
            (b'{"command": "x", "endpoint": "echo"}', "exactly one of"),
            (b'{"endpoint": "echo", "id": "a/b"}', "must not contain '/'"),
        ]
        for body, needle in cases:
            r = httpx.post(f"{url}/v1/actions", content=body)
            assert r.status_code == 400, (body, r.text)
            assert needle in r.json()["error"]["message"], (body, r.json())
        r = httpx.get(f"{url}/v1/actions/never")
        assert r.status_code == 404 and r.json()["error"]["code"] == "unknown_action"
        r = httpx.get(f"{url}/v1/actions/never", params={"wait": "x"})
        assert r.status_code == 400
        r = httpx.delete(f"{url}/v1/trajectories/none")
        assert r.status_code == 404 and r.json()["error"]["code"] == "unknown_trajectory"
        r = httpx.post(f"{url}/v1/trajectories", json={"id": "t"})
        assert r.status_code == 501 and r.json()["error"]["code"] == "executor_missing"
        r = httpx.get(f"{url}/no/such/path")
        assert r.status_code == 404 and "error" in r.json()
        # The service still serves.
        with Client(url) as c:
            assert c.run(endpoint="echo", payload="ok").value == "ok"
            with pytest.raises(ServiceError) as info:
                c.run(endpoint="echo", payload="x", id="dup")
                c.run(endpoint="echo", payload="y", id="dup")
            assert info.value.status == 409 and info.value.code == "conflict"


def test_trace_is_written_at_shutdown_and_on_demand(tmp_path: Path) -> None:
    from tangram.trace import load_trace

    path = tmp_path / "run.jsonl"
    svc = api_service(
        CallLog(), config=RuntimeConfig(max_pending=100, trace_path=path), trace_path=path
    )
    with svc, Client(svc.url) as c:
        for i in range(7):
            c.run(endpoint="echo", payload=i, trajectory="tr")
        saved = c.save_trace()
        assert saved["rows"] == 7 and Path(saved["path"]) == path
        text = c.trace_text()
        assert text.splitlines()[0].startswith('{"tangram_trace":3')  # live rows may be v3
        c.write_trace(tmp_path / "copy.jsonl")
        assert len(load_trace(tmp_path / "copy.jsonl")) == 7
        c.run(endpoint="echo", payload="last")
    trace = load_trace(path)  # rewritten at shutdown, with the last action
    assert len(trace) == 8
    assert all(r.obs_outcome == "result" for r in trace.rows)


def test_the_trainer_says_when_a_steps_submissions_are_done() -> None:
    """``POST /v1/submissions`` sets the core's ``no_more_arrivals`` (the simulator's
    closed-loop driver sets it after a step's last action: ``RolloutConfig.announce_step_end``)
    and ``{"done": false}`` clears it; anything else is a 400 naming the field."""
    with api_service(CallLog()) as svc, Client(svc.url) as c:
        assert svc.runtime is not None and not svc.runtime.scheduler.no_more_arrivals
        assert c.submissions_done() == {"done": True}
        assert svc.runtime.scheduler.no_more_arrivals
        assert c.submissions_done(False) == {"done": False}
        assert not svc.runtime.scheduler.no_more_arrivals
        for body, field in (
            ({"done": "yes"}, "'done'"),
            ({"finished": True}, "done"),
            ([1], "done"),
        ):
            r = httpx.post(f"{svc.url}/v1/submissions", json=body)
            assert r.status_code == 400 and field in r.json()["error"]["message"], r.text
        assert httpx.post(f"{svc.url}/v1/submissions").json() == {"done": True}


def test_a_service_whose_runtime_fails_to_start_stops_its_executors(tmp_path: Path) -> None:
    """A runtime that failed to start (its trace or journal path unusable, a journal held by
    another service) left its executors running: ``start_site`` closed only a runtime that
    had started, so the executors ``build_runtime`` made (AOE's Docker client, watchdog and
    warm containers; EOE's devices; the API endpoints' pool and connections) were never
    stopped. They are stopped, and the start's error goes on."""
    stopped: list[str] = []

    class Recording(ApiExecutor):
        def shutdown(self) -> None:
            stopped.append("api")
            super().shutdown()

    blocker = tmp_path / "a-file"
    blocker.write_text("")
    config = RuntimeConfig(trace_path=blocker / "trace.jsonl")  # (below a file: unwritable)

    def make() -> Runtime:
        return Runtime(CLUSTER, config, api=Recording({"echo": echo}))

    svc = ServiceThread(make, ServeOptions(port=0))
    with pytest.raises(RuntimeError, match="trace stream"):
        svc.start(timeout_s=60)
    svc.stop()
    assert stopped == ["api"]


def test_a_stopped_service_leaves_no_openai_worker_thread() -> None:
    """The OpenAI-style routes parse and tokenise on a worker thread of their own, which was
    never shut down: every service that answered one such request left its thread behind
    when it stopped (one per service, for the life of the process). It stops with the
    service."""
    import threading

    def openai_threads() -> set[threading.Thread]:
        return {t for t in threading.enumerate() if t.name.startswith("tangram-openai")}

    before = openai_threads()
    with api_service(CallLog()) as svc:
        r = httpx.post(f"{svc.url}/v1/completions", json={"model": "m", "prompt": "hi"})
        assert r.status_code == 404, r.text  # (no model here; parsed on the worker thread)
        assert openai_threads() - before, "the request ran on no worker thread"
    assert not openai_threads() - before


def test_an_outcomes_timings_add_up_as_sent() -> None:
    """Each timing rounded alone to the microsecond, act_s differed from the sum of the
    others by 1e-6 (0.0000004 + 0.0000004 + 0.0000004: parts 0, act 1e-6)."""
    import json
    import random

    from tangram.exec.runtime.records import Outcome, Timings
    from tangram.exec.service.schema import outcome_doc

    rng = random.Random(7)
    cases = [(4e-7, 4e-7, 4e-7), (0.1, 0.2, 0.0), (1.0000004, 2.0000004, 3.0000004)]
    cases += [tuple(rng.uniform(0, 3) for _ in range(3)) for _ in range(2000)]
    for q, o, e in cases:
        timings = Timings(q, o, e, q + o + e)
        out = Outcome("a", None, "api", "ok", None, None, timings, 0.0, 0.0, q + o + e)
        doc = json.loads(json.dumps(outcome_doc(out)))["timings"]
        assert doc["act_s"] == doc["queue_s"] + doc["overhead_s"] + doc["exec_s"], (q, o, e)
        assert doc["act_s"] == pytest.approx(q + o + e, abs=2e-6)
        assert all(v == round(v, 6) for k, v in doc.items() if k != "act_s")
