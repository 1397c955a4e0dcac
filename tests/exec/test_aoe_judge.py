"""How AOE judges an action's end (``tangram.exec.aoe.judge``), as a specification: from what
the transport saw and what was seen of the container, every verdict the executor can give, with
its status, exit code, message and reason. No Docker: the raw results are constructed."""

from __future__ import annotations

from dataclasses import replace

import pytest

from tangram.exec.aoe.judge import (
    CONTAINER_FAILURE,
    RULES,
    UNRUN,
    Facts,
    Probe,
    Unrun,
    Verdict,
    judge,
    probe,
    refused,
    unrun,
    wants_oom_count,
)
from tangram.exec.aoe.transport import RawResult

LIMIT = 1000
FACTS = Facts(max_output_bytes=LIMIT, timeout_s=0.7, memory_gb=2.0)
DIED = "container abc died: status exited, exit code 137"


def raw(
    code: int | None = 0,
    ended: str = "exit",
    stdout: bytes = b"out\n",
    stderr: bytes = b"",
    stdout_bytes: int | None = None,
    stderr_bytes: int | None = None,
) -> RawResult:
    """A transport's result; the byte counts default to what the streams hold."""
    return RawResult(
        code,
        stdout,
        stderr,
        ended,
        len(stdout) if stdout_bytes is None else stdout_bytes,
        len(stderr) if stderr_bytes is None else stderr_bytes,
    )


def facts(**kw: object) -> Facts:
    return replace(FACTS, **kw)


# --- every way an action that ran can end ---------------------------------------------------

