"""``POST /run_code``: SandboxFusion's code-execution call, served by Tangram's CPU executor.

verl's sandbox tool (and anything else written against SandboxFusion) can point its URL at a
Tangram service unchanged. Each request runs in a container of its own (an ephemeral
trajectory: ``tangram-python`` for python and bash, ``tangram-compilers`` for the others, see
``languages.py``), taken warm from the pool when the service has one (reset before any other
request gets it) or made and removed, as SandboxFusion runs each request in a fresh directory.
Compile and run are ordinary actions: the scheduler grants their cores, admission control
bounds them, the trace records them.

Request fields (JSON object; null is the same as absent):

| field | type | supported | meaning |
|---|---|---|---|
| ``code`` | string | yes (required) | the program |
| ``language`` | string | ``python``, ``bash``, ``c``, ``cpp``, ``java``, ``go``, ``nodejs``, ``rust`` (and aliases) | others are refused (400) |
| ``run_timeout`` | number | yes (default 10) | seconds the program may run (``timeout`` in the container) |
| ``compile_timeout`` | number | yes (default 10) | seconds the compile step may take (compiled languages) |
| ``memory_limit_MB`` | number | yes (-1 or absent: the service default; 16 .. the node's) | the container's memory limit (the compiler's too) |
| ``stdin`` | string or null | yes | the program's standard input |
| ``files`` | object name -> base64 or null | yes | written under the working directory first (null: skipped; java: each ``.jar`` joins the class path) |
| ``fetch_files`` | list of paths | yes (at most 256) | read back after the run, base64, into ``files`` |
| ``max_units`` | integer | Tangram extension | cores the run may use (default 1; more makes it elastic) |
| others | | ignored | SandboxFusion's ``extra`` etc. |

Response: ``{"status": "Success" | "Failed" | "SandboxError", "message": str,
"compile_result": R | null, "run_result": R | null, "executor_pod_name": null,
"files": {path: base64}}`` with ``R = {"status": "Finished" | "TimeLimitExceeded" | "Error",
"execution_time": s, "return_code": int | null, "stdout": str, "stderr": str}``.

- ``Success``: the compile step (if any) and the program exited 0.
- ``Failed``: the program's own failure. A compile error (``compile_result`` ``Finished`` with
  a non-zero code, or ``TimeLimitExceeded``; ``run_result`` null, nothing ran), a non-zero exit
  (``Finished``; a memory-limit breach is the kernel's SIGKILL, return code 137), the time limit
  (``TimeLimitExceeded``, return code null, as SandboxFusion's), or an end without an exit of its
  own (``Error``): its output passed the service's cap (it was killed, the output cut) or it
  killed its container.
  A program the service's shutdown cut is ``Failed`` too (``Error``, return code null): its
  outcome is known, and a ``SandboxError`` would have the client run it a second time.
- ``SandboxError``: Tangram's side failed (the container could not be made, the files could
  not be written, the shutdown ended the request before its program started, a step
  timed out waiting for memory or cores before it started);
  SandboxFusion's client retries it.

A request that cannot be run as written (a missing or ill-typed field, an unsupported
language, a memory limit beyond the node) is refused with HTTP 400 before anything runs; its
body is both a ``SandboxError`` answer and Tangram's error document. Admission control
(the runtime's ``max_pending``) is waited out at the door, as SandboxFusion queues requests:
a step the bound refuses (nothing was accepted) is tried again after its ``Retry-After`` for up
to ``queue_allowance_s``, and only then answered HTTP 429 with ``Retry-After``. Why: verl's
sandbox client retries a 504 only, so a 429 at once was that test case scored as an API
failure; the ``sandbox-fusion`` client retries any error.
"""

from __future__ import annotations

import asyncio
import base64
import binascii
import logging
import posixpath
import shlex
import uuid
from collections.abc import Awaitable, Callable, Collection, Mapping
from dataclasses import dataclass
from typing import Any, TypeVar

from tangram.exec.aoe.config import PYTHON_IMAGE
from tangram.exec.aoe.environment import text_problem
from tangram.exec.runtime import ActionSpec, CommandResult, CpuWork, Outcome, Runtime
from tangram.exec.runtime.errors import BadRequest, LiveError, Overloaded, ShuttingDown
from tangram.exec.runtime.records import INT_MAX, MIN_MEMORY_GB, is_finite_number
from tangram.exec.service.languages import LANGUAGES, ImageBuilds, resolve
from tangram.exec.service.schema import error_doc

