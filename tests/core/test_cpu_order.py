"""The default CPU rule's queue order (``policies/cpu_order.py``): trajectories under way
before newcomers, the rule forgets a trajectory when it closes, and an order kept between passes
decides what a fresh sort does."""

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from tangram.core import Action, Amdahl, ClusterSpec, CpuNodeSpec, ResourceKind, Scheduler
from tangram.core.decision import Start
from tangram.core.policies import cpu_order, make_policy

from .harness import run
from .test_policy_properties import instances

ONE = ClusterSpec("one", cpu_nodes=(CpuNodeSpec("n", 1, 1, 64.0),))


def act(aid: str, traj: str, at: float, t1: float = 10.0) -> Action:
    return Action(aid, traj, ResourceKind.CPU, Amdahl(t1, 0.0), arrival=at, max_units=1)


def started(decisions) -> list[str]:
    return [d.action.id for d in decisions if isinstance(d, Start)]


def test_a_continuing_action_passes_an_older_newcomer_and_closed_trajectories_are_forgotten():
    policy = make_policy("tangram")
    sched = Scheduler(ONE, policy, resizable=True)
    for traj in ("A", "B", "C"):
        sched.open_trajectory(traj, 0.0, memory_gb=1.0)
    assert started(sched.advance(0.0, arrived=[act("a1", "A", 0.0), act("b1", "B", 0.0)])) == ["a1"]
    assert started(sched.advance(10.0, finished=["a1"])) == ["b1"]  # (no continuation waits)
    sched.advance(10.5, arrived=[act("c1", "C", 10.5)])  # C is a newcomer
    sched.advance(11.0, arrived=[act("a2", "A", 11.0)])  # A is under way
    assert started(sched.advance(20.0, finished=["b1"])) == ["a2"]  # a2 before the older c1
    continuation = policy.rules["cpu"].continuation
    assert continuation.begun == {"A", "B"}
    sched.advance(30.0, finished=["a2"])
    sched.close_trajectory("A", 30.0)
    assert continuation.begun == {"B", "C"}  # A forgotten; c1 started at 30


def test_the_papers_policy_keeps_fcfs():
    sched = Scheduler(ONE, make_policy("tangram-paper"), resizable=True)
    for traj in ("A", "B", "C"):
        sched.open_trajectory(traj, 0.0, memory_gb=1.0)
    sched.advance(0.0, arrived=[act("a1", "A", 0.0), act("b1", "B", 0.0)])
    sched.advance(10.0, finished=["a1"])
    sched.advance(10.5, arrived=[act("c1", "C", 10.5)])
    sched.advance(11.0, arrived=[act("a2", "A", 11.0)])
    assert started(sched.advance(20.0, finished=["b1"])) == ["c1"]


def test_a_trajectorys_parallel_first_actions_stop_being_newcomers_when_one_starts():
    # A sends two actions at once (parallel tool calls) while B's runs; C is a newcomer that
    # arrived before them. When a1 starts, a2 belongs to a trajectory under way and goes
    # before C's first action.
    sched = Scheduler(ONE, make_policy("tangram"), resizable=True)
    for traj in ("A", "B", "C"):
        sched.open_trajectory(traj, 0.0, memory_gb=1.0)
    assert started(sched.advance(0.0, arrived=[act("b1", "B", 0.0)])) == ["b1"]
    sched.advance(0.5, arrived=[act("c1", "C", 0.5)])
    sched.advance(1.0, arrived=[act("a1", "A", 1.0, t1=1.0), act("a2", "A", 1.0)])
    assert started(sched.advance(10.0, finished=["b1"])) == ["a1"]  # shortest of the newcomers
    assert started(sched.advance(11.0, finished=["a1"])) == ["a2"]  # A under way: before c1


@st.composite
def busy_node(draw) -> tuple[ClusterSpec, list[Action]]:
    """One small node and a queue that outgrows it: many short and long actions of a few
    trajectories, arriving over a few seconds (the queue's head changes, grows, or stays)."""
    cores = draw(st.integers(1, 3))
    cluster = ClusterSpec("busy", cpu_nodes=(CpuNodeSpec("n", cores, 1, 64.0),))
    n = draw(st.integers(4, 30))
    trajectories = draw(st.integers(1, 6))
    actions = [
        Action(
            f"a{i}",
            f"t{draw(st.integers(0, trajectories - 1))}",
            ResourceKind.CPU,
            Amdahl(draw(st.sampled_from([0.25, 1.0, 4.0, 16.0])), draw(st.sampled_from([0, 0.5]))),
            arrival=draw(st.integers(0, 12)) * 0.5,
            max_units=draw(st.integers(1, cores)),
            malleable=draw(st.booleans()),
        )
        for i in range(n)
    ]
    return cluster, actions


@settings(max_examples=150, deadline=None)
@given(instance=st.one_of(busy_node(), instances()), lookahead=st.integers(1, 4))
def test_a_reused_order_decides_what_a_fresh_sort_decides(instance, lookahead):
    """The shortest-first order kept between passes (``KeyOrder.still_holds``) gives the same
    decisions as sorting the head afresh every pass; a short head makes queues longer than it
    (pushes behind a full head) common on small instances."""
    cluster, actions = instance
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(cpu_order, "LOOKAHEAD", lookahead)
        reused = run(cluster, "tangram", actions)
        patch.setattr(cpu_order.KeyOrder, "still_holds", lambda self, queue, keys: False)
        fresh = run(cluster, "tangram", actions)
    assert reused.log == fresh.log
    assert reused.started == fresh.started
