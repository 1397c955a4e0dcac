"""What waits: FCFS queues per domain and the indexes a policy reads them by.

Queues are kept per *domain*, the set of units actions compete for: one per CPU node (a CPU
action is bound to its trajectory's container, hence to one node), one for all GPUs (any GPU
call may use any node's cells), one per API endpoint. Every queued action also sits in its
trajectory's queue and, for GPU calls, in its service's queue; its unit options and domain are
kept beside it. Removal is O(1) from everywhere, so a policy may start or reject actions while it
walks a queue.
"""

from __future__ import annotations

from collections.abc import Iterator

from tangram.core.action import Action
from tangram.core.options import Options
from tangram.core.resources import ResourceKind

Domain = tuple[str, str]
GPU_DOMAIN: Domain = ("gpu", "*")


#: ``FcfsQueue.compact`` looks at the first this many live entries ...
FRONT = 64
#: ... and drops the dead ones among them when there are more than this many.
FRONT_DEAD = 16


class FcfsQueue:
    """Actions in arrival order, with O(1) removal from anywhere.

    Removal only forgets the id; iteration skips forgotten entries, so a policy may start or
    reject actions while it walks the queue. ``compact`` (between passes) drops dead entries.
    An entry is live while ``live`` maps its id to that very action: a runtime may reuse a
    forgotten id for a new action while the old one's dead entry is still in the list.
    """

    __slots__ = ("items", "head", "live", "removed")

    def __init__(self) -> None:
        self.items: list[Action] = []
        self.head = 0
        self.live: dict[str, Action] = {}
        #: Removals so far: while it and the length say only pushes happened, the oldest
        #: entries are the same (a reader may keep what it derived from them).
        self.removed = 0

    def push(self, action: Action) -> None:
        self.items.append(action)
        self.live[action.id] = action

    def remove(self, action_id: str) -> None:
        del self.live[action_id]
        self.removed += 1

    def __len__(self) -> int:
        return len(self.live)

    def __contains__(self, action_id: str) -> bool:
        return action_id in self.live

    def __iter__(self) -> Iterator[Action]:
        items, alive = self.items, self.live.get
        i = self.head
        while i < len(items):
            action = items[i]
            i += 1
            if alive(action.id) is action:  # (the action itself: a removed id may be reused)
                yield action

    def compact(self) -> None:
        """Forget removed entries: skip those at the front, and drop them from the list once
        they are the larger part (so a long run keeps only what is queued, never its history)."""
        items, live = self.items, self.live
        if not live:
            items.clear()
            self.head = 0
            return
        head = self.head
        while live.get(items[head].id) is not items[head]:  # a live entry lies at or after
            head += 1
        if len(items) - head > 2 * len(live) + 64:  # dead entries behind the head
            self.items = [a for a in items[head:] if live.get(a.id) is a]
            head = 0
        elif head > 64 and 2 * head > len(items):  # dead entries before it
            del items[:head]
            head = 0
        self.head = head
        self._compact_front()

    def _compact_front(self) -> None:
        """Drop the dead entries among the first ``FRONT`` live ones when there are more than
        ``FRONT_DEAD`` of them: a policy that starts actions out of FCFS order (shortest first)
        leaves them there, and every reader of the front skipped them on every pass (~130 us
        a pass on the scheduler bench's nodes) while the rule above waited for the whole list."""
        items, live, head = self.items, self.live, self.head
        end, seen, n = head, 0, len(items)
        while end < n and seen < FRONT:
            if live.get(items[end].id) is items[end]:
                seen += 1
            end += 1
        if end - head - seen > FRONT_DEAD:
            items[head:end] = [a for a in items[head:end] if live.get(a.id) is a]


class Backlog:
    """Every queued action, by domain, by GPU service and by trajectory, with its options."""

    __slots__ = ("queues", "gpu_by_service", "by_trajectory", "options", "domain_of", "_touched")

    def __init__(self) -> None:
        self.queues: dict[Domain, FcfsQueue] = {}
        self.gpu_by_service: dict[str, FcfsQueue] = {}
        #: trajectory -> its queued actions by id, in arrival order (a trajectory has few queued
        #: at once, so a plain dict is its FCFS queue; readers iterate a copy).
        self.by_trajectory: dict[str, dict[str, Action]] = {}
        self.options: dict[str, Options] = {}
        self.domain_of: dict[str, Domain] = {}
        self._touched: set[FcfsQueue] = set()

    def __len__(self) -> int:
        return sum(len(q) for q in self.queues.values())

    def waiting_in(self, domain: Domain) -> bool:
        """Whether any action is queued in ``domain``."""
        queue = self.queues.get(domain)
        return queue is not None and bool(queue.live)

    def push(self, action: Action, domain: Domain, opts: Options) -> None:
        """Queue an action on its domain (and its trajectory's and service's queues)."""
        aid = action.id
        self.options[aid] = opts
        self.domain_of[aid] = domain
        queue = self.queues.get(domain)
        if queue is None:
            queue = self.queues[domain] = FcfsQueue()
        queue.push(action)
        by_traj = self.by_trajectory.get(action.trajectory)
        if by_traj is None:
            self.by_trajectory[action.trajectory] = {aid: action}
        else:
            by_traj[aid] = action
        if action.resource is ResourceKind.GPU:
            by_service = self.gpu_by_service.get(action.service or "")
            if by_service is None:
                by_service = self.gpu_by_service[action.service or ""] = FcfsQueue()
            by_service.push(action)

    def remove(self, action: Action) -> Domain:
        """Remove a queued action from every index; returns its domain."""
        aid = action.id
        domain = self.domain_of.pop(aid)
        touched = self._touched
        queue = self.queues[domain]
        queue.remove(aid)
        touched.add(queue)
        by_traj = self.by_trajectory[action.trajectory]
        del by_traj[aid]
        if not by_traj:
            del self.by_trajectory[action.trajectory]
        if action.resource is ResourceKind.GPU:
            by_service = self.gpu_by_service[action.service or ""]
            by_service.remove(aid)
            touched.add(by_service)
        del self.options[aid]
        return domain

    def compact(self) -> None:
        """Drop dead entries from the queues that lost actions since the last pass."""
        for queue in self._touched:
            queue.compact()
        self._touched.clear()