log = logging.getLogger(__name__)

#: Files larger than this in all are encoded for upload in a worker thread (``run_code``).
UPLOAD_THREAD_BYTES = 256 * 1024
#: Largest base64 text sent in one shell command (the kernel caps one argument at 128 KiB).
CHUNK_CHARS = 60_000
#: Exit code of coreutils ``timeout`` when the limit fired (a program may exit with it too:
#: only a run that lasted the limit counts as stopped by it).
TIMEOUT_EXIT = 124
#: Exit code of the step whose file upload failed before its command ran (told apart from the
#: program's own exit by a marker line with a nonce on stderr).
UPLOAD_FAILED_EXIT = 198
#: Linux's limits on one name in a path and on a whole path (bytes): past them the shell
#: cannot create the file, which would fail the upload after the request was accepted.
MAX_NAME_BYTES = 255
MAX_PATH_BYTES = 4000
#: Raw bytes of a fetched file read per action: its base64 (4/3 as many characters, 512 KiB)
#: stays under the output cap of one action (``FETCH_CAP``), however large the file.
FETCH_CHUNK = 3 << 17
FETCH_CAP = 1 << 20
#: The most paths ``fetch_files`` may name. SandboxFusion's API sets no bound (a plain list of
#: strings) and its clients (verl's sandbox tool, reward code) fetch a handful; here each path
#: costs at least one action, a container round trip of ~10-50 ms under Docker, while the
#: request holds its container (and a tenant's place). 256 paths are ~10 s of reading back, the
#: default run time-out's order; a 64 MiB body could name millions and hold them for hours.
MAX_FETCH_PATHS = 256
#: The most bytes ``fetch_files`` returns in one answer (it is held in memory as base64); a
#: file past it is left out and the answer's message names it.
MAX_FETCH_BYTES = 32 << 20


@dataclass(frozen=True)
class RunCodeSettings:
    """Service-side defaults of ``/run_code``."""

    image: str = PYTHON_IMAGE
    memory_gb: float = 0.5
    #: Default memory of a compiled language's container (javac and rustc need more).
    compiled_memory_gb: float = 1.0
    default_run_timeout_s: float = 10.0
    default_compile_timeout_s: float = 10.0
    max_run_timeout_s: float = 600.0
    #: Seconds the run may wait for a container's memory or for cores, beyond its run time.
    queue_allowance_s: float = 300.0
    #: The Amdahl serial fraction of a run that asks for ``max_units`` > 1: its curve lets the
    #: scheduler grant it more than one core (a run of ``max_units`` 1 is inelastic).
    serial_fraction: float = 0.1

    def __post_init__(self) -> None:
        """``ValueError`` naming the setting that no request could be served with: a
        boolean or a string for a number, a memory below a container's least, a default time
        limit above the maximum (every request that left it out was refused with a 400
        blaming its ``run_timeout``, a field it never sent)."""
        if not isinstance(self.image, str) or not self.image:
            raise ValueError(f"image must be a non-empty image reference, got {self.image!r}")
        for name in ("memory_gb", "compiled_memory_gb"):
            _setting(self, name, least=MIN_MEMORY_GB)
        for name in ("default_run_timeout_s", "default_compile_timeout_s", "max_run_timeout_s"):
            if not _setting(self, name) > 0:
                raise ValueError(f"{name} must be > 0 seconds, got {getattr(self, name)!r}")
        for name in ("default_run_timeout_s", "default_compile_timeout_s"):
            if getattr(self, name) > self.max_run_timeout_s:
                raise ValueError(
                    f"{name} ({getattr(self, name)!r}) must be at most max_run_timeout_s "
                    f"({self.max_run_timeout_s!r}): a request leaving it out would be refused"
                )
        _setting(self, "queue_allowance_s")
        if not 0 <= _setting(self, "serial_fraction") <= 1:
            raise ValueError(f"serial_fraction must be in [0, 1], got {self.serial_fraction!r}")


def _setting(settings: RunCodeSettings, name: str, least: float = 0.0) -> float:
    """The number ``name`` of ``settings``: finite, not a boolean, at least ``least``; else
    ``ValueError`` naming it."""
    value = getattr(settings, name)
    if not is_finite_number(value) or value < least:
        raise ValueError(f"{name} must be a finite number >= {least:g}, got {value!r}")
    return float(value)


