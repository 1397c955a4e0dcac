"""The HTTP API of a Tangram service (aiohttp): trajectories, actions, status, metrics, trace,
and SandboxFusion's ``/run_code``. ``docs/live.md`` is the reference.

Every error is a JSON document ``{"error": {"code", "message", "retryable"}}`` with an HTTP
status that says who should act: a runtime error answers with the status its class declares
(``tangram.exec.runtime.errors``; ``docs/live.md`` tabulates them), a missing or wrong token
with 401, anything unexpected with 500. Errors with a back-off hint carry ``Retry-After``.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import json
import logging
import math
import tempfile
import uuid
from collections import Counter
from collections.abc import Awaitable, Callable, Iterator
from pathlib import Path
from typing import Any

from aiohttp import web

from tangram.exec.aoe.config import MAX_OUTPUT_BYTES
from tangram.exec.runtime import Runtime
from tangram.exec.runtime.errors import BadRequest, Conflict, Forbidden, LiveError
from tangram.exec.runtime.records import Outcome, check_id
from tangram.exec.service.body import (
    MAX_BODY_BYTES,
    THREAD_BYTES,
    ClientGone,
    json_response,
    read_json,
)
from tangram.exec.service.causes import translate
from tangram.exec.service.codec import dumps, is_large
from tangram.exec.service.connections import RUN_CODE_PATH
from tangram.exec.service.limits import DEFAULT_MAX_OUTPUT_BYTES
from tangram.exec.service.metrics import CONTENT_TYPE, ServiceMetrics
from tangram.exec.service.openai_routes import (
    CALL_PATHS,
    OPENAI_PATHS,
    OpenAiRoutes,
    openai_answer,
    unauthorized_answer,
)
from tangram.exec.service.openai_schema import OpenAiError
from tangram.exec.service.sandbox_fusion import (
    RunCodeSettings,
    parse_run_code,
    refusal_doc,
    run_code,
    sandbox_error,
)
from tangram.exec.service.schema import (
    error_doc,
    parse_action,
    parse_trajectory,
    state_doc,
    trajectory_doc,
)
from tangram.exec.service.tenants import Tenant, Tokens

log = logging.getLogger(__name__)

#: How much of the trace file ``GET /v1/trace`` reads and sends at a time.
TRACE_CHUNK_BYTES = 1 << 20

RUNTIME_KEY = web.AppKey("runtime", Runtime)
Handler = Callable[[web.Request], Awaitable[web.StreamResponse]]

#: Paths served without a token (liveness probes).
OPEN_PATHS = frozenset({"/healthz"})
#: A path segment holding an id: anything but '/' (aiohttp's default also refuses '{}'), and
#: then the id alphabet (``check_id``) with a 400 naming the field.
ID = "{id:[^/]+}"


def error_response(exc: LiveError, doc: dict[str, Any] | None = None) -> web.Response:
    """The answer to a runtime error: its class's status, its document (``doc`` instead when
    given), its back-off hint."""
    headers = {}
    retry = exc.retry_after_s
    if retry is not None:
        headers["Retry-After"] = str(max(1, math.ceil(retry)))
        headers["X-Retry-After-S"] = f"{retry:.3f}"
    if doc is None:
        doc = error_doc(exc.code, exc.message, exc.retryable)
    return json_response(doc, status=exc.http_status, headers=headers)


def http_refusal_doc(exc: web.HTTPException) -> dict[str, Any]:
    """A ``/run_code`` request aiohttp refused before it was read (413, 408), in both shapes
    like every refusal of that call: SandboxFusion's clients read ``status``."""
    doc = None
    if exc.content_type == "application/json" and exc.text:
        try:
            doc = json.loads(exc.text)
        except ValueError:
            doc = None
    if not isinstance(doc, dict) or not isinstance(doc.get("error"), dict):
        doc = error_doc("http_" + str(exc.status), exc.reason)
    return {**sandbox_error(str(doc["error"].get("message", exc.reason))), **doc}


