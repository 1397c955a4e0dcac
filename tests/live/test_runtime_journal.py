"""The journal (issue 16, defect 2): accepted ids, fingerprints and outcomes on disk, so a
restarted runtime never runs an id twice. On API work (no Docker, no torch): the journal on
its own (round trip, unknown after a stop, bounds, lock, failed commits), then runtimes on
one journal in turn, as a service restarted on it would be."""

from __future__ import annotations

import asyncio
import json
import sqlite3
import time
from pathlib import Path
from typing import Any

import pytest

from tangram.exec.runtime import (
    ActionSpec,
    ApiExecutor,
    ApiWork,
    CommandResult,
    Conflict,
    Outcome,
    Runtime,
    RuntimeConfig,
    UnknownAction,
)
from tangram.exec.runtime.journal import Journal, JournalBusy
from tangram.exec.runtime.journal_codec import outcome_from_json, outcome_to_json
from tangram.exec.runtime.outcomes import UNKNOWN_CODE, unknown_outcome
from tangram.exec.runtime.records import STATUSES, ErrorInfo, Timings
from tangram.exec.service.schema import outcome_doc
from tests.live.conftest import CallLog, fail_commits, faulty_endpoints
from tests.live.test_runtime import api_cluster, counted


def outcome(action_id: str, value: Any = None, status: str = "result") -> Outcome:
    return Outcome(
        action_id=action_id,
        trajectory="t",
        resource="cpu",
        status=status,  # type: ignore[arg-type]
        value=value,
        error=None if status == "result" else ErrorInfo("cancelled", "by the client"),
        timings=Timings(0.1, 0.2, 0.3, 0.6),
        arrival_s=1.0,
        start_s=1.1,
        end_s=1.6,
        units=2,
        node="local",
        cores=(0, 1),
        reason="tangram: 2 of 2 free cores",
    )


def test_outcomes_round_trip_through_the_codec() -> None:
    cmd = outcome("a", CommandResult("hi\n", "", 0, None))
    assert outcome_from_json(outcome_to_json(cmd)) == cmd
    plain = outcome("b", {"hits": [1, 2.5, "x"], "n": None}, status="error")
    assert outcome_from_json(outcome_to_json(plain)) == plain
    odd = outcome_from_json(outcome_to_json(outcome("c", (1, float("inf"), {3}))))
    assert odd.value == [1, "inf", [3]]  # as the HTTP API shows them: lists, repr of the rest


def test_unknown_is_a_status_with_its_own_error_and_zero_timings() -> None:
    assert "unknown" in STATUSES
    out = unknown_outcome("lost", "api", None, 1_700_000_000.0)
    assert out.status == "unknown" and not out.ok and out.error is not None
    assert out.error.code == UNKNOWN_CODE and "2023-11-14" in out.error.message
    assert out.timings == Timings(0.0, 0.0, 0.0, 0.0) and out.start_s is None


def test_the_journal_keeps_ids_and_outcomes_and_marks_unfinished_ones_unknown(
    tmp_path: Path,
) -> None:
    path = tmp_path / "j.sqlite"
    j = Journal(path)
    assert j.open() == 0
    now = time.time()
    j.accept("done", "fp-done", "cpu", "t", now)
    j.accept("running", "fp-running", "api", None, now)
    pending = j.lookup("done")  # buffered, not yet on disk: found all the same
    assert pending is not None and pending.fingerprint == "fp-done" and pending.outcome is None
    j.commit()
    j.ended(outcome("done", CommandResult("out", "err", 3, "exit 3")), now)
    assert j.lookup("done").outcome.value.exit_code == 3  # type: ignore[union-attr]  # buffered
    j.commit()
    j.close()  # as if the process died with "running" in flight: no outcome recorded

    again = Journal(path)
    assert again.open() == 1
    done, lost = again.lookup("done"), again.lookup("running")
    assert done is not None and done.fingerprint == "fp-done"
    assert done.outcome == outcome("done", CommandResult("out", "err", 3, "exit 3"))
    assert lost is not None and lost.fingerprint == "fp-running"
    assert lost.outcome is not None and lost.outcome.status == "unknown"
    assert lost.outcome.resource == "api" and lost.outcome.action_id == "running"
    assert again.lookup("never") is None
    again.close()
    third = Journal(path)
    assert third.open() == 0, "an unknown outcome is an outcome: not marked twice"
    third.close()


