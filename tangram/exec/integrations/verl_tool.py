"""A stateful sandbox tool for verl's agent loop, on a per-trajectory Tangram container.

verl's ``SandboxFusionTool`` is stateless: every call runs in a fresh sandbox, so a file written
by one tool call is gone at the next. ``TangramSandboxTool`` follows verl's ``BaseTool``
lifecycle on one container per trajectory of ``tangram serve``:

- ``create``: opens a trajectory (a container: memory, files and processes kept until release;
  from the service's warm pool when it has one);
- ``execute``: runs the call's ``code`` (python or bash) in that container as one action: the
  scheduler grants it cores for this call only (``max_units``, elastic when > 1);
- ``calc_reward``: runs the configured ``reward_command`` in the same container (e.g. the
  task's tests): 1.0 when it exits 0, else 0.0; 0.0 without one;
- ``release``: closes the trajectory (its container goes).

Config (verl's tool yaml, ``verl_tool_config.yaml`` beside this file): ``tangram_url``,
``token``, ``image``, ``memory_gb``, ``max_units``, ``t1_s``, ``serial_fraction``, ``timeout_s``,
``max_output_chars``, ``default_language``, ``reward_command``. Needs the ``verl`` package
(``pip install --no-deps verl`` works: the tool modules need only pydantic, omegaconf and
tensordict besides).
"""

from __future__ import annotations

import asyncio
import base64
import logging
import shlex
import uuid
from collections.abc import Mapping
from dataclasses import dataclass, fields
from typing import Any

from verl.tools.base_tool import BaseTool
from verl.tools.schemas import OpenAIFunctionToolSchema, ToolResponse

from tangram.exec.runtime.errors import BadRequest, Conflict, UnknownTrajectory
from tangram.exec.runtime.records import (
    ActionSpec,
    CpuWork,
    check_image,
    check_memory_gb,
    is_finite_number,
)
from tangram.exec.service.client import AsyncClient
from tangram.exec.service.retry import ServiceError

log = logging.getLogger(__name__)

#: How long an open waits for memory on a full node (the service's ``wait_s``).
OPEN_WAIT_S = 60.0
#: How long past what a call may take (its action's ``timeout_s``, an open's wait for room)
#: the tool waits for the service's answer. Unbounded, a service that took a request and
#: never answered held the call for the client's read time-out (360 s) on each of its 9
#: attempts: 54 minutes of a rollout on one tool call.
ANSWER_MARGIN_S = 60.0

#: How each language's code is run: file name and interpreter.
RUNNERS: dict[str, tuple[str, str]] = {"python": (".py", "python3"), "bash": (".sh", "bash")}

SCHEMA = {
    "type": "function",
    "function": {
        "name": "code_interpreter",
        "description": "Run code in this conversation's sandbox. Files and background "
        "processes persist between calls.",
        "parameters": {
            "type": "object",
            "properties": {
                "code": {"type": "string", "description": "The code to run."},
                "language": {"type": "string", "description": "python (default) or bash."},
            },
            "required": ["code"],
        },
    },
}


