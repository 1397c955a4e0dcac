"""The errors of the EOE executor, one class per cause, so a caller can tell them apart.

Every error that concerns one call is returned in that call's ``CallOutcome`` (status
``"error"``) rather than raised across the manager, so one bad call never stops the others;
``CallOutcome.unwrap()`` re-raises it for callers that prefer exceptions.
"""

from __future__ import annotations


def shown(value: object, limit: int = 300) -> str:
    """``repr(value)`` for an error's message, cut to ``limit`` characters; a value that
    cannot be shown (its ``__repr__`` raised; an int past str's 4,300 digits) is named by its
    type. A caller's value quoted with ``!r`` whose repr raised made the error's own message
    raise: a call reported as the executor's bug, or a call that raised out of ``call``."""
    try:
        text = repr(value)
    except Exception as exc:
        return f"<{type(value).__name__} object whose repr raised {type(exc).__name__}>"[:limit]
    return text[:limit]


def told(exc: BaseException) -> str:
    """``str(exc)`` for an error's message; an exception whose ``__str__`` raised is said to
    have none readable. A service's exception quoted with ``{exc}`` whose str raised made
    the wrapping error's own message raise: the call was reported as the executor's bug (a
    factory's, as no ServiceSpecError)."""
    try:
        return str(exc)
    except Exception as error:
        return f"<its message could not be read: {type(error).__name__}>"


class EoeError(Exception):
    """Base class of every EOE error."""


class ServiceSpecError(EoeError, ValueError):
    """A service description is invalid (bad name, DoPs, memory figures, factory result)."""


class DuplicateServiceError(EoeError, ValueError):
    """A service of that name is already registered."""


class UnknownServiceError(EoeError, KeyError):
    """A call or eviction named a service that is not registered."""

    def __str__(self) -> str:  # KeyError would quote the message
        return str(self.args[0]) if self.args else ""


class ServiceTooLargeError(EoeError):
    """A service needs more memory per GPU than any cell (or the chosen cell) can hold."""


class HostMemoryError(EoeError):
    """The host backups of the registered services would exceed the host memory budget."""


class InvalidCellError(EoeError, ValueError):
    """The GPUs given for a call are not an aligned cell of this executor, or do not match the DoP."""


class DopNotSupportedError(EoeError, ValueError):
    """The call asked for a DoP that the service does not declare or the devices cannot provide."""


class ServiceInUseError(EoeError):
    """An explicit eviction (or unregistration) targeted a service while a call is using it."""


class DeviceOutOfMemoryError(EoeError):
    """A device allocation would exceed the device's budget, or the device itself ran out."""


class RestoreError(EoeError):
    """Restoring a service's weights to a GPU failed."""


class RestoreOutOfMemoryError(RestoreError):
    """Restoring a service failed for lack of device memory (budget or a real CUDA OOM)."""


class CallFailedError(EoeError):
    """The service's call function raised; the original exception is ``__cause__``."""


class InputSplitError(EoeError, ValueError):
    """The inputs of a call at DoP > 1 could not be split across the cell's replicas."""


class CallArgumentError(EoeError, ValueError):
    """An argument of the call is not one it can take (its ``timeout_s``: a number of
    seconds, 0 or more, not NaN); it never ran."""


class QueueTimeoutError(EoeError):
    """The call waited longer than its ``timeout_s`` for its GPUs or for memory; it never ran."""


class ExecutorError(EoeError):
    """An unexpected failure inside the executor itself (a bug); the cause is chained."""


class ManagerClosedError(EoeError):
    """The manager was closed; it serves no more calls."""