def sandbox_error(message: str) -> dict[str, Any]:
    """SandboxFusion's answer when the sandbox, not the program, failed (or was asked wrong)."""
    return {
        "status": "SandboxError",
        "message": message,
        "compile_result": None,
        "run_result": None,
        "executor_pod_name": None,
        "files": {},
    }


def refusal_doc(exc: LiveError) -> dict[str, Any]:
    """A request refused before anything ran, in both shapes: SandboxFusion's ``SandboxError``
    (what its clients read) and Tangram's error document (what Tangram's clients read)."""
    return {**sandbox_error(exc.message), **error_doc(exc.code, exc.message, exc.retryable)}


@dataclass(frozen=True)
class RunCodeRequest:
    code: str
    language: str
    run_timeout_s: float
    compile_timeout_s: float
    memory_gb: float
    stdin: str | None
    files: dict[str, bytes]
    #: The paths as the request wrote them (checked by ``_safe_path``): the answer's ``files``
    #: is keyed by them, as SandboxFusion's is ('./out.txt' stays './out.txt').
    fetch_files: tuple[str, ...]
    max_units: int


def parse_run_code(
    body: Any, settings: RunCodeSettings, node_memory_gb: float | None = None
) -> RunCodeRequest:
    """Check a request; ``BadRequest`` names the field (a language other than python and
    bash, a memory limit beyond ``node_memory_gb``, ...). A field given as null is absent;
    any other value is taken as given or refused, never replaced by a default."""
    if not isinstance(body, Mapping):
        raise BadRequest(f"the request must be a JSON object, got {type(body).__name__}")
    code = body.get("code")
    if not isinstance(code, str):
        raise BadRequest("field 'code': required, a string")
    _check_text("field 'code'", code)
    asked = body.get("language")
    asked = "python" if asked is None else asked
    if not isinstance(asked, str):
        raise BadRequest("field 'language': expected a string")
    language = resolve(asked)
    if language is None:
        raise BadRequest(
            f"field 'language': {asked[:100]!r} is not supported by Tangram's /run_code; "
            f"supported: {', '.join(sorted(LANGUAGES))}"
        )
    timeout = _seconds(body, "run_timeout", settings.default_run_timeout_s, settings)
    compile_timeout = _seconds(
        body, "compile_timeout", settings.default_compile_timeout_s, settings
    )
    mem_mb = body.get("memory_limit_MB")
    compiled = LANGUAGES[language].image is not None
    memory_gb = settings.compiled_memory_gb if compiled else settings.memory_gb
    if mem_mb is not None and mem_mb != -1:
        least = MIN_MEMORY_GB * 1024
        if not _number(mem_mb) or mem_mb < least:
            raise BadRequest(
                f"field 'memory_limit_MB': expected -1 or megabytes >= {least:g}, got {mem_mb!r}"
            )
        memory_gb = mem_mb / 1024
        if node_memory_gb is not None and memory_gb > node_memory_gb:
            raise BadRequest(
                f"field 'memory_limit_MB': {mem_mb:g} MB is more than this service's CPU node "
                f"has for containers ({node_memory_gb * 1024:g} MB)"
            )
    stdin = body.get("stdin")
    if stdin is not None and not isinstance(stdin, str):
        raise BadRequest("field 'stdin': expected a string or null")
    if stdin is not None:
        _check_text("field 'stdin'", stdin)
    files: dict[str, bytes] = {}
    raw_files = body.get("files")
    raw_files = {} if raw_files is None else raw_files
    if not isinstance(raw_files, Mapping):
        raise BadRequest("field 'files': expected an object of path -> base64 content")
    for name, content in raw_files.items():
        if content is None:
            continue  # SandboxFusion's ``Dict[str, Optional[str]]``: a null content is skipped
        path = _safe_path(name, "files")
        if path in files:
            raise BadRequest(f"field 'files': {name!r} names the same file as another entry")
        if not isinstance(content, str):
            raise BadRequest(f"field 'files': content of {name!r} must be a base64 string")
        try:
            files[path] = base64.b64decode(content, validate=True)
        except (binascii.Error, ValueError):
            raise BadRequest(f"field 'files': content of {name!r} is not valid base64") from None
    _check_layout(files)
    _check_source_free(files, LANGUAGES[language].source)
    if language == "java":
        _check_class_path(files)
    fetch = body.get("fetch_files")
    fetch = [] if fetch is None else fetch
    if not isinstance(fetch, list) or not all(isinstance(p, str) for p in fetch):
        raise BadRequest("field 'fetch_files': expected a list of paths")
    if len(fetch) > MAX_FETCH_PATHS:
        raise BadRequest(
            f"field 'fetch_files': at most {MAX_FETCH_PATHS} paths per request, got {len(fetch)}"
        )
    for path in fetch:
        _safe_path(path, "fetch_files")
    units = body.get("max_units")
    units = 1 if units is None else units
    if isinstance(units, bool) or not isinstance(units, int) or units < 1:
        raise BadRequest(f"field 'max_units': expected an integer >= 1, got {units!r}")
    if units > INT_MAX:
        raise BadRequest(
            f"field 'max_units': at most {INT_MAX} (the trace's integers are int64), got {units}"
        )
    return RunCodeRequest(
        code=code,
        language=language,
        run_timeout_s=timeout,
        compile_timeout_s=compile_timeout,
        memory_gb=float(memory_gb),
        stdin=stdin,
        files=files,
        fetch_files=tuple(fetch),
        max_units=units,
    )


