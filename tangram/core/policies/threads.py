"""Told threads: a non-malleable CPU action starts on the cores free now, told to run the
thread count of its fastest option, and its grant grows to that count as cores free up.

A non-malleable program sizes its thread pool once, at start, from what it is told
(``TANGRAM_CORES``, ``OMP_NUM_THREADS``). Told only the cores free now, it is stuck there for
its whole run: an 800-s job started on one core of a node whose other actions end seconds
later runs 800 s. Told more threads than cores, its threads time-slice on its own cores (the
work of a fixed pool on fewer cores: the parallel part at the cores' rate, the serial part on
one, as a Kubernetes pod's threads share its CPU), and the malleable steps (``malleable.py``)
grow its grant up to its thread count, never past it (``running.growth_cap``), and shrink it
for queued actions.

The thread count is its fastest option's units, not cut at the knee: a grant that can shrink
later need not be cut now (random CPU family, 200 instances at seeds 0 / 1000: cutting the
count at the knee while others generate left mean ACT beaten >5% on 11.5 / 8.5% of
instances, not cutting it 8.5 / 5%; step 23.5 / 27.5% -> 19.5 / 20.5%).
"""

from __future__ import annotations

from collections.abc import Callable

from tangram.core.action import Action
from tangram.core.options import Options
from tangram.core.round import Round


def told_threads(rnd: Round, options: Callable[[Action], Options]) -> list[int]:
    """Per kept action, the thread count it is told (0 for a malleable one): its fastest
    option's units, at least its grant."""
    threads = []
    for action, units in zip(rnd.kept, rnd.units, strict=True):
        if action.malleable:
            threads.append(0)
            continue
        opts = options(action)
        threads.append(max(opts.units[opts.fastest], units))
    return threads
