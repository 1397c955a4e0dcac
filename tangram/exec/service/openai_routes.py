"""OpenAI-style routes for EOE's model services, so RL frameworks point their existing clients
at Tangram: ``POST /v1/completions`` (a teacher's prompt log-probs), ``POST /pooling`` and
``/v1/pooling`` (a reward model's scores, vLLM's shape), ``POST /get_reward`` (OpenRLHF's
remote reward model) and ``GET /v1/models``.

``model`` names a registered service made from a model directory (``eoe.hf``). Each request is
one GPU action of the runtime (``GpuWork`` on a right-padded batch), so the scheduler core
places it, EOE restores the model if needed, and it is traced like any other action. Errors are
answered in OpenAI's shape (``openai_schema``).
"""

from __future__ import annotations

import asyncio
import contextvars
import functools
import json
import logging
import math
import time
from collections.abc import Awaitable, Callable
from concurrent.futures import ThreadPoolExecutor
from typing import Any

from aiohttp import web

from tangram.exec.runtime import Runtime
from tangram.exec.runtime.errors import LiveError
from tangram.exec.runtime.records import ActionSpec, GpuWork
from tangram.exec.service.body import json_response, read_json
from tangram.exec.service.codec import dumps
from tangram.exec.service.openai_schema import (
    OpenAiError,
    completion_doc,
    completion_request,
    model_name,
    padded,
    pooling_doc,
    prompts,
    reward_texts,
)

log = logging.getLogger(__name__)

Handler = Callable[[web.Request], Awaitable[web.Response]]

#: The other kind's endpoint, named in the error for a model of the wrong kind.
ENDPOINT_OF = {"teacher": "/v1/completions", "reward": "/pooling or /get_reward"}


def answers_errors(handler: Callable[[Any, web.Request], Awaitable[web.Response]]) -> Any:
    """Answer every error ``handler`` raises in OpenAI's shape, at its status: an
    ``OpenAiError`` as it is, any other through ``as_openai_error``. (Only ``OpenAiError`` was
    caught: a body aiohttp refused (413), a runtime error or a parser's own bug reached the
    service's middleware and came back in Tangram's shape, which OpenAI's clients cannot
    read.) A client that went away is no error to answer."""

    @functools.wraps(handler)
    async def wrapped(self: Any, request: web.Request) -> web.Response:
        ran = RAN.set(False)
        try:
            return await handler(self, request)
        except (asyncio.CancelledError, ConnectionResetError):
            raise  # (ClientGone too: the client went away, nothing to answer)
        except web.HTTPException as exc:
            if exc.status < 400:
                raise  # (not an error)
            return _answer(_after_run(as_openai_error(request, exc)), exc)
        except Exception as exc:  # noqa: BLE001 - each is answered, in OpenAI's shape
            return _answer(_after_run(as_openai_error(request, exc)), exc)
        finally:
            RAN.reset(ran)

    return wrapped


#: Whether the request's GPU call started (set by ``OpenAiRoutes._call``; each request is a
#: task of its own, so of its own context).
RAN: contextvars.ContextVar[bool] = contextvars.ContextVar("tangram_openai_ran", default=False)


def _after_run(error: OpenAiError) -> OpenAiError:
    """``error`` of a request whose GPU call had started (its answer failed to be made: a
    service's value of an unexpected shape, say) says ``x-should-retry: false``: OpenAI's
    clients retry a 500 by themselves, which ran the call again."""
    if RAN.get() and error.should_retry is None:
        error.should_retry = False
    return error


def _answer(error: OpenAiError, exc: Exception) -> web.Response:
    """``error`` in OpenAI's shape, with its back-off hint, and the headers of aiohttp's
    refusal a client should still see: ``Connection: close`` (the body's time-out) and a
    405's ``Allow`` (RFC 9110 requires it)."""
    headers = error.headers()
    if isinstance(exc, web.HTTPException):
        headers.update({k: v for k, v in exc.headers.items() if k in ("Connection", "Allow")})
    return json_response(error.doc(), status=error.status, headers=headers)


