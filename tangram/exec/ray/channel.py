"""A direct, authenticated connection from the scheduler actor to a node agent, for the calls
on every action's path (``run_cpu``, ``call_gpu``, container open and close).

Measured here, an actor call from the scheduler actor to an agent and back cost 2-3 ms more
than the single-node runtime's hand-off to a thread (Ray builds a task, sends it over gRPC,
queues it on the agent's thread pool, and relays the reply through its I/O thread into the
event loop). Ray stays the control plane (it places the agents, reports their deaths, and
carries pings, stats and shutdown); only these calls go over one persistent TCP connection
per agent: length-prefixed pickled messages, requests and replies matched by number, many in
flight at once.

The agent listens on its Ray node's address (the one Ray itself uses) on a port the kernel
picks. The connection is authenticated both ways before anything is unpickled: each side
sends a random nonce and must answer the other's with HMAC-SHA256 under a 32-byte key the
scheduler actor makes at its start and gives its agents through Ray. A peer without the key
gets nothing and can send nothing. If the connection closes (the agent's process died: the
kernel closes its sockets), the calls in flight fail with ``ChannelClosed`` and the fleet
loses the node, as when Ray reports the agent dead.
"""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import hmac
import itertools
import logging
import os
import pickle
import socket
import struct
import threading
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from typing import Any

log = logging.getLogger(__name__)

#: The calls an agent answers over its channel (everything else goes through Ray).
DIRECT_METHODS = frozenset({"run_cpu", "call_gpu", "open", "close", "recreate"})
#: A frame's header: the length of the pickled payload that follows, the call's number, and
#: (replies) whether it is an answer or the agent's exception. The number is outside the
#: pickle, so a payload that does not unpickle fails its own call, not the connection.
_HEADER = struct.Struct("!QQB")
_NONCE = 32
#: Seconds a peer has to complete the handshake.
HANDSHAKE_S = 10.0


class ChannelClosed(Exception):
    """The connection to the agent closed (its process died, or it was shut)."""


def new_key() -> bytes:
    """A fresh key for a scheduler actor's channels."""
    return os.urandom(32)


def _mac(key: bytes, role: bytes, nonce: bytes) -> bytes:
    return hmac.new(key, role + nonce, hashlib.sha256).digest()


def _dumps(obj: Any) -> bytes:
    """Pickled with the standard pickler; cloudpickle (Ray's) for what it cannot take."""
    try:
        return pickle.dumps(obj, protocol=5)
    except (pickle.PicklingError, AttributeError, TypeError):
        from ray import cloudpickle

        return cloudpickle.dumps(obj, protocol=5)


# ---------------------------------------------------------------------------- agent side
class AgentServer:
    """Serves ``handler(method, args, waited_s)`` to authenticated connections, each call on a
    thread of its own pool (calls block: a CPU action runs for its command's whole time);
    ``waited_s``: how long the call waited for a thread since its frame was read (its time-out
    runs meanwhile: ``NodeAgent._direct_call``)."""

    def __init__(
        self,
        handler: Callable[[str, tuple[Any, ...], float], Any],
        host: str,
        key: bytes,
        threads: int,
    ) -> None:
        self.handler, self.key = handler, key
        self._listener = socket.create_server((host, 0), backlog=16)
        self.address: tuple[str, int] = (host, self._listener.getsockname()[1])
        self._pool = ThreadPoolExecutor(threads, thread_name_prefix="tangram-direct")
        self._closed = False
        #: The connections being served (``close`` shuts them: their threads then end).
        self._conns: set[socket.socket] = set()
        self._conns_lock = threading.Lock()
        threading.Thread(target=self._accept, name="tangram-direct-accept", daemon=True).start()

    def close(self) -> None:
        """Stop listening and close every connection (the scheduler's channel learns it at
        once); calls not yet started are dropped, running ones' answers go nowhere. A bare
        ``close`` of the listener woke neither the thread blocked in ``accept`` (it took one
        more peer) nor those reading their connections (left open until a next frame)."""
        with self._conns_lock:
            self._closed = True
            conns = list(self._conns)
        for sock in (self._listener, *conns):
            with contextlib.suppress(OSError):
                sock.shutdown(socket.SHUT_RDWR)
        with contextlib.suppress(OSError):
            self._listener.close()
        self._pool.shutdown(wait=False, cancel_futures=True)

    def _accept(self) -> None:
        while not self._closed:
            try:
                conn, _ = self._listener.accept()
            except OSError:
                return
            with self._conns_lock:
                if self._closed:
                    conn.close()
                    return
                self._conns.add(conn)
            threading.Thread(
                target=self._serve, args=(conn,), name="tangram-direct-conn", daemon=True
            ).start()

    def _serve(self, conn: socket.socket) -> None:
        """One connection: the handshake, then requests until it closes (or the server)."""
        try:
            self._serve_one(conn)
        finally:
            with self._conns_lock:
                self._conns.discard(conn)

    def _serve_one(self, conn: socket.socket) -> None:
        with conn:
            conn.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            stream = conn.makefile("rb")
            try:
                conn.settimeout(HANDSHAKE_S)
                theirs = _read_exactly(stream, _NONCE)
                ours = os.urandom(_NONCE)
                conn.sendall(ours + _mac(self.key, b"agent", theirs))
                answer = _read_exactly(stream, 32)
                if not hmac.compare_digest(answer, _mac(self.key, b"scheduler", ours)):
                    log.warning("a connection to the agent failed its handshake: closed")
                    return
                conn.settimeout(None)
            except (OSError, EOFError):
                return
            send_lock = threading.Lock()
            while not self._closed:
                try:
                    size, rid, _ = _HEADER.unpack(_read_exactly(stream, _HEADER.size))
                    payload = _read_exactly(stream, size)
                except (OSError, EOFError):
                    return
                received = time.monotonic()
                try:
                    self._pool.submit(self._answer, conn, send_lock, rid, payload, received)
                except RuntimeError:  # the pool is shut: the server closed
                    return

    def _answer(
        self, conn: socket.socket, lock: threading.Lock, rid: int, payload: bytes, received: float
    ) -> None:
        ok = False
        try:
            method, args = pickle.loads(payload)
            if method not in DIRECT_METHODS:
                raise ValueError(f"{method!r} is not a direct call")
            value, ok = self.handler(method, args, time.monotonic() - received), True
        except Exception as exc:  # noqa: BLE001 - the caller gets the agent's exception
            value = exc
        data, ok = _reply(value, ok)
        with lock, contextlib.suppress(OSError):
            conn.sendall(_HEADER.pack(len(data), rid, ok) + data)


