"""The live runtime's own rules, on API work (no Docker, no torch): one scheduling pass per
loop iteration, exactly one outcome per action, admission control, idempotent ids, time-outs,
cancellation, quotas enforced by the core, the recorded trace."""

from __future__ import annotations

import asyncio
import contextlib
import random
from collections.abc import Awaitable, Callable
from typing import Any

import pytest

from tangram.core.resources import ApiEndpointSpec, ClusterSpec
from tangram.exec.runtime import (
    ActionSpec,
    ApiExecutor,
    ApiWork,
    BadRequest,
    Conflict,
    CpuWork,
    ExecutorMissing,
    Overloaded,
    Runtime,
    RuntimeConfig,
    ShuttingDown,
    UnknownAction,
    UnknownTrajectory,
)
from tests.live.conftest import CallLog, faulty_endpoints, live_cluster


def api_cluster(concurrency: int = 3, rate: float | None = None) -> ClusterSpec:
    return ClusterSpec(
        name="api-only",
        apis=(
            ApiEndpointSpec("echo", concurrency=256),
            ApiEndpointSpec("counted", concurrency=concurrency, rate_per_s=rate, burst=1),
            ApiEndpointSpec("faulty", concurrency=4),
            ApiEndpointSpec("slow", concurrency=2),
            ApiEndpointSpec("unregistered", concurrency=1),
        ),
    )


def with_runtime(
    body: Callable[[Runtime, CallLog], Awaitable[Any]],
    *,
    config: RuntimeConfig | None = None,
    cluster: ClusterSpec | None = None,
) -> Any:
    async def main() -> Any:
        from tangram.exec.runtime.api import echo

        log = CallLog()
        endpoints = {"echo": echo, **faulty_endpoints(log)}
        rt = Runtime(cluster or api_cluster(), config, api=ApiExecutor(endpoints))
        async with rt:
            return await body(rt, log)

    return asyncio.run(main())


def counted(key: str, s: float = 0.01, **kw: Any) -> ActionSpec:
    return ActionSpec(ApiWork("counted", {"key": key, "s": s}), **kw)


def test_simultaneous_submissions_are_one_scheduling_pass() -> None:
    async def body(rt: Runtime, log: CallLog) -> None:
        calls: list[int] = []
        real = rt.scheduler.advance

        def spy(now: float, *, finished: Any = (), arrived: Any = ()) -> Any:
            calls.append(len(arrived))
            return real(now, finished=finished, arrived=arrived)

        rt.scheduler.advance = spy  # type: ignore[method-assign]
        ids = await asyncio.gather(*(rt.submit(counted(f"k{i}")) for i in range(50)))
        outs = await asyncio.gather(*(rt.result(i) for i in ids))
        assert all(o is not None and o.ok for o in outs)
        assert calls[0] == 50, f"the first pass saw {calls[0]} of the 50 simultaneous arrivals"

    with_runtime(body)


def test_every_action_gets_exactly_one_outcome_and_runs_once() -> None:
    async def body(rt: Runtime, log: CallLog) -> None:
        rng = random.Random(7)
        specs = []
        for i in range(400):
            roll = rng.random()
            if roll < 0.6:
                specs.append(counted(f"k{i}", s=rng.uniform(0, 0.01), id=f"a{i}"))
            elif roll < 0.8:
                specs.append(ActionSpec(ApiWork("faulty", i), id=f"a{i}"))
            else:
                specs.append(ActionSpec(ApiWork("echo", {"i": i}), id=f"a{i}"))
        outcomes: list[Any] = []

        async def one(spec: ActionSpec) -> None:
            await asyncio.sleep(rng.uniform(0, 0.05))
            outcomes.append(await rt.run(spec))

        await asyncio.gather(*(one(s) for s in specs))
        assert sorted(o.action_id for o in outcomes) == sorted(s.id for s in specs)
        assert all(n == 1 for n in log.calls.values()), "an action ran twice"
        assert sum(log.calls.values()) == sum(1 for s in specs if s.work.endpoint == "counted")
        assert log.peak <= 3, f"{log.peak} calls in flight; the endpoint's quota is 3"
        by_kind = {s.id: s.work.endpoint for s in specs}
        for o in outcomes:
            assert o.ok == (by_kind[o.action_id] != "faulty")
            t = o.timings
            assert t.act_s == pytest.approx(t.queue_s + t.overhead_s + t.exec_s, abs=1e-9)
        assert rt.pending == 0
        assert rt.counters["completed"] == 400

    with_runtime(body)


