"""A GPU calibration record: round trips, clear refusals, and what it predicts."""

from __future__ import annotations

import json
import math

import pytest
from hypothesis import given
from hypothesis import strategies as st

from tangram.trace import TraceRow
from tangram.trace.gpu_calibration import (
    CalibrationError,
    CallOverhead,
    CallTime,
    GpuCalibration,
    load_gpu_calibration,
)
from tangram.trace.host_load import (
    busy_at_start,
    busy_for,
    contention_points,
    overhead_points,
)


def record(**changes) -> GpuCalibration:
    base = dict(
        service="judge",
        backend="cpu",
        call_overhead_s=0.002,
        restore_gbps=4.0,
        restore_fixed_s=0.05,
        host_cores=2,
        call_times=(
            CallTime(1, 0.0, 0.040),
            CallTime(1, 2.0, 0.060),
            CallTime(2, 0.0, 0.030),
            CallTime(2, 1.0, 0.045),
        ),
        host_cpu_node="vm",
        gpu_node="gpu-0",
    )
    return GpuCalibration(**{**base, **changes})


def test_call_time_is_linear_between_points_flat_beyond_and_read_from_the_dop_below() -> None:
    r = record()
    assert r.call_s(1, 0) == 0.040
    assert math.isclose(r.call_s(1, 1.0), 0.050)  # half-way from 0.040 to 0.060
    assert r.call_s(1, 5.0) == 0.060
    assert math.isclose(r.slowdown(2, 0.5), 0.0375 / 0.030)
    assert r.call_s(4, 1.0) == r.call_s(2, 1.0)  # DoP 4 not measured: DoP 2's figures
    assert r.slowdown(1, 0) == 1.0


def test_restore_time_is_bytes_per_gpu_over_bandwidth_plus_the_fixed_part() -> None:
    r = record()
    assert math.isclose(r.restore_s(2.0), 2.0 / 4.0 + 0.05)
    assert math.isclose(r.restore_s(2.0, shards=2), 1.0 / 4.0 + 0.05)


@pytest.mark.parametrize("suffix", [".json", ".toml"])
def test_a_record_reads_back_equal_from_json_and_toml(tmp_path, suffix) -> None:
    r = record()
    path = r.write(tmp_path / "r.json")
    if suffix == ".toml":
        data = json.loads(path.read_text())
        lines = [f"{k} = {json.dumps(v)}" for k, v in data.items() if k != "call_times"]
        for p in data["call_times"]:
            lines += ["[[call_times]]", *(f"{k} = {json.dumps(v)}" for k, v in p.items())]
        path = tmp_path / "r.toml"
        path.write_text("\n".join(lines) + "\n")
    assert load_gpu_calibration(path) == r


@given(
    overhead=st.floats(0, 1),
    gbps=st.floats(1e-3, 1e3),
    fixed=st.floats(0, 1),
    times=st.dictionaries(
        st.tuples(st.sampled_from([1, 2, 4, 8]), st.integers(1, 16)),
        st.floats(1e-4, 10),
        max_size=8,
    ),
    idle=st.floats(1e-4, 10),
)
def test_every_valid_record_survives_its_dict_form(overhead, gbps, fixed, times, idle) -> None:
    points = [CallTime(d, 0.0, idle) for d in sorted({d for d, _ in times} | {1})]
    points += [CallTime(d, float(b), t) for (d, b), t in times.items()]
    r = record(
        call_overhead_s=overhead,
        restore_gbps=gbps,
        restore_fixed_s=fixed,
        call_times=tuple(points),
    )
    assert GpuCalibration.from_dict(json.loads(json.dumps(r.to_dict()))) == r


