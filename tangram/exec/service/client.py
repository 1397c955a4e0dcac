"""Python clients of a Tangram service: ``AsyncClient`` (httpx, asyncio) and ``Client`` (sync).

Both speak the HTTP API of ``docs/live.md`` and return the runtime's own records
(``Outcome``, with ``value`` holding the JSON result; ``CommandResult`` for CPU work).
They are two thin transports over one implementation: ``calls`` builds every request and
reads every answer, ``retry`` decides what is retried and when; a client only sends calls
and sleeps pauses, with ``httpx.AsyncClient`` or ``httpx.Client``.

Retries are safe by construction: the client gives every action (and every trajectory it
opens) an id before sending it, so a submission repeated after a lost answer or a 429 is the
same action to the service (never a second run), an open the same trajectory (never a
second container). Requests refused by admission control (429) or while the node is full (503,
retryable) are retried after the service's ``Retry-After`` hint, ``retries`` times; other
errors raise ``ServiceError`` carrying the service's ``code`` and message.
"""

from __future__ import annotations

import asyncio
import math
import time
from pathlib import Path
from typing import Any, TypeVar

import httpx

from tangram.exec.runtime.records import Outcome
from tangram.exec.service import calls
from tangram.exec.service.calls import Operation, action_body, steps
from tangram.exec.service.retry import Call, OverloadedError, ServiceError, unsendable

__all__ = ["AsyncClient", "Client", "OverloadedError", "ServiceError", "action_body"]

T = TypeVar("T")


def _headers(token: str | None) -> dict[str, str]:
    """The token's header, or ``ValueError`` naming ``token`` if no header can carry it: one
    not ASCII raised httpx's "'ascii' codec can't encode", naming nothing, and one with a
    control character (a newline) failed every call as a transport error, retried."""
    if token is not None and (
        not isinstance(token, str)
        or not token.isascii()
        or any(ord(ch) < 0x20 or ord(ch) == 0x7F for ch in token)
    ):
        # (Its value is not shown: a secret belongs in no error message or log.)
        raise ValueError(
            "token must be ASCII text without control characters; the "
            f"{type(token).__name__} given is not (its value is not shown)"
        )
    return {"Authorization": f"Bearer {token}"} if token else {}


def _base_url(base_url: str) -> str:
    """``base_url`` without its trailing '/', or ``ValueError`` naming it unless it is an
    ``http://`` or ``https://`` address with a host: "localhost:8765" was taken, and every
    call then failed with httpx's ``UnsupportedProtocol``, a transport error, retried with
    back-off (about 13 s at the default ``retries``) before it was raised."""
    try:
        parsed = httpx.URL(base_url) if isinstance(base_url, str) else None
    except httpx.InvalidURL:
        parsed = None
    if parsed is None or parsed.scheme not in ("http", "https") or not parsed.host:
        raise ValueError(
            f"base_url must be an http:// or https:// address (http://HOST:PORT), not {base_url!r}"
        )
    return base_url.rstrip("/")


def _timeout(max_wait_s: float) -> httpx.Timeout:
    """The read time-out: ``max_wait_s`` (seconds > 0; ``math.inf``: no limit) plus a margin
    for the answer."""
    if (
        isinstance(max_wait_s, bool)
        or not isinstance(max_wait_s, (int, float))
        or math.isnan(max_wait_s)
        or max_wait_s <= 0
    ):
        raise ValueError(f"max_wait_s must be a number of seconds > 0, not {max_wait_s!r}")
    read = max_wait_s + 60.0 if math.isfinite(max_wait_s) else None
    return httpx.Timeout(connect=30.0, read=read, write=60.0, pool=None)


def _retries(retries: int) -> int:
    """``retries``, a count >= 0, or ``ValueError`` naming it: -1 ran no attempt at all (every
    call raised ``RuntimeError('unreachable')``, naming nothing), and ``True`` was 1."""
    if isinstance(retries, bool) or not isinstance(retries, int) or retries < 0:
        raise ValueError(f"retries must be an integer >= 0, not {retries!r}")
    return retries