def test_back_pressure_refuses_with_a_retryable_error_and_accepts_after() -> None:
    async def body(rt: Runtime, log: CallLog) -> None:
        ids = [await rt.submit(counted(f"k{i}", s=0.2)) for i in range(5)]
        with pytest.raises(Overloaded) as info:
            await rt.submit(counted("k-extra"))
        assert info.value.retryable and info.value.retry_after_s > 0
        assert "max_pending" in str(info.value) and "5" in str(info.value)
        assert "k-extra" not in log.calls
        await asyncio.gather(*(rt.result(i) for i in ids))
        later = await rt.run(counted("k-extra", id="extra"))
        assert later.ok
        assert rt.counters["refused_overloaded"] == 1

    with_runtime(body, config=RuntimeConfig(max_pending=5))


def test_resubmitting_an_id_is_idempotent_and_a_different_action_conflicts() -> None:
    async def body(rt: Runtime, log: CallLog) -> None:
        first = await rt.submit(counted("once", id="same"))
        again = await rt.submit(counted("once", id="same"))
        assert first == again == "same"
        out = await rt.result("same")
        assert out is not None and out.ok
        assert await rt.submit(counted("once", id="same")) == "same"  # after the end too
        assert log.calls["once"] == 1
        with pytest.raises(Conflict, match="different action"):
            await rt.submit(counted("other", id="same"))

    with_runtime(body)


def test_timeouts_in_the_queue_and_while_running() -> None:
    async def body(rt: Runtime, log: CallLog) -> None:
        slow = [
            await rt.submit(ActionSpec(ApiWork("slow", {"s": 5}), timeout_s=0.2, id=f"s{i}"))
            for i in range(2)
        ]
        queued = await rt.submit(ActionSpec(ApiWork("slow", {"s": 0.05}), timeout_s=0.1))
        outs = [await rt.result(i) for i in [*slow, queued]]
        for o in outs[:2]:
            assert o.status == "timeout" and o.start_s is not None
            assert "cancelled" in o.error.message
            assert 0.19 <= o.timings.act_s < 4  # ended by its time-out, not the 5-s call
        assert outs[2].status == "timeout" and outs[2].start_s is None
        assert "never started" in outs[2].error.message
        # The withdrawn one held nothing for good: the endpoint serves the next calls.
        after = await rt.run(ActionSpec(ApiWork("slow", {"s": 0.01})))
        assert after.ok
        assert rt.scheduler.state.api["slow"].in_flight == 0

    with_runtime(body)


def test_cancel_queued_and_running_calls() -> None:
    async def body(rt: Runtime, log: CallLog) -> None:
        running = [await rt.submit(ActionSpec(ApiWork("slow", {"s": 5}))) for _ in range(2)]
        queued = await rt.submit(ActionSpec(ApiWork("slow", {"s": 5})))
        await asyncio.sleep(0.05)
        assert rt.state(running[0]) == "running" and rt.state(queued) == "queued"
        out = await rt.cancel(queued)
        assert out.status == "error" and out.error.code == "cancelled" and out.start_s is None
        out = await rt.cancel(running[0])
        assert out.error.code == "cancelled" and out.start_s is not None
        assert (await rt.cancel(running[0])) is out  # a finished action: the same outcome
        await rt.cancel(running[1])
        with pytest.raises(UnknownAction):
            await rt.cancel("never-submitted")

    with_runtime(body)


