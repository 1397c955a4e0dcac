"""How a running CPU action's grant changes: the one place that resizes.

Two kinds of action are resized: a malleable one (its program uses whatever cores it gets, up
to ``max_units``) and a non-malleable one started with more threads than cores
(``Start.threads``: its thread count is fixed, so it gains from cores only up to that count,
and below it its threads time-slice on its own cores). ``tangram.core.running.growth_cap`` is that rule.

A resize gives back the action's highest cores (shrink) or takes free cores, NUMA-near its own
first (grow), records the new grant in the running set, and moves the core's estimate of its
finish: the work left at ``now`` (the estimate's remaining time over its duration on the old
units) runs on the new units. Drivers integrate the real progress themselves.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from tangram.core.decision import Resize
from tangram.core.running import Running, growth_cap, resizable
from tangram.core.state import CapacityError

if TYPE_CHECKING:
    from tangram.core.scheduler import Scheduler


def remaining_fraction(running: Running, now: float) -> float:
    """The share of its work the core estimates a running action has left at ``now``."""
    start = running.start
    begun = start.time + start.est_overhead  # execution starts after its overhead
    if now <= begun or start.est_duration <= 0:
        return 1.0
    left = (running.est_finish - now) / start.est_duration
    return min(1.0, max(0.0, left))


def resize_action(
    sched: Scheduler, running: Running, units: int, reason: str, now: float
) -> Resize:
    """Give ``running`` (a resizable CPU action holding its own cores) ``units`` cores."""
    start, action = running.start, running.action
    if not resizable(running):
        raise CapacityError(
            f"{action.id}: only a malleable action, or one told more threads than cores, "
            "is resized on its own cores"
        )
    if not 1 <= units <= min(growth_cap(running), sched.state.cpu[start.node].spec.cores):
        raise CapacityError(f"{action.id}: cannot run on {units} cores")
    node = sched.state.cpu[start.node]
    held = start.cores
    if units < len(held):
        kept = tuple(sorted(held)[:units])
        node.release_granted(tuple(sorted(held)[units:]))
    else:
        kept = held + node.grow_cores(held, units - len(held))
    duration = action.curve.duration(units)
    left = remaining_fraction(running, now)
    begun = max(now, start.time + start.est_overhead)
    moved = start._replace(units=units, cores=kept, est_duration=duration)
    sched.runs.replace(
        Running(action, moved, running.domain, begun + left * duration, running.base_units)
    )
    return Resize(now, action, start.node, units, kept, len(held), reason)
