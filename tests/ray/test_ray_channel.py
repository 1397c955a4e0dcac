"""The direct channel from the scheduler actor to an agent (no Ray needed): answers matched
to their calls with many in flight, the agent's exceptions passed back, only the agent's
direct methods served, a peer without the key refused before anything is unpickled, and a
closed connection failing the calls in flight and telling its owner."""

from __future__ import annotations

import asyncio
import socket
import threading
import time
from typing import Any

import pytest

from tangram.exec.ray.channel import AgentServer, Channel, ChannelClosed, new_key


class TwoArgs(Exception):
    """An exception whose pickle does not keep its arguments (it does not unpickle)."""

    def __init__(self, node: str, why: str) -> None:
        super().__init__(f"{node}: {why}")


class Handler:
    """An agent's direct methods: ``run_cpu`` sleeps and echoes, ``open`` and ``close`` raise."""

    def __init__(self) -> None:
        self.calls: list[tuple[str, tuple[Any, ...]]] = []
        self.waited: list[float] = []
        self.lock = threading.Lock()

    def __call__(self, method: str, args: tuple[Any, ...], waited_s: float = 0.0) -> Any:
        with self.lock:
            self.calls.append((method, args))
            self.waited.append(waited_s)
        if method == "open":
            raise KeyError(f"no trajectory {args[0]}")
        if method == "close":
            raise TwoArgs("w1", "gone")
        delay, value = args
        time.sleep(delay)
        return {"echo": value}


def test_calls_are_answered_each_by_its_own_reply_and_errors_come_back() -> None:
    key, handler = new_key(), Handler()
    server = AgentServer(handler, "127.0.0.1", key, threads=64)
    closed: list[str] = []

    async def go() -> None:
        ch = await Channel.open(server.address, key, closed.append)
        # 40 calls in flight; later ones finish first (shorter sleeps)
        futs = [ch.send("run_cpu", ((40 - i) * 0.002, i)) for i in range(40)]
        assert await asyncio.gather(*futs) == [{"echo": i} for i in range(40)]
        with pytest.raises(KeyError, match="no trajectory t-9"):
            await ch.send("open", ("t-9", 1.0, None))
        with pytest.raises(ValueError, match="'ping' is not a direct call"):
            await ch.send("ping", ())
        # an error that would not unpickle comes back as one that does, naming it; the
        # connection stays up
        with pytest.raises(RuntimeError, match=r"error \(TwoArgs: w1: gone\) did not pickle"):
            await ch.send("close", ("t-1",))
        with pytest.raises(TypeError):  # arguments that do not pickle fail their own call
            await ch.send("run_cpu", (0.0, threading.Lock()))
        assert await ch.send("run_cpu", (0.0, "still up")) == {"echo": "still up"}
        # one call's round trip on this machine, for the record
        t0 = time.perf_counter()
        for _ in range(200):
            await ch.send("run_cpu", (0.0, 0))
        print(f"direct round trip: {(time.perf_counter() - t0) / 200 * 1e3:.3f} ms")
        ch.close()
        assert ch.closed is not None
        with pytest.raises(ChannelClosed):
            await ch.send("run_cpu", (0.0, 1))

    try:
        asyncio.run(go())
    finally:
        server.close()
    assert closed == []  # closed on purpose: nobody is told it was lost
    assert [m for m, _ in handler.calls].count("ping") == 0


def test_a_peer_without_the_key_is_refused_both_ways() -> None:
    handler = Handler()
    server = AgentServer(handler, "127.0.0.1", new_key(), threads=4)

    async def wrong_key() -> None:
        with pytest.raises(ConnectionError, match="failed the handshake"):
            await Channel.open(server.address, new_key(), lambda why: None)

    try:
        asyncio.run(wrong_key())
        # a raw peer that skips the handshake and sends a frame: never unpickled, never run
        with socket.create_connection(server.address) as raw:
            raw.sendall(b"\0" * 32)  # its "nonce"
            raw.recv(64)  # the agent's nonce and proof
            raw.sendall(b"\1" * 32)  # a wrong answer
            raw.settimeout(5)
            assert raw.recv(1) == b""  # the agent closed the connection
    finally:
        server.close()
    assert handler.calls == []


def test_a_connection_that_closes_fails_the_calls_in_flight_and_tells_its_owner() -> None:
    key, handler = new_key(), Handler()
    server = AgentServer(handler, "127.0.0.1", key, threads=4)
    closed: list[str] = []

    async def go() -> None:
        ch = await Channel.open(server.address, key, closed.append)
        slow = ch.send("run_cpu", (1.0, "never answered"))
        await asyncio.sleep(0.2)
        ch.writer.transport.abort()  # the connection breaks (as when a process dies)
        with pytest.raises(ChannelClosed):
            await asyncio.wait_for(slow, 2.0)

    try:
        asyncio.run(go())
    finally:
        server.close()
    assert len(closed) == 1 and "closed" in closed[0]


