"""Ray-native clients of the scheduler actor, for frameworks already on Ray: actor calls, no
HTTP, the same operations, outcomes and errors as ``tangram.exec.service``'s clients.

Actions are the same keyword arguments (``action_body`` builds the same document, with an id
made up on the client so a resend is the same action), the actor parses them with the HTTP
service's schema, and outcomes come back as the same documents (``outcome_from_doc``). A
runtime error raises ``ServiceError`` with its code and the HTTP status the service would
answer; retryable ones (overloaded, capacity short) are retried after their hint, ``retries``
times. If the scheduler actor dies, a call raises ``ServiceError`` with code
``scheduler_lost`` at once (Ray reports the death; nothing waits). If it cannot be reached
for a moment (Ray's ``ActorUnavailableError``: the call may or may not have run), a call safe
to resend (its id and content make it the same action: actions, not opens) is sent again,
``retries`` times; any other, or the last, raises ``scheduler_unreachable``: its effect is
unknown, not lost.

As with the HTTP clients, each operation is described once (``RayCall``: the actor method,
its arguments, whether a retry is safe, how to read the answer); ``AsyncRayClient`` and
``RayClient`` only differ in how they wait.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from tangram.exec.runtime.errors import ERRORS
from tangram.exec.runtime.records import Outcome
from tangram.exec.service.calls import action_body
from tangram.exec.service.retry import ServiceError
from tangram.exec.service.schema import outcome_from_doc

#: The code of a call whose scheduler actor died.
SCHEDULER_LOST = "scheduler_lost"
#: The code of a call whose scheduler actor could not be reached for a moment (Ray's
#: ``ActorUnavailableError``): the actor may still run it, and may have.
SCHEDULER_UNREACHABLE = "scheduler_unreachable"
#: Seconds before a call safe to resend is sent again while the actor cannot be reached.
UNAVAILABLE_PAUSE_S = 1.0


def _same(value: Any) -> Any:
    return value


def _maybe_outcome(doc: dict[str, Any]) -> Outcome | None:
    return outcome_from_doc(doc["outcome"]) if doc["outcome"] is not None else None


@dataclass(frozen=True)
class RayCall:
    """One operation: ``actor.method(*args)``, retried when ``retry`` and the error is
    retryable (the same id: never a second action), its value read by ``read``; sent again
    when the actor could not be reached (its effect unknown) only when ``resend``: the same
    id and content are the same action (an open resent is 'already open', not the open)."""

    method: str
    args: tuple[Any, ...] = ()
    retry: bool = False
    resend: bool = False
    read: Callable[[Any], Any] = _same


def open_trajectory(
    id: str | None, memory_gb: float | None, image: str | None, wait_s: float | None
) -> RayCall:
    body = {"id": id, "memory_gb": memory_gb, "image": image, "wait_s": wait_s}
    doc = {k: v for k, v in body.items() if v is not None}
    return RayCall("open_trajectory", (doc,), retry=id is not None)


def run(action: dict[str, Any]) -> RayCall:
    body = action_body(**action)
    return RayCall("run", (body,), retry=True, resend=True, read=outcome_from_doc)


def submit(action: dict[str, Any]) -> RayCall:
    return RayCall("submit", (action_body(**action),), retry=True, resend=True)


def result(id: str, wait_s: float) -> RayCall:
    return RayCall("result", (id, wait_s), read=_maybe_outcome)


def cancel(id: str) -> RayCall:
    return RayCall("cancel", (id,), read=outcome_from_doc)


def unwrap(reply: dict[str, Any]) -> Any:
    """The actor's reply: its value, or ``ServiceError`` for its error."""
    if "error" not in reply:
        return reply["value"]
    err = reply["error"]
    cls = ERRORS.get(err["code"])
    # (a code that is no runtime error's, from another version, may carry its HTTP status)
    status = cls.http_status if cls is not None else int(err.get("http_status") or 500)
    raise ServiceError(
        status,
        err["code"],
        err["message"],
        retryable=bool(err.get("retryable")),
        retry_after_s=err.get("retry_after_s"),
    )


def _lost(exc: BaseException) -> ServiceError:
    return ServiceError(
        503,
        SCHEDULER_LOST,
        f"the Tangram scheduler actor is gone ({type(exc).__name__}: {exc}); actions it had "
        "accepted have no outcome to fetch; start it again and resend them (new ids)",
    )