def _seconds(body: Mapping, field: str, default: float, settings: RunCodeSettings) -> float:
    """A time limit field: absent or null is ``default``, else seconds in (0, max]."""
    value = body.get(field)
    value = default if value is None else value
    if not _number(value) or value <= 0:
        raise BadRequest(f"field {field!r}: expected seconds > 0, got {value!r}")
    if value > settings.max_run_timeout_s:
        raise BadRequest(
            f"field {field!r}: at most {settings.max_run_timeout_s:g} s here, got {value}"
        )
    return float(value)


def _check_text(what: str, text: str) -> None:
    """``BadRequest`` when ``text`` cannot be written as UTF-8 (a lone surrogate): it was a
    500 (the code, stdin) or a ``SandboxError`` (a file name) once accepted."""
    problem = text_problem(what, text)
    if problem is not None:
        raise BadRequest(problem)


def _number(value: Any) -> bool:
    return is_finite_number(value)


def _safe_path(name: Any, field: str) -> str:
    """A relative path to a file inside the working directory: not absolute, no '..'
    component, not the directory itself ('.'); '..data' is a plain name."""
    if not isinstance(name, str) or not name:
        raise BadRequest(f"field {field!r}: paths must be non-empty strings")
    _check_text(f"field {field!r}: {name[:80]!r}", name)
    norm = posixpath.normpath(name)
    if norm.startswith("/") or norm.split("/")[0] == ".." or "\0" in norm:
        raise BadRequest(f"field {field!r}: {name!r} must be a relative path inside the sandbox")
    if norm == ".":
        raise BadRequest(f"field {field!r}: {name!r} names the working directory, not a file")
    encoded = norm.encode("utf-8", "surrogatepass")
    if len(encoded) > MAX_PATH_BYTES or any(len(p) > MAX_NAME_BYTES for p in encoded.split(b"/")):
        raise BadRequest(
            f"field {field!r}: {name[:80]!r}... is too long for a file name (at most "
            f"{MAX_NAME_BYTES} bytes per name, {MAX_PATH_BYTES} in all)"
        )
    return norm


def _check_layout(paths: Collection[str]) -> None:
    """``BadRequest`` when one file of ``files`` is also a directory of another ('a' and
    'a/b'): one of them could not be written, and the program would run without it."""
    names = set(paths)
    for path in paths:
        parent = posixpath.dirname(path)
        while parent:
            if parent in names:
                raise BadRequest(
                    f"field 'files': {parent!r} is a file and also a directory of {path!r}"
                )
            parent = posixpath.dirname(parent)


def _check_source_free(paths: Collection[str], source: str) -> None:
    """``BadRequest`` when a file of ``files`` lies under the language's source file: the code
    is written there after the files, into what would be a directory, so the request could
    never run (it failed as a ``SandboxError``, which clients retry)."""
    for path in paths:
        if path.startswith(source + "/"):
            raise BadRequest(
                f"field 'files': {path!r} would make {source!r}, the file the code is written "
                "to, a directory"
            )


def _check_class_path(paths: Collection[str]) -> None:
    """``BadRequest`` when a ``.jar`` of a Java request has ':' in its path: each jar joins
    the class path, whose entries ':' separates, so it would silently not be on it."""
    for path in paths:
        if path.endswith(".jar") and ":" in path:
            raise BadRequest(
                f"field 'files': {path!r} would join java's class path, where ':' separates "
                "entries; name the jar without ':'"
            )


