"""Conversions at the trace's borders: a row into the core's action, a live observation into
a row (and through a file and back)."""

from __future__ import annotations

import dataclasses

import pytest

from tangram.core.action import Action
from tangram.core.resources import ResourceKind
from tangram.trace import (
    LiveObservation,
    Trace,
    TraceRow,
    load_trace,
    row_from_observation,
    row_to_action,
    write_trace,
)
from tests.trace.rows import row as base_row


def row(**kw) -> TraceRow:
    return base_row(**{"gen_before_s": 0.5, **kw})


#: One row of every resource kind and every way of giving elasticity.
ROWS = {
    "cpu-amdahl": row(serial_fraction=0.25, memory_gb=3.5),
    "cpu-tabulated": row(curve={"kind": "tabulated", "points": [[1, 2.0], [2, 1.2], [4, 0.9]]}),
    "cpu-curve-amdahl": row(curve={"kind": "amdahl", "t1": 2.0, "serial_fraction": 0.5}),
    "cpu-inelastic": row(max_units=1),
    "gpu": row(
        resource="gpu",
        kind="reward",
        max_units=4,
        serial_fraction=0.1,
        service="rm-7b",
        service_size_gb=14.0,
        memory_gb=2.0,  # a GPU action carries no container memory
    ),
    "gpu-replicas": row(
        resource="gpu", max_units=2, service="rm-1b", service_size_gb=2.0, service_replicas=True
    ),
    "cpu-malleable": row(serial_fraction=0.1, malleable=True),
    "api": row(resource="api", kind="search", max_units=1, service="search", memory_gb=1.0),
    "api-curve": row(
        resource="api", max_units=1, service="s", curve={"kind": "inelastic", "t1": 2.0}
    ),
}


def driver_action(row: TraceRow, traj: str, now: float) -> Action:
    """What ``Simulation._submit`` built before the conversion moved to the trace package."""
    resource = {kind.value: kind for kind in ResourceKind}[row.resource]
    return Action.prevalidated(
        row.action_id,
        traj,
        resource,
        row.curve_object(),
        now,
        row.max_units,
        row.task,
        row.kind,
        row.memory_gb if resource is ResourceKind.CPU else 0.0,
        row.service,
        row.service_size_gb,
        row.malleable,
        row.service_replicas,
    )


@pytest.mark.parametrize("name", sorted(ROWS))
def test_a_row_becomes_the_action_the_driver_built(name: str) -> None:
    r = ROWS[name]
    action = row_to_action(r, "step0/t0", 12.5)
    expected = driver_action(r, "step0/t0", 12.5)
    assert action == expected
    assert vars(action) == vars(expected)  # node and payload too
    assert type(action.resource) is ResourceKind and action.trajectory == "step0/t0"


@pytest.mark.parametrize("name", sorted(ROWS))
def test_the_unchecked_action_passes_the_actions_own_checks(name: str) -> None:
    # prevalidated skips Action.__post_init__; the row's checks must have covered it.
    action = row_to_action(ROWS[name], "t0", 3.0)
    fields = {f.name: getattr(action, f.name) for f in dataclasses.fields(Action)}
    assert Action(**fields) == action


def test_only_a_cpu_action_carries_memory() -> None:
    assert row_to_action(ROWS["cpu-amdahl"], "t", 0.0).memory_gb == 3.5
    assert row_to_action(ROWS["gpu"], "t", 0.0).memory_gb == 0.0
    assert row_to_action(ROWS["api"], "t", 0.0).memory_gb == 0.0


def observation(**kw) -> LiveObservation:
    base = dict(
        action_id="x1",
        trajectory="traj-0",
        task="live",
        kind="command",
        resource="cpu",
        t1_s=1.5,
        max_units=4,
        serial_fraction=0.2,
        curve=None,
        service=None,
        service_size_gb=0.0,
        memory_gb=2.0,
        outcome="result",
        arrival_s=10.1234567,
        queue_s=0.25,
        overhead_s=0.0123456789,
        exec_s=0.4,
        start_s=10.4,
        units=2,
        node="cpu-0",
    )
    return LiveObservation(**{**base, **kw})


