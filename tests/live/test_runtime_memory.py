"""Bounded memory (issue 16, defect 4) on API work (no Docker, no torch): outcomes kept for
polling expire by count and age and an expired id answers clearly; the trace is streamed to
disk as actions end (a valid trace file at every moment) instead of kept in memory; with a
journal, nothing per action stays in memory beyond the polling bound."""

from __future__ import annotations

import asyncio
import gc
import math
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest

from tangram.exec.runtime import (
    ActionSpec,
    ApiWork,
    CpuExecutor,
    CpuWork,
    Outcome,
    Runtime,
    RuntimeConfig,
    UnknownAction,
)
from tangram.exec.runtime.actions import ActionTable, LiveAction, Phase
from tangram.exec.runtime.outcomes import unknown_outcome
from tangram.exec.runtime.recorder import RecordedAction, TraceRecorder
from tangram.trace import load_trace
from tests.live.conftest import CallLog
from tests.live.test_runtime import api_cluster, counted, with_runtime


def echo(i: int, **kw: Any) -> ActionSpec:
    return ActionSpec(ApiWork("echo", {"i": i}), id=f"e{i}", **kw)


async def run_all(rt: Runtime, specs: list[ActionSpec], width: int = 16) -> list[Outcome]:
    """Run ``specs`` ``width`` at a time (bounded concurrency, like a pool of clients)."""
    outs: list[Outcome] = []
    for k in range(0, len(specs), width):
        outs += await asyncio.gather(*(rt.run(s) for s in specs[k : k + width]))
    return outs


def live(kind: type) -> int:
    gc.collect()
    return sum(1 for o in gc.get_objects() if type(o) is kind)


def test_polled_outcomes_expire_by_count_and_an_expired_id_answers_clearly() -> None:
    async def body(rt: Runtime, log: CallLog) -> None:
        await run_all(rt, [echo(i) for i in range(30)])
        await rt.run(echo(30))  # alone: the batch before it is out of the core by now
        assert len(rt.host.table) == 10
        assert (await rt.result("e29")).ok  # type: ignore[union-attr]
        with pytest.raises(UnknownAction, match="expired .*kept in memory for 3600 s, at most 10"):
            await rt.result("e0")
        with pytest.raises(UnknownAction, match="journal"):
            rt.state("e0")

    with_runtime(body, config=RuntimeConfig(keep_outcomes=10))


def test_polled_outcomes_expire_by_age() -> None:
    table = ActionTable(keep=100, keep_s=5.0)
    forgotten: list[str] = []

    def end(i: int, at: float) -> None:
        rec = SimpleNamespace(id=f"r{i}", phase=Phase.OUT, outcome=SimpleNamespace(end_s=at))
        table.add(rec)  # type: ignore[arg-type]  # (what the table reads of a record)
        table.retire(rec)  # type: ignore[arg-type]

    for i, at in enumerate([0.0, 1.0, 4.0, 6.5, 9.9]):
        end(i, at)
    assert sorted(r.id for r in table) == ["r3", "r4"], "ended within 5 s of the last"
    table.forget = forgotten.append
    end(5, 20.0)
    assert [r.id for r in table] == ["r5"] and forgotten == ["r3", "r4"]


def test_polled_outcomes_expire_by_age_on_an_idle_runtime() -> None:
    """Age expiry ran only when another action ended: a service idle after a burst kept its
    outcomes (up to ``keep_outcomes``, each with its output) past ``keep_outcomes_s`` for as
    long as it stayed idle, and answered polls for them. They go at their age, idle or not."""

    async def body(rt: Runtime, log: CallLog) -> None:
        await run_all(rt, [echo(i) for i in range(5)])
        assert len(rt.host.table) == 5
        for _ in range(100):  # bounded: 10 s for outcomes that are due after 0.2 s
            if len(rt.host.table) == 0:
                break
            await asyncio.sleep(0.1)
        assert len(rt.host.table) == 0, [r.id for r in rt.host.table]
        with pytest.raises(UnknownAction, match="expired"):
            await rt.result("e0")
        assert (await rt.run(echo(9))).ok  # (and the runtime goes on as before)

    with_runtime(body, config=RuntimeConfig(keep_outcomes_s=0.2))


