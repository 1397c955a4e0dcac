"""What happened to an action: raw facts in (what the transport saw, what was seen of the
container), one ``Verdict`` with its reason out. Pure: no Docker, no threads, no clock, so every
rule is a specification a test can state from a constructed ``RawResult``.

The order of judgement: first whether the container (not the command) failed the action, then
how the command ended (``RULES``, first match wins). An action that never ran (the grant or the
transport failed) is judged by ``UNRUN``; one sent to a container already dead, by ``refused``.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING

from tangram.exec.aoe.records import KillReport, Status

if TYPE_CHECKING:
    from tangram.exec.aoe.transport import RawResult

#: The prefix of every error the container, not the command, caused (the live runtime's CPU
#: executor tells executor failures from command failures by it).
CONTAINER_FAILURE = "container failure: "

#: Stream ends that leave the runner, not the command, in question.
_RUNNER_LOST = ("eof", "stuck")

#: Exit code of a process killed by SIGKILL (what the OOM killer sends).
_SIGKILL_EXIT = 137


@dataclass(frozen=True)
class Verdict:
    """How an action ended: its ``ActionOutcome`` before the cores and timings."""

    status: Status
    exit_code: int | None
    stdout: bytes
    stderr: bytes
    error: str | None
    #: The rule that decided: a ``Rule.reason``, an ``UNRUN`` key, ``container_died``,
    #: ``container_dead`` or ``late`` (its deadline passed before it started).
    reason: str


@dataclass(frozen=True)
class Facts:
    """What the judge knows besides the raw result: the action's limits and what was seen of
    its container."""

    max_output_bytes: int
    timeout_s: float
    memory_gb: float
    #: The container's OOM-kill counter before and after the action (None: unknown, or not
    #: read because ``wants_oom_count`` said it could not matter).
    oom_kills_before: int | None = None
    oom_kills_after: int | None = None
    #: Why the container is dead, when the probe ``probe`` asked for found it so.
    death: str | None = None
    #: What the kill at the time-out or on overflow did (None: no kill, or not reported).
    kill: KillReport | None = None


@dataclass(frozen=True)
class Probe:
    """The container must be looked at before judging: is it still running?"""

    #: The stream ended without an answer, so the container probably died but the engine may
    #: not know yet: keep looking a moment rather than once.
    suspect: bool
    reason: str


#: Linux's highest signal number (SIGRTMAX): a shell reports a death by signal N as exit
#: 128 + N, so an exit past 128 + 64 (255: a program's ``exit(-1)``) is the program's own.
LAST_SIGNAL = 64


def probe(raw: RawResult) -> Probe | None:
    """Whether the container may have ended the action (None: the command ended on its own)."""
    if raw.ended in _RUNNER_LOST:
        return Probe(True, f"the runner's stream ended ({raw.ended})")
    if raw.exit_code is None:
        return Probe(True, "no exit code came back")
    if raw.exit_code >= 128:
        return Probe(False, f"killed by a signal (exit {raw.exit_code})")
    return None


def wants_oom_count(raw: RawResult, oom_kills_before: int | None) -> bool:
    """Whether the OOM-kill counter after the action can matter: only a SIGKILL whose counter
    was readable before."""
    return raw.exit_code == _SIGKILL_EXIT and oom_kills_before is not None


# --- the rules, in order ------------------------------------------------------------------


@dataclass(frozen=True)
class Rule:
    """One way an action can end: when it applies, its status, and its error message."""

    reason: str
    status: Status
    applies: Callable[[RawResult, Facts], bool]
    error: Callable[[RawResult, Facts], str | None]


def _detail(raw: RawResult) -> str:
    """``: <last stderr line>``, or nothing when stderr is empty."""
    lines = raw.stderr.decode(errors="replace").strip().splitlines()
    return f": {lines[-1]}" if lines else ""


def _kill_note(facts: Facts) -> str:
    """What a reported kill did not do, to append to "killed" (empty when all died)."""
    frozen = (
        "; its action cgroup could not be thawed after the kill, so its container takes no "
        "more actions (recreate it)"
        if facts.kill is not None and facts.kill.left_frozen
        else ""
    )
    return _survivors_note(facts) + frozen


def _kept_note(facts: Facts) -> str:
    """ ", the container was kept" unless the kill left it frozen (it is then taken out of
    service, as ``_kill_note`` says)."""
    return "" if facts.kill is not None and facts.kill.left_frozen else ", the container was kept"


def _survivors_note(facts: Facts) -> str:
    """What a reported kill left alive, to append to "killed" (empty when all died)."""
    kill = facts.kill
    if kill is not None and kill.by == "cgroup" and kill.survivors is None:
        return (
            " but whether all of its processes died is not known (the kill failed; what is "
            "left stays in the action's cgroup, where later kills take it)"
        )
    if kill is None or (kill.by == "cgroup" and not kill.survivors):
        return ""
    if kill.by == "cgroup":
        return (
            f" but {kill.survivors} of its processes could not be (stuck in the kernel?; they "
            "stay in the action's cgroup, where later kills take them)"
        )
    return (
        " (those that still carried its marker: the container's cgroups are out of reach "
        "here, and a process that cleared its environment may have survived)"
    )


def _too_large(raw: RawResult, facts: Facts) -> bool:
    limit = facts.max_output_bytes
    return raw.ended == "overflow" or raw.stdout_bytes > limit or raw.stderr_bytes > limit


def _too_large_error(raw: RawResult, facts: Facts) -> str:
    limit = facts.max_output_bytes
    which = "stdout" if raw.stdout_bytes > limit else "stderr"
    size = max(raw.stdout_bytes, raw.stderr_bytes)
    return (
        f"output too large: {which} passed max_output_bytes={limit} "
        f"({size}+ bytes); the action was killed{_kill_note(facts)} and its output truncated"
    )


def _oom_killed(raw: RawResult, facts: Facts) -> bool:
    before = facts.oom_kills_before
    return (
        raw.exit_code == _SIGKILL_EXIT
        and before is not None
        and (facts.oom_kills_after or 0) > before
    )


RULES: tuple[Rule, ...] = (
    Rule(
        "container_died",
        "error",
        lambda raw, facts: facts.death is not None,
        lambda raw, facts: f"{CONTAINER_FAILURE}{facts.death}",
    ),
    Rule(
        "runner_stuck",
        "error",
        lambda raw, facts: raw.ended == "stuck",
        lambda raw, facts: (
            f"{CONTAINER_FAILURE}the action's runner stopped answering after it was killed; "
            "a fresh runner will serve the next action"
        ),
    ),
    Rule(
        "runner_ended",
        "error",
        lambda raw, facts: raw.ended == "eof",
        lambda raw, facts: (
            f"{CONTAINER_FAILURE}the action's runner ended unexpectedly (killed from "
            f"outside?){_detail(raw)}"
        ),
    ),
    Rule(
        "timeout",
        "timeout",
        lambda raw, facts: raw.ended == "timeout",
        lambda raw, facts: (
            f"timed out after {facts.timeout_s:g} s; the action's processes were killed"
            f"{_kill_note(facts)}{_kept_note(facts)}"
        ),
    ),
    Rule("output_too_large", "error", _too_large, _too_large_error),
    Rule(
        "exit_unknown",
        "error",
        lambda raw, facts: raw.exit_code is None,
        lambda raw, facts: (
            f"{CONTAINER_FAILURE}the command ended but its exit code could not be read; "
            f"whether it succeeded is unknown{_detail(raw)}"
        ),
    ),
    Rule("ok", "ok", lambda raw, facts: raw.exit_code == 0, lambda raw, facts: None),
    Rule(
        "command_not_found",
        "error",
        lambda raw, facts: raw.exit_code == 127,
        lambda raw, facts: f"command not found (exit 127){_detail(raw)}",
    ),
    Rule(
        "not_executable",
        "error",
        lambda raw, facts: raw.exit_code == 126,
        lambda raw, facts: f"command not executable (exit 126){_detail(raw)}",
    ),
    Rule(
        "out_of_memory",
        "error",
        _oom_killed,
        lambda raw, facts: (
            f"killed by the out-of-memory killer (memory limit {facts.memory_gb:g} GB)"
        ),
    ),
    Rule(
        "signal",
        "error",
        lambda raw, facts: raw.exit_code is not None and 128 < raw.exit_code <= 128 + LAST_SIGNAL,
        lambda raw, facts: (
            f"killed by signal {raw.exit_code - 128} (exit {raw.exit_code}){_detail(raw)}"
        ),
    ),
    Rule(
        "exit_code",
        "error",
        lambda raw, facts: True,
        lambda raw, facts: f"exit code {raw.exit_code}{_detail(raw)}",
    ),
)


def judge(raw: RawResult, facts: Facts) -> Verdict:
    """The verdict on an action that ran: the first rule of ``RULES`` that applies."""
    for rule in RULES:
        if rule.applies(raw, facts):
            error = rule.error(raw, facts)
            return Verdict(rule.status, raw.exit_code, raw.stdout, raw.stderr, error, rule.reason)
    raise AssertionError("the last rule applies to every result")  # pragma: no cover


# --- actions that never ran ----------------------------------------------------------------


@dataclass(frozen=True)
class Unrun:
    """Why an action never produced a raw result: a key of ``UNRUN`` and the error's text."""

    reason: str
    detail: str = ""


