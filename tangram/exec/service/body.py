"""A request's JSON body, read so that no body can be a 500 or hold a connection forever.

The body must arrive within ``timeout_s`` (else 408 and the connection is closed), be UTF-8
(JSON's only encoding, whatever the Content-Type claims), parse as JSON with finite numbers
and integers of at most 4300 digits, no key twice in one object (one value would be dropped
silently), and nest at most ``MAX_DEPTH`` arrays and objects deep.
Every other way it can be wrong is a ``BadRequest`` saying what is wrong (HTTP 400). A large
body is parsed off the event loop (``THREAD_BYTES``).
"""

from __future__ import annotations

import asyncio
import json
import math
from collections.abc import Callable
from typing import Any

from aiohttp import web

from tangram.exec.runtime.errors import BadRequest
from tangram.exec.service.codec import dumps
from tangram.exec.service.schema import error_doc

#: The largest body the service takes (the application's ``client_max_size``; larger: 413).
MAX_BODY_BYTES = 64 * 1024 * 1024
#: The deepest nesting of arrays and objects a body may have (GPU inputs need a handful).
MAX_DEPTH = 64
#: Bodies larger than this are decoded and parsed in a worker thread, so other clients'
#: requests go on meanwhile (50 MiB of floats: the loop stalled 9.4 s, now 0.2 s). The C parser
#: still holds the GIL while it reads integers (they take no Python hook): 50 MiB of token ids
#: stall the loop ~2.7 s (7.5 s before, most of it the depth walk, now done in C).
THREAD_BYTES = 256 * 1024


def json_response(doc: Any, *, status: int = 200, headers: Any = None) -> web.Response:
    """aiohttp's ``json_response`` written with ``codec.dumps`` (strict JSON: a NaN or an
    infinity is ``NonFiniteNumber`` naming its path, never ``NaN`` in the body). Every JSON
    answer of the service is made here."""
    return web.json_response(doc, status=status, headers=headers, dumps=dumps)


async def read_json(
    request: web.Request,
    *,
    timeout_s: float,
    optional: bool = False,
    then: Callable[[Any], Any] | None = None,
) -> Any:
    """The body's JSON (None for an empty body when ``optional``), or ``then`` of it: run
    where the parse runs, off the event loop for a large body (turning a GPU call's million
    numbers into a tensor took the loop ~0.7 s, every other client's requests waiting)."""
    check_encoding(request.headers.get("Content-Encoding"))
    try:
        async with asyncio.timeout(timeout_s):
            data = await request.read()
    except MalformedBody as exc:
        raise BadRequest(str(exc)) from None
    except web.RequestPayloadError as exc:
        # (A body its Content-Encoding does not describe, gzip that is not: a 500 with a
        # stack trace in the log, any client's to cause.)
        why = str(exc).split("message:", 1)[-1].strip()
        raise BadRequest(
            f"the request body is malformed: {why} (a body sent with Content-Encoding must be "
            "compressed so; a plain JSON body takes none)"
        ) from None
    except web.HTTPRequestEntityTooLarge:
        raise too_large(MAX_BODY_BYTES) from None
    except ConnectionResetError:
        raise ClientGone(
            f"the client went away before its body arrived whole ({_received(request)})"
        ) from None
    except TimeoutError:
        raise web.HTTPRequestTimeout(
            text=dumps(
                error_doc(
                    "request_timeout",
                    f"the request body did not arrive within {timeout_s:g} s "
                    "(the service's --body-timeout-s)",
                )
            ),
            content_type="application/json",
            headers={"Connection": "close"},
        ) from None

    def parse() -> Any:
        value = parse_json(data, optional=optional)
        return value if then is None else then(value)

    if len(data) > THREAD_BYTES:
        return await asyncio.to_thread(parse)
    return parse()


#: The Content-Encoding values aiohttp decodes (one coding, as written; "identity": none).
DECODED = frozenset({"identity", "gzip", "deflate", "br", "zstd"})


def check_encoding(value: str | None) -> None:
    """``BadRequest`` naming the header unless ``value`` is a coding aiohttp decodes: any
    other (``x-gzip``, ``gzip, br``, ``xyz``) was passed on as it came, read as plain JSON,
    accepted when it was, else refused as "not valid UTF-8", naming the wrong thing."""
    if value is None or value.strip() == "" or value.strip().lower() in DECODED:
        return
    raise BadRequest(
        f"header Content-Encoding: {value[:100]!r} is not a coding this service decodes: "
        f"send one of {', '.join(sorted(DECODED - {'identity'}))}, or none"
    )


