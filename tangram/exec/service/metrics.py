"""Prometheus metrics of a running service (``GET /metrics``), with ``prometheus_client``.

Each service has its own registry (no process-global state). Counters and gauges are read
from the runtime when scraped; the per-action time histograms are fed by an outcome listener.

| metric | type | labels | meaning |
|---|---|---|---|
| ``tangram_actions_submitted_total`` | counter | resource | actions accepted |
| ``tangram_actions_completed_total`` | counter | status | outcomes given (``STATUSES``) |
| ``tangram_actions_refused_total`` | counter | reason | requests refused by an admission bound (``REFUSALS``) |
| ``tangram_actions_pending`` | gauge | | accepted and not yet ended |
| ``tangram_actions_queued`` / ``_running`` | gauge | | in the core's queues / running |
| ``tangram_max_pending`` | gauge | | the admission bound |
| ``tangram_trajectories_open`` | gauge | | open trajectories (containers) |
| ``tangram_cores_held`` / ``tangram_gpus_held`` | gauge | | units granted now |
| ``tangram_api_in_flight`` | gauge | endpoint | API calls in flight |
| ``tangram_scheduler_passes_total`` | counter | | scheduling passes (``advance`` calls) |
| ``tangram_action_{act,queue,overhead,exec}_seconds`` | histogram | resource | per-action times |
| ``tangram_warm_pool_*`` | | | the AOE warm pool (``pool_metrics.py``) |
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

from prometheus_client import CollectorRegistry, Histogram, generate_latest
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily
from prometheus_client.registry import Collector

from tangram.exec.runtime import Outcome, Runtime
from tangram.exec.runtime.records import STATUSES
from tangram.exec.service.pool_metrics import PoolCollector

CONTENT_TYPE = "text/plain; version=0.0.4; charset=utf-8"
#: The refusals of each admission bound (429 ``overloaded``): the runtime's ``max_pending``,
#: and a tenant's ``tenant_max_pending`` and ``tenant_max_trajectories``, by the runtime's
#: counter of each (only the first was counted: a tenant refused all day showed none); and
#: the connections beyond ``--max-connections`` (``GuardedSite``; none were counted), and a
#: tenant's requests beyond ``--tenant-max-connections``.
REFUSALS = {
    "overloaded": "refused_overloaded",
    "tenant": "refused_tenant",
    "tenant_trajectories": "refused_tenant_trajectories",
    "connections": "refused_connections",
    "tenant_connections": "refused_tenant_connections",
}
_BUCKETS = (0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 300)


class _RuntimeCollector(Collector):
    def __init__(self, runtime: Runtime) -> None:
        self.runtime = runtime

    def collect(self) -> Iterator[Any]:
        rt = self.runtime
        c = rt.counters
        submitted = CounterMetricFamily(
            "tangram_actions_submitted", "Actions accepted.", labels=["resource"]
        )
        for r in ("cpu", "gpu", "api"):
            submitted.add_metric([r], c[f"submitted_{r}"])
        yield submitted
        completed = CounterMetricFamily(
            "tangram_actions_completed", "Outcomes given.", labels=["status"]
        )
        for s in STATUSES:  # unknown: actions a previous run accepted and never ended
            completed.add_metric([s], c[f"outcome_{s}"])
        yield completed
        refused = CounterMetricFamily(
            "tangram_actions_refused", "Submissions refused by admission.", labels=["reason"]
        )
        for reason, counter in REFUSALS.items():
            refused.add_metric([reason], c[counter])
        yield refused
        yield CounterMetricFamily(
            "tangram_scheduler_passes", "Scheduling passes (advance calls).", value=rt.passes
        )
        st = rt.scheduler.state
        for name, doc, value in (
            ("tangram_actions_pending", "Accepted actions not yet ended.", rt.pending),
            ("tangram_actions_queued", "Actions in the core's queues.", rt.scheduler.queued),
            ("tangram_actions_running", "Actions running.", len(rt.scheduler.running)),
            ("tangram_max_pending", "The admission bound.", rt.config.max_pending),
            ("tangram_trajectories_open", "Open trajectories.", rt.open_trajectories),
            ("tangram_cores_held", "CPU cores granted now.", st.held_cores),
            ("tangram_gpus_held", "GPUs granted now.", st.held_gpus),
        ):
            yield GaugeMetricFamily(name, doc, value=value)
        api = GaugeMetricFamily(
            "tangram_api_in_flight", "API calls in flight.", labels=["endpoint"]
        )
        for name, a in st.api.items():
            api.add_metric([name], a.in_flight)
        yield api


class ServiceMetrics:
    """The registry of one service, fed by ``runtime``'s outcomes."""

    def __init__(self, runtime: Runtime) -> None:
        self.registry = CollectorRegistry(auto_describe=True)
        self.registry.register(_RuntimeCollector(runtime))
        self.registry.register(PoolCollector(runtime))  # the warm pool, when there is one
        self.hist = {
            part: Histogram(
                f"tangram_action_{part}_seconds",
                f"Per-action {part} time (seconds).",
                ["resource"],
                buckets=_BUCKETS,
                registry=self.registry,
            )
            for part in ("act", "queue", "overhead", "exec")
        }
        runtime.on_outcome.append(self.observe)

    def observe(self, outcome: Outcome) -> None:
        t = outcome.timings
        for part, value in (
            ("act", t.act_s),
            ("queue", t.queue_s),
            ("overhead", t.overhead_s),
            ("exec", t.exec_s),
        ):
            self.hist[part].labels(outcome.resource).observe(value)

    def render(self) -> bytes:
        return generate_latest(self.registry)
