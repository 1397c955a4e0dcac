"""Building a service at registration: run its factory, back it up on the host, measure it,
and refuse what no GPU of the node could hold.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence

from tangram.exec.eoe.backup import HostBackup, LazyWeights
from tangram.exec.eoe.bookkeeping import Service
from tangram.exec.eoe.cells import aligned_cells
from tangram.exec.eoe.engine import EngineBackup
from tangram.exec.eoe.errors import (
    DopNotSupportedError,
    InvalidCellError,
    ServiceSpecError,
    ServiceTooLargeError,
    told,
)
from tangram.exec.eoe.execution import FAILURES
from tangram.exec.eoe.records import ServiceInfo
from tangram.exec.eoe.registry import ServiceSpec


def build_service(
    spec: ServiceSpec,
    *,
    pin: bool,
    budgets: Sequence[int],
    admit: Callable[[int], None] | None = None,
) -> Service:
    """``spec`` built and backed up, with its figures.

    ``DopNotSupportedError`` if no DoP of the service fits the node's GPUs, and
    ``InvalidCellError`` if the node lacks an engine's home GPU (both checked before the
    factory runs); ``ServiceSpecError`` if the factory raised or ``memory_bytes`` is
    below the measured size;
    ``ServiceTooLargeError`` if one replica plus workspace exceeds the largest of the GPUs'
    ``budgets`` (every GPU of a cell holds a whole data-parallel replica), or, for an engine
    service, its home GPU's budget (checked from its declared ``memory_bytes`` before the
    engine is built: it runs there only). ``admit(nbytes)`` is called with the
    host backup's size as soon as it is known: before the backup's buffer is allocated and
    its weights copied (or read from their files), so that it may refuse the service first.
    """
    check_dops(spec, len(budgets))
    check_home(spec, len(budgets))
    home = spec.home  # an engine runs on its home GPU only
    budget = budgets[home] if home is not None else max(budgets)
    where = (
        f"its home GPU {home} has a budget of {budget} bytes (its engine runs there only)"
        if home is not None
        else f"the largest GPU budget is {budget} bytes"
    )
    if spec.backend == "engine":  # its size is declared: checked before the engine is built
        need = (spec.memory_bytes or 0) + spec.workspace_bytes
        if need > budget:
            raise ServiceTooLargeError(
                f"service {spec.name!r} needs {need} bytes per GPU ({spec.memory_bytes} "
                f"declared + {spec.workspace_bytes} workspace) but {where}"
            )
    start = time.perf_counter()
    try:
        module = spec.factory()
    except FAILURES as exc:  # (a sys.exit() in it too: it went through register as is)
        raise ServiceSpecError(
            f"service {spec.name!r}: factory raised {type(exc).__name__}: {told(exc)}"
        ) from exc
    if spec.backend == "engine":
        backup = EngineBackup(module, spec.home)
        if admit is not None:
            admit(backup.nbytes)
    elif isinstance(module, LazyWeights):  # weights read straight from their files
        backup = HostBackup(
            module.module, pin=pin, shards=spec.shards, read=module.read, admit=admit
        )
    else:
        backup = HostBackup(module, pin=pin, shards=spec.shards, admit=admit)
    del module
    per_gpu = max(backup.shard_bytes)  # the whole replica unless sharded
    if spec.memory_bytes is not None and spec.memory_bytes < min(per_gpu, backup.tensor_bytes):
        raise ServiceSpecError(
            f"service {spec.name!r} declares memory_bytes={spec.memory_bytes} but its "
            f"parameters and buffers take {min(per_gpu, backup.tensor_bytes)} bytes per GPU"
        )
    info = ServiceInfo(
        name=spec.name,
        dops=spec.dops,
        weight_bytes=backup.tensor_bytes,
        replica_bytes=backup.nbytes,
        resident_bytes=max(spec.memory_bytes or 0, per_gpu),
        workspace_bytes=spec.workspace_bytes,
        pinned=backup.pinned,
        build_s=time.perf_counter() - start,
        shards=backup.shards,
        home=spec.home,
    )
    if info.need_bytes > budget:
        held = (
            f"one of {info.shards} layer shards"
            if info.shards > 1
            else "a whole data-parallel replica (a larger model needs shards=k)"
        )
        raise ServiceTooLargeError(
            f"service {spec.name!r} needs {info.need_bytes} bytes per GPU "
            f"({info.resident_bytes} resident + {info.workspace_bytes} workspace) but "
            f"{where}; every GPU of a cell holds {held}, so no cell can run it"
        )
    check_cells(info, budgets)
    return Service(spec, backup, info)


def check_dops(spec: ServiceSpec, gpus: int) -> None:
    """``DopNotSupportedError`` unless some DoP of ``spec`` fits a node of ``gpus`` GPUs: a
    service of dops=(4,) (or shards=4) on 2 GPUs was registered (built, backed up, its host
    bytes booked), and every call of it then failed with DopNotSupportedError."""
    if any(d <= gpus for d in spec.dops):
        return
    split = f", split in {spec.shards} layer shards," if spec.shards > 1 else ""
    raise DopNotSupportedError(
        f"service {spec.name!r}{split} runs at DoPs {spec.dops} (cells of that many GPUs), "
        f"but this executor has {gpus} GPUs: no call of it could run"
    )


def check_home(spec: ServiceSpec, gpus: int) -> None:
    """``InvalidCellError`` when ``spec`` is an engine service whose home GPU a node of
    ``gpus`` GPUs lacks: home=5 on 2 GPUs was registered (its engine built, its weights
    booked on the host), and every call of it then failed with InvalidCellError."""
    if spec.home is not None and spec.home >= gpus:
        raise InvalidCellError(
            f"service {spec.name!r} runs on GPU {spec.home} only (its engine lives there), "
            f"but this executor has {gpus} GPUs: no call of it could run"
        )


def check_cells(info: ServiceInfo, budgets: Sequence[int]) -> None:
    """``ServiceTooLargeError`` unless some aligned cell of one of the service's DoPs has a
    budget on each of its GPUs that holds ``need_bytes``: on GPUs of different budgets, a
    service of dops=(2,) that fit the largest GPU alone was registered (only the largest
    budget was asked), and every call of it then failed. (An engine's home GPU was checked
    already: it runs there only.)"""
    if info.home is not None:
        return
    n = len(budgets)
    for dop in (d for d in info.dops if d <= n):
        if any(all(budgets[g] >= info.need_bytes for g in cell) for cell in aligned_cells(n, dop)):
            return
    raise ServiceTooLargeError(
        f"service {info.name!r} needs {info.need_bytes} bytes per GPU and runs at DoPs "
        f"{info.dops}, but no aligned cell of those sizes has that on each of its GPUs "
        f"(budgets {list(budgets)[:16]}): no call of it could run"
    )
