"""No online policy meets issue 11's "beaten by more than 20% on none", on mean ACT or step.

``tangram.bench.online_limit`` builds, per figure, two instances of the random GPU family's
kind that are the same until they diverge (replayable copies in
``tests/mechanisms/gpu/online_twin_*``). Four 80-GB GPUs; a call A to a 7.6B model (15.2 GB,
warm on one GPU) arrives at t = 0: t1 = 100 s, serial fraction 0.25, at most 4 GPUs, so
d(k) = 100 x (0.25 + 0.75 / k): 100, 62.5, 43.75 s on 1, 2, 4 GPUs. A GPU call's width is
fixed at its start and cells are aligned; a policy that sees only the past starts A at some w
on some k, the same in both twins while they are alike. Restores only add to the bounds.

Mean ACT (``alone`` / ``crowd``): fifteen 1-s one-GPU calls, one per trajectory, at t = 50,
52, ..., 78 in ``alone`` and all at t = 20 in ``crowd``.
- k = 4, w < 20: in ``crowd`` A holds every GPU until w + 43.75 > 43.75; each crowd call is
  done no sooner than 43.75 - 20 + 1 = 24.75 s after it arrives: mean ACT >= (43.75 + 15 x
  24.75) / 16 = 25.94 s, 3.0x ``fixed:2``'s 8.545 s (A on 2 GPUs, the crowd on the other 2).
- k = 2 (1), w < 20: in ``alone`` >= (62.5 + 15) / 16 = 4.84 s ((100 + 15) / 16 = 7.19 s),
  1.30x (1.93x) ``fixed:4``'s 3.726 s (A restored on 4 GPUs: 0.202 + 43.75).
- w >= 20: in ``alone`` >= (20 + 43.75 + 15) / 16 = 4.92 s, 1.32x ``fixed:4``'s.

Step (``after_long`` / ``after_crowd``): two 25.5-s one-GPU calls arrive at t = 16 in both; a
25.5-s one-GPU call M comes 0.5 s after the call before it: after A, or after the first crowd
call. The twins are alike until a call ends.
- k = 4 before a call ends: in ``after_crowd`` the crowd starts no sooner than 43.75: step >=
  43.75 + 25.5 + 0.5 + 25.5 = 95.25 s, 1.40x ``fixed:2``'s 68.158 s.
- k = 2 (1) before a call ends: in ``after_long`` >= 62.5 + 26 = 88.5 s (126 s), 1.25x (1.78x)
  ``fixed:4``'s 70.61 s.
- after a call ends (no sooner than 16 + 25.5 = 41.5): in ``after_long`` >= 41.5 + 43.75 +
  26 = 111.25 s, 1.58x.
"""

from pathlib import Path

import pytest

from tangram.bench import online_limit
from tangram.bench.online_limit import MeanTwins, StepTwins, bound_pair, twin_cluster
from tangram.core.cluster_file import load_cluster
from tangram.sim.demand import expected_demand
from tangram.trace.files import load_trace

CASES = Path(__file__).parent / "gpu"
MEAN, STEP = MeanTwins(), StepTwins()


@pytest.fixture(scope="module")
def mean_pair() -> dict:
    return bound_pair(MEAN)


@pytest.fixture(scope="module")
def step_pair() -> dict:
    return bound_pair(STEP)


@pytest.mark.parametrize("twins", [MEAN, STEP])
def test_the_replayable_copies_are_the_benchmarks_twins(twins):
    for twin, trace in twins.traces().items():
        assert load_trace(CASES / f"online_twin_{twin}.jsonl").rows == trace.rows
        assert load_cluster(CASES / f"online_twin_{twin}.toml") == twin_cluster()


@pytest.mark.parametrize("twins", [MEAN, STEP])
def test_the_twins_declare_the_same_demand_and_start_alike(twins):
    first, second = twins.traces().values()
    cluster = twin_cluster()
    assert expected_demand(first, cluster) == expected_demand(second, cluster)
    assert len(first.rows) == len(second.rows)
    # Both open with the long call at t = 0.
    assert first.rows[0] == second.rows[0] and first.rows[0].action_id == online_limit.LONG


