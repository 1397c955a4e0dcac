"""The scheduler actor's view of its node agents: handles, liveness, and the calls in flight.

Every call to an agent goes through ``Fleet.call``: it returns the agent's answer, or a
retryable ``node_lost`` error as soon as the node is lost (its agent's process died, or it
stopped answering pings), whichever comes first, so no action waits on a dead node.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from tangram.exec.ray.channel import DIRECT_METHODS, Channel, ChannelClosed
from tangram.exec.ray.nodes import NodeReport
from tangram.exec.runtime.records import ErrorInfo
from tangram.exec.runtime.result import ExecResult

log = logging.getLogger(__name__)

#: The error code of an action whose node was lost while it ran (retryable).
NODE_LOST = "node_lost"
#: Seconds an agent has to say where its direct channel listens (``Fleet.connect``).
DIRECT_START_S = 30.0


class NodeLost(Exception):
    """A call to an agent whose node is lost (or was lost while the call ran); ``sent``:
    whether the call went out to the agent (False: the node was lost already)."""

    def __init__(self, node: str, why: str, *, sent: bool = True) -> None:
        super().__init__(f"node {node} was lost: {why}")
        self.node, self.why, self.sent = node, why, sent


def lost_result(err: NodeLost, exec_s: float = 0.0) -> ExecResult:
    """The outcome of an action whose node was lost: a retryable ``node_lost`` error; its
    ``exec_s`` the time its call was out on the node (it ran there, as far as anyone knows:
    not the runtime's overhead). One never sent (its node lost before it started: the core
    fences a lost node at once, so none is known to) did not run, and says so."""
    if not err.sent:
        message = (
            f"{err}; the action was not sent there and did not run: submit it again (a new id)"
        )
        return ExecResult("error", error=ErrorInfo(NODE_LOST, message, retryable=True), ran=False)
    message = f"{err}; the action may not have finished there: submit it again (a new id)"
    return ExecResult(
        "error", error=ErrorInfo(NODE_LOST, message, retryable=True), exec_s=max(0.0, exec_s)
    )


@dataclass(eq=False)
class Member:
    """One node agent: its handle, its report, whether it is alive, its calls in flight."""

    report: NodeReport
    handle: Any
    alive: bool = True
    why: str = ""
    pending: set[asyncio.Future[Any]] = field(default_factory=set)
    #: The direct connection for the calls on actions' paths (None: they go through Ray).
    channel: Channel | None = None


class Fleet:
    """The node agents by Tangram node name."""

    def __init__(self) -> None:
        self.by_name: dict[str, Member] = {}
        #: Called once per lost node (the scheduler actor ends its trajectories).
        self.on_lost: list[Callable[[str, str], None]] = []
        #: Called when a trajectory's container was made on a node (node, trajectory), by
        #: whichever API opened it.
        self.on_opened: list[Callable[[str, str], None]] = []
        #: The channels were closed on purpose (the scheduler stops): a closed one loses no
        #: node (``close_channels``).
        self.stopping = False

    def add(self, report: NodeReport, handle: Any) -> Member:
        member = Member(report, handle)
        self.by_name[report.name] = member
        return member

    def alive(self, name: str) -> bool:
        member = self.by_name.get(name)
        return member is not None and member.alive

    def members(self) -> list[Member]:
        return list(self.by_name.values())

    async def connect(self, member: Member, key: bytes) -> None:
        """Open the direct channel to ``member``'s agent (``channel``); on any failure its
        calls stay on Ray (slower, the same answers)."""
        name = member.report.name
        try:
            try:
                address = await asyncio.wait_for(
                    member.handle.serve_direct.remote(key), DIRECT_START_S
                )
            except TimeoutError:
                raise TimeoutError(
                    f"its agent did not say where its channel listens within {DIRECT_START_S:g} s"
                ) from None
            member.channel = await Channel.open(
                tuple(address), key, lambda why: self.lose(name, f"its agent's {why}")
            )
        except Exception as exc:  # noqa: BLE001 - Ray still reaches it
            log.warning("no direct channel to node %s (%s): its calls go through Ray", name, exc)

    async def call(self, name: str, method: str, *args: Any) -> Any:
        """``agent.method(*args)`` on node ``name``; ``NodeLost`` if the node is or gets lost.
        The calls on actions' paths take the direct channel when there is one."""
        member = self.by_name.get(name)
        if member is None or not member.alive:
            raise NodeLost(name, member.why if member else "no agent runs there", sent=False)
        import ray

        loop = asyncio.get_running_loop()
        out: asyncio.Future[Any] = loop.create_future()
        channel = member.channel
        if channel is not None and channel.closed is None and method in DIRECT_METHODS:
            inner = channel.send(method, args)
        else:  # (sending may raise: arguments Ray cannot serialize; nothing is in flight then)
            ref = getattr(member.handle, method).remote(*args)
            inner = asyncio.wrap_future(ref.future(), loop=loop)
        member.pending.add(out)

        def relay(done: asyncio.Future[Any]) -> None:
            if out.done():
                return
            exc = done.exception()
            if exc is None:
                out.set_result(done.result())
            elif self.stopping and isinstance(exc, ChannelClosed | ray.exceptions.RayActorError):
                out.set_exception(NodeLost(name, "the scheduler stopped while the call ran"))
            elif isinstance(exc, ChannelClosed):
                self.lose(name, f"its agent's connection closed ({exc})")
            elif isinstance(exc, ray.exceptions.RayActorError | ray.exceptions.ActorDiedError):
                self.lose(name, f"its agent died ({type(exc).__name__})")
            else:
                out.set_exception(_cause(exc))

        inner.add_done_callback(relay)
        try:
            return await out
        finally:
            member.pending.discard(out)

    def close_channels(self) -> None:
        """Close every direct channel on purpose (the scheduler shuts down). The calls still in
        flight end with ``NodeLost``; no node is lost for it: that logged every node with
        such a call as lost, evacuated it on the closing runtime and killed its agent while
        the stop shut it down."""
        self.stopping = True
        for member in self.by_name.values():
            if member.channel is not None:
                member.channel.close()

    def opened(self, name: str, trajectory: str) -> None:
        """A container of ``trajectory`` now runs on node ``name``."""
        for listener in self.on_opened:
            listener(name, trajectory)

    def lose(self, name: str, why: str) -> None:
        """Mark the node lost: every call in flight to it ends with ``NodeLost`` now."""
        member = self.by_name.get(name)
        if member is None or not member.alive:
            return
        member.alive, member.why = False, why
        log.warning("node %s lost: %s", name, why)
        if member.channel is not None:
            member.channel.close()
        for fut in list(member.pending):
            if not fut.done():
                fut.set_exception(NodeLost(name, why))
        member.pending.clear()
        for listener in self.on_lost:
            listener(name, why)


def _cause(exc: BaseException) -> BaseException:
    """The agent's own exception out of Ray's wrapper (``RayTaskError``)."""
    try:
        import ray

        if isinstance(exc, ray.exceptions.RayTaskError):
            return exc.as_instanceof_cause()
    except Exception:  # noqa: BLE001 - keep Ray's error as is
        pass
    return exc
