"""The two clients are one implementation: the same methods and signatures, the same answers
from the same service, the same requests and retries against the same scripted answers."""

from __future__ import annotations

import asyncio
import contextlib
import inspect
import json
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from tangram.core.resources import ApiEndpointSpec, ClusterSpec
from tangram.exec.runtime import ApiExecutor, Outcome, Runtime, RuntimeConfig
from tangram.exec.runtime.api import echo
from tangram.exec.service import (
    AsyncClient,
    Client,
    OverloadedError,
    ServeOptions,
    ServiceError,
    ServiceThread,
)
from tests.live.test_service_ids import FakeAoe, fake_cpu_runtime

LIFECYCLE = {"__init__", "close", "aclose", "__enter__", "__exit__", "__aenter__", "__aexit__"}


def public_methods(cls: type) -> set[str]:
    return {n for n, m in vars(cls).items() if callable(m) and not n.startswith("_")}


def test_the_clients_have_the_same_methods_signatures_and_docs() -> None:
    names = public_methods(Client) - LIFECYCLE
    assert names == public_methods(AsyncClient) - LIFECYCLE
    assert len(names) == 16
    for name in names:
        sync, async_ = getattr(Client, name), getattr(AsyncClient, name)
        assert inspect.signature(sync) == inspect.signature(async_), name
        assert inspect.iscoroutinefunction(async_) and not inspect.iscoroutinefunction(sync)
        assert sync.__doc__ and sync.__doc__ == async_.__doc__, name
    init = {
        k: v
        for k, v in inspect.signature(AsyncClient).parameters.items()
        if k not in ("max_connections", "transport")
    }
    assert init == {
        k: v for k, v in inspect.signature(Client).parameters.items() if k != "transport"
    }


# -- the same service ------------------------------------------------------------------------


@pytest.fixture(scope="module")
def svc(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ServiceThread]:
    cluster = ClusterSpec(name="twins", apis=(ApiEndpointSpec("echo", concurrency=8),))
    trace = tmp_path_factory.mktemp("twins") / "live.jsonl"

    def make() -> Runtime:
        config = RuntimeConfig(max_pending=50, trace_path=trace)
        return Runtime(cluster, config, api=ApiExecutor({"echo": echo}))

    with ServiceThread(make, ServeOptions(port=0, trace_path=trace)) as service:
        yield service


def outcome_view(o: Outcome | None) -> Any:
    """What an outcome says, without its times."""
    if o is None:
        return None
    return (o.action_id, o.status, o.value, o.error, o.resource, o.units, o.node)


def script(prefix: str, tmp: Path) -> list[tuple[str, Callable[[Any], Any], Callable[[Any], Any]]]:
    """Steps as (name, call on a client, what to compare of the answer)."""
    same: Callable[[Any], Any] = lambda x: x  # noqa: E731
    return [
        ("run", lambda c: c.run(endpoint="echo", payload=[1, 2], id=f"{prefix}-a"), outcome_view),
        ("submit", lambda c: c.submit(endpoint="echo", payload="s", id=f"{prefix}-b"), same),
        ("result", lambda c: c.result(f"{prefix}-b", wait_s=30), outcome_view),
        ("state", lambda c: c.state(f"{prefix}-b"), same),
        ("cancel", lambda c: c.cancel(f"{prefix}-b"), outcome_view),
        ("rerun", lambda c: c.run(endpoint="echo", payload=[1, 2], id=f"{prefix}-a"), outcome_view),
        ("conflict", lambda c: c.run(endpoint="echo", payload=3, id=f"{prefix}-a"), same),
        ("unknown", lambda c: c.result(f"{prefix}-never"), same),
        ("open", lambda c: c.open_trajectory(f"{prefix}-t", memory_gb=0.5), same),
        ("close", lambda c: c.close_trajectory(f"{prefix}-t"), same),
        ("recreate", lambda c: c.recreate_trajectory(f"{prefix}-t"), same),
        ("trajectories", lambda c: c.trajectories(), same),
        ("status", lambda c: c.status(), lambda d: sorted(d)),
        ("metrics", lambda c: c.metrics(), lambda t: "tangram_actions_completed_total" in t),
        ("trace", lambda c: c.trace_text(), lambda t: t.splitlines()[0][:20]),
        ("write", lambda c: c.write_trace(tmp / f"{prefix}.jsonl"), lambda p: p.name),
        ("save", lambda c: c.save_trace(), lambda d: sorted(d)),
        ("run_code", lambda c: c.run_code("print(1)", run_timeout=5), same),
        ("bad", lambda c: c.run(command="x", endpoint="echo"), same),
    ]