def _arg(path: str) -> str:
    """``path`` as one shell word that no command reads as an option ('-n/x' is './-n/x')."""
    return shlex.quote(path if path.startswith("/") else f"./{path}")


def _upload_commands(files: dict[str, bytes]) -> list[str]:
    """Shell commands writing ``files`` (base64 in chunks the kernel accepts as arguments)."""
    steps: list[str] = []
    for path, data in files.items():
        quoted = _arg(path)
        encoded = base64.b64encode(data).decode()
        parent = posixpath.dirname(path)
        prefix = f"mkdir -p {_arg(parent)} && " if parent else ""
        if not encoded:
            steps.append(f"{prefix}: > {quoted}")
            continue
        for i in range(0, len(encoded), CHUNK_CHARS):
            redirect = ">" if i == 0 else ">>"
            steps.append(
                f"{prefix if i == 0 else ''}printf %s {encoded[i : i + CHUNK_CHARS]} "
                f"| base64 -d {redirect} {quoted}"
            )
    commands: list[str] = []
    current: list[str] = []
    size = 0
    for step in steps:
        if current and size + len(step) > 2 * CHUNK_CHARS:
            commands.append(" && ".join(current))
            current, size = [], 0
        current.append(step)
        size += len(step)
    if current:
        commands.append(" && ".join(current))
    return commands


#: Builds the compilers image the first time a request needs it (one build per process).
IMAGE_BUILDS = ImageBuilds()


async def run_code(
    runtime: Runtime, req: RunCodeRequest, settings: RunCodeSettings, *, max_output_bytes: int
) -> dict:
    """Run one request in a container of its own (compile, then run) and answer in
    SandboxFusion's format; the output is cut at ``max_output_bytes`` per stream."""
    lang = LANGUAGES[req.language]
    check_steps(req, settings, max_output_bytes)
    image = lang.image or settings.image
    if lang.image is not None and runtime.cpu is not None:
        try:
            await IMAGE_BUILDS.ensure(runtime.cpu.aoe.client, image)
        except LiveError as exc:
            return sandbox_error(exc.message)
    files = dict(req.files)
    files[lang.source] = req.code.encode()
    stdin_path = "/tmp/.tangram-stdin"
    if req.stdin is not None:
        files[stdin_path] = req.stdin.encode()
    # (Off the loop for large files: their base64, up to 64 MiB of it, took the loop ~0.1 s.)
    big = sum(len(data) for data in files.values()) > UPLOAD_THREAD_BYTES
    uploads = await asyncio.to_thread(_upload_commands, files) if big else _upload_commands(files)
    redirect = stdin_path if req.stdin is not None else "/dev/null"
    traj = f"run-code-{uuid.uuid4().hex[:12]}"
    door = asyncio.get_running_loop().time() + settings.queue_allowance_s
    await runtime.open_trajectory(
        traj,
        memory_gb=req.memory_gb,
        image=image,
        wait_s=settings.queue_allowance_s,
        ephemeral=True,
    )
    try:
        for step in uploads[:-1]:
            spec = ActionSpec(CpuWork(step), trajectory=traj, kind="run_code_upload", t1_s=0.01)
            setup = await admitted(door, lambda spec=spec: runtime.run(spec))
            if not setup.ok or setup.value.exit_code != 0:
                return sandbox_error(f"writing the files failed: {_why(setup)}")
        last_upload = uploads[-1] if uploads else None
        compiled: dict[str, Any] | None = None
        compile_command, run_command = _commands(req)
        if compile_command is not None:
            step = f"timeout -k 1 {req.compile_timeout_s:g} sh -c {shlex.quote(compile_command)}"
            outcome, unwritten = await _step(
                runtime, traj, req, settings, last_upload, step, "compile", max_output_bytes, door
            )
            last_upload = None
            if unwritten is not None:
                return sandbox_error(f"writing the files failed: {unwritten}")
            compiled = _answer(outcome, req.compile_timeout_s)
            if compiled["status"] == "SandboxError":
                return compiled
            compiled["compile_result"], compiled["run_result"] = compiled["run_result"], None
            if compiled["status"] != "Success":
                answer = compiled
                answer["message"] = answer["message"] or "compile error"
        if compiled is None or compiled["status"] == "Success":
            t = req.run_timeout_s
            run = f"timeout -k 1 {t:g} {run_command} < {redirect}"
            outcome, unwritten = await _step(
                runtime, traj, req, settings, last_upload, run, "run", max_output_bytes, door
            )
            if unwritten is not None:
                return sandbox_error(f"writing the files failed: {unwritten}")
            answer = _program_answer(outcome, t)
            if compiled is not None and answer["status"] != "SandboxError":
                answer["compile_result"] = compiled["compile_result"]
        if req.fetch_files and answer["status"] != "SandboxError":
            notes: list[str] = []
            try:
                answer["files"] = await _fetch(
                    runtime, traj, req.fetch_files, settings.queue_allowance_s, notes
                )
            except LiveError as exc:
                notes.append(exc.message)  # the run's answer stands; files are missing
            if notes:
                answer["message"] = "; ".join(m for m in (answer["message"], *notes) if m)
        return answer
    finally:
        try:
            await runtime.close_trajectory(traj)
        except LiveError as exc:  # the answer stands (the service is stopping, say)
            log.warning("closing /run_code's container %s failed: %s", traj, exc)


