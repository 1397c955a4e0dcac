"""Hand-written CPU cases (issue 11): the default ``tangram`` handles each, ``tangram-paper``
still shows the defect. Traces and clusters live in ``tests/mechanisms/cpu/``; replay one with
``tangram sim --trace tests/mechanisms/cpu/X.jsonl --cluster tests/mechanisms/cpu/X.toml``.

Every action is Amdahl with serial fraction 0 (d(k) = t1 / k); AOE's grant and container
start overheads are set to 0 so the arithmetic is the schedule's alone.
"""

from dataclasses import replace
from pathlib import Path

import numpy as np
import pytest

from tangram.core.cluster_file import load_cluster
from tangram.sim.config import Overheads, SimConfig
from tangram.sim.driver import simulate
from tangram.trace import Trace
from tangram.trace.files import load_trace

CASES = Path(__file__).parent / "cpu"
NO_OVERHEAD = Overheads(aoe_grant_s=0.0, container_start_s=0.0)


def replay(case: str, policy: str) -> tuple[dict[str, float], float]:
    """Each action's ACT and the step time."""
    trace = load_trace(CASES / f"{case}.jsonl")
    cluster = load_cluster(CASES / f"{case}.toml")
    result = simulate(trace, cluster, SimConfig(policy=policy, overheads=NO_OVERHEAD))
    assert all(r.outcome == "result" for r in result.actions)
    acts = {r.row.action_id: r.finish - r.arrival for r in result.actions}
    (step,) = result.steps
    return acts, step.end - step.start


def test_a_burst_larger_than_the_window_starts_at_once():
    # 96 one-core actions of 10 s arrive together on a 256-core node. The paper's window takes
    # 32 candidates per pass: 32 start at 0, the other 64 at the next event (t = 10), mean
    # (32 x 10 + 64 x 20) / 96 = 16.67 s. The default sizes the window from the 256 free cores:
    # all 96 start at 0, mean 10 s.
    paper, _ = replay("burst_window", "tangram-paper")
    default, _ = replay("burst_window", "tangram")
    assert np.mean(list(paper.values())) == pytest.approx(50 / 3)
    assert np.mean(list(default.values())) == pytest.approx(10.0)


def test_a_malleable_long_action_shrinks_for_short_arrivals_and_grows_back():
    # 16 cores. A (malleable, 160 s on one core, up to 16) arrives alone at 0 and takes all 16
    # (10 s). Fifteen one-core actions of 1 s arrive at 0.5 s.
    # Paper: DoP fixed at start, so they wait for A: 10 - 0.5 + 1 = 10.5 s each; mean
    # (10 + 15 x 10.5) / 16 = 10.47 s.
    # Default: A shrinks to one core at 0.5 s (its estimate: 1 s on 1 core then back to 16,
    # 10.44 s, against the shorts' 157.5 s of waiting), they run at once (1 s each), and A
    # grows back to 16 at 1.5 s: it did 0.5 / 10 + 1 / 160 of its work by then and the
    # rest, 0.94375 x 10 s, ends at 10.94 s; mean (10.94 + 15) / 16 = 1.62 s.
    paper, _ = replay("lone_long_malleable", "tangram-paper")
    default, step = replay("lone_long_malleable", "tangram")
    shorts = [a for a in default if not a.startswith("s0-t00000")]
    assert np.mean(list(paper.values())) == pytest.approx((10 + 15 * 10.5) / 16)
    assert all(default[a] == pytest.approx(1.0) for a in shorts)
    assert default["s0-t00000-a000"] == pytest.approx(1.5 + 0.94375 * 10)
    assert step == pytest.approx(1.5 + 0.94375 * 10)


def test_a_non_malleable_long_action_told_its_threads_shrinks_and_grows_back():
    # The same actions, A not malleable (its thread count is fixed at start). Paper: DoP
    # fixed, mean 10.47 s as above. Default: A is told 16 threads (its fastest option), so
    # its grant may shrink below them (its threads time-slice on its own cores) and grow
    # back to them: the arithmetic of the malleable case, mean 1.62 s (fixed:4: 3.6 s).
    paper, _ = replay("lone_long_fixed", "tangram-paper")
    default, step = replay("lone_long_fixed", "tangram")
    shorts = [a for a in default if not a.startswith("s0-t00000")]
    assert np.mean(list(paper.values())) == pytest.approx((10 + 15 * 10.5) / 16)
    assert all(default[a] == pytest.approx(1.0) for a in shorts)
    assert step == pytest.approx(1.5 + 0.94375 * 10)


def test_a_non_malleable_action_told_its_threads_grows_rather_than_running_on_one():
    # 16 cores; fifteen one-core actions of 2 s start at 0. At 0.1 s A (not malleable, 100 s
    # on one core, up to 16) arrives to one free core.
    # Paper: it starts on that core and runs 100 s: ACT 100 s, step 100.1 s.
    # Default: it starts on that core told 16 threads; when the others end at 2 s it grows to
    # 16 cores, having done 1.9 / 100 of its work; the rest takes 0.981 x 100 / 16 =
    # 6.13125 s: ACT 8.03125 s, step 8.13125 s (fixed:16 waits: ACT 8.15 s). (Where the
    # driver cannot resize, it waits for the 16 cores instead: ``waits``, the same 8.15 s.)
    paper, paper_step = replay("wait_for_cores", "tangram-paper")
    default, step = replay("wait_for_cores", "tangram")
    assert paper["s0-t00015-a000"] == pytest.approx(100.0)
    assert default["s0-t00015-a000"] == pytest.approx(1.9 + 0.981 * 100 / 16)
    assert step == pytest.approx(2.0 + 0.981 * 100 / 16)
    assert paper_step / step > 12