def _max_connections(max_connections: int) -> int:
    """``max_connections``, a count > 0, or ``ValueError`` naming it: 0 was taken, and
    httpx's pool then lent no connection, every call waiting forever (no pool time-out)."""
    if (
        isinstance(max_connections, bool)
        or not isinstance(max_connections, int)
        or max_connections < 1
    ):
        raise ValueError(f"max_connections must be an integer > 0, not {max_connections!r}")
    return max_connections


def _documented(cls: type[T]) -> type[T]:
    """Give each public method without a docstring its operation's (``calls.NAME``)."""
    for name, method in vars(cls).items():
        op = getattr(calls, name, None)
        if callable(method) and not name.startswith("_") and op and not method.__doc__:
            method.__doc__ = op.__doc__
    return cls


@_documented
class AsyncClient:
    """Asynchronous client: ``async with AsyncClient(url, token=...) as c: await c.run(...)``."""

    def __init__(
        self,
        base_url: str,
        *,
        token: str | None = None,
        retries: int = 8,
        max_wait_s: float = 300.0,
        max_connections: int = 256,
        transport: httpx.AsyncBaseTransport | None = None,
    ) -> None:
        self.retries, self.max_wait_s = _retries(retries), max_wait_s
        self._http = httpx.AsyncClient(
            base_url=_base_url(base_url),
            headers=_headers(token),
            timeout=_timeout(max_wait_s),
            limits=httpx.Limits(
                max_connections=_max_connections(max_connections), max_keepalive_connections=64
            ),
            transport=transport,
        )

    async def __aenter__(self) -> AsyncClient:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.aclose()

    async def aclose(self) -> None:
        await self._http.aclose()

    async def _send(self, call: Call) -> httpx.Response:
        try:
            return await self._http.request(
                call.method, call.path, json=call.body, params=call.params
            )
        except ValueError as exc:  # (the body could not be encoded: nothing was sent)
            raise unsendable(call, exc) from None

    async def _do(self, operation: Operation[T]) -> T:
        """Run an operation: send its calls, sleep its pauses."""
        plan = steps(operation, self.retries)
        try:
            step = next(plan)
            while True:
                if isinstance(step, Call):
                    try:
                        response = await self._send(step)
                    except httpx.TransportError as exc:
                        step = plan.throw(exc)
                        continue
                    step = plan.send(response)
                else:
                    await asyncio.sleep(step.seconds)
                    step = plan.send(None)
        except StopIteration as done:
            return done.value

    async def open_trajectory(
        self,
        id: str | None = None,
        *,
        memory_gb: float | None = None,
        image: str | None = None,
        wait_s: float | None = None,
    ) -> dict[str, Any]:
        op = calls.open_trajectory(id, memory_gb=memory_gb, image=image, wait_s=wait_s)
        return await self._do(op)

    async def close_trajectory(self, id: str) -> dict[str, Any]:
        return await self._do(calls.close_trajectory(id))

    async def recreate_trajectory(self, id: str) -> dict[str, Any]:
        return await self._do(calls.recreate_trajectory(id))

    async def trajectories(self) -> list[dict[str, Any]]:
        return await self._do(calls.trajectories())

    async def submit(self, **action: Any) -> str:
        return await self._do(calls.submit(action))

    async def run(self, **action: Any) -> Outcome:
        return await self._do(calls.run(action, self.max_wait_s))

    async def result(self, id: str, wait_s: float = 0.0) -> Outcome | None:
        return await self._do(calls.result(id, wait_s, self.max_wait_s))

    async def state(self, id: str) -> str:
        return await self._do(calls.state(id))

    async def cancel(self, id: str) -> Outcome:
        return await self._do(calls.cancel(id))

    async def submissions_done(self, done: bool = True) -> dict[str, Any]:
        return await self._do(calls.submissions_done(done))

    async def status(self) -> dict[str, Any]:
        return await self._do(calls.status())

    async def metrics(self) -> str:
        return await self._do(calls.metrics())

    async def trace_text(self) -> str:
        return await self._do(calls.trace_text())

    async def write_trace(self, path: str | Path) -> Path:
        return await self._do(calls.write_trace(path))

    async def save_trace(self) -> dict[str, Any]:
        return await self._do(calls.save_trace())

    async def run_code(self, code: str, language: str = "python", **fields: Any) -> dict:
        return await self._do(calls.run_code(code, language, **fields))


