"""The API executor: a registry of callables per endpoint, called when the scheduler allows.

Concurrency and rate quotas are the scheduler core's (the cluster's ``[[api]]`` entries); this
module only carries out the calls. A callable takes the action's payload and returns a
JSON-able value; it may be a coroutine function (awaited on the loop) or a plain function
(run on a small thread pool). ``builtin_endpoints()`` gives the demo endpoints ``echo`` and
``search``; ``http_endpoint(url)`` forwards payloads to an HTTP service.
As the runtime's ``Executor`` for ``ApiWork``: a call runs as a task on the loop, so a deadline
or a client's cancel cancels it.
"""

from __future__ import annotations

import asyncio
import contextlib
import inspect
import json
import logging
import random
import time
from collections.abc import Awaitable, Callable, Mapping
from concurrent.futures import ThreadPoolExecutor
from typing import Any, ClassVar

from tangram.core.decision import Start
from tangram.core.resources import ClusterSpec, ResourceKind
from tangram.exec.runtime.errors import BadRequest, ExecutorMissing
from tangram.exec.runtime.executor import Admission, OnDeadline
from tangram.exec.runtime.records import ActionSpec, ApiWork, ErrorInfo, is_finite_number
from tangram.exec.runtime.result import ExecResult, NeverRan
from tangram.exec.runtime.trajectories import Trajectory

ApiCallable = Callable[[Any], Awaitable[Any]] | Callable[[Any], Any]

#: Threads for plain (blocking) endpoint callables: calls beyond wait for one, and a call
#: whose action is cancelled while it waits never runs.
API_THREADS = 16

log = logging.getLogger(__name__)


class ApiExecutor:
    """Calls registered endpoint callables; exceptions become the action's error."""

    work: ClassVar[type] = ApiWork
    on_deadline: ClassVar[OnDeadline] = OnDeadline.CANCEL
    deadline_note: ClassVar[str] = "; the call was cancelled"
    cancellable: ClassVar[bool] = True

    def __init__(self, endpoints: Mapping[str, ApiCallable] | None = None) -> None:
        self._endpoints: dict[str, ApiCallable] = dict(endpoints or {})
        self._pool: ThreadPoolExecutor | None = None
        #: Calls of cancelled actions whose threads are still waited for (``_on_thread``).
        self._outliving: set[asyncio.Future[Any]] = set()
        #: Set by ``aclose``: a cancelled call's thread is no longer waited for.
        self._closing = False

    def register(self, name: str, fn: ApiCallable) -> None:
        if not callable(fn):
            raise TypeError(f"endpoint {name!r}: expected a callable, got {type(fn).__name__}")
        self._endpoints[name] = fn

    def endpoints(self) -> tuple[str, ...]:
        return tuple(sorted(self._endpoints))

    def __contains__(self, name: str) -> bool:
        return name in self._endpoints

    def admit(
        self, spec: ActionSpec, trajectory: Trajectory | None, cluster: ClusterSpec
    ) -> Admission:
        """An endpoint the cluster gives a quota and this executor a callable; one slot."""
        work: ApiWork = spec.work  # type: ignore[assignment]  # the registry's key
        declared = {a.name for a in cluster.apis}
        if work.endpoint not in declared:
            raise BadRequest(
                f"unknown API endpoint {work.endpoint!r}; the cluster has {sorted(declared)}"
            )
        if work.endpoint not in self._endpoints:
            raise ExecutorMissing(
                f"API endpoint {work.endpoint!r} has a quota in the cluster but no callable "
                f"registered; registered: {list(self.endpoints())}"
            )
        return Admission(ResourceKind.API, 1)

    async def execute(
        self, work: ApiWork, start: Start, *, trajectory: str, time_left_s: float
    ) -> ExecResult:
        """Call the endpoint with the payload (the core granted one of its slots). One started
        with no time left ends at once with the time-out, uncalled: the deadline's cancel
        cannot stop a plain callable once it runs on a worker thread."""
        if time_left_s <= 0:
            return ExecResult(
                "timeout", error=ErrorInfo("timeout", "the time-out passed at its start"), ran=False
            )
        return await self.run(work.endpoint, work.payload)

    async def run(self, endpoint: str, payload: Any) -> ExecResult:
        fn = self._endpoints[endpoint]
        t0 = time.perf_counter()
        try:
            if inspect.iscoroutinefunction(fn) or inspect.iscoroutinefunction(
                getattr(fn, "__call__", None)  # noqa: B004 - callable objects with async __call__
            ):
                value = await fn(payload)
            else:
                value = await self._on_thread(fn, payload)
                if inspect.isawaitable(value):
                    value = await value
        except asyncio.CancelledError:
            raise
        except Exception as exc:  # noqa: BLE001 - the endpoint's failure is this action's error
            return ExecResult(
                "error",
                None,
                ErrorInfo(
                    "endpoint_failed", f"endpoint {endpoint!r} raised {type(exc).__name__}: {exc}"
                ),
                exec_s=time.perf_counter() - t0,
            )
        return ExecResult("result", value, None, exec_s=time.perf_counter() - t0)

    async def aclose(self) -> None:
        """Stop waiting for the threads of cancelled calls (their tasks end: nothing waits
        for them past the runtime), and close what the endpoints hold open (an
        ``HttpEndpoint``'s connections): each callable with an ``aclose`` coroutine method,
        on the loop, before ``shutdown``."""
        self._closing = True  # (a task cancelled by the shutdown may not have seen it yet)
        for call in list(self._outliving):
            call.cancel()  # (the thread runs on; only the wait ends)
        for name, fn in self._endpoints.items():
            aclose = getattr(fn, "aclose", None)
            if aclose is None or not inspect.iscoroutinefunction(aclose):
                continue
            try:
                await aclose()
            except Exception:
                log.exception("closing API endpoint %r failed", name)

    async def _on_thread(self, fn: Callable[[Any], Any], payload: Any) -> Any:
        """``fn(payload)`` on the pool. A cancel (a deadline, a client's cancel) of a call
        still waiting for a thread takes it off the pool: it never runs. One running cannot
        be stopped, so it is waited for before the cancel goes on: the action's task, and
        with it its slot of the endpoint's quota, lasts until the call returns (the runtime
        ends the action at its grace meanwhile). A second cancel, or ``aclose`` (the
        runtime's shutdown), stops the wait."""
        if self._pool is None:
            self._pool = ThreadPoolExecutor(API_THREADS, thread_name_prefix="tangram-api")
        queued = self._pool.submit(fn, payload)
        call = asyncio.wrap_future(queued)
        try:
            return await asyncio.shield(call)
        except asyncio.CancelledError:
            # Still waiting for a thread (every one busy): taken off the pool, it never runs.
            # Waited for, it ran once a thread was free, after its client had been told it
            # timed out (or was cancelled), its effects seen by no one.
            if queued.cancel():  # (taken off the pool: the runtime ends it as never run)
                raise NeverRan("the call was still waiting for a thread") from None
            if self._closing:
                raise
            self._outliving.add(call)
            try:
                with contextlib.suppress(Exception):  # (its value or error is discarded)
                    await call
            finally:
                self._outliving.discard(call)
            raise

    def shutdown(self) -> None:
        if self._pool is not None:
            self._pool.shutdown(wait=False, cancel_futures=True)


