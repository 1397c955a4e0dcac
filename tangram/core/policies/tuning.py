"""What distinguishes ``tangram`` from ``tangram-paper``: the elastic rules' switches.

``tangram-paper`` is the paper's policy (arXiv 2603.13019), kept for the reproduction
experiments: a candidate window of 32, DoP fixed at start, one restore weighed against one
call, one FCFS order for GPU calls. ``tangram`` is the robust default that turns on each
mechanism below (issue 11; docs/core.md says why each exists and what it costs).
"""

from __future__ import annotations

from dataclasses import dataclass, replace

#: The paper's candidate window (actions considered per pass).
PAPER_WINDOW = 32


@dataclass(frozen=True)
class ElasticTuning:
    """Switches of the elastic CPU and GPU rules (one record, shared by both)."""

    #: Candidates per pass; None sizes the window from the free units (a burst of small
    #: actions is never starved by a fixed window).
    window: int | None = None
    #: Queued actions looked at behind the candidates (the eviction test's projection).
    depth: int = 32
    #: Running malleable CPU actions' cores grow and shrink at each pass.
    malleable: bool = True
    #: A non-malleable CPU action starts on the cores free now told the thread count of its
    #: fastest option; its grant then grows up to that count
    #: as cores free and shrinks for queued actions, its threads time-slicing on its own
    #: cores (``threads.told_threads``; only where the driver resizes).
    oversubscribe: bool = True
    #: Grants are CFS weights over the node's cores, not exclusive cpusets: an action is
    #: guaranteed its granted cores' worth of CPU and its threads also run on cycles the others
    #: leave idle (a serial phase keeps one core busy; the rest of its grant goes to the node's
    #: other actions until its parallel phase needs it back). Exclusive cores idle through
    #: every serial phase, which a burstable pod's CFS lends (``Capabilities.cpu_lends_idle``;
    #: drivers that cannot share keep exclusive cores).
    lend_idle_cycles: bool = True
    #: A non-malleable CPU action granted few cores waits for more when that finishes it
    #: sooner and nothing else waits (``waits.defer_short_grants``; not taken when it is
    #: told more threads, since its grant then grows).
    arrival_aware: bool = True
    #: A non-malleable CPU action's grant leaves a core for each action the node's generating
    #: trajectories are expected to send during its run (``waits.leave_room_for_arrivals``).
    #: Off by default: on the random CPU family it lost to no trim on p99 ACT and step time
    #: (long actions get fewer cores; docs/core.md has the figures).
    room_for_arrivals: bool = False
    #: A non-malleable CPU grant stops at its knee (efficiency 0.4) while other trajectories
    #: on its node are generating (``waits.cap_at_the_knee``).
    knee: bool = True
    #: A node's queue is read shortest expected first, with aging (``cpu_order``), not FCFS.
    shortest_first: bool = True
    #: ... and, before that, actions of trajectories already under way before newcomers' first
    #: actions (``cpu_order.Continuation``; only with ``shortest_first``).
    continuation_first: bool = True
    #: GPU: restores weighed against the calls a service is expected to receive, evictions
    #: charged to the start that forces them, per-service order for calls.
    gpu_robust: bool = True

    def with_window(self, window: int | None) -> ElasticTuning:
        return replace(self, window=window)


#: The paper's policy: every mechanism off, the window fixed at 32.
PAPER = ElasticTuning(
    window=PAPER_WINDOW,
    malleable=False,
    oversubscribe=False,
    lend_idle_cycles=False,
    arrival_aware=False,
    room_for_arrivals=False,
    knee=False,
    shortest_first=False,
    continuation_first=False,
    gpu_robust=False,
)
#: The default ``tangram`` policy.
ROBUST = ElasticTuning()
#: ``tangram-exclusive``: the default's rules on exclusive cores (no idle cycles lent).
EXCLUSIVE = replace(ROBUST, lend_idle_cycles=False)
