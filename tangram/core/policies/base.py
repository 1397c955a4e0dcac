"""The policy contract, and the composite that gives each resource kind its own rule.

A policy is an object with a ``name``, its declared ``capabilities``
(``tangram.core.capabilities``: what it promises, so the scheduler never probes it),
``schedule(ctx)`` and the trajectory hooks; it reads the queues and free capacity from the
``Context`` and acts through ``ctx.start`` / ``ctx.defer`` / ``ctx.reject``. ``BasePolicy``
gives the defaults. Most policies treat CPU nodes, the GPU pool and API endpoints differently,
so they are a ``CompositePolicy`` of one ``DomainRule`` per kind, each declaring its
``RuleTraits``.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Protocol

from tangram.core.action import Action
from tangram.core.backlog import Domain
from tangram.core.capabilities import Capabilities
from tangram.core.context import Context
from tangram.core.demand import ServiceDemand


class Policy(Protocol):
    name: str
    capabilities: Capabilities

    def schedule(self, ctx: Context) -> None: ...

    def on_trajectory_open(self, ctx: Context, trajectory: str, node: str) -> None: ...

    def on_trajectory_close(self, ctx: Context, trajectory: str) -> None: ...

    def expect(self, demands: tuple[ServiceDemand, ...]) -> None: ...


class BasePolicy:
    """Defaults for a policy: it promises nothing and ignores trajectory opens and closes."""

    name = "policy"
    capabilities = Capabilities()

    def schedule(self, ctx: Context) -> None:  # pragma: no cover
        raise NotImplementedError

    def on_trajectory_open(self, ctx: Context, trajectory: str, node: str) -> None:
        """A trajectory's container was placed on ``node`` (reservations only, no starts)."""

    def on_trajectory_close(self, ctx: Context, trajectory: str) -> None:
        """Release whatever the policy held for the trajectory."""

    def on_withdraw(self, action: Action) -> None:
        """A queued action left without a decision of the policy's (withdrawn by its client,
        or rejected as its trajectory closed): drop what the policy kept under its id, which
        the driver may later forget and reuse. Optional: the scheduler calls it when present."""

    def expect(self, demands: tuple[ServiceDemand, ...]) -> None:
        """The load each GPU service is expected to get (before any action; optional)."""

    def __repr__(self) -> str:
        return f"<policy {self.name}>"


@dataclass(frozen=True)
class RuleTraits:
    """What a ``DomainRule`` declares about its ``schedule_domain`` (the defaults: nothing)."""

    #: It decides only about the domain's queued actions (see ``Capabilities.queue_driven``).
    queue_driven: bool = False
    #: Its ``alone(node, options)`` says what ``schedule_domain`` decides for a lone
    #: CPU arrival into an empty queue (a queue-driven CPU rule only).
    lone_arrival: bool = False
    #: It overrides ``observe``, which must then see every pass's arrivals and completions.
    observes: bool = False
    #: Its CPU starts are requests, not exclusive cores: running actions share their node's
    #: cycles the way Linux CFS does (a burstable pod). The simulator models that sharing
    #: (``tangram.sim.cfs``); the live runtime, which grants exclusive cores, refuses it.
    shares_cpu: bool = False
    #: Its CPU grants are CFS weights over the node's cores (``ElasticTuning.lend_idle_cycles``):
    #: the core still counts each grant's cores as held (weights never sum past the node), but
    #: a driver that can runs the action's threads on any idle cycle of the node; one that
    #: cannot keeps exclusive cores, which is the same decision, less work-conserving.
    lends_idle: bool = False
    #: Its pass may grow and shrink running malleable actions (a completion with nothing queued
    #: may grow them, a lone arrival shrink them): the queue-driven shortcuts then hold only on
    #: a node where none runs, which the scheduler checks.
    resizes: bool = False
    #: It reads ``Scheduler.arrivals`` (generation gaps per node), which is kept only then.
    tracks_arrivals: bool = False


class DomainRule:
    """How one resource kind is scheduled. Override ``schedule_domain``; hooks are optional.

    A rule declares its ``traits``. They describe one ``schedule_domain``: a subclass that
    writes its own ``schedule_domain`` and does not declare ``traits`` again gets none (it
    cannot inherit a shortcut its parent's pass earned), and one that overrides ``observe``
    must say so, or the class is refused when it is defined.
    """

    traits = RuleTraits()

    def __init_subclass__(cls, **kwargs: object) -> None:
        super().__init_subclass__(**kwargs)
        own = cls.__dict__
        if "schedule_domain" in own and "traits" not in own:
            cls.traits = RuleTraits()
        if "observe" in own and not cls.traits.observes:
            raise TypeError(
                f"{cls.__name__} overrides observe(): declare traits = RuleTraits(observes=True)"
            )
        if cls.traits.lone_arrival and not (cls.traits.queue_driven and hasattr(cls, "alone")):
            raise TypeError(f"{cls.__name__}: lone_arrival needs queue_driven and an alone()")

    def observe(self, ctx: Context) -> None:
        """See the pass's arrivals and completions before any domain is scheduled."""

    def schedule_domain(self, ctx: Context, domain: Domain) -> None:  # pragma: no cover
        raise NotImplementedError

    def on_trajectory_open(self, ctx: Context, trajectory: str, node: str) -> None:
        """A trajectory's container was placed on ``node`` (reservations only, no starts)."""

    def on_trajectory_close(self, ctx: Context, trajectory: str) -> None:
        """Release whatever the rule held for the trajectory."""

    def on_withdraw(self, action: Action) -> None:
        """A queued action left without the rule's decision: drop what it kept under its id."""

    def expect(self, demands: tuple[ServiceDemand, ...]) -> None:
        """The load each GPU service is expected to get (a static sizing reads it)."""


class CompositePolicy(BasePolicy):
    """A named policy made of one rule per resource kind ("cpu", "gpu", "api")."""

    def __init__(self, name: str, *, cpu: DomainRule, gpu: DomainRule, api: DomainRule) -> None:
        self.name = name
        self.rules = {"cpu": cpu, "gpu": gpu, "api": api}
        # Only rules that observe need to see every pass (a hot path).
        self._observers = [r for r in self.rules.values() if r.traits.observes]
        queue_driven = not self._observers and all(
            r.traits.queue_driven for r in self.rules.values()
        )
        self.capabilities = Capabilities(
            queue_driven=queue_driven,
            # The CPU rule's decision for a lone arrival into an empty queue, when it has one.
            alone=cpu.alone if queue_driven and cpu.traits.lone_arrival else None,  # type: ignore[attr-defined]
            cpu_shared=cpu.traits.shares_cpu,
            cpu_lends_idle=cpu.traits.lends_idle,
            resizes=cpu.traits.resizes,
            tracks_arrivals=cpu.traits.tracks_arrivals,
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

    def on_withdraw(self, action: Action) -> None:
        self.rules[action.resource.value].on_withdraw(action)

    def expect(self, demands: tuple[ServiceDemand, ...]) -> None:
        for rule in self.rules.values():
            rule.expect(demands)