def answer(value: Any, view: Callable[[Any], Any], prefix: str) -> str:
    """The comparable part of an answer or an error, with the client's id prefix taken out."""
    if isinstance(value, ServiceError):
        value = (type(value), value.status, value.code, value.retryable, value.message)
    elif isinstance(value, BaseException):
        value = (type(value), str(value))
    else:
        value = view(value)
    return repr(value).replace(prefix, "P")


def test_sync_and_async_clients_answer_the_same_on_the_same_service(
    svc: ServiceThread, tmp_path: Path
) -> None:
    sync_answers = []
    with Client(svc.url) as c:
        for _, step, view in script("twin-s", tmp_path):
            try:
                sync_answers.append(answer(step(c), view, "twin-s"))
            except Exception as exc:  # noqa: BLE001 - errors are answers to compare
                sync_answers.append(answer(exc, view, "twin-s"))

    async def main() -> list[Any]:
        answers = []
        async with AsyncClient(svc.url) as c:
            for _, step, view in script("twin-a", tmp_path):
                try:
                    answers.append(answer(await step(c), view, "twin-a"))
                except Exception as exc:  # noqa: BLE001
                    answers.append(answer(exc, view, "twin-a"))
        return answers

    async_answers = asyncio.run(main())
    names = [name for name, _, _ in script("x", tmp_path)]
    assert dict(zip(names, sync_answers, strict=True)) == dict(
        zip(names, async_answers, strict=True)
    )
    assert sync_answers[names.index("run")] == "('P-a', 'result', [1, 2], None, 'api', 1, 'echo')"
    assert "'conflict'" in sync_answers[names.index("conflict")]


# -- the same scripted answers ---------------------------------------------------------------


class Script:
    """A mock service: answers requests from a list (a response to copy, an exception to raise)."""

    def __init__(self, answers: list[httpx.Response | Exception]) -> None:
        self.answers, self.requests = list(answers), []

    def __call__(self, request: httpx.Request) -> httpx.Response:
        self.requests.append((request.method, request.url.path, request.url.query, request.content))
        answer = self.answers.pop(0)
        if isinstance(answer, Exception):
            raise answer
        return httpx.Response(answer.status_code, headers=answer.headers, content=answer.content)


def overloaded(hint: str | None = "0.001") -> httpx.Response:
    headers = {"X-Retry-After-S": hint} if hint else {}
    doc = {"error": {"code": "overloaded", "message": "busy", "retryable": True}}
    return httpx.Response(429, json=doc, headers=headers)


def both(
    answers: list[httpx.Response | Exception], op: Callable[[Any], Any], retries: int = 8
) -> tuple[Any, Any]:
    """Run ``op`` with each client against its own copy of ``answers``: (result, requests)."""
    results = []
    sync_script, async_script = Script(answers), Script(answers)
    with Client("http://mock", transport=httpx.MockTransport(sync_script), retries=retries) as c:
        try:
            results.append(op(c))
        except Exception as exc:  # noqa: BLE001
            results.append(exc)

    async def main() -> Any:
        transport = httpx.MockTransport(async_script)
        async with AsyncClient("http://mock", transport=transport, retries=retries) as c:
            try:
                return await op(c)
            except Exception as exc:  # noqa: BLE001
                return exc

    results.append(asyncio.run(main()))
    assert sync_script.requests == async_script.requests
    assert not sync_script.answers and not async_script.answers, "a script was not used up"
    for r in results:
        if isinstance(r, ServiceError):
            results = [(type(x), x.status, x.code, x.retryable, x.retry_after_s) for x in results]
            break
        if isinstance(r, Exception):
            results = [(type(x), str(x)) for x in results]
            break
    assert results[0] == results[1]
    return results[0], sync_script.requests


