"""How an action starts: the one place capacity is taken for it and it becomes running.

Every start goes through ``start_action``: a policy's (``Context.start``) and the scheduler's
own lone-arrival path. It checks that the units are one of the action's options, takes the
capacity (NUMA-local cores the core picks, or the cores given; the aligned GPU cell; an API
slot and rate token), works out a GPU restore, records the action as running and returns the
``Start``. A policy asking for capacity that is not free, or for units that are not an option,
gets a ``CapacityError`` and nothing changes.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from tangram.core.action import Action
from tangram.core.backlog import Domain
from tangram.core.decision import Start
from tangram.core.options import Options, option_index
from tangram.core.resources import ResourceKind
from tangram.core.state import CapacityError

if TYPE_CHECKING:
    from tangram.core.scheduler import Scheduler


def start_action(
    sched: Scheduler,
    action: Action,
    node: str,
    units: int,
    reason: str,
    opts: Options,
    domain: Domain,
    now: float,
    cores: tuple[int, ...] | None = None,
    gpus: tuple[int, ...] = (),
    in_slot: bool = False,
    queued: bool = True,
    slot_since: float | None = None,
    threads: int = 0,
) -> Start:
    """The one way an action starts: check its option, take its capacity, record it as
    running (out of the queue when ``queued``), and return the decision. A policy starts
    actions through ``Context.start``; the scheduler's lone-arrival path calls it directly."""
    option = option_index(action, opts, units)
    if threads and (threads < units or action.malleable or action.resource is not ResourceKind.CPU):
        raise CapacityError(
            f"{action.id}: told {threads} threads on {units} units (only a non-malleable CPU "
            "action is told threads, at least its units)"
        )
    kind = action.resource
    bounded = sched.respects_capacity
    state = sched.state
    restore, overhead = False, 0.0
    if cores is None and kind is ResourceKind.CPU:  # the commonest: cores the core picks
        if domain[1] != node or domain[0] != "cpu":
            raise _off_its_node(action, node, domain)
        # An unbounded policy holds nothing (its starts are never given back): no cores.
        cores = state.cpu[node].grant_cores(units) if bounded else ()
    elif kind is ResourceKind.CPU:  # on the given cores (a static pod's)
        if bounded and not in_slot:
            if domain[1] != node or domain[0] != "cpu":
                raise _off_its_node(action, node, domain)
            if len(cores) != units:  # type: ignore[arg-type]
                raise CapacityError(f"{action.id}: {units} units but {len(cores)} cores")  # type: ignore[arg-type]
            state.cpu[node].take_cores(cores)  # type: ignore[arg-type]
    elif kind is ResourceKind.GPU:
        cores = ()
        if bounded:
            gpu = state.gpu[node]
            if action.memory_gb > gpu.spec.host_memory_gb:  # (a policy's placement bug)
                raise CapacityError(
                    f"{action.id}: needs {action.memory_gb} GB of host memory, {node} has "
                    f"{gpu.spec.host_memory_gb} GB"
                )
            restore = not gpu.is_resident(action.service or "", gpus)
            overhead = (
                gpu.spec.restore_s(
                    action.service_size_gb, len(gpus), replicas=action.service_replicas
                )
                if restore
                else 0.0
            )
            if not in_slot:
                if len(gpus) != units:
                    raise CapacityError(f"{action.id}: {units} units but cell {gpus}")
                gpu.take(gpus, action.id)
    else:
        cores = ()
        if bounded and not in_slot:
            state.api[action.service or ""].take(now)
    start = Start(  # positional, in field order: the hot path of every replay
        now,
        action,
        node,
        units,
        reason,
        cores,
        gpus,
        restore,
        in_slot,
        opts.durations[option],
        overhead,
        slot_since,
        threads,
    )
    if queued:
        sched.backlog.remove(action)
    sched.runs.add(start, domain)
    return start


def _off_its_node(action: Action, node: str, domain: Domain) -> CapacityError:
    """A CPU start on a node other than its container's (a policy bug)."""
    return CapacityError(
        f"{action.id}: CPU action started on {node}, its container is on {domain[1]}"
    )
