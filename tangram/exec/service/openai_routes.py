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

import functools
import logging
from collections.abc import Awaitable, Callable
from typing import Any

from aiohttp import web

from tangram.exec.runtime import Runtime
from tangram.exec.runtime.errors import LiveError
from tangram.exec.runtime.records import ActionSpec, GpuWork
from tangram.exec.service.body import read_json
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
    """Answer an ``OpenAiError`` raised by ``handler`` in OpenAI's shape at its status."""

    @functools.wraps(handler)
    async def wrapped(self: Any, request: web.Request) -> web.Response:
        try:
            return await handler(self, request)
        except OpenAiError as exc:
            return web.json_response(exc.doc(), status=exc.status)

    return wrapped


class OpenAiRoutes:
    """The routes over a started ``Runtime`` whose GPU executor serves model directories."""

    def __init__(self, runtime: Runtime, *, body_timeout_s: float = 60.0) -> None:
        self.runtime = runtime
        self.body_timeout_s = body_timeout_s

    def add_to(self, router: web.UrlDispatcher) -> None:
        router.add_get("/v1/models", self.models)
        router.add_post("/v1/completions", self.completions)
        router.add_post("/pooling", self.pooling)
        router.add_post("/v1/pooling", self.pooling)
        router.add_post("/get_reward", self.get_reward)

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
            raise OpenAiError(exc.message, status=exc.http_status) from None

    async def _call(self, model: str, inputs: dict[str, Any]) -> Any:
        """One GPU action of ``model`` on ``inputs``; its value, or the error as OpenAI's."""
        try:
            outcome = await self.runtime.run(ActionSpec(work=GpuWork(model, inputs)))
        except LiveError as exc:
            kind = "server_error" if exc.http_status >= 500 else "invalid_request_error"
            raise OpenAiError(
                exc.message, status=exc.http_status, code=exc.code, kind=kind
            ) from None
        if not outcome.ok:
            error = outcome.error
            raise OpenAiError(
                f"the call of {model!r} ended with {outcome.status}"
                + (f": {error.message}" if error is not None else ""),
                status=504 if outcome.status == "timeout" else 500,
                code=error.code if error is not None else outcome.status,
                kind="server_error",
            )
        return outcome.value

    # -- handlers -------------------------------------------------------------------------

    @answers_errors
    async def models(self, request: web.Request) -> web.Response:
        data = [
            {"id": name, "object": "model", "owned_by": "tangram", "kind": fe.kind}
            for name, fe in sorted(self._frontends().items())
        ]
        return web.json_response({"object": "list", "data": data})

    @answers_errors
    async def completions(self, request: web.Request) -> web.Response:
        req = completion_request(await self._body(request), self.frontend_of)
        frontend = self.frontend_of(req.model, "teacher")
        batch = padded(req.prompts, frontend.pad_token_id, req.top)
        value = await self._call(req.model, batch)
        return web.json_response(completion_doc(req, value, frontend))

    @answers_errors
    async def pooling(self, request: web.Request) -> web.Response:
        body = await self._body(request)
        if not isinstance(body, dict):
            raise OpenAiError("the request body must be a JSON object")
        model = model_name(body)
        frontend = self.frontend_of(model, "reward")
        if "input" not in body:
            raise OpenAiError("'input' is a required property", param="input")
        items = prompts(body["input"], "input", frontend)
        scores = await self._call(model, padded(items, frontend.pad_token_id))
        return web.json_response(pooling_doc(model, items, _floats(scores)))

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
        items = prompts(texts, "query", frontend)
        scores = _floats(await self._call(model, padded(items, frontend.pad_token_id)))
        return web.json_response({"rewards": scores, "scores": scores})


def _floats(value: Any) -> list[float]:
    """A reward model's scores as floats (a tensor, or the list the runtime made of it)."""
    values = value.tolist() if hasattr(value, "tolist") else value
    return [float(v) for v in values]