def test_a_serial_phase_lends_its_idle_core_to_a_queued_action():
    # 2 cores. B (not malleable, 40 s on one core, serial fraction 0.5, up to 2) arrives alone
    # at 0 and takes both: 40 x (0.5 + 0.5 / 2) = 30 s, a serial phase of 20 s on one thread
    # then 20 core-s on two. A (10 s on one core) arrives at 1 s.
    # Paper: B's DoP is fixed; A waits for it: ACT 29 + 10 = 39 s.
    # Exclusive cores (``tangram-exclusive``): B shrinks to one core for A; from 1 s to 11 s
    # it runs at its one-core rate (1/40 per s), having done 1/30 by 1 s, so 0.71667 of it is
    # left at 11 s, 0.71667 x 30 = 21.5 s on two cores: B ends at 32.5 s.
    # Default: B's grant is a CFS weight; its serial phase keeps one core busy whatever its
    # grant, so A runs on the other (1-11 s) without slowing B, whose parallel phase runs on
    # both cores from 20 s: B ends at 30 s, A's ACT is 10 s. Mean (30 + 10) / 2 = 20 s
    # (exclusive: 21.25 s; paper: 34.5 s).
    paper, _ = replay("lend_idle_cycles", "tangram-paper")
    exclusive, _ = replay("lend_idle_cycles", "tangram-exclusive")
    default, step = replay("lend_idle_cycles", "tangram")
    a, b = "s0-t00001-a000", "s0-t00000-a000"
    assert paper[a] == pytest.approx(39.0)
    assert exclusive[a] == pytest.approx(10.0)
    assert exclusive[b] == pytest.approx(1 + 10 + (1 - 1 / 30 - 10 / 40) * 30)
    assert default[a] == pytest.approx(10.0)
    assert default[b] == pytest.approx(30.0)
    assert step == pytest.approx(30.0)


def test_trajectories_under_way_go_before_newcomers():
    # One core; every action 10 s on it, and 1 s of generation between a trajectory's two
    # actions. A and B send their first action at 0, C at 0.5 (a newcomer: none of its actions
    # has run). A1 runs 0-10, B1 10-20 (A2 arrives at 11).
    # Paper (FCFS): C1 (0.5) before A2 (11): C1 20-30, A2 30-40, B2 40-50, C2 (arrived 31)
    # 50-60. ACTs 10, 20, 29.5, 29, 29, 29: mean 24.42 s; every trajectory stays alive to the end.
    # Default: at 20, A2 (A is under way) goes before C1, then B2 (21): A2 20-30, B2 30-40,
    # C1 40-50, C2 51-61. ACTs 10, 20, 19, 19, 49.5, 10: mean 21.25 s. C1 is held: its 10 s
    # are no more than the 19.5 s the node needs for the other work in view when it arrives
    # (B1's 10 s and A1's 9.5 s left, one core). Step 61 s against 60.
    paper, paper_step = replay("continuation_first", "tangram-paper")
    default, step = replay("continuation_first", "tangram")
    assert np.mean(list(paper.values())) == pytest.approx((10 + 20 + 29.5 + 3 * 29) / 6)
    assert default["s0-t00002-a000"] == pytest.approx(49.5)
    assert default["s0-t00000-a001"] == pytest.approx(19.0)
    assert np.mean(list(default.values())) == pytest.approx(21.25)
    assert (paper_step, step) == (pytest.approx(60.0), pytest.approx(61.0))


def test_a_newcomer_longer_than_the_nodes_drain_is_not_held():
    # As above, but C's first action takes 40 s: more than the 19.5 s the node needs for the
    # other work in view when it arrives at 0.5 (B1's 10 s and A1's 9.5 s left, one core),
    # so it may be its step's critical path and holding it would end the step late by the
    # wait. It is not held: at 10 it goes before B1 (a newcomer, held: its 10 s are less than
    # the 49.5 s of other work) and starts at 10, where a held C1 would wait for A2, B1 and
    # B2 and start at 40.
    trace = load_trace(CASES / "continuation_first.jsonl")
    rows = [replace(r, t1_s=40.0) if r.action_id == "s0-t00002-a000" else r for r in trace.rows]
    cluster = load_cluster(CASES / "continuation_first.toml")
    config = SimConfig(policy="tangram", overheads=NO_OVERHEAD)
    result = simulate(Trace(tuple(rows), trace.meta), cluster, config)
    start = {r.row.action_id: r.start for r in result.actions}
    assert start["s0-t00002-a000"] == pytest.approx(10.0)
    assert start["s0-t00001-a000"] > start["s0-t00000-a001"]  # B1 held behind A2
