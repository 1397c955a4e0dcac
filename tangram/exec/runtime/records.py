"""Records of the live runtime: what a client asks for (``ActionSpec``), what it gets back
(``Outcome``), and what a trajectory is (``TrajectoryInfo``).

All are frozen: an outcome is handed to many readers (the waiting client, pollers, the trace
recorder, the metrics) and none may change it.
"""

from __future__ import annotations

import hashlib
import json
import math
import pickle
import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any, Literal

from tangram.core.curves import Amdahl, CurveError, ElasticityCurve, Inelastic, curve_from_dict
from tangram.exec.aoe.config import MAX_OUTPUT_BYTES
from tangram.exec.aoe.environment import (
    command_problem,
    env_problem,
    script_problem,
    text_problem,
)
from tangram.exec.runtime.errors import BadRequest
from tangram.trace.row import INT_MAX, TIME_MAX_S

Resource = Literal["cpu", "gpu", "api"]
#: How an action ended. ``unknown``: the service stopped (killed, crashed) after accepting it
#: and before recording its outcome; it may have run, in part or in full, or not at all, and
#: it is never run again (``docs/live.md``, "Durability"). Only a journal gives it.
Status = Literal["result", "error", "timeout", "unknown"]
STATUSES: tuple[str, ...] = ("result", "error", "timeout", "unknown")


@dataclass(frozen=True)
class CpuWork:
    """A shell command (or argv) run in the trajectory's container on the granted cores.

    The command sees ``TANGRAM_CORES`` (and ``OMP_NUM_THREADS``) set to the cores granted, so
    it can size its own parallelism (``make -j$TANGRAM_CORES``).
    """

    command: str | tuple[str, ...]
    env: Mapping[str, str] = field(default_factory=dict)
    max_output_bytes: int | None = None

    resource = "cpu"

    @property
    def target(self) -> str | None:
        """The service or endpoint it calls: none, it is a command."""
        return None

    def check(self) -> None:
        """``BadRequest`` for a command that cannot run: empty, too long, or with an
        environment AOE refuses (reserved or malformed keys; ``aoe.environment`` owns the
        rule), naming the key or the limit."""
        cmd = self.command
        if isinstance(cmd, str) and not cmd.strip():
            raise BadRequest("command is empty")
        if not isinstance(cmd, str) and (not cmd or not all(isinstance(a, str) for a in cmd)):
            raise BadRequest("command must be a string or a non-empty list of strings")
        if not isinstance(self.env, Mapping):
            raise BadRequest(f"env must be an object of strings, got {type(self.env).__name__}")
        problem = command_problem(cmd) or env_problem(self.env) or script_problem(cmd, self.env)
        if problem is not None:
            raise BadRequest(problem)
        limit = self.max_output_bytes
        if limit is not None and (isinstance(limit, bool) or not isinstance(limit, int)):
            raise BadRequest(f"max_output_bytes must be an integer, got {limit!r}")
        if limit is not None and not 1 <= limit <= MAX_OUTPUT_BYTES:
            raise BadRequest(
                f"max_output_bytes must be between 1 and {MAX_OUTPUT_BYTES} (AOE's most), "
                f"got {limit}"
            )

    def identity(self) -> list[Any]:
        """What makes two submissions of it the same (for ``ActionSpec.fingerprint``)."""
        return [self.command, dict(self.env), self.max_output_bytes]


@dataclass(frozen=True)
class GpuWork:
    """One call of a registered EOE service (reward model, teacher) on ``inputs``."""

    service: str
    inputs: Any

    resource = "gpu"

    @property
    def target(self) -> str | None:
        return self.service

    def check(self) -> None:
        """Nothing to check before its executor admits it."""

    def identity(self) -> list[Any]:
        return [self.service, _digest(self.inputs)]


@dataclass(frozen=True)
class ApiWork:
    """One call of an API endpoint (an async callable registered under ``endpoint``)."""

    endpoint: str
    payload: Any = None

    resource = "api"

    @property
    def target(self) -> str | None:
        return self.endpoint

    def check(self) -> None:
        """Nothing to check before its executor admits it."""

    def identity(self) -> list[Any]:
        return [self.endpoint, _digest(self.payload)]


Work = CpuWork | GpuWork | ApiWork