@pytest.mark.parametrize(
    ("change", "message"),
    [
        ({"restore_gbps": 0}, "restore_gbps must be a finite number > 0"),
        ({"call_overhead_s": -1.0}, "call_overhead_s must be a finite number >= 0"),
        ({"call_overhead_s": float("nan")}, "call_overhead_s must be a finite number"),
        ({"host_cores": 0}, "host_cores must be an integer >= 1"),
        ({"host_cores_per_gpu": -1.0}, "host_cores_per_gpu must be a finite number >= 0"),
        (
            {"call_overheads": (CallOverhead(1.0, 0.1), CallOverhead(1.0, 0.2))},
            "call_overheads: two points at the same busy_cores",
        ),
        ({"gpu_node": None}, "host_cpu_node and gpu_node must be given together"),
        ({"version": 9}, "version 9 is not supported"),
        ({"call_times": ()}, "call_times must hold at least one point"),
        ({"call_times": (CallTime(1, 1.0, 0.1),)}, "dop 1 has no point with busy_cores 0"),
        (
            {"call_times": (CallTime(1, 0.0, 0.1), CallTime(1, 0.0, 0.2))},
            "two points at dop 1, busy_cores 0.0",
        ),
    ],
)
def test_an_invalid_record_is_refused_naming_the_field(change, message) -> None:
    with pytest.raises(CalibrationError, match=message):
        record(**change)


@pytest.mark.parametrize(
    ("edit", "message"),
    [
        (lambda d: d.pop("restore_gbps"), r"r.json: missing field\(s\) \['restore_gbps'\]"),
        (lambda d: d.update(speed=1), r"unknown field\(s\) \['speed'\]"),
        (lambda d: d["call_times"][0].update(seconds=-1), r"call_times\[0\].*seconds must be"),
        (lambda d: d["call_times"][1].pop("dop"), r"call_times\[1\] must have exactly"),
        (lambda d: d.update(call_times=5), "call_times must be a list of tables"),
        (
            lambda d: d.update(call_overheads=[{"busy_cores": 1, "seconds": -1}]),
            r"call_overheads\[0\]: call_overheads: seconds must be a finite number >= 0",
        ),
        (lambda d: d.update(call_overheads=[{"busy": 1}]), r"call_overheads\[0\] must have"),
        # A number or a list reached the simulator's node lookup (a list: a TypeError).
        (lambda d: d.update(host_cpu_node=5), "r.json: host_cpu_node must be a non-empty node"),
        (lambda d: d.update(gpu_node=["g"]), "r.json: gpu_node must be a non-empty node name"),
        (lambda d: d.update(gpu_node=""), "r.json: gpu_node must be a non-empty node name"),
        # Times past a trace's longest swallowed every duration added to them.
        (lambda d: d.update(call_overhead_s=1e300), r"call_overhead_s must be <= 1e\+09 seconds"),
        (lambda d: d.update(restore_fixed_s=1e300), r"restore_fixed_s must be <= 1e\+09 seconds"),
        (lambda d: d["call_times"][0].update(seconds=1e300), r"call_times: seconds must be <="),
        (
            lambda d: d.update(call_overheads=[{"busy_cores": 0, "seconds": 1e300}]),
            r"call_overheads: seconds must be <= 1e\+09",
        ),
    ],
)
def test_a_bad_file_is_refused_naming_the_file_and_field(tmp_path, edit, message) -> None:
    data = record().to_dict()
    edit(data)
    path = tmp_path / "r.json"
    path.write_text(json.dumps(data))
    with pytest.raises(CalibrationError, match=message):
        load_gpu_calibration(path)


def test_a_file_that_is_not_json_is_refused_clearly(tmp_path) -> None:
    path = tmp_path / "r.json"
    path.write_text("{not json")
    with pytest.raises(CalibrationError, match="r.json: not valid json"):
        load_gpu_calibration(path)
    with pytest.raises(CalibrationError, match="cannot read the calibration"):
        load_gpu_calibration(tmp_path / "missing.json")


