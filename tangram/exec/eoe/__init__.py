"""Evict-on-Execution (EOE): the GPU executor of Tangram on PyTorch.

Many reward and teacher models share few GPUs: each model's weights are backed up in host
memory, restored to an aligned GPU cell on demand, kept there after use, and evicted
least-recently-used when memory is short. On a machine without CUDA the same code runs on
budgeted logical CPU devices. See ``docs/eoe.md``.

Names are exported lazily so that importing this package (``tangram --help`` does) needs no
torch; torch is imported when a manager, a backup or an example model is first used.
"""

from __future__ import annotations

import importlib
from typing import Any

_EXPORTS = {
    "EoeManager": "manager",
    "EoeConfig": "config",
    "ServiceSpec": "registry",
    "ServiceRegistry": "registry",
    "split_batch": "registry",
    "merge_batch": "registry",
    "CallOutcome": "records",
    "EvictOutcome": "records",
    "ServiceInfo": "records",
    "EoeStats": "records",
    "DeviceStats": "records",
    "aligned_cells": "cells",
    "validate_cell": "cells",
    "CpuDevice": "devices",
    "CudaDevice": "devices",
    "nvml_gpus": "devices",
    "open_devices": "devices",
    "reward_model_spec": "services",
    "teacher_spec": "services",
    "example_tokens": "services",
    "SIZES": "services",
    "hf_service": "hf",
    "HfService": "hf",
    "save_model_dir": "hf_tiny",
    "HF_SHAPES": "hf_tiny",
    "engine_spec": "engine",
    "ModuleEngine": "engine",
    "VllmEngine": "engine",
    "EoeError": "errors",
    "ServiceSpecError": "errors",
    "DuplicateServiceError": "errors",
    "UnknownServiceError": "errors",
    "ServiceTooLargeError": "errors",
    "HostMemoryError": "errors",
    "InvalidCellError": "errors",
    "DopNotSupportedError": "errors",
    "ServiceInUseError": "errors",
    "DeviceOutOfMemoryError": "errors",
    "RestoreError": "errors",
    "RestoreOutOfMemoryError": "errors",
    "CallFailedError": "errors",
    "InputSplitError": "errors",
    "ManagerClosedError": "errors",
    "ExecutorError": "errors",
    "QueueTimeoutError": "errors",
    "CallArgumentError": "errors",
}

__all__ = sorted(_EXPORTS)


def __getattr__(name: str) -> Any:
    module = _EXPORTS.get(name)
    if module is None:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    value = getattr(importlib.import_module(f"{__name__}.{module}"), name)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(__all__))
