"""Setup shared by the EOE manager tests: a config or manager of N devices, on CPU or CUDA
alike (``testing.make_config``), skipping only where CUDA has fewer GPUs than asked for."""

from __future__ import annotations

import pytest

from tangram.exec.eoe.config import EoeConfig
from tangram.exec.eoe.manager import EoeManager
from tangram.exec.eoe.testing import UNIT, make_config, missing_devices

MIB = 1 << 20


def eoe_config(devices: int = 1, units: float = 4, **kw: object) -> EoeConfig:
    """``devices`` devices with room for ``units`` units of services each; the test is
    skipped where the backend lacks that many devices (CUDA with fewer GPUs)."""
    reason = missing_devices(devices)
    if reason is not None:
        pytest.skip(reason)
    return make_config(devices, units, **kw)


def eoe_manager(devices: int, mib: float, **kw: object) -> EoeManager:
    """A manager of ``devices`` devices with room for ``mib`` MiB of claims each (on CUDA the
    process's baseline allocations are added, see ``make_config``)."""
    return EoeManager(eoe_config(devices, units=mib * MIB / UNIT, **kw))
