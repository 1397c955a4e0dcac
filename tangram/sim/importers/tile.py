"""Combine imported traces, and tile their trajectories into an RL-step batch of N.

``merge`` joins the traces of several files into one (a trajectory name already taken by an
earlier file gets ``~K``, K = the file's index, so two runs of one task instance both stay;
where that name is taken too, by an earlier file or by a trajectory of the same file, it gets
``~K-2``, ``~K-3``... the first one free).

``tile`` builds one RL step of ``batch`` trajectories from the M imported ones:

- slot ``i`` (0..N-1) replays imported trajectory ``order[i % M]``, where ``order`` is a
  permutation of the M trajectories drawn from ``seed``: round-robin, so each imported
  trajectory appears floor(N/M) or ceil(N/M) times;
- each slot starts after its own offset, drawn uniformly from [0, ``max_offset_s``) with the
  same seed: added to the first action's ``gen_before_s`` (and to every ``arrival_s`` of an
  open-loop trace), so copies of one trajectory do not issue their actions at the same instants;
- the default ``max_offset_s`` is the mean cycle of an imported action (``gen_before_s`` +
  ``t1_s``): enough to interleave copies, small against a trajectory's length. 0 = lockstep;
- slot ``i`` is trajectory ``b<i:05d>-<source name>``, its actions ``...-a<position:03d>``, all
  in the RL step of the first imported row.

The same trace, batch, seed and ``max_offset_s`` give the same batch, row for row.
"""

from __future__ import annotations

import dataclasses
import json
import math
from collections.abc import Sequence
from typing import Any

import numpy as np

from tangram.sim.workloads.base import TRAJECTORIES_MAX
from tangram.trace import Trace, TraceRow
from tangram.trace.row import TIME_MAX_S


def _renamed(row: TraceRow, trajectory: str, **changes: Any) -> TraceRow:
    return dataclasses.replace(
        row, trajectory=trajectory, action_id=f"{trajectory}-a{row.position:03d}", **changes
    )


def merge(traces: Sequence[Trace], files: Sequence[str]) -> Trace:
    """One trace of every row of ``traces`` (one per file, in order); meta lists each file's."""
    if len(traces) == 1:
        return traces[0]
    taken: set[str] = set()
    rows: list[TraceRow] = []
    for k, trace in enumerate(traces):
        rename = _renames(list(dict.fromkeys(t for _, t in trace.trajectories())), taken, k)
        taken |= set(rename.values())
        rows += [
            r if rename[r.trajectory] == r.trajectory else _renamed(r, rename[r.trajectory])
            for r in trace.rows
        ]
    first = traces[0].meta
    meta = {
        "source": first.get("source"),
        "importer": first.get("importer"),
        "files": list(files),
        "per_file": [t.meta for t in traces],
    }
    return Trace(tuple(rows), json.loads(json.dumps(meta)))


def _renames(names: list[str], taken: set[str], k: int) -> dict[str, str]:
    """File ``k``'s trajectory names -> their merged names: a name an earlier file took gets
    ``~k`` (or ``~k-2``, ``~k-3``... where that is taken too), never one that an earlier file
    or another trajectory of this file has."""
    used = taken | set(names)
    out: dict[str, str] = {}
    for name in names:
        if name not in taken:
            out[name] = name
            continue
        new, j = f"{name}~{k}", 2
        while new in used:
            new, j = f"{name}~{k}-{j}", j + 1
        used.add(new)
        out[name] = new
    return out


def mean_cycle_s(trace: Trace) -> float:
    """Mean of ``gen_before_s + t1_s`` over the trace's actions: the default offset range."""
    if not trace.rows:
        return 0.0
    return float(np.mean([r.gen_before_s + r.t1_s for r in trace.rows]))


def check_max_offset_s(max_offset_s: float) -> None:
    """``max_offset_s`` in [0, the trace format's longest time]: an offset is added to a
    trajectory's first generation, and an infinite range cannot be drawn from."""
    if not (math.isfinite(max_offset_s) and 0 <= max_offset_s <= TIME_MAX_S):
        raise ValueError(
            f"--max-offset-s must be seconds in [0, {TIME_MAX_S:g}] (the trace format's "
            f"longest time), got {max_offset_s}"
        )


def tile(trace: Trace, batch: int, seed: int, max_offset_s: float | None = None) -> Trace:
    """One RL step of ``batch`` trajectories drawn round-robin from ``trace`` (module docstring)."""
    if batch < 1:
        raise ValueError(f"--batch must be >= 1, got {batch}")
    if batch > TRAJECTORIES_MAX:  # as a generated workload's: 10**8 ran for hours, silently
        raise ValueError(f"--batch must be at most {TRAJECTORIES_MAX:,} trajectories, got {batch}")
    if max_offset_s is None:
        max_offset_s = mean_cycle_s(trace)
    check_max_offset_s(max_offset_s)
    sources = list(trace.trajectories().items())
    if not sources:
        raise ValueError("the imported trace has no trajectory to tile")
    rng = np.random.default_rng(seed)
    order = rng.permutation(len(sources))
    offsets = np.round(rng.uniform(0.0, max_offset_s, size=batch), 6)
    step = trace.rows[0].step
    rows: list[TraceRow] = []
    slots = []
    for i in range(batch):
        (_, name), source = sources[int(order[i % len(sources)])]
        new = f"b{i:05d}-{name}"
        offset = float(offsets[i])
        slots.append(name)
        for row in source:
            changes: dict[str, Any] = {"step": step}
            if row.position == 0:
                changes["gen_before_s"] = round(row.gen_before_s + offset, 6)
            if row.arrival_s is not None:
                changes["arrival_s"] = round(row.arrival_s + offset, 6)
            rows.append(_renamed(row, new, **changes))
    meta = dict(trace.meta)
    meta["tiling"] = {
        "batch": batch,
        "seed": seed,
        "max_offset_s": max_offset_s,
        "rule": "slot i replays imported trajectory order[i % M] (order: a seeded permutation) "
        "after a seeded offset uniform in [0, max_offset_s)",
        "imported_trajectories": len(sources),
        "slots": slots,
    }
    return Trace(tuple(rows), json.loads(json.dumps(meta)))