@pytest.mark.parametrize("suffix", [".json", ".toml"])
def test_a_file_that_is_not_utf8_is_refused_naming_it(tmp_path, suffix) -> None:
    # It was a bare UnicodeDecodeError: "'utf-8' codec can't decode byte 0xff", no file named.
    path = tmp_path / f"r{suffix}"
    path.write_bytes(b"\xff{}")  # (\xff\xfe opens UTF-16: named as such)
    with pytest.raises(CalibrationError, match=rf"r\{suffix}: not UTF-8 text \(byte 0\)"):
        load_gpu_calibration(path)


def row(action_id: str, resource: str, arrival: float, units: int, exec_s: float, **kw):
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
        max_units=2,
        arrival_s=arrival,
        obs_arrival_s=arrival,
        obs_units=units,
        obs_queue_s=0.0,
        obs_overhead_s=0.0,
        obs_exec_s=exec_s,
        obs_outcome="result",
        obs_node="vm" if resource == "cpu" else "gpu-0",
    )
    if resource == "gpu":
        base.update(service="judge", serial_fraction=None)
    return TraceRow(**{**base, **kw})


def test_busy_cores_at_a_calls_start_count_the_cpu_actions_then_holding_the_host() -> None:
    rows = [
        row("c1", "cpu", 0.0, 2, 10.0),  # holds 2 cores over [0, 10)
        row("c2", "cpu", 5.0, 1, 10.0),  # 1 core over [5, 15)
        row("c3", "cpu", 0.0, 2, 20.0, obs_node="other"),  # another node: not the host
        row("g1", "gpu", 1.0, 1, 0.1),
        row("g2", "gpu", 6.0, 1, 0.1),
        row("g3", "gpu", 12.0, 1, 0.1),
        row("g4", "gpu", 16.0, 1, 0.1),
    ]
    assert busy_at_start(rows, "vm") == {"g1": 2, "g2": 3, "g3": 1, "g4": 0}


def test_contention_points_are_the_idle_time_times_the_median_slow_down_per_level() -> None:
    idle = record(call_times=(CallTime(1, 0.0, 0.040), CallTime(2, 0.0, 0.030)))
    rows = [row("c", "cpu", 0.0, 2, 100.0)]  # both host cores busy all along
    rows += [row(f"g{i}", "gpu", 1.0 + i, 1, t) for i, t in enumerate([0.05, 0.06, 0.07])]
    rows += [row("h", "gpu", 9.0, 2, 0.09)]  # one DoP-2 call: takes the pooled ratio
    points = contention_points(rows, idle, host_cores=2)
    assert [(p.dop, p.busy_cores) for p in points] == [(1, 2.0), (2, 2.0)]  # no call at 1 busy
    assert points[0].seconds == pytest.approx(0.040 * 1.5)  # ratios 1.25, 1.5, 1.75
    assert points[1].seconds == pytest.approx(0.030 * 1.625)  # pooled: those and 3.0


def test_a_cell_size_without_calls_at_a_level_takes_the_others_times_when_no_core_is_free() -> None:
    # CPU-backed calls (a thread per GPU) on 2 cores with both held: no free core to run a
    # DoP-2 call's second half, so its time there is a DoP-1 call's, not its idle share.
    idle = record(
        call_times=(CallTime(1, 0.0, 0.040), CallTime(2, 0.0, 0.024)), host_cores_per_gpu=1.0
    )
    rows = [row("c", "cpu", 0.0, 2, 100.0)]
    rows += [row(f"g{i}", "gpu", 1.0 + i, 1, t) for i, t in enumerate([0.05, 0.06, 0.07])]
    rows += [row("h", "gpu", 9.0, 2, 0.09)]
    points = {(p.dop, p.busy_cores): p.seconds for p in contention_points(rows, idle, 2)}
    assert points[(1, 2.0)] == pytest.approx(0.060)  # its own three calls
    assert points[(2, 2.0)] == pytest.approx(0.065)  # median of 0.05, 0.06, 0.07, 0.09
    # (pooling the ratios to idle, as before, gave 0.024 x 1.625 = 0.039: 40% short)


