"""The live runtime: the scheduler core driven on asyncio by real executors (AOE, EOE, APIs).

See ``docs/live.md``. ``Runtime`` is the driver; ``build_runtime`` makes one with the
executors a cluster needs; ``discover_cluster`` describes this machine. The errors (and
their registry ``ERRORS``) are re-exported from ``errors``.
"""

from __future__ import annotations

from tangram.exec.runtime import errors
from tangram.exec.runtime.api import ApiExecutor, builtin_endpoints, http_endpoint
from tangram.exec.runtime.builder import build_runtime, default_services
from tangram.exec.runtime.config import RuntimeConfig
from tangram.exec.runtime.cpu import CpuExecutor
from tangram.exec.runtime.discovery import cluster_to_dict, discover_cluster
from tangram.exec.runtime.errors import *  # noqa: F403 - the errors, listed once in errors.py
from tangram.exec.runtime.gpu import GpuExecutor
from tangram.exec.runtime.recorder import TraceRecorder
from tangram.exec.runtime.records import (
    ActionSpec,
    ApiWork,
    CommandResult,
    CpuWork,
    ErrorInfo,
    GpuWork,
    Outcome,
    Timings,
    TrajectoryInfo,
)
from tangram.exec.runtime.runtime import Runtime

__all__ = [
    "ActionSpec",
    "ApiExecutor",
    "ApiWork",
    "CommandResult",
    "CpuExecutor",
    "CpuWork",
    "ErrorInfo",
    "GpuExecutor",
    "GpuWork",
    "Outcome",
    "Runtime",
    "RuntimeConfig",
    "Timings",
    "TraceRecorder",
    "TrajectoryInfo",
    "build_runtime",
    "builtin_endpoints",
    "cluster_to_dict",
    "default_services",
    "discover_cluster",
    "http_endpoint",
]
__all__ += errors.__all__
