"""API endpoints: FCFS within the concurrency quota and the start-rate token bucket."""

from __future__ import annotations

from tangram.core.backlog import Domain
from tangram.core.context import Context
from tangram.core.policies.base import DomainRule, RuleTraits


class FifoApi(DomainRule):
    """Start queued calls in order while a call slot and a rate token are free."""

    traits = RuleTraits(queue_driven=True)

    def schedule_domain(self, ctx: Context, domain: Domain) -> None:
        api = ctx.state.api[domain[1]]
        for action in ctx.queue(domain):
            if not api.can_start(ctx.now):
                wake = api.next_token_at(ctx.now)
                if wake is not None and api.in_flight < api.spec.concurrency:
                    ctx.wake_at(wake)
                return
            ctx.start(
                action, domain[1], 1, f"api: call slot {api.in_flight + 1}/{api.spec.concurrency}"
            )
