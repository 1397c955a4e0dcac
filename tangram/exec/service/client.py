"""Python clients of a Tangram service: ``AsyncClient`` (httpx, asyncio) and ``Client`` (sync).

Both speak the HTTP API of ``docs/live.md`` and return the runtime's own records
(``Outcome``, with ``value`` holding the JSON result; ``CommandResult`` for CPU work).

Retries are safe by construction: the client gives every action an id before sending it, so
a submission repeated after a lost answer or a 429 is the same action to the service (never
a second run). Requests refused by admission control (429) or while the node is full (503,
retryable) are retried after the service's ``Retry-After`` hint, ``retries`` times; other
errors raise ``ServiceError`` carrying the service's ``code`` and message.
"""

from __future__ import annotations

import asyncio
import random
import time
import uuid
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx

from tangram.exec.runtime.records import Outcome
from tangram.exec.service.schema import outcome_from_doc


class ServiceError(RuntimeError):
    """The service answered with an error: ``status`` (HTTP), ``code``, ``message``."""

    def __init__(
        self,
        status: int,
        code: str,
        message: str,
        retryable: bool = False,
        retry_after_s: float | None = None,
    ) -> None:
        super().__init__(f"HTTP {status} {code}: {message}")
        self.status, self.code, self.message = status, code, message
        self.retryable, self.retry_after_s = retryable, retry_after_s


class OverloadedError(ServiceError):
    """HTTP 429: admission control refused the request (still so after the retries)."""


@dataclass(frozen=True)
class _Call:
    """One request: method, path, JSON body, query, and whether repeating it is safe."""

    method: str
    path: str
    body: Any = None
    params: Mapping[str, str] | None = None
    idempotent: bool = True


def action_body(
    *,
    command: str | list[str] | None = None,
    service: str | None = None,
    inputs: Any = None,
    endpoint: str | None = None,
    payload: Any = None,
    trajectory: str | None = None,
    id: str | None = None,
    max_units: int | None = None,
    t1_s: float | None = None,
    serial_fraction: float | None = None,
    curve: Mapping[str, Any] | None = None,
    timeout_s: float | None = None,
    task: str | None = None,
    kind: str | None = None,
    env: Mapping[str, str] | None = None,
    wait: bool | float | None = None,
) -> dict[str, Any]:
    """The JSON of ``POST /v1/actions`` (an id is made up when none is given)."""
    given = [x is not None for x in (command, service, endpoint)]
    if sum(given) != 1:
        raise ValueError("give exactly one of command (cpu), service (gpu) or endpoint (api)")
    body: dict[str, Any] = {"id": id or f"c-{uuid.uuid4().hex}"}
    if command is not None:
        body["command"] = command
        if env:
            body["env"] = dict(env)
    elif service is not None:
        body.update(service=service, inputs=inputs)
    else:
        body.update(endpoint=endpoint, payload=payload)
    optional = {
        "trajectory": trajectory,
        "max_units": max_units,
        "t1_s": t1_s,
        "serial_fraction": serial_fraction,
        "curve": dict(curve) if curve is not None else None,
        "timeout_s": timeout_s,
        "task": task,
        "kind": kind,
        "wait": wait,
    }
    body.update({k: v for k, v in optional.items() if v is not None})
    return body


def _error_of(response: httpx.Response) -> ServiceError:
    try:
        err = response.json()["error"]
        code, message, retryable = err["code"], err["message"], bool(err.get("retryable"))
    except Exception:  # noqa: BLE001 - not our JSON (a proxy's page)
        code, message, retryable = f"http_{response.status_code}", response.text[:500], False
    hint = response.headers.get("X-Retry-After-S") or response.headers.get("Retry-After")
    retry_after = float(hint) if hint else None
    cls = OverloadedError if response.status_code == 429 else ServiceError
    return cls(response.status_code, code, message, retryable, retry_after)


def _backoff(error: ServiceError | None, attempt: int) -> float:
    base = error.retry_after_s if error and error.retry_after_s else 0.05 * 2**attempt
    return min(10.0, base) * (0.5 + random.random())


def _retry_worthy(response: httpx.Response, error: ServiceError) -> bool:
    """429 (admission control) and retryable 503s (node full now, shutting down)."""
    return response.status_code == 429 or (response.status_code == 503 and error.retryable)


