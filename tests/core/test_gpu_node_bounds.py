"""A GPU node's copy bandwidth and memory per GPU are bounded, so its restore estimate stays a
finite number of seconds.

``h2d_gbps`` was any positive number: a cluster file's ``h2d_gbps = 1e-320`` (or 1e-308, a
typo's exponent) made a restore of a 20-GB model take ``inf`` seconds (20 / 1e-320 overflows),
and a cold replay under ``tangram`` or ``sglang-sized`` failed with "event time must be a
finite number of seconds, got inf", naming no file or key. An unbounded ``gpu_memory_gb``
lets a model large enough overflow the same division at any bandwidth.
"""

import math

import pytest

from tangram.core import GpuNodeSpec
from tangram.core.cluster_file import ClusterFileError, load_cluster
from tangram.core.resources import (
    GPU_MEMORY_GB_MAX,
    H2D_GBPS_MIN,
    RESTORE_FIXED_S_MAX,
    SpecError,
)


@pytest.mark.parametrize("h2d", [1e-320, 1e-308, H2D_GBPS_MIN / 2])
def test_a_copy_bandwidth_below_the_floor_is_refused_naming_it(h2d):
    with pytest.raises(SpecError, match=r"h2d_gbps: must be .*>= 1e-06"):
        GpuNodeSpec("g", 8, 80.0, 1000.0, h2d_gbps=h2d)


def test_memory_per_gpu_above_the_bound_is_refused_naming_it():
    with pytest.raises(SpecError, match=r"gpu_memory_gb: must be .*<= 1e\+06"):
        GpuNodeSpec("g", 8, GPU_MEMORY_GB_MAX * 2, 1000.0)


def test_at_the_bounds_every_restore_is_finite():
    node = GpuNodeSpec("g", 8, GPU_MEMORY_GB_MAX, 1000.0, h2d_gbps=H2D_GBPS_MIN)
    assert math.isfinite(node.restore_s(8 * GPU_MEMORY_GB_MAX, 1))


def test_a_cluster_file_names_the_key(tmp_path):
    path = tmp_path / "c.toml"
    path.write_text(
        'name = "c"\n[[gpu_node]]\nname = "g0"\ngpus = 8\ngpu_memory_gb = 80\n'
        "host_memory_gb = 1000\nh2d_gbps = 1e-320\n"
    )
    with pytest.raises(ClusterFileError, match=r"gpu_node\[0\]\.h2d_gbps"):
        load_cluster(path)


def test_a_cold_replay_on_the_slowest_copy_runs(tmp_path):
    """At the floor a cold restore is long, not infinite: the run ends with every action."""
    from tangram.core.resources import ClusterSpec, CpuNodeSpec
    from tangram.sim.config import SimConfig
    from tangram.sim.driver import simulate
    from tangram.sim.workloads import generate

    cluster = ClusterSpec(
        "slow-copy",
        (CpuNodeSpec("c0", 8, 1, 100.0),),
        (GpuNodeSpec("g0", 8, 80.0, 1000.0, h2d_gbps=H2D_GBPS_MIN),),
    )
    trace = generate("mopd", batch=2, steps=1, seed=0)
    result = simulate(trace, cluster, SimConfig(policy="tangram", warm_gpus=False))
    assert all(r.outcome in ("result", "rejected") for r in result.actions)
    assert math.isfinite(result.makespan)


@pytest.mark.parametrize("fixed", [1e300, RESTORE_FIXED_S_MAX * 2])
def test_a_restore_fixed_cost_above_the_bound_is_refused_naming_it(fixed):
    """``restore_fixed_s = 1e300`` passed (finite, >= 0) and a replay's ACTs came out as 1e300
    seconds; the simulator's own override (``overheads.gpu_restore_fixed_s``) is capped at
    1e9 s, and the node's key now is too."""
    with pytest.raises(SpecError, match=r"restore_fixed_s: must be .*<= 1e\+09"):
        GpuNodeSpec("g", 8, 80.0, 1000.0, restore_fixed_s=fixed)


def test_a_cluster_file_names_the_restore_fixed_key(tmp_path):
    path = tmp_path / "c.toml"
    path.write_text(
        'name = "c"\n[[gpu_node]]\nname = "g0"\ngpus = 8\ngpu_memory_gb = 80\n'
        "host_memory_gb = 1000\nrestore_fixed_s = 1e300\n"
    )
    with pytest.raises(ClusterFileError, match=r"gpu_node\[0\]\.restore_fixed_s"):
        load_cluster(path)


def test_the_restore_fixed_bound_is_the_trace_time_bound():
    from tangram.trace.row import TIME_MAX_S

    assert RESTORE_FIXED_S_MAX == TIME_MAX_S
    assert GpuNodeSpec("g", 8, 80.0, 1000.0, restore_fixed_s=RESTORE_FIXED_S_MAX)
