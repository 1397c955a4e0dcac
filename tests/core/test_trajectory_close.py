"""A trajectory's container (its memory, a static pod's cores) against the actions in it:
freed only once none of them runs, and never leaving one queued without a container."""

import pytest

from tangram.core import (
    Action,
    ApiEndpointSpec,
    ClusterSpec,
    CpuNodeSpec,
    GpuNodeSpec,
    Inelastic,
    Reject,
    ResourceKind,
    Scheduler,
    Start,
    make_policy,
)
from tangram.core.decision import Decision
from tangram.core.loop import DriverLoop

TWO_CORES = ClusterSpec("two", (CpuNodeSpec("n", 2, 1, 16.0),))


def cpu(aid, traj, memory_gb=1.0, units=2):
    return Action(aid, traj, ResourceKind.CPU, Inelastic(1.0), max_units=units, memory_gb=memory_gb)


def api(aid, traj):
    return Action(aid, traj, ResourceKind.API, Inelastic(1.0), service="s")


def _snapshot(sched):
    node = sched.state.cpu["n"]
    return (
        {aid: r.start for aid, r in sched.running.items()},
        {d: list(q) for d, q in sched.queues.items()},
        [list(d) for d in node.free_by_numa],
        node.free_cores,
        node.memory_free_gb,
        node.containers,
        sched.state.held_cores,
        dict(sched.trajectories),
        sched.now,
    )


def _pod_held_by_a_running_action():
    """k8s-static:2 on 2 cores: A's pod runs a1; B opened, waits for a pod, b1 queued."""
    sched = Scheduler(TWO_CORES, make_policy("k8s-static:2"))
    sched.open_trajectory("A", 0.0, memory_gb=1.0)
    sched.open_trajectory("B", 0.0, memory_gb=1.0)
    [a1] = sched.submit(cpu("a1", "A"), 0.0)
    assert a1.in_slot and a1.cores == (0, 1)
    assert sched.submit(cpu("b1", "B"), 0.0) == []
    return sched, a1


def test_a_close_while_an_action_runs_in_the_pod_is_refused_changing_nothing():
    """k8s-static: a close with a1 still running in A's pod gave the pod's cores to B's pod,
    and b1 started on the cores a1 was running on (two actions on cores (0, 1))."""
    sched, a1 = _pod_held_by_a_running_action()
    before = _snapshot(sched)
    with pytest.raises(ValueError, match=r"'A'.*a1.*run"):
        sched.close_trajectory("A", 0.5)
    assert _snapshot(sched) == before
    assert sched.finish("a1", 1.0) == []  # (A's pod stays held while A is open)
    [b1] = sched.close_trajectory("A", 1.0)
    assert b1.action.id == "b1" and b1.cores == a1.cores and b1.time == 1.0


def test_a_close_while_an_action_runs_in_the_container_is_refused():
    """tangram: a close with a1 running freed A's container memory, and B's container (which
    waited for it) was placed and b1 started in memory a1's container still used."""
    sched = Scheduler(TWO_CORES, make_policy("tangram"))
    [a1] = sched.submit(cpu("a1", "A", memory_gb=10.0, units=1), 0.0)
    assert sched.submit(cpu("b1", "B", memory_gb=10.0, units=1), 0.0) == []  # waits for memory
    before = _snapshot(sched)
    with pytest.raises(ValueError, match=r"'A'.*a1.*run"):
        sched.close_trajectory("A", 0.5)
    with pytest.raises(ValueError, match=r"'A'.*a1.*run"):
        sched.close_trajectory("A", 0.5, opened=False)
    assert _snapshot(sched) == before
    sched.finish("a1", 1.0)
    [b1] = sched.close_trajectory("A", 1.0)
    assert b1.action.id == "b1"


class _Host:
    def __init__(self) -> None:
        self.decisions: list[Decision] = []
        self.start = self.reject = self.defer = self.decisions.append

    resize = handed = settled = request_flush = arm_wakeup = None

    def pass_failed(self, arrived, finished, error):
        raise error


def test_the_simulators_close_before_its_buffered_finish_decides_as_before():
    """The simulator closes a trajectory as its last action ends, that action's finish still
    buffered in the loop for the instant's pass: the loop tells the core that finish is held
    (``ended``), so the close is taken and decides as it always did."""
    sched, a1 = _pod_held_by_a_running_action()
    host = _Host()
    loop = DriverLoop(sched, host)  # type: ignore[arg-type]
    loop.finish("a1")
    loop.close_trajectory("A", 1.0)
    [b1] = host.decisions
    assert isinstance(b1, Start) and b1.action.id == "b1" and b1.cores == a1.cores
    loop.flush(1.0)
    assert set(sched.running) == {"b1"} and sched.state.cpu["n"].free_cores == 0