def as_openai_error(request: web.Request, exc: Exception) -> OpenAiError:
    """``exc`` as OpenAI's error: itself, aiohttp's refusal (413, 408) at its status, a
    runtime error at its class's status, anything else a 500 (logged, as the service's
    middleware logs it)."""
    if isinstance(exc, OpenAiError):
        return exc
    if isinstance(exc, web.HTTPException) and exc.status >= 400:
        return OpenAiError(
            _http_message(exc), status=exc.status, code=f"http_{exc.status}", kind=_kind(exc.status)
        )
    if isinstance(exc, LiveError):
        hint = exc.retry_after_s
        return OpenAiError(
            exc.message,
            status=exc.http_status,
            code=exc.code,
            kind=_kind(exc.http_status),
            retry_after_s=hint,
        )
    log.exception("%s %s failed", request.method, request.path)
    return OpenAiError(
        f"internal error: {type(exc).__name__}: {exc}",
        status=500,
        code="internal",
        kind="server_error",
    )


def _http_message(exc: web.HTTPException) -> str:
    """The message of aiohttp's refusal: the JSON error document's when it carries one (the
    body's time-out names ``--body-timeout-s``), else its reason."""
    if exc.content_type == "application/json" and exc.text:
        try:
            doc = json.loads(exc.text)
            return str(doc["error"]["message"])
        except (ValueError, KeyError, TypeError):
            pass
    return exc.reason


#: The routes whose calls run model work (each a place of its client's, under a tenant bound).
CALL_PATHS = frozenset({"/v1/completions", "/pooling", "/v1/pooling", "/get_reward"})
#: Every OpenAI-style route: its errors are answered in OpenAI's shape, the service's
#: middleware's too (a tenant's bound, a missing token, a method the path does not take).
OPENAI_PATHS = CALL_PATHS | {"/v1/models"}


def openai_answer(
    request: web.Request, exc: Exception, clean: Callable[[str], str] | None = None
) -> web.Response:
    """``exc``, raised on an OpenAI-style route before or around its handler, answered in
    OpenAI's shape at its status (``clean``: the tenant's view of the message)."""
    error = as_openai_error(request, exc)
    if clean is not None:
        error.message = clean(error.message)
    return _answer(error, exc)


def unauthorized_answer(message: str) -> web.Response:
    """A missing or wrong token on an OpenAI-style route, as OpenAI answers one."""
    error = OpenAiError(message, status=401, code="invalid_api_key")
    return json_response(error.doc(), status=401, headers={"WWW-Authenticate": "Bearer"})


