"""The policy interface and the composite that gives each resource kind its own rule.

A policy is any object with ``schedule(ctx)``; it reads the queues and free capacity from the
``Context`` and acts through ``ctx.start`` / ``ctx.defer`` / ``ctx.reject``. Most policies
treat CPU nodes, the GPU pool and API endpoints differently, so they are built as a
``CompositePolicy`` of one ``DomainRule`` per kind.
"""

from __future__ import annotations

from typing import Protocol

from tangram.core.scheduler import Context, Domain


class Policy(Protocol):
    name: str

    def schedule(self, ctx: Context) -> None: ...


class DomainRule:
    """How one resource kind is scheduled. Override ``schedule_domain``; hooks are optional."""

    #: True when ``schedule_domain`` decides only about the domain's queued actions, so a pass
    #: in which no freed domain has any is a no-op the scheduler may skip. Off by default: a
    #: rule that acts on something else (a static pod granted to a waiting trajectory) must run.
    queue_driven: bool = False

    def observe(self, ctx: Context) -> None:
        """See the pass's arrivals and completions before any domain is scheduled."""

    def schedule_domain(self, ctx: Context, domain: Domain) -> None:  # pragma: no cover
        raise NotImplementedError

    def on_trajectory_open(self, ctx: Context, trajectory: str, node: str) -> None:
        """A trajectory's container was placed on ``node`` (reservations only, no starts)."""

    def on_trajectory_close(self, ctx: Context, trajectory: str) -> None:
        """Release whatever the rule held for the trajectory."""


def _promised_by_its_scheduler(rule: DomainRule, name: str) -> bool:
    """Whether ``name`` comes from the class whose ``schedule_domain`` the rule runs (or a
    subclass of it). ``queue_driven`` and ``alone`` describe one ``schedule_domain``: a subclass
    that rewrites it and does not declare them again gets neither shortcut."""
    mro = type(rule).__mro__
    scheduler = next(c for c in mro if "schedule_domain" in c.__dict__)
    owner = next((c for c in mro if name in c.__dict__), None)
    return owner is not None and issubclass(owner, scheduler)


class CompositePolicy:
    """A named policy made of one rule per resource kind ("cpu", "gpu", "api")."""

    unbounded = False

    def __init__(self, name: str, *, cpu: DomainRule, gpu: DomainRule, api: DomainRule) -> None:
        self.name = name
        self.rules = {"cpu": cpu, "gpu": gpu, "api": api}
        # Only rules that override observe() need to see every pass (a hot path).
        self._observers = [
            r for r in self.rules.values() if type(r).observe is not DomainRule.observe
        ]
        self.queue_driven = not self._observers and all(
            r.queue_driven and _promised_by_its_scheduler(r, "queue_driven")
            for r in self.rules.values()
        )
        #: The CPU rule's decision for a lone arrival into an empty queue, when it has one
        #: (the scheduler then skips the queue and the pass for it).
        self.alone = (
            cpu.alone  # type: ignore[attr-defined]
            if self.queue_driven and _promised_by_its_scheduler(cpu, "alone")
            else None
        )

    def schedule(self, ctx: Context) -> None:
        for rule in self._observers:
            rule.observe(ctx)
        for domain in list(ctx.dirty):
            self.rules[domain[0]].schedule_domain(ctx, domain)

    def on_trajectory_open(self, ctx: Context, trajectory: str, node: str) -> None:
        for rule in self.rules.values():
            rule.on_trajectory_open(ctx, trajectory, node)

    def on_trajectory_close(self, ctx: Context, trajectory: str) -> None:
        for rule in self.rules.values():
            rule.on_trajectory_close(ctx, trajectory)

    def __repr__(self) -> str:
        return f"<policy {self.name}>"