def test_a_429_from_anyone_is_retried_with_the_same_request() -> None:
    proxy_page = httpx.Response(429, text="<html>slow down</html>")
    done = httpx.Response(200, json={"id": "x1", "state": "queued", "outcome": None})
    got, requests = both(
        [overloaded(), proxy_page, done], lambda c: c.submit(endpoint="e", id="x1")
    )
    assert got == "x1" and len(requests) == 3 and len(set(requests)) == 1


def test_retries_run_out_with_an_overloaded_error() -> None:
    got, requests = both([overloaded()] * 3, lambda c: c.status(), retries=2)
    assert got == (OverloadedError, 429, "overloaded", True, 0.001) and len(requests) == 3


def test_a_503_is_retried_only_when_the_service_says_it_is_retryable() -> None:
    doc = {"error": {"code": "capacity_short", "message": "full", "retryable": True}}
    full = httpx.Response(503, json=doc, headers={"X-Retry-After-S": "0.001"})
    opened = httpx.Response(201, json={"id": "t"})
    got, requests = both([full, opened], lambda c: c.open_trajectory("t", memory_gb=1))
    assert got == {"id": "t"} and len(requests) == 2
    assert requests[0][3] == b'{"id":"t","memory_gb":1}'
    proxy = httpx.Response(503, text="bad gateway")
    got, requests = both([proxy], lambda c: c.status())
    assert got == (ServiceError, 503, "http_503", False, None) and len(requests) == 1


def test_a_lost_connection_is_retried_only_for_idempotent_calls() -> None:
    lost = httpx.ReadError("lost")
    ok = httpx.Response(200, json={"trajectories": []})
    got, requests = both([lost, ok], lambda c: c.trajectories())
    assert got == [] and len(requests) == 2
    got, requests = both([lost], lambda c: c.close_trajectory("t"))
    assert got == (httpx.ReadError, "lost") and requests == [
        ("DELETE", "/v1/trajectories/t", b"", b"")
    ]
    got, _ = both([lost] * 2, lambda c: c.status(), retries=1)
    assert got == (httpx.ReadError, "lost")


@pytest.mark.parametrize(
    "unsent",
    [httpx.ConnectError("refused"), httpx.ConnectTimeout("slow"), httpx.PoolTimeout("full")],
)
def test_a_call_that_never_reached_the_service_is_retried_even_if_not_idempotent(
    unsent: Exception,
) -> None:
    """A connection that could not be made (refused while the service restarts, a connect
    or pool time-out) sent nothing, yet a non-idempotent call (``run_code``,
    ``close_trajectory``) raised at once, as if its request might have been acted on,
    where a 429 (nothing accepted either) is retried. It is retried now."""
    ok = httpx.Response(200, json={"status": "Success", "run_result": None})
    got, requests = both([unsent, ok], lambda c: c.run_code("print(1)"))
    assert got == {"status": "Success", "run_result": None} and len(requests) == 2
    closed = httpx.Response(200, json={"id": "t", "closed": True})
    got, requests = both([unsent, closed], lambda c: c.close_trajectory("t"))
    assert got == {"id": "t", "closed": True} and len(requests) == 2
    got, _ = both([unsent] * 2, lambda c: c.close_trajectory("t"), retries=1)
    assert got == (type(unsent), str(unsent))


class LoseFirstOpenAnswer(httpx.HTTPTransport):
    """Sends every request; the answer to the first trajectory open is lost on the way back
    (a read time-out, a connection reset after the service acted)."""

    def __init__(self) -> None:
        super().__init__()
        self.opens: list[bytes] = []

    def handle_request(self, request: httpx.Request) -> httpx.Response:
        response = super().handle_request(request)
        if request.method == "POST" and request.url.path == "/v1/trajectories":
            self.opens.append(request.content)
            if len(self.opens) == 1:
                response.close()
                raise httpx.ReadError("the answer was lost", request=request)
        return response


