"""A pass's Context whose queue for one domain is read in the policy's own order (the CPU
rule's shortest-first, the GPU rule's per-service merge), not FCFS."""

from __future__ import annotations

from collections.abc import Iterable, Iterator

from tangram.core.action import Action
from tangram.core.backlog import Domain
from tangram.core.context import Context


class OrderedQueue:
    """The pass's Context with one domain's queue read in a given order (``elastic_round``
    reads the queue through ``ctx.queue``; everything else is the Context's). The order may be
    a list or a lazy iterator (read once); an action started since it was made is skipped."""

    __slots__ = ("_ctx", "_domain", "_order")

    def __init__(self, ctx: Context, domain: Domain, order: Iterable[Action]) -> None:
        self._ctx, self._domain, self._order = ctx, domain, order

    def queue(self, domain: Domain) -> Iterator[Action]:
        if domain != self._domain:
            return self._ctx.queue(domain)
        queued = self._ctx.scheduler.backlog.domain_of
        return (a for a in self._order if a.id in queued)  # (one may have started since)

    def __getattr__(self, name: str) -> object:
        return getattr(self._ctx, name)