def test_an_observation_becomes_an_open_loop_row_rounded_to_the_microsecond() -> None:
    r = row_from_observation(observation(), 3, 9.0)
    assert (r.step, r.position, r.trajectory) == (0, 3, "traj-0")
    assert r.arrival_s == r.obs_arrival_s == 10.123457
    assert r.gen_before_s == 1.123457  # from the previous end to this arrival
    assert (r.obs_units, r.obs_node, r.obs_outcome) == (2, "cpu-0", "result")
    assert (r.obs_queue_s, r.obs_overhead_s, r.obs_exec_s) == (0.25, 0.012346, 0.4)
    assert (r.serial_fraction, r.memory_gb, r.t1_s, r.max_units) == (0.2, 2.0, 1.5, 4)


def test_an_observation_with_nothing_before_it_or_negative_spans_gives_zeros() -> None:
    r = row_from_observation(observation(queue_s=-1e-9, exec_s=-0.1), 0, None)
    assert r.gen_before_s == 0.0 and r.obs_queue_s == 0.0 and r.obs_exec_s == 0.0
    early = row_from_observation(observation(), 1, 11.0)  # arrived before the previous end
    assert early.gen_before_s == 0.0


def test_an_action_that_never_started_has_no_units_nor_node() -> None:
    r = row_from_observation(observation(start_s=None, outcome="timeout"), 0, None)
    assert r.obs_units is None and r.obs_node is None and r.obs_outcome == "timeout"
    r = row_from_observation(observation(units=None, outcome="error"), 0, None)
    assert r.obs_units is None and r.obs_node is None


def test_an_api_row_is_inelastic_and_a_non_cpu_row_has_no_memory() -> None:
    api = row_from_observation(
        observation(
            resource="api",
            max_units=1,
            units=1,
            service="search",
            serial_fraction=None,
            curve={"kind": "inelastic", "t1": 1.5},
        ),
        0,
        None,
    )
    assert api.curve is None and api.serial_fraction is None and api.memory_gb == 0.0
    gpu = row_from_observation(
        observation(resource="gpu", service="rm", service_size_gb=1 / 3, serial_fraction=None),
        0,
        None,
    )
    assert gpu.memory_gb == 0.0 and gpu.service_size_gb == round(1 / 3, 9)


def test_an_observation_keeps_how_its_work_runs_malleable_cpu_and_replicated_gpu() -> None:
    assert row_from_observation(observation(malleable=True), 0, None).malleable
    gpu = row_from_observation(
        observation(
            resource="gpu", service="rm", service_size_gb=2.0, serial_fraction=None,
            service_replicas=True,
        ),
        0,
        None,
    )  # fmt: skip
    assert gpu.service_replicas and not gpu.malleable
    assert row_to_action(gpu, "t", 0.0).service_replicas


@pytest.mark.parametrize("suffix", [".jsonl", ".jsonl.gz", ".parquet"])
def test_observed_rows_round_trip_through_a_file(tmp_path, suffix: str) -> None:
    curve = {"kind": "tabulated", "points": [(1, 1.5), (2, 1.0)]}
    observations = [
        observation(),
        observation(action_id="x2", serial_fraction=None, curve=curve, arrival_s=11.0, units=1),
        observation(action_id="x3", start_s=None, units=None, outcome="timeout", arrival_s=12.0),
        observation(
            action_id="g1",
            trajectory="traj-1",
            resource="gpu",
            kind="reward",
            service="rm",
            service_size_gb=14.2,
            serial_fraction=None,
            node="gpu-0",
        ),
        observation(
            action_id="q1",
            trajectory="traj-2",
            resource="api",
            max_units=1,
            units=1,
            service="search",
            serial_fraction=None,
            outcome="error",
        ),
    ]
    positions = {"traj-0": 0, "traj-1": 0, "traj-2": 0}
    rows = []
    for obs in observations:
        rows.append(row_from_observation(obs, positions[obs.trajectory], None))
        positions[obs.trajectory] += 1
    trace = Trace(tuple(rows), {"policy": "tangram"})
    back = load_trace(write_trace(trace, tmp_path / f"live{suffix}"))
    assert back.rows == trace.rows and back.meta == trace.meta
    assert back.rows[1].curve == {"kind": "tabulated", "points": [[1, 1.5], [2, 1.0]]}