def test_an_open_without_an_id_retried_after_a_lost_answer_opens_one_trajectory() -> None:
    """The client retries a lost answer for an open, but sent no id when the caller gave
    none: the service made a fresh id for each attempt, two containers were opened, and the
    first one, whose id no one knew, held its memory on the node until the service stopped.
    The client makes the id up, as it does for actions: the retry is the same open, and
    its 409 (the first attempt did open it) is read as that open's answer."""
    from tests.live.test_service_ids import fake_cpu_runtime

    transport = LoseFirstOpenAnswer()
    with (
        ServiceThread(fake_cpu_runtime, ServeOptions(port=0)) as svc,
        Client(svc.url, transport=transport) as c,
    ):
        info = c.open_trajectory(memory_gb=1)
        opened = c.trajectories()
        assert len(transport.opens) == 2 and len(set(transport.opens)) == 1, transport.opens
        assert len(opened) == 1, opened
        assert info["id"] == opened[0]["id"], (info, opened)
        # A caller's own id may be another client's: its 409 is raised, never taken over.
        with pytest.raises(ServiceError) as refused:
            c.open_trajectory(info["id"], memory_gb=1)
        assert refused.value.status == 409


class GatedAoe(FakeAoe):
    """``FakeAoe`` whose container takes until ``gate`` is set to make (``entered`` set when
    its making began), and then fails if ``fails``."""

    def __init__(self, fails: bool) -> None:
        super().__init__()
        self.entered, self.gate, self.fails = threading.Event(), threading.Event(), fails

    def open_trajectory(self, traj: str, memory_gb: float, *, image: str | None = None) -> Any:
        self.entered.set()
        assert self.gate.wait(30.0), "the test never let the container be made"
        if self.fails:
            raise RuntimeError("the image would not start")
        return super().open_trajectory(traj, memory_gb, image=image)


class LoseOpenWhileMaking(httpx.HTTPTransport):
    """The first trajectory open's answer is lost while the service still makes its container
    (the request is sent on a thread of its own; the client sees a read error once the making
    began). The container is let be made 0.5 s after the client's next read of the trajectory
    was sent (a read that answers at once sees it still being made)."""

    def __init__(self, aoe: GatedAoe) -> None:
        super().__init__()
        self.aoe, self.opens, self.reads = aoe, 0, 0

    def handle_request(self, request: httpx.Request) -> httpx.Response:
        if request.method == "POST" and request.url.path == "/v1/trajectories":
            self.opens += 1
            if self.opens == 1:
                threading.Thread(target=self._send_and_drop, args=(request,), daemon=True).start()
                assert self.aoe.entered.wait(30.0), "the open never reached the executor"
                raise httpx.ReadError("the answer was lost", request=request)
        if request.method == "GET" and request.url.path.startswith("/v1/trajectories/"):
            self.reads += 1
            threading.Timer(0.5, self.aoe.gate.set).start()
        return super().handle_request(request)

    def _send_and_drop(self, request: httpx.Request) -> None:
        with contextlib.suppress(httpx.HTTPError):
            super().handle_request(request).close()


@pytest.mark.parametrize("fails", [False, True], ids=["made", "fails"])
def test_an_open_retried_while_its_container_is_made_returns_once_it_is_open(
    fails: bool,
) -> None:
    """A retried open whose first attempt is still making the container is answered 409; the
    client then read the trajectory and returned it at once, still opening (no container) and
    maybe never to open: the caller was told it opened when its container then failed. The
    read waits for the open: the client returns the trajectory open, with its container, or
    raises the open's failure; the caller's first action runs in it once."""
    aoe = GatedAoe(fails)
    transport = LoseOpenWhileMaking(aoe)
    with (
        ServiceThread(lambda: fake_cpu_runtime(aoe), ServeOptions(port=0)) as svc,
        Client(svc.url, transport=transport) as c,
    ):
        if fails:
            with pytest.raises(ServiceError) as failed:
                c.open_trajectory(memory_gb=1)
            assert failed.value.status == 404 and "failed to open" in failed.value.message
            assert c.trajectories() == []
            return
        info = c.open_trajectory(memory_gb=1)
        assert transport.opens == 2 and transport.reads == 1
        assert info["container"] is not None, info
        assert c.trajectories() == [info]
        outcome = c.run(command="echo first", trajectory=info["id"])
        assert outcome.status == "result", outcome
        assert [(t, cmd) for t, cmd, _ in aoe.runs] == [(info["id"], "echo first")]


