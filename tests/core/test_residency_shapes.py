"""A GPU copy serves the cell it was restored as: a layer-sharded copy holds 1/k of the model
on each of its k GPUs, so it serves neither a sub-cell nor a wider cell; whole copies (one per
GPU) serve any cell made of them. The core, the simulator's residency and the live reporters
(in-process EOE and Ray) all speak in copies (``cells.copies_on``)."""

from __future__ import annotations

from types import SimpleNamespace

import pytest
from hypothesis import given
from hypothesis import strategies as st

from tangram.core import ClusterSpec
from tangram.core.action import Action
from tangram.core.cells import aligned_cells, copies_on, is_aligned_cell
from tangram.core.curves import Amdahl
from tangram.core.policies import make_policy
from tangram.core.resources import GpuNodeSpec, ResourceKind
from tangram.core.scheduler import Scheduler
from tangram.exec.ray.executors import RayGpuExecutor
from tangram.exec.ray.fleet import Fleet
from tangram.exec.ray.nodes import ServiceEntry
from tangram.sim.config import SimConfig
from tangram.sim.driver import simulate
from tangram.sim.residency import ResidencyModel
from tangram.trace import Trace, TraceRow

NODE = GpuNodeSpec("g0", 4, 80.0, 500.0, h2d_gbps=20.0, restore_fixed_s=0.1)
CLUSTER = ClusterSpec("g", gpu_nodes=(NODE,))


def call(i: int, max_units: int, *, replicas: bool = False) -> Action:
    return Action(
        f"a{i}",
        f"t{i}",
        ResourceKind.GPU,
        Amdahl(1.0, 0.1),
        service="rm",
        service_size_gb=20.0,
        max_units=max_units,
        service_replicas=replicas,
    )


def test_a_sharded_copy_serves_its_own_cell_only():
    sched = Scheduler(CLUSTER, make_policy("tangram"))
    sched.report_residency("g0", (2, 3), "rm", True)
    node = sched.state.gpu["g0"]
    assert node.is_resident("rm", (2, 3))
    # GPU 2 holds half the model: a 1-GPU call there restores a whole copy.
    assert not node.is_resident("rm", (2,))
    assert not node.is_resident("rm", (0, 1, 2, 3))
    # One shard evicted: the copy is gone from its cell.
    sched.report_residency("g0", (3,), "rm", False)
    assert not node.is_resident("rm", (2, 3))


def test_whole_copies_serve_every_cell_made_of_them():
    sched = Scheduler(CLUSTER, make_policy("tangram"))
    for g in (0, 1):
        sched.report_residency("g0", (g,), "rm", True)
    node = sched.state.gpu["g0"]
    assert node.is_resident("rm", (0,)) and node.is_resident("rm", (0, 1))
    assert not node.is_resident("rm", (0, 1, 2, 3))


def test_a_one_gpu_call_on_a_sharded_copys_gpus_is_a_restore():
    sched = Scheduler(CLUSTER, make_policy("tangram"))
    # The sharded copy fills GPUs 0-1; GPUs 2-3 are taken, so the call must go to 0 or 1.
    sched.report_residency("g0", (0, 1), "rm", True)
    sched.state.gpu["g0"].take((2, 3), "other")
    [d] = sched.submit(call(0, 1), 0.0)
    assert d.gpus in ((0,), (1,)) and d.restore and d.est_overhead > 0


