"""Malleable CPU grants (issue 11): a running malleable action's cores grow and shrink.

The harness (tests/core/harness.py) runs actions exactly as estimated, integrates a resized
action's progress grant by grant, checks every invariant after each event (no core granted
twice or both granted and free, tallies agree), and asserts that each resized action's shares
of work done add up to exactly its work when it ends.
"""

from dataclasses import replace

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from tangram.core import Action, Amdahl, ClusterSpec, CpuNodeSpec, ResourceKind, Scheduler
from tangram.core.decision import Resize
from tangram.core.policies import cpu_order, make_policy
from tangram.core.state import CapacityError
from tests.core.harness import run

NODE = ClusterSpec("one", cpu_nodes=(CpuNodeSpec("n", 8, 2, 64.0),))


def cpu(aid: str, t1: float, units: int, *, at: float = 0.0, s: float = 0.0, m: bool = True):
    return Action(
        aid, aid, ResourceKind.CPU, Amdahl(t1, s), arrival=at, max_units=units, malleable=m
    )


def test_a_malleable_action_grows_into_cores_freed_after_it_started():
    # 8 cores. A (malleable, 40 s on one core, up to 8) and B (not malleable, 4 s on one
    # core, up to 4) arrive at 0: the marginal split gives A 6 cores (6.67 s) and B 2 (2 s).
    # B ends at 2 s: A grows to 8, having done 2 / 6.67 = 0.3 of its work; the rest,
    # 0.7 x 5 s, ends at 5.5 s.
    out = run(NODE, "tangram", [cpu("A", 40.0, 8), cpu("B", 4.0, 4, m=False)])
    assert ("Resize", "A", 8, "n") in out.log
    assert out.finished["A"] == pytest.approx(5.5)


def test_the_paper_policy_never_resizes():
    out = run(NODE, "tangram-paper", [cpu("A", 40.0, 8), cpu("B", 4.0, 4, m=False)])
    assert not [e for e in out.log if e[0] == "Resize"]
    assert out.finished["A"] == pytest.approx(40.0 / 6)  # its start grant to the end


def test_a_non_malleable_action_told_more_threads_grows_to_them_and_no_further():
    # The same as above with A not malleable: it starts on 6 cores told 8 threads (its
    # fastest option), B on 2 told 4. B ends at 2 s and A grows to its 8 threads: 5.5 s.
    out = run(NODE, "tangram", [cpu("A", 40.0, 8, m=False), cpu("B", 4.0, 4, m=False)])
    assert (out.started["A"].units, out.started["A"].threads) == (6, 8)
    assert (out.started["B"].units, out.started["B"].threads) == (2, 4)
    assert [e for e in out.log if e[0] == "Resize"] == [("Resize", "A", 8, "n")]
    assert out.finished["A"] == pytest.approx(5.5)


def test_a_non_malleable_action_grows_no_further_than_it_was_told():
    sched = Scheduler(NODE, make_policy("tangram"), resizable=True)
    starts = sched.submit_many([cpu("A", 40.0, 8, m=False), cpu("B", 4.0, 4, m=False)], 0.0)
    b = next(d for d in starts if d.action.id == "B")
    from tangram.core.resize import resize_action

    with pytest.raises(CapacityError, match="cannot run on 5 cores"):
        resize_action(sched, sched.running["B"], b.threads + 1, "past its threads", 1.0)


def test_non_malleable_actions_at_their_fastest_are_told_that_and_never_resized():
    # Uncontended, each gets its fastest option (4 of the 8 cores), told 4 threads: nothing
    # queues, and neither can grow past its threads.
    out = run(NODE, "tangram", [cpu("B", 4.0, 4, m=False), cpu("C", 4.0, 4, m=False)])
    assert out.started["B"].threads == 4 and out.started["C"].threads == 4
    assert not [e for e in out.log if e[0] == "Resize"]


def test_a_scheduler_whose_driver_cannot_resize_gets_no_resize():
    sched = Scheduler(NODE, make_policy("tangram"))  # resizable=False: the default
    decisions = sched.submit_many([cpu("A", 40.0, 8), cpu("B", 4.0, 4, m=False)], 0.0)
    decisions += sched.finish("B", 1.0)
    assert not [d for d in decisions if isinstance(d, Resize)]