@_documented
class Client:
    """Synchronous client with the same methods as ``AsyncClient`` (``with Client(url) as c``)."""

    def __init__(
        self,
        base_url: str,
        *,
        token: str | None = None,
        retries: int = 8,
        max_wait_s: float = 300.0,
        transport: httpx.BaseTransport | None = None,
    ) -> None:
        self.retries, self.max_wait_s = _retries(retries), max_wait_s
        self._http = httpx.Client(
            base_url=_base_url(base_url),
            headers=_headers(token),
            timeout=_timeout(max_wait_s),
            transport=transport,
        )

    def __enter__(self) -> Client:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def close(self) -> None:
        self._http.close()

    def _send(self, call: Call) -> httpx.Response:
        try:
            return self._http.request(call.method, call.path, json=call.body, params=call.params)
        except ValueError as exc:  # (the body could not be encoded: nothing was sent)
            raise unsendable(call, exc) from None

    def _do(self, operation: Operation[T]) -> T:
        """Run an operation: send its calls, sleep its pauses."""
        plan = steps(operation, self.retries)
        try:
            step = next(plan)
            while True:
                if isinstance(step, Call):
                    try:
                        response = self._send(step)
                    except httpx.TransportError as exc:
                        step = plan.throw(exc)
                        continue
                    step = plan.send(response)
                else:
                    time.sleep(step.seconds)
                    step = plan.send(None)
        except StopIteration as done:
            return done.value

    def open_trajectory(
        self,
        id: str | None = None,
        *,
        memory_gb: float | None = None,
        image: str | None = None,
        wait_s: float | None = None,
    ) -> dict[str, Any]:
        return self._do(calls.open_trajectory(id, memory_gb=memory_gb, image=image, wait_s=wait_s))

    def close_trajectory(self, id: str) -> dict[str, Any]:
        return self._do(calls.close_trajectory(id))

    def recreate_trajectory(self, id: str) -> dict[str, Any]:
        return self._do(calls.recreate_trajectory(id))

    def trajectories(self) -> list[dict[str, Any]]:
        return self._do(calls.trajectories())

    def submit(self, **action: Any) -> str:
        return self._do(calls.submit(action))

    def run(self, **action: Any) -> Outcome:
        return self._do(calls.run(action, self.max_wait_s))

    def result(self, id: str, wait_s: float = 0.0) -> Outcome | None:
        return self._do(calls.result(id, wait_s, self.max_wait_s))

    def state(self, id: str) -> str:
        return self._do(calls.state(id))

    def cancel(self, id: str) -> Outcome:
        return self._do(calls.cancel(id))

    def submissions_done(self, done: bool = True) -> dict[str, Any]:
        return self._do(calls.submissions_done(done))

    def status(self) -> dict[str, Any]:
        return self._do(calls.status())

    def metrics(self) -> str:
        return self._do(calls.metrics())

    def trace_text(self) -> str:
        return self._do(calls.trace_text())

    def write_trace(self, path: str | Path) -> Path:
        return self._do(calls.write_trace(path))

    def save_trace(self) -> dict[str, Any]:
        return self._do(calls.save_trace())

    def run_code(self, code: str, language: str = "python", **fields: Any) -> dict:
        return self._do(calls.run_code(code, language, **fields))
