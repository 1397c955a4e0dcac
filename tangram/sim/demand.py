"""The GPU demand a trace implies, as an operator sizing static replicas would know it."""

from __future__ import annotations

from tangram.core.cells import unit_options_on
from tangram.core.demand import ServiceDemand
from tangram.core.resources import ClusterSpec
from tangram.trace import Trace, row_to_action


def expected_demand(trace: Trace, cluster: ClusterSpec) -> tuple[ServiceDemand, ...]:
    """Per GPU service: the GPUs of one replica (the smallest cell its memory fits on the
    cluster's GPU nodes, by the core's own rule, ``OptionBuilder.gpu_units``: one node's cell; a service of
    whole replicas needs one GPU to hold all of it) and the GPU-seconds of all its calls at
    that cell.

    This is the operator's foreknowledge (popularity x call cost over the run); a service
    that fits on no node is left out (its calls are rejected whatever the sizing).
    """
    if not cluster.gpu_nodes:
        return ()
    shapes = {(n.gpus, n.gpu_memory_gb) for n in cluster.gpu_nodes}
    seconds: dict[str, float] = {}
    cells: dict[str, int] = {}
    models: dict[str, tuple[float, bool]] = {}
    for row in trace.rows:
        if row.resource != "gpu" or not row.service:
            continue
        k = cells.get(row.service)
        if k is None:
            fits = unit_options_on(row.service_size_gb, shapes, 1, replicas=row.service_replicas)
            if not fits:
                continue
            k = fits[0]
            cells[row.service] = k
            models[row.service] = (row.service_size_gb, row.service_replicas)
        curve = row_to_action(row, row.trajectory, 0.0).curve
        seconds[row.service] = seconds.get(row.service, 0.0) + curve.duration(k) * k
    return tuple(
        ServiceDemand(service, cells[service], seconds[service], *models[service])
        for service in sorted(seconds)
    )
