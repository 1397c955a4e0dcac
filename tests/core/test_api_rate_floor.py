"""An API endpoint's ``rate_per_s`` has a floor, so the wait for its next start token stays a
finite number of seconds.

It was any positive number: a cluster file's ``rate_per_s = 1e-320`` made the next token due
at ``inf`` (1 / 1e-320 overflows), and ``tangram sim --workload deepsearch`` failed as "event
time must be a finite number of seconds, got inf", naming no file or key.
"""

import math

import pytest

from tangram.core import ApiEndpointSpec
from tangram.core.cluster_file import ClusterFileError, load_cluster
from tangram.core.resources import RATE_PER_S_MIN, SpecError


@pytest.mark.parametrize("rate", [1e-320, 1e-300, RATE_PER_S_MIN / 2])
def test_a_rate_below_the_floor_is_refused_naming_it(rate):
    with pytest.raises(SpecError, match=r"rate_per_s: must be .*at least 1e-06"):
        ApiEndpointSpec("search", 4, rate_per_s=rate)


def test_a_cluster_file_names_the_key(tmp_path):
    path = tmp_path / "c.toml"
    path.write_text('name = "c"\n[[api]]\nname = "search"\nconcurrency = 4\nrate_per_s = 1e-320\n')
    with pytest.raises(ClusterFileError, match=r"api\[0\]\.rate_per_s"):
        load_cluster(path)


def test_the_slowest_rate_runs_to_the_end():
    """At the floor the calls wait long for their tokens, not forever: every action ends."""
    from tangram.core.resources import ClusterSpec, CpuNodeSpec, GpuNodeSpec
    from tangram.sim.config import SimConfig
    from tangram.sim.driver import simulate
    from tangram.sim.workloads import generate

    cluster = ClusterSpec(
        "slow-api",
        (CpuNodeSpec("c0", 8, 1, 100.0),),
        (GpuNodeSpec("g0", 8, 80.0, 1000.0),),
        (ApiEndpointSpec("search", 4, rate_per_s=RATE_PER_S_MIN),),
    )
    trace = generate("deepsearch", batch=1, steps=1, seed=0)
    result = simulate(trace, cluster, SimConfig(policy="tangram"))
    assert all(r.outcome == "result" for r in result.actions)
    assert math.isfinite(result.makespan)
