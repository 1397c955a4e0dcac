"""Workload settings found by stop 26's hunt: every number a generator is given is finite,
every time at most the trace format's longest, and a count cap at most ``COUNT_MAX``; a bad
one is refused naming the setting (not a generated trace field, not a numpy overflow), and a
large cap no longer costs time in proportion to it."""

from __future__ import annotations

import math
import time

import pytest

from tangram.sim.workloads import WORKLOADS, TeacherSpec
from tangram.sim.workloads.base import COUNT_MAX, expected_count

INF = float("inf")


@pytest.mark.parametrize(
    ("workload", "setting", "value"),
    [
        ("coding", "memory_gb_max", INF),
        ("coding", "exec_mean_s", INF),
        ("coding", "gen_sigma", INF),
        ("coding", "exec_mean_s", 1e300),
        ("mopd", "t1_sigma", INF),
        ("mopd", "bytes_per_param", INF),
        ("mopd", "response_tokens_max", 10**400),
        ("deepsearch", "search_median_s", 1e20),
        ("random", "sigma_max", INF),
        ("random", "mixed_shares", (INF, 1.0, 1.0)),
    ],
)
def test_a_non_finite_or_too_long_setting_is_refused_naming_it(workload, setting, value) -> None:
    with pytest.raises(ValueError, match=rf"^{setting}: must be"):
        WORKLOADS[workload].params_with(**{setting: value})


def test_a_teacher_of_infinite_size_is_refused_naming_the_teacher() -> None:
    with pytest.raises(ValueError, match=r"^teacher 'big': params_b: must be a finite number"):
        TeacherSpec("big", INF)


@pytest.mark.parametrize(
    ("workload", "setting"),
    [
        ("coding", "env_actions_max"),
        ("deepsearch", "searches_max"),
        ("random", "actions_max"),  # was not capped: 100,001 generated for minutes, silently
        ("mopd", "calls_per_trajectory"),  # nor this one
    ],
)
def test_a_count_cap_beyond_count_max_is_refused_naming_it(workload, setting) -> None:
    with pytest.raises(ValueError, match=rf"^{setting}: must lie in \[1, {COUNT_MAX}\]"):
        WORKLOADS[workload].params_with(**{setting: COUNT_MAX + 1})


def test_the_largest_count_cap_generates_quickly() -> None:
    start = time.process_time()  # this process's CPU time: a busy machine does not count
    trace = WORKLOADS["coding"](WORKLOADS["coding"].params_with(env_actions_max=COUNT_MAX), batch=2)
    assert len(trace.trajectories()) == 2 and time.process_time() - start < 5.0


@pytest.mark.parametrize(
    ("median", "sigma", "hi"),
    [(25.0, 0.53, 100), (7.0, 1.135, 64), (3.0, 0.0, 10), (25.0, 0.53, 5000)],
)
def test_expected_count_equals_the_full_sum_bit_for_bit(median, sigma, hi) -> None:
    def cdf(x: float) -> float:
        if sigma == 0:
            return 1.0 if x >= median else 0.0
        return 0.5 * (1.0 + math.erf(math.log(x / median) / (sigma * math.sqrt(2.0))))

    full = 0.0
    for k in range(1, hi + 1):
        full += k * ((1.0 if k == hi else cdf(k + 0.5)) - (0.0 if k == 1 else cdf(k - 0.5)))
    assert expected_count(median, sigma, 1, hi) == full


def test_a_teacher_without_a_name_is_refused_naming_the_setting() -> None:
    # It failed in the generated rows as "field 'service': must be a non-empty string".
    with pytest.raises(ValueError, match=r"^teachers: each teacher needs a non-empty name"):
        WORKLOADS["mopd"].params_with(teachers=(TeacherSpec("", 7.0),))


@pytest.mark.parametrize("setting", ["search_service", "judge_service"])
def test_an_empty_service_name_is_refused_naming_the_setting(setting) -> None:
    # It failed in the generated rows as "field 'service': must be a non-empty string".
    with pytest.raises(ValueError, match=rf"^{setting}: must be a non-empty service name"):
        WORKLOADS["deepsearch"].params_with(**{setting: ""})


@pytest.mark.parametrize("setting", ["cpu_nodes_max", "gpu_nodes_max"])
def test_a_random_cluster_past_a_cluster_files_nodes_is_refused_naming_the_setting(setting):
    # cpu_nodes_max=100000 failed as "trace meta 'cluster': cpu_node: 30113 nodes; at most 4096".
    from tangram.core.cluster_file import MAX_NODES

    assert getattr(WORKLOADS["random"].params_with(**{setting: MAX_NODES}), setting) == MAX_NODES
    with pytest.raises(ValueError, match=rf"^{setting}: must lie in \[1, {MAX_NODES}\]"):
        WORKLOADS["random"].params_with(**{setting: MAX_NODES + 1})
