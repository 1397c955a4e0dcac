"""A fenced node (``Scheduler.fence_node``: a driver's node that is lost or not up yet) gets
no new work: its free GPUs and container memory are held, what its running calls and closing
containers give back goes to the fence in the same step (not to a pass that starts queued
work there), and lifting the fence (``unfence_node``) frees them and starts queued work."""

from __future__ import annotations

import pytest

from tangram.core import (
    Action,
    Amdahl,
    ClusterSpec,
    CpuNodeSpec,
    GpuNodeSpec,
    ResourceKind,
    Scheduler,
    Start,
    make_policy,
)
from tangram.core.loop import DriverLoop

CLUSTER = ClusterSpec(
    "two",
    (CpuNodeSpec("a", 4, 1, 10.0), CpuNodeSpec("b", 4, 1, 10.0)),
    (GpuNodeSpec("a", 2, 80.0, 1000.0), GpuNodeSpec("b", 2, 80.0, 1000.0)),
)
HOLDER = "~lost~a"


def call(i: int) -> Action:
    return Action(
        f"g{i}",
        f"t{i}",
        ResourceKind.GPU,
        Amdahl(1.0, 0.2),
        service="rm",
        service_size_gb=10.0,
        max_units=1,
    )


def cpu(i: int, traj: str, memory_gb: float) -> Action:
    return Action(f"c{i}", traj, ResourceKind.CPU, Amdahl(1.0, 0.1), memory_gb=memory_gb)


def starts(decisions) -> dict[str, str]:
    return {d.action.id: d.node for d in decisions if isinstance(d, Start)}


@pytest.mark.parametrize("policy", ["fixed:1", "tangram", "tangram-paper"])
def test_a_fenced_gpu_node_gets_no_new_calls_its_freed_cells_go_to_the_fence(policy):
    sched = Scheduler(CLUSTER, make_policy(policy))
    first = starts(sched.submit_many([call(i) for i in range(8)], 0.0))
    assert sorted(first.values()) == ["a", "a", "b", "b"]
    on_a = [aid for aid, node in first.items() if node == "a"]
    on_b = [aid for aid, node in first.items() if node == "b"]
    sched.fence_node("a", HOLDER)
    # a's calls end (node_lost): their cells go to the fence, nothing starts there. Before
    # the fence was in the core, the pass of this very step started two queued calls on a.
    assert starts(sched.finish_many(on_a, 1.0)) == {}
    assert sched.state.gpu["a"].owner == [HOLDER, HOLDER]
    assert sched.queued == 4
    # b's calls end: the queued calls go to b.
    later = starts(sched.finish_many(on_b, 2.0))
    assert sorted(later.values()) == ["b", "b"]
    # The fence lifted: its cells are free and the rest start there at once.
    back = starts(sched.unfence_node("a", 3.0))
    assert sorted(back.values()) == ["a", "a"]
    assert sched.queued == 0 and "a" not in sched.fenced
    assert sched.unfence_node("a", 3.0) == []  # (not fenced: nothing)


def test_fencing_holds_free_gpus_and_memory_and_unfencing_gives_them_back():
    sched = Scheduler(CLUSTER, make_policy("tangram"))
    assert sched.open_trajectory("x", 0.0, memory_gb=4.0, node="a") == "a"
    sched.fence_node("a", HOLDER)
    assert sched.state.gpu["a"].owner == [HOLDER, HOLDER]
    assert sched.state.gpu["a"].free_gpus == 0
    assert sched.state.cpu["a"].memory_free_gb == pytest.approx(0.0)
    sched.fence_node("a", HOLDER)  # (again: nothing more to hold)
    assert sched.fenced_memory_gb["a"] == pytest.approx(6.0)
    with pytest.raises(ValueError, match="fenced by"):
        sched.fence_node("a", "another")
    with pytest.raises(ValueError, match="unknown node"):
        sched.fence_node("z", HOLDER)
    # x closes: its memory goes to the fence, not to the next container.
    sched.close_trajectory("x", 1.0)
    assert sched.fenced_memory_gb["a"] == pytest.approx(10.0)
    assert sched.open_trajectory("y", 1.0, memory_gb=0.0) == "b"  # (none asked: not a)
    assert sched.open_trajectory("z", 1.0, memory_gb=1.0, node="a") is None
    assert sched.unfence_node("a", 2.0) == []
    assert sched.state.gpu["a"].owner == [None, None]
    assert sched.state.cpu["a"].memory_free_gb == pytest.approx(10.0)
    assert sched.open_trajectory("w", 2.0, memory_gb=9.0) == "a"


def test_a_container_freed_on_a_fenced_node_is_not_taken_by_one_waiting_for_room():
    sched = Scheduler(CLUSTER, make_policy("tangram"))
    assert sched.open_trajectory("x", 0.0, memory_gb=8.0) == "a"
    assert sched.open_trajectory("y", 0.0, memory_gb=8.0) == "b"
    assert sched.submit(cpu(0, "w", 8.0), 0.0) == []  # no room: w's container waits
    sched.fence_node("a", HOLDER)
    # x's container (on the lost node) is closed: before the fence was in the core, w was
    # placed on a in this very step (and its container failed there).
    assert starts(sched.close_trajectory("x", 1.0)) == {}
    assert sched.queued == 1
    waiting = sched.trajectories.get("w")
    assert waiting is None or waiting.node is None
    # y closes on b: w goes there.
    assert starts(sched.close_trajectory("y", 2.0)) == {"c0": "b"}
    assert sched.trajectories["w"].node == "b"


def test_unfencing_places_a_waiting_container_and_starts_its_action_through_the_loop():
    sched = Scheduler(CLUSTER, make_policy("tangram"))
    sched.open_trajectory("x", 0.0, memory_gb=8.0, node="a")
    sched.open_trajectory("y", 0.0, memory_gb=8.0, node="b")
    sched.fence_node("a", HOLDER)
    sched.close_trajectory("x", 0.5)
    assert sched.submit(cpu(0, "w", 8.0), 1.0) == []

    started: list[Start] = []

    class Host:
        start = staticmethod(started.append)
        reject = defer = resize = handed = settled = request_flush = arm_wakeup = None

        def pass_failed(self, arrived, finished, error):
            raise error

    loop = DriverLoop(sched, Host())  # type: ignore[arg-type]
    loop.unfence_node("a", 2.0)
    assert [(d.action.id, d.node) for d in started] == [("c0", "a")]
