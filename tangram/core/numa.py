"""NUMA-local core choice, the one owner of the rule (the core's CPU state and AOE both ask it).

A grant of n cores takes them from one NUMA domain when any domain has n free: the best fit,
the domain with the fewest free cores that still holds n (ties: the lowest domain), so large
free domains stay whole for large grants. Otherwise it spans as few domains as possible,
taking the domains with the most free cores first (ties: the lowest domain). Within a domain,
the caller takes its lowest free core ids. Deterministic: the same free sets, the same picks.
"""

from __future__ import annotations

import math
from collections.abc import Sequence, Sized

_NO_DOMAIN = math.inf  # more free cores than any domain has


def numa_picks(free_by_domain: Sequence[Sized], n: int) -> list[tuple[int, int]]:
    """(domain index, how many of its free cores) for a grant of ``n`` cores, in the order the
    cores are taken; the caller checks that ``n`` cores are free in all."""
    best, best_free = -1, _NO_DOMAIN
    for d, domain in enumerate(free_by_domain):  # the first of the fullest domains that fit
        free = len(domain)
        if n <= free < best_free:
            best, best_free = d, free
    if best >= 0:
        return [(best, n)]
    picks = []
    left = n
    for _, d in sorted([(-len(s), d) for d, s in enumerate(free_by_domain)]):
        k = min(left, len(free_by_domain[d]))
        picks.append((d, k))
        left -= k
        if left == 0:
            break
    return picks
