"""The errors of the live runtime: each has a stable ``code`` and says whether a retry may help.

A client (or the HTTP layer) maps them to responses without parsing messages: ``code`` is
machine-readable, ``retryable`` tells a caller that the same request, sent again later, may
succeed (back-pressure, memory short now) and cannot run twice (ids make submissions
idempotent).
"""

from __future__ import annotations


class LiveError(Exception):
    """Base class of every live-runtime error."""

    code = "error"
    retryable = False

    def __init__(self, message: str) -> None:
        super().__init__(message)
        self.message = message


class BadRequest(LiveError, ValueError):
    """A request that can never be served as written (a missing or ill-typed field)."""

    code = "bad_request"


class UnknownTrajectory(LiveError, KeyError):
    """An action or a close names a trajectory that is not open."""

    code = "unknown_trajectory"

    def __str__(self) -> str:  # KeyError would quote the message
        return self.message


class UnknownAction(LiveError, KeyError):
    """A result, poll or cancel names an action id the runtime has never accepted."""

    code = "unknown_action"

    def __str__(self) -> str:
        return self.message


class Conflict(LiveError):
    """An id already in use for something else (a different action, an open trajectory)."""

    code = "conflict"


class Overloaded(LiveError):
    """Admission control refused the request: too many actions pending. Retry later.

    ``retry_after_s`` is a hint for the caller's back-off. Nothing was accepted, so the same
    request (with the same id) can be sent again safely.
    """

    code = "overloaded"
    retryable = True

    def __init__(self, message: str, retry_after_s: float = 0.5) -> None:
        super().__init__(message)
        self.retry_after_s = retry_after_s


class CapacityShort(LiveError):
    """A trajectory could not be placed: no node has the memory it asks for now. Retry later."""

    code = "capacity_short"
    retryable = True

    def __init__(self, message: str, retry_after_s: float = 1.0) -> None:
        super().__init__(message)
        self.retry_after_s = retry_after_s


class NotCancellable(LiveError):
    """A cancel of an action that is already running on an executor that cannot interrupt it."""

    code = "not_cancellable"


class ExecutorMissing(LiveError):
    """The action needs an executor this runtime was started without (no Docker, no GPU...)."""

    code = "executor_missing"


class ShuttingDown(LiveError):
    """The runtime is closing and accepts nothing new."""

    code = "shutting_down"
    retryable = True

    def __init__(self, message: str = "the runtime is shutting down") -> None:
        super().__init__(message)
        self.retry_after_s = 5.0