def http_error_response(
    request: web.Request, exc: web.HTTPException, *, sandbox: bool = False
) -> web.Response:
    """aiohttp's refusal (404, 405, 413 ...) as the service's error document, and for
    ``/run_code`` (``sandbox``) SandboxFusion's ``SandboxError`` too, as its other refusals.
    A 405 keeps its ``Allow`` header (RFC 9110 requires it) and names the methods the path
    takes."""
    message = exc.reason
    headers = {}
    allow = exc.headers.get("Allow")
    if exc.status == 405 and allow:
        headers["Allow"] = allow
        message = f"{exc.reason}: {request.method} {request.path} takes {allow}"
    elif exc.status == 404:  # (it said "Not Found" alone: a typo'd path went unnamed)
        message = (
            f"{exc.reason}: {request.method} {request.path[:200]!r} is no route of this "
            "service (docs/live.md lists them)"
        )
    doc = error_doc("http_" + str(exc.status), message)
    if sandbox:
        doc = {**sandbox_error(message), **doc}
    return json_response(doc, status=exc.status, headers=headers)


def _kept_headers(exc: web.HTTPException) -> dict[str, str]:
    """The refusal's headers a client should still see (408 closes the connection)."""
    return {k: v for k, v in exc.headers.items() if k in ("Connection", "Retry-After")}


def _aiohttp_expect_handler() -> Callable[[web.Request], Awaitable[Any]]:
    """aiohttp's own ``Expect`` handler (a route's default, through public API): it answers
    ``100-continue`` and raises ``HTTPExpectationFailed`` (417) for any other expectation."""

    async def unused(request: web.Request) -> web.StreamResponse:
        raise AssertionError("never routed")

    return web.UrlDispatcher().add_get("/", unused).handle_expect_header


_AIOHTTP_EXPECT = _aiohttp_expect_handler()


async def expect_handler(request: web.Request) -> web.StreamResponse | None:
    """A request's ``Expect`` header, answered before its handler and every middleware (as
    aiohttp does): ``100-continue`` as aiohttp does, any other a 417 in its path's shape.
    aiohttp's 417 was a plain-text "Unknown Expect: ..." where every other refusal is the
    error document (SandboxFusion's or OpenAI's on their routes)."""
    try:
        return await _AIOHTTP_EXPECT(request)
    except web.HTTPException as exc:
        if exc.status != 417:
            raise
    expect = request.headers.get("Expect", "")[:100]
    message = f"header Expect: {expect!r} cannot be met: only '100-continue' is served"
    if request.path in OPENAI_PATHS:
        return openai_answer(request, OpenAiError(message, status=417, code="http_417"))
    doc = error_doc("http_417", message)
    if request.path == RUN_CODE_PATH:
        doc = {**sandbox_error(message), **doc}
    return json_response(doc, status=417)


def check_seconds(name: str, value: object) -> None:
    """``ValueError`` naming ``name`` unless ``value`` is seconds > 0 (``math.inf``: no
    bound). A NaN was no cap at all (``min(wait, nan)`` is ``wait``), 0 or less answered
    every wait at once or refused every body, and a boolean was 1 s."""
    if isinstance(value, bool) or not isinstance(value, int | float) or not value > 0:
        raise ValueError(f"{name} must be a number of seconds > 0, got {value!r}")


def bearer_token(header: str) -> str | None:
    """The token of an ``Authorization: Bearer TOKEN`` header (None for another scheme or
    none). The scheme is matched without regard to case and may be followed by more than one
    space (RFC 7235 section 2.1: ``auth-scheme 1*SP token68``): ``bearer TOKEN`` is a 401
    nowhere else, and a client library that writes it was refused here."""
    scheme, space, credentials = header.partition(" ")
    if not space or scheme.lower() != "bearer":
        return None
    return credentials.lstrip(" ")


def path_id(request: web.Request, field: str) -> str:
    """The id in the request's path, checked against the id alphabet (400 naming ``field``)."""
    return check_id(field, request.match_info["id"])