def _reply(value: Any, ok: bool) -> tuple[bytes, bool]:
    """The pickled answer and whether it is one (not an error). An exception is sent only if it
    unpickles as well (some take arguments their pickle does not keep); one that does not, or
    an answer that does not pickle, becomes a ``RuntimeError`` naming it."""
    try:
        data = _dumps(value)
        if not ok:
            pickle.loads(data)
        return data, ok
    except Exception as exc:  # noqa: BLE001 - the caller gets an error it can read
        what = "answer" if ok else f"error ({type(value).__name__}: {value})"
        return _dumps(RuntimeError(f"the agent's {what} did not pickle: {exc}")), False


def _read_exactly(stream: Any, n: int) -> bytes:
    data = stream.read(n)
    if data is None or len(data) < n:
        raise EOFError("the connection closed")
    return data


# ---------------------------------------------------------------------------- scheduler side
class Channel:
    """The scheduler actor's end: ``send(method, args)`` returns a future of the answer."""

    def __init__(
        self,
        reader: asyncio.StreamReader,
        writer: asyncio.StreamWriter,
        on_closed: Callable[[str], None],
    ) -> None:
        self.reader, self.writer, self.on_closed = reader, writer, on_closed
        self.pending: dict[int, asyncio.Future[Any]] = {}
        self.closed: str | None = None
        self._seq = itertools.count(1)
        self._task = asyncio.get_running_loop().create_task(self._read())

    @classmethod
    async def open(
        cls, address: tuple[str, int], key: bytes, on_closed: Callable[[str], None]
    ) -> Channel:
        """Connect to an agent's ``AgentServer`` and authenticate (both ways)."""
        reader, writer = await asyncio.wait_for(asyncio.open_connection(*address), HANDSHAKE_S)
        try:
            ours = os.urandom(_NONCE)
            writer.write(ours)
            reply = await asyncio.wait_for(reader.readexactly(_NONCE + 32), HANDSHAKE_S)
            theirs, proof = reply[:_NONCE], reply[_NONCE:]
            if not hmac.compare_digest(proof, _mac(key, b"agent", ours)):
                raise ConnectionError(f"the agent at {address} failed the handshake")
            writer.write(_mac(key, b"scheduler", theirs))
            await writer.drain()
        except BaseException:
            writer.close()
            raise
        return cls(reader, writer, on_closed)

    def send(self, method: str, args: tuple[Any, ...]) -> asyncio.Future[Any]:
        """Send one call; its future ends with the answer, the agent's exception, or
        ``ChannelClosed``."""
        fut: asyncio.Future[Any] = asyncio.get_running_loop().create_future()
        if self.closed is not None:
            fut.set_exception(ChannelClosed(self.closed))
            return fut
        rid = next(self._seq)
        try:
            data = _dumps((method, args))
        except Exception as exc:  # noqa: BLE001 - arguments that do not pickle: this call fails
            fut.set_exception(exc)
            return fut
        self.pending[rid] = fut
        self.writer.write(_HEADER.pack(len(data), rid, True) + data)
        return fut

    async def _read(self) -> None:
        why = "the agent closed the connection"
        try:
            while True:
                size, rid, ok = _HEADER.unpack(await self.reader.readexactly(_HEADER.size))
                payload = await self.reader.readexactly(size)
                fut = self.pending.pop(rid, None)
                if fut is None or fut.done():
                    continue
                try:
                    value = pickle.loads(payload)
                except Exception as exc:  # noqa: BLE001 - this answer only
                    fut.set_exception(RuntimeError(f"the agent's answer did not unpickle: {exc}"))
                    continue
                if ok:
                    fut.set_result(value)
                else:
                    fut.set_exception(value)
        except asyncio.CancelledError:
            why = self.closed or "closed"
        except (asyncio.IncompleteReadError, ConnectionError, OSError) as exc:
            why = f"its connection closed ({type(exc).__name__})"
        except Exception as exc:  # noqa: BLE001 - a frame that does not unpickle
            why = f"its connection failed ({type(exc).__name__}: {exc})"
        self._end(why, notify=True)

    def close(self) -> None:
        """Close on purpose (shutdown, a node already lost): no ``on_closed``."""
        self._end("closed by the scheduler", notify=False)
        self._task.cancel()

    def _end(self, why: str, *, notify: bool) -> None:
        if self.closed is not None:
            return
        self.closed = why
        with contextlib.suppress(Exception):
            self.writer.close()
        for fut in self.pending.values():
            if not fut.done():
                fut.set_exception(ChannelClosed(why))
        self.pending.clear()
        if notify:
            self.on_closed(why)