def _commands(req: RunCodeRequest) -> tuple[str | None, str]:
    """The language's compile and run commands; for Java, each ``.jar`` of ``files`` joins
    the class path ('.') of both, as SandboxFusion's ``run_java`` does."""
    lang = LANGUAGES[req.language]
    jars = [p for p in req.files if p.endswith(".jar")] if req.language == "java" else []
    if not jars or lang.compile is None:
        return lang.compile, lang.run
    cp = f"-cp {shlex.quote(':'.join(['.', *jars]))} "
    return lang.compile.replace("-cp . ", cp), lang.run.replace("-cp . ", cp)


async def _step(
    runtime: Runtime,
    traj: str,
    req: RunCodeRequest,
    settings: RunCodeSettings,
    upload: str | None,
    command: str,
    what: str,
    cap: int,
    door: float,
) -> tuple[Outcome, str | None]:
    """One compile or run action, after the last file upload when one is left (one container
    round trip, not two); and why the upload failed (None: it did not), in which case the
    command never ran: the sandbox failed, not the program."""
    marker = None
    if upload:
        marker = f"tangram: writing the files failed ({uuid.uuid4().hex})"
        command = (
            f"if ! {{ {upload}; }}; then printf '%s\\n' {shlex.quote(marker)} >&2; "
            f"exit {UPLOAD_FAILED_EXIT}; fi; {command}"
        )
    spec = step_spec(req, settings, traj, command, what, cap)
    outcome = await admitted(door, lambda: runtime.run(spec))
    return outcome, _upload_failure(outcome, marker)


def step_spec(
    req: RunCodeRequest, settings: RunCodeSettings, traj: str, command: str, what: str, cap: int
) -> ActionSpec:
    """The action of the compile (``what`` "compile") or run step: the request's cores, time
    limit and output cap; ``BadRequest`` when the request asks what no action may."""
    t = req.compile_timeout_s if what == "compile" else req.run_timeout_s
    return ActionSpec(
        CpuWork(command, max_output_bytes=cap),
        trajectory=traj,
        kind="run_code" if what == "run" else "run_code_compile",
        max_units=req.max_units,
        t1_s=max(0.01, min(t, 1.0)),
        serial_fraction=settings.serial_fraction if req.max_units > 1 else None,
        timeout_s=t + settings.queue_allowance_s,
        task="run_code",
    )


def check_steps(req: RunCodeRequest, settings: RunCodeSettings, cap: int) -> None:
    """Build the request's step actions once before anything happens: a limit only an
    action checks (``ActionSpec``) refuses the request with a 400 before the image build and
    the container, not after them (a huge ``max_units`` opened and removed a container)."""
    whats = ("compile", "run") if LANGUAGES[req.language].compile is not None else ("run",)
    for what in whats:
        step_spec(req, settings, "run-code-check", "true", what, cap)


def _upload_failure(outcome: Outcome, marker: str | None) -> str | None:
    """Why the step's upload failed (its stderr before the marker), or None."""
    value = outcome.value
    if marker is None or not isinstance(value, CommandResult):
        return None
    if value.exit_code != UPLOAD_FAILED_EXIT or not value.stderr.rstrip().endswith(marker):
        return None
    why = value.stderr.rstrip()[: -len(marker)].strip()
    return why[-500:] or f"exit code {UPLOAD_FAILED_EXIT}"


