"""A capacity-aware lower bound on mean ACT and step time: the floor no policy can beat.

The ``lower-bound`` policy runs every action at its fastest option the moment it arrives; it
ignores capacity, so on a small busy cluster no schedule comes near it. This bound keeps the
capacity, in a *fluid relaxation* (``docs/metrics.md``, "The capacity-aware bound"):

- each domain's units are pooled and divisible: all the cluster's cores are one pool of
  ``C_cpu`` cores, all its GPUs one pool of ``C_gpu`` GPUs, each API endpoint a pool of its
  concurrency (pooling and dividing only widen what a schedule may do);
- an action ``i`` needs an *area* ``a_i = min_m m * T_i(m)`` unit-seconds (its work at its best
  efficiency) and at least ``d_i = min_m T_i(m)`` seconds (its fastest option), ``m`` ranging
  over the options any capacity-respecting schedule has: 1..min(max_units, the largest node's
  cores) cores, the aligned cells that hold its model up to max_units, one API slot;
- overheads (container starts, grants, restores, pod starts) count as zero.

**Mean ACT.** ACT_i = C_i - r_i (completion minus arrival). In a closed loop most arrivals
depend on the schedule, but two kinds do not, up to a shift common to the group: the first
actions of a step (arrival = step start + ``gen_before_s``; steps run one after another) and a
``sync`` round (all released at one instant). The actions are partitioned into groups (per step
and domain: the first actions without ``sync``; each sync round; every other action alone).
Restricting any schedule to one group gives a schedule of that group alone on the whole pool,
so the sum of the groups' optimal flow times bounds the sum of ACTs. For a group with release
times ``r_i`` on a pool of ``C`` units, sort any schedule's completions ``C_(1) <= ... <= C_(n)``:

1. ``C_(k) >= S_(k)``, the k-th completion of SRPT on one machine of speed ``C`` processing
   sizes ``a_i`` (a fluid schedule is a preemptive one-machine schedule of speed ``C``; on one
   machine SRPT completes at least as many jobs by any time as any preemptive schedule:
   Schrage 1968, Smith 1978, "SRPT minimises the jobs in the system at every instant");
2. ``C_(k) >= (r + d)_(k)``, the k-th smallest ``r_i + d_i`` (the first k to complete each
   finish no earlier than their own ``r_i + d_i``).

So ``sum ACT >= sum_k max(S_(k), (r + d)_(k)) - sum r_i`` for a group, ``d_i`` for a lone action.
A step without ``sync`` also gives a bound from whole trajectories: a trajectory lives its
generations plus its actions' ACTs (each action arrives when its generation ends), and all start
at the step's start, so sum ACT = sum of trajectory ends - sum of generations; the k-th smallest
end is at least the k-th smallest critical path (``d_i`` and generations) and, for each domain,
the k-th SRPT completion of the trajectories' work there (released at the earliest arrival of
their first action there, sized their area there) plus the least time any of them needs after
its last action there. The step's bound is the larger of the two. Both are at least
``sum d_i``, hence never below ``lower-bound``'s figure: its options include the
capacity-respecting ones (a GPU call with none, its ``max_units`` below the smallest cell that
holds its model, say, is rejected by ``lower-bound`` as by every policy; it took a cell no
schedule can use, and was then no bound).

**Step time.** A step lasts at least (a) its critical path: every action at ``d_i`` with its
generations, ``sync`` barriers included, plus ``train_s``; and (b) for each domain and each
threshold ``t`` among the earliest arrivals ``h_i`` of its actions (from (a)): ``t`` plus the
area of the actions with ``h_i >= t`` over ``C``, plus the least time ``q_i`` any of those needs
after it completes (its trajectory's later generations and fastest actions), plus ``train_s``.
The bound assumes ``exec_noise_sigma = 0`` (durations equal the curves).
"""

from __future__ import annotations

import heapq
import math
from collections.abc import Sequence
from dataclasses import dataclass

from tangram.core.cells import unit_options_on
from tangram.core.resources import ClusterSpec
from tangram.sim.config import RolloutConfig
from tangram.trace import Trace, TraceRow

#: A domain: ("cpu", ""), ("gpu", "") or ("api", endpoint).
Domain = tuple[str, str]


@dataclass(frozen=True)
class ActionNeed:
    """What one action needs at least: its domain, area (unit-seconds) and duration (s)."""

    domain: Domain
    area: float
    duration: float


@dataclass(frozen=True)
class CapacityBound:
    """The bound's figures for one trace on one cluster (seconds)."""

    #: Lower bound on mean ACT over the actions the cluster can run.
    act_mean_s: float
    #: Mean over actions of the fastest option alone (what the bound adds contention to).
    act_floor_s: float
    #: Lower bound on mean step time (NaN for an open-loop replay, which has no steps).
    step_mean_s: float
    #: Actions counted, and those no capacity-respecting schedule can run (left out).
    actions: int
    unrunnable: int


