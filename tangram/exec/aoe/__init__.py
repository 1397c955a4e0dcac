"""Allocate-on-Execution (AOE): the CPU executor on real Docker containers.

One container per trajectory keeps the trajectory's memory and files for its whole life but
holds CPU only while one of its actions runs; the grant is a cgroup write (cpuset + CFS
quota) of microseconds. See ``docs/aoe.md``.

The names below are imported lazily so ``import tangram.exec.aoe`` (and ``tangram --help``)
works without the docker SDK; only creating an ``AoeManager`` needs it.
"""

from __future__ import annotations

import importlib
from typing import Any

_EXPORTS = {
    "AoeManager": "tangram.exec.aoe.manager",
    "AoeConfig": "tangram.exec.aoe.config",
    "SandboxConfig": "tangram.exec.aoe.config",
    "BUSYBOX_IMAGE": "tangram.exec.aoe.config",
    "PYTHON_IMAGE": "tangram.exec.aoe.config",
    "ActionOutcome": "tangram.exec.aoe.records",
    "ContainerHandle": "tangram.exec.aoe.records",
    "GrantRecord": "tangram.exec.aoe.records",
    "NumaTopology": "tangram.exec.aoe.topology",
    "choose_cores": "tangram.exec.aoe.topology",
    "read_host_topology": "tangram.exec.aoe.topology",
    "AoeError": "tangram.exec.aoe.errors",
    "EngineUnavailable": "tangram.exec.aoe.errors",
    "GrantError": "tangram.exec.aoe.errors",
    "ImageMissing": "tangram.exec.aoe.errors",
    "UnknownTrajectory": "tangram.exec.aoe.errors",
}

__all__ = sorted(_EXPORTS)


def __getattr__(name: str) -> Any:
    module = _EXPORTS.get(name)
    if module is None:
        raise AttributeError(f"module 'tangram.exec.aoe' has no attribute {name!r}")
    return getattr(importlib.import_module(module), name)