def test_rate_limit_wakes_the_core_without_other_events() -> None:
    async def body(rt: Runtime, log: CallLog) -> None:
        t0 = rt.now()
        # Without the wake-up the last starts would wait forever: bounded, that fails.
        runs = asyncio.gather(*(rt.run(counted(f"r{i}", s=0.0)) for i in range(6)))
        outs = await asyncio.wait_for(runs, 30)
        starts = sorted(o.start_s for o in outs)
        # burst 1, 20 starts/s: starts spread over at least 5/20 s (0.25-0.3 s when idle; the
        # upper bound leaves room for a loaded machine)
        assert 0.24 <= starts[-1] - t0 < 5
        gaps = [b - a for a, b in zip(starts, starts[1:], strict=False)]
        assert min(gaps) > 0.03

    with_runtime(body, cluster=api_cluster(concurrency=8, rate=20.0))


def test_clear_errors_for_bad_submissions() -> None:
    async def body(rt: Runtime, log: CallLog) -> None:
        with pytest.raises(BadRequest, match="unknown API endpoint 'nope'"):
            await rt.submit(ActionSpec(ApiWork("nope")))
        with pytest.raises(ExecutorMissing, match="no callable registered"):
            await rt.submit(ActionSpec(ApiWork("unregistered")))
        with pytest.raises(ExecutorMissing, match="no CPU executor"):
            await rt.submit(ActionSpec(CpuWork("echo"), trajectory="t"))
        with pytest.raises(ExecutorMissing):
            await rt.open_trajectory("t")
        with pytest.raises(UnknownTrajectory):
            await rt.close_trajectory("t")
        with pytest.raises(BadRequest, match="serial_fraction"):
            ActionSpec(ApiWork("echo"), serial_fraction=0.1).elasticity()
        with pytest.raises(BadRequest, match="max_units"):
            ActionSpec(ApiWork("echo"), max_units=0)
        with pytest.raises(BadRequest, match="t1_s"):
            ActionSpec(ApiWork("echo"), t1_s=-1)
        with pytest.raises(BadRequest, match="id"):
            ActionSpec(ApiWork("echo"), id="a/b")

    with_runtime(body)


def test_an_endpoint_that_raises_gives_that_action_an_error_only() -> None:
    async def body(rt: Runtime, log: CallLog) -> None:
        bad, good = await asyncio.gather(
            rt.run(ActionSpec(ApiWork("faulty", "x"))), rt.run(counted("fine"))
        )
        assert bad.status == "error" and bad.error.code == "endpoint_failed"
        assert "RuntimeError" in bad.error.message and "broke" in bad.error.message
        assert good.ok

    with_runtime(body)


def test_shutdown_ends_queued_actions_and_refuses_new_ones() -> None:
    async def main() -> None:
        log = CallLog()
        rt = Runtime(api_cluster(), api=ApiExecutor(faulty_endpoints(log)))
        await rt.start()
        running = [await rt.submit(ActionSpec(ApiWork("slow", {"s": 0.2}))) for _ in range(2)]
        queued = await rt.submit(ActionSpec(ApiWork("slow", {"s": 0.2})))
        await asyncio.sleep(0.01)
        await rt.close(grace_s=5)
        q = await rt.result(queued)
        assert q.status == "error" and q.error.code == "shutting_down"
        for i in running:
            assert (await rt.result(i)).ok
        with pytest.raises(ShuttingDown):
            await rt.submit(ActionSpec(ApiWork("slow")))

    asyncio.run(main())


def test_trace_of_a_run_is_valid_open_loop_with_observations(tmp_path: Any) -> None:
    from tangram.trace import load_trace

    async def body(rt: Runtime, log: CallLog) -> Any:
        await asyncio.gather(
            *(rt.run(counted(f"k{i}", trajectory="traj-a", id=f"x{i}")) for i in range(5))
        )
        await rt.run(ActionSpec(ApiWork("faulty", 1), id="bad"))
        return rt.write_trace(tmp_path / "t.jsonl")

    path = with_runtime(body)
    trace = load_trace(path)
    assert len(trace) == 6
    assert trace.meta["policy"] == "tangram" and trace.meta["cluster"]["name"] == "api-only"
    rows = {r.action_id: r for r in trace.rows}
    assert rows["bad"].obs_outcome == "error"
    assert [r.position for r in trace.trajectories()[(0, "traj-a")]] == list(range(5))
    for r in trace.rows:
        assert r.arrival_s == r.obs_arrival_s is not None
        assert r.obs_queue_s is not None and r.obs_exec_s is not None
        assert r.obs_units == 1 and r.obs_node in ("counted", "faulty")