def test_one_process_per_journal(tmp_path: Path) -> None:
    first = Journal(tmp_path / "j.sqlite")
    first.open()
    try:
        with pytest.raises(JournalBusy, match="in use by pid"):
            Journal(tmp_path / "j.sqlite").open()
    finally:
        first.close()
    second = Journal(tmp_path / "j.sqlite")  # released by close (and by the kernel on death)
    second.open()
    second.close()


def test_the_journal_is_bounded_by_count_and_age_and_keeps_unfinished_entries(
    tmp_path: Path,
) -> None:
    path = tmp_path / "j.sqlite"
    now = [0.0]

    def journal(keep: int) -> Journal:
        return Journal(path, keep=keep, keep_s=1000.0, clock=lambda: now[0])

    def ids() -> set[str]:
        return {r[0] for r in sqlite3.connect(path).execute("SELECT id FROM actions")}

    j = journal(keep=10)
    j.open()
    for i in range(30):
        j.accept(f"a{i}", "fp", "api", None, float(i))
        if i != 3:
            j.ended(outcome(f"a{i}"), float(i))
    j.commit()
    assert ids() == {f"a{i}" for i in range(30)}, "nothing expires before it is due"
    now[0] = 100.0  # a3 unfinished, in flight: kept
    j.accept("a30", "fp", "api", None, 100.0)
    j.commit()  # expiry is due (60 s since the last): the newest 10 and the unfinished one
    assert ids() == {"a3", *(f"a{i}" for i in range(21, 31))}
    j.close()  # a3 left unfinished: the next open marks it unknown, so it may expire
    now[0] = 1050.0
    j = journal(keep=100)
    assert j.open() == 2  # a3 and a30 had no outcome
    assert ids() == {"a30"}, "by age: accepted over 1000 s ago (a30 at 100 s is not)"
    j.close()


def test_a_failed_commit_is_raised_and_retried_and_its_acceptances_stay_logged(
    tmp_path: Path,
) -> None:
    j = Journal(tmp_path / "j.sqlite")
    j.open()
    assert j._writer is not None
    real = fail_commits(j._writer)
    j.accept("x", "fp", "api", None, time.time())
    j.write_ahead()
    with pytest.raises(sqlite3.OperationalError):
        j.commit()
    assert j.lookup("x") is not None, "in the writer's hand: still found"
    assert any("x" in p.read_text() for p in j.log_paths), "and still in its log"
    j._writer.db = real  # the disk recovers: the writer's retry commits it
    j.commit()
    assert j.lookup("x") is not None and len(j) == 1
    assert all(p.read_text() == "" for p in j.log_paths), "committed: the logs are emptied"
    j.close()


def test_a_logged_acceptance_survives_a_stop_before_its_commit(tmp_path: Path) -> None:
    """What ``write_ahead`` logged is on disk: a copy of the files taken then (a kill)
    opens with the id known and marked unknown; a torn last line is skipped."""
    path = tmp_path / "j.sqlite"
    j = Journal(path)
    j.open()
    j.accept("started", "fp", "api", None, time.time())
    j.write_ahead()
    with j.log_paths[0].open("a") as fh:
        fh.write('["torn", "fp", "api", nu')  # a write the kill cut short
    copy = snapshot(path, tmp_path / "after-kill")
    j.close()
    again = Journal(copy)
    assert again.open() == 1
    entry = again.lookup("started")
    assert entry is not None and entry.outcome is not None and entry.outcome.status == "unknown"
    assert again.lookup("torn") is None
    again.close()


def snapshot(path: Path, folder: Path) -> Path:
    """A copy of the journal's files as they are on disk now (what a kill -9 leaves)."""
    import shutil

    folder.mkdir()
    for f in path.parent.glob(path.name + "*"):
        if not f.name.endswith((".lock", "-shm")):
            shutil.copy(f, folder / f.name)
    return folder / path.name


# -- runtimes on one journal -------------------------------------------------------------------


