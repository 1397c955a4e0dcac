"""``EoeConfig``: how the EOE executor finds its devices and budgets their memory."""

from __future__ import annotations

import numbers
from dataclasses import dataclass

from tangram.exec.eoe.errors import shown

GIB = 1 << 30

#: Per-device budget on CPU when none is configured.
DEFAULT_CPU_DEVICE_MEMORY = 1 * GIB
#: Logical devices on CPU when none is configured.
DEFAULT_CPU_DEVICES = 2
#: Most devices one executor manages: devices=10**9 on CPU tried to create 10**9 of them.
MAX_DEVICES = 1024


def _whole(value: object) -> bool:
    """True for an int that is no bool (True passed isinstance(int): devices=True opened one
    device, device_memory_bytes=True budgeted 1 byte)."""
    return isinstance(value, int) and not isinstance(value, bool)


@dataclass(frozen=True)
class EoeConfig:
    """Configuration of an ``EoeManager``.

    ``backend``: ``"cuda"`` (GPUs found with pynvml and torch), ``"cpu"`` (logical devices
    backed by host memory with a per-device budget, so that all of the logic runs without a
    GPU) or ``"auto"`` (cuda when torch sees a GPU, else cpu).

    ``devices``: how many devices to manage (the first N, at most ``MAX_DEVICES``). On CUDA,
    None means all visible GPUs; on CPU, None means ``DEFAULT_CPU_DEVICES``.

    ``device_memory_bytes``: the budget of each device. On CUDA, None means
    ``memory_fraction`` of the GPU's total memory as reported by NVML; on CPU, None means
    ``DEFAULT_CPU_DEVICE_MEMORY``.

    ``calls_per_gpu``: how many calls may run on one GPU at once (1: a GPU belongs to one call,
    the scheduler core's model; more lets several small services share a GPU concurrently).

    ``host_memory_bytes``: budget for the host backups of all services (None: unlimited).
    ``pin_host_memory``: page-lock backups (None: when the backend is cuda).
    """

    backend: str = "auto"
    devices: int | None = None
    device_memory_bytes: int | None = None
    memory_fraction: float = 0.9
    calls_per_gpu: int = 1
    host_memory_bytes: int | None = None
    pin_host_memory: bool | None = None

    def __post_init__(self) -> None:
        if self.backend not in ("auto", "cpu", "cuda"):
            raise ValueError(f"backend must be 'auto', 'cpu' or 'cuda', got {shown(self.backend)}")
        if self.devices is not None and (not _whole(self.devices) or self.devices < 1):
            raise ValueError(f"devices must be a positive int or None, got {shown(self.devices)}")
        if self.devices is not None and self.devices > MAX_DEVICES:
            raise ValueError(f"devices must be at most {MAX_DEVICES}, got {shown(self.devices)}")
        if self.device_memory_bytes is not None and (
            not _whole(self.device_memory_bytes) or self.device_memory_bytes < 1
        ):
            raise ValueError(
                f"device_memory_bytes must be a positive int or None, got {shown(self.device_memory_bytes)}"
            )
        fraction = self.memory_fraction
        if (
            isinstance(fraction, bool)
            or not isinstance(fraction, numbers.Real)
            or not 0 < fraction <= 1
        ):
            raise ValueError(f"memory_fraction must be a number in (0, 1], got {shown(fraction)}")
        if not _whole(self.calls_per_gpu) or self.calls_per_gpu < 1:
            raise ValueError(
                f"calls_per_gpu must be a positive int, got {shown(self.calls_per_gpu)}"
            )
        if self.host_memory_bytes is not None and (
            not _whole(self.host_memory_bytes) or self.host_memory_bytes < 1
        ):
            raise ValueError(
                f"host_memory_bytes must be a positive int or None, got {shown(self.host_memory_bytes)}"
            )
        if not isinstance(self.pin_host_memory, bool | None):
            raise ValueError(
                f"pin_host_memory must be True, False or None, got {shown(self.pin_host_memory)}"
            )