@pytest.mark.parametrize(
    ("kwargs", "words"),
    [
        ({"trajectory": ""}, "trajectory"),
        ({"trajectory": "t", "memory_gb": 1e-9}, "memory_gb"),
        ({"trajectory": "t", "memory_gb": 0}, "memory_gb"),
        ({"trajectory": "t", "image": ""}, "image"),
        ({"trajectory": "t", "image": "Not An Image!"}, "image"),
    ],
)
def test_the_python_api_refuses_what_http_refuses_never_rewriting_it(kwargs, words) -> None:
    """The runtime's own API holds the HTTP rules: a given value is checked, not replaced."""
    from tangram.exec.runtime import BadRequest, Runtime
    from tangram.exec.runtime.cpu import CpuExecutor

    class NoContainers(CpuExecutor):  # refusals come before any container: none is made
        def __init__(self) -> None:
            pass

        @property
        def node(self):  # type: ignore[override]
            return live_cluster().cpu_nodes[0]

    async def go() -> None:
        async with Runtime(live_cluster(), cpu=NoContainers()) as rt:
            with pytest.raises(BadRequest, match=words):
                await rt.open_trajectory(**kwargs)

    asyncio.run(go())


def test_the_search_stand_in_bounds_what_a_payload_asks_of_it() -> None:
    """``search`` (a built-in endpoint of ``tangram serve``'s default cluster) made ``k``
    hits, each titled with the query, in one synchronous loop on the event loop: a payload
    with k = 10**9 (or a 64 MiB query) stalled every client's work and took the service's
    memory. k is at most ``SEARCH_K_MAX`` and the query ``SEARCH_QUERY_MAX`` characters; a
    payload past either is the action's error, naming the field."""
    from tangram.exec.runtime.api import SEARCH_K_MAX, SEARCH_QUERY_MAX, search

    cluster = ClusterSpec(name="search", apis=(ApiEndpointSpec("search", concurrency=4),))

    async def main() -> list[Any]:
        rt = Runtime(cluster, api=ApiExecutor({"search": search}))
        async with rt:
            payloads = [
                {"query": "q", "k": SEARCH_K_MAX, "latency_s": 0},
                {"query": "q", "k": SEARCH_K_MAX + 1, "latency_s": 0},
                {"query": "q" * (SEARCH_QUERY_MAX + 1), "latency_s": 0},
            ]
            return [await rt.run(ActionSpec(ApiWork("search", p))) for p in payloads]

    fine, many, long = asyncio.run(main())
    assert fine.ok and len(fine.value["hits"]) == SEARCH_K_MAX
    for out, field in ((many, "k"), (long, "query")):
        assert out.status == "error" and out.error is not None, out
        assert out.error.code == "endpoint_failed" and f"{field} must" in out.error.message


def test_an_api_call_that_ignores_its_cancel_still_ends_at_its_time_out() -> None:
    """An endpoint that swallows the ``CancelledError`` of its deadline (a retry loop around
    an await, say) kept running, and its action ended when it returned, after its time-out,
    as a ``result``. The deadline holds: a value that comes after the cancel is discarded
    (``timeout``), and one that does not come within ``timeout_grace_s`` is not waited for
    (its API slot stays held until the call returns)."""
    returned: list[str] = []

    async def stubborn(payload: Any) -> Any:
        for _ in range(3):
            try:
                await asyncio.sleep(payload)
                break
            except asyncio.CancelledError:
                continue
        returned.append("returned")
        return "late"

    cluster = ClusterSpec(name="stubborn", apis=(ApiEndpointSpec("stubborn", concurrency=1),))

    async def main(grace_s: float, sleep_s: float) -> Any:
        config = RuntimeConfig(timeout_grace_s=grace_s)
        async with Runtime(cluster, config, api=ApiExecutor({"stubborn": stubborn})) as rt:
            out = await rt.run(ActionSpec(ApiWork("stubborn", sleep_s), timeout_s=0.05))
            seen = list(returned)
            await rt.close(grace_s=5.0)  # (waits for the call: bounded by its 3 sleeps)
            return out, seen

    late, seen = asyncio.run(main(grace_s=30.0, sleep_s=0.1))
    assert seen == ["returned"], "it ended once the call returned"
    returned.clear()
    never, seen = asyncio.run(main(grace_s=0.05, sleep_s=1.0))
    assert seen == [], "it ended at its time-out and grace, before the call returned"
    for out in (late, never):
        assert out.status == "timeout" and out.value is None, out
        assert out.error is not None and out.error.code == "timeout"


