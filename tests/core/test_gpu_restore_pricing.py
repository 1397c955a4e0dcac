"""What the default GPU rule charges a call for a restore, against waiting for its service's
own busy copy (``elastic_gpu._RobustPass.hold`` and ``start_cost``)."""

from __future__ import annotations

from tangram.core import ClusterSpec
from tangram.core.action import Action
from tangram.core.curves import Amdahl
from tangram.core.decision import Defer, Start
from tangram.core.policies import make_policy
from tangram.core.resources import GpuNodeSpec, ResourceKind
from tangram.core.scheduler import Scheduler

NODE = GpuNodeSpec("g0", 4, 80.0, 500.0, h2d_gbps=20.0, restore_fixed_s=0.1)


def call(name: str, service: str, size_gb: float, max_units: int, t1: float) -> Action:
    return Action(
        name, f"t-{name}", ResourceKind.GPU, Amdahl(t1, 0.2),
        service=service, service_size_gb=size_gb, max_units=max_units,
    )  # fmt: skip


def test_a_size_with_no_free_cell_is_not_a_cheap_restore():
    """GPU 0 holds "a" (20 GB), GPU 1 "b" (78 GB, whole), GPUs 2-3 "c" (156 GB, sharded);
    "b" and "c" were just called, so each is its service's only copy, in use. A 2-s call of
    "a" runs on GPU 0 from t=1; another "a" call (1 s) arrives at 1.2.

    Waiting for GPU 0: free at 3.0, then 1 s: done at 4.0 (2.8 s from now). A restore on
    GPUs 2-3 evicts "c": 20 GB over two links (0.6 s) plus "c"'s 3.9 s restore charged, plus
    the call: 5.1 s. A restore on all four GPUs would be cheap (0.35 s) but there is no free
    4-GPU cell: priced as if there were, it won the comparison, and the round then restored
    "a" over "c" on the 2-GPU cell that was free. The call waits."""
    sched = Scheduler(ClusterSpec("g", gpu_nodes=(NODE,)), make_policy("tangram"))
    sched.report_residency("g0", (0,), "a", True)
    sched.report_residency("g0", (1,), "b", True)
    sched.report_residency("g0", (2, 3), "c", True)
    warm = sched.submit_many([call("b0", "b", 78.0, 1, 0.5), call("c0", "c", 156.0, 2, 0.5)], 0.0)
    assert all(isinstance(d, Start) and not d.restore for d in warm)
    sched.finish_many(["b0", "c0"], 1.0)
    [first] = sched.submit(call("a1", "a", 20.0, 4, 2.0), 1.0)
    assert isinstance(first, Start) and first.gpus == (0,) and not first.restore
    [second] = sched.submit(call("a2", "a", 20.0, 4, 1.0), 1.2)
    assert isinstance(second, Defer), second
    assert "waits" in second.reason and "cell holding a" in second.reason
    node = sched.state.gpu["g0"]
    assert node.is_resident("b", (1,)) and node.is_resident("c", (2, 3))


def test_a_copy_resident_before_its_first_call_is_charged_when_a_restore_evicts_it():
    """GPU 0 holds "warm" (70 GB, resident from before the run, never called); GPU 1 "x"
    (40 GB). A 3-s call of "x" runs on GPU 1 from t=0; a 1-s call of "x" arrives at 0.5.

    Waiting for GPU 1: free at 3.0, then 1 s (3.5 s from now). Restoring "x" on GPU 0 takes
    40 GB / 20 GB/s + 0.1 = 2.1 s and evicts "warm", whose own restore (70 / 20 + 0.1 = 3.6 s)
    is charged as a service's about to be called: 6.7 s with the call. The call waits. When
    the core took the size of a service from its calls alone, "warm" counted as taking no
    memory, its eviction cost nothing, and the 3.1-s restore won."""
    node = GpuNodeSpec("g0", 2, 80.0, 500.0, h2d_gbps=20.0, restore_fixed_s=0.1)
    sched = Scheduler(ClusterSpec("g", gpu_nodes=(node,)), make_policy("tangram"))
    sched.report_residency("g0", (0,), "warm", True, 70.0)
    sched.report_residency("g0", (1,), "x", True, 40.0)

    def one_gpu(name: str, t1: float) -> Action:
        return call(name, "x", 40.0, 1, t1)

    [first] = sched.submit(one_gpu("x0", 3.0), 0.0)
    assert isinstance(first, Start) and first.gpus == (1,) and not first.restore
    [second] = sched.submit(one_gpu("x1", 1.0), 0.5)
    assert isinstance(second, Defer), second
    assert "waits" in second.reason and "cell holding x" in second.reason
    assert sched.state.gpu["g0"].is_resident("warm", (0,))


def test_the_size_an_executor_reports_is_the_memory_an_uncalled_copy_takes():
    """A restore of 60 GB onto an 80-GB GPU holding an uncalled 70-GB copy evicts it; a copy
    reported without a size (an executor that does not know it) still counts as none."""
    from tangram.core.policies.gpu_cost import ServiceLoad, evicted_by

    sched = Scheduler(ClusterSpec("g", gpu_nodes=(NODE,)), make_policy("tangram"))
    sched.report_residency("g0", (0,), "sized", True, 70.0)
    sched.report_residency("g0", (1,), "unsized", True)
    node, load = sched.state.gpu["g0"], ServiceLoad()
    assert evicted_by(node, (0,), "new", 60.0, load) == {"sized": 1}
    assert evicted_by(node, (1,), "new", 60.0, load) == {}