@dataclass(frozen=True)
class ActionSpec:
    """One action as a client submits it.

    ``id`` makes a submission idempotent: sending the same id again returns the first
    submission's action (never a second run); None lets the runtime pick one. ``trajectory`` is
    required for CPU work (the container it runs in) and optional for GPU and API work.
    ``max_units``, ``t1_s`` and ``serial_fraction``/``curve`` are the client's estimate of how
    the action scales: the scheduler's elasticity curve (inelastic when neither is given).
    ``timeout_s`` bounds the whole action, queueing included (None: the runtime's default).
    ``malleable`` (CPU work only): the command uses whatever cores it is given while it runs,
    so the scheduler may grow and shrink its grant (docs/live.md, "Malleable CPU actions").
    """

    work: Work
    id: str | None = None
    trajectory: str | None = None
    max_units: int = 1
    t1_s: float = 1.0
    serial_fraction: float | None = None
    curve: Mapping[str, Any] | None = None
    timeout_s: float | None = None
    task: str = "live"
    kind: str | None = None
    malleable: bool = False

    def __post_init__(self) -> None:
        if not isinstance(self.work, CpuWork | GpuWork | ApiWork):
            raise BadRequest(
                f"work must be CpuWork, GpuWork or ApiWork, got {type(self.work).__name__}"
            )
        if self.id is not None:
            check_id("id", self.id)
        if self.trajectory is not None:
            # Not '~...': a GPU or API action so labelled shared the runtime's own label of
            # another action ('~<id>'), two rows at one trace position (the trace unreadable).
            check_trajectory_id("trajectory", self.trajectory)
        if isinstance(self.max_units, bool) or not isinstance(self.max_units, int):
            raise BadRequest(f"max_units must be an integer >= 1, got {self.max_units!r}")
        if self.max_units < 1:
            raise BadRequest(f"max_units must be >= 1, got {self.max_units}")
        if self.max_units > INT_MAX:
            raise BadRequest(
                f"max_units must be at most {INT_MAX} (the trace's integers are int64), "
                f"got {self.max_units}"
            )
        if not _positive(self.t1_s):
            raise BadRequest(f"t1_s must be a positive number of seconds, got {self.t1_s!r}")
        if self.t1_s > TIME_MAX_S:
            raise BadRequest(
                f"t1_s must be at most {TIME_MAX_S:g} s (the trace's longest time), "
                f"got {self.t1_s!r}"
            )
        if self.timeout_s is not None and not _positive(self.timeout_s):
            raise BadRequest(
                f"timeout_s must be a positive number of seconds, got {self.timeout_s!r}"
            )
        if self.timeout_s is not None and self.timeout_s > MAX_TIMEOUT_S:
            raise BadRequest(
                f"timeout_s must be at most {MAX_TIMEOUT_S:g} s (30 days), got {self.timeout_s!r}"
            )
        if self.serial_fraction is not None and self.curve is not None:
            raise BadRequest("give serial_fraction or curve, not both")
        self.work.check()
        if not isinstance(self.task, str) or not self.task:
            raise BadRequest(f"task must be a non-empty string, got {self.task!r}")
        if self.kind is not None and (not isinstance(self.kind, str) or not self.kind):
            raise BadRequest(f"kind must be a non-empty string, got {self.kind!r}")
        # Labels go into every trace format, Parquet's UTF-8 too: one that cannot be encoded
        # failed the whole trace's write (every client's actions), not only its own row.
        problem = text_problem("task", self.task) or (
            None if self.kind is None else text_problem("kind", self.kind)
        )
        if problem is not None:
            raise BadRequest(problem)
        for name, label in (("task", self.task), ("kind", self.kind)):
            if label is not None:
                check_label(name, label)
        if not isinstance(self.malleable, bool):
            raise BadRequest(f"malleable must be true or false, got {self.malleable!r}")
        if self.malleable and self.resource != "cpu":
            raise BadRequest(
                f"malleable: only a cpu action can be malleable (its cores resized while it "
                f"runs); this one's resource is {self.resource!r}"
            )
        t1 = self.elasticity().t1  # raises BadRequest for a bad curve
        if t1 > TIME_MAX_S:
            raise BadRequest(
                f"curve: its time on one unit (t1) must be at most {TIME_MAX_S:g} s (the "
                f"trace's longest time), got {t1!r}"
            )

    @property
    def resource(self) -> Resource:
        return self.work.resource  # type: ignore[return-value]

    @property
    def service(self) -> str | None:
        """The GPU service or API endpoint it calls (None for a command)."""
        return self.work.target

    def label(self) -> str:
        """The action's kind for reports: given, else the service or endpoint, else ``command``."""
        return self.kind or self.service or "command"

    def elasticity(self) -> ElasticityCurve:
        """The scheduler's curve for this action (API work is always inelastic)."""
        try:
            if self.resource == "api":
                if self.serial_fraction is not None or (
                    self.curve is not None and self.curve.get("kind") != "inelastic"
                ):
                    raise BadRequest("an api action is inelastic: leave serial_fraction/curve out")
                if self.curve is not None:  # (its t1_s, checked: it was ignored, -5 taken)
                    return curve_from_dict(self.curve)
                return Inelastic(self.t1_s)
            if self.serial_fraction is not None:
                return Amdahl(self.t1_s, self.serial_fraction)
            if self.curve is not None:
                if not isinstance(self.curve, Mapping):
                    raise BadRequest(f"curve must be an object, got {type(self.curve).__name__}")
                return curve_from_dict(self.curve)
            return Inelastic(self.t1_s)
        except (CurveError, TypeError, ValueError) as exc:
            if isinstance(exc, BadRequest):
                raise
            raise BadRequest(f"bad elasticity: {exc}") from None

    def fingerprint(self) -> str:
        """A digest of everything but the id: equal for a retry of the same submission.

        Numbers count by value, not by how a client's JSON wrote them (``1`` and ``1.0`` are
        the same ``t1_s``, the same payload value): a resend from another client library was
        a 409. The seconds and fractions are written as floats (the default ``t1_s`` 1.0, and
        with it the fingerprints already journaled, unchanged), nested values' integral floats
        as integers; a boolean is never a number (``true`` is not ``1``)."""
        body = {
            "resource": self.resource,
            "trajectory": self.trajectory,
            "max_units": self.max_units,
            "t1_s": _real(self.t1_s),
            "serial_fraction": _real(self.serial_fraction),
            "curve": _canonical(dict(self.curve)) if self.curve is not None else None,
            "timeout_s": _real(self.timeout_s),
            "task": self.task,
            "kind": self.kind,
            "work": self.work.identity(),
        }
        if self.malleable:  # (only when set: earlier fingerprints, journaled, stay the same)
            body["malleable"] = True
        return hashlib.sha256(_dump(body).encode()).hexdigest()