def test_a_call_that_claims_a_sharded_copy_is_priced_free_only_at_that_copys_size():
    """ "big" (120 GB, so 2 or 4 GPUs of 80 GB) has a sharded copy on GPUs 0-3 and another on
    4-5; "small" is warm on 6 and 7. Two big calls and four small ones arrive together: the
    first big call claims the free 4-GPU copy. Priced free at every resident size up to its
    claim, the round gave it 2 GPUs (the 2-GPU copy being the other big call's), it waited for
    the 4-GPU cell, and small calls restored over both big copies. It runs on its copy now."""
    node = GpuNodeSpec("g0", 8, 80.0, 500.0, h2d_gbps=20.0, restore_fixed_s=0.1)
    sched = Scheduler(ClusterSpec("g", gpu_nodes=(node,)), make_policy("tangram"))
    sched.report_residency("g0", (0, 1, 2, 3), "big", True)
    sched.report_residency("g0", (4, 5), "big", True)
    for g in (6, 7):
        sched.report_residency("g0", (g,), "small", True)

    def gpu_call(i: int, service: str, size_gb: float, max_units: int, t1: float) -> Action:
        curve = Amdahl(t1, 0.3 if service == "big" else 0.1)
        return Action(
            f"a{i}", f"t{i}", ResourceKind.GPU, curve,
            service=service, service_size_gb=size_gb, max_units=max_units,
        )  # fmt: skip

    calls = [gpu_call(i, "big", 120.0, 4, 1.0) for i in (0, 1)]
    calls += [gpu_call(i, "small", 20.0, 2, 0.3) for i in (2, 3, 4, 5)]
    started = {d.action.id: d for d in sched.submit_many(calls, 0.0) if getattr(d, "gpus", None)}
    assert "a0" in started, "the call that claimed the free 4-GPU copy did not start"
    assert started["a0"].gpus == (0, 1, 2, 3) and not started["a0"].restore
    assert not any(set(d.gpus) & {0, 1, 2, 3} for i, d in started.items() if i != "a0")


@given(st.lists(st.integers(0, 7), min_size=1, max_size=8), st.sampled_from([1, 2, 4, 8]))
def test_copies_on_cuts_reported_gpus_into_aligned_copies(gpus, shards):
    copies = copies_on(gpus, shards)
    covered = {g for copy in copies for g in copy}
    assert set(gpus) <= covered
    assert all(len(copy) == shards and is_aligned_cell(copy, 8) for copy in copies)
    assert len(set(copies)) == len(copies)
    # No copy without a reported GPU in it.
    assert all(set(copy) & set(gpus) for copy in copies)


def test_the_simulators_residency_holds_by_shape_and_counts_whole_replicas_in_full():
    events = []
    model = ResidencyModel(
        {"g": 80.0}, lambda node, cell, svc, res, size: events.append((cell, res))
    )
    model.restore("g", (0, 1), "sharded", 40.0)
    assert model.holds("g", (0, 1), "sharded") and not model.holds("g", (0,), "sharded")
    assert model.used_gb("g", 0) == pytest.approx(20.0)
    events.clear()
    model.restore("g", (2, 3), "whole", 40.0, replicas=True)
    assert events == [((2,), True), ((3,), True)]  # one copy per GPU
    assert model.used_gb("g", 2) == pytest.approx(40.0)  # each GPU holds the whole model
    assert model.holds("g", (2,), "whole") and model.holds("g", (2, 3), "whole")


def row(i: int, arrival: float, max_units: int) -> TraceRow:
    """A trajectory that generates for ``arrival`` seconds, then makes one call."""
    return TraceRow(
        action_id=f"a{i}",
        trajectory=f"t{i}",
        step=0,
        position=0,
        task="judge",
        kind="judge",
        gen_before_s=arrival,
        resource="gpu",
        t1_s=1.0,
        serial_fraction=0.1,
        max_units=max_units,
        service="rm",
        service_size_gb=20.0,
    )


def test_the_simulator_charges_the_restore_a_new_shape_needs():
    """Call 0 (up to 2 GPUs, alone) runs on 2 GPUs: its copy is sharded over them. Call 1, at
    t=10 and 1 GPU at most, needs a whole copy: restored (20 GB at 20 GB/s + 0.1 s = 1.1 s),
    not run free on half the model. Before, it ran with no restore."""
    trace = Trace((row(0, 0.0, 2), row(1, 10.0, 1)), {"workload": "shapes"})
    cluster = ClusterSpec("g", gpu_nodes=(GpuNodeSpec("g0", 2, 80.0, 500.0, 20.0, 0.1),))
    result = simulate(trace, cluster, SimConfig(policy="tangram", warm_gpus=False))
    first, second = sorted(result.actions, key=lambda a: a.arrival)
    assert first.units == 2 and first.restored
    assert second.units == 1 and second.restored
    assert second.overhead == pytest.approx(1.1, rel=0.05)


