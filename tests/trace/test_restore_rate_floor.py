"""Every restore rate the simulator divides by has the GPU node's floor (``H2D_GBPS_MIN``).

A cluster file's ``h2d_gbps`` is held to it (``tests/core/test_gpu_node_bounds.py``); the
other rates were any positive number: ``--set overheads.gpu_h2d_gbps=1e-320``, a calibration
record's ``restore_gbps = 1e-320`` (``tangram replay --gpu-calibration``) and a live header's
EOE counters giving such a rate made a cold restore take ``inf`` seconds, and the run failed
as "event time must be a finite number of seconds, got inf", naming no flag, file or field.
A record's call time so small that it is no measurement (1e-320 s) made its slow-down
infinite or 0: the replay failed as "math domain error" or a ZeroDivisionError traceback.
"""

from __future__ import annotations

import copy

import pytest

from tangram.core.resources import H2D_GBPS_MIN
from tangram.trace.gpu_calibration import CalibrationError, GpuCalibration

RECORD = {
    "service": "reward",
    "backend": "cpu",
    "call_overhead_s": 0.0005,
    "restore_gbps": 0.27,
    "restore_fixed_s": 0.0,
    "host_cores": 2,
    "call_times": [
        {"dop": 1, "busy_cores": 0.0, "seconds": 0.0034},
        {"dop": 1, "busy_cores": 1.0, "seconds": 0.0061},
    ],
    "version": 1,
}


def test_the_sim_overheads_refuse_a_restore_rate_below_the_floor() -> None:
    from tangram.sim.config import Overheads

    assert Overheads(gpu_h2d_gbps=H2D_GBPS_MIN).gpu_h2d_gbps == H2D_GBPS_MIN
    with pytest.raises(ValueError, match=r"overheads.gpu_h2d_gbps must be .*>= 1e-06"):
        Overheads(gpu_h2d_gbps=1e-320)


def test_a_calibration_record_refuses_a_restore_rate_below_the_floor() -> None:
    data = {**RECORD, "restore_gbps": 1e-320}
    with pytest.raises(CalibrationError, match=r"restore_gbps must be >= 1e-06"):
        GpuCalibration.from_dict(data)


@pytest.mark.parametrize("seconds", [1e-320, 1e-7])
def test_a_calibration_record_refuses_a_call_time_that_is_no_measurement(seconds) -> None:
    data = copy.deepcopy(RECORD)
    data["call_times"][0]["seconds"] = seconds
    with pytest.raises(CalibrationError, match=r"call_times: seconds must be >= 1e-06"):
        GpuCalibration.from_dict(data)


def test_a_live_headers_restore_counters_below_the_floor_are_refused_naming_them() -> None:
    from tangram.trace import TraceError
    from tangram.trace.calibrate import restore_gbps

    with pytest.raises(TraceError, match=r"bytes_restored / restore_s must give .*>= 1e-06"):
        restore_gbps({"restores": 1, "bytes_restored": 1, "restore_s": 1e6})
