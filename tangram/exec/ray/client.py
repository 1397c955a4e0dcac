"""Ray-native clients of the scheduler actor, for frameworks already on Ray: actor calls, no
HTTP, the same operations, outcomes and errors as ``tangram.exec.service``'s clients.

Actions are the same keyword arguments (``action_body`` builds the same document, with an id
made up on the client so a resend is the same action), the actor parses them with the HTTP
service's schema, and outcomes come back as the same documents (``outcome_from_doc``). A
runtime error raises ``ServiceError`` with its code and the HTTP status the service would
answer; retryable ones (overloaded, capacity short) are retried after their hint, ``retries``
times. If the scheduler actor dies, a call raises ``ServiceError`` with code
``scheduler_lost`` at once (Ray reports the death; nothing waits).
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable
from typing import Any

from tangram.exec.runtime.errors import ERRORS
from tangram.exec.runtime.records import Outcome
from tangram.exec.service.calls import action_body
from tangram.exec.service.retry import ServiceError
from tangram.exec.service.schema import outcome_from_doc

#: The code of a call whose scheduler actor died (or could not be reached).
SCHEDULER_LOST = "scheduler_lost"


def unwrap(reply: dict[str, Any]) -> Any:
    """The actor's reply: its value, or ``ServiceError`` for its error."""
    if "error" not in reply:
        return reply["value"]
    err = reply["error"]
    cls = ERRORS.get(err["code"])
    raise ServiceError(
        cls.http_status if cls is not None else 500,
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


def _trajectory_body(
    id: str | None, memory_gb: float | None, image: str | None, wait_s: float | None
) -> dict[str, Any]:
    body = {"id": id, "memory_gb": memory_gb, "image": image, "wait_s": wait_s}
    return {k: v for k, v in body.items() if v is not None}


class AsyncRayClient:
    """Asynchronous: ``await AsyncRayClient(handle).run(command=..., trajectory=...)``."""

    def __init__(self, handle: Any, *, retries: int = 8) -> None:
        self.handle, self.retries = handle, retries

    async def _call(self, method: str, *args: Any, retry: bool = False) -> Any:
        import ray

        for attempt in range(self.retries + 1):
            try:
                reply = await getattr(self.handle, method).remote(*args)
            except (ray.exceptions.RayActorError, ray.exceptions.ActorDiedError) as exc:
                raise _lost(exc) from exc
            try:
                return unwrap(reply)
            except ServiceError as exc:
                if not (retry and exc.retryable) or attempt == self.retries:
                    raise
                await asyncio.sleep(min(5.0, exc.retry_after_s or 0.5))
        raise AssertionError("unreachable")

    async def open_trajectory(
        self,
        id: str | None = None,
        *,
        memory_gb: float | None = None,
        image: str | None = None,
        wait_s: float | None = None,
    ) -> dict[str, Any]:
        body = _trajectory_body(id, memory_gb, image, wait_s)
        return await self._call("open_trajectory", body, retry=id is not None)

    async def close_trajectory(self, id: str) -> dict[str, Any]:
        return await self._call("close_trajectory", id)

    async def recreate_trajectory(self, id: str) -> dict[str, Any]:
        return await self._call("recreate_trajectory", id)

    async def trajectories(self) -> list[dict[str, Any]]:
        return await self._call("trajectories")

    async def submit(self, **action: Any) -> str:
        return await self._call("submit", action_body(**action), retry=True)

    async def run(self, **action: Any) -> Outcome:
        return outcome_from_doc(await self._call("run", action_body(**action), retry=True))

    async def result(self, id: str, wait_s: float = 0.0) -> Outcome | None:
        doc = await self._call("result", id, wait_s)
        return outcome_from_doc(doc["outcome"]) if doc["outcome"] is not None else None

    async def cancel(self, id: str) -> Outcome:
        return outcome_from_doc(await self._call("cancel", id))

    async def status(self) -> dict[str, Any]:
        return await self._call("status")


class RayClient:
    """Synchronous: the same methods as ``AsyncRayClient``, each waiting for its answer."""

    def __init__(self, handle: Any, *, retries: int = 8) -> None:
        self.handle, self.retries = handle, retries

    def _call(self, method: str, *args: Any, retry: bool = False) -> Any:
        import ray

        for attempt in range(self.retries + 1):
            try:
                reply = ray.get(getattr(self.handle, method).remote(*args))
            except (ray.exceptions.RayActorError, ray.exceptions.ActorDiedError) as exc:
                raise _lost(exc) from exc
            try:
                return unwrap(reply)
            except ServiceError as exc:
                if not (retry and exc.retryable) or attempt == self.retries:
                    raise
                time.sleep(min(5.0, exc.retry_after_s or 0.5))
        raise AssertionError("unreachable")

    def open_trajectory(
        self,
        id: str | None = None,
        *,
        memory_gb: float | None = None,
        image: str | None = None,
        wait_s: float | None = None,
    ) -> dict[str, Any]:
        body = _trajectory_body(id, memory_gb, image, wait_s)
        return self._call("open_trajectory", body, retry=id is not None)

    def close_trajectory(self, id: str) -> dict[str, Any]:
        return self._call("close_trajectory", id)

    def recreate_trajectory(self, id: str) -> dict[str, Any]:
        return self._call("recreate_trajectory", id)

    def trajectories(self) -> list[dict[str, Any]]:
        return self._call("trajectories")

    def submit(self, **action: Any) -> str:
        return self._call("submit", action_body(**action), retry=True)

    def run(self, **action: Any) -> Outcome:
        return outcome_from_doc(self._call("run", action_body(**action), retry=True))

    def result(self, id: str, wait_s: float = 0.0) -> Outcome | None:
        doc = self._call("result", id, wait_s)
        return outcome_from_doc(doc["outcome"]) if doc["outcome"] is not None else None

    def cancel(self, id: str) -> Outcome:
        return outcome_from_doc(self._call("cancel", id))

    def status(self) -> dict[str, Any]:
        return self._call("status")


#: Both clients' shared shape, for type hints.
Factory = Callable[[Any], RayClient | AsyncRayClient]
