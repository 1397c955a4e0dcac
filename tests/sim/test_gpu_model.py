"""The simulator's GPU call model: dispatch overhead, restore and host load, by hand."""

from __future__ import annotations

import pytest

from tangram.core import ClusterSpec, CpuNodeSpec
from tangram.core.resources import GpuNodeSpec
from tangram.sim.config import Overheads, RolloutConfig, SimConfig
from tangram.sim.driver import simulate
from tangram.sim.metrics import actions_frame
from tangram.trace import Trace, TraceRow
from tangram.trace.gpu_calibration import CallOverhead, CallTime, GpuCalibration

#: 2 cores and 2 GPUs (1 GB/s host-to-GPU, 0.5 s fixed: the core's restore estimate).
CLUSTER = ClusterSpec(
    "box",
    cpu_nodes=(CpuNodeSpec("vm", 2, 1, 64.0),),
    gpu_nodes=(GpuNodeSpec("gpu-0", 2, 16.0, 64.0, h2d_gbps=1.0, restore_fixed_s=0.5),),
)


def row(action_id: str, resource: str, arrival: float, **kw) -> TraceRow:
    base = dict(
        action_id=action_id,
        trajectory=action_id,
        step=0,
        position=0,
        task="t",
        kind="k",
        gen_before_s=0.0,
        resource=resource,
        t1_s=1.0,
        max_units=1,
        arrival_s=arrival,
    )
    if resource == "gpu":
        base.update(service="judge", service_size_gb=2.0, service_replicas=True)
    return TraceRow(**{**base, **kw})


#: A CPU action holding both cores over [0, 10); a GPU call at 1 s (cold: restores) and one
#: at 5 s (resident: no restore), both while the cores are held; one at 20 s on an idle host.
TRACE = Trace(
    (
        row("cpu", "cpu", 0.0, t1_s=20.0, max_units=2, serial_fraction=0.0),
        row("g1", "gpu", 1.0),
        row("g2", "gpu", 5.0),
        row("g3", "gpu", 20.0),
    )
)

RECORD = GpuCalibration(
    service="judge",
    backend="cpu",
    call_overhead_s=0.01,
    restore_gbps=4.0,
    restore_fixed_s=0.1,
    host_cores=2,
    call_times=(CallTime(1, 0.0, 0.2), CallTime(1, 2.0, 0.3)),  # 1.5x with both cores busy
    host_cpu_node="vm",
    gpu_node="gpu-0",
)


def acts(**config) -> dict[str, tuple[float, float]]:
    """action id -> (overhead, execution) simulated."""
    cfg = SimConfig(
        policy="tangram",
        rollout=RolloutConfig(mode="open"),
        warm_gpus=False,
        overheads=Overheads(aoe_grant_s=0.0, container_start_s=0.0),
        **config,
    )
    frame = actions_frame(simulate(TRACE, CLUSTER, cfg)).set_index("action_id")
    return {i: (frame.at[i, "overhead_s"], frame.at[i, "exec_s"]) for i in frame.index}


def test_without_a_calibration_a_call_costs_its_curve_plus_the_cores_restore_estimate() -> None:
    out = acts()
    assert out["g1"] == pytest.approx((2.0 / 1.0 + 0.5, 1.0))  # cluster file: 1 GB/s + 0.5 s
    assert out["g2"] == (0.0, 1.0) and out["g3"] == (0.0, 1.0)


def test_a_record_prices_its_services_dispatch_restore_and_host_load() -> None:
    out = acts(gpu_calibrations=(RECORD,))
    assert out["g1"] == pytest.approx((2.0 / 4.0 + 0.1 + 0.01, 1.0 * 1.5))  # both cores held
    assert out["g2"] == pytest.approx((0.01, 1.5))
    assert out["g3"] == pytest.approx((0.01, 1.0))  # the host idle again at 20 s
    assert out["cpu"] == (0.0, 10.0)  # CPU work is not the record's


def test_a_record_for_another_service_changes_nothing() -> None:
    other = GpuCalibration(**{**RECORD.__dict__, "service": "teacher"})
    assert acts(gpu_calibrations=(other,)) == acts()


