"""Where a waiting call's restore leaves a copy of the service a pass asks about
(``elastic_gpu._RobustPass._released``)."""

from __future__ import annotations

import math

from tangram.core import ClusterSpec
from tangram.core.action import Action
from tangram.core.backlog import GPU_DOMAIN
from tangram.core.context import Context
from tangram.core.curves import Amdahl
from tangram.core.policies import make_policy
from tangram.core.policies.elastic_gpu import _RobustPass
from tangram.core.policies.gpu_waits import Reservation
from tangram.core.resources import GpuNodeSpec, ResourceKind
from tangram.core.scheduler import Scheduler

NODE = GpuNodeSpec("g0", 4, 80.0, 500.0, h2d_gbps=20.0, restore_fixed_s=0.1)


def _released(shards: bool, cell: tuple[int, ...]) -> dict[tuple[str, int], float]:
    """A 60-GB model "s" resident as a copy on (0, 1), every GPU busy with 1-GB "b" calls; a
    call of "s" waits for ``cell``."""
    sched = Scheduler(ClusterSpec("g", gpu_nodes=(NODE,)), make_policy("tangram"))
    sched.report_residency("g0", (0, 1) if shards else (0,), "s", True, 60.0)
    if not shards:
        sched.report_residency("g0", (1,), "s", True, 60.0)
    busy = [
        Action(f"b{i}", f"t-b{i}", ResourceKind.GPU, Amdahl(50.0, 0.2),
               service="b", service_size_gb=1.0, max_units=1)
        for i in range(4)
    ]  # fmt: skip
    sched.submit_many(busy, 0.0)
    assert sched.state.gpu["g0"].free_gpus == 0
    waiting = Action(
        "w", "t-w", ResourceKind.GPU, Amdahl(4.0, 0.2),
        service="s", service_size_gb=60.0, max_units=4, service_replicas=not shards,
    )  # fmt: skip
    sched.submit(waiting, 0.5)
    rule = sched.policy.rules["gpu"]
    rule.waits.by_action["w"] = Reservation(waiting, "g0", cell, 5.0, 9.0)
    return _RobustPass(rule, Context(sched, 1.0), GPU_DOMAIN)._released("s")


def test_a_sharded_copy_the_waiting_calls_own_restore_reshapes_is_not_released() -> None:
    """The waiting call restores its own service as a 4-GPU sharded copy over the 2-GPU one:
    a copy serves its own cell alone (``cells.copy_serves``), so after it the (0, 1) copy no
    longer serves a 2-GPU call. Counted as left there, a call of the service waited for a
    copy that would be gone, then restored all the same."""
    at = _released(shards=True, cell=(0, 1, 2, 3))
    assert all(math.isinf(at[("g0", g)]) for g in range(4)), at


def test_whole_replicas_the_waiting_calls_own_restore_adds_are_released() -> None:
    """Whole replicas serve any cell within them: its restore leaves the service there."""
    at = _released(shards=False, cell=(0, 1, 2, 3))
    assert all(math.isfinite(at[("g0", g)]) for g in range(4)), at
