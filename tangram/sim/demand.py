"""The GPU demand a trace implies, as an operator sizing static replicas would know it."""

from __future__ import annotations

from tangram.core.cells import smallest_cell_for
from tangram.core.demand import ServiceDemand
from tangram.core.resources import ClusterSpec
from tangram.trace import Trace, row_to_action


def expected_demand(trace: Trace, cluster: ClusterSpec) -> tuple[ServiceDemand, ...]:
    """Per GPU service: the GPUs of one replica (the smallest cell its memory fits on the
    cluster's GPU nodes) and the GPU-seconds of all its calls at that cell.

    This is the operator's foreknowledge (popularity x call cost over the run); a service
    that fits on no node is left out (its calls are rejected whatever the sizing).
    """
    if not cluster.gpu_nodes:
        return ()
    node = max(cluster.gpu_nodes, key=lambda n: (n.gpus, n.gpu_memory_gb))
    seconds: dict[str, float] = {}
    cells: dict[str, int] = {}
    for row in trace.rows:
        if row.resource != "gpu" or not row.service:
            continue
        k = cells.get(row.service)
        if k is None:
            k = smallest_cell_for(row.service_size_gb, node.gpu_memory_gb, node.gpus)
            if k is None:
                continue
            cells[row.service] = k
        curve = row_to_action(row, row.trajectory, 0.0).curve
        seconds[row.service] = seconds.get(row.service, 0.0) + curve.duration(k) * k
    return tuple(
        ServiceDemand(service, cells[service], seconds[service]) for service in sorted(seconds)
    )
