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
