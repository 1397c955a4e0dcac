"""A trace row for tests: a valid CPU row whose fields a test overrides by keyword."""

from __future__ import annotations

from tangram.trace import TraceRow

BASE = dict(
    action_id="a0",
    trajectory="t0",
    step=0,
    position=0,
    task="coding",
    kind="env",
    gen_before_s=1.5,
    resource="cpu",
    t1_s=2.0,
    max_units=16,
)


def row(**kw) -> TraceRow:
    return TraceRow(**{**BASE, **kw})
