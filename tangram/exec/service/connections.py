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
import logging
import re
from collections.abc import Callable
from typing import Any
from urllib.parse import unquote

from aiohttp import web, web_protocol

from tangram.exec.runtime.errors import Overloaded
from tangram.exec.service.body import MalformedBody, json_response
from tangram.exec.service.codec import dumps
from tangram.exec.service.limits import ConnectionLimits
from tangram.exec.service.openai_routes import OPENAI_PATHS
from tangram.exec.service.openai_schema import OpenAiError
from tangram.exec.service.sandbox_fusion import refusal_doc, sandbox_error
from tangram.exec.service.schema import error_doc

log = logging.getLogger(__name__)

#: aiohttp's queued answer to a request its parser failed on (private: absent from another
#: aiohttp, ``ErrorDocHandler`` leaves a broken body to aiohttp, as it did, rather than fail
#: the service's import).
_ERR_INFO: type | None = getattr(web_protocol, "_ErrInfo", None)

#: SandboxFusion's route: its refusals are answered in its shape.
RUN_CODE_PATH = "/run_code"

#: How long a refused connection may take to send its request's headers before the answer.
REFUSAL_WAIT_S = 1.0
#: The most bytes of a refused connection's request head that are kept (to find its path).
REFUSAL_READ_BYTES = 64 * 1024
#: After the answer, how long at least a refused connection may go on sending its request
#: (its body) before it is closed (``drain_time``: the body time-out if longer), and how many
#: bytes of it are read and dropped at most (a body the service would take: 64 MiB, and its
#: head). Closing with unread bytes resets the connection, and a client still sending its
#: body then reads a reset, not the 429.
REFUSAL_LINGER_S = 5.0
REFUSAL_DRAIN_BYTES = 64 * 1024 * 1024 + REFUSAL_READ_BYTES


def drain_time(body_timeout_s: float) -> float:
    """How long a connection answered before its request's body arrived whole may go on
    sending it (drained, then closed): the body time-out, as its request would have had,
    and at least ``REFUSAL_LINGER_S`` (a shorter one could cut a client still uploading
    at a modest rate before it reads its answer)."""
    return max(body_timeout_s, REFUSAL_LINGER_S)