@dataclass
class Batch:
    """A ``run_many``: the actions' documents (ids made on the client, so a resend is the same
    action) and, per action, its outcome or the error that refused it."""

    bodies: list[dict[str, Any]]
    results: list[Outcome | ServiceError | None]

    @classmethod
    def of(cls, actions: Sequence[Mapping[str, Any]]) -> Batch:
        return cls([action_body(**a) for a in actions], [None] * len(actions))

    def read(
        self, sent: list[int], replies: list[dict[str, Any]], last: bool
    ) -> tuple[list[int], float]:
        """Take the replies to the actions ``sent``: the ones to send again (retryable errors,
        unless ``last``) and the pause before."""
        again, pause = [], 0.0
        for i, reply in zip(sent, replies, strict=True):
            try:
                self.results[i] = outcome_from_doc(unwrap(reply))
            except ServiceError as exc:
                self.results[i] = exc
                if exc.retryable and not last:
                    again.append(i)
                    pause = max(pause, min(5.0, exc.retry_after_s or 0.5))
        return again, pause


def _dead() -> tuple[type[BaseException], ...]:
    import ray

    return (ray.exceptions.RayActorError, ray.exceptions.ActorDiedError)


def _unreachable(exc: BaseException) -> ServiceError:
    return ServiceError(
        503,
        SCHEDULER_UNREACHABLE,
        f"the Tangram scheduler actor could not be reached ({type(exc).__name__}: {exc}); it "
        "may still run what it accepted, this call included: read its outcome, or send it "
        "again with the same id (never run twice)",
    )


def _resend_after(exc: BaseException, safe: bool, attempt: int, retries: int) -> float:
    """Seconds before sending a call again after Ray failed it with ``exc`` (the actor died
    or could not be reached); raises the caller's ``ServiceError`` when it must not be sent
    again. Unreachable is not dead: telling the caller ``scheduler_lost`` (resend with new
    ids) ran twice an action the actor had accepted and still ran."""
    import ray

    if not isinstance(exc, ray.exceptions.ActorUnavailableError):
        raise _lost(exc) from exc
    if not safe or attempt == retries:
        raise _unreachable(exc) from exc
    return UNAVAILABLE_PAUSE_S


def _pause(exc: ServiceError, call: RayCall, attempt: int, retries: int) -> float:
    """Seconds to wait before retrying ``call`` after ``exc``; re-raises when it must not."""
    if not (call.retry and exc.retryable) or attempt == retries:
        raise exc
    return min(5.0, exc.retry_after_s or 0.5)


def _check_retries(retries: Any) -> int:
    """``retries`` as given, if a count: -1 sent nothing and raised ``AssertionError`` at the
    first call, 1.5 a ``TypeError`` from ``range`` there, far from the mistake."""
    if isinstance(retries, bool) or not isinstance(retries, int) or retries < 0:
        raise ValueError(f"retries must be an integer >= 0, got {retries!r}")
    return retries