def test_overheads_alone_add_a_dispatch_cost_and_replace_the_restore_figures() -> None:
    ov = Overheads(aoe_grant_s=0.0, container_start_s=0.0, gpu_call_s=0.02, gpu_h2d_gbps=8.0)
    cfg = SimConfig(
        policy="tangram", rollout=RolloutConfig(mode="open"), warm_gpus=False, overheads=ov
    )
    frame = actions_frame(simulate(TRACE, CLUSTER, cfg)).set_index("action_id")
    # 2 GB at 8 GB/s, the cluster file's fixed 0.5 s, plus the dispatch; no host-load model.
    assert frame.at["g1", "overhead_s"] == pytest.approx(0.25 + 0.5 + 0.02)
    assert frame.at["g2", "overhead_s"] == pytest.approx(0.02)
    assert frame.at["g2", "exec_s"] == 1.0


def test_a_record_naming_nodes_the_cluster_lacks_is_refused() -> None:
    stray = GpuCalibration(**{**RECORD.__dict__, "host_cpu_node": "elsewhere"})
    with pytest.raises(ValueError, match="names GPU node 'gpu-0' sharing the cores of CPU node"):
        acts(gpu_calibrations=(stray,))


@pytest.mark.parametrize(
    ("field", "value", "message"),
    [
        ("gpu_call_s", -0.1, "overheads.gpu_call_s must be a number >= 0"),
        ("gpu_h2d_gbps", 0.0, "overheads.gpu_h2d_gbps must be None or a number > 0"),
        ("gpu_restore_fixed_s", -1.0, "overheads.gpu_restore_fixed_s must be None or"),
    ],
)
def test_bad_gpu_overheads_are_refused_naming_the_field(field, value, message) -> None:
    with pytest.raises(ValueError, match=message):
        Overheads(**{field: value})


def test_two_records_for_one_service_are_refused() -> None:
    with pytest.raises(ValueError, match="one record per service"):
        SimConfig(gpu_calibrations=(RECORD, RECORD))


def test_a_cpu_backed_record_counts_the_nodes_other_calls_as_busy_host_cores() -> None:
    """Two calls overlap on an idle host: the second starts with the first's GPU busy."""
    small = dict(service_size_gb=0.001)  # restored in no time: b takes the other GPU
    trace = Trace(
        (
            row("a", "gpu", 0.0, **small),
            row("b", "gpu", 0.5, **small),
            row("c", "gpu", 5.0, **small),  # one service, one size
        )
    )
    points = (CallTime(1, 0.0, 0.2), CallTime(1, 1.0, 0.3))  # 1.5x with one core busy
    cfg = dict(
        policy="tangram",
        rollout=RolloutConfig(mode="open"),
        warm_gpus=True,
        overheads=Overheads(aoe_grant_s=0.0, container_start_s=0.0),
    )

    def execs(per_gpu: float) -> dict[str, float]:
        """action id -> simulated execution time (after checking the calls overlapped)."""
        rec = GpuCalibration(**{**RECORD.__dict__, "call_times": points})
        rec = GpuCalibration(**{**rec.__dict__, "host_cores_per_gpu": per_gpu})
        frame = actions_frame(
            simulate(trace, CLUSTER, SimConfig(**cfg, gpu_calibrations=(rec,)))
        ).set_index("action_id")
        assert frame.at["b", "start"] == 0.5 and frame.at["b", "node"] == "gpu-0"
        return {i: frame.at[i, "exec_s"] for i in frame.index}

    assert execs(0.0) == pytest.approx({"a": 1.0, "b": 1.0, "c": 1.0})
    # b starts while a holds the other GPU: one host core busy; a and c started alone.
    assert execs(1.0) == pytest.approx({"a": 1.0, "b": 1.5, "c": 1.0})


def test_a_record_with_overheads_per_level_charges_the_one_for_the_load_at_the_start() -> None:
    overheads = (CallOverhead(2.0, 0.05),)  # 0.01 idle (call_overhead_s), 0.05 both busy
    out = acts(
        gpu_calibrations=(GpuCalibration(**{**RECORD.__dict__, "call_overheads": overheads}),)
    )
    assert out["g1"][0] == pytest.approx(2.0 / 4.0 + 0.1 + 0.05)  # restore + loaded dispatch
    assert out["g2"][0] == pytest.approx(0.05)
    assert out["g3"][0] == pytest.approx(0.01)  # the host idle again at 20 s