def test_a_client_s_cancel_of_an_api_call_that_ignores_it_ends_within_the_grace() -> None:
    """A client's cancel of a running API call whose endpoint swallows the ``CancelledError``
    waited for the call to return, with no bound but the action's time-out: the cancel (an
    HTTP DELETE) hung that long, and the action then ended as a ``timeout``, not cancelled.
    As at a deadline, a call that has not returned ``timeout_grace_s`` after its cancel is no
    longer waited for: it ends ``cancelled`` (its API slot stays held until it returns)."""
    release = asyncio.Event()

    async def stubborn(payload: Any) -> Any:
        while not release.is_set():
            try:
                await release.wait()
            except asyncio.CancelledError:
                continue
        return "late"

    cluster = ClusterSpec(name="stubborn", apis=(ApiEndpointSpec("stubborn", concurrency=1),))

    async def main() -> Any:
        config = RuntimeConfig(timeout_grace_s=0.05)
        async with Runtime(cluster, config, api=ApiExecutor({"stubborn": stubborn})) as rt:
            aid = await rt.submit(ActionSpec(ApiWork("stubborn", None), timeout_s=3600))
            while rt.state(aid) != "running":
                await asyncio.sleep(0)
            try:
                out = await asyncio.wait_for(rt.cancel(aid), timeout=5)
            finally:
                release.set()
            return out

    out = asyncio.run(main())
    assert out.status == "error" and out.error is not None, out
    assert out.error.code == "cancelled" and "cancelled by the client" in out.error.message


def test_an_api_actions_inelastic_curve_is_checked_and_taken() -> None:
    """An API action's curve was read for its kind only: ``{"kind": "inelastic", "t1": -5}``
    was accepted (202), as was one missing its ``t1`` (a typo, ``t1_s``), and ``t1`` 5 was
    replaced by the default 1 s without a word, in the scheduler's estimate and the trace.
    It is checked and taken as a CPU or GPU action's curve is."""
    for bad in ({"kind": "inelastic", "t1": -5}, {"kind": "inelastic", "t1_s": 5}):
        with pytest.raises(BadRequest, match="bad elasticity"):
            ActionSpec(ApiWork("echo"), curve=bad)
    spec = ActionSpec(ApiWork("echo"), curve={"kind": "inelastic", "t1": 5})
    assert spec.elasticity().t1 == 5.0


def _stubborn_until(release: asyncio.Event) -> Callable[[Any], Awaitable[Any]]:
    """An endpoint that swallows every ``CancelledError`` until ``release`` is set."""

    async def stubborn(payload: Any) -> Any:
        while not release.is_set():
            try:
                await release.wait()
            except asyncio.CancelledError:
                continue
        return "late"

    return stubborn


async def _running(rt: Runtime, aid: str) -> None:
    """Wait (at most 5 s, 10,000 hops) for ``aid`` to run."""
    for _ in range(10_000):
        if rt.state(aid) == "running":
            return
        await asyncio.sleep(0.0005)
    raise AssertionError(f"{aid} never ran")


