"""What runs: every started action with where it runs and when the core expects it to end."""

from __future__ import annotations

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


class RunningSet:
    """Running actions by id and by domain (a policy reads a domain's for its projections)."""

    __slots__ = ("by_id", "by_domain", "malleable")

    def __init__(self) -> None:
        self.by_id: dict[str, Running] = {}
        self.by_domain: dict[Domain, dict[str, Running]] = {}
        #: Running malleable actions per domain (a pass may resize them: the scheduler's
        #: queue-driven shortcuts hold only where none runs).
        self.malleable: dict[Domain, int] = {}

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
        if action.malleable:
            self.malleable[domain] = self.malleable.get(domain, 0) + 1

    def replace(self, running: Running) -> None:
        """A running action's grant changed (a resize): its record is the new one."""
        action_id = running.action.id
        self.by_id[action_id] = running
        self.by_domain[running.domain][action_id] = running

    def pop(self, action_id: str) -> Running:
        """The action ended: it leaves the set (its units are the caller's to return)."""
        running = self.by_id.pop(action_id)
        del self.by_domain[running.domain][action_id]
        if running.action.malleable:
            self.malleable[running.domain] -= 1
        return running

    def in_domain(self, domain: Domain) -> Iterator[Running]:
        return iter(self.by_domain.get(domain, _NOTHING).values())