# -- built-in endpoints ------------------------------------------------------------------------


async def echo(payload: Any) -> Any:
    """Returns its payload: a no-op endpoint for tests and the service benchmark."""
    return payload


#: The most hits ``search`` returns, and the longest query it takes (characters): it makes
#: its hits on the event loop, each titled with the query, so a payload's k = 10**9 (or a
#: 64 MiB query) stalled every client's work and took the service's memory.
SEARCH_K_MAX = 1000
SEARCH_QUERY_MAX = 4096


async def search(payload: Any) -> Any:
    """A stand-in for a web-search API: waits ``latency_s`` (default 50 ms) and returns
    ``k`` fake hits for ``query``. Lets the API quota path run without a network."""
    body = payload if isinstance(payload, Mapping) else {"query": payload}
    latency = float(body.get("latency_s", 0.05))
    if not 0 <= latency <= 60:
        raise ValueError(f"latency_s must be in [0, 60], got {latency}")
    query = str(body.get("query", ""))
    if len(query) > SEARCH_QUERY_MAX:
        raise ValueError(f"query must be at most {SEARCH_QUERY_MAX} characters, got {len(query)}")
    k = int(body.get("k", 3))
    if not 0 <= k <= SEARCH_K_MAX:
        raise ValueError(f"k must be in [0, {SEARCH_K_MAX}], got {k}")
    await asyncio.sleep(latency)
    rng = random.Random(query)
    return {
        "query": query,
        "hits": [{"title": f"{query} #{i}", "score": round(rng.random(), 4)} for i in range(k)],
    }


def builtin_endpoints() -> dict[str, ApiCallable]:
    return {"echo": echo, "search": search}


class EndpointError(RuntimeError):
    """An ``HttpEndpoint`` call that failed, said without the endpoint's URL."""


