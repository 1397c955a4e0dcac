"""The AOE warm pool in ``GET /metrics`` (read from the CPU executor's manager when scraped).

| metric | type | labels | meaning |
|---|---|---|---|
| ``tangram_warm_pool_parked`` | gauge | key | clean parked containers ready to hand out |
| ``tangram_warm_pool_in_use`` | gauge | key | pool containers held by trajectories |
| ``tangram_warm_pool_target`` | gauge | key | containers the key keeps (recent demand, bounded) |
| ``tangram_warm_pool_resetting`` | gauge | | containers being reset after use |
| ``tangram_warm_pool_events_total`` | counter | event | hits, misses, resets, reset_failed, created, ... |

``key`` is ``image/memory``. Nothing is reported when the service has no pool.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily
from prometheus_client.registry import Collector

#: The pool's counters shown as events (the sum of reset times is left to the benchmark).
EVENTS = (
    "hits",
    "misses",
    "resets",
    "reset_failed",
    "created",
    "create_failed",
    "removed_surplus",
    "removed_stale",
    "died_parked",
)


class PoolCollector(Collector):
    """Reads ``runtime.cpu.aoe.pool_stats()`` at each scrape."""

    def __init__(self, runtime: Any) -> None:
        self.runtime = runtime

    def collect(self) -> Iterator[Any]:
        cpu = getattr(self.runtime, "cpu", None)
        stats_of = getattr(getattr(cpu, "aoe", None), "pool_stats", None)
        stats = stats_of() if stats_of is not None else None
        if stats is None:
            return
        for name, doc, values in (
            ("tangram_warm_pool_parked", "Clean parked containers.", stats.parked),
            ("tangram_warm_pool_in_use", "Pool containers held by trajectories.", stats.in_use),
            ("tangram_warm_pool_target", "Containers the key keeps.", stats.target),
        ):
            family = GaugeMetricFamily(name, doc, labels=["key"])
            for key, n in sorted(values.items()):
                family.add_metric([key], n)
            yield family
        yield GaugeMetricFamily(
            "tangram_warm_pool_resetting", "Containers being reset.", value=stats.resetting
        )
        events = CounterMetricFamily(
            "tangram_warm_pool_events", "Warm pool events.", labels=["event"]
        )
        for event in EVENTS:
            events.add_metric([event], stats.counters.get(event, 0))
        yield events