def test_an_undone_open_rejects_its_queued_cpu_actions_and_keeps_its_labelled_calls():
    """close_trajectory(opened=False) of a bound trajectory freed its container but left its
    queued CPU action queued: it then started on the node with no container (no memory held
    for it, the trajectory unknown to the core). It is rejected, saying why; work of other
    kinds labelled with the id keeps its place."""
    cluster = ClusterSpec("one", (CpuNodeSpec("n", 1, 1, 16.0),), apis=(ApiEndpointSpec("s", 1),))
    sched = Scheduler(cluster, make_policy("tangram"))
    assert sched.open_trajectory("A", 0.0, memory_gb=4.0) == "n"
    [z] = sched.submit(cpu("z", "Z", units=1), 0.0)
    [_] = sched.submit(api("q0", "A"), 0.0)
    assert sched.submit_many([cpu("a1", "A", units=1), api("q1", "A")], 0.0) == []
    [r] = sched.close_trajectory("A", 1.0, opened=False)
    assert isinstance(r, Reject) and r.action.id == "a1" and "container" in r.reason
    assert sched.state.cpu["n"].memory_free_gb == pytest.approx(16.0 - 1.0)  # (z's)
    assert "q1" in sched.domain_of and "a1" not in sched.domain_of
    assert sched.finish("z", 2.0) == []
    assert [d.action.id for d in sched.finish("q0", 2.0)] == ["q1"]


def test_a_later_action_waits_behind_its_trajectorys_action_waiting_for_memory():
    """a1 (10 GB) waited for its trajectory's container; a2 (1 GB) of the same trajectory
    placed the container at 1 GB and started ahead of it (FCFS within the trajectory broken;
    a1 then had to grow the container, or was rejected when the node could not). a2 waits
    behind a1, and both start in arrival order once the container is placed."""
    sched = Scheduler(TWO_CORES, make_policy("tangram"))
    assert sched.open_trajectory("Z", 0.0, memory_gb=10.0) == "n"
    assert sched.submit(cpu("a1", "A", memory_gb=10.0, units=1), 0.0) == []
    assert sched.submit(cpu("a2", "A", memory_gb=1.0, units=1), 1.0) == []
    assert sched.queued == 2 and sched.trajectories["A"].node is None
    decided = sched.close_trajectory("Z", 2.0)
    assert [d.action.id for d in decided] == ["a1", "a2"]
    assert all(isinstance(d, Start) for d in decided)
    assert sched.trajectories["A"].memory_gb == 10.0


def test_a_later_action_of_a_trajectory_opened_meanwhile_waits_behind_the_first():
    """The trajectory opened (its container placed) while a1 waited for memory: a2 took the
    placed-container shortcut and was queued ahead of a1 all the same."""
    sched = Scheduler(TWO_CORES, make_policy("tangram"))
    assert sched.open_trajectory("Z", 0.0, memory_gb=10.0) == "n"
    assert sched.submit(cpu("a1", "A", memory_gb=10.0, units=1), 0.0) == []
    assert sched.open_trajectory("A", 0.5, memory_gb=1.0) == "n"
    assert sched.submit(cpu("a2", "A", memory_gb=1.0, units=1), 1.0) == []
    decided = sched.close_trajectory("Z", 2.0)
    assert [d.action.id for d in decided] == ["a1", "a2"]


def test_an_action_behind_a_withdrawn_one_waiting_for_memory_is_admitted_at_once():
    """a2 waits behind a1 (its trajectory's, waiting for memory); a1 is withdrawn and a2,
    which fits now, is admitted by the pass after the withdrawal, not at the next close."""
    sched = Scheduler(TWO_CORES, make_policy("tangram"))
    assert sched.open_trajectory("Z", 0.0, memory_gb=10.0) == "n"
    assert sched.submit(cpu("a1", "A", memory_gb=10.0, units=1), 0.0) == []
    assert sched.submit(cpu("a2", "A", memory_gb=1.0, units=1), 1.0) == []
    assert sched.withdraw("a1", 2.0)
    [a2] = sched.after_withdrawals(2.0)
    assert isinstance(a2, Start) and a2.action.id == "a2"


def test_a_gpu_call_needing_more_host_memory_than_any_gpu_node_has_is_rejected():
    """A GPU action's memory_gb (host memory) was never read: a call asking 500 GB of host
    memory on nodes of 100 GB was queued and started. It can never run as asked: rejected at
    once, the arithmetic in the reason; one that fits any GPU node is taken as before."""
    cluster = ClusterSpec(
        "g",
        gpu_nodes=(GpuNodeSpec("g0", 2, 80.0, 100.0), GpuNodeSpec("g1", 2, 80.0, 200.0)),
    )
    sched = Scheduler(cluster, make_policy("tangram"))

    def call(aid, memory_gb):
        return Action(
            aid,
            "T",
            ResourceKind.GPU,
            Inelastic(1.0),
            service="m",
            service_size_gb=10.0,
            memory_gb=memory_gb,
        )

    [r] = sched.submit(call("big", 500.0), 0.0)
    assert isinstance(r, Reject) and "500.0 GB of host memory" in r.reason and "200.0" in r.reason
    [s] = sched.submit(call("fits", 150.0), 0.0)
    assert isinstance(s, Start)
