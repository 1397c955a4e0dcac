"""Moving weights: start a replica's restore from its host backup, wait for the copies, and drop
an evicted replica, checking that the allocator saw its bytes go. The only part of the manager
that touches torch tensors; it decides nothing.
"""

from __future__ import annotations

import gc
from collections.abc import Iterable
from typing import TYPE_CHECKING, Any

from tangram.exec.eoe.devices import Device, is_cuda_oom
from tangram.exec.eoe.errors import (
    DeviceOutOfMemoryError,
    RestoreError,
    RestoreOutOfMemoryError,
    told,
)
from tangram.exec.eoe.execution import FAILURES

if TYPE_CHECKING:
    import torch

    from tangram.exec.eoe.backup import HostBackup
    from tangram.exec.eoe.bookkeeping import Replica


def start_restore(
    service: str, backup: HostBackup, device: Device, gpu: int, shard: int | None = None
) -> tuple[torch.nn.Module | None, torch.Tensor, Any]:
    """A replica of ``service`` (or its shard ``shard``) on ``device`` (the manager's GPU
    ``gpu``) whose copy may still run: (module, None for a shard; its device buffer; a fence to
    wait on). ``RestoreOutOfMemoryError`` for lack of memory (the budget or a real CUDA OOM),
    ``RestoreError`` for anything else, a ``SystemExit`` in an engine's wake-up too (it
    left ``manager.call`` without an outcome, and stopped the live runtime's event loop)."""
    try:
        module, storage = backup.restore(device, sync=False, shard=shard)
    except DeviceOutOfMemoryError as exc:
        raise RestoreOutOfMemoryError(
            f"service {service!r}: out of memory restoring {int(storage_bytes(backup, shard))} bytes to "
            f"GPU {gpu}: {told(exc)}"
        ) from exc
    except FAILURES as exc:  # (SystemExit too: an engine's wake_up is the service's own code)
        if is_cuda_oom(exc):
            raise RestoreOutOfMemoryError(
                f"service {service!r}: CUDA out of memory restoring to GPU {gpu}: {told(exc)}"
            ) from exc
        raise RestoreError(
            f"service {service!r}: restoring to GPU {gpu} failed: {type(exc).__name__}: {told(exc)}"
        ) from exc
    return module, storage, device.fence()


def storage_bytes(backup: HostBackup, shard: int | None) -> int:
    """Bytes of the device buffer a restore of ``shard`` (None: the whole replica) allocates."""
    return backup.nbytes if shard is None else backup.shard_bytes[shard]


def wait_for_copies(fences: Iterable[Any]) -> None:
    """Wait for copies started on several devices (they ran concurrently)."""
    for fence in fences:
        if fence is not None:
            fence.synchronize()


def drop_weights(replica: Replica, device: Device, backup: HostBackup | None) -> tuple[int, int]:
    """Drop an evicted replica's module and buffer: (its bytes, the bytes the allocator freed).

    The skeleton goes back to ``backup`` for reuse. If the allocator's figure did not fall by
    the replica's size, a reference cycle may hold the buffer: collect and look again.
    """
    size = replica.nbytes
    before = device.allocated_bytes()
    if backup is not None and replica.module is not None:
        backup.recycle(replica.module)  # keeps the skeleton, drops the device tensors
    replica.module = None
    replica.storage = None
    freed = before - device.allocated_bytes()
    if freed < size:
        gc.collect()  # a reference cycle in the module may hold the buffer
        freed = before - device.allocated_bytes()
    return size, freed
