"""A minimal discrete-event loop over the core, for core tests: actions run exactly as estimated.

It checks the cluster invariants after every event and returns what happened to each action.
(The SimPy simulator in tangram.sim adds overheads and the rollout; these tests need neither.)
"""

from __future__ import annotations

import heapq
from collections import Counter
from dataclasses import dataclass, field

from tangram.core import (
    Action,
    ClusterSpec,
    CpuNodeSpec,
    Defer,
    GpuNodeSpec,
    Reject,
    ResourceKind,
    Scheduler,
    Start,
    make_policy,
)
from tangram.core.cells import CELL_SIZES
from tangram.core.decision import Resize
from tangram.core.fastpaths import FAST, FastPaths
from tangram.core.loop import DriverLoop


@dataclass
class Outcome:
    started: dict[str, Start] = field(default_factory=dict)
    rejected: dict[str, Reject] = field(default_factory=dict)
    finished: dict[str, float] = field(default_factory=dict)
    log: list[tuple] = field(default_factory=list)
    #: Resizes applied, per action.
    resized: Counter = field(default_factory=Counter)

    def total_act(self, actions: list[Action]) -> float:
        return sum(self.finished[a.id] - a.arrival for a in actions if a.id in self.finished)


def check_invariants(sched: Scheduler, traj_nodes: dict[str, str]) -> None:
    """No capacity exceeded in any dimension; GPU cells aligned and disjoint; CPU on its node."""
    if sched.unbounded:
        return
    st = sched.state
    held: dict[str, Counter] = {n: Counter() for n in st.cpu}
    for r in sched.running.values():
        s = r.start
        if r.action.resource is ResourceKind.CPU:
            assert s.node == traj_nodes.setdefault(r.action.trajectory, s.node), (
                "CPU action off its container's node"
            )
            # A CFS-shared start names its pod's requested cores and runs ``units`` threads.
            assert len(s.cores) == s.units or (sched.capabilities.cpu_shared and s.in_slot)
            if not s.in_slot:
                held[s.node].update(s.cores)
        elif r.action.resource is ResourceKind.GPU:
            k = len(s.gpus)
            assert k == s.units and k in CELL_SIZES and s.gpus[0] % k == 0, (
                f"unaligned cell {s.gpus}"
            )
            assert s.gpus == tuple(range(s.gpus[0], s.gpus[0] + k))
            if not s.in_slot:
                assert all(st.gpu[s.node].owner[g] == r.action.id for g in s.gpus)
    for name, node in st.cpu.items():
        free = set().union(*node.free_by_numa)
        assert len(free) == sum(map(len, node.free_by_numa)) == node.free_cores >= 0
        assert all(d == sorted(d) for d in node.free_by_numa), "free cores kept sorted"
        assert max(held[name].values(), default=0) <= 1, "a core granted twice"
        assert not (set(held[name]) & free), "a granted core is also free"
        assert all(0 <= c < node.spec.cores for c in free | set(held[name]))
        assert len(held[name]) + node.free_cores <= node.spec.cores
        assert -1e-9 <= node.memory_free_gb <= node.spec.memory_gb + 1e-9
    for api in st.api.values():
        assert 0 <= api.in_flight <= api.spec.concurrency
    # The O(1) tallies the simulator samples agree with a count over every node.
    assert st.held_cores == sum(n.spec.cores - n.free_cores for n in st.cpu.values())
    assert st.held_gpus == sum(n.spec.gpus - n.owner.count(None) for n in st.gpu.values())
    assert st.free_gpus == sum(n.free_gpus for n in st.gpu.values())
    assert st.api_in_flight == sum(a.in_flight for a in st.api.values())