@dataclass(frozen=True)
class ToolSettings:
    """The tool's config, from verl's tool yaml (unknown keys such as ``type`` are ignored)."""

    tangram_url: str = "http://127.0.0.1:8765"
    token: str | None = None
    image: str = "tangram-python"
    memory_gb: float = 1.0
    max_units: int = 1
    t1_s: float = 1.0
    serial_fraction: float = 0.1
    timeout_s: float = 30.0
    max_output_chars: int = 8000
    default_language: str = "python"
    reward_command: str | None = None

    def __post_init__(self) -> None:
        """``ValueError`` naming a setting no call could be served with, when verl loads the
        tool: taken as given, a negative ``max_output_chars`` cut every answer's end without
        a word, and a bad ``max_units`` or ``timeout_s`` failed every call mid-rollout."""
        if not isinstance(self.tangram_url, str) or not self.tangram_url.startswith(
            ("http://", "https://")
        ):
            raise ValueError(f"tangram_url must be an http(s):// URL, got {self.tangram_url!r}")
        for name in ("token", "reward_command"):
            value = getattr(self, name)
            if value is not None and (not isinstance(value, str) or not value):
                raise ValueError(f"{name} must be a non-empty string or absent, got {value!r}")
        if not isinstance(self.image, str) or not self.image:
            raise ValueError(f"image must be a non-empty image reference, got {self.image!r}")
        for name in ("max_units", "max_output_chars"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise ValueError(f"{name} must be an integer >= 1, got {value!r}")
        for name in ("memory_gb", "t1_s", "timeout_s"):
            if not _positive(getattr(self, name)):
                raise ValueError(f"{name} must be a number > 0, got {getattr(self, name)!r}")
        fraction = self.serial_fraction
        if not is_finite_number(fraction) or not 0 <= fraction <= 1:
            raise ValueError(f"serial_fraction must be in [0, 1], got {fraction!r}")
        if self.default_language not in RUNNERS:
            raise ValueError(
                f"default_language must be one of {sorted(RUNNERS)}, got {self.default_language!r}"
            )
        self._check_as_action()

    def _check_as_action(self) -> None:
        """``ValueError`` (the service's own words, naming the setting) when an open or an
        action with these settings would be refused: an image that is no image reference,
        less memory than the smallest container, a ``timeout_s`` over 30 days, a ``t1_s``
        past the trace's longest time, a ``max_units`` past int64 passed the checks above,
        and the service refused every call with a 400 mid-rollout. (Checked by the
        runtime's own rules, so the two cannot drift apart.)"""
        try:
            check_image("image", self.image)
            check_memory_gb("memory_gb", self.memory_gb)
            ActionSpec(
                CpuWork(self.reward_command or "true"),
                trajectory="t",
                max_units=self.max_units,
                t1_s=self.t1_s,
                serial_fraction=self.serial_fraction if self.max_units > 1 else None,
                timeout_s=self.timeout_s,
            )
        except BadRequest as exc:
            raise ValueError(f"verl tool settings: {exc}") from None

    @classmethod
    def from_config(cls, config: dict[str, Any]) -> ToolSettings:
        known = {f.name for f in fields(cls)}
        return cls(**{k: v for k, v in (config or {}).items() if k in known})


class TangramSandboxTool(BaseTool):
    """verl ``BaseTool`` on a Tangram container per trajectory (see the module's docstring)."""

    def __init__(self, config: dict, tool_schema: OpenAIFunctionToolSchema | None = None):
        schema = tool_schema or OpenAIFunctionToolSchema.model_validate(SCHEMA)
        super().__init__(config, schema)
        self.settings = ToolSettings.from_config(config)
        self._client: AsyncClient | None = None
        #: The event loop ``_client`` was made on (its connections belong to it).
        self._client_loop: asyncio.AbstractEventLoop | None = None
        self._calls: dict[str, int] = {}
        #: Closes of trajectories whose open failed, still running (``_abandon``).
        self._abandoning: set[asyncio.Future[None]] = set()

    @property
    def client(self) -> AsyncClient:
        """The HTTP client of the running event loop, made on its first use there. One made
        on an earlier loop cannot be used on this one (its connections belong to that loop:
        every call failed with 'Event loop is closed'), so each loop gets its own; the
        previous one is closed on its loop if that still runs, else dropped with it."""
        loop = asyncio.get_running_loop()
        if self._client is None or self._client_loop is not loop:
            self._retire_client()
            self._client = AsyncClient(self.settings.tangram_url, token=self.settings.token)
            self._client_loop = loop
        return self._client

    def _retire_client(self) -> None:
        """Let go of the previous loop's client: closed there when that loop still runs (on
        another thread), else nothing is left to close (its loop closed its sockets)."""
        old, old_loop = self._client, self._client_loop
        self._client = self._client_loop = None
        if old is not None and old_loop is not None and old_loop.is_running():
            asyncio.run_coroutine_threadsafe(old.aclose(), old_loop)

    async def create(
        self, instance_id: str | None = None, **kwargs: Any
    ) -> tuple[str, ToolResponse]:
        """Open the trajectory's container; its id is the instance id, made up here (before
        the request) when verl gives none.

        Made up inside the client's call, the id was unknown to the tool when the open failed
        after the service had opened it (the answer not in time, the connection lost): the
        container held the node's memory until the service stopped. Known here, it is closed
        whenever the open fails (see ``_abandon``). A 409 on an id made up here can only be a
        retry of this open whose first attempt opened it (the id is a fresh uuid): it is this
        open's success. A caller's own id may be another client's: its 409 is raised, and
        nothing is closed."""
        s = self.settings
        made_up = not instance_id
        traj = instance_id or f"t-{uuid.uuid4().hex}"
        opening = self.client.open_trajectory(
            traj, memory_gb=s.memory_gb, image=s.image, wait_s=OPEN_WAIT_S
        )
        try:
            await _answered(opening, OPEN_WAIT_S, "the open")
        except ServiceError as exc:
            if exc.code != Conflict.code:
                await self._abandon(traj)
                raise
            if not made_up:  # (maybe another client's trajectory: never closed)
                raise
        except BaseException:  # (a time-out, the transport's, a cancel: it may be open)
            await self._abandon(traj)
            raise
        self._calls[traj] = 0
        return traj, ToolResponse()

    async def _abandon(self, traj: str) -> None:
        """Close ``traj``, whose open failed: the service may have opened it all the same
        (it took the request, its answer was lost). A close of one it never opened is a 404,
        logged by ``release``. Run as a task of its own, shielded: a cancelled ``create``
        (verl's rollout cut short) still closes it. (An open that reaches the service only
        after this close is left to the service's shutdown: nothing can tell it apart.)"""
        task = asyncio.ensure_future(self.release(traj))
        self._abandoning.add(task)  # (held: the loop keeps only a weak reference)
        task.add_done_callback(self._abandoning.discard)
        await asyncio.shield(task)

    async def execute(
        self, instance_id: str, parameters: dict[str, Any], **kwargs: Any
    ) -> tuple[ToolResponse, float, dict]:
        """Run ``parameters["code"]`` in the trajectory's container; the answer is its output.

        Bad arguments are answered, never raised: verl passes them as ``json.loads`` gave
        them (a list or a string raised ``AttributeError`` out of the tool), and a
        ``language`` that is no string (a list, a dict) raised ``TypeError`` from the lookup."""
        if not isinstance(parameters, Mapping):
            text = "Error: the arguments must be a JSON object with a string 'code'."
            return ToolResponse(text=text), 0.0, {}
        code = parameters.get("code")
        language = parameters.get("language") or self.settings.default_language
        if not isinstance(code, str) or not code:
            return ToolResponse(text="Error: 'code' must be a non-empty string."), 0.0, {}
        if not isinstance(language, str) or language not in RUNNERS:
            supported = ", ".join(sorted(RUNNERS))
            return ToolResponse(text=f"Error: language {language!r}; use {supported}."), 0.0, {}
        self._calls[instance_id] = self._calls.get(instance_id, 0) + 1
        script = _script(code, language, self._calls[instance_id])
        try:
            outcome = await self._run(instance_id, script)
        except TimeoutError as exc:  # (the service hung: the call may still run there)
            return ToolResponse(text=f"Error: {exc}"), 0.0, {"status": "no_answer"}
        value = outcome.value
        metrics = {
            "status": outcome.status,
            "exit_code": getattr(value, "exit_code", None),
            "queue_s": outcome.timings.queue_s,
            "exec_s": outcome.timings.exec_s,
        }
        if value is None or not hasattr(value, "stdout"):
            why = outcome.error.message if outcome.error else outcome.status
            return ToolResponse(text=f"Error: {why}"), 0.0, metrics
        text = value.stdout + (f"\n[stderr]\n{value.stderr}" if value.stderr else "")
        note = (
            f"\n[timed out after {self.settings.timeout_s:g} s]"
            if outcome.status == "timeout"
            else ""
        )
        return ToolResponse(text=_bounded(text, note, self.settings.max_output_chars)), 0.0, metrics

    async def calc_reward(self, instance_id: str, **kwargs: Any) -> float:
        """1.0 when ``reward_command`` exits 0 in the trajectory's container, else 0.0."""
        if not self.settings.reward_command:
            return 0.0
        try:
            outcome = await self._run(instance_id, self.settings.reward_command)
        except TimeoutError as exc:
            log.warning("reward of trajectory %s: %s; 0.0", instance_id, exc)
            return 0.0
        return 1.0 if outcome.ok and getattr(outcome.value, "exit_code", 1) == 0 else 0.0

    async def release(self, instance_id: str, **kwargs: Any) -> None:
        """Close the trajectory: its container (and everything in it) goes. One the service
        no longer has (closed by a restart of the service, or by the operator) is released
        already: its 404 raised out of verl's agent loop, failing the rollout over nothing.

        Nothing raises out of it: verl's agent loop calls it in a ``finally`` with no guard of
        its own, so any other error (the service unreachable, a 503 while it shuts down)
        failed the whole rollout. Each is logged; the container is left to the service (its
        shutdown removes its containers, the operator's ``DELETE`` one left behind)."""
        self._calls.pop(instance_id, None)
        try:
            # (A close waits for the trajectory's running action: up to its timeout_s.)
            closing = self.client.close_trajectory(instance_id)
            await _answered(closing, self.settings.timeout_s, "the close")
        except ServiceError as exc:
            if exc.code == UnknownTrajectory.code:
                log.info("trajectory %s was gone already: %s", instance_id, exc.message)
                return
            log.warning(
                "releasing trajectory %s failed (left to the service): %s", instance_id, exc
            )
        except Exception as exc:  # noqa: BLE001 - the transport's: verl must not see it
            log.warning(
                "releasing trajectory %s failed (left to the service): %s: %s",
                instance_id,
                type(exc).__name__,
                exc,
            )

    async def _run(self, traj: str, command: str) -> Any:
        """``command`` as one action of ``traj``; ``TimeoutError`` when the service has not
        answered ``ANSWER_MARGIN_S`` after its ``timeout_s``."""
        s = self.settings
        running = self.client.run(
            command=command,
            trajectory=traj,
            max_units=s.max_units,
            t1_s=s.t1_s,
            serial_fraction=s.serial_fraction if s.max_units > 1 else None,
            timeout_s=s.timeout_s,
            kind="verl_tool",
        )
        return await _answered(running, s.timeout_s, "the call")


async def _answered(call: Any, may_take_s: float, what: str) -> Any:
    """``call``'s answer, or ``TimeoutError`` saying so when the service has not given it
    ``ANSWER_MARGIN_S`` after the ``may_take_s`` it may take (its retries included)."""
    bound = may_take_s + ANSWER_MARGIN_S
    try:
        return await asyncio.wait_for(call, bound)
    except TimeoutError:
        raise TimeoutError(
            f"the Tangram service did not answer {what} within {bound:g} s (it may still "
            "run it there)"
        ) from None


def _bounded(output: str, note: str, limit: int) -> str:
    """``output`` then ``note`` in at most ``limit`` characters. The output is what gets cut,
    and a cut says so with the output's full length: cut as one text, a call that printed
    past the bound lost its time-out note, and the model read a cut output as all there was.
    (A note longer than the bound is cut itself: the bound is the trainer's.)"""
    if len(output) + len(note) <= limit:
        return output + note
    cut = f"\n[output truncated: {len(output)} characters in all]"
    return (output[: max(0, limit - len(cut) - len(note))] + cut + note)[:limit]


def _positive(value: Any) -> bool:
    return is_finite_number(value) and value > 0


def _script(code: str, language: str, n: int) -> str:
    """A shell command that writes the call's code to a file of its own and runs it."""
    suffix, interpreter = RUNNERS[language]
    name = f".tool_call_{n}{suffix}"
    encoded = base64.b64encode(code.encode()).decode()
    return f"printf %s {encoded} | base64 -d > {name} && {interpreter} {shlex.quote(name)}"
