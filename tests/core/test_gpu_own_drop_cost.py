"""``gpu_cost.own_drop`` counts a service's copies left from ``copy_widths``, once per pass,
not by scanning every GPU of the pool for each cell placement prices."""

from __future__ import annotations

import pytest

from tangram.core import ClusterSpec
from tangram.core.action import Action
from tangram.core.cells import aligned_cells, cell_sizes
from tangram.core.context import Context
from tangram.core.curves import Amdahl
from tangram.core.policies import gpu_cost, make_policy
from tangram.core.policies.gpu_cost import copy_widths, own_drop, place_charged, resident_copies
from tangram.core.resources import GpuNodeSpec, ResourceKind
from tangram.core.scheduler import Scheduler

NODES = tuple(
    GpuNodeSpec(f"n{i}", 8, 80.0, 500.0, h2d_gbps=20.0, restore_fixed_s=0.1) for i in range(4)
)


def _pool() -> tuple[Scheduler, Context]:
    """Four 8-GPU nodes; "m" (15 GB) as 2-GPU shards on n0-n2, 1-GPU copies on n3's GPUs 0-3
    and a 4-GPU copy on n3's 4-7; "x" (20 GB) on a few GPUs; "m"'s calls seen: 3 narrow (1-2
    GPUs) for each wide (8), ~3.3 GPUs kept busy."""
    sched = Scheduler(ClusterSpec("g", gpu_nodes=NODES), make_policy("tangram"))
    for i in range(3):
        for g in range(0, 8, 2):
            sched.report_residency(f"n{i}", (g, g + 1), "m", True, 15.0)
    for g in range(4):
        sched.report_residency("n3", (g,), "m", True, 15.0)
    sched.report_residency("n3", (4, 5, 6, 7), "m", True, 15.0)
    for name, g in (("n0", 3), ("n1", 0), ("n3", 6)):
        sched.report_residency(name, (g,), "x", True, 20.0)
    load = sched.policy.rules["gpu"].load
    load.reach["m"] = {1: 2, 2: 1, 8: 1}
    load.count["m"] = 4.0
    load.first_seen["m"] = 0.0
    load.work["m"] = 30.0
    return sched, Context(sched, 1.0)


def _wide() -> Action:
    return Action(
        "w", "t-w", ResourceKind.GPU, Amdahl(4.0, 0.5),
        service="m", service_size_gb=15.0, max_units=8,
    )  # fmt: skip


def test_own_drop_from_the_pass_widths_is_what_a_scan_gives() -> None:
    sched, ctx = _pool()
    load, action = sched.policy.rules["gpu"].load, _wide()
    charged = 0
    for name, node in ctx.state.gpu.items():
        for size in cell_sizes(node.spec.gpus):
            for cell in aligned_cells(node.spec.gpus, size):
                scanned = own_drop(ctx, name, cell, action, load)
                cached = own_drop(ctx, name, cell, action, load, lambda: copy_widths(ctx))
                assert cached == scanned, (name, cell)
                charged += scanned > 0
    assert charged >= 10  # (the cases above are priced, not all 0)


def test_placement_does_not_scan_the_pool_per_cell(monkeypatch: pytest.MonkeyPatch) -> None:
    """Priced for a 4-GPU call of "m", each free 4-GPU cell that drops a 2-GPU copy asked
    ``own_drop``, which scanned all 32 GPUs (``_shapes`` of each node) per cell: 4 x 6 cells
    with a dropped copy. Given the pass's widths, ``own_drop`` scans nothing."""
    sched, ctx = _pool()
    load, action = sched.policy.rules["gpu"].load, _wide()
    scans = 0
    shapes = gpu_cost._shapes

    def counted(node, service):  # type: ignore[no-untyped-def]
        nonlocal scans
        scans += 1
        return shapes(node, service)

    monkeypatch.setattr(gpu_cost, "_shapes", counted)
    asked = 0

    def widths() -> dict[str, list[int]]:
        nonlocal asked
        asked += 1
        return copy_widths(ctx)

    spot = place_charged(ctx, 4, action, load, resident_copies(ctx), widths=widths)
    assert spot is not None
    assert scans == 0 and asked > 0
    scans = 0
    assert place_charged(ctx, 4, action, load, resident_copies(ctx)) == spot
    assert scans >= 4 * 6  # (without: a scan of each node for each such cell)


def test_a_cell_its_one_gpu_copies_serve_drops_nothing() -> None:
    # n3's GPUs 0-3 each hold a 1-GPU copy of "m": a call on (0, 1) or (0, 1, 2, 3) runs on
    # them with no restore, so nothing is dropped and nothing is charged (the reviewer's
    # finding: ``displaced`` asks ``own_drop`` for a resident cell too).
    sched, ctx = _pool()
    load, action = sched.policy.rules["gpu"].load, _wide()
    assert ctx.state.gpu["n3"].is_resident("m", (0, 1, 2, 3))
    assert own_drop(ctx, "n3", (0, 1, 2, 3), action, load) == 0.0
    assert own_drop(ctx, "n3", (0, 1), action, load) == 0.0
    assert own_drop(ctx, "n3", (0, 1, 2, 3, 4, 5, 6, 7), action, load) > 0.0


def test_one_charge_per_width_dropped() -> None:
    # A restore of "m" over all of n0 drops its four 2-GPU shards, over (0-3) two: the calls
    # that lose them restore one back, charged once per width (as one evicted service is),
    # weighted by how busy the 2-GPU-or-narrower copies left are kept: 16 - 4 = 12 left
    # against 16 - 2 = 14, so 14/12 = 1.17x the half's charge (charged per copy dropped, it
    # was 4/2 x 14/12 = 2.33x).
    sched, ctx = _pool()
    load, action = sched.policy.rules["gpu"].load, _wide()
    whole = own_drop(ctx, "n0", tuple(range(8)), action, load)
    half = own_drop(ctx, "n0", (0, 1, 2, 3), action, load)
    assert half > 0.0
    assert whole == pytest.approx(half * 14 / 12)