def test_an_expired_outcome_is_answered_from_the_journal(tmp_path: Path) -> None:
    config = RuntimeConfig(keep_outcomes=5, journal_path=tmp_path / "j.sqlite")

    async def body(rt: Runtime, log: CallLog) -> None:
        outs = await run_all(rt, [echo(i) for i in range(20)])
        assert "e0" not in rt.host.table
        assert await rt.result("e0") == outs[0] and rt.state("e0") == "done"
        again = await rt.run(echo(0))  # a late resend: the same outcome, not a second run
        assert again == outs[0] and rt.counters["resubmitted"] == 1

    with_runtime(body, config=config)


def test_nothing_per_action_stays_in_memory_beyond_the_polling_bound(tmp_path: Path) -> None:
    """Before: every ended action stayed in the recorder (and every id in the core's set of
    ids) for the life of the process."""
    config = RuntimeConfig(
        keep_outcomes=50, journal_path=tmp_path / "j.sqlite", trace_path=tmp_path / "t.jsonl"
    )

    async def body(rt: Runtime, log: CallLog) -> None:
        before = {kind: live(kind) for kind in (RecordedAction, LiveAction, Outcome)}
        await run_all(rt, [echo(i) for i in range(1500)])
        await asyncio.sleep(0.05)  # the last iteration's rows
        assert rt.journal is not None
        rt.journal.commit()  # (what the writer has in hand is kept until it is on disk)
        grew = {kind: live(kind) - n for kind, n in before.items()}
        assert grew[RecordedAction] <= 0, "the recorder streamed its rows to disk"
        assert grew[LiveAction] <= 50 and grew[Outcome] <= 50
        assert len(rt.scheduler.admission.seen) <= 50, "the core forgets ids the table drops"
        assert len(rt.recorder) == 1500

    with_runtime(body, config=config)
    assert len(load_trace(tmp_path / "t.jsonl")) == 1500


def test_the_trace_file_is_a_valid_trace_while_the_run_goes_on(tmp_path: Path) -> None:
    path = tmp_path / "live.jsonl"
    config = RuntimeConfig(trace_path=path)

    async def body(rt: Runtime, log: CallLog) -> None:
        # one labelled trajectory whose calls overlap and end out of arrival order
        ended: list[str] = []
        rt.on_outcome.append(lambda o: ended.append(o.action_id))
        specs = [counted(f"k{i}", s=0.03 * (5 - i), trajectory="lab", id=f"c{i}") for i in range(5)]
        await asyncio.gather(*(rt.run(s) for s in specs))
        await asyncio.sleep(0.02)
        mid = load_trace(path)  # read while running: validated (contiguous positions...)
        assert len(mid) == 5 and mid.meta["policy"] == "tangram"
        by_pos = [r.action_id for r in mid.trajectories()[(0, "lab")]]
        assert by_pos == ended and ended != sorted(ended), "positions in the order they ended"
        await run_all(rt, [echo(i) for i in range(20)])
        copy = rt.write_trace(tmp_path / "copy.jsonl")
        assert len(load_trace(copy)) == 25 and len(rt.trace()) == 25
        rt.write_trace(path)  # the stream itself: rewritten in place, still appended to
        await rt.run(echo(99))

    with_runtime(body, config=config)
    final = load_trace(path)  # rewritten at shutdown with the final header
    assert len(final) == 26 and {r.obs_outcome for r in final.rows} == {"result"}


def test_a_parquet_trace_is_written_from_its_stream_which_is_then_removed(
    tmp_path: Path,
) -> None:
    path = tmp_path / "live.parquet"

    async def body(rt: Runtime, log: CallLog) -> None:
        await run_all(rt, [echo(i) for i in range(7)])
        await asyncio.sleep(0.02)
        assert len(load_trace(tmp_path / "live.parquet.partial.jsonl")) == 7

    with_runtime(body, config=RuntimeConfig(trace_path=path))
    assert len(load_trace(path)) == 7
    assert not (tmp_path / "live.parquet.partial.jsonl").exists()


