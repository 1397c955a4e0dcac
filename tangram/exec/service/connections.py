"""Applying ``limits.ConnectionLimits`` to the service's connections, so that slow or idle
clients cannot hold it forever.

The header time-out is aiohttp's keep-alive timer (``ConnectionLimits.handler_kwargs``), the
body time-out ``body.read_json``'s; ``GuardedSite`` is a TCP site that refuses a connection
beyond ``max_connections`` when it is accepted (``Refusal``: 429 ``overloaded``, then closed)
and whose connection handlers (``ErrorDocHandler``) answer malformed requests with the
service's error document.
"""

from __future__ import annotations

import asyncio
import json

from aiohttp import web

from tangram.exec.runtime.errors import Overloaded
from tangram.exec.service.limits import ConnectionLimits
from tangram.exec.service.schema import error_doc

#: How long a refused connection may take to send its request's headers before the answer.
REFUSAL_WAIT_S = 1.0
#: The most bytes read (and dropped) from a refused connection.
REFUSAL_READ_BYTES = 64 * 1024


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
