"""Replay calibration: a recorded live trace into the simulator's input and parameters."""

from __future__ import annotations

import dataclasses
import math

import pytest

from tangram.trace import Trace, TraceRow
from tangram.trace.calibrate import (
    Measured,
    _rescaled,
    measure,
    percentiles,
    relative_error,
    replay_trace,
)


def live(action_id: str, trajectory: str, position: int, arrival: float, **kw) -> TraceRow:
    base = dict(
        action_id=action_id,
        trajectory=trajectory,
        step=0,
        position=position,
        task="live",
        kind="command",
        gen_before_s=0.0,
        resource="cpu",
        t1_s=2.0,
        max_units=4,
        serial_fraction=0.5,
        memory_gb=1.0,
        arrival_s=arrival,
        obs_arrival_s=arrival,
        obs_units=2,
        obs_queue_s=0.1,
        obs_overhead_s=0.02,
        obs_exec_s=1.2,
        obs_outcome="result",
        obs_node="cpu-0",
    )
    return TraceRow(**{**base, **kw})


@pytest.mark.parametrize(
    "elasticity",
    [
        {"serial_fraction": 0.5},
        {"serial_fraction": None, "curve": {"kind": "amdahl", "t1": 2.0, "serial_fraction": 0.2}},
        {"serial_fraction": None, "curve": {"kind": "tabulated", "points": [[1, 2.0], [2, 1.5]]}},
        # Points in any order are a valid row; the replay took the first as the one-unit time.
        {"serial_fraction": None, "curve": {"kind": "tabulated", "points": [[2, 1.5], [1, 2.0]]}},
        {"serial_fraction": None},
    ],
)
def test_a_rescaled_row_takes_the_target_time_on_its_granted_units(elasticity) -> None:
    r = live("a", "t", 0, 0.0, **elasticity)
    scaled = TraceRow(**{**dataclasses.asdict(r), **_rescaled(r, 0.9)})
    assert math.isclose(scaled.curve_object().duration(2), 0.9)


def test_the_replayed_trace_keeps_started_actions_renumbered_without_memory() -> None:
    rows = (
        live("a0", "t", 0, 0.0),
        live("a1", "t", 1, 2.0, obs_units=None, obs_node=None, obs_outcome="timeout"),
        live("a2", "t", 2, 3.0, obs_exec_s=0.6),
        live("g0", "u", 0, 1.0, resource="gpu", service="rm", serial_fraction=None, obs_units=1),
    )
    trace = Trace(rows, {"policy": "tangram"})
    measured = dataclasses.replace(measure(trace), gpu_call_overhead_s=0.05)
    out = replay_trace(trace, measured)
    assert [r.action_id for r in out.rows] == ["a0", "g0", "a2"]  # by arrival, a1 never ran
    assert [r.position for r in out.rows] == [0, 0, 1]
    assert all(r.memory_gb == 0.0 and r.gen_after_s == 0.0 for r in out.rows)
    assert math.isclose(out.rows[2].curve_object().duration(2), 0.6)
    assert math.isclose(out.rows[1].t1_s, 1.2 + 0.05)  # a GPU call's dispatch folded in
    declared = replay_trace(trace, measured, "curve")
    assert declared.rows[0].t1_s == 2.0 and math.isclose(declared.rows[1].t1_s, 2.05)


def test_a_trace_without_observations_is_not_replayed() -> None:
    generated = TraceRow("a", "t", 0, 0, "x", "env", 0.0, "cpu", 1.0, 1)
    with pytest.raises(ValueError, match="not a recorded live trace"):
        replay_trace(Trace((generated,)), measure(Trace((generated,))))
    with pytest.raises(ValueError, match="durations"):
        replay_trace(Trace((live("a", "t", 0, 0.0),)), measure(Trace(())), "guess")


def test_measured_overheads_come_from_the_rows_and_the_eoe_header() -> None:
    rows = (
        live("a", "t", 0, 0.0, obs_overhead_s=0.02),
        live("b", "t", 1, 1.0, obs_overhead_s=0.04),
        live(
            "q",
            "v",
            0,
            0.5,
            resource="api",
            service="s",
            max_units=1,
            serial_fraction=None,
            obs_units=1,
        ),
    )
    eoe = {"restores": 2, "restore_s": 0.5, "bytes_restored": 1 << 30, "evictions": 4}
    m = measure(Trace(rows, {"eoe": {**eoe, "evict_s": 0.2}}))
    assert isinstance(m, Measured)
    assert math.isclose(m.cpu_overhead_s, 0.03) and m.api_overhead_s == 0.02
    assert m.h2d_gbps == 2.0 and m.restore_fixed_s == 0.0 and math.isclose(m.eviction_s, 0.05)
    assert m.exec_noise_sigma > 0  # observed 1.2 s vs declared 1.5 s (cpu) and 2.0 s (api)


def test_percentiles_and_relative_error() -> None:
    p = percentiles([1.0, 2.0, 3.0, 4.0])
    assert p["p50"] == 2.5 and p["mean"] == 2.5 and set(p) == {"p50", "p90", "p95", "p99", "mean"}
    err = relative_error({"p50": 3.0, "mean": 1.0}, {"p50": 2.5, "mean": 0.0})
    assert math.isclose(err["p50"], 0.2) and math.isnan(err["mean"])


def test_the_spread_of_gpu_calls_and_of_the_other_actions_is_measured_apart() -> None:
    gpu = dict(resource="gpu", service="rm", serial_fraction=None, max_units=1, memory_gb=0.0)
    rows = (  # CPU work: declared 1.5 s on 2 units, observed 1.2 and 1.8 s; GPU calls wider
        live("a", "t", 0, 0.0, obs_exec_s=1.2),
        live("b", "t", 1, 1.0, obs_exec_s=1.8),
        live("g", "u", 0, 0.5, t1_s=1.0, obs_units=1, obs_exec_s=0.5, **gpu),
        live("h", "u", 1, 0.9, t1_s=1.0, obs_units=1, obs_exec_s=2.0, **gpu),
    )
    m = measure(Trace(rows, {}))
    assert math.isclose(m.other_exec_noise_sigma, abs(math.log(1.8 / 1.2)) / 2)
    assert math.isclose(m.gpu_exec_noise_sigma, abs(math.log(2.0 / 0.5)) / 2)
    assert m.other_exec_noise_sigma < m.exec_noise_sigma < m.gpu_exec_noise_sigma
    assert measure(Trace(rows[:3], {})).gpu_exec_noise_sigma is None  # one GPU call: no spread