def test_clear_trace_starts_the_stream_over(tmp_path: Path) -> None:
    path = tmp_path / "live.jsonl"

    async def body(rt: Runtime, log: CallLog) -> None:
        await run_all(rt, [echo(i) for i in range(5)])
        rt.clear_trace()
        await run_all(rt, [echo(i) for i in range(5, 8)])
        assert [r.action_id for r in rt.trace().rows] == ["e5", "e6", "e7"]

    with_runtime(body, config=RuntimeConfig(trace_path=path))


def test_unknown_outcomes_are_not_recorded(tmp_path: Path) -> None:
    """The trace format's outcomes are result, error and timeout; an unknown one belongs to
    a previous run, which this run's trace never saw arrive."""
    recorder = TraceRecorder(tmp_path / "t.jsonl")
    recorder.start({"source": "test"})
    lost = unknown_outcome("lost", "api", None, 0.0)
    recorder.add(RecordedAction(echo(0), "~lost", lost, 1, 0.0, 0.0, 1))
    recorder.flush()
    assert len(recorder) == 0 and recorder.skipped_unknown == 1
    assert len(load_trace(tmp_path / "t.jsonl")) == 0
    recorder.close()


def test_keep_bounds_are_checked() -> None:
    for bad in ({"keep_outcomes": 0}, {"keep_outcomes_s": 0.0}, {"journal_keep_s": -1.0}):
        with pytest.raises(ValueError, match=next(iter(bad))):
            RuntimeConfig(**bad)  # type: ignore[arg-type]
    assert RuntimeConfig().keep_outcomes_s < math.inf


