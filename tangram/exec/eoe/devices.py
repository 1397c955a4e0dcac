"""The devices of the EOE executor: GPUs found with pynvml, or budgeted logical CPU devices.

A ``Device`` allocates the raw buffers that hold restored weights and reports how many bytes
are really allocated on it, so that the manager can check that an eviction freed memory before
the next restore begins:

- ``CudaDevice``: ``torch.cuda.memory_allocated`` is the figure; allocations beyond the budget,
  and real ``torch.cuda.OutOfMemoryError``, raise ``DeviceOutOfMemoryError``. Total and used
  memory come from NVML (pynvml).
- ``CpuDevice``: a logical device whose tensors live in host memory. It counts the bytes of
  every live buffer it allocated (a finalizer on the buffer's storage subtracts them when the
  last tensor viewing it is freed) and refuses allocations beyond its budget, as a GPU would.
"""

from __future__ import annotations

import collections
import contextlib
import os
import threading
import warnings
import weakref
from collections.abc import Iterator
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from tangram.exec.eoe.config import (
    DEFAULT_CPU_DEVICE_MEMORY,
    DEFAULT_CPU_DEVICES,
    EoeConfig,
)
from tangram.exec.eoe.errors import DeviceOutOfMemoryError

if TYPE_CHECKING:
    import torch

#: Allocations are rounded up to this many bytes (the CUDA caching allocator's block size).
ALLOC_ROUND = 512


