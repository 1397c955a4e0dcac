"""How a client sends one request: what counts as an error, which errors are retried, and when.

Sans I/O, so that ``AsyncClient`` and ``Client`` share it: ``attempts`` is a generator that
yields the request to send (``Call``) or a back-off to sleep (``Pause``) and is sent the
answers (a ``httpx.TransportError`` is thrown into it). Which errors are retried comes from
the runtime's error registry: those its classes declare retryable, at their HTTP statuses,
and a 429 from anyone.
"""

from __future__ import annotations

import datetime
import email.utils
import math
import random
from collections.abc import Generator, Mapping
from dataclasses import dataclass
from typing import Any

import httpx

from tangram.exec.runtime.errors import ERRORS, LiveError, Overloaded
from tangram.exec.service.codec import non_finite_path

#: Statuses of a successful answer.
OK_STATUSES = frozenset({200, 201, 202})

#: Statuses at which the service may answer a retryable error (429 overloaded, 503 ...).
RETRY_STATUSES = frozenset(cls.http_status for cls in ERRORS.values() if cls.retryable)


class ServiceError(RuntimeError):
    """The service answered with an error: ``status`` (HTTP), ``code``, ``message``."""

    def __init__(
        self,
        status: int,
        code: str,
        message: str,
        retryable: bool = False,
        retry_after_s: float | None = None,
    ) -> None:
        super().__init__(f"HTTP {status} {code}: {message}")
        self.status, self.code, self.message = status, code, message
        self.retryable, self.retry_after_s = retryable, retry_after_s

    @property
    def error_class(self) -> type[LiveError] | None:
        """The runtime's error class of ``code`` (None for codes that are not runtime errors)."""
        return ERRORS.get(self.code)


class OverloadedError(ServiceError):
    """HTTP 429: admission control refused the request (still so after the retries)."""


@dataclass(frozen=True)
class Call:
    """One request: method, path, JSON body, query, and whether repeating it is safe."""

    method: str
    path: str
    body: Any = None
    params: Mapping[str, str] | None = None
    idempotent: bool = True
    #: Error statuses that, answered to a resent call, say an earlier attempt did it (an
    #: open with an id the client made up, answered 409 after its first answer was lost):
    #: returned to the operation, which reads what was done, rather than raised.
    done_before: frozenset[int] = frozenset()


@dataclass(frozen=True)
class Pause:
    """Sleep this long before the next attempt."""

    seconds: float


def unsendable(call: Call, exc: ValueError) -> ValueError:
    """The error of a ``call`` whose body could not be encoded (``exc``, httpx's): one naming
    the field when a NaN or an infinity is the cause. httpx encodes strict JSON and said only
    "Out of range float values are not JSON compliant", naming no field of the body."""
    where = non_finite_path(call.body) if call.body is not None else None
    if where is None:
        return exc
    return ValueError(
        f"{call.method} {call.path}: field {where[0]!r} is {where[1]!r}, which JSON cannot "
        "carry (no NaN or infinity); nothing was sent"
    )


#: What ``attempts`` yields, is sent, and returns.
Attempts = Generator[Call | Pause, httpx.Response | None, httpx.Response]


def error_of(response: httpx.Response) -> ServiceError:
    """The error an answer carries (a page that is not the service's JSON keeps its text)."""
    try:
        err = response.json()["error"]
        code, message, retryable = err["code"], err["message"], bool(err.get("retryable"))
    except Exception:  # noqa: BLE001 - not our JSON (a proxy's page)
        code, message, retryable = f"http_{response.status_code}", response.text[:500], False
    hint = response.headers.get("X-Retry-After-S") or response.headers.get("Retry-After")
    retry_after = retry_after_s(hint)
    cls = OverloadedError if response.status_code == Overloaded.http_status else ServiceError
    return cls(response.status_code, code, message, retryable, retry_after)


def retry_after_s(hint: str | None) -> float | None:
    """Seconds to wait that a ``Retry-After`` (or ``X-Retry-After-S``) value says: a number
    of seconds, or an HTTP date (RFC 9110, section 10.2.3: a proxy may send one; its wait is
    from now, none once past); None for no value or one that is neither. Read with ``float``
    alone, a date raised ``ValueError`` out of the client's retry loop."""
    if not hint:
        return None
    try:
        seconds = float(hint)
    except ValueError:
        try:
            when = email.utils.parsedate_to_datetime(hint)
        except (TypeError, ValueError):
            return None
        if when.tzinfo is None:  # (RFC 9110 dates are GMT)
            when = when.replace(tzinfo=datetime.UTC)
        seconds = (when - datetime.datetime.now(datetime.UTC)).total_seconds()
    return max(0.0, seconds) if math.isfinite(seconds) else None


def retry_worthy(status: int, error: ServiceError) -> bool:
    """A 429 (whoever sent it), or a retryable error at a status that may carry one."""
    return status == Overloaded.http_status or (status in RETRY_STATUSES and error.retryable)


#: Transport errors raised before the request left the client (no connection was made, or
#: none was free in the pool): nothing reached the service, so even a call that must not run
#: twice is safe to resend (it raised at once, as if it might have been acted on).
UNSENT = (httpx.ConnectError, httpx.ConnectTimeout, httpx.PoolTimeout)


def backoff(error: ServiceError | None, attempt: int) -> float:
    """The service's hint if it gave one, else exponential from 50 ms; capped, jittered."""
    base = error.retry_after_s if error and error.retry_after_s else 0.05 * 2**attempt
    return min(10.0, base) * (0.5 + random.random())


def attempts(call: Call, retries: int) -> Attempts:
    """Send ``call`` until it succeeds, retrying up to ``retries`` times; returns the answer.

    A lost connection is retried only for an idempotent call, one never made (``UNSENT``)
    for any; an error answer only when ``retry_worthy``. The last error (``ServiceError`` or
    the transport's) is raised.
    """
    error: ServiceError | None = None
    for attempt in range(retries + 1):
        try:
            response = yield call
        except httpx.TransportError as exc:
            if not (call.idempotent or isinstance(exc, UNSENT)) or attempt == retries:
                raise
            yield Pause(backoff(None, attempt))
            continue
        assert response is not None
        if response.status_code in OK_STATUSES or (
            attempt > 0 and response.status_code in call.done_before
        ):
            return response
        error = error_of(response)
        if not retry_worthy(response.status_code, error) or attempt == retries:
            raise error
        yield Pause(backoff(error, attempt))
    raise error or RuntimeError("unreachable")
