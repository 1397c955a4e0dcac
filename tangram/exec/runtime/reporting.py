"""Read-only reports of a live runtime: its status snapshot and its trace's header metadata.

Nothing here changes the runtime; both are read by the service (``GET /v1/status``, trace
downloads) possibly while actions run, so each reads what it needs once.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from tangram.exec.runtime.discovery import cluster_to_dict

if TYPE_CHECKING:
    from tangram.exec.runtime.runtime import Runtime


def status(rt: Runtime) -> dict[str, Any]:
    """A snapshot for people and dashboards: load, holdings, counters, executors, residency."""
    scheduler = rt.scheduler
    st = scheduler.state
    return {
        "policy": rt.config.policy,
        "cluster": rt.cluster.name,
        "uptime_s": round(rt.now(), 3),
        "closing": rt.closing,
        "pending": rt.pending,
        "max_pending": rt.config.max_pending,
        "queued": scheduler.queued,
        "running": len(scheduler.running),
        "waiting": rt.host.table.waiting(),
        "trajectories_open": rt.open_trajectories,
        "held": {
            "cores": st.held_cores,
            "gpus": st.held_gpus,
            "api_in_flight": {name: a.in_flight for name, a in st.api.items()},
        },
        "counters": dict(rt.counters),
        "scheduler_passes": rt.passes,
        "executors": {
            "cpu": rt.cpu.node.name if rt.cpu else None,
            # CPU grants: CFS weights over the node's cores, or exclusive cpusets with a quota.
            "cpu_grants": "weighted" if rt.weighted_cpu else "exclusive",
            "gpu": rt.gpu.node.name if rt.gpu else None,
            "gpu_services": list(rt.gpu.services()) if rt.gpu else [],
            "api": list(rt.api.endpoints()),
        },
        "residency": rt.gpu.eoe.residency() if rt.gpu else {},
        "journal": str(rt.journal.path) if rt.journal is not None else None,
        "trace": {
            "stream": str(rt.recorder.path) if rt.recorder.path is not None else None,
            "rows": len(rt.recorder),
            "rows_dropped": rt.recorder.dropped,
        },
    }


def trace_meta(rt: Runtime) -> dict[str, Any]:
    """The header of the runtime's trace: source, policy, cluster, clock, EOE's figures."""
    meta: dict[str, Any] = {
        "source": "tangram live runtime",
        "policy": rt.config.policy,
        "cluster": cluster_to_dict(rt.cluster),
        "started_at_unix": round(rt.started_unix, 3),
        "clock": "seconds since the runtime started",
        "cpu_grants": "weighted" if rt.weighted_cpu else "exclusive",
        "gpu_residency_at_start": {k: list(v) for k, v in rt.residency_at_record_start.items()},
    }
    if rt.gpu is not None:
        eoe = rt.gpu.eoe
        stats = eoe.stats()
        meta["eoe"] = {
            "backend": eoe.backend,
            "restores": stats.restores,
            "bytes_restored": stats.bytes_restored,
            "restore_s": round(stats.restore_s, 6),
            "evictions": stats.evictions,
            "evict_s": round(stats.evict_s, 6),
        }
    return meta