def run_on(path: Path, body: Any, log: CallLog | None = None, **config: Any) -> Any:
    """``body(rt, log)`` on a runtime with the journal at ``path`` (API work)."""

    async def main() -> Any:
        from tangram.exec.runtime.api import echo

        calls = log or CallLog()
        endpoints = {"echo": echo, **faulty_endpoints(calls)}
        cfg = RuntimeConfig(journal_path=path, **config)
        async with Runtime(api_cluster(), cfg, api=ApiExecutor(endpoints)) as rt:
            return await body(rt, calls)

    return asyncio.run(main())


def test_a_restarted_runtime_answers_finished_ids_and_never_runs_them_again(
    tmp_path: Path,
) -> None:
    path = tmp_path / "j.sqlite"
    log = CallLog()

    async def first(rt: Runtime, log: CallLog) -> Outcome:
        return await rt.run(counted("k1", id="one"))

    before = run_on(path, first, log)
    assert before.ok and log.calls["k1"] == 1

    async def second(rt: Runtime, log: CallLog) -> Outcome:
        again = await rt.run(counted("k1", id="one"))  # the client's resend
        assert rt.state("one") == "done" and await rt.result("one") == again
        assert await rt.cancel("one") == again  # done: the outcome, unchanged
        with pytest.raises(Conflict, match="different action"):
            await rt.submit(counted("other", id="one"))
        with pytest.raises(UnknownAction, match="never accepted"):
            await rt.result("nobody")
        return again

    after = run_on(path, second, log)
    assert after == before, "the journaled outcome, as the first run gave it"
    assert log.calls["k1"] == 1, "never run a second time"


def test_actions_in_flight_when_a_runtime_stopped_are_unknown_after_it(tmp_path: Path) -> None:
    path = tmp_path / "j.sqlite"
    log = CallLog()

    copies: list[Path] = []

    async def crash(rt: Runtime, log: CallLog) -> None:
        await rt.submit(counted("slow", s=30.0, id="in-flight"))
        for _ in range(200):  # bounded: until the slow call runs
            if log.calls["slow"]:
                break
            await asyncio.sleep(0.01)
        copies.append(snapshot(path, tmp_path / "killed-at-once"))  # only in the log
        assert rt.journal is not None
        rt.journal.commit()
        copies.append(snapshot(path, tmp_path / "killed-later"))  # in SQLite, no outcome

    run_on(path, crash, log, close_grace_s=0.0)
    assert log.calls["slow"] == 1

    async def restarted(rt: Runtime, log: CallLog) -> list[Outcome]:
        assert rt.counters["outcome_unknown"] == 1
        out = await rt.run(counted("slow", s=30.0, id="in-flight"))
        return [out, await rt.result("in-flight")]  # type: ignore[list-item]

    for copy in copies:
        outs = run_on(copy, restarted, log)
        assert [o.status for o in outs] == ["unknown", "unknown"]
        assert outs[0].error is not None and "will not run again" in outs[0].error.message
    assert log.calls["slow"] == 1


def test_the_journal_is_written_before_an_action_starts(tmp_path: Path) -> None:
    """Write-ahead: when the endpoint runs, a copy of the journal's files taken then (what a
    kill at that moment would leave) knows the id."""
    path = tmp_path / "j.sqlite"
    known: list[bool] = []

    async def body(rt: Runtime, log: CallLog) -> None:
        async def probe(payload: Any) -> Any:
            copy = snapshot(path, tmp_path / f"at-{payload}")
            j = Journal(copy)
            j.open()
            known.append(j.lookup(payload) is not None)
            j.close()
            return payload

        rt.api.register("echo", probe)
        outs = await asyncio.gather(
            *(rt.run(ActionSpec(ApiWork("echo", f"w{i}"), id=f"w{i}")) for i in range(10))
        )
        assert all(o.ok for o in outs)

    run_on(path, body)
    assert known == [True] * 10


def test_an_action_that_cannot_be_journaled_does_not_run(tmp_path: Path) -> None:
    path = tmp_path / "j.sqlite"

    async def body(rt: Runtime, log: CallLog) -> Outcome:
        good = rt.host.before_start

        def broken() -> None:
            raise OSError(28, "No space left on device")

        rt.host.before_start = broken  # (the journal's write_ahead, on a full disk)
        out = await rt.run(counted("never", id="no-disk"))
        rt.host.before_start = good
        return out

    log = CallLog()
    out = run_on(path, body, log)
    assert out.status == "error" and out.error is not None
    assert out.error.code == "journal_failed" and out.error.retryable
    assert log.calls["never"] == 0
    # It never started: no start time nor units (they said it ran, so the OpenAI-style
    # routes told clients not to retry a call that never ran).
    assert out.start_s is None and out.units is None, out


