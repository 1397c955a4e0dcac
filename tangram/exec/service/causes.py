"""Runtime failures that are the request's fault: a registry from the cause an executor raised
to the 4xx error the client gets, so that a missing image is a 400 naming ``image``, not a 500.

The runtime wraps what an executor raised in a plain ``LiveError`` (HTTP 500) with the
executor's exception as its ``__cause__``; ``translate`` looks along that chain.
"""

from __future__ import annotations

from collections.abc import Callable

from tangram.exec.aoe.errors import ImageMissing
from tangram.exec.runtime.errors import BadRequest, LiveError

#: An executor's exception class -> the client's error made from it.
CAUSES: dict[type[BaseException], Callable[[BaseException], LiveError]] = {
    ImageMissing: lambda exc: BadRequest(f"field 'image': {exc}"),
}


def translate(error: LiveError) -> LiveError:
    """The error to answer with: ``error`` itself, or the client's error its cause maps to."""
    if type(error) is not LiveError:
        return error  # already a declared error with its own status
    cause = error.__cause__
    for _ in range(8):  # a chain is short; bound it all the same
        if cause is None:
            break
        make = CAUSES.get(type(cause))
        if make is not None:
            return make(cause)
        cause = cause.__cause__
    return error