def _why(outcome: Outcome) -> str:
    if outcome.error is not None:
        return outcome.error.message
    value = outcome.value
    if isinstance(value, CommandResult):
        return f"exit code {value.exit_code}: {value.stderr.strip()[-500:]}"
    return outcome.status


#: Error codes of the program's own run that the program caused: its output passed the limit
#: (it was killed), or it killed its container's processes. Each request has a container of
#: its own, so nothing but the program ran there: ``Failed``, never ``SandboxError`` (which
#: SandboxFusion's client retries, running the program again).
PROGRAM_FAULTS = frozenset({"exec_failed", "container_failure"})


def _answer(outcome: Outcome, run_timeout_s: float) -> dict[str, Any]:
    """The SandboxFusion answer to a compile or run step, by the outcome's status."""
    return ANSWERS[outcome.status](outcome, run_timeout_s)


def _program_answer(outcome: Outcome, run_timeout_s: float) -> dict[str, Any]:
    """The answer to the program's run step. A run the service's shutdown cut after it
    started is final: ``Failed`` with ``run_result`` ``Error`` (no return code), not a
    ``SandboxError``, which SandboxFusion's client retries, running the program a second time
    on a restarted service. (A step the shutdown ended before it started ran nothing: that
    stays a ``SandboxError``, safe to retry; so does a cut compile, the program unrun.)"""
    if _cut_by_shutdown(outcome):
        assert outcome.error is not None
        return _failed(
            outcome,
            "Error",
            f"the program was cut: {outcome.error.message}; it is not run again (the service "
            "runs nothing twice), send it again as a new request if it should run",
        )
    return _answer(outcome, run_timeout_s)


def _cut_by_shutdown(outcome: Outcome) -> bool:
    """True when the runtime's shutdown ended the action after it had started running."""
    error = outcome.error
    started = outcome.start_s is not None
    return error is not None and error.code == ShuttingDown.code and started


def _finished(outcome: Outcome, run_timeout_s: float) -> dict[str, Any]:
    value = outcome.value
    if not isinstance(value, CommandResult):
        return sandbox_error(f"the sandbox failed: {_why(outcome)}")
    code = value.exit_code
    # ``timeout`` exits 124 when the limit fired (137: TERM ignored, KILL a second later); a
    # program that exits 124 or 137 itself before the limit finished on its own.
    limit_hit = code in (TIMEOUT_EXIT, 137) and outcome.timings.exec_s >= run_timeout_s
    if limit_hit:
        return _failed(outcome, "TimeLimitExceeded", value.message or "TimeLimitExceeded")
    if code == 0:
        return _run_answer("Success", "", outcome, "Finished")
    return _failed(outcome, "Finished", value.message or "Finished")


def _timed_out(outcome: Outcome, run_timeout_s: float) -> dict[str, Any]:
    """The step's time limit, when it ran into it. A step whose action timed out before it
    started (it waited its whole time-out for memory or cores) never ran: a
    ``SandboxError`` (the client's retry is safe), not ``TimeLimitExceeded``, which blamed
    the program and which the client does not retry."""
    why = outcome.error.message if outcome.error else "TimeLimitExceeded"
    if outcome.start_s is None:
        return sandbox_error(f"the sandbox was too busy, the step never started: {why}")
    return _failed(outcome, "TimeLimitExceeded", why)


def _errored(outcome: Outcome, run_timeout_s: float) -> dict[str, Any]:
    error = outcome.error
    if error is not None and error.code in PROGRAM_FAULTS and outcome.start_s is not None:
        return _failed(outcome, "Error", error.message)
    return sandbox_error(f"the sandbox failed: {_why(outcome)}")


#: The answer for each outcome status (``Outcome.status``).
ANSWERS: dict[str, Callable[[Outcome, float], dict[str, Any]]] = {
    "result": _finished,
    "timeout": _timed_out,
    "error": _errored,
}


def _failed(outcome: Outcome, run_status: str, message: str) -> dict[str, Any]:
    return _run_answer("Failed", message, outcome, run_status)