def test_a_value_that_cannot_be_encoded_costs_only_its_own_value(tmp_path: Path) -> None:
    """An endpoint's value that JSON encoding fails on with other than a TypeError or
    ValueError (nested 5,000 deep: a RecursionError, in the value and in its repr too) was
    re-encoded at every later flush and raised each time: nothing was committed after it,
    any other action's outcome included, and the runtime's close raised out of its persist
    step before the journal was closed or the trace written. Its outcome is kept without
    its value, as one JSON cannot hold."""
    path = tmp_path / "j.sqlite"

    async def body(rt: Runtime, log: CallLog) -> list[Outcome]:
        async def deep(payload: Any) -> Any:
            value: list[Any] = []
            for _ in range(5000):
                value = [value]
            return value

        rt.api.register("counted", deep)
        outs = [await rt.run(counted("deep", id="deep"))]
        outs.append(await rt.run(ActionSpec(ApiWork("echo", "x"), id="other")))
        assert rt.journal is not None
        rt.journal.commit()
        return outs

    outs = run_on(path, body)
    assert [o.status for o in outs] == ["result", "result"]
    # The client's own answer encodes too (its GET was a 500, RecursionError), saying why.
    answer = json.loads(json.dumps(outcome_doc(outs[0])))
    assert answer["status"] == "result" and "nested too deep" in answer["result"]

    async def restarted(rt: Runtime, log: CallLog) -> list[Outcome | None]:
        return [await rt.result("deep"), await rt.result("other")]

    deep, other = run_on(path, restarted)
    assert other is not None and other.value == "x" and other.status == "result"
    assert deep is not None and deep.status == "result" and deep.value == answer["result"]


@pytest.mark.parametrize(
    ("journal", "trace"),
    [
        ("x.jsonl", "x.jsonl"),
        ("x.parquet.partial.jsonl", "x.parquet"),
        ("j", "j.accepts.0"),
        ("sub/../x.jsonl", "x.jsonl"),
    ],
)
def test_the_journal_and_the_trace_cannot_share_a_file(
    tmp_path: Path, journal: str, trace: str
) -> None:
    """One path for both was accepted: the trace's header overwrote the journal's database
    and SQLite's checkpoints the trace's rows, silently while the service ran; after it,
    neither could be read back ('file is not a database'; 'line 2: not valid JSON')."""
    (tmp_path / "sub").mkdir()
    with pytest.raises(ValueError, match="would share the file"):
        RuntimeConfig(journal_path=tmp_path / journal, trace_path=tmp_path / trace)
    RuntimeConfig(journal_path=tmp_path / "x.journal", trace_path=tmp_path / "x.jsonl")


def test_a_journal_path_holding_another_file_is_refused_naming_it(tmp_path: Path) -> None:
    """A --journal naming a file that is not a journal (a text file, a trace) failed with
    sqlite3's bare 'file is not a database' traceback, naming neither the file nor the flag;
    the file is left as it was."""
    path = tmp_path / "notes.txt"
    path.write_text("hello\n" * 100)
    with pytest.raises(ValueError, match=r"notes\.txt.*not a journal.*--journal"):
        Journal(path).open()
    assert path.read_text() == "hello\n" * 100
    Journal(path.with_name("fresh.sqlite")).open()  # (the lock of the refused one is free)
    again = Journal(path)
    with pytest.raises(ValueError, match="not a journal"):
        again.open()


def test_a_journal_that_cannot_be_made_is_refused_naming_it(tmp_path: Path) -> None:
    """A journal path below a file raised FileExistsError, which tangram serve reported as
    'cannot listen on 127.0.0.1:0: File exists', blaming the address."""
    (tmp_path / "file").write_text("x")
    with pytest.raises(ValueError, match=r"journal .*file/j\.sqlite: cannot open it"):
        Journal(tmp_path / "file" / "j.sqlite").open()