class _HarnessHost:
    """The driver loop's host for core tests: a heap of events, actions run as estimated."""

    def __init__(self, sched: Scheduler, by_id: dict[str, Action], check: bool) -> None:
        self.sched, self.by_id, self.check = sched, by_id, check
        self.out = Outcome()
        self.remaining = Counter(a.trajectory for a in by_id.values())
        self.events: list[tuple[float, int, str, str]] = []  # (time, order, tie, id)
        self.traj_nodes: dict[str, str] = {}
        self.loop = DriverLoop(sched, self)
        self.now = 0.0
        self._wakes = 0
        #: action id -> [execution begins, units, share of its work done] (resizes move it).
        self.progress: dict[str, list] = {}
        #: action id -> its current end (a finish event at another time is stale).
        self.ends: dict[str, float] = {}

    def start(self, d: Start) -> None:
        self.out.log.append(("Start", d.action.id, d.units, d.node))
        assert d.action.id not in self.out.started, "started twice"
        check_start_record(
            d, bounded=not self.sched.unbounded, shared=self.sched.capabilities.cpu_shared
        )
        self.out.started[d.action.id] = d
        end = self.now + d.est_duration + d.est_overhead
        self.ends[d.action.id] = end
        self.progress[d.action.id] = [self.now + d.est_overhead, d.units, 0.0]
        heapq.heappush(self.events, (end, 0, d.action.id, d.action.id))

    def resize(self, d: Resize) -> None:
        """Integrate the action's progress on its old cores up to now; the rest on the new."""
        aid = d.action.id
        self.out.log.append(("Resize", aid, d.units, d.node))
        told = self.out.started[aid].threads
        # A non-malleable action is resized only when told more threads than its cores, and
        # never past them (its thread count is fixed at start).
        assert d.action.malleable or d.units <= told, (
            "a non-malleable action resized past its threads"
        )
        assert len(d.cores) == d.units and len(set(d.cores)) == d.units
        if aid in self.out.finished:
            return  # it ended this instant (the core has not seen the finish yet)
        self.out.resized[aid] += 1
        begun, units, done = self.progress[aid]
        curve = d.action.curve
        if self.now > begun:
            done += (self.now - begun) / curve.duration(units)
            begun = self.now
        self.progress[aid] = [begun, d.units, done]
        end = begun + max(0.0, 1.0 - done) * curve.duration(d.units)
        self.ends[aid] = end
        heapq.heappush(self.events, (end, 0, aid, aid))

    def finished(self, aid: str, now: float) -> bool:
        """Whether this finish event is the action's current end (and its work is all done)."""
        if self.ends.get(aid) != now:
            return False  # stale: the action was resized since
        begun, units, done = self.progress[aid]
        action = self.by_id[aid]
        if now > begun and action.resource is ResourceKind.CPU:
            done += (now - begun) / action.curve.duration(units)
            # Work is conserved: the shares of its work done grant by grant add up to all of it.
            assert self.out.resized[aid] == 0 or abs(done - 1.0) < 1e-6, (aid, done)
        return True

    def reject(self, d: Reject) -> None:
        self.out.log.append(("Reject", d.action.id, None, None))
        self.out.rejected[d.action.id] = d
        self.done(d.action.trajectory)

    def defer(self, d: Defer) -> None:
        self.out.log.append(("Defer", d.action.id, None, None))

    def settled(self, now: float) -> None:
        if self.check:
            check_invariants(self.sched, self.traj_nodes)

    #: ``run`` flushes once the instant's events are all in, and keeps the batch's finishes.
    request_flush = handed = None

    def arm_wakeup(self, when: float) -> None:
        self._wakes += 1
        heapq.heappush(self.events, (when, 2, f"w{self._wakes:08d}", "tick"))

    def pass_failed(self, arrived: object, finished: object, error: Exception) -> None:
        raise error

    def done(self, traj: str) -> None:
        self.remaining[traj] -= 1
        if self.remaining[traj] == 0:
            self.loop.close_trajectory(traj, self.now)


def check_start_record(d: Start, *, bounded: bool, shared: bool = False) -> None:
    """A start carries what its executor needs, typed as ``Start`` declares: CPU cores for a
    CPU action (none for an unbounded policy; a CFS-shared start names its pod's requested
    cores and runs its threads, ``units``, on the node), a GPU cell for a GPU call, neither
    for an API."""
    assert isinstance(d.cores, tuple) and isinstance(d.gpus, tuple), d
    kind = d.action.resource
    if kind is ResourceKind.CPU and shared and d.in_slot:
        assert d.gpus == () and d.cores and d.units >= 1, d
    elif kind is ResourceKind.CPU:
        assert d.gpus == () and len(d.cores) == (d.units if bounded else 0), d
    elif kind is ResourceKind.GPU:
        assert d.cores == () and len(d.gpus) == (d.units if bounded else 0), d
    else:
        assert d.cores == () and d.gpus == () and d.units == 1, d
    assert d.est_duration > 0 and d.est_overhead >= 0


def run(
    cluster: ClusterSpec,
    policy: str,
    actions: list[Action],
    *,
    check: bool = True,
    fast: FastPaths = FAST,
    open_first: bool = False,
    join: tuple[float, CpuNodeSpec | GpuNodeSpec] | None = None,
) -> Outcome:
    """Submit each action at its arrival, finish it after its estimated time, close trajectories.

    Events go through the one driver loop (``tangram.core.loop``), as in the simulator: every
    completion and arrival of an instant is one scheduling pass. ``fast=FULL`` turns off the
    scheduler's speed shortcuts (``tangram.core.fastpaths``: every event then goes through the
    queue and a full pass); ``open_first`` opens every trajectory at time 0 (containers placed
    before their first action, as the simulator does). ``join`` = (time, node): the node joins
    the cluster at that time, after that instant's events (``Scheduler.add_node``).
    """
    sched = Scheduler(cluster, make_policy(policy), fast=fast, resizable=True)
    if open_first:
        for traj in sorted({a.trajectory for a in actions if a.resource is ResourceKind.CPU}):
            sched.open_trajectory(traj, 0.0, memory_gb=1.0)
    by_id = {a.id: a for a in actions}
    host = _HarnessHost(sched, by_id, check)
    for i, a in enumerate(sorted(actions, key=lambda a: a.arrival)):
        heapq.heappush(host.events, (a.arrival, 1, f"{i:08d}", a.id))
    if join is not None:
        heapq.heappush(host.events, (join[0], 3, "join", "join"))
    events, loop = host.events, host.loop
    while events:
        now = host.now = events[0][0]
        joins = False
        while events and events[0][0] == now:  # every event of this instant, then one pass
            _, order, when, aid = heapq.heappop(events)
            if order == 0:
                if aid in host.out.finished or not host.finished(aid, now):
                    continue
                host.out.finished[aid] = now
                loop.finish(aid)
            elif order == 1:
                loop.arrive(by_id[aid])
            elif order == 2:
                loop.wake(now, now)
            else:
                joins = True
        finished = list(loop.finishes)
        loop.flush(now)
        for aid in finished:
            host.done(by_id[aid].trajectory)
        if joins:
            node = join[1]  # type: ignore[index]
            host.out.log.append(("Join", node.name, None, None))
            loop.add_node(node, now)  # (the host checks the invariants after it)
    return host.out