@dataclass(frozen=True)
class UnrunRule:
    """How to judge a failure before the command ran: look at the container first or not,
    and what to say when the container is still running."""

    probe: Probe | None
    error: Callable[[str], str]


UNRUN: dict[str, UnrunRule] = {
    # The grant found the cgroup gone: the container has probably just died.
    "cgroup_vanished": UnrunRule(
        Probe(True, "the cgroup vanished"), lambda detail: "its cgroup vanished"
    ),
    # The grant could not be written, yet the cgroup is there: the container is not suspect.
    "grant_failed": UnrunRule(None, lambda detail: f"the grant could not be written: {detail}"),
    # The engine failed the transport (the stream, the exec): the container may have died.
    "transport_failed": UnrunRule(Probe(True, "the transport failed"), lambda detail: detail),
}


def unrun(failure: Unrun, death: str | None = None) -> Verdict:
    """The verdict on an action that never ran; ``death`` when the probe found the container
    dead (it then names the cause)."""
    why = death or UNRUN[failure.reason].error(failure.detail)
    reason = "container_died" if death else failure.reason
    return Verdict("error", None, b"", b"", f"{CONTAINER_FAILURE}{why}", reason)


def late(waited_s: float) -> Verdict:
    """The verdict on an action whose deadline passed before its command could start (it
    waited ``waited_s`` for its trajectory's previous action or its cores): run nothing."""
    error = (
        f"timed out before it started: its deadline passed while it waited {waited_s:.3f} s "
        "for its trajectory's previous action or its cores; nothing ran"
    )
    return Verdict("timeout", None, b"", b"", error, "late")


def refused(short_id: str, dead: str) -> Verdict:
    """The verdict on an action sent to a container already known dead: run nothing."""
    error = f"container {short_id} is dead ({dead}); call recreate()"
    return Verdict("error", None, b"", b"", error, "container_dead")