class ServiceApp:
    """Builds the aiohttp application around a started ``Runtime``.

    ``token``: when set, every request but ``/healthz`` needs ``Authorization: Bearer TOKEN``
    (or ``X-Tangram-Token``). ``clients``: tenants (name -> token), each with ids of its own
    (``tenants``); ``token`` is then the operator's, who sees everything; ``tenant_max_pending``
    bounds the actions each tenant may have pending (None: only the runtime's shared bound), so
    one tenant's flood cannot take every place; ``tenant_max_trajectories`` the trajectories it
    may have open, so one cannot take the node's memory with containers. ``trace_path``: where ``POST /v1/trace`` writes. ``max_wait_s``
    caps how long one request may wait for an outcome (a longer ``wait`` answers 202 and the
    client polls). ``max_output_bytes``: the most output per stream a CPU action may ask for
    (more is refused with a 400), and its default. ``body_timeout_s``: a request body must
    arrive within it (else 408).
    """

    def __init__(
        self,
        runtime: Runtime,
        *,
        token: str | None = None,
        clients: dict[str, str] | None = None,
        tenant_max_pending: int | None = None,
        tenant_max_trajectories: int | None = None,
        trace_path: Path | None = None,
        run_code_settings: RunCodeSettings | None = None,
        max_wait_s: float = 300.0,
        max_output_bytes: int = DEFAULT_MAX_OUTPUT_BYTES,
        body_timeout_s: float = 60.0,
    ) -> None:
        self.runtime = runtime
        self.tokens = Tokens(token, clients)
        for name, bound in (
            ("tenant_max_pending", tenant_max_pending),
            ("tenant_max_trajectories", tenant_max_trajectories),
        ):
            if bound is not None and (
                isinstance(bound, bool) or not isinstance(bound, int) or bound < 1
            ):
                raise ValueError(f"{name} must be a positive integer, got {bound!r}")
        self.tenant_max_pending = tenant_max_pending
        self.tenant_max_trajectories = tenant_max_trajectories
        check_seconds("max_wait_s", max_wait_s)
        check_seconds("body_timeout_s", body_timeout_s)
        if (
            isinstance(max_output_bytes, bool)
            or not isinstance(max_output_bytes, int)
            or not 1 <= max_output_bytes <= MAX_OUTPUT_BYTES
        ):
            # (At most AOE's own bound: beyond it every action asking for the service's cap
            # was accepted here and then refused by AOE.)
            raise ValueError(
                f"max_output_bytes must be an integer between 1 and {MAX_OUTPUT_BYTES} "
                f"(AOE's most), got {max_output_bytes!r}"
            )
        #: Each tenant's trajectory opens under way (counted against its bound while the
        #: runtime waits for memory: two opens racing must not both pass at the last place).
        #: Counted per id: a second open of an id still opening holds the place too (the first
        #: may give up while the second still waits).
        self.tenant_opening: dict[str, Counter[str]] = {
            name: Counter() for name in self.tokens.names
        }
        #: Each tenant's accepted actions without an outcome yet (``tenant_max_pending``).
        self.tenant_pending: dict[str, set[str]] = {name: set() for name in self.tokens.names}
        runtime.on_outcome.append(self._ended)
        self.trace_path = trace_path
        self.run_code_settings = run_code_settings or RunCodeSettings()
        self.max_wait_s = max_wait_s
        self.max_output_bytes = max_output_bytes
        self.body_timeout_s = body_timeout_s
        self.metrics = ServiceMetrics(runtime)

    def build(self) -> web.Application:
        app = web.Application(
            middlewares=[self._errors, self._auth], client_max_size=MAX_BODY_BYTES
        )
        app[RUNTIME_KEY] = self.runtime
        r = app.router
        expect = {"expect_handler": self._expect}
        r.add_get("/healthz", self.healthz, **expect)
        r.add_get("/v1/status", self.status, **expect)
        r.add_get("/metrics", self.metrics_text, **expect)
        r.add_post("/v1/trajectories", self.open_trajectory, **expect)
        r.add_get("/v1/trajectories", self.list_trajectories, **expect)
        r.add_get(f"/v1/trajectories/{ID}", self.get_trajectory, **expect)
        r.add_delete(f"/v1/trajectories/{ID}", self.close_trajectory, **expect)
        r.add_post(f"/v1/trajectories/{ID}/recreate", self.recreate_trajectory, **expect)
        r.add_post("/v1/actions", self.submit, **expect)
        r.add_get(f"/v1/actions/{ID}", self.get_action, **expect)
        r.add_delete(f"/v1/actions/{ID}", self.cancel, **expect)
        r.add_get("/v1/trace", self.get_trace, **expect)
        r.add_post("/v1/trace", self.save_trace, **expect)
        r.add_post("/v1/submissions", self.submissions, **expect)
        r.add_post("/run_code", self.run_code, **expect)
        OpenAiRoutes(self.runtime, body_timeout_s=self.body_timeout_s).add_to(
            app, expect_handler=self._expect
        )
        return app

    # -- middlewares ----------------------------------------------------------------------

    @web.middleware
    async def _errors(self, request: web.Request, handler: Handler) -> web.StreamResponse:
        try:
            return await handler(request)
        except LiveError as exc:
            error = translate(exc)
            tenant = _tenant(request)
            if request.path in OPENAI_PATHS:  # (a tenant's bound, before the route's handler)
                return openai_answer(request, error, tenant.clean if tenant else None)
            if tenant is None:
                return error_response(error)
            doc = error_doc(error.code, tenant.clean(error.message), error.retryable)
            return error_response(error, doc)
        except web.HTTPException as exc:
            if exc.status >= 400 and request.path in OPENAI_PATHS:
                return openai_answer(request, exc)  # (a method the path does not take)
            if exc.status >= 400 and request.path == RUN_CODE_PATH:
                return http_error_response(request, exc, sandbox=True)  # (ditto)
            if exc.status >= 400 and exc.content_type != "application/json":
                return http_error_response(request, exc)
            raise
        except ClientGone as exc:
            log.info("%s %s: %s; nothing was accepted", request.method, request.path, exc)
            return web.Response(status=400)  # (never sent: the connection is gone)
        except (asyncio.CancelledError, ConnectionResetError):
            raise  # the client went away: nothing to answer
        except Exception as exc:
            log.exception("%s %s failed", request.method, request.path)
            return internal_error(request, exc)

    @web.middleware
    async def _auth(self, request: web.Request, handler: Handler) -> web.StreamResponse:
        if not self.tokens.required or request.path in OPEN_PATHS:
            return await handler(request)
        refused = self._admission(request)
        if refused is not None:
            return refused
        if request.method == "POST" and request.path in CALL_PATHS:
            with self._place_for_request(request):
                return await handler(request)
        return await handler(request)

    async def _expect(self, request: web.Request) -> web.StreamResponse | None:
        """A request's ``Expect`` header (``expect_handler``), once its token is checked: a
        client that asks ``100-continue`` waits before sending its body precisely so that a
        refusal comes first, yet it was told to continue whatever its token, uploaded up to
        64 MiB, and only then read its 401 (or its tenant's connection 429)."""
        if self.tokens.required and request.path not in OPEN_PATHS:
            refused = self._admission(request) or self._place_refusal(request)
            if refused is not None:
                return refused
        return await expect_handler(request)

    def _place_refusal(self, request: web.Request) -> web.Response | None:
        """The 429 of a tenant at ``--tenant-max-pending`` asking to continue a request that
        always takes a place (``/run_code``, an OpenAI-style call: ``_place_for_request``),
        in its path's shape; None otherwise. It was told to continue, uploaded its body, and
        only then read the 429. A submission (``/v1/actions``) is told to continue: its body
        names its id, and a resend of an accepted one takes no new place."""
        tenant = _tenant(request)
        takes_place = request.path == RUN_CODE_PATH or request.path in CALL_PATHS
        if tenant is None or request.method != "POST" or not takes_place:
            return None
        try:
            self._claim_place(tenant)  # (checks only: the place is taken with the body)
        except LiveError as exc:
            error = translate(exc)
            if request.path in OPENAI_PATHS:
                return openai_answer(request, error, tenant.clean)
            return error_response(error, refusal_doc(error))
        return None

    def _admission(self, request: web.Request) -> web.Response | None:
        """The refusal of a request whose token is missing or wrong (401) or whose tenant is
        at its connection bound (429), in its path's shape; None if it may go on (its tenant
        noted on the request)."""
        given = request.headers.get("X-Tangram-Token", "")
        bearer = bearer_token(request.headers.get("Authorization", ""))
        if bearer is not None:
            given = bearer
        known, tenant = self.tokens.match(given)
        request[TENANT_KEY] = tenant
        if not known:
            message = "missing or wrong token: send 'Authorization: Bearer TOKEN'"
            if request.path in OPENAI_PATHS:
                return unauthorized_answer(message)
            doc = error_doc("unauthorized", message)
            if request.path == RUN_CODE_PATH:  # SandboxFusion's clients read its shape
                doc = {**sandbox_error(message), **doc}
            return json_response(doc, status=401, headers={"WWW-Authenticate": "Bearer"})
        return None if tenant is None else self._tenant_connection(request, tenant)

    def _tenant_connection(self, request: web.Request, tenant: Tenant) -> web.Response | None:
        """The 429 to a tenant's request on a connection beyond its
        ``--tenant-max-connections`` (``ErrorDocHandler.hold_for_tenant``: counted once per
        connection, until it closes), in its path's shape, closing the connection (it frees
        its place in ``--max-connections``); None if the connection may serve it. A
        connection handler without the bound (aiohttp's own, in tests) holds every one."""
        hold = getattr(request.protocol, "hold_for_tenant", None)
        message = hold(tenant.name) if hold is not None else None
        if message is None:
            return None
        error = self.runtime.overloaded("refused_tenant_connections", message)
        if request.path in OPENAI_PATHS:
            answer = openai_answer(request, error, tenant.clean)
        elif request.path == RUN_CODE_PATH:  # SandboxFusion's clients read its shape
            answer = error_response(error, refusal_doc(error))
        else:
            answer = error_response(error)
        answer.force_close()
        return answer

    # -- helpers --------------------------------------------------------------------------

    async def _body(
        self,
        request: web.Request,
        *,
        optional: bool = False,
        then: Callable[[Any], Any] | None = None,
    ) -> Any:
        """The request's JSON body (``then`` of it: off the loop with a large body's parse)."""
        return await read_json(request, timeout_s=self.body_timeout_s, optional=optional, then=then)

    def _trajectory_id(self, request: web.Request, value: str | None) -> str | None:
        """The runtime's id for a trajectory the client names (a tenant's: in its namespace)."""
        tenant = _tenant(request)
        if tenant is None or value is None:
            return value
        return tenant.inner("trajectory", value)

    def _action_id(self, request: web.Request, value: str) -> str:
        tenant = _tenant(request)
        return value if tenant is None else tenant.inner("id", value)

    def _wait_s(self, wait: float | None) -> float | None:
        if wait is None:
            return None
        return min(wait, self.max_wait_s)

    # -- handlers -------------------------------------------------------------------------

    async def healthz(self, request: web.Request) -> web.Response:
        return json_response({"ok": not self.runtime.closing})

    async def status(self, request: web.Request) -> web.Response:
        doc = self.runtime.status()
        doc["residency"] = {k: list(v) for k, v in doc["residency"].items()}
        return json_response(doc)

    async def metrics_text(self, request: web.Request) -> web.Response:
        return web.Response(body=self.metrics.render(), headers={"Content-Type": CONTENT_TYPE})

    async def open_trajectory(self, request: web.Request) -> web.Response:
        args = parse_trajectory(await self._body(request, optional=True))
        tenant = _tenant(request)
        if tenant is not None:
            given = args["trajectory"]
            args["trajectory"] = tenant.fresh("t") if given is None else tenant.inner("id", given)
        if tenant is None or self.tenant_max_trajectories is None:
            info = await self.runtime.open_trajectory(**args)
        else:
            info = await self._tenant_open(tenant, args)
        return json_response(_trajectory_doc(request, info), status=201)

    async def _tenant_open(self, tenant: Tenant, args: dict[str, Any]) -> Any:
        """Open within the tenant's trajectory bound: its open (or closing) trajectories and
        the opens under way count, and the place is taken before the runtime is asked (no
        await between). An id already open or opening is the runtime's to answer (a 409)."""
        rt, prefix, traj = self.runtime, tenant.name + ":", args["trajectory"]
        opening = self.tenant_opening[tenant.name]
        held = {t.id for t in rt.public_trajectories() if t.id.startswith(prefix)} | set(opening)
        cap = self.tenant_max_trajectories
        if traj not in held and cap is not None and len(held) >= cap:
            raise rt.overloaded(
                "refused_tenant_trajectories",
                f"{len(held)} trajectories of tenant {tenant.name!r} open or opening, its "
                f"limit (--tenant-max-trajectories) is {cap}; close one, or retry later",
            )
        opening[traj] += 1
        try:
            return await rt.open_trajectory(**args)
        finally:
            opening[traj] -= 1
            if opening[traj] <= 0:
                del opening[traj]

    async def list_trajectories(self, request: web.Request) -> web.Response:
        tenant = _tenant(request)
        infos = self.runtime.public_trajectories()
        if tenant is not None:
            infos = [t for t in infos if tenant.owns(t.id)]
        return json_response({"trajectories": [_trajectory_doc(request, t) for t in infos]})

    def _public_trajectory(self, request: web.Request) -> str | None:
        named = self._trajectory_id(request, path_id(request, "trajectory"))
        return self.runtime.public_trajectory(named)

    async def get_trajectory(self, request: web.Request) -> web.Response:
        """One trajectory; one still opening is answered once open (or 404 if its open
        fails): a client that retried a lost open answer reads it here, and returned it still
        without its container, maybe never to open."""
        info = await self.runtime.opened_trajectory(self._public_trajectory(request))
        return json_response(_trajectory_doc(request, info))

    async def close_trajectory(self, request: web.Request) -> web.Response:
        info = await self.runtime.close_trajectory(self._public_trajectory(request))
        return json_response({**_trajectory_doc(request, info), "closed": True})

    async def recreate_trajectory(self, request: web.Request) -> web.Response:
        info = await self.runtime.recreate_trajectory(self._public_trajectory(request))
        return json_response(_trajectory_doc(request, info))

    async def submit(self, request: web.Request) -> web.Response:
        cap = self.max_output_bytes
        spec, wait = await self._body(
            request, then=lambda body: parse_action(body, max_output_bytes=cap)
        )
        tenant = _tenant(request)
        if tenant is not None:
            spec = dataclasses.replace(
                spec,
                id=tenant.fresh("a") if spec.id is None else tenant.inner("id", spec.id),
                trajectory=self._trajectory_id(request, spec.trajectory),
            )
        self.runtime.public_trajectory(spec.trajectory)
        if tenant is None or self.tenant_max_pending is None:
            action_id = await self.runtime.submit(spec)
        else:
            action_id = await self._tenant_submit(tenant, spec)
        return await self._answer(action_id, self._wait_s(wait), tenant)

    async def _tenant_submit(self, tenant: Tenant, spec: Any) -> str:
        """Submit within the tenant's bound: its place is taken before the runtime is asked
        (no await between the count and the claim) and given back if nothing was accepted.

        A resubmission (an id accepted before, in memory or in the journal, or one this
        tenant's place is already held for: a retry racing its first send) takes no new place;
        a failed submission gives back only a place it took and the runtime does not hold."""
        rt, mine = self.runtime, self.tenant_pending[tenant.name]
        # (The journal is asked only at the bound: below it a resubmission's place is given
        # back below, once the runtime has answered it, and the runtime asks the journal once.)
        at_bound = len(mine) >= (self.tenant_max_pending or 0)
        if spec.id in mine or (at_bound and rt.known(spec.id)):
            return await rt.submit(spec)
        self._claim_place(tenant)
        mine.add(spec.id)
        try:
            action_id = await rt.submit(spec)
        except BaseException:
            rec = rt.host.table.get(spec.id)
            if rec is None or rec.outcome is not None:
                mine.discard(spec.id)
            raise
        if action_id != spec.id or rt.state(action_id) == "done":  # (accepted in an earlier run)
            mine.discard(spec.id)
        return action_id

    def _claim_place(self, tenant: Tenant) -> None:
        """``Overloaded`` when the tenant holds ``tenant_max_pending`` places (the caller then
        takes one, with no await in between)."""
        rt, held, cap = self.runtime, len(self.tenant_pending[tenant.name]), self.tenant_max_pending
        if cap is None or held < cap:
            return
        raise rt.overloaded(
            "refused_tenant",
            f"{held} actions of tenant {tenant.name!r} pending, its limit "
            f"(--tenant-max-pending) is {cap}; nothing was accepted, retry later",
        )

    @contextlib.contextmanager
    def _place_for_request(self, request: web.Request) -> Iterator[None]:
        """A tenant's request that runs work the client never names (``/run_code``, the
        OpenAI-style calls) holds one of its places while it runs: within its bound too."""
        tenant = _tenant(request)
        if tenant is None or self.tenant_max_pending is None:
            yield
            return
        self._claim_place(tenant)
        key = f"~{tenant.name}:request-{uuid.uuid4().hex}"  # (no action id starts with '~')
        mine = self.tenant_pending[tenant.name]
        mine.add(key)
        try:
            yield
        finally:
            mine.discard(key)

    def _ended(self, outcome: Outcome) -> None:
        for name, pending in self.tenant_pending.items():
            if outcome.action_id.startswith(name + ":"):
                pending.discard(outcome.action_id)
                return

    async def get_action(self, request: web.Request) -> web.Response:
        named = self._action_id(request, path_id(request, "id"))
        action_id = self.runtime.public_action(named)
        wait = request.query.get("wait")
        seconds = None
        if wait is not None:
            try:
                seconds = float(wait)
            except ValueError:
                raise BadRequest(f"query 'wait': expected seconds, got {wait!r}") from None
            if not seconds >= 0:
                raise BadRequest(f"query 'wait': expected seconds >= 0, got {wait!r}")
        return await self._answer(action_id, self._wait_s(seconds), _tenant(request))

    async def _answer(
        self, action_id: str, wait: float | None, tenant: Tenant | None
    ) -> web.Response:
        rt = self.runtime
        outcome = await rt.result(action_id, 0.0 if wait is None else wait)
        state = "done" if outcome is not None else rt.state(action_id)
        return await _state_answer(tenant, action_id, state, outcome)

    async def cancel(self, request: web.Request) -> web.Response:
        named = self._action_id(request, path_id(request, "id"))
        outcome = await self.runtime.cancel(self.runtime.public_action(named))
        return await _state_answer(_tenant(request), outcome.action_id, "done", outcome)

    async def get_trace(self, request: web.Request) -> web.StreamResponse:
        """The trace so far, streamed from a copy on disk in 1 MiB chunks (never held whole
        in memory: a long run's trace is tens of MB). The operator's alone: it holds every
        tenant's actions."""
        _operator_only(request, "the trace")
        loop = asyncio.get_running_loop()
        with tempfile.TemporaryDirectory(prefix="tangram-trace-") as tmp:
            path = await loop.run_in_executor(
                None, self.runtime.write_trace, Path(tmp) / "live.jsonl"
            )
            response = web.StreamResponse(headers={"Content-Type": "application/x-ndjson"})
            response.content_length = path.stat().st_size
            await response.prepare(request)
            with path.open("rb") as f:
                while chunk := await loop.run_in_executor(None, f.read, TRACE_CHUNK_BYTES):
                    await self._send_chunk(request, response, chunk)
            await response.write_eof()
            return response

    async def _send_chunk(
        self, request: web.Request, response: web.StreamResponse, chunk: bytes
    ) -> None:
        """Write ``chunk`` of a streamed answer; a client that takes none of it within the
        body time-out is cut off (``ConnectionResetError``, its connection aborted): one that
        never read the trace held its connection, and the trace's copy on disk, for good."""
        try:
            async with asyncio.timeout(self.body_timeout_s):
                await response.write(chunk)
        except TimeoutError:
            log.info(
                "%s %s: the client read nothing of its answer for %g s (the service's "
                "--body-timeout-s); its connection is closed",
                request.method,
                request.path,
                self.body_timeout_s,
            )
            if request.transport is not None:
                request.transport.abort()
            raise ConnectionResetError("the client did not read its answer") from None

    async def save_trace(self, request: web.Request) -> web.Response:
        _operator_only(request, "the trace")
        if self.trace_path is None:
            raise Conflict(
                "this service has no trace path: start it with --trace PATH, or download the "
                "trace with GET /v1/trace"
            )
        loop = asyncio.get_running_loop()
        path = await loop.run_in_executor(None, self.runtime.write_trace, self.trace_path)
        return json_response({"path": str(path), "rows": len(self.runtime.recorder)})

    async def submissions(self, request: web.Request) -> web.Response:
        """``{"done": true}`` (the default): the step's actions are all submitted, no call is
        to come; ``false``: more come. The operator's (a tenant's word would steer every
        tenant's GPU calls)."""
        _operator_only(request, "the end of a step's submissions")
        body = await self._body(request, optional=True)
        if body is None:
            body = {}
        if not isinstance(body, dict) or set(body) - {"done"}:
            raise BadRequest(f"expected {{'done': true|false}}, got {body!r}"[:300])
        done = body.get("done", True)
        if not isinstance(done, bool):
            raise BadRequest(f"field 'done' must be true or false, got {done!r}"[:300])
        self.runtime.submissions_done(done)
        return json_response({"done": done})

    async def run_code(self, request: web.Request) -> web.Response:
        """SandboxFusion's call; a request refused before anything ran answers in both
        shapes (``refusal_doc``) at its error's status."""
        settings = self.run_code_settings
        cpu = self.runtime.cpu
        try:
            memory_gb = cpu.node.memory_gb if cpu else None
            # (Checked where the body is parsed: off the loop for a large one, whose files'
            # base64, up to 64 MiB, took the loop ~0.2-0.3 s to decode.)
            req = await self._body(
                request, then=lambda body: parse_run_code(body, settings, memory_gb)
            )
            with self._place_for_request(request):
                answer = await run_code(
                    self.runtime, req, settings, max_output_bytes=self.max_output_bytes
                )
            # (Made here: an answer that cannot be encoded is a 500 in SandboxFusion's shape.)
            return await _run_code_answer(answer)
        except LiveError as exc:
            error = translate(exc)
            return error_response(error, refusal_doc(error))
        except web.HTTPException as exc:  # the body was too large (413) or too slow (408)
            if exc.status < 400:
                raise
            return json_response(
                http_refusal_doc(exc), status=exc.status, headers=_kept_headers(exc)
            )
        except ConnectionResetError:
            raise  # the client went away (``ClientGone`` included): nothing to answer
        except Exception as exc:  # a bug: SandboxFusion's clients read its shape all the same
            log.exception("%s %s failed", request.method, request.path)
            return internal_error(request, exc, sandbox=True)