def test_closing_the_server_closes_its_connections_and_stops_listening() -> None:
    """An agent's ``shutdown`` closes its server: the scheduler's channel to it learns at
    once that it is closed (a call sent later fails instead of going unanswered), no peer
    can connect and authenticate any more, and none of its threads is left serving."""
    key, handler = new_key(), Handler()
    server = AgentServer(handler, "127.0.0.1", key, threads=4)
    closed: list[str] = []

    async def go() -> None:
        told = asyncio.Event()

        def on_closed(why: str) -> None:
            closed.append(why)
            told.set()

        ch = await Channel.open(server.address, key, on_closed)
        assert await ch.send("run_cpu", (0.0, "up")) == {"echo": "up"}
        server.close()
        await asyncio.wait_for(told.wait(), 10.0)  # (it waited for a next frame before)
        assert ch.closed is not None
        with pytest.raises(ChannelClosed):
            await asyncio.wait_for(ch.send("run_cpu", (0.0, "after")), 10.0)
        with pytest.raises(OSError):  # (the listener accepted one more peer before)
            await Channel.open(server.address, key, lambda why: None)

    try:
        asyncio.run(go())
    finally:
        server.close()
    assert len(closed) == 1
    deadline = time.monotonic() + 10.0
    while time.monotonic() < deadline and any(
        t.name.startswith("tangram-direct") for t in threading.enumerate()
    ):
        time.sleep(0.02)
    assert not [t.name for t in threading.enumerate() if t.name.startswith("tangram-direct")]
    assert [m for m, _ in handler.calls] == ["run_cpu"]


def test_closing_the_channels_at_stop_loses_no_node() -> None:
    """The scheduler's stop closes the channels on purpose, then shuts each agent down. A call
    still in flight on one (a GPU call past its deadline, which nobody waits for) failed with
    ``ChannelClosed``, which lost its node: a 'node lost' warning, an evacuation on the
    closing runtime, and the agent killed (as a lost node's is) while its shutdown ran. The
    call ends, the node stays a member to shut down."""
    from types import SimpleNamespace

    from tangram.exec.ray.fleet import Fleet, NodeLost
    from tangram.exec.ray.nodes import NodeReport

    key, handler = new_key(), Handler()
    server = AgentServer(handler, "127.0.0.1", key, threads=4)
    lost: list[str] = []

    async def go() -> None:
        fleet = Fleet()
        fleet.on_lost.append(lambda name, why: lost.append(why))

        async def serve_direct(k: bytes) -> tuple[str, int]:
            return server.address

        handle = SimpleNamespace(serve_direct=SimpleNamespace(remote=serve_direct))
        member = fleet.add(NodeReport("id-a", "a", ((0,),), 8.0, None), handle)
        await fleet.connect(member, key)
        assert member.channel is not None
        call = asyncio.ensure_future(fleet.call("a", "run_cpu", 2.0, "cut at stop"))
        for _ in range(500):  # (at most 5 s: the call reaches the agent)
            if handler.calls:
                break
            await asyncio.sleep(0.01)
        fleet.close_channels()
        with pytest.raises(NodeLost):
            await asyncio.wait_for(call, 5.0)
        assert member.alive

    try:
        asyncio.run(go())
    finally:
        server.close()
    assert lost == []


def test_an_action_that_waited_for_a_thread_on_the_agent_gets_only_the_time_it_has_left() -> None:
    """A direct call waits for a thread of the agent's pool when all run calls (more actions
    at once than threads, on a node with many cores): its action's time-out runs meanwhile.
    The agent gave it its whole time-out from when a thread took it, so one that waited past
    its deadline ran after the scheduler had ended it (a time-out). It gets what is left,
    and one with nothing left ends as a time-out that never ran."""
    from tangram.exec.ray.agent import NodeAgent

    key, handler = new_key(), Handler()
    server = AgentServer(handler, "127.0.0.1", key, threads=1)

    async def go() -> None:
        ch = await Channel.open(server.address, key, lambda why: None)
        first = ch.send("run_cpu", (0.5, "first"))  # holds the one thread
        second = ch.send("run_cpu", (0.0, "second"))
        assert await asyncio.gather(first, second) == [{"echo": "first"}, {"echo": "second"}]
        ch.close()

    try:
        asyncio.run(go())
    finally:
        server.close()
    assert handler.waited[0] < 0.3 <= 0.4 <= handler.waited[1], handler.waited
    labels = {"tangram-name": "n", "tangram-cores": "", "tangram-gpus": "0"}
    agent = NodeAgent("id-n", labels, 0.0, {})
    seen: list[float] = []
    agent.run_cpu = lambda *args: seen.append(args[3]) or "ran"  # type: ignore[method-assign]
    run = ("t", "true", (0,), 1.0, None, None, False)
    assert agent._direct_call("run_cpu", run, 0.25) == "ran" and seen == [0.75]
    late = agent._direct_call("run_cpu", run, 1.5)
    assert late.status == "timeout" and "never ran" in late.error.message and seen == [0.75]
    assert late.ran is False, "its outcome says it never started (no start time, no units)"
    out, residency, _ = agent._direct_call("call_gpu", ("reward", [1], (0,), 0.5), 0.6)
    assert out.status == "timeout" and residency == {} and out.ran is False