def test_a_failed_append_keeps_its_rows_for_the_next_and_tears_nothing(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A stream append that failed part-way (a full disk: half the bytes written, then
    ENOSPC) lost its rows although the runtime's ``_persist`` promises they stay buffered for
    the next one; its positions were taken, and its torn bytes, not counted in the stream's
    size, glued to the next row: the file no longer loaded and a copy cut its last row."""
    import dataclasses
    import os

    from tangram.exec.runtime import recorder as recorder_module
    from tangram.exec.runtime.records import Outcome, Timings

    def ended(i: int) -> RecordedAction:
        t = float(i)
        out = Outcome(f"e{i}", "lab", "api", "result", None, None, Timings(0, 0, 0.1, 0.1), t, t, t)
        out = dataclasses.replace(out, end_s=t + 0.1, units=1)
        return RecordedAction(echo(i, trajectory="lab"), "lab", out, 1, 0.0, 0.0, i + 1)

    path = tmp_path / "t.jsonl"
    recorder = TraceRecorder(path)
    recorder.start({"source": "test"})
    recorder.add(ended(0))
    recorder.flush()
    full, real_write = [True], os.write

    def write(fd: int, data: Any) -> int:
        if full[0]:
            full[0] = False
            real_write(fd, bytes(data[: len(data) // 2]))
            raise OSError(28, "No space left on device")
        return real_write(fd, data)

    monkeypatch.setattr(recorder_module.os, "write", write)
    recorder.add(ended(1))
    with pytest.raises(OSError):
        recorder.flush()
    recorder.add(ended(2))
    recorder.flush()  # the disk has room again
    monkeypatch.undo()
    assert len(recorder) == 3
    rows = load_trace(path).trajectories()[(0, "lab")]
    assert [(r.action_id, r.position) for r in rows] == [("e0", 0), ("e1", 1), ("e2", 2)]
    copy = recorder.write(tmp_path / "copy.jsonl")
    assert [r.action_id for r in load_trace(copy).rows] == ["e0", "e1", "e2"]
    recorder.close()


def test_a_closed_run_code_container_leaves_nothing_in_the_recorder(tmp_path: Path) -> None:
    """The recorder kept each trajectory label's next position and last end for the life of
    the process, so every ``/run_code`` request (an ephemeral trajectory of a fresh id, never
    opened again) grew its memory: 1,000 requests, 1,000 entries. An ephemeral trajectory's
    entry goes once it is closed and its rows are written; its rows are as before."""
    from tests.live.test_service_ids import CLUSTER, NODE, FakeAoe

    path = tmp_path / "t.jsonl"

    async def main() -> int:
        config = RuntimeConfig(trace_path=path)
        async with Runtime(CLUSTER, config, cpu=CpuExecutor(FakeAoe(), NODE)) as rt:
            for i in range(50):
                traj = f"run-code-{i}"
                await rt.open_trajectory(traj, memory_gb=0.5, ephemeral=True)
                for _ in range(2):
                    await rt.run(ActionSpec(CpuWork("true"), trajectory=traj))
                await rt.close_trajectory(traj)
            await rt.open_trajectory("kept", memory_gb=0.5)
            await rt.run(ActionSpec(CpuWork("true"), trajectory="kept"))
            await asyncio.sleep(0.05)  # (the last rows' persist)
            return len(rt.recorder._trajs)

    assert asyncio.run(main()) == 1, "only the open, non-ephemeral trajectory's"
    trace = load_trace(path)
    assert len(trace) == 101
    positions = {key[1]: [r.position for r in rows] for key, rows in trace.trajectories().items()}
    assert positions["run-code-7"] == [0, 1] and positions["kept"] == [0]


def test_closed_trajectories_keep_a_bounded_window_in_the_recorder(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A closed (non-ephemeral) trajectory's entry stayed for the life of the process, so its
    positions go on if its id is reopened; verl's tool opens one trajectory per rollout, so
    the recorder grew with every rollout. The entries of the ``MAX_CLOSED_TRAJECTORIES``
    most recently closed stay; older ones go. An open one's entry never goes, and a
    trajectory reopened within the window goes on from its last position."""
    from tangram.exec.runtime import recorder as recorder_module
    from tests.live.test_service_ids import CLUSTER, NODE, FakeAoe

    monkeypatch.setattr(recorder_module, "MAX_CLOSED_TRAJECTORIES", 5, raising=False)
    path = tmp_path / "t.jsonl"

    async def main() -> int:
        config = RuntimeConfig(trace_path=path)
        async with Runtime(CLUSTER, config, cpu=CpuExecutor(FakeAoe(), NODE)) as rt:
            await rt.open_trajectory("kept", memory_gb=0.5)
            await rt.run(ActionSpec(CpuWork("true"), trajectory="kept"))
            for i in range(40):
                traj = f"rollout-{i}"
                await rt.open_trajectory(traj, memory_gb=0.5)
                await rt.run(ActionSpec(CpuWork("true"), trajectory=traj))
                await rt.close_trajectory(traj)
            await rt.open_trajectory("rollout-39", memory_gb=0.5)  # (within the window)
            await rt.run(ActionSpec(CpuWork("true"), trajectory="rollout-39"))
            await rt.run(ActionSpec(CpuWork("true"), trajectory="kept"))
            await asyncio.sleep(0.05)  # (the last rows' persist)
            return len(rt.recorder._trajs)

    assert asyncio.run(main()) <= 1 + 5, "the open one's and the window's"
    trace = load_trace(path)
    positions = {key[1]: [r.position for r in rows] for key, rows in trace.trajectories().items()}
    assert positions["kept"] == [0, 1] and positions["rollout-39"] == [0, 1]


def test_a_trace_stream_that_cannot_be_written_is_refused_naming_it(tmp_path: Path) -> None:
    """A Parquet trace's stream (``PATH.partial.jsonl``) that is a directory raised
    IsADirectoryError from the start, which tangram serve reported as 'cannot listen on
    HOST:PORT: Is a directory', blaming the address."""
    (tmp_path / "run.parquet.partial.jsonl").mkdir()
    config = RuntimeConfig(trace_path=tmp_path / "run.parquet")

    async def main() -> None:
        async with Runtime(api_cluster()):  # (one without a trace path starts)
            pass
        with pytest.raises(ValueError, match=r"run\.parquet\.partial\.jsonl: cannot write it"):
            await Runtime(api_cluster(), config).start()

    asyncio.run(main())
