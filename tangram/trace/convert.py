"""Conversions at the trace's two borders: a row into the core's ``Action`` (what the simulator
submits for each replayed row) and a live observation into a row (what the live recorder
writes), so that neither driver restates the other's vocabulary.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from tangram.core.action import Action
from tangram.core.resources import ResourceKind
from tangram.trace.row import TraceRow

_RESOURCE_KINDS = {kind.value: kind for kind in ResourceKind}
_CPU = ResourceKind.CPU
_prevalidated = Action.prevalidated


def row_to_action(row: TraceRow, trajectory: str, arrival: float) -> Action:
    """The core's action for ``row``, in ``trajectory``, arriving at ``arrival`` (seconds).

    The one place that knows a row is already checked: building the row validated every field,
    so the action skips its own checks (``Action.prevalidated``); this runs once per simulated
    action. A CPU action carries the row's container memory, any other none.
    """
    resource = _RESOURCE_KINDS[row.resource]
    return _prevalidated(
        row.action_id,
        trajectory,
        resource,
        row.curve_object(),
        arrival,
        row.max_units,
        row.task,
        row.kind,
        row.memory_gb if resource is _CPU else 0.0,
        row.service,
        row.service_size_gb,
        row.malleable,
        row.service_replicas,
    )


@dataclass(frozen=True)
class LiveObservation:
    """One finished live action: what its client declared and what the runtime observed.

    Times are seconds on the runtime's clock. ``t1_s`` is the declared curve's time on one
    unit; ``serial_fraction`` and ``curve`` are as declared (an API row drops them: it is
    inelastic). ``start_s``, ``units`` and ``node`` are None for an action that never started;
    ``outcome`` is ``result``, ``error`` or ``timeout``.
    """

    action_id: str
    trajectory: str
    task: str
    kind: str
    resource: str
    t1_s: float
    max_units: int
    serial_fraction: float | None
    curve: Mapping[str, Any] | None
    service: str | None
    service_size_gb: float
    memory_gb: float
    outcome: str
    arrival_s: float
    queue_s: float
    overhead_s: float
    exec_s: float
    start_s: float | None = None
    units: int | None = None
    node: str | None = None
    #: As declared (CPU) / as the service runs (GPU): see ``TraceRow``.
    malleable: bool = False
    service_replicas: bool = False


def row_from_observation(obs: LiveObservation, position: int, prev_end_s: float | None) -> TraceRow:
    """The open-loop row (step 0, ``arrival_s`` = observed arrival) of an observed action.

    ``position`` is its place in its trajectory; ``prev_end_s`` when the trajectory's previous
    action ended (or the trajectory opened; None: unknown), whose gap to this arrival is the
    row's generation before it. Times are rounded to the microsecond, negative spans to 0.
    """
    ran = obs.start_s is not None and obs.units is not None
    api = obs.resource == "api"
    gen_before = 0.0 if prev_end_s is None else max(0.0, obs.arrival_s - prev_end_s)
    return TraceRow(
        action_id=obs.action_id,
        trajectory=obs.trajectory,
        step=0,
        position=position,
        task=obs.task,
        kind=obs.kind,
        gen_before_s=round(gen_before, 6),
        resource=obs.resource,
        t1_s=obs.t1_s,
        max_units=obs.max_units,
        serial_fraction=obs.serial_fraction if not api else None,
        curve=dict(obs.curve) if obs.curve is not None and not api else None,
        service=obs.service,
        service_size_gb=round(obs.service_size_gb, 9),
        memory_gb=obs.memory_gb if obs.resource == "cpu" else 0.0,
        arrival_s=round(obs.arrival_s, 6),
        obs_arrival_s=round(obs.arrival_s, 6),
        obs_units=obs.units if ran else None,
        obs_queue_s=round(max(0.0, obs.queue_s), 6),
        obs_overhead_s=round(max(0.0, obs.overhead_s), 6),
        obs_exec_s=round(max(0.0, obs.exec_s), 6),
        obs_outcome=obs.outcome,
        obs_node=obs.node if ran else None,
        malleable=obs.malleable and obs.resource == "cpu",
        service_replicas=obs.service_replicas and obs.resource == "gpu",
    )
