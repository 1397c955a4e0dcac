"""The RL loop's structure as workload parameters: each moves what it names, and nothing else."""

from collections import Counter

import numpy as np
import pytest

from tangram.core import load_cluster
from tangram.sim.config import SimConfig
from tangram.sim.driver import simulate
from tangram.sim.metrics import actions_frame
from tangram.sim.workloads import WORKLOADS, generate


def arrivals(trace, kind: str, cluster: str = "paper") -> np.ndarray:
    acts = actions_frame(simulate(trace, load_cluster(cluster), SimConfig(policy="tangram")))
    return acts.loc[acts["kind"] == kind, "arrival"].to_numpy()


def test_a_batch_synchronous_reward_makes_every_reward_arrive_in_one_instant():
    sync = arrivals(generate("coding", batch=32, seed=3, reward_sync="step"), "reward")
    assert len(sync) == 32 and sync.max() - sync.min() == 0.0
    spread = arrivals(generate("coding", batch=32, seed=3), "reward")
    assert spread.max() - spread.min() > 10.0  # asynchronous: rewards as rollouts end
    assert sync.min() >= spread.max() - 1e-9  # held for the slowest rollout


def test_a_batch_synchronous_judge_makes_every_judge_call_arrive_in_one_instant():
    sync = arrivals(generate("deepsearch", batch=16, seed=2, judge_sync="step"), "judge")
    assert len(sync) == 16 and sync.max() - sync.min() == 0.0


def test_a_setup_action_opens_every_trajectory_at_the_steps_first_instant():
    trace = generate("coding", batch=16, seed=1, setup_t1_mean_s=20.0)
    plain = generate("coding", batch=16, seed=1)
    firsts = [r for r in trace.rows if r.position == 0]
    assert {r.kind for r in firsts} == {"setup"} and {r.gen_before_s for r in firsts} == {0.0}
    assert np.mean([r.t1_s for r in firsts]) == pytest.approx(20.0, rel=0.35)
    assert list(arrivals(trace, "setup")) == [0.0] * 16
    # The rest of the trajectory is the one without setup, one position later.
    rest = [(r.kind, r.t1_s, r.position - 1) for r in trace.rows if r.kind != "setup"]
    assert rest == [(r.kind, r.t1_s, r.position) for r in plain.rows]


def test_without_a_prefix_cache_later_turns_recompute_the_conversation():
    cached = generate("mopd", batch=8, seed=0, calls_per_trajectory=3)
    full = generate("mopd", batch=8, seed=0, calls_per_trajectory=3, prefix_cache=False)
    for a, b in zip(cached.rows, full.rows, strict=True):
        if a.position == 0:
            assert b.t1_s == a.t1_s  # the first turn has no prefix
        else:
            assert b.t1_s > a.t1_s
    # The ratio is the tokens so far over the turn's (generation time is tokens / speed).
    gens = [r.gen_before_s for r in cached.rows[:3]]
    assert full.rows[2].t1_s / cached.rows[2].t1_s == pytest.approx(sum(gens) / gens[2], rel=1e-4)


@pytest.mark.parametrize("order, most", [("largest-first", 72.7), ("smallest-first", 7.6)])
def test_zipf_popularity_routes_most_trajectories_to_the_first_in_its_order(order, most):
    params = WORKLOADS["mopd"].params_with(popularity="zipf", zipf_order=order)
    routing = params.routing()
    assert routing.sum() == pytest.approx(1.0)
    top = params.teachers[int(np.argmax(routing))]
    assert top.params_b == most
    trace = generate("mopd", batch=2000, seed=0, popularity="zipf", zipf_order=order)
    counts = Counter(r.service for r in trace.rows)
    assert counts.most_common(1)[0][1] > 2000 / len(params.teachers) * 2  # skewed


def test_zipf_with_exponent_zero_is_the_equal_split():
    params = WORKLOADS["mopd"].params_with(popularity="zipf", zipf_exponent=0.0)
    assert np.allclose(params.routing(), 1 / len(params.teachers))


def test_the_defaults_generate_the_traces_they_did_before_these_parameters():
    # Streams are named: the new parameters at their defaults change no draw.
    for name in ("coding", "mopd", "deepsearch"):
        assert not any(r.sync for r in generate(name, batch=8).rows)


@pytest.mark.parametrize(
    "workload, name, value",
    [
        ("coding", "reward_sync", "batch"),
        ("coding", "setup_t1_mean_s", -1.0),
        ("deepsearch", "judge_sync", "never"),
        ("mopd", "popularity", "pareto"),
        ("mopd", "zipf_order", "random"),
        ("mopd", "zipf_exponent", -0.5),
    ],
)
def test_a_bad_value_is_refused_naming_the_parameter(workload, name, value):
    with pytest.raises(ValueError, match=name):
        WORKLOADS[workload].params_with(**{name: value})
