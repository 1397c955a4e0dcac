"""The scheduler's speed shortcuts, behind one switch.

Each shortcut decides exactly what the full pass decides, faster, where a policy's
``Capabilities`` allow it; the property tests run both ways (``FAST`` and ``FULL``) and compare
every decision. ``Scheduler(cluster, policy, fast=FULL)`` turns them all off.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class FastPaths:
    """Which shortcuts are on (all by default)."""

    #: A lone CPU arrival into an empty queue is decided by the policy's ``alone`` rule and
    #: never enters the queue (queue-driven policies that declare one).
    lone_arrival: bool = True
    #: Completions that free units in domains where nothing waits skip the pass
    #: (queue-driven policies).
    idle_finish: bool = True
    #: An arrival whose container is already placed and large enough skips the feasibility
    #: and memory checks it cannot fail.
    placed_arrival: bool = True
    #: A domain with one queued action skips the elastic round's candidate lists.
    single_queued: bool = True


#: Every shortcut on: what the simulator and the runtime use.
FAST = FastPaths()
#: Every shortcut off: the full pass for every event (the reference the tests compare with).
FULL = FastPaths(lone_arrival=False, idle_finish=False, placed_arrival=False, single_queued=False)
