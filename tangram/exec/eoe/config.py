"""``EoeConfig``: how the EOE executor finds its devices and budgets their memory."""

from __future__ import annotations

from dataclasses import dataclass

GIB = 1 << 30

#: Per-device budget on CPU when none is configured.
DEFAULT_CPU_DEVICE_MEMORY = 1 * GIB
#: Logical devices on CPU when none is configured.
DEFAULT_CPU_DEVICES = 2


@dataclass(frozen=True)
class EoeConfig:
    """Configuration of an ``EoeManager``.

    ``backend``: ``"cuda"`` (GPUs found with pynvml and torch), ``"cpu"`` (logical devices
    backed by host memory with a per-device budget, so that all of the logic runs without a
    GPU) or ``"auto"`` (cuda when torch sees a GPU, else cpu).

    ``devices``: how many devices to manage (the first N). On CUDA, None means all visible
    GPUs; on CPU, None means ``DEFAULT_CPU_DEVICES``.

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
            raise ValueError(f"backend must be 'auto', 'cpu' or 'cuda', got {self.backend!r}")
        if self.devices is not None and (not isinstance(self.devices, int) or self.devices < 1):
            raise ValueError(f"devices must be a positive int or None, got {self.devices!r}")
        if self.device_memory_bytes is not None and (
            not isinstance(self.device_memory_bytes, int) or self.device_memory_bytes < 1
        ):
            raise ValueError(
                f"device_memory_bytes must be a positive int or None, got {self.device_memory_bytes!r}"
            )
        if not 0 < self.memory_fraction <= 1:
            raise ValueError(f"memory_fraction must be in (0, 1], got {self.memory_fraction!r}")
        if not isinstance(self.calls_per_gpu, int) or self.calls_per_gpu < 1:
            raise ValueError(f"calls_per_gpu must be a positive int, got {self.calls_per_gpu!r}")
        if self.host_memory_bytes is not None and (
            not isinstance(self.host_memory_bytes, int) or self.host_memory_bytes < 1
        ):
            raise ValueError(
                f"host_memory_bytes must be a positive int or None, got {self.host_memory_bytes!r}"
            )