def _run_answer(status: str, message: str, outcome: Outcome, run_status: str) -> dict[str, Any]:
    value = outcome.value if isinstance(outcome.value, CommandResult) else None
    return {
        "status": status,
        "message": message,
        "compile_result": None,
        "run_result": {
            "status": run_status,
            "execution_time": round(outcome.timings.exec_s, 6),
            # SandboxFusion has no return code for a run it stopped at the time limit.
            "return_code": value.exit_code if value and run_status != "TimeLimitExceeded" else None,
            "stdout": value.stdout if value else "",
            "stderr": value.stderr if value else "",
        },
        "executor_pod_name": None,
        "files": {},
    }


async def _fetch(
    runtime: Runtime, traj: str, paths: tuple[str, ...], patience_s: float, notes: list[str]
) -> dict[str, str]:
    """Read files back (base64), each keyed by its name as asked; a missing file is left out,
    as SandboxFusion does. A file is read in ``FETCH_CHUNK`` pieces (one action's output is
    capped); files past ``MAX_FETCH_BYTES`` in all are left out, each named in ``notes``."""
    found: dict[str, str] = {}
    #: Each file read (by normalised path), its size and base64: one asked under two names is
    #: read once (and counted against the budget under each, as it is answered under each).
    read: dict[str, tuple[int, str]] = {}
    budget = MAX_FETCH_BYTES
    for name in paths:
        if name in found:
            continue
        path = posixpath.normpath(name)
        if path in read:
            n, data = read[path]
            if n > budget:
                notes.append(_too_big(name, n))
            else:
                found[name] = data
                budget -= n
            continue
        quoted = _arg(path)
        # Its size and first piece in one round trip: most files need no other.
        head = await _read(
            runtime,
            traj,
            f"test -f {quoted} && wc -c < {quoted} && head -c {FETCH_CHUNK} {quoted} | base64 -w0",
            patience_s,
        )
        size, _, first = (head or "").partition("\n")
        if not size.strip().isdigit():
            continue  # not there (or not a regular file)
        n = int(size)
        if n > budget:
            notes.append(_too_big(name, n))
            continue
        pieces = [first.strip()]
        for offset in range(FETCH_CHUNK, n, FETCH_CHUNK):
            piece = await _read(
                runtime,
                traj,
                f"tail -c +{offset + 1} {quoted} | head -c {FETCH_CHUNK} | base64 -w0",
                patience_s,
            )
            if piece is None:
                break
            pieces.append(piece.strip())
        data = "".join(pieces)
        if len(data) != 4 * ((n + 2) // 3):
            notes.append(f"{name!r} could not be read back whole ({n:,} bytes)")
            continue
        found[name] = data
        read[path] = (n, data)
        budget -= n
    return found


def _too_big(name: str, size: int) -> str:
    return (
        f"{name!r} ({size:,} bytes) was not returned: an answer carries at most "
        f"{MAX_FETCH_BYTES:,} bytes of files"
    )


async def _read(runtime: Runtime, traj: str, command: str, patience_s: float) -> str | None:
    """The stdout of ``command`` run after the program, or None when it did not exit 0."""
    outcome = await _after_the_run(
        runtime,
        ActionSpec(
            CpuWork(command, max_output_bytes=FETCH_CAP),
            trajectory=traj,
            kind="run_code_fetch",
            t1_s=0.01,
        ),
        patience_s,
    )
    value = outcome.value
    if outcome.ok and isinstance(value, CommandResult) and value.exit_code == 0:
        return value.stdout
    return None


async def _after_the_run(runtime: Runtime, spec: ActionSpec, patience_s: float) -> Outcome:
    """An action after the program ran: admission's refusal is waited out (its Retry-After),
    never answered with a 429, which the client would resend, running the program again."""
    deadline = asyncio.get_running_loop().time() + patience_s
    try:
        return await admitted(deadline, lambda: runtime.run(spec))
    except Overloaded as exc:
        raise LiveError(f"the program ran but its files could not be read: {exc}") from exc


T = TypeVar("T")

#: The shortest pause between two tries at the door (a Retry-After hint may be smaller).
DOOR_PAUSE_S = 0.05


async def admitted(deadline: float, start: Callable[[], Awaitable[T]]) -> T:
    """``start()`` once admission takes it: a refusal (``Overloaded``: nothing was accepted,
    so trying again runs nothing twice) is waited out by its Retry-After until ``deadline``
    (the loop's time), and then raised."""
    loop = asyncio.get_running_loop()
    while True:
        try:
            return await start()
        except Overloaded as exc:
            left = deadline - loop.time()
            if left <= 0:
                raise
            await asyncio.sleep(min(max(exc.retry_after_s, DOOR_PAUSE_S), left))
