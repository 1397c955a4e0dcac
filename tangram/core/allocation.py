"""Split free units of one resource among candidate actions to minimise the sum of durations.

Two exact methods, chosen per call:

* **marginal gain** (``greedy``): start every candidate at its smallest option and hand out one
  unit at a time to the candidate whose next unit saves the most time (a heap). When every
  candidate's options are consecutive integers and its duration is convex in the units
  (equivalently its speedup m*E(m) is concave), the problem is a separable convex resource
  allocation and this greedy is exactly optimal. Cost O((n + F) log n) for n candidates and
  F free units.
* **dynamic programme** (``dp``): exact for any curves and any option sets (GPU cells of
  1/2/4/8 are not consecutive; a profiled table may be non-convex). Cost O(n * F * m) for m
  options each, vectorised with numpy over F.

``allocate`` picks greedy when it is exact and the DP otherwise; both return the same total
whenever both apply (tested).
"""

from __future__ import annotations

import heapq
from collections.abc import Sequence

import numpy as np

from tangram.core.options import Options


def greedy_applies(options: Sequence[Options]) -> bool:
    """True when marginal-gain allocation is exactly optimal for these candidates."""
    return all(opt.convex and opt.consecutive for opt in options)


def allocate(options: Sequence[Options], free_units: int) -> tuple[list[int], str]:
    """Option index per candidate, and the method used ("greedy" or "dp").

    Requires the candidates' smallest options to fit together in ``free_units``.
    """
    if sum(o.units[0] for o in options) > free_units:
        raise ValueError(
            f"candidates need {sum(o.units[0] for o in options)} units at least; {free_units} free"
        )
    if len(options) == 1:
        chosen, method = allocate_one(options[0], free_units)
        return [chosen], method
    if greedy_applies(options):
        return allocate_greedy(options, free_units), "greedy"
    return allocate_dp(options, free_units), "dp"


def allocate_one(opt: Options, free_units: int) -> tuple[int, str]:
    """``allocate`` for a single candidate (most scheduling passes): its option index and the
    method whose answer it is, without the heap or the table."""
    if opt.convex and opt.consecutive:
        return _greedy_single(opt, free_units), "greedy"
    return _dp_single(opt, free_units), "dp"


def _greedy_single(opt: Options, free_units: int) -> int:
    """``allocate_greedy`` for one candidate: step up while the next unit saves time."""
    top = opt.best_within(free_units)
    d = opt.durations
    k = 0
    while k < top and d[k] - d[k + 1] > 0:
        k += 1
    return k


def _dp_single(opt: Options, free_units: int) -> int:
    """``allocate_dp`` for one candidate: the least duration within the free units, fewest
    units among equals."""
    d = opt.durations[: opt.best_within(free_units) + 1]
    return d.index(min(d))


def allocate_greedy(
    options: Sequence[Options], free_units: int, resume: Sequence[int] | None = None
) -> list[int]:
    """Marginal-gain allocation (see module docstring); ties go to the earlier candidate.

    ``resume``: option indices from a greedy run over these candidates *and more after them*
    (the eviction test drops the last candidate and re-allocates). The units handed out follow
    one fixed order per candidate set, and dropping a candidate never reorders the others' picks,
    so the run continues from there with the same result as one from scratch, handing out only
    the units the dropped candidate had.
    """
    chosen = [0] * len(options) if resume is None else list(resume)
    left = free_units
    heap: list[tuple[float, int]] = []
    durations = []
    for i, opt in enumerate(options):
        c, d = chosen[i], opt.durations
        durations.append(d)
        left -= opt.units[c]
        if c + 1 < len(d):
            gain = d[c] - d[c + 1]
            if gain > 0:
                heap.append((-gain, i))
    heapq.heapify(heap)
    replace, pop = heapq.heapreplace, heapq.heappop
    while left > 0 and heap:
        i = heap[0][1]  # the largest gain; pop it, or replace it with its next step's gain
        k = chosen[i] = chosen[i] + 1
        left -= 1
        d = durations[i]
        if k + 1 < len(d) and d[k] - d[k + 1] > 0:
            replace(heap, (d[k + 1] - d[k], i))
        else:
            pop(heap)
    return chosen


def allocate_dp(options: Sequence[Options], free_units: int) -> list[int]:
    """Exact DP over candidates: best[j] = least total duration using exactly j units."""
    inf = float("inf")
    best = np.full(free_units + 1, inf)
    best[0] = 0.0
    choices = []
    for opt in options:
        new = np.full(free_units + 1, inf)
        pick = np.full(free_units + 1, -1, dtype=np.int64)
        for k, (u, d) in enumerate(zip(opt.units, opt.durations, strict=True)):
            if u > free_units:
                break
            cand = best[: free_units + 1 - u] + d
            better = cand < new[u:]
            new[u:] = np.where(better, cand, new[u:])
            pick[u:] = np.where(better, k, pick[u:])
        best = new
        choices.append(pick)
    # Least total; among equal totals, fewest units (leave the rest free for later arrivals).
    j = int(np.argmin(best))
    chosen = [0] * len(options)
    for i in range(len(options) - 1, -1, -1):
        k = int(choices[i][j])
        chosen[i] = k
        j -= options[i].units[k]
    return chosen


def total_duration(options: Sequence[Options], chosen: Sequence[int]) -> float:
    return sum(o.durations[k] for o, k in zip(options, chosen, strict=True))
