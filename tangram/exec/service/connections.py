"""Bounds on the service's connections, so that slow or idle clients cannot hold it forever.

- ``header_timeout_s``: a connection must send a request's headers within this time of
  opening (or of its previous answer); otherwise it is closed. aiohttp's keep-alive timer
  does exactly this (it closes a connection still waiting for a request's headers), so it is
  set to this value; an idle keep-alive connection closes after it too.
- ``body_timeout_s``: a body must arrive within this time of its headers (``body.read_json``
  answers 408 and closes the connection).
- ``max_connections``: at most this many connections are open at once; one more is answered
  429 ``overloaded`` (the clients retry it) and closed.

``GuardedSite`` is a TCP site that applies the bound when a connection is accepted.
"""

from __future__ import annotations

import asyncio
import json
from dataclasses import dataclass
from typing import Any

from aiohttp import web

from tangram.exec.runtime.errors import Overloaded
from tangram.exec.service.schema import error_doc

#: How long a refused connection may take to send its request's headers before the answer.
REFUSAL_WAIT_S = 1.0
#: The most bytes read (and dropped) from a refused connection.
REFUSAL_READ_BYTES = 64 * 1024
#: How long aiohttp keeps reading (and dropping) the rest of a body it did not read.
LINGER_S = 2.0


@dataclass(frozen=True)
class ConnectionLimits:
    """Time-outs for reading requests and the bound on open connections (module doc)."""

    header_timeout_s: float = 15.0
    body_timeout_s: float = 60.0
    max_connections: int = 1024

    def __post_init__(self) -> None:
        for name in ("header_timeout_s", "body_timeout_s"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int | float) or not value > 0:
                raise ValueError(f"{name} must be a positive number of seconds, got {value!r}")
        count = self.max_connections
        if isinstance(count, bool) or not isinstance(count, int) or count < 1:
            raise ValueError(f"max_connections must be a positive integer, got {count!r}")

    def handler_kwargs(self) -> dict[str, Any]:
        """The settings of aiohttp's connection handlers that carry these limits (access log
        off): the runner's, and ``GuardedSite``'s for the handlers it makes."""
        return {
            "access_log": None,
            "keepalive_timeout": self.header_timeout_s,
            "lingering_time": LINGER_S,
        }


def refusal_bytes(max_connections: int) -> bytes:
    """The whole HTTP answer to a connection beyond the bound."""
    doc = error_doc(
        Overloaded.code,
        f"the service has {max_connections} connections open (its --max-connections); retry later",
        retryable=True,
    )
    body = json.dumps(doc).encode()
    head = (
        f"HTTP/1.1 {Overloaded.http_status} Too Many Requests\r\n"
        "Content-Type: application/json\r\n"
        "Retry-After: 1\r\nX-Retry-After-S: 1.000\r\n"
        f"Content-Length: {len(body)}\r\nConnection: close\r\n\r\n"
    )
    return head.encode() + body


class Refusal(asyncio.Protocol):
    """A connection beyond the bound: read its headers (at most ``REFUSAL_WAIT_S``), answer
    429 and close. Waiting for the headers lets the client read the answer instead of a reset."""

    def __init__(self, answer: bytes) -> None:
        self.answer = answer
        self.seen = b""
        self.transport: asyncio.Transport | None = None
        self.timer: asyncio.TimerHandle | None = None

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        assert isinstance(transport, asyncio.Transport)
        self.transport = transport
        self.timer = asyncio.get_running_loop().call_later(REFUSAL_WAIT_S, self.finish)

    def data_received(self, data: bytes) -> None:
        self.seen = (self.seen + data)[-REFUSAL_READ_BYTES:]
        if b"\r\n\r\n" in self.seen or len(self.seen) >= REFUSAL_READ_BYTES:
            self.finish()

    def eof_received(self) -> bool:
        self.finish()
        return False

    def connection_lost(self, exc: BaseException | None) -> None:
        if self.timer is not None:
            self.timer.cancel()
        self.transport = None

    def finish(self) -> None:
        transport, self.transport = self.transport, None
        if self.timer is not None:
            self.timer.cancel()
        if transport is not None and not transport.is_closing():
            transport.write(self.answer)
            transport.close()


class ErrorDocHandler(web.RequestHandler):
    """aiohttp's connection handler, whose own error answers (a malformed request line or
    header, which never reaches the application) are the service's error document too."""

    def handle_error(
        self,
        request: web.BaseRequest,
        status: int = 500,
        exc: BaseException | None = None,
        message: str | None = None,
    ) -> web.StreamResponse:
        plain = super().handle_error(request, status, exc, message)  # logs; may raise
        text = message or getattr(plain, "text", None) or f"HTTP {status}"
        code = "bad_request" if status == 400 else "internal" if status == 500 else f"http_{status}"
        answer = web.json_response(error_doc(code, text.strip()), status=status)
        answer.force_close()
        return answer


class GuardedSite(web.BaseSite):
    """A TCP site whose connections beyond ``max_connections`` are refused (``Refusal``) and
    whose connection handlers answer malformed requests with the error document."""

    def __init__(
        self, runner: web.BaseRunner, host: str, port: int, limits: ConnectionLimits
    ) -> None:
        super().__init__(runner, backlog=4096)
        self.host, self.requested_port, self.limits = host, port, limits
        self.answer = refusal_bytes(limits.max_connections)
        self.handler_kwargs = limits.handler_kwargs()
        self.refused = 0

    @property
    def port(self) -> int:
        server = self._server
        if server is not None and server.sockets:
            return int(server.sockets[0].getsockname()[1])
        return self.requested_port

    @property
    def name(self) -> str:
        host = f"[{self.host}]" if ":" in self.host else self.host
        return f"http://{host}:{self.port}"

    async def start(self) -> None:
        await super().start()
        loop = asyncio.get_running_loop()
        self._server = await loop.create_server(
            self._protocol, self.host, self.requested_port, backlog=4096, reuse_address=True
        )

    def _protocol(self) -> asyncio.BaseProtocol:
        server = self._runner.server
        assert server is not None
        if len(server.connections) >= self.limits.max_connections:
            self.refused += 1
            return Refusal(self.answer)
        loop = asyncio.get_running_loop()
        return ErrorDocHandler(server, loop=loop, **self.handler_kwargs)
