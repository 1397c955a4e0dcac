"""No online policy meets issue 11's "beaten by more than 20% on none" on mean ACT.

Two instances of the random GPU family's kind (``tests/mechanisms/gpu/online_twin_*``) are
the same until t = TAU: what arrives, the demand declared to every policy
(``Scheduler.expect``), the cluster and what its GPUs hold. A call A to a 7.6B model
(15.2 GB, warm on one of four 80-GB GPUs) arrives at t = 0: t1 = 100 s, serial fraction 0.25,
at most 4 GPUs, so d(k) = 100 x (0.25 + 0.75 / k): 100, 62.5, 43.75 s on 1, 2, 4 GPUs.
Fifteen 1-s one-GPU calls of the same model follow, one per trajectory:

- ``alone``: at t = 50, 52, ..., 78, each after A is done under a wide start;
- ``crowd``: all at t = TAU = 20, while A runs.

A GPU call's width is fixed at its start and cells are aligned (1, 2 or 4 GPUs). A policy that
sees only the past (every policy here: the simulator tells the core what has arrived) starts
A at some w with some k; if w < TAU it does so in both twins alike. Whatever it does, some
baseline beats its mean ACT by more than 20% on one twin (lower bounds; restores only add):

- k = 4, w < TAU: in ``crowd`` A holds every GPU until w + 43.75 > 43.75, so each crowd call
  is done no sooner than 43.75 - 20 + 1 = 24.75 s after it arrives: mean ACT >=
  (43.75 + 15 x 24.75) / 16 = 25.94 s, 3.0x ``fixed:2``'s 8.545 s (A on 2 GPUs, the crowd on
  the other 2).
- k = 2 (k = 1), w < TAU: in ``alone`` mean ACT >= (62.5 + 15 x 1) / 16 = 4.84 s ((100 + 15)
  / 16 = 7.19 s), 1.30x (1.93x) ``fixed:4``'s 3.726 s (A restored on 4 GPUs: 0.202 + 43.75).
- w >= TAU: in ``alone`` mean ACT >= (20 + 43.75 + 15) / 16 = 4.92 s, 1.32x ``fixed:4``'s.

So the least a deterministic online policy can be beaten by on one of them is 1.30x: the
target is out of reach of any such policy on a family holding instances like these, and
the benchmark's >20% share measures how often the family draws one (docs/core.md, issue 11).
The test checks the twins' common past, replays every baseline, and asserts the bounds.
"""

from pathlib import Path

import numpy as np
import pytest

from tangram.bench.robustness import BASELINES
from tangram.core.cluster_file import load_cluster
from tangram.sim.config import SimConfig
from tangram.sim.demand import expected_demand
from tangram.sim.driver import simulate
from tangram.trace.files import load_trace

CASES = Path(__file__).parent / "gpu"
TWINS = ("online_twin_alone", "online_twin_crowd")
#: The twins differ from this instant on.
TAU = 20.0
LONG = "s0-t00000-a000"
T1, SERIAL, WIDTHS = 100.0, 0.25, (1, 2, 4)
SHORT_S, CROWD = 1.0, 15
#: Issue 11's target: no baseline beats the default by more than this.
TARGET = 1.20


def duration(k: int) -> float:
    """A's run on k GPUs (Amdahl, as the trace's curve)."""
    return T1 * (SERIAL + (1.0 - SERIAL) / k)


def load(case: str):
    return load_trace(CASES / f"{case}.jsonl"), load_cluster(CASES / f"{case}.toml")


def mean_act(case: str, policy: str, warm: bool | str) -> float:
    trace, cluster = load(case)
    result = simulate(trace, cluster, SimConfig(policy=policy, timeline=False, warm_gpus=warm))
    assert all(r.outcome == "result" for r in result.actions)
    return float(np.mean([r.finish - r.arrival for r in result.actions]))


def online_lower_bounds(k: int | None) -> dict[str, float]:
    """Mean ACT no schedule can beat on each twin once A starts on ``k`` GPUs before TAU
    (None: A starts at TAU or later). Every call takes at least its fastest run after its
    arrival; in ``crowd`` a 4-GPU A leaves no GPU to the crowd until it is done."""
    n = CROWD + 1
    if k is None:
        return {"online_twin_alone": (TAU + duration(4) + CROWD * SHORT_S) / n}
    alone = (duration(k) + CROWD * SHORT_S) / n
    crowd_wait = duration(k) - TAU if k == max(WIDTHS) else 0.0
    crowd = (duration(k) + CROWD * (crowd_wait + SHORT_S)) / n
    return {"online_twin_alone": alone, "online_twin_crowd": crowd}


def test_the_twins_share_their_past_until_tau():
    (alone, cluster_a), (crowd, cluster_c) = load(TWINS[0]), load(TWINS[1])
    assert cluster_a == cluster_c
    assert expected_demand(alone, cluster_a) == expected_demand(crowd, cluster_c)
    assert alone.rows[0] == crowd.rows[0] and alone.rows[0].action_id == LONG
    # Every other trajectory's only call arrives at TAU or later (first actions arrive at
    # their gen_before_s), and is the same call in both.
    for a, c in zip(alone.rows[1:], crowd.rows[1:], strict=True):
        assert a.gen_before_s >= TAU and c.gen_before_s == TAU
        assert a.action_id == c.action_id and a.t1_s == c.t1_s == SHORT_S
        assert a.max_units == c.max_units == 1
    assert len(alone.rows) == CROWD + 1


@pytest.mark.parametrize("warm", [True, "plan"])
def test_every_online_start_of_the_long_call_loses_by_more_than_20_percent_on_a_twin(warm):
    best = {case: min(mean_act(case, p, warm) for p in BASELINES) for case in TWINS}
    # The baselines' figures the docstring's arithmetic uses (warm once: fixed:4 restores
    # A on 4 GPUs in 0.202 s; fixed:2 runs the crowd on the GPUs A leaves).
    if warm is True:
        assert best["online_twin_alone"] == pytest.approx(3.726, abs=1e-3)
        assert best["online_twin_crowd"] == pytest.approx(8.545, abs=1e-3)
    worst_case = {}
    for k in (*WIDTHS, None):
        bounds = online_lower_bounds(k)
        worst_case[k] = max(bounds[case] / best[case] for case in bounds)
    assert min(worst_case.values()) > TARGET, worst_case


@pytest.mark.parametrize("policy", ["tangram", "tangram-paper"])
def test_the_policies_lose_on_one_twin_as_the_bound_says(policy):
    # Both start A at once on 4 GPUs (optimal alone) and the crowd waits for it.
    best = {case: min(mean_act(case, p, True) for p in BASELINES) for case in TWINS}
    ratios = {case: mean_act(case, policy, True) / best[case] for case in TWINS}
    assert ratios["online_twin_alone"] == pytest.approx(1.0, abs=1e-6)
    assert ratios["online_twin_crowd"] > 3.0
