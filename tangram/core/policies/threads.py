"""Told threads: a non-malleable CPU action starts on the cores free now, told to run the
thread count of its fastest option, and its grant grows to that count as cores free up.

A non-malleable program sizes its thread pool once, at start, from what it is told
(``TANGRAM_CORES``, ``OMP_NUM_THREADS``). Told only the cores free now, it is
stuck there for its whole run: an 800-s job started on one core of a node whose other actions
end seconds later runs 800 s. Told more threads than cores, its threads time-slice on its own
cores (the work of a fixed pool on fewer cores: the parallel part at the cores' rate, the
serial part on one, as a Kubernetes pod's threads share its CPU), and the malleable steps
(``malleable.py``) grow its grant up to its thread count, never past it (``resize.growth_cap``).

The thread count is its fastest option's units, cut at the knee (``waits.knee_of``) while
other trajectories on the node are generating, as a fixed grant would be.
"""

from __future__ import annotations

from tangram.core.backlog import Domain
from tangram.core.context import Context
from tangram.core.policies.waits import generating, knee_of
from tangram.core.round import Round


def told_threads(ctx: Context, domain: Domain, rnd: Round) -> list[int]:
    """Per kept action, the thread count it is told (0 for a malleable one)."""
    others = None
    threads = []
    for action, units in zip(rnd.kept, rnd.units, strict=True):
        if action.malleable:
            threads.append(0)
            continue
        opts = ctx.options(action)
        top = opts.units[opts.fastest]
        if top > units:
            if others is None:
                others = generating(ctx, domain)
            if others:
                top = knee_of(opts, top)
        threads.append(max(top, units))
    return threads
