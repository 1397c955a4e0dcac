"""The default CPU rule's queue order (``policies/cpu_order.py``): trajectories under way
before newcomers, and the rule forgets a trajectory when it closes."""

from tangram.core import Action, Amdahl, ClusterSpec, CpuNodeSpec, ResourceKind, Scheduler
from tangram.core.decision import Start
from tangram.core.policies import make_policy

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