def test_the_ray_executor_reports_each_copy():
    got = []
    ray_gpu = RayGpuExecutor(
        Fleet(),
        ClusterSpec("g", gpu_nodes=(NODE,)),
        {
            "whole": ServiceEntry((1, 2), 5.0, replicas=True),
            "split": ServiceEntry((2,), 30.0, replicas=False, shards=2),
        },
    )
    ray_gpu.scheduler = SimpleNamespace(report_residency=lambda *a: got.append(a))
    ray_gpu.report("g0", {"whole": (0, 1), "split": (0, 1, 2, 3)})
    assert sorted(got) == sorted(
        [
            ("g0", (0,), "whole", True, 5.0),
            ("g0", (1,), "whole", True, 5.0),
            ("g0", (0, 1), "split", True, 30.0),
            ("g0", (2, 3), "split", True, 30.0),
        ]
    )


def test_aligned_cells_of_copies_on_a_full_node_are_its_cells():
    assert copies_on(range(8), 4) == aligned_cells(8, 4)


@pytest.mark.parametrize(
    ("shards", "told"),
    [(1, [(0,), (1,)]), (2, [(0, 1)])],
)
def test_the_live_runtime_tells_the_core_each_copy_eoe_restored(shards, told):
    """EOE reports the GPUs one call restored; whole replicas are a copy each."""
    from tangram.exec.runtime.runtime import Runtime

    got = []
    fake = SimpleNamespace(
        gpu=SimpleNamespace(
            node=SimpleNamespace(name="g0"),
            eoe=SimpleNamespace(info=lambda service: SimpleNamespace(shards=shards)),
            size_gb=lambda service: 12.0,
        ),
        _loop=SimpleNamespace(call_soon_threadsafe=lambda fn, *args: fn(*args)),
        scheduler=SimpleNamespace(report_residency=lambda *a: got.append(a)),
    )
    Runtime.residency_changed(fake, "rm", (0, 1), True)
    assert got == [("g0", copy, "rm", True, 12.0) for copy in told]  # with the model's size
    got.clear()
    Runtime.residency_changed(fake, "rm", (1,), False)  # an eviction names its GPUs as they are
    assert got == [("g0", (1,), "rm", False, None)]


def test_a_full_listing_names_only_the_copies_whose_every_shard_is_listed():
    """Ray's agents list every GPU holding a service; EOE evicts a shard at a time, so a
    sharded copy missing a shard is no copy (a restore's report names what it just restored,
    and the rest of the cell holds it: there a partial cell is the whole copy)."""
    assert copies_on((2,), 2) == ((2, 3),)
    assert copies_on((2,), 2, complete=True) == ()
    assert copies_on((0, 1, 2), 2, complete=True) == ((0, 1),)
    assert copies_on((0, 2), 1, complete=True) == ((0,), (2,))


def test_the_ray_executor_drops_a_sharded_copy_that_lost_a_shard():
    sched = Scheduler(CLUSTER, make_policy("tangram"))
    ray_gpu = RayGpuExecutor(
        Fleet(), CLUSTER, {"split": ServiceEntry((2,), 100.0, replicas=False, shards=2)}
    )
    ray_gpu.scheduler = sched
    ray_gpu.report("g0", {"split": (2, 3)})
    assert sched.state.gpu["g0"].is_resident("split", (2, 3))
    ray_gpu.report("g0", {"split": (2,)})  # EOE evicted the shard on GPU 3
    assert not sched.state.gpu["g0"].is_resident("split", (2, 3))


def test_a_whole_replica_is_charged_its_full_size_on_each_gpu():
    """A 60 GB service of whole replicas onto (0, 1) of 80 GB GPUs needs 60 GB on GPU 0, where
    a 50 GB service sits: the simulator evicts it, and the core's estimate says so."""
    from tangram.core.policies.gpu_cost import ServiceLoad, evicted_by

    cluster = ClusterSpec("g", gpu_nodes=(GpuNodeSpec("g0", 2, 80.0, 512.0),))
    sched = Scheduler(cluster, make_policy("tangram"))
    model = ResidencyModel({"g0": 80.0}, sched.report_residency)
    load = ServiceLoad()
    load.size_gb.update({"old": 50.0, "rep": 60.0})
    load.last_call["old"] = 0.0
    model.restore("g0", (0,), "old", 50.0, replicas=True)
    node = sched.state.gpu["g0"]
    assert evicted_by(node, (0, 1), "rep", 60.0, load, replicas=True) == {"old": 1}
    assert evicted_by(node, (0, 1), "rep", 60.0, load) == {}  # as 30 GB shards it fits
    assert model.restore("g0", (0, 1), "rep", 60.0, replicas=True) == 1