#: (name, raw result, facts, status, error, reason): read top to bottom, it is the rule book.
CASES = [
    ("exit 0 is ok", raw(0), FACTS, "ok", None, "ok"),
    # It was "exit code None", an error naming a code no command can have: the exec's exit
    # code was not yet in the engine's record (a loaded machine), or the runner's end line
    # was unreadable. The command may well have succeeded: the outcome says it is unknown.
    (
        "an end whose exit code could not be read says it is unknown",
        raw(None, stderr=b"warn\n"),
        FACTS,
        "error",
        f"{CONTAINER_FAILURE}the command ended but its exit code could not be read; whether "
        "it succeeded is unknown: warn",
        "exit_unknown",
    ),
    (
        "a non-zero exit names the code and the last stderr line",
        raw(3, stderr=b"warming up\nbad input\n"),
        FACTS,
        "error",
        "exit code 3: bad input",
        "exit_code",
    ),
    (
        "a non-zero exit without stderr names the code",
        raw(1),
        FACTS,
        "error",
        "exit code 1",
        "exit_code",
    ),
    (
        "exit 127 is a command not found",
        raw(127, stderr=b"/bin/sh: foo: not found\n"),
        FACTS,
        "error",
        "command not found (exit 127): /bin/sh: foo: not found",
        "command_not_found",
    ),
    (
        "exit 126 is a command not executable",
        raw(126, stderr=b"/bin/sh: ./x: Permission denied\n"),
        FACTS,
        "error",
        "command not executable (exit 126): /bin/sh: ./x: Permission denied",
        "not_executable",
    ),
    (
        "a SIGKILL while the container's OOM counter grew is the out-of-memory killer",
        raw(137, stderr=b"Killed\n"),
        facts(oom_kills_before=0, oom_kills_after=1),
        "error",
        "killed by the out-of-memory killer (memory limit 2 GB)",
        "out_of_memory",
    ),
    (
        "a SIGKILL without an OOM kill is a signal",
        raw(137),
        facts(oom_kills_before=1, oom_kills_after=1),
        "error",
        "killed by signal 9 (exit 137)",
        "signal",
    ),
    (
        "a SIGKILL whose OOM counter is unknown is a signal",
        raw(137, stderr=b"Killed\n"),
        facts(oom_kills_before=None, oom_kills_after=3),
        "error",
        "killed by signal 9 (exit 137): Killed",
        "signal",
    ),
    (
        "an exit above 128 is the signal it encodes",
        raw(143, stderr=b"Terminated\n"),
        FACTS,
        "error",
        "killed by signal 15 (exit 143): Terminated",
        "signal",
    ),
    (
        "an exit past 128 + the last signal (64) is a plain exit code ('exit(-1)' is 255)",
        raw(255),
        FACTS,
        "error",
        "exit code 255",
        "exit_code",
    ),
    (
        "exit 128 itself is a plain exit code",
        raw(128),
        FACTS,
        "error",
        "exit code 128",
        "exit_code",
    ),
    (
        "a time-out says how long and that the container was kept",
        raw(137, ended="timeout", stdout=b"started\n"),
        FACTS,
        "timeout",
        "timed out after 0.7 s; the action's processes were killed, the container was kept",
        "timeout",
    ),
    (
        "a time-out wins over output past the limit",
        raw(137, ended="timeout", stdout_bytes=LIMIT + 1),
        FACTS,
        "timeout",
        "timed out after 0.7 s; the action's processes were killed, the container was kept",
        "timeout",
    ),
    (
        "stdout past the limit is output too large, even with exit 0",
        raw(0, stdout_bytes=LIMIT + 5),
        FACTS,
        "error",
        f"output too large: stdout passed max_output_bytes={LIMIT} ({LIMIT + 5}+ bytes); "
        "the action was killed and its output truncated",
        "output_too_large",
    ),
    (
        "stderr past the limit is output too large",
        raw(137, ended="overflow", stderr_bytes=LIMIT + 9),
        facts(oom_kills_before=0, oom_kills_after=1),
        "error",
        f"output too large: stderr passed max_output_bytes={LIMIT} ({LIMIT + 9}+ bytes); "
        "the action was killed and its output truncated",
        "output_too_large",
    ),
    (
        "a container found dead fails the action whatever the command did",
        raw(None, ended="eof"),
        facts(death=DIED),
        "error",
        f"{CONTAINER_FAILURE}{DIED}",
        "container_died",
    ),
    (
        "a container found dead wins over a time-out",
        raw(137, ended="timeout"),
        facts(death=DIED),
        "error",
        f"{CONTAINER_FAILURE}{DIED}",
        "container_died",
    ),
    (
        "a runner that stopped answering after the kill is a container failure",
        raw(None, ended="stuck"),
        FACTS,
        "error",
        f"{CONTAINER_FAILURE}the action's runner stopped answering after it was killed; "
        "a fresh runner will serve the next action",
        "runner_stuck",
    ),
    (
        "a runner stream that ended early is a container failure",
        raw(0, ended="eof"),
        FACTS,
        "error",
        f"{CONTAINER_FAILURE}the action's runner ended unexpectedly (killed from outside?)",
        "runner_ended",
    ),
]


@pytest.mark.parametrize(
    ("name", "result", "seen", "status", "error", "reason"), CASES, ids=[c[0] for c in CASES]
)
def test_an_action_that_ran_is_judged_by_the_first_rule_that_applies(
    name: str, result: RawResult, seen: Facts, status: str, error: str | None, reason: str
) -> None:
    verdict = judge(result, seen)
    assert verdict == Verdict(status, result.exit_code, result.stdout, result.stderr, error, reason)


def test_every_rule_is_in_the_rule_book() -> None:
    assert {case[-1] for case in CASES} == {rule.reason for rule in RULES}


def test_the_last_stderr_line_is_the_detail_and_undecodable_bytes_are_replaced() -> None:
    verdict = judge(raw(2, stderr=b"\xff first\nsecond \xfe\n\n"), FACTS)
    assert verdict.error == "exit code 2: second \ufffd"
    assert judge(raw(2, stderr=b"  \n"), FACTS).error == "exit code 2"


