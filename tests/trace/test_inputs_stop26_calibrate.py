"""Replay calibration's input found by stop 26's hunt: a recorded trace's ``eoe`` header holds
the live EOE's counters, each a number >= 0; anything else is refused naming the header key."""

from __future__ import annotations

import pytest

from tangram.trace import Trace, TraceError
from tangram.trace.calibrate import measure
from tests.trace.rows import row


def live_trace(eoe) -> Trace:
    done = row(arrival_s=0.0, obs_units=1, obs_exec_s=2.0, obs_outcome="result")
    return Trace((done,), {"eoe": eoe})


@pytest.mark.parametrize(
    ("eoe", "field"),
    [
        ("bad", "eoe"),
        ({"restores": 1, "restore_s": 0.5, "evictions": "x"}, "eoe.evictions"),
        ({"evictions": 2, "evict_s": None}, "eoe.evict_s"),
        ({"restores": 5, "restore_s": -1.0, "bytes_restored": 10}, "eoe.restore_s"),
        ({"restores": True}, "eoe.restores"),
    ],
)
def test_a_malformed_eoe_header_is_refused_naming_the_header_key(eoe, field) -> None:
    with pytest.raises(TraceError) as info:
        measure(live_trace(eoe))
    assert info.value.field == field and info.value.where == "header"


def test_an_eoe_header_without_some_counters_counts_them_as_zero() -> None:
    measured = measure(live_trace({"backend": "cpu", "evictions": 0}))
    assert measured.h2d_gbps is None and measured.eviction_s == 0.01


@pytest.mark.parametrize(
    "eoe",
    [
        {"restores": 1, "restore_s": 1e-300, "bytes_restored": 1e300},  # rate overflows to inf
        {"restores": 1, "restore_s": 1e300, "bytes_restored": 1e-300},  # rate underflows to 0
    ],
)
def test_counters_that_divide_to_no_restore_rate_are_refused_naming_the_header(eoe) -> None:
    # Each counter is valid alone; the rate was refused by the GPU node as "h2d_gbps: must be
    # a positive finite number" (inf had passed silently before: free restores), no header named.
    with pytest.raises(TraceError, match="must give a finite restore rate >= 1e-06") as info:
        measure(live_trace(eoe))
    assert info.value.field == "eoe" and info.value.where == "header"


def test_restores_of_no_bytes_measure_no_rate() -> None:
    measured = measure(live_trace({"restores": 2, "restore_s": 0.01, "bytes_restored": 0}))
    assert measured.h2d_gbps is None


@pytest.mark.parametrize(
    "residency", ["false", 1, [0], {"judge": "0"}, {"judge": [True]}, {"judge": [-1]}, {"": [0]}]
)
def test_a_residency_header_that_is_not_services_to_gpus_is_refused_naming_it(residency) -> None:
    # Only its truthiness was read: "false" started the replay warm, silently.
    from tangram.trace.calibrate import warm_at_start

    with pytest.raises(TraceError, match="list of GPU indices") as info:
        warm_at_start({"gpu_residency_at_start": residency})
    assert info.value.field == "gpu_residency_at_start" and info.value.where == "header"


@pytest.mark.parametrize(
    ("residency", "warm"),
    [(None, False), ({}, False), ({"judge": []}, False), ({"judge": [0, 1]}, True)],
)
def test_a_residency_header_as_the_live_runtime_writes_it_reads(residency, warm) -> None:
    from tangram.trace.calibrate import warm_at_start

    assert warm_at_start({"gpu_residency_at_start": residency}) is warm