class OpenAiRoutes:
    """The routes over a started ``Runtime`` whose GPU executor serves model directories."""

    def __init__(self, runtime: Runtime, *, body_timeout_s: float = 60.0) -> None:
        self.runtime = runtime
        self.body_timeout_s = body_timeout_s
        #: Tokenising prompts and building answers (up to ``MAX_REQUEST_TOKENS`` each) run
        #: here, off the event loop, one at a time (a fast tokenizer is not safe to share
        #: between threads): a large request no longer stalls every other client's calls.
        self._work = ThreadPoolExecutor(1, thread_name_prefix="tangram-openai")

    async def _off_loop(self, fn: Callable[[], Any]) -> Any:
        return await asyncio.get_running_loop().run_in_executor(self._work, fn)

    def add_to(self, app: web.Application, expect_handler: Any = None) -> None:
        """Its routes on ``app``, and its worker thread's end with the app's cleanup
        (``expect_handler``: the routes' answer to an ``Expect`` header; aiohttp's if None)."""
        router = app.router
        app.on_cleanup.append(self.close)
        expect = {"expect_handler": expect_handler}
        router.add_get("/v1/models", self.models, **expect)
        router.add_post("/v1/completions", self.completions, **expect)
        router.add_post("/pooling", self.pooling, **expect)
        router.add_post("/v1/pooling", self.pooling, **expect)
        router.add_post("/get_reward", self.get_reward, **expect)

    async def close(self, app: web.Application | None = None) -> None:
        """Stop the worker thread once its work is done (the service stops): left running, it
        outlived every service that had answered one of these requests."""
        await asyncio.to_thread(self._work.shutdown, wait=True, cancel_futures=True)

    # -- the services ---------------------------------------------------------------------

    def _frontends(self) -> dict[str, Any]:
        """Registered services made from model directories, by name."""
        gpu = self.runtime.gpu
        if gpu is None:
            return {}
        found = {}
        for name in gpu.eoe.services():
            frontend = gpu.eoe.spec(name).frontend
            if frontend is not None and hasattr(frontend, "tokenizer"):
                found[name] = frontend
        return found

    def frontend_of(self, model: str, kind: str) -> Any:
        """The front end of ``model``, which must be a ``kind`` service."""
        frontends = self._frontends()
        frontend = frontends.get(model)
        if frontend is None:
            raise OpenAiError(
                f"The model `{model}` does not exist. Models served from a directory: "
                f"{sorted(frontends) or 'none'}",
                param="model",
                status=404,
                code="model_not_found",
            )
        if frontend.kind != kind:
            raise OpenAiError(
                f"model {model!r} is a {frontend.kind} service: use {ENDPOINT_OF[frontend.kind]}",
                param="model",
            )
        return frontend

    async def _body(self, request: web.Request) -> Any:
        try:
            return await read_json(request, timeout_s=self.body_timeout_s)
        except LiveError as exc:
            status = exc.http_status
            raise OpenAiError(
                exc.message, status=status, code=exc.code, kind=_kind(status)
            ) from None

    async def _call(self, model: str, inputs: dict[str, Any]) -> Any:
        """One GPU action of ``model`` on ``inputs``; its value, or the error as OpenAI's:
        a refusal at its own status (429 and 503 with ``Retry-After``), an outcome that is
        retryable (the service shut down while it waited) 503, a time-out 504, others 500.
        An error of a call that started (it ran, in part or in full: the shutdown cut it, it
        timed out or failed) says ``x-should-retry: false``: OpenAI's clients retry every 5xx
        by themselves, which ran the call a second time (the service runs nothing twice)."""
        try:
            outcome = await self.runtime.run(ActionSpec(work=GpuWork(model, inputs)))
        except LiveError as exc:
            hint = exc.retry_after_s
            raise OpenAiError(
                exc.message,
                status=exc.http_status,
                code=exc.code,
                kind=_kind(exc.http_status),
                retry_after_s=hint if hint is not None else (1.0 if exc.retryable else None),
            ) from None
        error = outcome.error
        retryable = error is not None and error.retryable
        # (A retryable outcome did not run, started or not: EOE's restore ran out of memory.)
        ran = getattr(outcome, "start_s", None) is not None and not retryable
        if ran:
            RAN.set(True)
        if not outcome.ok:
            status = 503 if retryable else 504 if outcome.status == "timeout" else 500
            note = (
                "; it started and is not run again: send a new request if it should run"
                if ran
                else ""
            )
            raise OpenAiError(
                f"the call of {model!r} ended with {outcome.status}"
                + (f": {error.message}" if error is not None else "")
                + note,
                status=status,
                code=error.code if error is not None else outcome.status,
                kind="server_error",
                retry_after_s=1.0 if retryable else None,
                should_retry=False if ran else None,
            )
        return outcome.value

    # -- handlers -------------------------------------------------------------------------

    @answers_errors
    async def models(self, request: web.Request) -> web.Response:
        # OpenAI's model object has ``created`` (Unix seconds; vLLM's model card gives the
        # time of the answer, as here): a client that validates the object refused it.
        created = int(time.time())
        data = [
            {
                "id": name,
                "object": "model",
                "created": created,
                "owned_by": "tangram",
                "kind": fe.kind,
            }
            for name, fe in sorted(self._frontends().items())
        ]
        return json_response({"object": "list", "data": data})

    @answers_errors
    async def completions(self, request: web.Request) -> web.Response:
        body = await self._body(request)
        req = await self._off_loop(lambda: completion_request(body, self.frontend_of))
        frontend = self.frontend_of(req.model, "teacher")
        batch = await self._off_loop(lambda: padded(req.prompts, frontend.pad_token_id, req.top))
        value = await self._call(req.model, batch)
        text = await self._off_loop(lambda: dumps(completion_doc(req, value, frontend)))
        return web.Response(text=text, content_type="application/json")

    @answers_errors
    async def pooling(self, request: web.Request) -> web.Response:
        body = await self._body(request)
        if not isinstance(body, dict):
            raise OpenAiError("the request body must be a JSON object")
        model = model_name(body)
        frontend = self.frontend_of(model, "reward")
        if "input" not in body:
            raise OpenAiError("'input' is a required property", param="input")
        if body.get("encoding_format") not in (None, "float"):
            raise OpenAiError(
                "only 'encoding_format': 'float' is served (scores come as JSON numbers)",
                param="encoding_format",
            )
        items = await self._off_loop(lambda: prompts(body["input"], "input", frontend))
        batch = await self._off_loop(lambda: padded(items, frontend.pad_token_id))
        scores = _finite_scores(model, _floats(await self._call(model, batch)), "input")
        return json_response(pooling_doc(model, items, scores))

    @answers_errors
    async def get_reward(self, request: web.Request) -> web.Response:
        model, texts = reward_texts(await self._body(request))
        if model is None:
            rewards = sorted(n for n, fe in self._frontends().items() if fe.kind == "reward")
            if len(rewards) != 1:
                raise OpenAiError(
                    f"name the reward service in 'model': served reward models are {rewards}",
                    param="model",
                )
            model = rewards[0]
        frontend = self.frontend_of(model, "reward")
        items = await self._off_loop(lambda: prompts(texts, "query", frontend))
        batch = await self._off_loop(lambda: padded(items, frontend.pad_token_id))
        scores = _finite_scores(model, _floats(await self._call(model, batch)), "query")
        return json_response({"rewards": scores, "scores": scores})


