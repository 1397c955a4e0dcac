"""Helpers for tests that drive an ``EoeManager``, here on CPU or on a GPU box alike.

- ``Blob``: a service whose replica takes exactly ``units * UNIT`` bytes, so tests can reason
  about budgets in whole units; its call can check that its replica stays intact while it runs.
- ``make_config``: an ``EoeConfig`` of N devices with a budget of some units. With
  ``TANGRAM_EOE_BACKEND=cuda`` it targets real GPUs: the unit grows to 8 MiB and the budget adds
  what the process already holds on the GPU (cuBLAS workspace, other tests' leftovers) plus
  1 MiB for the calls' own inputs and activations, which the CUDA allocator counts and the CPU
  device does not.
"""

from __future__ import annotations

import os
import time
from collections.abc import Callable

import torch
from torch import nn

from tangram.exec.eoe.config import EoeConfig
from tangram.exec.eoe.registry import ServiceSpec

BACKEND: str = os.environ.get("TANGRAM_EOE_BACKEND", "cpu")
KIB, MIB = 1 << 10, 1 << 20
#: The size step of ``Blob`` services.
UNIT: int = 8 * MIB if BACKEND == "cuda" else 64 * KIB
#: Room left on a CUDA budget for the calls' inputs and activations.
CUDA_SLACK: int = MIB


def missing_devices(devices: int) -> str | None:
    """Why a test needing ``devices`` devices cannot run on this backend, or None."""
    if BACKEND != "cuda":
        return None
    if not torch.cuda.is_available():
        return "TANGRAM_EOE_BACKEND=cuda but torch sees no CUDA GPU"
    if torch.cuda.device_count() < devices:
        return f"needs {devices} GPUs, {torch.cuda.device_count()} visible"
    return None


def make_config(devices: int = 1, units: float = 4, **kw: object) -> EoeConfig:
    """``devices`` devices with room for ``units`` units of services each (see module doc)."""
    budget = int(units * UNIT)
    if BACKEND == "cuda":
        for i in range(devices):  # create the cuBLAS workspace now, so it is in the baseline
            with torch.cuda.device(i):
                a = torch.ones(64, 64, device="cuda")
                (a @ a).sum().item()
            del a
        budget += max(torch.cuda.memory_allocated(i) for i in range(devices)) + CUDA_SLACK
    return EoeConfig(backend=BACKEND, devices=devices, device_memory_bytes=budget, **kw)


def same_bytes(actual: int, expected: int) -> bool:
    """Equal on CPU; on CUDA the caching allocator may round a block up (by under 2 MiB)."""
    if BACKEND == "cuda":
        return expected <= actual < expected + 2 * MIB
    return actual == expected


class Blob(nn.Module):
    """A service of exactly ``units * UNIT`` bytes: a weight vector and its checksum."""

    def __init__(self, units: float, seed: int) -> None:
        super().__init__()
        gen = torch.Generator().manual_seed(seed)
        n = (int(units * UNIT) - 512) // 4  # + the checksum buffer and alignment = units * UNIT
        self.w = nn.Parameter(torch.randn(n, generator=gen), requires_grad=False)
        self.register_buffer("check", self.w.detach().double().sum())

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x * self.w.sum() + self.w[0]


def checked_call(pause_s: float = 0.0) -> Callable[[nn.Module, torch.Tensor], torch.Tensor]:
    """A call function that fails if its replica's weights are wrong, or change (are evicted or
    overwritten) while it pauses in the middle."""

    def call(module: nn.Module, x: torch.Tensor) -> torch.Tensor:
        # Sums on the replica's device, without a full-size temporary (it would count on CUDA).
        before = module.w.sum()
        if not torch.allclose(before.double(), module.check, rtol=1e-4, atol=1e-2):
            raise AssertionError("replica weights are wrong at call start")
        if pause_s:
            time.sleep(pause_s)
        if module.w.device.type == "meta" or not torch.equal(module.w.sum(), before):
            raise AssertionError("replica was evicted or overwritten during the call")
        return module(x)

    return call


def blob_spec(
    name: str,
    units: float = 1,
    seed: int = 0,
    call: Callable | None = None,
    dops: tuple[int, ...] = (1, 2),
    **kw: object,
) -> ServiceSpec:
    """A ``Blob`` service; the default call checks its replica (``checked_call()``)."""
    return ServiceSpec(
        name,
        factory=lambda: Blob(units, seed),
        call=call or checked_call(),
        dops=dops,
        **kw,
    )


def blob_reference(units: float, seed: int, x: torch.Tensor) -> torch.Tensor:
    """What a call of ``blob_spec(.., units, seed)`` returns for ``x``, computed on the host."""
    return Blob(units, seed)(x)
