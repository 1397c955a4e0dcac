"""The records the EOE manager hands out: per-call outcomes, evictions, services and statistics.

All are frozen dataclasses; ``CallOutcome`` is the one result every call gets, success or error,
with its timings, so the live runtime can report "exactly one outcome per action".
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from typing import Any

from tangram.exec.eoe.errors import EoeError

OK = "ok"
ERROR = "error"


@dataclass(frozen=True)
class ServiceInfo:
    """A registered service as the executor sees it (sizes in bytes, per GPU)."""

    name: str
    dops: tuple[int, ...]
    #: Bytes of the parameters and buffers themselves.
    weight_bytes: int
    #: Bytes of one replica's device buffer (weights plus alignment padding).
    replica_bytes: int
    #: Bytes claimed on a GPU while a replica is resident: max(declared memory_bytes, replica_bytes).
    resident_bytes: int
    #: Extra bytes claimed on each GPU of the cell while a call runs.
    workspace_bytes: int
    #: Whether the host backup is page-locked.
    pinned: bool
    #: Seconds taken by the factory and the backup at registration.
    build_s: float
    #: 1: data-parallel replicas (a whole copy per GPU); k: split by layers over a k-GPU cell,
    #: each GPU holding one shard (``resident_bytes`` is then the largest shard's).
    shards: int = 1
    #: The one GPU an engine service runs on; None: any cell.
    home: int | None = None

    @property
    def parallelism(self) -> str:
        """How a cell of several GPUs runs the service: "replicas" or "layers"."""
        return "layers" if self.shards > 1 else "replicas"

    @property
    def need_bytes(self) -> int:
        """Bytes one GPU must have for a call: resident state plus workspace."""
        return self.resident_bytes + self.workspace_bytes


@dataclass(frozen=True)
class CallOutcome:
    """What one call produced (``value``) or why it failed (``error``), and where the time went.

    ``queue_s``: waiting for the cell's GPUs to be free and for memory to be freed by other
    calls; ``evict_s``: evictions this call made; ``restore_s``: restores this call made
    (allocation, host-to-device copy, rebuilding the module); ``exec_s``: running the call
    function on the replicas, with inputs moved to and results moved from the devices;
    ``total_s``: all of it, from entry to return.
    """

    service: str
    status: str
    value: Any = None
    error: EoeError | None = None
    gpus: tuple[int, ...] = ()
    dop: int = 0
    #: True when every replica the call used was already resident (no restore, no waiting for one).
    hit: bool = False
    restored_gpus: tuple[int, ...] = ()
    #: (service, gpu) of each replica this call evicted to make room.
    evicted: tuple[tuple[str, int], ...] = ()
    queue_s: float = 0.0
    evict_s: float = 0.0
    restore_s: float = 0.0
    exec_s: float = 0.0
    total_s: float = 0.0
    #: The error's formatted traceback (the exception itself is kept without its frames).
    detail: str = ""

    @property
    def ok(self) -> bool:
        return self.status == OK

    @property
    def message(self) -> str:
        return "" if self.error is None else f"{type(self.error).__name__}: {self.error}"

    def unwrap(self) -> Any:
        """The value, or the call's error raised."""
        if self.error is not None:
            raise self.error
        return self.value

    def timings(self) -> dict[str, float]:
        return {
            "queue_s": self.queue_s,
            "evict_s": self.evict_s,
            "restore_s": self.restore_s,
            "exec_s": self.exec_s,
            "total_s": self.total_s,
        }


@dataclass(frozen=True)
class EvictOutcome:
    """An explicit eviction: the GPUs the service left, the bytes freed and the time taken."""

    service: str
    gpus: tuple[int, ...]
    bytes_freed: int
    evict_s: float


@dataclass(frozen=True)
class DeviceStats:
    """One device's memory and occupancy at one moment (bytes)."""

    index: int
    backend: str
    name: str
    budget_bytes: int
    #: Bytes the manager accounts for: resident replicas, replicas being evicted, workspaces.
    claimed_bytes: int
    #: Bytes really allocated (the allocator's figure; on CPU the live buffers of the device).
    allocated_bytes: int
    peak_allocated_bytes: int
    running_calls: int
    resident: tuple[str, ...]
    nvml_total_bytes: int | None = None
    nvml_used_bytes: int | None = None


@dataclass(frozen=True)
class EoeStats:
    """Counters since the manager started, and the devices now."""

    calls: int
    ok: int
    errors: int
    hits: int
    misses: int
    restores: int
    evictions: int
    bytes_restored: int
    bytes_evicted: int
    #: Seconds of completed restores, which restored ``bytes_restored``: their rate.
    restore_s: float
    evict_s: float
    #: Evictions after which the allocator did not show the replica's bytes freed.
    unverified_evictions: int
    #: Seconds spent on restores that failed (counted apart from ``restore_s``).
    failed_restore_s: float = 0.0
    errors_by_type: dict[str, int] = field(default_factory=dict)
    devices: tuple[DeviceStats, ...] = ()

    def as_dict(self) -> dict[str, Any]:
        return asdict(self)