def test_a_client_s_cancel_after_the_deadline_does_not_rewrite_the_time_out() -> None:
    """A client's cancel of an API call that had passed its deadline (the call swallowed the
    deadline's cancel and ran in its grace) replaced the pending time-out by its own
    ``cancelled``: the action that timed out ended as cancelled by the client. The first
    interruption stands: it ends ``timeout``, and the cancel answers with that outcome."""
    release = asyncio.Event()
    cluster = ClusterSpec(name="stubborn", apis=(ApiEndpointSpec("stubborn", concurrency=1),))

    async def main() -> Any:
        config = RuntimeConfig(timeout_grace_s=30.0)
        api = ApiExecutor({"stubborn": _stubborn_until(release)})
        async with Runtime(cluster, config, api=api) as rt:
            aid = await rt.submit(ActionSpec(ApiWork("stubborn", None), timeout_s=0.05))
            rec = rt.host.table.get(aid)
            assert rec is not None
            for _ in range(10_000):  # (5 s at most) the deadline passes; the call runs on
                if rec.interrupt is not None:
                    break
                await asyncio.sleep(0.0005)
            assert rec.interrupt is not None and rec.outcome is None
            cancel = asyncio.ensure_future(rt.cancel(aid))
            await asyncio.sleep(0)
            release.set()
            out = await asyncio.wait_for(cancel, timeout=5)
            return out, await rt.result(aid)

    out, result = asyncio.run(main())
    assert out is result
    assert out.status == "timeout" and out.error is not None, out
    assert out.error.code == "timeout" and "timed out after" in out.error.message


def test_a_deadline_in_a_client_s_cancel_grace_does_not_rewrite_the_cancel() -> None:
    """A deadline that passed while a client's cancel waited for a call that swallowed it
    replaced the cancel by a ``timeout``: the client asked to cancel, its cancel returned a
    time-out. The first interruption stands: it ends ``cancelled`` by the client."""
    release = asyncio.Event()
    cluster = ClusterSpec(name="stubborn", apis=(ApiEndpointSpec("stubborn", concurrency=1),))

    async def main() -> Any:
        config = RuntimeConfig(timeout_grace_s=30.0)
        api = ApiExecutor({"stubborn": _stubborn_until(release)})
        async with Runtime(cluster, config, api=api) as rt:
            aid = await rt.submit(ActionSpec(ApiWork("stubborn", None), timeout_s=3600))
            await _running(rt, aid)
            rec = rt.host.table.get(aid)
            assert rec is not None
            cancel = asyncio.ensure_future(rt.cancel(aid))
            await asyncio.sleep(0)
            assert rec.interrupt is not None and rec.outcome is None
            rt.host.on_deadline(rec)  # (its deadline's timer, firing in the cancel's grace)
            await asyncio.sleep(0)
            release.set()
            out = await asyncio.wait_for(cancel, timeout=5)
            return out, rt.counters["outcome_timeout"]

    out, timeouts = asyncio.run(main())
    assert out.status == "error" and out.error is not None, out
    assert out.error.code == "cancelled" and "cancelled by the client" in out.error.message
    assert timeouts == 0


