"""Admission while the journal cannot commit (its disk fails): the entries waiting for the
writer are bounded; past ``JOURNAL_BACKLOG_MAX`` a submission is refused with a retryable
``Overloaded`` naming the journal, and accepted again once the writer catches up. API work:
no Docker."""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

import pytest

from tangram.exec.runtime import ActionSpec, ApiWork, Overloaded, Runtime, RuntimeConfig
from tangram.exec.runtime import runtime as runtime_module
from tests.live.conftest import fail_commits
from tests.live.test_runtime_journal import run_on


def test_a_failing_journal_refuses_work_before_its_backlog_takes_the_memory(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """With the writer's commits failing, every accepted action's entry (its outcome, output
    included) stayed buffered, one more per action, for as long as the disk failed: the
    service's memory grew without bound while it went on accepting work it could not
    journal. Past the bound it refuses, retryable, and loses nothing."""
    monkeypatch.setattr(runtime_module, "JOURNAL_BACKLOG_MAX", 20)

    async def body(rt: Runtime, log: Any) -> tuple[int, int, int]:
        journal = rt.journal
        assert journal is not None and journal._writer is not None
        real = fail_commits(journal._writer)
        refused = 0
        for i in range(100):  # bounded: 100 submissions while the disk fails
            try:
                out = await rt.run(ActionSpec(ApiWork("echo", i), id=f"w{i}"))
                assert out.ok, out
            except Overloaded as exc:
                assert "journal" in str(exc) and "disk I/O error" in str(exc), exc
                assert exc.retryable
                refused += 1
            await asyncio.sleep(0.002)  # (the commits the runtime arms try and fail)
        most = journal.buffered
        journal._writer.db = real  # the disk recovers: the writer's retry commits it
        for _ in range(500):  # bounded: 5 s for the backlog to reach the disk
            if journal.buffered == 0 and not journal._writer.busy:
                break
            await asyncio.sleep(0.01)
        left = journal.buffered
        after = await rt.run(ActionSpec(ApiWork("echo", "again"), id="after"))
        assert after.ok, "accepted again once the backlog is on disk"
        return refused, most, left

    refused, most, left = run_on(tmp_path / "j.sqlite", body)
    assert refused >= 70, refused
    assert most <= 20 + 1, most
    assert left == 0


def test_the_bound_is_a_runtime_constant() -> None:
    assert RuntimeConfig().max_pending <= runtime_module.JOURNAL_BACKLOG_MAX