def action_need(row: TraceRow, cluster: ClusterSpec) -> ActionNeed | None:
    """The action's domain, least area and least duration on ``cluster`` (None: cannot run)."""
    curve = row.curve_object()
    if row.resource == "cpu":
        top = min(row.max_units, max((n.cores for n in cluster.cpu_nodes), default=0))
        units: Sequence[int] = range(1, top + 1)
        domain: Domain = ("cpu", "")
    elif row.resource == "gpu":
        units = unit_options_on(  # the core's options (``OptionBuilder.gpu_units``)
            row.service_size_gb,
            {(n.gpus, n.gpu_memory_gb) for n in cluster.gpu_nodes},
            row.max_units,
            replicas=row.service_replicas,
        )
        domain = ("gpu", "")
    else:
        units = (1,) if any(a.name == row.service for a in cluster.apis) else ()
        domain = ("api", row.service or "")
    if not units:
        return None
    durations = curve.durations(tuple(units))
    area = min(m * t for m, t in zip(units, durations, strict=True))
    return ActionNeed(domain, area, min(durations))


def capacities(cluster: ClusterSpec) -> dict[Domain, float]:
    """Each domain's pooled units."""
    out: dict[Domain, float] = {("cpu", ""): cluster.total_cores, ("gpu", ""): cluster.total_gpus}
    out.update({("api", a.name): a.concurrency for a in cluster.apis})
    return out


def srpt_completions(jobs: Sequence[tuple[float, float]], speed: float) -> list[float]:
    """Completion times, ascending, of SRPT on one machine of ``speed`` (jobs: release, size)."""
    order = sorted(jobs)
    done: list[float] = []
    heap: list[float] = []
    t, i, n = 0.0, 0, len(order)
    while i < n or heap:
        if not heap:
            t = max(t, order[i][0])
        while i < n and order[i][0] <= t:
            heapq.heappush(heap, order[i][1])
            i += 1
        rest = heapq.heappop(heap)
        finish = t + rest / speed
        if i < n and order[i][0] < finish:
            nxt = order[i][0]
            heapq.heappush(heap, rest - (nxt - t) * speed)
            t = nxt
        else:
            done.append(finish)
            t = finish
    return done


def group_flow_bound(jobs: Sequence[tuple[float, ActionNeed]], capacity: float) -> float:
    """Least sum of flow times of actions (release, need) alone on ``capacity`` pooled units."""
    if len(jobs) == 1:
        return jobs[0][1].duration
    srpt = srpt_completions([(r, need.area) for r, need in jobs], capacity)
    alone = sorted(r + need.duration for r, need in jobs)
    return sum(max(s, a) for s, a in zip(srpt, alone, strict=True)) - sum(r for r, _ in jobs)


def _chain(
    groups: Sequence[tuple[TraceRow, ...]], needs: dict[str, ActionNeed]
) -> tuple[dict[str, float], list[float]]:
    """Earliest arrival of each action and each trajectory's earliest end, sync included."""
    arrival: dict[str, float] = {}
    clock = [0.0] * len(groups)
    pos = [0] * len(groups)
    while True:
        waiting = []  # trajectories at a sync action: (index, reach time)
        for j, rows in enumerate(groups):
            while pos[j] < len(rows):
                row = rows[pos[j]]
                reach = clock[j] + row.gen_before_s
                if row.sync:
                    waiting.append((j, reach))
                    break
                arrival[row.action_id] = reach
                clock[j] = reach + needs[row.action_id].duration
                pos[j] += 1
        if not waiting:
            break
        ends = [
            clock[j] + (rows[-1].gen_after_s if rows else 0.0)
            for j, rows in enumerate(groups)
            if pos[j] == len(rows)
        ]
        release = max([t for _, t in waiting] + ends)
        for j, _ in waiting:
            row = groups[j][pos[j]]
            arrival[row.action_id] = release
            clock[j] = release + needs[row.action_id].duration
            pos[j] += 1
    return arrival, [
        clock[j] + (rows[-1].gen_after_s if rows else 0.0) for j, rows in enumerate(groups)
    ]


def _tails(rows: Sequence[TraceRow], needs: dict[str, ActionNeed]) -> dict[str, float]:
    """Least time from each action's completion to its trajectory's end."""
    out, after = {}, rows[-1].gen_after_s if rows else 0.0
    for row in reversed(rows):
        out[row.action_id] = after
        after += row.gen_before_s + needs[row.action_id].duration
    return out


def _domain_step_bound(items: list[tuple[float, float, float]], capacity: float) -> float:
    """max over thresholds t of t + area(h >= t) / C + min tail(h >= t); items: (h, area, tail)."""
    best, area, tail = 0.0, 0.0, math.inf
    for h, a, q in sorted(items, reverse=True):
        area += a
        tail = min(tail, q)
        best = max(best, h + area / capacity + tail)
    return best