def _api_result(id: str, value: int) -> dict[str, Any]:
    """A finished API action's outcome document, as the service answers it."""
    return {
        "id": id,
        "resource": "api",
        "status": "result",
        "result": value,
        "error": None,
        "timings": {"act_s": 0.1, "queue_s": 0.0, "overhead_s": 0.0, "exec_s": 0.1},
        "arrival_s": 0.0,
        "end_s": 0.1,
    }


def test_run_polls_until_the_outcome_comes() -> None:
    outcome = _api_result("r1", 7)
    pending = httpx.Response(202, json={"id": "r1", "state": "running", "outcome": None})
    done = httpx.Response(200, json={"id": "r1", "state": "done", "outcome": outcome})
    got, requests = both([pending, pending, done], lambda c: c.run(endpoint="e", id="r1"))
    assert got.value == 7 and [r[:3] for r in requests] == [
        ("POST", "/v1/actions", b""),
        ("GET", "/v1/actions/r1", b"wait=300"),
        ("GET", "/v1/actions/r1", b"wait=300"),
    ]


def test_run_asks_the_service_to_wait_no_longer_than_it_reads() -> None:
    """``run`` sent ``wait: true`` (until the outcome, as long as the service's --max-wait-s
    lets a request wait) while it reads an answer for its own ``max_wait_s`` + 60 s: behind a
    service whose cap is longer, an action running past that read time-out had its POST
    time out and sent again (the same id: never a second run) until the retries ran out,
    and the caller got ``ReadTimeout`` instead of the outcome. It asks the service to wait
    its own ``max_wait_s`` (300 s here), and polls after that as it always did."""
    outcome = _api_result("r2", 8)
    done = httpx.Response(200, json={"id": "r2", "state": "done", "outcome": outcome})
    got, requests = both([done], lambda c: c.run(endpoint="e", id="r2"))
    method, path, _, body = requests[0]
    assert (method, path) == ("POST", "/v1/actions") and json.loads(body)["wait"] == 300, body
    assert got.value == 8


def test_a_tiny_max_wait_still_polls_at_most_once_a_second() -> None:
    """With ``max_wait_s=0.01`` each poll asked the service to wait 0.01 s and the client
    polled in a near-tight loop until the outcome (with 0: a tight one). The submission asks
    for the client's own wait; each poll after it waits at least ``POLL_FLOOR_S`` (1 s)."""
    outcome = _api_result("r3", 9)
    pending = httpx.Response(200, json={"id": "r3", "state": "running", "outcome": None})
    done = httpx.Response(200, json={"id": "r3", "state": "done", "outcome": outcome})
    script = Script([pending, pending, done])
    with Client("http://mock", transport=httpx.MockTransport(script), max_wait_s=0.01) as c:
        assert c.run(endpoint="e", id="r3").value == 9
    assert json.loads(script.requests[0][3])["wait"] == 0.01
    assert [r[2] for r in script.requests[1:]] == [b"wait=1", b"wait=1"]


@pytest.mark.parametrize("bad", [0, -1.0, float("nan"), True, "300"])
def test_a_client_refuses_a_max_wait_that_is_not_seconds_above_zero(bad: object) -> None:
    # 0 polled in a tight loop; a negative wait got a 400 on every submission.
    for make in (Client, AsyncClient):
        with pytest.raises(ValueError, match="max_wait_s"):
            make("http://mock", max_wait_s=bad)  # type: ignore[arg-type]


@pytest.mark.parametrize("bad", [-1, True, 2.5, "8", None])
def test_a_client_refuses_retries_that_are_not_a_count(bad: object) -> None:
    # -1 ran no attempt: every call raised RuntimeError('unreachable'), naming nothing;
    # True was one retry.
    for make in (Client, AsyncClient):
        with pytest.raises(ValueError, match="retries"):
            make("http://mock", retries=bad)  # type: ignore[arg-type]