def test_with_free_cores_a_cell_size_keeps_its_idle_speed_up_over_the_others() -> None:
    # 4 host cores, 1 held: 3 free, more than a DoP-2 call's idle speed-up (0.040 / 0.024),
    # so the DoP-1 calls' times carry over at that speed-up (their ratio to idle).
    idle = record(
        call_times=(CallTime(1, 0.0, 0.040), CallTime(2, 0.0, 0.024)), host_cores_per_gpu=1.0
    )
    rows = [row("c", "cpu", 0.0, 1, 100.0)]
    rows += [row(f"g{i}", "gpu", 1.0 + i, 1, t) for i, t in enumerate([0.05, 0.06, 0.07])]
    points = {(p.dop, p.busy_cores): p.seconds for p in contention_points(rows, idle, 4)}
    assert points[(2, 1.0)] == pytest.approx(0.024 * 0.06 / 0.040)


def test_host_cores_per_gpu_is_written_only_when_set_and_reads_back() -> None:
    assert "host_cores_per_gpu" not in record().to_dict()  # records before it read the same
    r = record(host_cores_per_gpu=1.0)
    assert r.to_dict()["host_cores_per_gpu"] == 1.0
    assert GpuCalibration.from_dict(json.loads(json.dumps(r.to_dict()))) == r


def test_busy_cores_count_other_calls_on_the_gpu_node_at_their_cores_per_gpu() -> None:
    rows = [
        row("c1", "cpu", 0.0, 1, 10.0),  # 1 core over [0, 10)
        row("g1", "gpu", 1.0, 2, 2.0),  # a DoP-2 call over [1, 3)
        row("g2", "gpu", 2.0, 1, 2.0),  # over [2, 4): g1 running at its start
        row("g3", "gpu", 3.5, 1, 1.0),  # g2 running
        row("g4", "gpu", 3.5, 1, 1.0, obs_node="gpu-1"),  # another GPU node: not counted
        row("g5", "gpu", 12.0, 1, 1.0),  # alone
    ]
    assert busy_at_start(rows, "vm") == {"g1": 1, "g2": 1, "g3": 1, "g4": 1, "g5": 0}
    both = busy_at_start(rows, "vm", "gpu-0", 1.0)
    # g4 (on gpu-1) sees the host loaded by gpu-0's g2 and g3; g3 does not count g4.
    assert both == {"g1": 1, "g2": 1 + 2, "g3": 1 + 1, "g4": 1 + 2, "g5": 0}
    assert busy_for(rows, record(host_cores_per_gpu=0.5))["g2"] == 1 + 0.5 * 2
    assert busy_for(rows, record()) == busy_at_start(rows, "vm")  # 0 per GPU: CPU only


def test_contention_points_carry_the_top_level_up_by_processor_sharing() -> None:
    idle = record(call_times=(CallTime(1, 0.0, 0.040),), host_cores_per_gpu=1.0)
    rows = [row("c", "cpu", 0.0, 2, 100.0)]  # both host cores busy all along
    rows += [row(f"g{i}", "gpu", 1.0 + i, 1, t) for i, t in enumerate([0.05, 0.06, 0.07])]
    # 2 cores and 2 GPUs: up to 2 + 1 busy; no call saw the other GPU busy, so level 3 is
    # level 2 times (1 + 3) / 2 over (1 + 2) / 2: one more thread on the 2 shared cores.
    points = contention_points(rows, idle, host_cores=2, gpus=2)
    assert [(p.dop, p.busy_cores) for p in points] == [(1, 2.0), (1, 3.0)]
    assert points[1].seconds == pytest.approx(points[0].seconds * 4 / 3)
    # Three calls overlapping another call are measured at that level instead.
    rows += [row(f"h{i}", "gpu", 10.0 + i, 1, 0.1) for i in range(3)]
    rows += [row(f"o{i}", "gpu", 10.0 + i - 0.01, 1, 0.5) for i in range(3)]
    measured = contention_points(rows, idle, host_cores=2, gpus=2)
    top = measured[-1]  # ratios 2.5, 2.5, 2.5
    assert (top.dop, top.busy_cores) == (1, 3.0) and top.seconds == pytest.approx(0.040 * 2.5)
    # Without host load from calls there is no level past the host's cores.
    assert max(p.busy_cores for p in contention_points(rows, record(), 2, gpus=2)) == 2.0


