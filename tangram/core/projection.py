"""The eviction test's estimate of total ACT: candidates exactly, the queue by projection.

Candidates start now, so each contributes its duration. Queued actions (including evicted
candidates, in FCFS order) are projected with a heap of completion times, as in the paper:
pop the earliest finish, start the next queued action on the units it frees (plus any left
free), at the largest option that fits. Only the first ``depth`` queued actions are projected,
the same set for every alternative compared, so the estimate stays O(depth log n) per trial.
"""

from __future__ import annotations

import heapq
from collections.abc import Sequence

from tangram.core.options import Options


def projected_total(
    now: float,
    chosen: Sequence[tuple[int, float]],
    busy: Sequence[tuple[float, int]],
    free_left: int,
    queued: Sequence[Options],
) -> float:
    """Sum of estimated ACT from ``now`` for the chosen (units, duration) pairs and ``queued``.

    ``busy`` holds (estimated finish, units) of running actions, sorted, with finishes already
    in the past moved to ``now``: the caller sorts it once for every alternative it compares,
    and each call merges it with a small heap of the projection's own starts. ``free_left`` is
    the units no candidate took.
    """
    total = sum([d for _, d in chosen])
    if not queued:
        return total
    heap = [(now + d, u) for u, d in chosen]
    heapq.heapify(heap)
    pop, push = heapq.heappop, heapq.heappush
    b, nb = 0, len(busy)
    clock, avail = now, free_left
    for opt in queued:
        # (The fields unpacked once: the projection is the eviction test's inner loop.)
        units, durations, _, _, consecutive = opt
        need = units[0]
        while avail < need:  # the next finish, from whichever of the two sources is earlier
            if b < nb and (not heap or busy[b] <= heap[0]):
                t, u = busy[b]
                b += 1
            elif heap:
                t, u = pop(heap)
            else:
                break
            if t > clock:
                clock = t
            avail += u
        if avail < need:  # cannot start within the projection: count it from the last finish
            total += clock - now + durations[0]
            continue
        if consecutive:  # best_within, inline: one unit per option
            k = avail - need
            if k >= len(units):
                k = len(units) - 1
        else:
            k = opt.best_within(avail)
        u, d = units[k], durations[k]
        total += clock - now + d
        push(heap, (clock + d, u))
        avail -= u
    return total