def is_finite_number(value: Any) -> bool:
    """Whether ``value`` is a number a float holds: not a bool, NaN or infinite, and not an
    integer past a float's range (JSON allows 10**400; ``math.isfinite`` and ``float`` raise
    ``OverflowError`` on it, which was a 500)."""
    if isinstance(value, bool) or not isinstance(value, int | float):
        return False
    try:
        return math.isfinite(value)
    except OverflowError:
        return False


def _positive(value: Any) -> bool:
    return is_finite_number(value) and value > 0


#: The longest id, in characters.
MAX_ID_CHARS = 128
#: The longest ``task`` or ``kind`` label, in characters: as ids. Labels are written into
#: every trace row and keyed on in the reports; an unbounded one let a client grow every row
#: (and the journal) by megabytes. The trace format sets no bound of its own
#: (docs/trace-format.md: non-empty strings), so every label the service takes, the trace holds.
MAX_LABEL_CHARS = MAX_ID_CHARS
#: The longest time-out an action may ask for (30 days): longer than any run, and far below
#: where the executors' timers overflow (a socket time-out of 1e10 s is past the platform's
#: ``time_t``: the action failed as if its container had, without running).
MAX_TIMEOUT_S = 30 * 86400.0


def check_label(name: str, value: str) -> None:
    """A ``task`` or ``kind`` label: at most ``MAX_LABEL_CHARS`` characters, each printable
    as an id's (spaces and '/' inside are fine). A NUL byte, a newline or another control
    character went into the trace and the journal as given (a NUL cuts C strings, a newline
    splits a log line); ``BadRequest`` names the field."""
    if len(value) > MAX_LABEL_CHARS:
        raise BadRequest(
            f"{name} must be at most {MAX_LABEL_CHARS} characters (as ids), got {len(value)}"
        )
    if not value.isprintable():
        bad = next(c for c in value if not c.isprintable())
        raise BadRequest(
            f"{name} {value[:80]!r} must be printable characters only (as ids), got {bad!r}"
        )


