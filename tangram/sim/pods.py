"""When a simulated container or Kubernetes pod can run its first action.

AOE creates a trajectory's container when the trajectory opens (``container_start_s``). A
static baseline's pod is created when the scheduler grants it its cores, which for a pod that
waited for capacity is long after the open; it is ready ``pod_start_s`` later unless a warm
pod was waiting. The first container or pod on a node also pulls the image. The rules are
documented on :class:`tangram.sim.config.Overheads`.
"""

from __future__ import annotations

import heapq

from tangram.sim.config import Overheads


class StartupClock:
    """Ready times of containers and pods, per trajectory, from the overheads' rules.

    The image pull is per node and per kind of sandbox (AOE containers are created at opens,
    pods at grants; a policy uses one or the other): it starts with the first one created on
    the node and whatever is created before it completes waits for it.
    """

    def __init__(self, overheads: Overheads) -> None:
        self.overheads = overheads
        #: trajectory -> (its AOE container's node, when it was created).
        self.opened: dict[str, tuple[str | None, float]] = {}
        #: trajectory -> when its AOE container / its pod can run an action.
        self.container_ready: dict[str, float] = {}
        self.pod_ready: dict[str, float] = {}
        #: ("aoe" | "pod", node) -> when the image is on the node.
        self.pull_done: dict[tuple[str, str], float] = {}
        #: Ready times of the warm pods (a min-heap): all ready at the start of the run.
        self.warm: list[float] = [0.0] * overheads.warm_pods
        #: Pods that started cold / took a warm pod (reported with the run).
        self.cold_pods = 0
        self.warm_pods_taken = 0

    def _pulled(self, kind: str, node: str | None, created: float) -> float:
        """When a container of ``kind`` created at ``created`` on ``node`` has its image."""
        if node is None:
            return created
        done = self.pull_done.setdefault((kind, node), created + self.overheads.image_pull_s)
        return max(created, done)

    def open_container(self, trajectory: str, node: str | None, now: float) -> None:
        """AOE: the container is created now, while the first generation runs (its ready time
        is worked out at its first action, when the policy shows it uses it)."""
        self.opened[trajectory] = (node, now)
        if node is not None:
            self.pull_done.setdefault(("aoe", node), now + self.overheads.image_pull_s)

    def container(self, trajectory: str, now: float) -> float:
        """When the trajectory's AOE container can run (now if it was never opened)."""
        ready = self.container_ready.get(trajectory)
        if ready is None:
            if trajectory not in self.opened:
                return now
            node, created = self.opened[trajectory]
            ready = self._pulled("aoe", node, created) + self.overheads.container_start_s
            self.container_ready[trajectory] = ready
        return ready

    def pod(self, trajectory: str, node: str, granted: float) -> float:
        """When the trajectory's pod, granted its cores at ``granted``, can run its first action.

        Decided once per pod: a warm pod ready before a cold start would be is taken (and
        replaced, ready ``pod_start_s`` after it was taken); otherwise the pod starts cold.
        """
        ready = self.pod_ready.get(trajectory)
        if ready is not None:
            return ready
        ov = self.overheads
        cold = self._pulled("pod", node, granted) + ov.pod_start_s
        if self.warm and max(self.warm[0], granted) < cold:
            ready = max(heapq.heappop(self.warm), granted)
            heapq.heappush(self.warm, granted + ov.pod_start_s)
            self.warm_pods_taken += 1
        else:
            ready = cold
            self.cold_pods += 1
        self.pod_ready[trajectory] = ready
        return ready

    def forget(self, trajectory: str) -> None:
        """The trajectory ended: its container or pod is gone."""
        self.opened.pop(trajectory, None)
        self.container_ready.pop(trajectory, None)
        self.pod_ready.pop(trajectory, None)