#: The largest answer an ``HttpEndpoint`` reads (bytes): its value is kept as the action's
#: outcome (in memory for polling, in the journal, in the trace), so it is bounded as a CPU
#: action's output is.
MAX_ANSWER_BYTES = 16 << 20


class HttpEndpoint:
    """An endpoint that POSTs the payload as JSON to ``url`` and returns the JSON answer.

    Its ``httpx.AsyncClient`` (made at the first call, on the runtime's loop) keeps its
    connections alive between calls; ``aclose`` closes them (the ``ApiExecutor`` does, as
    the runtime closes), so none is left open past the runtime. A failure is an
    ``EndpointError`` that never quotes the URL (the operator's secrets may be in it).
    The answer is read up to ``max_answer_bytes`` (more fails the call, the rest unread:
    read whole, an endpoint answering without end took the service's memory)."""

    def __init__(
        self, url: str, *, timeout_s: float = 60.0, max_answer_bytes: int = MAX_ANSWER_BYTES
    ) -> None:
        if not is_finite_number(timeout_s) or not timeout_s > 0:
            # (given to httpx as is: NaN or a negative one failed every call)
            raise ValueError(f"timeout_s must be a finite number > 0, got {timeout_s!r}")
        if (
            isinstance(max_answer_bytes, bool)
            or not isinstance(max_answer_bytes, int)
            or max_answer_bytes < 1
        ):
            raise ValueError(f"max_answer_bytes must be an integer >= 1, got {max_answer_bytes!r}")
        self.url, self.timeout_s, self.max_answer_bytes = url, timeout_s, max_answer_bytes
        self._client: Any = None  # httpx.AsyncClient, made at the first call

    async def __call__(self, payload: Any) -> Any:
        import httpx
        import idna  # (httpx's: its host names)

        if self._client is None:
            self._client = httpx.AsyncClient(timeout=self.timeout_s)
        try:
            async with self._client.stream("POST", self.url, json=payload) as response:
                if response.is_error:  # (httpx's own message quotes the URL)
                    raise EndpointError(
                        f"the endpoint answered HTTP {response.status_code} "
                        f"{response.reason_phrase}"
                    )
                body = await self._read(response)
        except httpx.HTTPError as exc:
            raise EndpointError(f"{type(exc).__name__}: {self._hidden(str(exc))}") from None
        except (httpx.InvalidURL, idna.IDNAError) as exc:
            # Not httpx's request errors: their messages quote parts of the URL (its host,
            # its port) that ``_hidden`` cannot find, so only the kind is said. (A payload
            # JSON cannot hold, a TypeError or ValueError, goes on with its own message.)
            raise EndpointError(
                f"{type(exc).__name__}: the endpoint's URL could not be used (the operator's "
                "configuration; its message is not shown, as it may quote the URL)"
            ) from None
        try:
            return json.loads(body)
        except ValueError as exc:  # (json's own words name neither the answer nor its type)
            kind = response.headers.get("content-type", "no content type")
            raise EndpointError(
                f"the endpoint's answer is not JSON ({kind[:100]}, {len(body)} bytes): {exc}"
            ) from None

    async def _read(self, response: Any) -> bytes:
        """The answer's body, ``EndpointError`` once it passes ``max_answer_bytes`` (the
        rest is not read: the connection is dropped with the response)."""
        limit, chunks, size = self.max_answer_bytes, [], 0
        async for chunk in response.aiter_bytes():
            size += len(chunk)
            if size > limit:
                raise EndpointError(
                    f"the endpoint's answer is more than {limit:,} bytes (max_answer_bytes)"
                )
            chunks.append(chunk)
        return b"".join(chunks)

    def _hidden(self, text: str) -> str:
        """``text`` without the endpoint's URL: it may hold the operator's credentials
        (``user:token@``) or keys (``?api_key=``), and an error's message goes to clients."""
        import httpx

        try:
            shown_as = {self.url, str(httpx.URL(self.url))}
        except Exception:  # noqa: BLE001 - a URL httpx cannot parse: as the operator wrote it
            shown_as = {self.url}
        for shown in shown_as:
            text = text.replace(shown, "<the endpoint's URL>")
        return text

    async def aclose(self) -> None:
        """Close the client and its connections (a later call opens a new one)."""
        client, self._client = self._client, None
        if client is not None:
            await client.aclose()


def http_endpoint(
    url: str, *, timeout_s: float = 60.0, max_answer_bytes: int = MAX_ANSWER_BYTES
) -> ApiCallable:
    """An endpoint that POSTs the payload as JSON to ``url`` (``HttpEndpoint``)."""
    return HttpEndpoint(url, timeout_s=timeout_s, max_answer_bytes=max_answer_bytes)
