"""What the core knows of arrivals to come: how long a node's trajectories generate between
their actions (an exponentially weighted mean of the gaps it saw, per CPU node), and how many
of them are generating now. The ``tangram`` policy's arrival-aware DoP reads it, so a
non-malleable action does not take a whole node when its trajectories are about to send more.
Pure bookkeeping on the events' own times (no clock).
"""

from __future__ import annotations

#: Weight of the newest gap in the running mean (about the last ten gaps count).
ALPHA = 0.1


class ArrivalStats:
    """Per node, the mean gap between a trajectory's action ending and its next arriving."""

    __slots__ = ("last_end", "gap")

    def __init__(self) -> None:
        #: trajectory -> when its last action ended (until its next one arrives).
        self.last_end: dict[str, float] = {}
        #: CPU node -> mean gap (seconds), once one gap was seen there.
        self.gap: dict[str, float] = {}

    def ended(self, trajectory: str, now: float) -> None:
        self.last_end[trajectory] = now

    def arrived(self, trajectory: str, node: str | None, now: float) -> None:
        end = self.last_end.pop(trajectory, None)
        if end is None or node is None:
            return
        gap = now - end
        mean = self.gap.get(node)
        self.gap[node] = gap if mean is None else mean + ALPHA * (gap - mean)

    def closed(self, trajectory: str) -> None:
        self.last_end.pop(trajectory, None)
