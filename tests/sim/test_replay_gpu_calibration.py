"""``tangram replay --gpu-calibration``: a measured GPU call model prices a replay's calls."""

from __future__ import annotations

import dataclasses

import pytest

from tangram.core.cluster_file import parse_cluster
from tangram.sim.replay_cli import replay
from tangram.trace import Trace, TraceRow
from tangram.trace.files import write_trace
from tangram.trace.gpu_calibration import CallTime, GpuCalibration

#: The header's cluster: 2 cores and 2 GPUs.
CLUSTER = {
    "name": "box",
    "cpu_node": [{"name": "vm", "cores": 2, "numa_domains": 1, "memory_gb": 64.0}],
    "gpu_node": [{"name": "gpu-0", "gpus": 2, "gpu_memory_gb": 16.0, "host_memory_gb": 64.0}],
}
RECORD = GpuCalibration(
    service="judge",
    backend="cpu",
    call_overhead_s=0.01,
    restore_gbps=4.0,
    restore_fixed_s=0.0,
    host_cores=2,
    call_times=(CallTime(1, 0.0, 0.2), CallTime(1, 2.0, 0.4)),  # 2x with both cores busy
    host_cpu_node="vm",
    gpu_node="gpu-0",
)


def live_row(action_id: str, resource: str, arrival: float, exec_s: float, **kw) -> TraceRow:
    base = dict(
        action_id=action_id,
        trajectory=action_id,
        step=0,
        position=0,
        task="t",
        kind="k",
        gen_before_s=0.0,
        resource=resource,
        t1_s=exec_s,
        max_units=1,
        arrival_s=arrival,
        obs_arrival_s=arrival,
        obs_units=1,
        obs_queue_s=0.0,
        obs_overhead_s=0.0,
        obs_exec_s=exec_s,
        obs_outcome="result",
        obs_node="vm",
    )
    if resource == "gpu":
        base.update(service="judge", service_replicas=True, obs_node="gpu-0", t1_s=0.2)
    return TraceRow(**{**base, **kw})


@pytest.fixture
def trace_path(tmp_path):
    """Two 1-core CPU actions over [0, 10) and a GPU call at 1 s that took 0.4 s live (both
    cores busy), declared at its idle 0.2 s; GPUs resident from the start."""
    rows = (
        live_row("c1", "cpu", 0.0, 10.0),
        live_row("c2", "cpu", 0.0, 10.0),
        live_row("g", "gpu", 1.0, 0.4, obs_overhead_s=0.01),
    )
    meta = {
        "policy": "tangram",
        "cluster": CLUSTER,
        "gpu_residency_at_start": {"judge": [0, 1]},
    }
    return write_trace(Trace(rows, meta), tmp_path / "live.jsonl")


def test_the_header_cluster_is_this_tests_box() -> None:
    spec = parse_cluster(CLUSTER)
    assert [n.name for n in spec.cpu_nodes] == ["vm"] and spec.total_gpus == 2


def gpu_act(report) -> float:
    return report.by_resource["gpu"]["sim"]["p50"]


def test_declared_curves_with_the_record_predict_the_loaded_call(trace_path) -> None:
    without = replay(trace_path, durations="curve", exec_noise=0.0)
    with_record = replay(trace_path, durations="curve", exec_noise=0.0, gpu_calibrations=[RECORD])
    assert gpu_act(without) == pytest.approx(0.2 + 0.01)  # idle time + the folded dispatch
    assert gpu_act(with_record) == pytest.approx(0.4 + 0.01)  # 2x: both host cores held
    assert with_record.by_resource["gpu"]["error"]["p50"] == pytest.approx(0.0, abs=1e-9)


def test_observed_durations_already_hold_the_host_load(trace_path) -> None:
    report = replay(trace_path, durations="observed", gpu_calibrations=[RECORD])
    assert gpu_act(report) == pytest.approx(0.4 + 0.01)  # not slowed down twice


def test_the_spread_of_calibrated_calls_is_measured_around_the_records_prediction(
    trace_path,
) -> None:
    plain = replay(trace_path, durations="curve")
    calibrated = replay(trace_path, durations="curve", gpu_calibrations=[RECORD])
    # Live the call took 2x its declared time: off the curve, but just what the record says.
    assert plain.measured.exec_noise_sigma > 0.3
    assert calibrated.measured.exec_noise_sigma == pytest.approx(0.0, abs=1e-9)


def test_gpu_curve_replays_the_gpu_calls_declared_and_the_rest_as_observed(tmp_path) -> None:
    """The CPU actions declared 5 s but took 10 s live: from their curves a call at 7 s finds
    the host idle, from what they took it finds both cores busy, as it did live."""
    rows = (
        live_row("c1", "cpu", 0.0, 10.0, t1_s=5.0),
        live_row("c2", "cpu", 0.0, 10.0, t1_s=5.0),
        live_row("g", "gpu", 7.0, 0.4, obs_overhead_s=0.01),
    )
    meta = {"policy": "tangram", "cluster": CLUSTER, "gpu_residency_at_start": {"judge": [0, 1]}}
    path = write_trace(Trace(rows, meta), tmp_path / "live.jsonl")
    curve = replay(path, durations="curve", exec_noise=0.0, gpu_calibrations=[RECORD])
    gpu_only = replay(path, durations="gpu-curve", gpu_calibrations=[RECORD])
    assert gpu_act(curve) == pytest.approx(0.2 + 0.01)
    assert gpu_act(gpu_only) == pytest.approx(0.4 + 0.01)
    assert gpu_only.by_resource["cpu"]["sim"]["p50"] == pytest.approx(10.0)


def test_flags_that_would_change_nothing_are_refused(trace_path) -> None:
    """``--noise per-resource`` chooses between measured spreads, which only ``--durations
    curve`` draws from and ``--exec-noise`` replaces; a calibration for a service the trace
    never calls prices nothing. Both were accepted and ignored (stop 26's hunt)."""
    with pytest.raises(ValueError, match="--noise per-resource applies"):
        replay(trace_path, durations="observed", noise="per-resource")
    with pytest.raises(ValueError, match="--noise per-resource applies"):
        replay(trace_path, durations="curve", exec_noise=0.1, noise="per-resource")
    stray = dataclasses.replace(RECORD, service="not-in-the-trace")
    with pytest.raises(ValueError, match="not-in-the-trace"):
        replay(trace_path, durations="curve", gpu_calibrations=[stray])


@pytest.mark.parametrize("second", ["a.json", "b.json"])
def test_two_records_of_one_service_are_refused_naming_both_files(
    trace_path, tmp_path, capsys, second
) -> None:
    # "gpu_calibrations: one record per service, got ['judge', 'judge']": no flag, no file.
    from tangram.cli import main

    RECORD.write(tmp_path / "a.json")
    RECORD.write(tmp_path / "b.json")
    flags = ["--gpu-calibration", str(tmp_path / "a.json"), "--gpu-calibration"]
    assert main(["replay", str(trace_path), *flags, str(tmp_path / second)]) == 2
    err = capsys.readouterr().err
    assert f"--gpu-calibration {tmp_path / second}: a second record of service 'judge'" in err
    assert f"(--gpu-calibration {tmp_path / 'a.json'} has one)" in err