def capacity_bound(
    trace: Trace, cluster: ClusterSpec, rollout: RolloutConfig | None = None
) -> CapacityBound:
    """The capacity-aware lower bound of ``trace`` on ``cluster`` (see the module docstring)."""
    rollout = rollout or RolloutConfig()
    caps = capacities(cluster)
    needs: dict[str, ActionNeed] = {}
    unrunnable = set()
    for row in trace.rows:
        need = action_need(row, cluster)
        if need is None:
            unrunnable.add(row.action_id)
        else:
            needs[row.action_id] = need
    if not needs:
        nan = math.nan
        return CapacityBound(nan, nan, nan, 0, len(unrunnable))
    # Unrunnable actions are left out (every schedule rejects them); their trajectories go on.
    trajectories = {
        key: tuple(r for r in rows if r.action_id in needs)
        for key, rows in trace.trajectories().items()
    }
    steps: dict[int, list[tuple[TraceRow, ...]]] = {}
    for (step, _), rows in trajectories.items():
        if rows:
            steps.setdefault(step, []).append(rows)
    n = len(needs)
    if rollout.mode == "open":
        opened: dict[Domain, list[tuple[float, ActionNeed]]] = {}
        for row in trace.rows:
            if row.action_id in needs:
                need = needs[row.action_id]
                opened.setdefault(need.domain, []).append((row.arrival_s or 0.0, need))
        flow = sum(group_flow_bound(jobs, caps[d]) for d, jobs in opened.items())
        step_mean = math.nan
    else:
        bounds = [_step_bounds(g, needs, caps) for g in steps.values()]
        flow = sum(b[0] for b in bounds)
        step_mean = sum(b[1] for b in bounds) / len(bounds) + rollout.train_s
    return CapacityBound(
        act_mean_s=flow / n,
        act_floor_s=sum(need.duration for need in needs.values()) / n,
        step_mean_s=step_mean,
        actions=n,
        unrunnable=len(unrunnable),
    )


def _group_flows(groups: list[tuple[TraceRow, ...]], needs: dict[str, ActionNeed], caps) -> float:
    """Least sum of ACT of one step from its groups: first actions and sync rounds per domain
    (each alone on its pool), every other action at its fastest option."""
    sets: dict[tuple, list[tuple[float, ActionNeed]]] = {}
    lone = 0.0
    for rows in groups:
        synced = 0
        for row in rows:
            need = needs[row.action_id]
            if row.sync:
                synced += 1
                sets.setdefault(("sync", synced, need.domain), []).append((0.0, need))
            elif row.position == 0:
                sets.setdefault(("first", need.domain), []).append((row.gen_before_s, need))
            else:
                lone += need.duration
    return lone + sum(group_flow_bound(jobs, caps[jobs[0][1].domain]) for jobs in sets.values())


def _trajectory_flows(
    groups: list[tuple[TraceRow, ...]],
    needs: dict[str, ActionNeed],
    caps: dict[Domain, float],
    arrival: dict[str, float],
    ends: list[float],
) -> float:
    """Least sum of ACT of one step without ``sync``, from its trajectories' ends.

    Without barriers a trajectory lives its generations plus its actions' ACTs, all
    trajectories starting at the step's start, so sum ACT = sum of ends - sum of generations.
    The k-th smallest end is at least the k-th smallest critical path and, for a domain D, the
    k-th SRPT completion of the trajectories' D-work (released at their first D action's
    earliest arrival, sized their D-area, on a machine of speed C_D) plus the least time any
    trajectory needs after its last D action.
    """
    generations = sum(r.gen_before_s for rows in groups for r in rows)
    generations += sum(rows[-1].gen_after_s for rows in groups)
    best = sum(ends)
    for domain, capacity in caps.items():
        jobs, tail, inside, outside = [], math.inf, [], 0.0
        for rows, end in zip(groups, ends, strict=True):
            mine = [r for r in rows if needs[r.action_id].domain == domain]
            if not mine:
                outside += end
                continue
            area = sum(needs[r.action_id].area for r in mine)
            jobs.append((arrival[mine[0].action_id], area))
            tail = min(tail, _tails(rows, needs)[mine[-1].action_id])
            inside.append(end)
        if not jobs or capacity <= 0:
            continue
        srpt = srpt_completions(jobs, capacity)
        total = sum(max(s + tail, c) for s, c in zip(srpt, sorted(inside), strict=True))
        best = max(best, total + outside)
    return best - generations


def _step_bounds(
    groups: list[tuple[TraceRow, ...]], needs: dict[str, ActionNeed], caps: dict[Domain, float]
) -> tuple[float, float]:
    """Least sum of ACT and least rollout time of one step."""
    arrival, ends = _chain(groups, needs)
    flow = _group_flows(groups, needs, caps)
    if not any(r.sync for rows in groups for r in rows):
        flow = max(flow, _trajectory_flows(groups, needs, caps, arrival, ends))
    items: dict[Domain, list[tuple[float, float, float]]] = {}
    for rows in groups:
        tails = _tails(rows, needs)
        for row in rows:
            need = needs[row.action_id]
            items.setdefault(need.domain, []).append(
                (arrival[row.action_id], need.area, tails[row.action_id])
            )
    span = max([max(ends)] + [_domain_step_bound(v, caps[d]) for d, v in items.items()])
    return flow, span
