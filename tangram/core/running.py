"""What runs: every started action with where it runs and when the core expects it to end."""

from __future__ import annotations

import bisect
from collections.abc import Iterator
from typing import NamedTuple

from tangram.core.action import Action
from tangram.core.backlog import Domain
from tangram.core.decision import Start


class Running(NamedTuple):
    """An action that has started, with where it runs and when the core expects it to end.

    (A NamedTuple for the same reason as ``Start``: one per action, on the hot path.)
    """

    action: Action
    start: Start
    domain: Domain
    est_finish: float
    #: The units it started with (a malleable action's grant may change since: ``start.units``).
    base_units: int = 0


_NOTHING: dict[str, Running] = {}


def resizable(running: Running) -> bool:
    """Whether a running action's grant may change: malleable, or told a thread count
    (``Start.threads``), and on cores of its own (not a static pod's)."""
    start = running.start
    return (
        (running.action.malleable or start.threads > 0) and not start.in_slot and bool(start.cores)
    )


def growth_cap(running: Running) -> int:
    """The most cores a running action can use: a malleable one's ``max_units``; a
    non-malleable one's thread count (cores past it would idle)."""
    if running.action.malleable:
        return running.action.max_units
    return running.start.threads or running.base_units


#: Larger than any units count: ``(t, _NO_UNITS)`` sorts after every ``(t, units)``.
_NO_UNITS = 1 << 62