class AsyncRayClient:
    """Asynchronous: ``await AsyncRayClient(handle).run(command=..., trajectory=...)``."""

    def __init__(self, handle: Any, *, retries: int = 8) -> None:
        self.handle, self.retries = handle, _check_retries(retries)

    async def _do(self, call: RayCall) -> Any:
        for attempt in range(self.retries + 1):
            try:
                reply = await getattr(self.handle, call.method).remote(*call.args)
            except _dead() as exc:
                await asyncio.sleep(_resend_after(exc, call.resend, attempt, self.retries))
                continue
            try:
                return call.read(unwrap(reply))
            except ServiceError as exc:
                await asyncio.sleep(_pause(exc, call, attempt, self.retries))
        raise AssertionError("unreachable")

    async def open_trajectory(
        self,
        id: str | None = None,
        *,
        memory_gb: float | None = None,
        image: str | None = None,
        wait_s: float | None = None,
    ) -> dict[str, Any]:
        return await self._do(open_trajectory(id, memory_gb, image, wait_s))

    async def close_trajectory(self, id: str) -> dict[str, Any]:
        return await self._do(RayCall("close_trajectory", (id,)))

    async def recreate_trajectory(self, id: str) -> dict[str, Any]:
        return await self._do(RayCall("recreate_trajectory", (id,)))

    async def trajectories(self) -> list[dict[str, Any]]:
        return await self._do(RayCall("trajectories"))

    async def submit(self, **action: Any) -> str:
        return await self._do(submit(action))

    async def run(self, **action: Any) -> Outcome:
        return await self._do(run(action))

    async def run_many(self, actions: Sequence[Mapping[str, Any]]) -> list[Outcome | ServiceError]:
        """Several actions (``run``'s keyword arguments each) in one actor call, answered
        when all have ended: per action its outcome, or the ``ServiceError`` that refused it
        (retryable ones retried first). One call instead of one per action: more actions per
        second through the scheduler actor, each waiting for the slowest of its batch."""
        batch, todo = Batch.of(actions), list(range(len(actions)))
        for attempt in range(self.retries + 1):
            try:
                replies = await self.handle.run_many.remote([batch.bodies[i] for i in todo])
            except _dead() as exc:  # (each action's id: the batch is safe to send again)
                await asyncio.sleep(_resend_after(exc, True, attempt, self.retries))
                continue
            todo, pause = batch.read(todo, replies, attempt == self.retries)
            if not todo:
                break
            await asyncio.sleep(pause)
        return batch.results  # type: ignore[return-value]  # every entry filled

    async def result(self, id: str, wait_s: float = 0.0) -> Outcome | None:
        return await self._do(result(id, wait_s))

    async def cancel(self, id: str) -> Outcome:
        return await self._do(cancel(id))

    async def status(self) -> dict[str, Any]:
        return await self._do(RayCall("status"))


class RayClient:
    """Synchronous: the same methods as ``AsyncRayClient``, each waiting for its answer."""

    def __init__(self, handle: Any, *, retries: int = 8) -> None:
        self.handle, self.retries = handle, _check_retries(retries)

    def _do(self, call: RayCall) -> Any:
        import ray

        for attempt in range(self.retries + 1):
            try:
                reply = ray.get(getattr(self.handle, call.method).remote(*call.args))
            except _dead() as exc:
                time.sleep(_resend_after(exc, call.resend, attempt, self.retries))
                continue
            try:
                return call.read(unwrap(reply))
            except ServiceError as exc:
                time.sleep(_pause(exc, call, attempt, self.retries))
        raise AssertionError("unreachable")

    def open_trajectory(
        self,
        id: str | None = None,
        *,
        memory_gb: float | None = None,
        image: str | None = None,
        wait_s: float | None = None,
    ) -> dict[str, Any]:
        return self._do(open_trajectory(id, memory_gb, image, wait_s))

    def close_trajectory(self, id: str) -> dict[str, Any]:
        return self._do(RayCall("close_trajectory", (id,)))

    def recreate_trajectory(self, id: str) -> dict[str, Any]:
        return self._do(RayCall("recreate_trajectory", (id,)))

    def trajectories(self) -> list[dict[str, Any]]:
        return self._do(RayCall("trajectories"))

    def submit(self, **action: Any) -> str:
        return self._do(submit(action))

    def run(self, **action: Any) -> Outcome:
        return self._do(run(action))

    def run_many(self, actions: Sequence[Mapping[str, Any]]) -> list[Outcome | ServiceError]:
        """``AsyncRayClient.run_many``, waiting."""
        import ray

        batch, todo = Batch.of(actions), list(range(len(actions)))
        for attempt in range(self.retries + 1):
            try:
                replies = ray.get(self.handle.run_many.remote([batch.bodies[i] for i in todo]))
            except _dead() as exc:  # (each action's id: the batch is safe to send again)
                time.sleep(_resend_after(exc, True, attempt, self.retries))
                continue
            todo, pause = batch.read(todo, replies, attempt == self.retries)
            if not todo:
                break
            time.sleep(pause)
        return batch.results  # type: ignore[return-value]  # every entry filled

    def result(self, id: str, wait_s: float = 0.0) -> Outcome | None:
        return self._do(result(id, wait_s))

    def cancel(self, id: str) -> Outcome:
        return self._do(cancel(id))

    def status(self) -> dict[str, Any]:
        return self._do(RayCall("status"))
