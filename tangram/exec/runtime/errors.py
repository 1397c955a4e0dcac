"""The errors of the live runtime, each declaring once its ``code``, ``retryable`` and HTTP status.

A client (or the HTTP layer) maps them to responses without parsing messages: ``code`` is
machine-readable, ``retryable`` tells a caller that the same request, sent again later, may
succeed (back-pressure, memory short now) and cannot run twice (ids make submissions
idempotent), and ``http_status`` is the status the service answers with. ``ERRORS`` maps each
code to its class; a subclass joins it by declaring its own ``code`` (the service and the
clients read it rather than restating the list).
"""

from __future__ import annotations

from typing import Any, ClassVar

#: Every live-runtime error by its stable code (filled as the classes are defined).
ERRORS: dict[str, type[LiveError]] = {}


class LiveError(Exception):
    """Base class of every live-runtime error (raised as is: an internal failure, HTTP 500)."""

    code: ClassVar[str] = "error"
    retryable: ClassVar[bool] = False
    http_status: ClassVar[int] = 500
    #: A back-off hint in seconds, for the errors that carry one.
    retry_after_s: float | None = None

    def __init__(self, message: str) -> None:
        super().__init__(message)
        self.message = message

    def __init_subclass__(cls, **kwargs: Any) -> None:
        super().__init_subclass__(**kwargs)
        if "code" not in cls.__dict__:
            raise TypeError(f"{cls.__name__} must declare its own code")
        if cls.code in ERRORS:
            raise TypeError(f"{cls.__name__}: code {cls.code!r} is {ERRORS[cls.code].__name__}'s")
        ERRORS[cls.code] = cls


class BadRequest(LiveError, ValueError):
    """A request that can never be served as written (a missing or ill-typed field)."""

    code = "bad_request"
    http_status = 400


class UnknownTrajectory(LiveError, KeyError):
    """An action or a close names a trajectory that is not open."""

    code = "unknown_trajectory"
    http_status = 404

    def __str__(self) -> str:  # KeyError would quote the message
        return self.message


class UnknownAction(LiveError, KeyError):
    """A result, poll or cancel names an action id the runtime has never accepted."""

    code = "unknown_action"
    http_status = 404

    def __str__(self) -> str:
        return self.message


class Forbidden(LiveError):
    """The client's token admits it, but not to this (a tenant asking for the trace, which
    holds every tenant's actions)."""

    code = "forbidden"
    http_status = 403


class Conflict(LiveError):
    """An id already in use for something else (a different action, an open trajectory)."""

    code = "conflict"
    http_status = 409


class Overloaded(LiveError):
    """Admission control refused the request: too many actions pending. Retry later.

    ``retry_after_s`` is a hint for the caller's back-off. Nothing was accepted, so the same
    request (with the same id) can be sent again safely.
    """

    code = "overloaded"
    retryable = True
    http_status = 429

    def __init__(self, message: str, retry_after_s: float = 0.5) -> None:
        super().__init__(message)
        self.retry_after_s = retry_after_s


class CapacityShort(LiveError):
    """A trajectory could not be placed: no node has the memory it asks for now. Retry later."""

    code = "capacity_short"
    retryable = True
    http_status = 503

    def __init__(self, message: str, retry_after_s: float = 1.0) -> None:
        super().__init__(message)
        self.retry_after_s = retry_after_s


class NodeLostError(LiveError):
    """The node that was to make or run it was lost meanwhile (a multi-node runtime: a
    container's open whose node's agent died): nothing was made there, and the same request
    sent again is placed on a node alive. Retry (the same id)."""

    code = "node_lost"
    retryable = True
    http_status = 503


class NotCancellable(LiveError):
    """A cancel of an action that is already running on an executor that cannot interrupt it."""

    code = "not_cancellable"
    http_status = 409


class ExecutorMissing(LiveError):
    """The action needs an executor this runtime was started without (no Docker, no GPU...)."""

    code = "executor_missing"
    http_status = 501


class ShuttingDown(LiveError):
    """The runtime is closing and accepts nothing new."""

    code = "shutting_down"
    retryable = True
    http_status = 503

    def __init__(self, message: str = "the runtime is shutting down") -> None:
        super().__init__(message)
        self.retry_after_s = 5.0


__all__ = [
    "ERRORS",
    "BadRequest",
    "CapacityShort",
    "Conflict",
    "ExecutorMissing",
    "Forbidden",
    "LiveError",
    "NodeLostError",
    "NotCancellable",
    "Overloaded",
    "ShuttingDown",
    "UnknownAction",
    "UnknownTrajectory",
]