class RunningSet:
    """Running actions by id and by domain (a policy reads a domain's for its projections)."""

    __slots__ = ("by_id", "by_domain", "wide", "_wide_order", "growable", "_finishes")

    def __init__(self) -> None:
        self.by_id: dict[str, Running] = {}
        self.by_domain: dict[Domain, dict[str, Running]] = {}
        #: Resizable running actions on more than one core, per domain: the ones a shrink can
        #: take cores from (kept here so a pass need not walk every running action).
        self.wide: dict[Domain, dict[str, Running]] = {}
        #: ``wide``'s (units, id) keys per domain, sorted: a shrink's givers, those holding the
        #: most cores, are its tail (a selection over every wide action cost a pass ~120 us).
        self._wide_order: dict[Domain, list[tuple[int, str]]] = {}
        #: Resizable running actions below their growth cap, per domain: the ones a grow can
        #: give cores to (most told actions start at their cap and never join).
        self.growable: dict[Domain, dict[str, Running]] = {}
        #: Per domain, the sorted (estimated finish, units) of its actions on cores of their
        #: own, built on first read and kept sorted by every change since (a pass's projection
        #: and drain read it; sorting a busy node's ~100 running actions per event cost
        #: ~60 us).
        self._finishes: dict[Domain, list[tuple[float, int]]] = {}

    def __len__(self) -> int:
        return len(self.by_id)

    def __contains__(self, action_id: str) -> bool:
        return action_id in self.by_id

    def add(self, start: Start, domain: Domain) -> None:
        action = start.action
        running = Running(
            action, start, domain, start.time + start.est_duration + start.est_overhead, start.units
        )
        self.by_id[action.id] = running
        by_domain = self.by_domain.get(domain)
        if by_domain is None:
            by_domain = self.by_domain[domain] = {}
        by_domain[action.id] = running
        ordered = self._finishes.get(domain)
        if ordered is not None and not start.in_slot:
            bisect.insort(ordered, (running.est_finish, start.units))
        if action.malleable or start.threads:
            self._file_resizable(running)

    def replace(self, running: Running) -> None:
        """A running action's grant changed (a resize): its record is the new one."""
        action_id = running.action.id
        before = self.by_id[action_id]
        self.by_id[action_id] = running
        self.by_domain[running.domain][action_id] = running
        ordered = self._finishes.get(running.domain)
        if ordered is not None:
            _unfinish(ordered, before)
            if not running.start.in_slot:
                bisect.insort(ordered, (running.est_finish, running.start.units))
        self._file_resizable(running)

    def pop(self, action_id: str) -> Running:
        """The action ended: it leaves the set (its units are the caller's to return)."""
        running = self.by_id.pop(action_id)
        del self.by_domain[running.domain][action_id]
        ordered = self._finishes.get(running.domain)
        if ordered is not None:
            _unfinish(ordered, running)
        if running.action.malleable or running.start.threads:
            wide = self.wide.get(running.domain)
            if wide is not None:
                filed = wide.pop(action_id, None)
                if filed is not None:
                    _unfile(self._wide_order[running.domain], filed)
                self.growable[running.domain].pop(action_id, None)
        return running

    def finishes(self, domain: Domain, now: float) -> list[tuple[float, int]]:
        """(Estimated finish, units) of the domain's actions on cores of their own (not in a
        static pod's), sorted, finishes already past moved to ``now``: the busy units a
        projection frees, in order."""
        ordered = self._sorted_finishes(domain)
        past = bisect.bisect_right(ordered, (now, _NO_UNITS))  # those ending at or before now
        if not past:
            return list(ordered)
        # (Moved to now, the past ones sort by units among themselves; the rest keep order.)
        return sorted([(now, units) for _, units in ordered[:past]]) + ordered[past:]

    def busy_core_seconds(self, domain: Domain, now: float) -> float:
        """The expected core-seconds left to the domain's actions on cores of their own: the
        sum over ``finishes`` of (finish - now) x units, those past ``now`` counting nothing
        (read from the cached sorted finishes: no walk over the running actions' records)."""
        ordered = self._sorted_finishes(domain)
        past = bisect.bisect_right(ordered, (now, _NO_UNITS))
        return sum([(finish - now) * units for finish, units in ordered[past:]])

    def _sorted_finishes(self, domain: Domain) -> list[tuple[float, int]]:
        """(Estimated finish, units) of the domain's actions not in a static pod, sorted: the
        cache, built on first read (``add``, ``replace`` and ``pop`` keep it sorted after)."""
        ordered = self._finishes.get(domain)
        if ordered is not None:
            return ordered
        ordered = self._finishes[domain] = sorted(
            [
                (r.est_finish, r.start.units)
                for r in self.by_domain.get(domain, _NOTHING).values()
                if not r.start.in_slot
            ]
        )
        return ordered

    def widest(self, domain: Domain, n: int) -> list[Running]:
        """The ``n`` wide actions holding the most cores (ties: the larger id first), most first."""
        wide, order = self.wide.get(domain), self._wide_order.get(domain)
        if not wide or not order:
            return []
        return [wide[action_id] for _, action_id in reversed(order[-n:])]

    def _file_resizable(self, running: Running) -> None:
        """File a resizable action under ``wide`` while it holds more than one core and under
        ``growable`` while it holds fewer than its growth cap."""
        domain, action_id, start = running.domain, running.action.id, running.start
        ok = resizable(running)
        wide = self.wide.get(domain)
        if wide is None:
            wide = self.wide[domain] = {}
            self._wide_order[domain] = []
            self.growable[domain] = {}
        growable = self.growable[domain]
        order = self._wide_order[domain]
        filed = wide.get(action_id)  # (its record before this change: the key to move)
        if filed is not None:
            _unfile(order, filed)
        if ok and start.units > 1:
            wide[action_id] = running
            bisect.insort(order, (start.units, action_id))
        elif filed is not None:
            del wide[action_id]
        if ok and start.units < growth_cap(running):
            growable[action_id] = running
        elif action_id in growable:
            del growable[action_id]

    def in_domain(self, domain: Domain) -> Iterator[Running]:
        return iter(self.by_domain.get(domain, _NOTHING).values())


def _unfile(order: list[tuple[int, str]], running: Running) -> None:
    """Drop a wide action's key (as it was filed) from its domain's sorted keys."""
    key = (running.start.units, running.action.id)
    i = bisect.bisect_left(order, key)
    if i == len(order) or order[i] != key:  # (``wide`` and its keys are filed together)
        raise RuntimeError(f"running set out of step: {key} not among the wide keys")
    del order[i]


def _unfinish(ordered: list[tuple[float, int]], running: Running) -> None:
    """Drop a running action's (finish, units) from its domain's sorted finishes (an action in
    a static pod was never filed)."""
    if running.start.in_slot:
        return
    key = (running.est_finish, running.start.units)
    i = bisect.bisect_left(ordered, key)
    if i == len(ordered) or ordered[i] != key:
        raise RuntimeError(f"running set out of step: {key} not among the finishes")
    del ordered[i]