def test_the_mean_twins_differ_only_from_tau_on():
    alone, crowd = MEAN.traces().values()
    for a, c in zip(alone.rows[1:], crowd.rows[1:], strict=True):
        # First actions arrive at their gen_before_s: each is the same call, at TAU or later.
        assert a.position == c.position == 0
        assert a.gen_before_s >= MEAN.alone_from_s > MEAN.tau_s == c.gen_before_s
        assert (a.action_id, a.t1_s, a.max_units) == (c.action_id, c.t1_s, 1)


def test_the_step_twins_differ_only_in_whom_the_follow_up_follows():
    after_long, after_crowd = STEP.traces().values()
    firsts = [r for r in after_long.rows if r.position == 0]
    assert firsts == [r for r in after_crowd.rows if r.position == 0]
    (m_long,) = [r for r in after_long.rows if r.position == 1]
    (m_crowd,) = [r for r in after_crowd.rows if r.position == 1]
    assert m_long.trajectory == firsts[0].trajectory != m_crowd.trajectory
    assert (m_long.t1_s, m_long.gen_before_s) == (m_crowd.t1_s, m_crowd.gen_before_s)


def test_the_bounds_are_the_docstrings_arithmetic():
    mean = dict(MEAN.starts())
    assert mean["4-GPU cell before 20 s"]["crowd"] == pytest.approx(25.9375)
    assert mean["2-GPU cell before 20 s"]["alone"] == pytest.approx(4.84375)
    assert mean["at 20 s or later"] == {"alone": pytest.approx(4.921875)}
    step = dict(STEP.starts())
    assert step["4-GPU cell before a call ends"]["after_crowd"] == pytest.approx(95.25)
    assert step["2-GPU cell before a call ends"]["after_long"] == pytest.approx(88.5)
    assert step["after a call ends"] == {"after_long": pytest.approx(111.25)}


def test_every_online_start_loses_mean_act_by_more_than_20_percent_on_a_twin(mean_pair):
    best = mean_pair["best_baseline"]
    assert (best["alone"]["policy"], best["crowd"]["policy"]) == ("fixed:4", "fixed:2")
    assert best["alone"]["act_mean_s"] == pytest.approx(3.7256, abs=1e-3)
    assert best["crowd"]["act_mean_s"] == pytest.approx(8.5453, abs=1e-3)
    assert len(mean_pair["starts"]) == len(online_limit.WIDTHS) + 1
    assert mean_pair["least_ratio"] == pytest.approx(1.300, abs=1e-3)


def test_every_online_start_loses_the_step_by_more_than_20_percent_on_a_twin(step_pair):
    best = step_pair["best_baseline"]
    assert (best["after_long"]["policy"], best["after_crowd"]["policy"]) == ("fixed:4", "fixed:2")
    assert best["after_long"]["step_s"] == pytest.approx(70.61, abs=1e-2)
    assert best["after_crowd"]["step_s"] == pytest.approx(68.158, abs=1e-2)
    assert step_pair["least_ratio"] == pytest.approx(1.253, abs=1e-3)


@pytest.mark.parametrize("twins", [MEAN, STEP])
def test_the_limit_holds_from_the_sized_replicas_start_too(twins):
    assert bound_pair(twins, warm="plan")["least_ratio"] > online_limit.TARGET_RATIO


def test_the_default_takes_the_first_twins_optimum_and_loses_the_second(mean_pair, step_pair):
    # It starts A at once on 4 GPUs (optimal when A is alone or on the critical path).
    assert mean_pair["default_ratio"]["alone"] == pytest.approx(1.0, abs=1e-6)
    assert mean_pair["default_ratio"]["crowd"] > 3.0
    assert step_pair["default_ratio"]["after_long"] == pytest.approx(1.0, abs=1e-6)
    assert step_pair["default_ratio"]["after_crowd"] > 1.3


def test_numbers_for_which_the_argument_fails_are_refused():
    with pytest.raises(ValueError, match="tau_s"):
        MeanTwins(tau_s=60.0).check()
    with pytest.raises(ValueError, match="alone_from_s"):
        MeanTwins(alone_from_s=30.0, tau_s=20.0).check()
    with pytest.raises(ValueError, match="tau_s"):
        StepTwins(tau_s=float("nan")).check()