def test_the_overhead_per_busy_level_is_linear_between_points_flat_beyond() -> None:
    assert record().overhead_s(2.0) == 0.002  # no points: the idle overhead at every load
    r = record(call_overheads=(CallOverhead(1.0, 0.004), CallOverhead(2.0, 0.010)))
    assert r.overhead_s(0.0) == 0.002  # call_overhead_s is the busy-0 point
    assert r.overhead_s(1.5) == pytest.approx(0.007)
    assert r.overhead_s(5.0) == 0.010
    measured_idle = record(call_overheads=(CallOverhead(0.0, 0.001),))
    assert measured_idle.overhead_s(0.0) == measured_idle.overhead_s(3.0) == 0.001
    assert GpuCalibration.from_dict(json.loads(json.dumps(r.to_dict()))) == r
    assert "call_overheads" not in record().to_dict()


def test_overhead_points_are_the_mean_observed_overhead_per_busy_level() -> None:
    rows = [row("c", "cpu", 0.0, 2, 10.0)]  # both host cores busy over [0, 10)
    rows += [
        row(f"g{i}", "gpu", 1.0 + i, 1, 0.1, obs_overhead_s=o) for i, o in enumerate([1, 2, 6])
    ]
    rows += [row(f"h{i}", "gpu", 20.0 + i, 1, 0.1, obs_overhead_s=0.5) for i in range(3)]
    rows += [row("lone", "gpu", 30.0, 1, 0.1, obs_node="gpu-1", obs_overhead_s=9.0)]
    points = overhead_points(rows, record(), host_cores=2)
    # g* at 2 busy (mean 3), h* at 0; one call at 1 busy is too few for a point.
    assert points == (CallOverhead(0.0, 0.5), CallOverhead(2.0, 3.0))


@pytest.mark.parametrize("suffix", [".json", ".toml"])
def test_a_record_opening_with_a_byte_order_mark_loads(tmp_path, suffix) -> None:
    """An editor on Windows saves UTF-8 with a byte-order mark; the record was refused as
    "not valid json: Unexpected UTF-8 BOM" (TOML: "Invalid statement")."""
    r = record()
    data = json.loads(r.write(tmp_path / "r.json").read_text())
    if suffix == ".toml":
        lines = [f"{k} = {json.dumps(v)}" for k, v in data.items() if k != "call_times"]
        for p in data["call_times"]:
            lines += ["[[call_times]]", *(f"{k} = {json.dumps(v)}" for k, v in p.items())]
        text = "\n".join(lines) + "\n"
    else:
        text = json.dumps(data)
    path = tmp_path / f"bom{suffix}"
    path.write_bytes(b"\xef\xbb\xbf" + text.encode())
    assert load_gpu_calibration(path) == r


def test_a_key_repeated_in_a_json_record_is_refused_naming_it(tmp_path) -> None:
    """JSON keeps the last of a repeated key: a record saying ``"restore_gbps"`` twice loaded the
    second figure without a word (TOML refuses a repeated key itself)."""
    text = json.dumps(record().to_dict())
    path = tmp_path / "r.json"
    path.write_text(text[:-1] + ', "restore_gbps": 999.0}')
    with pytest.raises(CalibrationError, match=r"r\.json: .*'restore_gbps'.*more than once"):
        load_gpu_calibration(path)