def test_zero_retries_sends_once() -> None:
    script = Script([overloaded()])
    client = Client("http://mock", transport=httpx.MockTransport(script), retries=0)
    with client as c, pytest.raises(OverloadedError):
        c.status()
    assert len(script.requests) == 1


def test_a_retry_after_that_is_a_date_or_garbage_is_still_retried() -> None:
    """A proxy's ``Retry-After`` may be an HTTP date (RFC 9110, section 10.2.3), and a broken
    one anything: the client read it with ``float`` and raised ``ValueError`` out of its retry
    loop, so a 429 it should have waited out ended the call. A date is waited for (one in the
    past: no wait), a value that is neither a number nor a date is no hint."""
    done = httpx.Response(200, json={"id": "x1", "state": "queued", "outcome": None})
    for hint in ("Wed, 21 Oct 2015 07:28:00 GMT", "soon"):
        busy = httpx.Response(429, text="<html>slow down</html>", headers={"Retry-After": hint})
        got, requests = both([busy, done], lambda c: c.submit(endpoint="e", id="x1"))
        assert got == "x1" and len(requests) == 2, (hint, got)


def test_result_waits_as_long_as_asked_past_the_services_cap() -> None:
    """``result(id, wait_s)`` sent one poll: behind a service whose cap on a wait (its
    ``max_wait_s``) is shorter, it answered None at the cap however long the caller asked to
    wait (and a wait past the client's read time-out timed out, was sent again and raised
    ``ReadTimeout``). It polls in turns until ``wait_s`` has passed."""
    gate = threading.Event()

    async def gated(payload: Any) -> Any:
        while not gate.is_set():
            await asyncio.sleep(0.02)
        return payload

    cluster = ClusterSpec(name="waits", apis=(ApiEndpointSpec("gate", concurrency=4),))

    def make() -> Runtime:
        return Runtime(cluster, RuntimeConfig(max_pending=8), api=ApiExecutor({"gate": gated}))

    with ServiceThread(make, ServeOptions(port=0, max_wait_s=0.3)) as service:
        with Client(service.url, retries=0) as c:
            aid = c.submit(endpoint="gate", payload="late")
            started = time.monotonic()
            assert c.result(aid, wait_s=1.0) is None  # not done: None once 1 s has passed
            assert time.monotonic() - started >= 0.95
            threading.Timer(1.0, gate.set).start()
            got = c.result(aid, wait_s=30.0)
            assert got is not None and got.value == "late"

        async def main() -> Any:
            async with AsyncClient(service.url, retries=0) as c:
                aid = await c.submit(endpoint="gate", payload="later")
                return await c.result(aid, wait_s=5.0)

        gate.clear()
        threading.Timer(1.0, gate.set).start()
        got = asyncio.run(main())
        assert got is not None and got.value == "later"


@pytest.mark.parametrize("bad", [float("nan"), float("inf")])
def test_a_body_with_a_number_json_cannot_carry_is_refused_naming_its_field(bad: float) -> None:
    """httpx encodes strict JSON and refused such a body with "Out of range float values
    are not JSON compliant", naming no field: a caller with a NaN deep in a payload had to
    search for it. Both clients name the field now; nothing is sent (no service listens)."""
    payload = {"rows": [1.0, {"score": bad}]}
    with Client("http://127.0.0.1:9", retries=0) as c, pytest.raises(ValueError) as sync:
        c.submit(endpoint="echo", payload=payload)

    async def main() -> ValueError:
        async with AsyncClient("http://127.0.0.1:9", retries=0) as c:
            with pytest.raises(ValueError) as info:
                await c.submit(endpoint="echo", payload=payload)
            return info.value

    for err in (sync.value, asyncio.run(main())):
        assert "'payload.rows[1].score'" in str(err) and repr(bad) in str(err), err
        assert "nothing was sent" in str(err), err


@pytest.mark.parametrize("bad", [float("nan"), -1, -0.5, True, "5", None])
def test_result_refuses_a_wait_that_is_not_seconds_before_sending(bad: object) -> None:
    """``result(id, wait_s=nan)`` (or -1) was sent as ``?wait=nan`` and failed with the
    service's "query 'wait'" 400, naming no argument of the call (``True`` waited 1 s, a
    string raised a ``TypeError`` from the client's arithmetic). A ``ValueError`` naming
    ``wait_s`` now comes before anything is sent."""
    got, requests = both([], lambda c: c.result("a1", wait_s=bad))
    assert got[0] is ValueError and "wait_s" in got[1] and repr(bad) in got[1], got
    assert requests == []


