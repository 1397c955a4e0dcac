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
from collections.abc import Callable

from aiohttp import web

from tangram.exec.runtime.errors import Overloaded
from tangram.exec.service.limits import ConnectionLimits
from tangram.exec.service.openai_routes import OPENAI_PATHS
from tangram.exec.service.openai_schema import OpenAiError
from tangram.exec.service.sandbox_fusion import refusal_doc
from tangram.exec.service.schema import error_doc

#: SandboxFusion's route: its refusals are answered in its shape.
RUN_CODE_PATH = "/run_code"

#: How long a refused connection may take to send its request's headers before the answer.
REFUSAL_WAIT_S = 1.0
#: The most bytes of a refused connection's request head that are kept (to find its path).
REFUSAL_READ_BYTES = 64 * 1024
#: After the answer, how long a refused connection may go on sending its request (its body)
#: before it is closed, and how many bytes of it are read and dropped at most (a body the
#: service would take: 64 MiB, and its head). Closing with unread bytes resets the
#: connection, and a client still sending its body then reads a reset, not the 429.
REFUSAL_LINGER_S = 5.0
REFUSAL_DRAIN_BYTES = 64 * 1024 * 1024 + REFUSAL_READ_BYTES


def refusal_bytes(max_connections: int, path: str = "") -> bytes:
    """The whole HTTP answer to a connection beyond the bound whose request is for ``path``,
    in its route family's shape: ``/run_code`` SandboxFusion's ``SandboxError`` (with
    Tangram's error document, as its other refusals), an OpenAI-style route OpenAI's error,
    any other path (or a request line not read) Tangram's error document."""
    message = (
        f"the service has {max_connections} connections open (its --max-connections); retry later"
    )
    refused = Overloaded(message, retry_after_s=1.0)
    if path == RUN_CODE_PATH:
        doc = refusal_doc(refused)
    elif path in OPENAI_PATHS:
        doc = OpenAiError(
            message, status=refused.http_status, code=refused.code, kind="rate_limit_error"
        ).doc()
    else:
        doc = error_doc(refused.code, message, retryable=True)
    body = json.dumps(doc).encode()
    head = (
        f"HTTP/1.1 {Overloaded.http_status} Too Many Requests\r\n"
        "Content-Type: application/json\r\n"
        "Retry-After: 1\r\nX-Retry-After-S: 1.000\r\n"
        f"Content-Length: {len(body)}\r\nConnection: close\r\n\r\n"
    )
    return head.encode() + body


def request_path(head: bytes) -> str:
    """The path (without its query) of the request line that starts ``head``; "" if none."""
    line = head.split(b"\r\n", 1)[0].split(b" ")
    if len(line) < 2:
        return ""
    return line[1].split(b"?", 1)[0].decode("latin-1")


class Refusal(asyncio.Protocol):
    """A connection beyond the bound: read its headers (at most ``REFUSAL_WAIT_S``), answer
    429 in the shape of its path's route family (``answer``, by path), then end its sending
    side and read and drop what the client still sends (its body: at most
    ``REFUSAL_DRAIN_BYTES``, for at most ``REFUSAL_LINGER_S``) until it closes too. Waiting
    for the headers, and draining the body, let the client read the answer instead of a
    reset (a socket closed with bytes unread is reset, and a client still writing its body
    then failed with a broken pipe or a reset, never reading the 429 it should retry on)."""

    def __init__(self, answer: Callable[[str], bytes]) -> None:
        self.answer = answer
        self.seen = b""
        self.transport: asyncio.Transport | None = None
        self.timer: asyncio.TimerHandle | None = None
        #: Whether the answer was sent (the connection is then being drained).
        self.answered = False
        self.drained = 0

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        assert isinstance(transport, asyncio.Transport)
        self.transport = transport
        self.timer = asyncio.get_running_loop().call_later(REFUSAL_WAIT_S, self.finish)

    def data_received(self, data: bytes) -> None:
        if self.answered:
            self.drained += len(data)
            if self.drained >= REFUSAL_DRAIN_BYTES:
                self.close()
            return
        # The first bytes are kept: they hold the request line, whose path picks the
        # answer's shape (the last ones, kept before, lost it when the headers and the
        # body's start came in one read).
        self.seen = (self.seen + data)[:REFUSAL_READ_BYTES]
        if b"\r\n\r\n" in self.seen or len(self.seen) >= REFUSAL_READ_BYTES:
            self.finish()

    def eof_received(self) -> bool:
        self.finish()  # (the answer, if not sent yet: the client may still read it)
        self.close()
        return True  # (``close`` closes it once the answer is written)

    def connection_lost(self, exc: BaseException | None) -> None:
        if self.timer is not None:
            self.timer.cancel()
        self.transport = None

    def finish(self) -> None:
        """Answer, end the sending side and drain what comes until the client closes (or
        the linger passes)."""
        transport = self.transport
        if self.timer is not None:
            self.timer.cancel()
        if self.answered or transport is None or transport.is_closing():
            return
        self.answered = True
        transport.write(self.answer(request_path(self.seen)))
        if not transport.can_write_eof():
            self.close()
            return
        transport.write_eof()
        self.timer = asyncio.get_running_loop().call_later(REFUSAL_LINGER_S, self.close)

    def close(self) -> None:
        transport, self.transport = self.transport, None
        if self.timer is not None:
            self.timer.cancel()
        if transport is not None and not transport.is_closing():
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
        #: The refusal of each route family, made once (by ``_refusal``'s key).
        self.answers = {
            key: refusal_bytes(limits.max_connections, key) for key in ("", RUN_CODE_PATH)
        }
        self.answers["openai"] = refusal_bytes(limits.max_connections, "/v1/completions")
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

    def _refusal(self, path: str) -> bytes:
        """The refusal of ``path``'s route family."""
        if path in OPENAI_PATHS:
            return self.answers["openai"]
        return self.answers[RUN_CODE_PATH if path == RUN_CODE_PATH else ""]

    def _protocol(self) -> asyncio.BaseProtocol:
        server = self._runner.server
        assert server is not None
        if len(server.connections) >= self.limits.max_connections:
            self.refused += 1
            return Refusal(self._refusal)
        loop = asyncio.get_running_loop()
        return ErrorDocHandler(server, loop=loop, **self.handler_kwargs)