def check_id(name: str, value: Any) -> str:
    """The id alphabet of actions and trajectories (docs/live.md): 1..128 characters, each
    printable (``str.isprintable``: no control, format, separator other than the space,
    private-use or unassigned character), no '/', no space at either end. Ids travel as URL
    path segments (the clients percent-encode them) and ``BadRequest`` names the field."""
    if not isinstance(value, str) or not value:
        raise BadRequest(f"{name} must be a non-empty string, got {value!r}")
    if len(value) > MAX_ID_CHARS:
        raise BadRequest(f"{name} must be at most {MAX_ID_CHARS} characters, got {len(value)}")
    if "/" in value:
        raise BadRequest(f"{name} {value!r} must not contain '/'")
    if not value.isprintable():
        raise BadRequest(f"{name} {value!r} must be printable characters only")
    if value.strip() != value:
        raise BadRequest(f"{name} {value!r} must not have surrounding whitespace")
    return value


#: The first character of the runtime's own trajectory labels: ``~<action id>`` for GPU and API
#: work without a trajectory, ``~lost~<node>...`` for a lost node's fenced memory.
RESERVED_TRAJECTORY_PREFIX = "~"


def check_trajectory_id(name: str, value: Any) -> str:
    """A trajectory id to open: the id alphabet (``check_id``), not starting with ``~``. The
    core knows a trajectory by its id alone, so one opened as a runtime label would share its
    actions (closing ``~x`` rejected the queued action ``x`` without a trajectory) or its
    reservation."""
    value = check_id(name, value)
    if value.startswith(RESERVED_TRAJECTORY_PREFIX):
        raise BadRequest(
            f"{name} {value!r} must not start with {RESERVED_TRAJECTORY_PREFIX!r}: such ids "
            "are the runtime's labels (GPU and API work without a trajectory is '~<action id>')"
        )
    return value


#: The smallest container a trajectory may ask for (GB): 16 MiB, enough for the runner's
#: shell; Docker itself refuses less than 6 MB.
MIN_MEMORY_GB = 16 / 1024


def check_memory_gb(name: str, value: Any) -> float:
    """A container's memory: a finite number of GB, at least ``MIN_MEMORY_GB``."""
    if not is_finite_number(value):
        raise BadRequest(f"{name} must be a number of GB, got {value!r}")
    if value < MIN_MEMORY_GB:
        raise BadRequest(
            f"{name} must be at least {MIN_MEMORY_GB:g} GB (16 MiB, the smallest container), "
            f"got {value!r}"
        )
    return float(value)


#: A Docker image reference: [registry[:port]/]path[:tag][@digest], path components in
#: lower case (the grammar of the engine's ``reference`` package).
_COMPONENT = r"[a-z0-9]+(?:(?:[._]|__|-+)[a-z0-9]+)*"
_LABEL = r"[A-Za-z0-9](?:[A-Za-z0-9-]*[A-Za-z0-9])?"
_DOMAIN = rf"(?:{_LABEL}(?:\.{_LABEL})*(?::[0-9]+)?/)?"
IMAGE_REFERENCE = re.compile(
    _DOMAIN
    + _COMPONENT
    + rf"(?:/{_COMPONENT})*"
    + r"(?::[A-Za-z0-9_][A-Za-z0-9_.-]{0,127})?"
    + r"(?:@[A-Za-z][A-Za-z0-9]*(?:[-_+.][A-Za-z][A-Za-z0-9]*)*:[0-9a-fA-F]{32,})?\Z"
)
#: The longest image reference accepted.
MAX_IMAGE_CHARS = 255


def check_image(name: str, value: Any) -> str:
    """An image reference the engine can parse (whether it exists is the executor's to say)."""
    if not isinstance(value, str) or not value:
        raise BadRequest(f"{name} must be a non-empty image reference, got {value!r}")
    if len(value) > MAX_IMAGE_CHARS or not IMAGE_REFERENCE.match(value):
        raise BadRequest(
            f"{name} {value[:300]!r} is not an image reference "
            "([registry/]name[:tag][@digest], name in lower case, at most 255 characters)"
        )
    return value