def test_the_outputs_are_passed_through_as_the_transport_cut_them() -> None:
    result = raw(1, stdout=b"x" * 10, stderr=b"y" * 10, stdout_bytes=10, stderr_bytes=10)
    verdict = judge(result, FACTS)
    assert (verdict.stdout, verdict.stderr) == (b"x" * 10, b"y" * 10)


# --- whether the container is looked at first -------------------------------------------------


@pytest.mark.parametrize(
    ("result", "expected"),
    [
        (raw(0), None),
        (raw(3), None),
        (raw(127), None),
        (raw(0, ended="timeout"), None),
        (raw(1, ended="overflow"), None),
        (raw(137), Probe(False, "killed by a signal (exit 137)")),
        (raw(128, ended="timeout"), Probe(False, "killed by a signal (exit 128)")),
        (raw(None), Probe(True, "no exit code came back")),
        (raw(None, ended="timeout"), Probe(True, "no exit code came back")),
        (raw(0, ended="eof"), Probe(True, "the runner's stream ended (eof)")),
        (raw(None, ended="stuck"), Probe(True, "the runner's stream ended (stuck)")),
    ],
    ids=[
        "a clean exit: no",
        "a failed exit: no",
        "command not found: no",
        "a time-out with exit 0: no",
        "an overflow with a small exit code: no",
        "a signal: look once",
        "exit 128 at a time-out: look once",
        "no exit code: look a while",
        "a time-out without exit code: look a while",
        "the runner's stream ended: look a while",
        "the runner stuck: look a while",
    ],
)
def test_the_container_is_looked_at_when_it_may_have_ended_the_action(
    result: RawResult, expected: Probe | None
) -> None:
    assert probe(result) == expected


def test_the_oom_counter_is_read_again_only_after_a_sigkill_it_could_explain() -> None:
    assert wants_oom_count(raw(137), oom_kills_before=0)
    assert not wants_oom_count(raw(137), oom_kills_before=None)
    assert not wants_oom_count(raw(139), oom_kills_before=0)
    assert not wants_oom_count(raw(0), oom_kills_before=0)


# --- actions that never ran --------------------------------------------------------------------


@pytest.mark.parametrize(
    ("failure", "death", "error", "reason"),
    [
        (Unrun("cgroup_vanished"), None, "its cgroup vanished", "cgroup_vanished"),
        (Unrun("cgroup_vanished"), DIED, DIED, "container_died"),
        (
            Unrun("grant_failed", "writing '0' to /x failed: EBUSY"),
            None,
            "the grant could not be written: writing '0' to /x failed: EBUSY",
            "grant_failed",
        ),
        (
            Unrun("transport_failed", "APIError: 500 Server Error"),
            None,
            "APIError: 500 Server Error",
            "transport_failed",
        ),
        (Unrun("transport_failed", "APIError: 409"), DIED, DIED, "container_died"),
    ],
    ids=[
        "the cgroup vanished, the container still runs",
        "the cgroup vanished with the container",
        "the grant could not be written",
        "the transport failed, the container still runs",
        "the transport failed with the container",
    ],
)
def test_an_action_that_never_ran_is_a_container_failure_with_no_output(
    failure: Unrun, death: str | None, error: str, reason: str
) -> None:
    verdict = unrun(failure, death)
    assert verdict == Verdict("error", None, b"", b"", f"{CONTAINER_FAILURE}{error}", reason)


def test_only_a_failure_that_may_mean_a_dead_container_looks_at_it() -> None:
    assert UNRUN["cgroup_vanished"].probe == Probe(True, "the cgroup vanished")
    assert UNRUN["transport_failed"].probe == Probe(True, "the transport failed")
    assert UNRUN["grant_failed"].probe is None


def test_an_action_sent_to_a_dead_container_is_refused_asking_for_recreate() -> None:
    verdict = refused("abc123", DIED)
    assert verdict == Verdict(
        "error",
        None,
        b"",
        b"",
        f"container abc123 is dead ({DIED}); call recreate()",
        "container_dead",
    )