def too_large(limit: int) -> web.HTTPRequestEntityTooLarge:
    """The 413 of a body past ``limit`` bytes, as the error document naming the limit:
    aiohttp's said only "Request Entity Too Large", which every route answered, and a client
    could not tell how much less to send."""
    message = (
        f"the request body is larger than {limit:,} bytes ({limit / (1 << 20):g} MiB), the "
        "most this service takes; send less (a GPU call's inputs in smaller batches)"
    )
    return web.HTTPRequestEntityTooLarge(
        max_size=limit,
        actual_size=limit + 1,
        text=dumps(error_doc("http_413", message)),
        content_type="application/json",
    )


class MalformedBody(Exception):
    """The request's body broke the HTTP framing as it came (a chunk size that is not
    hexadecimal, a chunk longer than it said): set on the body's reader by the connection's
    handler (``connections.ErrorDocHandler``), so the read fails at once, a 400 naming it."""


class ClientGone(ConnectionResetError):
    """The client closed its connection while it sent a request's body: nothing of the
    request was read, so nothing was accepted, and there is no one to answer (one log line,
    not a stack trace: it is the client's doing, and a common one)."""


def _received(request: web.Request) -> str:
    """How much of the body came, for the log line: '12 of 1000 bytes'."""
    got = getattr(request.content, "total_bytes", None)
    want = request.content_length
    if want is None:
        return "chunked" if got is None else f"{got} bytes of a chunked body"
    return f"{want} bytes announced" if got is None else f"{got} of {want} bytes"


def parse_json(data: bytes, *, optional: bool = False) -> Any:
    """``data`` as JSON, or ``BadRequest`` naming what is wrong with it."""
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise BadRequest(
            f"the request body is not valid UTF-8 (byte {exc.start}: {data[exc.start : exc.start + 1]!r})"
        ) from None
    if not text.strip():
        if optional:
            return None
        raise BadRequest("the request body is empty; send a JSON object")
    try:
        value = json.loads(
            text, parse_constant=_no_constant, parse_float=_finite, object_pairs_hook=_unique
        )
    except json.JSONDecodeError as exc:
        raise BadRequest(f"the request body is not valid JSON: {exc}") from None
    except DuplicateKey as exc:
        raise BadRequest(str(exc)) from None
    except RecursionError:
        raise BadRequest(f"the request body nests deeper than {MAX_DEPTH} levels") from None
    except ValueError as exc:  # an integer of more than 4300 digits, NaN, Infinity, 1e999
        raise BadRequest(f"the request body has a number JSON cannot carry here: {exc}") from None
    problem = depth_problem(value)
    if problem is not None:
        raise BadRequest(problem)
    return value


#: What nests (``depth_problem``), subclasses included.
_NESTS = (dict, list, tuple)


def depth_problem(value: Any) -> str | None:
    """Why ``value`` nests too deep (None when it does not); iterative, for any depth. Tuples
    count as lists, and subclasses (an OrderedDict, a namedtuple) as their base (a Ray
    caller's documents are Python objects, not JSON)."""
    stack: list[tuple[Any, int]] = [(value, 1)]
    while stack:
        item, depth = stack.pop()
        if not isinstance(item, dict | list | tuple):
            continue
        if depth > MAX_DEPTH:
            return f"the request body nests deeper than {MAX_DEPTH} levels"
        children = item.values() if isinstance(item, dict) else item
        # The element types first, in C (map and set): a list of a million numbers, as GPU
        # inputs are, is skipped without a Python step per number (4.3 s -> 0.1 s for 50 MiB).
        kinds = set(map(type, children))
        if any(issubclass(kind, _NESTS) for kind in kinds):
            stack.extend((c, depth + 1) for c in children if isinstance(c, dict | list | tuple))
    return None


class DuplicateKey(ValueError):
    """A JSON object names one key twice."""


def _unique(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
    """An object's pairs as a dict; ``DuplicateKey`` when a key repeats (``json`` would keep
    the last value and drop the others without a word)."""
    obj = dict(pairs)
    if len(obj) == len(pairs):
        return obj
    seen: set[str] = set()
    for key, _ in pairs:
        if key in seen:
            raise DuplicateKey(
                f"the request body has the key {key[:100]!r} twice in one object; send it once"
            )
        seen.add(key)
    return obj  # (not reached)


def _no_constant(name: str) -> Any:
    raise ValueError(f"{name} is not a number JSON allows")


def _finite(text: str) -> float:
    value = float(text)
    if not math.isfinite(value):
        raise ValueError(f"{text} is out of range for a 64-bit float")
    return value