def _dump(value: Any) -> str:
    return json.dumps(value, sort_keys=True, separators=(",", ":"), default=repr)


def _digest(value: Any) -> str:
    """A stable digest of inputs: their JSON, with tensors and arrays as nested lists; the
    pickle of anything else."""
    try:
        text = json.dumps(_plain(value), sort_keys=True, separators=(",", ":"))
        return hashlib.sha256(text.encode()).hexdigest()
    except (TypeError, ValueError):
        pass
    try:
        return hashlib.sha256(pickle.dumps(value)).hexdigest()
    except Exception:  # noqa: BLE001 - unpicklable inputs: never equal to another submission
        return f"unhashable-{id(value)}"


def _plain(value: Any) -> Any:
    """``value`` as plain JSON data for its digest, numbers by value (``_canonical``)."""
    if hasattr(value, "tolist") and callable(value.tolist):  # torch tensors, numpy arrays
        return {"__array__": _canonical(value.tolist()), "dtype": str(getattr(value, "dtype", ""))}
    if isinstance(value, Mapping):
        return {str(k): _plain(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [_plain(v) for v in value]
    return _canonical(value)


def _canonical(value: Any) -> Any:
    """``value`` with numerically equal numbers written alike: an integral float as the
    integer it equals (``1.0`` -> ``1``, ``-0.0`` -> ``0``), exactly (``1e30`` is not
    ``10**30``); booleans stay booleans (``True == 1`` in Python, not in JSON)."""
    if isinstance(value, bool):
        return value
    if isinstance(value, float) and value.is_integer():
        return int(value)
    if isinstance(value, Mapping):
        return {k: _canonical(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [_canonical(v) for v in value]
    return value


def _real(value: float | None) -> float | None:
    """A seconds or fraction field as the float it means (an integer ``1`` is ``1.0``)."""
    return None if value is None else float(value)


@dataclass(frozen=True)
class CommandResult:
    """What a CPU command printed and how it exited (output decoded as UTF-8, bad bytes
    replaced). A non-zero exit (a failing test, a crash, an out-of-memory kill) is a result,
    not an error: for an agent it is data. ``message`` says what the exit means when it is
    not 0 (e.g. "killed by the out-of-memory killer")."""

    stdout: str
    stderr: str
    exit_code: int | None
    message: str | None = None


@dataclass(frozen=True)
class ErrorInfo:
    """Why an action did not produce a result: a stable ``code`` and a message for people."""

    code: str
    message: str
    retryable: bool = False


@dataclass(frozen=True)
class Timings:
    """Where an action's time went (seconds). ``act_s = queue_s + overhead_s + exec_s``.

    ``queue_s``: from submission until the scheduler started it, plus any wait inside the
    executor; ``exec_s``: the command / call itself as the executor measured it;
    ``overhead_s``: the rest (thread hand-off, cgroup grant and revoke, GPU restore or
    eviction, reporting the completion back).
    """

    queue_s: float
    overhead_s: float
    exec_s: float
    act_s: float


@dataclass(frozen=True)
class Outcome:
    """Exactly one per accepted action: its result, or why it has none, and its timings.

    Times ``arrival_s``, ``start_s`` and ``end_s`` are seconds on the runtime's clock (since
    it started). ``start_s``/``units``/``node`` are None for an action that never started.
    """

    action_id: str
    trajectory: str | None
    resource: Resource
    status: Status
    value: Any
    error: ErrorInfo | None
    timings: Timings
    arrival_s: float
    start_s: float | None
    end_s: float
    units: int | None = None
    node: str | None = None
    cores: tuple[int, ...] = ()
    gpus: tuple[int, ...] = ()
    reason: str = ""

    @property
    def ok(self) -> bool:
        return self.status == "result"


@dataclass(frozen=True)
class TrajectoryInfo:
    """An open trajectory: its CPU node and container (None for a trajectory without one)."""

    id: str
    node: str | None
    container: str | None
    memory_gb: float
    image: str | None
    opened_at_s: float
    ephemeral: bool = False