def test_a_resize_keeps_the_lowest_cores_when_shrinking_and_moves_the_estimate():
    sched = Scheduler(NODE, make_policy("tangram"), resizable=True)
    (start,) = sched.submit(cpu("A", 80.0, 8), 0.0)
    assert start.units == 8  # alone: all 8 cores, 10 s
    from tangram.core.resize import resize_action

    running = sched.running["A"]
    shrunk = resize_action(sched, running, 2, "test", 5.0)
    assert shrunk.cores == tuple(sorted(start.cores)[:2]) and shrunk.previous == 8
    # Half its work was done at 5 s; the other half on 2 cores takes 0.5 x 40 s.
    assert sched.running["A"].est_finish == pytest.approx(25.0)
    assert sched.state.cpu["n"].free_cores == 6
    with pytest.raises(CapacityError):
        resize_action(sched, sched.running["A"], 9, "too many", 5.0)


@st.composite
def malleable_workloads(draw):
    cores = draw(st.sampled_from([2, 4, 8, 16]))
    cluster = ClusterSpec("m", cpu_nodes=(CpuNodeSpec("n", cores, 2 if cores >= 4 else 1, 64.0),))
    actions = [
        cpu(
            f"a{i}",
            draw(st.floats(0.1, 20.0)),
            draw(st.integers(1, 16)),
            at=draw(st.integers(0, 8)) / 2,
            s=draw(st.sampled_from([0.0, 0.1, 0.5, 1.0])),
            m=draw(st.booleans()),
        )
        for i in range(draw(st.integers(1, 12)))
    ]
    return cluster, actions


@settings(max_examples=150, deadline=None)
@given(malleable_workloads())
def test_grants_that_grow_and_shrink_keep_every_invariant(instance):
    # After every event: no core granted twice, none both granted and free, the tallies agree
    # (harness.check_invariants); each resized action's work adds up to its whole work when it
    # ends (harness); every action ends (no starvation), each started once; and the same
    # events give the same decisions, resizes included.
    cluster, actions = instance
    out = run(cluster, "tangram", actions)
    assert set(out.finished) == {a.id for a in actions}
    assert out.log == run(cluster, "tangram", actions).log
    # No action, resized or not, ends before its fastest possible time.
    for a in actions:
        fastest = min(a.curve.duration(k) for k in range(1, min(a.max_units, 16) + 1))
        assert out.finished[a.id] - a.arrival >= fastest - 1e-9


def test_shortest_first_passes_a_long_action_only_within_a_quarter_of_its_duration():
    # One core. B holds it from 0 to 200 s. L (100 s) queues at 0.5 s, S (1 s) at 5 s,
    # T (1 s) at 20 s, all of B's trajectory (under way: no newcomer's stretch; cpu_order).
    # Keys (arrival + min(0.25 x duration, 10 s)): L 10.5, S 5.25, T 20.25.
    # When B ends at 200: S runs (200-201), then L (201-301), then T (301-302): T arrived
    # after L's key (its quarter, 25 s, is capped at 10 s), so it does not pass L; under FCFS
    # (the paper) S would run after L.
    one = ClusterSpec("one", cpu_nodes=(CpuNodeSpec("n", 1, 1, 64.0),))
    acts = [
        replace(cpu(aid, t1, 1, at=at, m=False), trajectory="B")
        for aid, t1, at in (("B", 200.0, 0.0), ("L", 100.0, 0.5), ("S", 1.0, 5.0), ("T", 1.0, 20.0))
    ]
    out = run(one, "tangram", acts)
    assert [out.finished[a] for a in "SLT"] == pytest.approx([201.0, 301.0, 302.0])
    paper = run(one, "tangram-paper", acts)
    assert [paper.finished[a] for a in "LST"] == pytest.approx([300.0, 301.0, 302.0])
    assert out.finished["L"] - 0.5 < 1.0 + 100.0 + (200.0 - 0.5) + 1e-9  # passed once, by S
    assert cpu_order.AGING_CAP_S == 10.0
    assert cpu_order.AGING == 0.25  # (the keys above)