def refusal_bytes(max_connections: int, path: str = "", message: str | None = None) -> bytes:
    """The whole HTTP answer to a connection beyond the bound whose request is for ``path``,
    in its route family's shape: ``/run_code`` SandboxFusion's ``SandboxError`` (with
    Tangram's error document, as its other refusals), an OpenAI-style route OpenAI's error,
    any other path (or a request line not read) Tangram's error document. ``message``:
    the refusal's, if not the service's bound's."""
    if message is None:
        message = (
            f"the service has {max_connections} connections open (its --max-connections); "
            "retry later"
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
    body = dumps(doc).encode()
    head = (
        f"HTTP/1.1 {Overloaded.http_status} Too Many Requests\r\n"
        "Content-Type: application/json\r\n"
        "Retry-After: 1\r\nX-Retry-After-S: 1.000\r\n"
        f"Content-Length: {len(body)}\r\nConnection: close\r\n\r\n"
    )
    return head.encode() + body


#: An absolute-form target's scheme and authority (RFC 9112 3.2.2: ``http://host:port``),
#: which aiohttp routes by the path after it.
_ABSOLUTE_PREFIX = re.compile(rb"^[A-Za-z][A-Za-z0-9+.-]*://[^/?#]*")


def target_path(target: bytes) -> str:
    """The path of a request target, without its query or fragment: an absolute-form
    target (``http://host/run_code``, as a proxy forwards it) is routed by its path, so its
    path, not the whole target, picks the answer's route family (it got Tangram's shape)."""
    path = _ABSOLUTE_PREFIX.sub(b"", target, count=1) if b"://" in target else target
    path = re.split(rb"[?#]", path, maxsplit=1)[0]
    # (Percent-decoded as aiohttp routes it: ``/run%5Fcode`` reaches ``/run_code``'s handler,
    # and its refusal got Tangram's shape.)
    return unquote((path or b"/").decode("latin-1"), errors="replace")


def request_path(head: bytes) -> str:
    """The path (without its query) of the request line that starts ``head``; "" if none."""
    line = head.split(b"\r\n", 1)[0].split(b" ")
    if len(line) < 2:
        return ""
    return target_path(line[1])


#: A request line (method, target, version) at a line's start; its target is group 1
#: (origin-form ``/path`` or absolute-form ``scheme://authority/path``).
_REQUEST_LINE = re.compile(
    rb"(?:^|\n)[!#$%&'*+.^_`|~0-9A-Za-z-]+ (/[^ \r\n]*|[A-Za-z][A-Za-z0-9+.-]*://[^ \r\n]*) HTTP/"
)


def last_request_path(recent: bytes) -> str:
    """The path of the last request line in ``recent`` (a connection's latest bytes); ""
    if none. aiohttp's parser, failing on a request's head, keeps nothing of it: the
    failing request is the last one begun, its head being the last bytes read."""
    found = list(_REQUEST_LINE.finditer(recent))
    return target_path(found[-1].group(1)) if found else ""


def error_doc_of(path: str, status: int, code: str, message: str) -> dict[str, Any]:
    """An error of a request for ``path`` the routes never saw, in its route family's
    shape: ``/run_code`` SandboxFusion's ``SandboxError`` with Tangram's document (as its
    other refusals), an OpenAI-style route OpenAI's error, any other Tangram's."""
    if path == RUN_CODE_PATH:
        return {**sandbox_error(message), **error_doc(code, message)}
    if path in OPENAI_PATHS:
        kind = "server_error" if status >= 500 else "invalid_request_error"
        return OpenAiError(message, status=status, code=code, kind=kind).doc()
    return error_doc(code, message)


class Drain(asyncio.Protocol):
    """A connection answered for good: its sending side is ended (``linger``) and what the
    client still sends (the rest of its request) is read and dropped, at most
    ``REFUSAL_DRAIN_BYTES`` for at most ``REFUSAL_LINGER_S``, until it closes too. A socket
    closed with bytes unread is reset by the kernel, and a client still writing its request
    then failed with a broken pipe or a reset, never reading the answer it was sent (a 429
    to retry on, a 400 naming what is wrong). ``on_lost``: told when the connection is gone
    (the protocol it was taken from, to forget it)."""

    def __init__(
        self,
        transport: asyncio.Transport,
        on_lost: Callable[[BaseException | None], None] | None = None,
        linger_s: float = REFUSAL_LINGER_S,
    ) -> None:
        """``linger_s``: how long it drains at most (``REFUSAL_LINGER_S`` unless told)."""
        self.transport = transport
        self.on_lost = on_lost
        self.drained = 0
        self.timer = asyncio.get_running_loop().call_later(linger_s, self.close)

    def data_received(self, data: bytes) -> None:
        self.drained += len(data)
        if self.drained >= REFUSAL_DRAIN_BYTES:
            self.close()

    def eof_received(self) -> bool:
        self.close()
        return True  # (``close`` closes it once the answer is written)

    def connection_lost(self, exc: BaseException | None) -> None:
        self.timer.cancel()
        on_lost, self.on_lost = self.on_lost, None
        if on_lost is not None:
            on_lost(exc)

    def close(self) -> None:
        self.timer.cancel()
        if not self.transport.is_closing():
            self.transport.close()


def linger(
    transport: asyncio.Transport,
    on_lost: Callable[[BaseException | None], None] | None = None,
    linger_s: float = REFUSAL_LINGER_S,
) -> Drain:
    """Hand ``transport``, whose answer is written, to a ``Drain``: its sending side ends
    once the answer is out, and it closes when the client does (or the drain's bounds:
    ``linger_s``, ``REFUSAL_DRAIN_BYTES``)."""
    drain = Drain(transport, on_lost, linger_s)
    transport.set_protocol(drain)
    transport.resume_reading()  # (aiohttp pauses a connection whose requests pile up)
    if transport.can_write_eof():
        transport.write_eof()
    else:
        drain.close()
    return drain


class Refusal(asyncio.Protocol):
    """A connection beyond the bound: read its headers (at most ``REFUSAL_WAIT_S``), answer
    429 in the shape of its path's route family (``answer``, by path), then ``linger``: the
    rest of its request is drained, so the client reads the answer instead of a reset.
    Waiting for the headers lets the client read the answer instead of a reset."""

    def __init__(
        self,
        answer: Callable[[str], bytes],
        on_gone: Callable[[Refusal], None] | None = None,
        linger_s: float = REFUSAL_LINGER_S,
    ) -> None:
        """``on_gone``: told when the connection is gone (the site, to forget it).
        ``linger_s``: how long the rest of its request may take to arrive after the answer
        (the site's body time-out, ``drain_time``)."""
        self.answer = answer
        self.on_gone = on_gone
        self.linger_s = linger_s
        self.seen = b""
        self.transport: asyncio.Transport | None = None
        self.timer: asyncio.TimerHandle | None = None
        self.drain: Drain | None = None

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        assert isinstance(transport, asyncio.Transport)
        self.transport = transport
        self.timer = asyncio.get_running_loop().call_later(REFUSAL_WAIT_S, self.finish)

    def data_received(self, data: bytes) -> None:
        # The first bytes are kept: they hold the request line, whose path picks the
        # answer's shape (the last ones, kept before, lost it when the headers and the
        # body's start came in one read).
        self.seen = (self.seen + data)[:REFUSAL_READ_BYTES]
        if b"\r\n\r\n" in self.seen or len(self.seen) >= REFUSAL_READ_BYTES:
            self.finish()

    def eof_received(self) -> bool:
        drain = self.finish()  # (the client may still read the answer)
        if drain is not None:
            drain.close()
        return True  # (closed once the answer is written)

    def connection_lost(self, exc: BaseException | None) -> None:
        if self.timer is not None:
            self.timer.cancel()
        self.transport = None
        self._gone(exc)

    def _gone(self, exc: BaseException | None = None) -> None:
        on_gone, self.on_gone = self.on_gone, None
        if on_gone is not None:
            on_gone(self)

    def finish(self) -> Drain | None:
        """Answer and drain (None if the connection is gone)."""
        transport, self.transport = self.transport, None
        if self.timer is not None:
            self.timer.cancel()
        if transport is None or transport.is_closing():
            return None
        transport.write(self.answer(request_path(self.seen)))
        self.drain = linger(transport, on_lost=self._gone, linger_s=self.linger_s)
        return self.drain

    def close(self) -> None:
        """Close the connection now (the service stops): answered first if it was not yet
        (with what of its head came), its answer written before it closes."""
        drain = self.finish() or self.drain
        if drain is not None:
            drain.close()


class ErrorDocHandler(web.RequestHandler):
    """aiohttp's connection handler, whose own error answers (a malformed request line or
    header, which never reaches the application) are the service's error document too.
    Such a connection is closed after its answer, once the rest of the request is drained
    (``linger``): closed at once, with the request's body unread, it was reset, and a client
    still sending its body failed with a reset instead of reading its 400."""

    def __init__(
        self,
        *args: Any,
        drain_s: float = REFUSAL_LINGER_S,
        site: GuardedSite | None = None,
        **kwargs: Any,
    ) -> None:
        """``drain_s``: how long the rest of a request answered before its body arrived
        whole may take to arrive (drained, then closed): the body time-out. ``site``: the
        site counting its connections per client (``GuardedSite.admit``) and per tenant
        (``hold_for_tenant``), if any."""
        super().__init__(*args, **kwargs)
        self.site = site
        #: The peer address this connection is counted under (None: not counted).
        self.peer: str | None = None
        #: The tenants this connection is counted for (``hold_for_tenant``).
        self.tenants: set[str] = set()
        self.drain_s = drain_time(drain_s)
        #: How long a client may read nothing of its answer before it is cut off.
        self.answer_timeout_s = drain_s
        #: Whether the answer being made ends the connection with a request left unread.
        self.linger_after = False
        self.drain: Drain | None = None
        #: The connection's latest bytes (at most ``REFUSAL_READ_BYTES``), where a request
        #: whose head aiohttp cannot parse finds its path (its answer's shape).
        self.recent = b""
        #: The path of the request aiohttp's parser failed on ("" if unknown).
        self.error_path = ""

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        site = self.site
        if site is not None:
            peer = _peer(transport)
            refusal = site.admit(peer)
            if refusal is not None:  # (never aiohttp's: the refusal answers it)
                assert isinstance(transport, asyncio.Transport)
                transport.set_protocol(refusal)
                refusal.connection_made(transport)
                return
            self.peer = peer
        super().connection_made(transport)

    def connection_lost(self, exc: BaseException | None) -> None:
        peer, self.peer = self.peer, None
        tenants, self.tenants = self.tenants, set()
        if self.site is not None:
            if peer is not None:
                self.site.release(peer)
            for name in tenants:
                self.site.release_tenant(name)
        super().connection_lost(exc)

    def hold_for_tenant(self, name: str) -> str | None:
        """Count this connection against tenant ``name``'s bound (once: every request of it
        on this connection after the first is free); the refusal's message if the tenant
        holds ``tenant_max_connections`` other connections already (None: held)."""
        if self.site is None or name in self.tenants:
            return None
        refusal = self.site.admit_tenant(name)
        if refusal is None:
            self.tenants.add(name)
        return refusal

    def data_received(self, data: bytes) -> None:
        if len(data) >= REFUSAL_READ_BYTES:
            self.recent = data[-REFUSAL_READ_BYTES:]
        else:
            self.recent = (self.recent + data)[-REFUSAL_READ_BYTES:]
        messages = getattr(self, "_messages", None)
        queued = len(messages) if messages is not None else 0
        super().data_received(data)
        if messages is not None and len(messages) > queued and _ERR_INFO is not None:
            if isinstance(messages[-1][0], _ERR_INFO):
                self.error_path = last_request_path(self.recent)
            self._body_broke(messages)

    def _body_broke(self, messages: Any) -> None:
        """aiohttp's parser, failing on a request's body (a malformed chunk), drops the
        body's reader without a word and queues a 400 for after that request: the handler
        reading the body waited out the body time-out (a 408 blaming a slow client, 60 s
        later), and the 400 followed as a second answer on the connection. The reader is
        given the parser's error instead (``MalformedBody``: the route answers 400 at once,
        in its shape, naming it), the queued 400 is dropped, and the connection closes
        after the answer, draining what comes meanwhile (its framing is lost)."""
        error = messages[-1][0]
        if _ERR_INFO is None or not isinstance(error, _ERR_INFO):
            return
        # The newest request's body: one queued before the error, else the one being read.
        payload = messages[-2][1] if len(messages) > 1 else None
        current = getattr(self, "_current_request", None)
        if payload is None and current is not None:
            payload = current.content
        if payload is None or payload.is_eof():
            return  # (the error is in a next request's head: aiohttp answers it)
        messages.pop()
        payload.set_exception(
            MalformedBody(f"the request body is malformed: {str(error.message).strip()}")
        )
        self.linger_after = True
        self.close()  # (no request after this one: data until its answer is dropped)

    def handle_error(
        self,
        request: web.BaseRequest,
        status: int = 500,
        exc: BaseException | None = None,
        message: str | None = None,
    ) -> web.StreamResponse:
        if status < 500:  # the client's malformed request: one line, not a stack trace
            # (aiohttp logged each at ERROR with its traceback: any client could fill the
            # service's log with them.)
            why = str(message or exc or f"HTTP {status}").strip().replace("\n", " ")
            log.info("a malformed request from %s, answered %d: %s", request.remote, status, why)
            if request.writer.output_size > 0:  # (as aiohttp: an answer is on its way)
                raise ConnectionError("an answer was sent already, the error cannot be")
            text = message or f"HTTP {status}"
        else:
            plain = super().handle_error(request, status, exc, message)  # logs; may raise
            text = message or getattr(plain, "text", None) or f"HTTP {status}"
        code = "bad_request" if status == 400 else "internal" if status == 500 else f"http_{status}"
        # A request aiohttp could not parse is "UNKNOWN /": its path is the one read last
        # (its answer was Tangram's document on every path, which SandboxFusion's and
        # OpenAI's clients do not read).
        path = self.error_path if request.method == "UNKNOWN" else request.path
        doc = error_doc_of(path, status, code, text.strip())
        answer = json_response(doc, status=status)
        answer.force_close()
        # (A body aiohttp still parses is drained by aiohttp itself; one it cannot parse,
        # the request's being malformed, is left on the socket.)
        self.linger_after = request.content.is_eof()
        return answer

    async def finish_response(
        self, request: web.BaseRequest, resp: web.StreamResponse, start_time: float | None
    ) -> tuple[web.StreamResponse, bool]:
        if not self.linger_after and not request.content.is_eof() and not resp.prepared:
            # (The connection ends after this answer, drained below: the answer says so,
            # where it said keep-alive and a client sent its next request to a drain.)
            resp.force_close()
        done = await self._answered(request, resp, start_time)
        transport = self.transport
        reset = done[1] if isinstance(done, tuple) else bool(done)  # (older aiohttp: reset)
        # An answer made before the request's body arrived whole (a wrong token's 401, a
        # 413, a tenant's 429): aiohttp read and dropped the rest for its lingering time
        # (2 s) only, then closed with the rest unread, so the kernel reset the connection
        # and a client still uploading (a large body at a modest rate) never read the answer.
        # The rest is drained for as long as a body may take (at most 64 MiB), then closed.
        unread = not self.linger_after and not request.content.is_eof()
        if (self.linger_after or unread) and not reset and transport is not None:
            assert isinstance(transport, asyncio.Transport)
            if not transport.is_closing():
                self.transport = None  # (aiohttp's closing of it is the drain's now)
                self.drain = linger(
                    transport,
                    on_lost=self.connection_lost,
                    # (a 408's client, too slow already, gets the short drain)
                    linger_s=self.drain_s if unread and resp.status != 408 else REFUSAL_LINGER_S,
                )
                # Nothing more of the connection is aiohttp's to read: not the body left
                # (a broken one raised its error at aiohttp's own lingering read of it).
                self.force_close()
        return done

    async def _answered(
        self, request: web.BaseRequest, resp: web.StreamResponse, start_time: float | None
    ) -> Any:
        """aiohttp's ``finish_response`` (the answer written), watched: a client that reads
        nothing of its answer for ``answer_timeout_s`` (the body time-out) is cut off. An
        answer waits in the connection's buffer until its client reads it, with no time
        limit in aiohttp: a client that never read held its connection, and the answer's
        memory (a 20-MB result), for good; a thousand such took the service's memory."""
        sending = asyncio.ensure_future(super().finish_response(request, resp, start_time))
        left = None
        while True:
            try:
                done, _ = await asyncio.wait({sending}, timeout=self.answer_timeout_s)
            except asyncio.CancelledError:  # (the service stops: the write stops with it)
                sending.cancel()
                raise
            if done:
                return sending.result()
            transport = self.transport
            unread = transport.get_write_buffer_size() if transport is not None else 0
            if transport is None or unread == 0 or unread != left:
                left = unread  # (it reads: wait on)
                continue
            log.info(
                "%s %s: the client read nothing of its answer for %g s (the service's "
                "--body-timeout-s), %d bytes unread; its connection is closed",
                request.method,
                request.path,
                self.answer_timeout_s,
                unread,
            )
            transport.abort()  # (the write waiting on it fails: aiohttp's answer ends)
            return await sending

    async def shutdown(self, timeout: float | None = 15.0) -> None:
        if self.drain is not None:
            self.drain.close()
        await super().shutdown(timeout)


def _peer(transport: asyncio.BaseTransport) -> str:
    """The peer's address (its host: each connection has a port of its own)."""
    name = transport.get_extra_info("peername")
    if isinstance(name, tuple) and name:
        return str(name[0])
    return str(name)


class GuardedSite(web.BaseSite):
    """A TCP site whose connections beyond ``max_connections`` are refused (``Refusal``) and
    whose connection handlers answer malformed requests with the error document."""

    def __init__(
        self,
        runner: web.BaseRunner,
        host: str,
        port: int,
        limits: ConnectionLimits,
        on_refused: Callable[[], None] | None = None,
    ) -> None:
        """``on_refused`` is called at each refusal (the metrics count them)."""
        super().__init__(runner, backlog=4096)
        self.on_refused = on_refused
        self.host, self.requested_port, self.limits = host, port, limits
        #: The refusal of each route family, made once (by ``_refusal``'s key).
        self.answers = {
            key: refusal_bytes(limits.max_connections, key) for key in ("", RUN_CODE_PATH)
        }
        self.answers["openai"] = refusal_bytes(limits.max_connections, "/v1/completions")
        each = limits.max_connections_per_client
        message = (
            f"this client has {each} connections open (the service's "
            "--max-connections-per-client); retry later"
        )
        #: The refusal of a client at its own bound, by ``_refusal``'s key.
        self.client_answers = {
            key: refusal_bytes(limits.max_connections, path, message)
            for key, path in (("", ""), (RUN_CODE_PATH, RUN_CODE_PATH), ("openai", "/pooling"))
        }
        #: Connections open per peer address (only with ``max_connections_per_client``).
        self.per_client: dict[str, int] = {}
        #: Connections serving each tenant (only with ``tenant_max_connections``).
        self.per_tenant: dict[str, int] = {}
        self.handler_kwargs = limits.handler_kwargs()
        self.refused = 0
        #: The refused connections still open (answering or draining): closed when the site
        #: stops. aiohttp does not know them, and left alone each stayed open after the
        #: service stopped, its drain's timer never run once the loop had stopped.
        self.refusals: set[Refusal] = set()

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

    async def stop(self) -> None:
        await super().stop()  # (no connection is accepted after)
        for refusal in list(self.refusals):
            refusal.close()
        self.refusals.clear()

    @staticmethod
    def _family(path: str) -> str:
        if path in OPENAI_PATHS:
            return "openai"
        return RUN_CODE_PATH if path == RUN_CODE_PATH else ""

    def _refusal(self, path: str) -> bytes:
        """The refusal of ``path``'s route family."""
        return self.answers[self._family(path)]

    def _client_refusal(self, path: str) -> bytes:
        """The refusal of ``path``'s route family to a client at its own bound."""
        return self.client_answers[self._family(path)]

    def _refuse(self, answer: Callable[[str], bytes]) -> Refusal:
        self.refused += 1
        if self.on_refused is not None:
            self.on_refused()
        # Drained as long as a body may take (a fixed 5 s cut a refused client still
        # uploading its body, the kernel reset the connection, and it never read its 429),
        # but only while fewer refusals than --max-connections are open: refusals are not
        # bounded in number, and a flood of them trickling bodies held a socket each for the
        # body time-out. Past that, the old short drain (``REFUSAL_LINGER_S``).
        long_drains = len(self.refusals) < self.limits.max_connections
        linger_s = drain_time(self.limits.body_timeout_s) if long_drains else REFUSAL_LINGER_S
        refusal = Refusal(answer, on_gone=self.refusals.discard, linger_s=linger_s)
        self.refusals.add(refusal)
        return refusal

    def admit(self, peer: str) -> Refusal | None:
        """Count a new connection from ``peer``; a ``Refusal`` for it instead if ``peer``
        has ``max_connections_per_client`` open already (one client took them all)."""
        each = self.limits.max_connections_per_client
        if each is None:
            return None
        count = self.per_client.get(peer, 0)
        if count >= each:
            return self._refuse(self._client_refusal)
        self.per_client[peer] = count + 1
        return None

    def admit_tenant(self, name: str) -> str | None:
        """Count one more connection serving tenant ``name``; the refusal's message instead
        if it has ``tenant_max_connections`` already (one tenant, from many addresses, took
        them all: ``max_connections_per_client`` counts addresses, not tokens)."""
        each = self.limits.tenant_max_connections
        if each is None:
            return None
        count = self.per_tenant.get(name, 0)
        if count >= each:
            return (
                f"tenant {name!r} has {count} connections open (the service's "
                f"--tenant-max-connections is {each}); nothing was accepted and this connection is "
                "closed: retry later, on one of its open connections or once one closes"
            )
        self.per_tenant[name] = count + 1
        return None

    def release_tenant(self, name: str) -> None:
        """A connection ``admit_tenant`` counted is gone."""
        count = self.per_tenant.get(name, 0) - 1
        if count > 0:
            self.per_tenant[name] = count
        else:
            self.per_tenant.pop(name, None)

    def release(self, peer: str) -> None:
        """A connection ``admit`` counted is gone."""
        count = self.per_client.get(peer, 0) - 1
        if count > 0:
            self.per_client[peer] = count
        else:
            self.per_client.pop(peer, None)

    def _protocol(self) -> asyncio.BaseProtocol:
        server = self._runner.server
        assert server is not None
        if len(server.connections) >= self.limits.max_connections:
            return self._refuse(self._refusal)
        loop = asyncio.get_running_loop()
        counts = (self.limits.max_connections_per_client, self.limits.tenant_max_connections)
        site = self if any(c is not None for c in counts) else None
        return ErrorDocHandler(
            server,
            loop=loop,
            drain_s=self.limits.body_timeout_s,
            site=site,
            **self.handler_kwargs,
        )
