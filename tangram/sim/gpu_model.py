"""How the simulator prices one GPU call: dispatch overhead, restore, call time under load.

Without a calibration (the defaults) a call costs what it always did: its curve's duration,
plus the core's restore estimate when it restores. ``Overheads.gpu_call_s`` adds a dispatch
cost to every call and ``gpu_h2d_gbps`` / ``gpu_restore_fixed_s`` replace the cluster file's
restore figures. A measured record (``GpuCalibration``, one per service, from ``tangram
calibrate gpu``) prices its own service's calls instead: its dispatch overhead (for the host
cores busy at the call's start, where it measured that), its restore
(bytes per GPU / bandwidth + fixed) and, when it names the CPU node whose cores the calls share
(a CPU-backed device), its slow-down for the cores busy there when the call starts (held by
CPU actions, and by the node's other calls when they compute on the host).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

from tangram.core.resources import GpuNodeSpec
from tangram.core.state import ClusterState
from tangram.sim.config import Overheads
from tangram.trace.gpu_calibration import GpuCalibration


@dataclass(frozen=True)
class GpuCallModel:
    """The GPU call pricing of one simulation (overheads plus the records by service)."""

    overheads: Overheads
    records: Mapping[str, GpuCalibration]

    @classmethod
    def of(cls, overheads: Overheads, records: tuple[GpuCalibration, ...]) -> GpuCallModel:
        return cls(overheads, {r.service: r for r in records})

    def check(self, state: ClusterState) -> None:
        """Refuse a record naming nodes the cluster lacks (a record for another machine)."""
        for r in self.records.values():
            if r.gpu_node is None:
                continue
            if r.gpu_node not in state.gpu or r.host_cpu_node not in state.cpu:
                raise ValueError(
                    f"GPU calibration of {r.service!r}: names GPU node {r.gpu_node!r} sharing "
                    f"the cores of CPU node {r.host_cpu_node!r}; the cluster has GPU nodes "
                    f"{sorted(state.gpu)} and CPU nodes {sorted(state.cpu)}"
                )

    def at_start(
        self, service: str, node: str, cells: int, state: ClusterState, action_id: str
    ) -> tuple[float, float]:
        """A call's per-call overhead and the factor on its duration when it starts on ``node``
        with ``cells`` GPUs: its record's for the host cores then busy (held by CPU actions,
        plus the record's ``host_cores_per_gpu`` per GPU of its node held by another call;
        ``action_id``: this call's, not counted; a dedicated replica's cell is not a call),
        where the record names the node's host; else the idle overhead and no slow-down."""
        record = self.records.get(service)
        if record is None:
            return self.overheads.gpu_call_s, 1.0
        if record.gpu_node != node or record.host_cpu_node is None:
            return record.overhead_s(0.0), 1.0
        busy = self._busy(record, node, state, action_id)
        return record.overhead_s(busy), record.slowdown(cells, busy)

    def restore_s(
        self, service: str, size_gb: float, shards: int, node: GpuNodeSpec, estimate: float
    ) -> float:
        """The restore's duration (``shards``: GPUs each copying 1/shards of ``size_gb``
        concurrently; 1 for whole replicas): the record's, else the overheads' figures (the
        node's where one is None), else the core's ``estimate`` from the cluster file."""
        record = self.records.get(service)
        if record is not None:
            return record.restore_s(size_gb, shards)
        ov = self.overheads
        if ov.gpu_h2d_gbps is None and ov.gpu_restore_fixed_s is None:
            return estimate
        gbps = node.h2d_gbps if ov.gpu_h2d_gbps is None else ov.gpu_h2d_gbps
        fixed = node.restore_fixed_s if ov.gpu_restore_fixed_s is None else ov.gpu_restore_fixed_s
        return size_gb / (shards * gbps) + fixed

    @staticmethod
    def _busy(record: GpuCalibration, node: str, state: ClusterState, action_id: str) -> float:
        """Host cores busy for a call of ``record`` starting on ``node`` (see ``at_start``)."""
        cpu = state.cpu[record.host_cpu_node or ""]
        busy: float = cpu.spec.cores - cpu.free_cores
        if record.host_cores_per_gpu:
            calls = sum(
                1
                for owner in state.gpu[node].owner
                if owner is not None and owner != action_id and not owner.startswith("dedicated:")
            )
            busy += record.host_cores_per_gpu * calls
        return busy