async def _run_code_answer(answer: dict[str, Any]) -> web.Response:
    """``/run_code``'s answer; encoded in a worker thread when its fetched files are large
    (up to 32 MiB of them, 43 MB of base64: ~0.15 s of the loop)."""
    files = answer.get("files")
    size = sum(len(v) for v in files.values() if isinstance(v, str)) if files else 0
    if size <= THREAD_BYTES:
        return json_response(answer)
    text = await asyncio.to_thread(dumps, answer)
    return web.Response(text=text, content_type="application/json")


def internal_error(request: web.Request, exc: Exception, *, sandbox: bool = False) -> web.Response:
    """The 500 answering an unexpected exception: the error document, and for ``/run_code``
    (``sandbox``) SandboxFusion's ``SandboxError`` too, as its every other error answer: its
    clients read ``status`` and ``message``, which Tangram's document alone lacked."""
    message = f"internal error: {type(exc).__name__}: {exc}"
    tenant = _tenant(request)
    if tenant is not None:
        message = tenant.clean(message)
    doc = error_doc("internal", message)
    if sandbox:
        doc = {**sandbox_error(message), **doc}
    return json_response(doc, status=500)


#: The tenant a request's token names (absent or None: the operator, or no token at all).
TENANT_KEY = web.RequestKey("tenant", object)