def _headers(token: str | None) -> dict[str, str]:
    return {"Authorization": f"Bearer {token}"} if token else {}


def _timeout(max_wait_s: float) -> httpx.Timeout:
    return httpx.Timeout(connect=30.0, read=max_wait_s + 60.0, write=60.0, pool=None)


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
        self.retries, self.max_wait_s = retries, max_wait_s
        self._http = httpx.AsyncClient(
            base_url=base_url.rstrip("/"),
            headers=_headers(token),
            timeout=_timeout(max_wait_s),
            limits=httpx.Limits(max_connections=max_connections, max_keepalive_connections=64),
            transport=transport,
        )

    async def __aenter__(self) -> AsyncClient:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.aclose()

    async def aclose(self) -> None:
        await self._http.aclose()

    async def _do(self, call: _Call, ok: tuple[int, ...] = (200, 201, 202)) -> httpx.Response:
        error: ServiceError | None = None
        for attempt in range(self.retries + 1):
            try:
                response = await self._http.request(
                    call.method, call.path, json=call.body, params=call.params
                )
            except httpx.TransportError:
                if not call.idempotent or attempt == self.retries:
                    raise
                await asyncio.sleep(_backoff(None, attempt))
                continue
            if response.status_code in ok:
                return response
            error = _error_of(response)
            if not _retry_worthy(response, error) or attempt == self.retries:
                raise error
            await asyncio.sleep(_backoff(error, attempt))
        raise error or RuntimeError("unreachable")

    # -- trajectories ------------------------------------------------------------------------

    async def open_trajectory(
        self,
        id: str | None = None,
        *,
        memory_gb: float | None = None,
        image: str | None = None,
        wait_s: float | None = None,
    ) -> dict[str, Any]:
        body = {"id": id, "memory_gb": memory_gb, "image": image, "wait_s": wait_s}
        call = _Call("POST", "/v1/trajectories", {k: v for k, v in body.items() if v is not None})
        return (await self._do(call)).json()

    async def close_trajectory(self, id: str) -> dict[str, Any]:
        return (await self._do(_Call("DELETE", f"/v1/trajectories/{id}", idempotent=False))).json()

    async def recreate_trajectory(self, id: str) -> dict[str, Any]:
        """A fresh container for a trajectory whose container died."""
        call = _Call("POST", f"/v1/trajectories/{id}/recreate", idempotent=False)
        return (await self._do(call)).json()

    async def trajectories(self) -> list[dict[str, Any]]:
        return (await self._do(_Call("GET", "/v1/trajectories"))).json()["trajectories"]

    # -- actions -----------------------------------------------------------------------------

    async def submit(self, **action: Any) -> str:
        """Submit without waiting; returns the action's id. Fields as ``action_body``."""
        body = action_body(**{**action, "wait": None})
        return (await self._do(_Call("POST", "/v1/actions", body))).json()["id"]

    async def run(self, **action: Any) -> Outcome:
        """Submit and wait for the outcome (polling past the service's ``max_wait_s``)."""
        body = action_body(**{**action, "wait": True})
        doc = (await self._do(_Call("POST", "/v1/actions", body))).json()
        while doc["outcome"] is None:
            doc = (await self._do(self._poll(body["id"], self.max_wait_s))).json()
        return outcome_from_doc(doc["outcome"])

    async def result(self, id: str, wait_s: float = 0.0) -> Outcome | None:
        """The outcome if it came within ``wait_s`` seconds, else None."""
        doc = (await self._do(self._poll(id, wait_s))).json()
        return outcome_from_doc(doc["outcome"]) if doc["outcome"] else None

    async def state(self, id: str) -> str:
        return (await self._do(self._poll(id, 0.0))).json()["state"]

    async def cancel(self, id: str) -> Outcome:
        doc = (await self._do(_Call("DELETE", f"/v1/actions/{id}"))).json()
        return outcome_from_doc(doc["outcome"])

    @staticmethod
    def _poll(id: str, wait_s: float) -> _Call:
        return _Call("GET", f"/v1/actions/{id}", params={"wait": f"{wait_s:g}"})

    # -- service -----------------------------------------------------------------------------

    async def status(self) -> dict[str, Any]:
        return (await self._do(_Call("GET", "/v1/status"))).json()

    async def metrics(self) -> str:
        return (await self._do(_Call("GET", "/metrics"))).text

    async def trace_text(self) -> str:
        """The trace of the run so far (JSONL, format v1)."""
        return (await self._do(_Call("GET", "/v1/trace"))).text

    async def write_trace(self, path: str | Path) -> Path:
        """Download the trace and write it to ``path`` here (JSONL)."""
        path = Path(path)
        path.write_text(await self.trace_text())
        return path

    async def save_trace(self) -> dict[str, Any]:
        """Ask the service to write its trace to its own ``--trace`` path."""
        return (await self._do(_Call("POST", "/v1/trace"))).json()

    async def run_code(self, code: str, language: str = "python", **fields: Any) -> dict:
        """SandboxFusion's ``/run_code`` (fields: run_timeout, stdin, files, ...)."""
        body = {"code": code, "language": language, **fields}
        return (await self._do(_Call("POST", "/run_code", body, idempotent=False))).json()


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
        self.retries, self.max_wait_s = retries, max_wait_s
        self._http = httpx.Client(
            base_url=base_url.rstrip("/"),
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

    def _do(self, call: _Call, ok: tuple[int, ...] = (200, 201, 202)) -> httpx.Response:
        error: ServiceError | None = None
        for attempt in range(self.retries + 1):
            try:
                response = self._http.request(
                    call.method, call.path, json=call.body, params=call.params
                )
            except httpx.TransportError:
                if not call.idempotent or attempt == self.retries:
                    raise
                time.sleep(_backoff(None, attempt))
                continue
            if response.status_code in ok:
                return response
            error = _error_of(response)
            if not _retry_worthy(response, error) or attempt == self.retries:
                raise error
            time.sleep(_backoff(error, attempt))
        raise error or RuntimeError("unreachable")

    def open_trajectory(
        self,
        id: str | None = None,
        *,
        memory_gb: float | None = None,
        image: str | None = None,
        wait_s: float | None = None,
    ) -> dict[str, Any]:
        body = {"id": id, "memory_gb": memory_gb, "image": image, "wait_s": wait_s}
        call = _Call("POST", "/v1/trajectories", {k: v for k, v in body.items() if v is not None})
        return self._do(call).json()

    def close_trajectory(self, id: str) -> dict[str, Any]:
        return self._do(_Call("DELETE", f"/v1/trajectories/{id}", idempotent=False)).json()

    def recreate_trajectory(self, id: str) -> dict[str, Any]:
        return self._do(_Call("POST", f"/v1/trajectories/{id}/recreate", idempotent=False)).json()

    def trajectories(self) -> list[dict[str, Any]]:
        return self._do(_Call("GET", "/v1/trajectories")).json()["trajectories"]

    def submit(self, **action: Any) -> str:
        body = action_body(**{**action, "wait": None})
        return self._do(_Call("POST", "/v1/actions", body)).json()["id"]

    def run(self, **action: Any) -> Outcome:
        body = action_body(**{**action, "wait": True})
        doc = self._do(_Call("POST", "/v1/actions", body)).json()
        while doc["outcome"] is None:
            doc = self._do(AsyncClient._poll(body["id"], self.max_wait_s)).json()
        return outcome_from_doc(doc["outcome"])

    def result(self, id: str, wait_s: float = 0.0) -> Outcome | None:
        doc = self._do(AsyncClient._poll(id, wait_s)).json()
        return outcome_from_doc(doc["outcome"]) if doc["outcome"] else None

    def state(self, id: str) -> str:
        return self._do(AsyncClient._poll(id, 0.0)).json()["state"]

    def cancel(self, id: str) -> Outcome:
        return outcome_from_doc(self._do(_Call("DELETE", f"/v1/actions/{id}")).json()["outcome"])

    def status(self) -> dict[str, Any]:
        return self._do(_Call("GET", "/v1/status")).json()

    def metrics(self) -> str:
        return self._do(_Call("GET", "/metrics")).text

    def trace_text(self) -> str:
        return self._do(_Call("GET", "/v1/trace")).text

    def write_trace(self, path: str | Path) -> Path:
        path = Path(path)
        path.write_text(self.trace_text())
        return path

    def save_trace(self) -> dict[str, Any]:
        return self._do(_Call("POST", "/v1/trace")).json()

    def run_code(self, code: str, language: str = "python", **fields: Any) -> dict:
        body = {"code": code, "language": language, **fields}
        return self._do(_Call("POST", "/run_code", body, idempotent=False)).json()
