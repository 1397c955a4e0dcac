"""The trace recorder's buffer while its stream cannot be appended to (a full disk): rows wait
for the next append, at most ``MAX_PENDING_ROWS`` of them; beyond, the oldest are dropped and
counted, so memory stays bounded and the stream stays a valid trace once the disk has room."""

from __future__ import annotations

import dataclasses
import os
from pathlib import Path
from typing import Any

import pytest

from tangram.exec.runtime import recorder as recorder_module
from tangram.exec.runtime.recorder import RecordedAction, TraceRecorder
from tangram.exec.runtime.records import ActionSpec, ApiWork, Outcome, Timings
from tangram.trace import load_trace


def ended(i: int) -> RecordedAction:
    t = float(i)
    out = Outcome(
        f"e{i}", "lab", "api", "result", "x" * 100, None, Timings(0, 0, 0.1, 0.1), t, t, t
    )
    out = dataclasses.replace(out, end_s=t + 0.1, units=1)
    spec = ActionSpec(ApiWork("echo", i), id=f"e{i}", trajectory="lab")
    return RecordedAction(spec, "lab", out, 1, 0.0, 0.0, i + 1)


def test_rows_wait_for_a_full_disk_in_a_bounded_buffer(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Every row of a failed append stayed buffered for the next, with its action's outcome
    (its output too): a disk full for hours held every action that ended meanwhile, the
    service's memory growing without bound. The buffer keeps the newest
    ``MAX_PENDING_ROWS``; the older are dropped, counted and logged."""
    monkeypatch.setattr(recorder_module, "MAX_PENDING_ROWS", 50)
    path = tmp_path / "t.jsonl"
    recorder = TraceRecorder(path)
    recorder.start({"source": "test"})
    recorder.add(ended(0))
    recorder.flush()
    real_write = os.write

    def full(fd: int, data: Any) -> int:
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(recorder_module.os, "write", full)
    for i in range(1, 201):  # bounded: 200 actions end while the disk is full
        recorder.add(ended(i))
        with pytest.raises(OSError):
            recorder.flush()
    assert len(recorder._pending) <= 50, len(recorder._pending)
    assert recorder.dropped == 150
    monkeypatch.setattr(recorder_module.os, "write", real_write)
    recorder.flush()  # the disk has room again
    rows = load_trace(path).trajectories()[(0, "lab")]
    ids = [r.action_id for r in rows]
    assert ids == ["e0", *(f"e{i}" for i in range(151, 201))], ids[:5]
    assert [r.position for r in rows] == list(range(51)), "positions stay contiguous"
    assert len(recorder) == 51
    recorder.close()


def test_the_bound_is_never_reached_while_the_stream_takes_rows(tmp_path: Path) -> None:
    recorder = TraceRecorder(tmp_path / "t.jsonl")
    recorder.start({"source": "test"})
    for i in range(100):
        recorder.add(ended(i))
    recorder.flush()
    assert recorder.dropped == 0 and len(load_trace(tmp_path / "t.jsonl")) == 100
    recorder.close()