def _tenant(request: web.Request) -> Tenant | None:
    tenant = request.get(TENANT_KEY)
    return tenant if isinstance(tenant, Tenant) else None


def _operator_only(request: web.Request, what: str) -> None:
    tenant = _tenant(request)
    if tenant is not None:
        raise Forbidden(
            f"{what} concerns every tenant's actions: tenant {tenant.name!r} may not use it "
            "(the operator's token may)"
        )


def _trajectory_doc(request: web.Request, info: Any) -> dict[str, Any]:
    doc = trajectory_doc(info)
    tenant = _tenant(request)
    if tenant is not None:
        doc["id"] = tenant.outer(doc["id"])
    return doc


async def _state_answer(
    tenant: Tenant | None, action_id: str, state: str, outcome: Outcome | None
) -> web.Response:
    """An action's state (200 with its outcome, 202 without). A large result (``is_large``)
    is encoded in a worker thread: a GPU call's 256 x 4096 floats took the loop 2.5 s per
    answer (to lists, then to text), every other client's requests waiting."""
    status = 200 if outcome is not None else 202
    if outcome is None or not is_large(outcome.value):
        return json_response(_state_doc(tenant, action_id, state, outcome), status=status)
    text = await asyncio.to_thread(lambda: dumps(_state_doc(tenant, action_id, state, outcome)))
    return web.Response(text=text, status=status, content_type="application/json")


def _state_doc(tenant: Tenant | None, action_id: str, state: str, outcome: Any) -> dict[str, Any]:
    doc = state_doc(action_id, state, outcome)
    if tenant is not None:
        doc["id"] = tenant.outer(doc["id"])
        if doc["outcome"] is not None:
            doc["outcome"]["id"] = tenant.outer(doc["outcome"]["id"])
            out = doc["outcome"]
            out["trajectory"] = tenant.outer(out["trajectory"])
            # Messages and reasons name the tenant's ids as the tenant does (a queued
            # action's "trajectory 'alice:t0' was closed ...").
            if out.get("error"):
                out["error"]["message"] = tenant.clean(out["error"]["message"])
            if isinstance(out.get("reason"), str):
                out["reason"] = tenant.clean(out["reason"])
    return doc