@pytest.mark.parametrize("bad", ["", None, 7])
@pytest.mark.parametrize(
    "call",
    ["result", "state", "cancel", "close_trajectory", "recreate_trajectory"],
)
def test_an_id_that_is_not_a_nonempty_string_is_refused_before_sending(
    call: str, bad: object
) -> None:
    """An empty id made the path ``/v1/actions/`` (the service's 404 "no route", naming
    nothing of the call), and one that was not a string a ``TypeError`` from ``quote``
    ("quote_from_bytes() expected bytes"). A ``ValueError`` naming ``id`` now comes first."""
    got, requests = both([], lambda c: getattr(c, call)(bad))
    assert got[0] is ValueError and "id" in got[1] and repr(bad) in got[1], got
    assert requests == []


@pytest.mark.parametrize("bad", [0, -1, True, 2.5, "8"])
def test_an_async_client_refuses_a_connection_bound_that_is_not_a_positive_count(
    bad: object,
) -> None:
    """``AsyncClient(max_connections=0)`` was taken: httpx's pool then never lent a
    connection and, with no pool time-out, every call waited forever (a bounded wait here
    stands for it). A ``ValueError`` naming ``max_connections`` now comes at once."""

    async def main() -> Any:
        client = AsyncClient("http://127.0.0.1:9", retries=0, max_connections=bad)  # type: ignore[arg-type]
        async with client as c:
            return await asyncio.wait_for(c.status(), timeout=5.0)

    with pytest.raises(ValueError, match="max_connections"):
        asyncio.run(main())


def test_an_empty_id_given_to_submit_or_run_is_refused_not_replaced(svc: ServiceThread) -> None:
    """``submit(id="")`` made an id up (``id or ...``), as if none was given: the caller's
    own id was silently another, and its later ``result("")`` found nothing. An empty id is
    sent as given, and the service's 400 names the field."""
    with Client(svc.url, retries=0) as c:
        for call in (c.submit, c.run):
            with pytest.raises(ServiceError) as info:
                call(endpoint="echo", payload=1, id="")
            assert info.value.status == 400 and "id" in info.value.message, info.value

    async def main() -> ServiceError:
        async with AsyncClient(svc.url, retries=0) as c:
            with pytest.raises(ServiceError) as info:
                await c.submit(endpoint="echo", payload=1, id="")
            return info.value

    assert asyncio.run(main()).status == 400


@pytest.mark.parametrize("bad", ["tök", "a\nb", "a\x00b", "a\x7fb", 5])
def test_a_client_refuses_a_token_no_header_can_carry(bad: object) -> None:
    """A token that is not ASCII raised "'ascii' codec can't encode character" from httpx,
    naming no argument; one with a control character (a newline) was taken, and every call
    then failed in httpx's header check as a transport error, retried ``retries`` times,
    naming nothing. A ``ValueError`` naming ``token`` now comes at once."""
    for make in (Client, AsyncClient):
        with pytest.raises(ValueError, match="token") as info:
            make("http://mock", token=bad)  # type: ignore[arg-type]
        assert repr(bad) not in str(info.value)  # (a secret is not shown)


@pytest.mark.parametrize("bad", ["127.0.0.1:8765", "localhost:8765", "ftp://x", "", "http://", 5])
def test_a_client_refuses_a_base_url_that_is_no_http_address(bad: object) -> None:
    """``Client("localhost:8765")`` was taken: every call then failed with httpx's
    ``UnsupportedProtocol`` (a transport error), retried ``retries`` times with back-off
    (about 13 s at the default 8) before it was raised, naming no argument. A ``ValueError``
    naming ``base_url`` now comes at once."""
    for make in (Client, AsyncClient):
        with pytest.raises(ValueError, match="base_url"):
            make(bad)  # type: ignore[arg-type]