async def _json_server(closed: asyncio.Event, status: bytes = b"200 OK") -> asyncio.Server:
    """A loopback HTTP/1.1 server answering every POST with ``{"ok": true}`` (at ``status``)
    on kept-alive connections; ``closed`` is set when a client closes its connection."""

    async def serve(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            for _ in range(100):  # (requests on one connection)
                head = await reader.readuntil(b"\r\n\r\n")
                length = 0
                for line in head.decode("latin-1").split("\r\n"):
                    name, _, value = line.partition(":")
                    if name.strip().lower() == "content-length":
                        length = int(value)
                await reader.readexactly(length)
                body = b'{"ok": true}'
                writer.write(
                    b"HTTP/1.1 "
                    + status
                    + b"\r\nContent-Type: application/json\r\n"
                    + f"Content-Length: {len(body)}\r\n\r\n".encode()
                    + body
                )
                await writer.drain()
        except (asyncio.IncompleteReadError, ConnectionError):
            closed.set()
        finally:
            writer.close()

    return await asyncio.start_server(serve, "127.0.0.1", 0)


def test_an_http_endpoint_s_connections_close_with_the_runtime() -> None:
    """``http_endpoint``'s ``httpx.AsyncClient`` was never closed: its kept-alive connections
    to the endpoint stayed open after the runtime closed (until the process exited). The
    runtime's close closes them."""
    from tangram.exec.runtime import http_endpoint

    cluster = ClusterSpec(name="http", apis=(ApiEndpointSpec("remote", concurrency=1),))

    async def main() -> tuple[Any, bool]:
        closed = asyncio.Event()
        server = await _json_server(closed)
        port = server.sockets[0].getsockname()[1]
        try:
            endpoint = http_endpoint(f"http://127.0.0.1:{port}/call")
            async with Runtime(cluster, api=ApiExecutor({"remote": endpoint})) as rt:
                out = await rt.run(ActionSpec(ApiWork("remote", {"x": 1})))
                assert not closed.is_set()  # (kept alive while the runtime runs)
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(closed.wait(), timeout=5)
            return out, closed.is_set()
        finally:
            server.close()

    out, closed = asyncio.run(main())
    assert out.ok and out.value == {"ok": True}, out
    assert closed, "the endpoint's connection was still open after the runtime closed"


def test_a_plain_endpoint_past_its_deadline_keeps_its_slot_until_its_thread_returns() -> None:
    """A plain (blocking) endpoint runs on a worker thread that a deadline cannot stop; its
    action's task ended at the cancel all the same, so the core gave its slot to the next
    call while the first still ran: two calls at once on an endpoint of concurrency 1 (an
    API's quota broken for every client). The action still ends at its time-out and grace;
    its slot is held until its thread returns, as for a call that swallows its cancel."""
    import threading

    release = threading.Event()
    log = CallLog()

    def blocking(payload: Any) -> Any:
        log.enter(str(payload))
        try:
            release.wait(10)  # (bounded: the test sets it)
        finally:
            log.leave()
        return payload

    cluster = ClusterSpec(name="plain", apis=(ApiEndpointSpec("plain", concurrency=1),))

    async def main() -> Any:
        config = RuntimeConfig(timeout_grace_s=0.05)
        async with Runtime(cluster, config, api=ApiExecutor({"plain": blocking})) as rt:
            first = await rt.submit(ActionSpec(ApiWork("plain", "first"), timeout_s=0.05))
            second = await rt.submit(ActionSpec(ApiWork("plain", "second"), timeout_s=60))
            timed_out = await asyncio.wait_for(rt.result(first), timeout=5)
            await asyncio.sleep(0.05)  # (passes run: a freed slot would start the second)
            state = rt.state(second)
            release.set()
            done = await asyncio.wait_for(rt.result(second), timeout=5)
            return timed_out, state, done

    timed_out, state, done = asyncio.run(main())
    assert timed_out.status == "timeout", timed_out
    assert state == "queued", "the second call started while the first one's thread ran"
    assert done.ok and done.value == "second", done
    assert log.peak == 1


def test_an_action_cut_at_shutdown_keeps_the_time_it_ran() -> None:
    """A running action the shutdown cut after its grace ended with an execution time of 0:
    the whole time it ran was counted as overhead in its outcome and the trace (a deadline's
    or a cancel's end counts it as execution). It counts as execution, start to cut."""

    async def main() -> Any:
        rt = Runtime(api_cluster(), api=ApiExecutor(faulty_endpoints(CallLog())))
        await rt.start()
        aid = await rt.submit(ActionSpec(ApiWork("slow", {"s": 30.0}), timeout_s=60))
        await _running(rt, aid)
        await rt.close(grace_s=0.05)
        return await rt.result(aid)

    out = asyncio.run(main())
    assert out.status == "error" and out.error is not None, out
    assert out.error.code == "shutting_down"
    assert out.start_s is not None
    # It ran at least the grace (the cut came after it), and no longer than start to end.
    assert 0.05 <= out.timings.exec_s <= out.end_s - out.start_s, out.timings


def test_a_plain_endpoint_still_running_at_close_leaves_no_task_waiting_for_it() -> None:
    """The action of a plain endpoint still on its thread when the runtime closes is cut
    after the grace; its task, which waits for the thread to keep the endpoint's slot, stops
    waiting as the API executor closes (it outlived the runtime, pending when the loop
    closed, until the thread returned)."""
    import threading

    release = threading.Event()

    def blocking(payload: Any) -> Any:
        release.wait(10)  # (bounded: the test sets it)
        return payload

    cluster = ClusterSpec(name="plain", apis=(ApiEndpointSpec("plain", concurrency=1),))

    async def main() -> Any:
        rt = Runtime(cluster, api=ApiExecutor({"plain": blocking}))
        await rt.start()
        aid = await rt.submit(ActionSpec(ApiWork("plain", 1), timeout_s=60))
        await _running(rt, aid)
        rec = rt.host.table.get(aid)
        assert rec is not None and rec.task is not None
        await rt.close(grace_s=0.05)
        for _ in range(10):  # (the task's last steps)
            await asyncio.sleep(0)
        done = rec.task.done()
        release.set()
        return done, await rt.result(aid)

    done, out = asyncio.run(main())
    assert out.status == "error" and out.error is not None and out.error.code == "shutting_down"
    assert done, "the action's task still waited for its thread after the close"


def test_an_http_endpoint_s_failure_does_not_show_its_url_to_clients() -> None:
    """An ``--api NAME=URL`` endpoint that answered an error status failed its action with
    httpx's message, which quotes the whole URL: its credentials (``user:token@``) and query
    (``?api_key=``), the operator's secrets, went to every client calling it (tenants too),
    the trace and the journal. The error names the endpoint's status, not its URL."""
    from tangram.exec.runtime import http_endpoint

    cluster = ClusterSpec(name="http", apis=(ApiEndpointSpec("remote", concurrency=1),))

    async def main() -> Any:
        server = await _json_server(asyncio.Event(), status=b"503 Service Unavailable")
        port = server.sockets[0].getsockname()[1]
        try:
            url = f"http://user:hunter2@127.0.0.1:{port}/call?api_key=topsecret"
            api = ApiExecutor({"remote": http_endpoint(url)})
            async with Runtime(cluster, api=api) as rt:
                return await rt.run(ActionSpec(ApiWork("remote", {"x": 1})))
        finally:
            server.close()

    out = asyncio.run(main())
    assert out.status == "error" and out.error is not None, out
    assert out.error.code == "endpoint_failed" and "503" in out.error.message, out.error
    assert "hunter2" not in out.error.message and "topsecret" not in out.error.message


@pytest.mark.parametrize(
    "url",
    ["http://[hunter2-token]/call", "http://user:pw@hunter2-host:12hunter2/call"],
    ids=["bad host", "bad port"],
)
def test_an_http_endpoint_s_invalid_url_is_not_shown_to_clients(url: str) -> None:
    """An ``--api`` URL that httpx refuses to use raised ``httpx.InvalidURL``, which is not an
    ``httpx.HTTPError``: it went through ``HttpEndpoint`` with its message, which quotes the
    URL's host or port (the operator's secrets may be there), to every client calling it.
    It is now an ``EndpointError`` that names only its kind."""
    from tangram.exec.runtime import http_endpoint
    from tangram.exec.runtime.api import EndpointError

    with pytest.raises(EndpointError) as info:
        asyncio.run(http_endpoint(url)({"x": 1}))
    assert "InvalidURL" in str(info.value) and "hunter2" not in str(info.value), info.value


def test_an_http_endpoint_s_payload_json_cannot_hold_is_named_as_the_payload() -> None:
    """(55bf31f took every error of the request for one of its URL's: a payload JSON cannot
    hold, NaN, was said to be the operator's URL.) The payload's error keeps its message."""
    from tangram.exec.runtime import http_endpoint

    with pytest.raises(ValueError, match="JSON") as info:
        asyncio.run(http_endpoint("http://127.0.0.1:9/call")(float("nan")))
    assert "URL" not in str(info.value)
    with pytest.raises(UnicodeEncodeError) as info:  # (a lone surrogate, which JSON can send)
        asyncio.run(http_endpoint("http://127.0.0.1:9/call")({"q": "\ud800"}))
    assert "URL" not in str(info.value)
