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
    Defer,
    Reject,
    ResourceKind,
    Scheduler,
    Start,
    make_policy,
)


@dataclass
class Outcome:
    started: dict[str, Start] = field(default_factory=dict)
    rejected: dict[str, Reject] = field(default_factory=dict)
    finished: dict[str, float] = field(default_factory=dict)
    log: list[tuple] = field(default_factory=list)

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
            assert len(s.cores) == s.units
            if not s.in_slot:
                held[s.node].update(s.cores)
        elif r.action.resource is ResourceKind.GPU:
            k = len(s.gpus)
            assert k == s.units and k in (1, 2, 4, 8) and s.gpus[0] % k == 0, (
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


def run(
    cluster: ClusterSpec,
    policy: str,
    actions: list[Action],
    *,
    check: bool = True,
    lone_arrivals: bool = True,
    open_first: bool = False,
) -> Outcome:
    """Submit each action at its arrival, finish it after its estimated time, close trajectories.

    ``lone_arrivals=False`` turns off the scheduler's short path for a lone CPU arrival (every
    arrival then goes through the queue and a full pass); ``open_first`` opens every
    trajectory at time 0 (containers placed before their first action, as the simulator does).
    """
    sched = Scheduler(cluster, make_policy(policy))
    if not lone_arrivals:
        sched._alone = None
    if open_first:
        for traj in sorted({a.trajectory for a in actions if a.resource is ResourceKind.CPU}):
            sched.open_trajectory(traj, 0.0, memory_gb=1.0)
    out = Outcome()
    remaining = Counter(a.trajectory for a in actions)
    events: list[tuple[float, int, str, str]] = []  # (time, order, kind, id)
    for i, a in enumerate(sorted(actions, key=lambda a: a.arrival)):
        heapq.heappush(events, (a.arrival, 1, f"{i:08d}", a.id))
    by_id = {a.id: a for a in actions}
    traj_nodes: dict[str, str] = {}
    wake_seq = 0

    def apply(now: float, decisions: list) -> None:
        for d in decisions:
            out.log.append(
                (type(d).__name__, d.action.id, getattr(d, "units", None), getattr(d, "node", None))
            )
            if isinstance(d, Start):
                assert d.action.id not in out.started, "started twice"
                out.started[d.action.id] = d
                heapq.heappush(
                    events, (now + d.est_duration + d.est_overhead, 0, d.action.id, d.action.id)
                )
            elif isinstance(d, Reject):
                out.rejected[d.action.id] = d
                done(now, d.action.trajectory)
            else:
                assert isinstance(d, Defer)

    def done(now: float, traj: str) -> None:
        remaining[traj] -= 1
        if remaining[traj] == 0:
            apply(now, sched.close_trajectory(traj, now))

    while events:
        now, order, _, aid = heapq.heappop(events)
        # Group simultaneous events of one kind into one pass, as the drivers do.
        batch = [aid]
        while events and events[0][0] == now and events[0][1] == order:
            batch.append(heapq.heappop(events)[3])
        if order == 1:
            apply(now, sched.submit_many([by_id[a] for a in batch], now))
        elif order == 2:
            apply(now, sched.tick(now))
        else:
            for a in batch:
                out.finished[a] = now
            apply(now, sched.finish_many(batch, now))
            for a in batch:
                done(now, by_id[a].trajectory)
        if sched.next_wakeup is not None and not any(e[1] == 2 for e in events):
            wake_seq += 1
            heapq.heappush(events, (sched.next_wakeup, 2, f"w{wake_seq:08d}", "tick"))
        if check:
            check_invariants(sched, traj_nodes)
    return out