def _kind(status: int) -> str:
    """OpenAI's error ``type`` for a refusal at HTTP ``status``."""
    if status == 429:
        return "rate_limit_error"
    return "server_error" if status >= 500 else "invalid_request_error"


def _floats(value: Any) -> list[float]:
    """A reward model's scores as floats (a tensor, or the list the runtime made of it)."""
    values = value.tolist() if hasattr(value, "tolist") else value
    return [float(v) for v in values]


def _finite_scores(model: str, scores: list[float], field: str) -> list[float]:
    """``scores`` if each is finite; else a 500 naming the inputs whose score is not (by
    their index in ``field``). A NaN or infinite score went out as ``NaN``/``Infinity``,
    which JSON lacks: strict parsers refused the whole answer, and Python's read a float
    NaN that silently poisons a training step. vLLM's (and OpenRLHF's) servers refuse to
    encode one too (a bare 500); this one says which input. The call ran (its model gives
    the same score again): ``x-should-retry: false``, set by ``answers_errors``."""
    bad = [(i, s) for i, s in enumerate(scores) if not math.isfinite(s)]
    if not bad:
        return scores
    named = ", ".join(f"{field}[{i}]: {s}" for i, s in bad[:10])
    more = f" and {len(bad) - 10} more" if len(bad) > 10 else ""
    raise OpenAiError(
        f"reward model {model!r} gave a score that is not a finite number for {named}{more} "
        "(JSON has no NaN or infinity); check the model on those inputs",
        param=field,
        status=500,
        code="non_finite_score",
        kind="server_error",
    )