def round_up(nbytes: int, to: int = ALLOC_ROUND) -> int:
    return -(-nbytes // to) * to


@dataclass(frozen=True)
class NvmlGpu:
    """One GPU as NVML sees it (index in NVML order, not necessarily CUDA's)."""

    index: int
    name: str
    uuid: str
    total_bytes: int
    used_bytes: int
    free_bytes: int


def _import_pynvml() -> Any:
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        import pynvml
    return pynvml


def _text(value: Any) -> str:
    return value.decode() if isinstance(value, bytes) else str(value)


def nvml_gpus(nvml: Any | None = None) -> tuple[NvmlGpu, ...]:
    """The GPUs NVML reports, or ``()`` when NVML (the driver) is absent."""
    try:
        nvml = nvml or _import_pynvml()
        nvml.nvmlInit()
    except Exception:
        return ()
    try:
        gpus = []
        for i in range(nvml.nvmlDeviceGetCount()):
            handle = nvml.nvmlDeviceGetHandleByIndex(i)
            mem = nvml.nvmlDeviceGetMemoryInfo(handle)
            gpus.append(
                NvmlGpu(
                    index=i,
                    name=_text(nvml.nvmlDeviceGetName(handle)),
                    uuid=_text(nvml.nvmlDeviceGetUUID(handle)),
                    total_bytes=int(mem.total),
                    used_bytes=int(mem.used),
                    free_bytes=int(mem.free),
                )
            )
        return tuple(gpus)
    finally:
        with contextlib.suppress(Exception):
            nvml.nvmlShutdown()


def _norm_uuid(uuid: str) -> str:
    uuid = uuid.strip().lower()
    return uuid[4:] if uuid.startswith("gpu-") else uuid


@dataclass(frozen=True)
class DeviceFigures:
    """Memory figures of one device at one moment, in bytes."""

    index: int
    backend: str
    name: str
    budget_bytes: int
    allocated_bytes: int
    peak_allocated_bytes: int
    #: NVML's view of the whole GPU (all processes); None on CPU or without NVML.
    nvml_total_bytes: int | None = None
    nvml_used_bytes: int | None = None


class Device:
    """One device of the executor: allocation of weight buffers and memory figures."""

    backend: str = "?"

    def __init__(self, index: int, name: str, budget_bytes: int) -> None:
        self.index = index
        self.name = name
        self.budget_bytes = budget_bytes

    @property
    def torch_device(self) -> torch.device:
        raise NotImplementedError

    def alloc(self, nbytes: int) -> torch.Tensor:
        """A new uint8 buffer of ``nbytes`` (rounded up) or ``DeviceOutOfMemoryError``."""
        raise NotImplementedError

    def allocated_bytes(self) -> int:
        raise NotImplementedError

    def peak_allocated_bytes(self) -> int:
        raise NotImplementedError

    def synchronize(self) -> None:
        """Wait for copies and kernels queued on this device."""

    def fence(self) -> Any:
        """A marker of the work queued so far on this device's current stream; ``.synchronize()``
        on it waits for that work only (None on CPU, where copies are synchronous)."""
        return None

    def context(self) -> contextlib.AbstractContextManager[Any]:
        """Make this device current for code that allocates without naming a device."""
        return contextlib.nullcontext()

    def figures(self) -> DeviceFigures:
        return DeviceFigures(
            index=self.index,
            backend=self.backend,
            name=self.name,
            budget_bytes=self.budget_bytes,
            allocated_bytes=self.allocated_bytes(),
            peak_allocated_bytes=self.peak_allocated_bytes(),
        )

    def _over_budget(self, nbytes: int) -> DeviceOutOfMemoryError:
        used = self.allocated_bytes()
        return DeviceOutOfMemoryError(
            f"device {self.index} ({self.name}): allocating {nbytes} bytes would exceed its budget "
            f"of {self.budget_bytes} bytes ({used} allocated, {self.budget_bytes - used} free)"
        )

    def __repr__(self) -> str:
        return f"{type(self).__name__}(index={self.index}, budget_bytes={self.budget_bytes})"


class CpuDevice(Device):
    """A logical device backed by host memory, with a budget and exact live-byte accounting."""

    backend = "cpu"

    def __init__(self, index: int, budget_bytes: int) -> None:
        super().__init__(index, f"cpu:{index}", budget_bytes)
        # Re-entrant: a finalizer may run inside alloc (garbage collection in torch.empty).
        self._lock = threading.RLock()
        self._allocated = 0
        self._peak = 0
        #: Sizes of buffers freed and not yet taken off ``_allocated``. A buffer's finalizer
        #: is this deque's own append, which runs no line of Python: a finalizer of ours
        #: (its lock, then the subtraction) was a place where an interrupt (a
        #: KeyboardInterrupt, which a finalizer's caller prints and drops) kept the bytes
        #: counted for good.
        self._freed: collections.deque[int] = collections.deque()

    @property
    def torch_device(self) -> torch.device:
        import torch

        return torch.device("cpu")

    def alloc(self, nbytes: int) -> torch.Tensor:
        import torch

        size = round_up(max(nbytes, 1))
        # The bytes counted are ``reserved`` until the buffer's finalizer takes them over, each
        # change on one line: counted before the try, or handed to the finalizer on a line of
        # their own, an interrupt in between (a KeyboardInterrupt) kept them counted for good,
        # a device budget shrunk by them.
        reserved = 0
        try:
            with self._lock:
                self._settle()
                if self._allocated + size > self.budget_bytes:
                    raise self._over_budget(size)
                self._allocated, self._peak, reserved = (
                    self._allocated + size,
                    max(self._peak, self._allocated + size),
                    size,
                )
            buf = torch.empty(size, dtype=torch.uint8)
            # The storage outlives every view of it, so this runs when the bytes are freed.
            _, reserved = weakref.finalize(buf.untyped_storage(), self._freed.append, size), 0
        except BaseException:
            if reserved:
                self._freed.append(reserved)
            raise
        return buf

    def _settle(self) -> None:
        """(Under the lock.) Take the bytes of the buffers freed off the count, each in the
        statement that takes it from the queue."""
        while self._freed:
            self._allocated -= self._freed.popleft()

    def allocated_bytes(self) -> int:
        with self._lock:
            self._settle()
            return self._allocated

    def peak_allocated_bytes(self) -> int:
        with self._lock:
            return self._peak

    def reset_peak(self) -> None:
        with self._lock:
            self._settle()
            self._peak = self._allocated


class CudaDevice(Device):
    """A CUDA GPU; the budget is enforced on top of what the GPU itself allows."""

    backend = "cuda"

    def __init__(
        self, index: int, name: str, budget_bytes: int, nvml_index: int | None = None
    ) -> None:
        super().__init__(index, name, budget_bytes)
        self.nvml_index = nvml_index

    @property
    def torch_device(self) -> torch.device:
        import torch

        return torch.device("cuda", self.index)

    def alloc(self, nbytes: int) -> torch.Tensor:
        import torch

        size = round_up(max(nbytes, 1))
        if torch.cuda.memory_allocated(self.index) + size > self.budget_bytes:
            raise self._over_budget(size)
        try:
            return torch.empty(size, dtype=torch.uint8, device=self.torch_device)
        except torch.cuda.OutOfMemoryError as exc:
            raise DeviceOutOfMemoryError(
                f"device {self.index} ({self.name}): CUDA out of memory allocating {size} bytes: "
                f"{str(exc).splitlines()[0] if str(exc) else exc!r}"
            ) from exc

    def allocated_bytes(self) -> int:
        import torch

        return int(torch.cuda.memory_allocated(self.index))

    def peak_allocated_bytes(self) -> int:
        import torch

        return int(torch.cuda.max_memory_allocated(self.index))

    def reset_peak(self) -> None:
        import torch

        torch.cuda.reset_peak_memory_stats(self.index)

    def synchronize(self) -> None:
        import torch

        torch.cuda.synchronize(self.index)

    def fence(self) -> Any:
        import torch

        with torch.cuda.device(self.index):
            event = torch.cuda.Event()
            event.record()
        return event

    def context(self) -> contextlib.AbstractContextManager[Any]:
        import torch

        return torch.cuda.device(self.index)

    def figures(self) -> DeviceFigures:
        base = super().figures()
        total = used = None
        for gpu in nvml_gpus():
            if gpu.index == self.nvml_index:
                total, used = gpu.total_bytes, gpu.used_bytes
        return DeviceFigures(
            **{**base.__dict__, "nvml_total_bytes": total, "nvml_used_bytes": used}
        )


def resolve_backend(config: EoeConfig) -> str:
    """``config.backend`` with ``"auto"`` decided: cuda when torch sees a GPU."""
    if config.backend != "auto":
        return config.backend
    import torch

    return "cuda" if torch.cuda.is_available() else "cpu"


def _cuda_nvml_map(count: int, gpus: tuple[NvmlGpu, ...]) -> dict[int, NvmlGpu]:
    """CUDA ordinal -> NVML GPU, matched by UUID (orders differ under CUDA_VISIBLE_DEVICES)."""
    import torch

    by_uuid = {_norm_uuid(g.uuid): g for g in gpus}
    found = {}
    for i in range(count):
        with contextlib.suppress(Exception):
            uuid = _norm_uuid(str(torch.cuda.get_device_properties(i).uuid))
            if uuid in by_uuid:
                found[i] = by_uuid[uuid]
    # No UUID (old driver or torch): with every GPU visible and one GPU, the orders agree.
    if not found and len(gpus) == count == 1 and "CUDA_VISIBLE_DEVICES" not in os.environ:
        found[0] = gpus[0]
    return found


def open_devices(config: EoeConfig) -> list[Device]:
    """The devices ``config`` describes, with their budgets; errors name what is missing."""
    backend = resolve_backend(config)
    if backend == "cpu":
        count = config.devices or DEFAULT_CPU_DEVICES
        budget = config.device_memory_bytes or DEFAULT_CPU_DEVICE_MEMORY
        return [CpuDevice(i, budget) for i in range(count)]

    import torch

    if not torch.cuda.is_available():
        raise RuntimeError("backend 'cuda' was asked for but torch sees no CUDA GPU")
    visible = torch.cuda.device_count()
    count = config.devices or visible
    if count > visible:
        raise RuntimeError(f"{count} CUDA devices were asked for but only {visible} are visible")
    nvml = _cuda_nvml_map(count, nvml_gpus())
    devices: list[Device] = []
    for i in range(count):
        gpu = nvml.get(i)
        total = gpu.total_bytes if gpu else int(torch.cuda.mem_get_info(i)[1])
        name = gpu.name if gpu else torch.cuda.get_device_name(i)
        budget = cuda_budget(config, i, name, total)
        devices.append(CudaDevice(i, name, budget, nvml_index=gpu.index if gpu else None))
    return devices


def check_pinning() -> None:
    """``ValueError`` naming ``pin_host_memory`` when this host cannot page-lock memory (no
    CUDA or other accelerator): asked for anyway, every register failed with torch's bare
    RuntimeError, naming no setting. Probed with one pinned byte, torch's own answer."""
    import torch

    try:
        torch.empty(1, dtype=torch.uint8, pin_memory=True)
    except RuntimeError as exc:
        raise ValueError(
            "pin_host_memory=True, but this host cannot page-lock memory (torch: "
            f"{str(exc)[:200]}); leave it unset (pinned on cuda only) or set it False"
        ) from None


def cuda_budget(config: EoeConfig, index: int, name: str, total: int) -> int:
    """The budget of CUDA GPU ``index`` (``name``, ``total`` bytes as NVML or torch report):
    ``config.device_memory_bytes``, or ``memory_fraction`` of ``total``. ``ValueError`` for
    a ``device_memory_bytes`` above ``total``: it was taken without a word, every plan then
    counted on memory the GPU lacks, and calls failed with CUDA's out-of-memory error where
    an eviction would have made room. (Refused, not clamped: a budget the user set and the
    GPU cannot give is a mistake in the setting, and a clamp would hide which.)"""
    asked = config.device_memory_bytes
    if asked is None:
        return int(total * config.memory_fraction)
    if asked > total:
        raise ValueError(
            f"device_memory_bytes {asked} is more than GPU {index} ({name}) has: {total} bytes "
            "in all; set it to at most that, or leave it unset for memory_fraction of it"
        )
    return asked


@contextlib.contextmanager
def no_grad_on(device: Device) -> Iterator[None]:
    """Inference mode with ``device`` current: how replicas run their calls."""
    import torch

    with device.context(), torch.inference_mode():
        yield


def is_cuda_oom(exc: BaseException) -> bool:
    """True if ``exc`` is torch's CUDA out-of-memory error (False when torch is absent)."""
    try:
        import torch
    except ImportError:  # pragma: no cover
        return False
    return isinstance(exc, torch.cuda.OutOfMemoryError)
