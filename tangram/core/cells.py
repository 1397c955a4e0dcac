"""Aligned GPU cells, the one owner of the rule: a cell of k GPUs (k in 1, 2, 4, 8) is k
consecutive GPUs starting at a multiple of k.

This is the buddy structure of the paper's GPU manager. The core's GPU state, its placement,
its unit options, EOE's executor, the simulator and the trace format all ask this module
rather than restating the rule. Pure Python.
"""

from __future__ import annotations

import operator
from collections.abc import Iterable, Sequence
from typing import Any

#: The cell sizes, ascending (a GPU action's unit options are drawn from these).
CELL_SIZES: tuple[int, ...] = (1, 2, 4, 8)

Cell = tuple[int, ...]


class CellError(ValueError):
    """GPUs that are not an aligned cell (the message says which rule they break)."""


def cell_sizes(n_gpus: int) -> tuple[int, ...]:
    """The cell sizes that fit in ``n_gpus`` GPUs, ascending."""
    return tuple(s for s in CELL_SIZES if s <= n_gpus)


def aligned_cells(n_gpus: int, size: int) -> tuple[Cell, ...]:
    """Every aligned cell of ``size`` GPUs among GPUs ``0..n_gpus-1``, in index order."""
    if size not in CELL_SIZES:
        raise CellError(f"cell size must be one of {CELL_SIZES}, got {size!r}")
    return tuple(tuple(range(start, start + size)) for start in range(0, n_gpus - size + 1, size))


def free_cells(owner: Sequence[object | None], size: int) -> list[Cell]:
    """The aligned cells of ``size`` whose GPUs are all free (``owner[g] is None``), in order."""
    cells = []
    for start in range(0, len(owner) - size + 1, size):
        cell = tuple(range(start, start + size))
        if all(owner[g] is None for g in cell):
            cells.append(cell)
    return cells


def copy_serves(restored_as: Cell, cell: Cell) -> bool:
    """Whether a copy restored as ``restored_as`` lets a call on ``cell`` skip the restore on
    its GPUs: a copy of this very cell, or a whole (1-GPU) one. A layer-sharded copy over
    (2, 3) holds half the model on each GPU, so it serves neither (2,) nor (0, 1, 2, 3)."""
    return restored_as == cell or len(restored_as) == 1


def copies_on(gpus: Iterable[int], shards: int, *, complete: bool = False) -> tuple[Cell, ...]:
    """The copies that GPUs reported resident form: one per GPU for a service of whole
    replicas (``shards`` 1), else the aligned cells of ``shards`` GPUs they fall in.

    The core records the cell each copy was restored as (``GpuNodeState.is_resident``), so a
    report of GPUs must name copies: two sharded copies are not one on their union. A restore's
    report names the GPUs just restored (EOE restores a copy's missing shards, so the whole cell
    then holds it); a full listing of the GPUs holding a service (``complete``, as Ray's agents
    send) names a cell only when every one of its GPUs is listed: EOE evicts a shard at a time.
    """
    ordered = sorted(set(gpus))
    if shards <= 1:
        return tuple((g,) for g in ordered)
    listed = set(ordered)
    starts = sorted({g - g % shards for g in ordered})
    cells = (tuple(range(start, start + shards)) for start in starts)
    return tuple(c for c in cells if not complete or listed.issuperset(c))


def cell_problem(gpus: Sequence[int], n_gpus: int) -> str | None:
    """Why sorted, distinct ``gpus`` are not an aligned cell of ``n_gpus`` GPUs (None if they are)."""
    cell, size = tuple(gpus), len(gpus)
    if size not in CELL_SIZES:
        return f"{cell} is not an aligned cell: it has {size} GPUs, a cell has 1, 2, 4 or 8"
    start = cell[0]
    if start % size or cell != tuple(range(start, start + size)):
        return (
            f"{cell} is not an aligned cell: a cell of k GPUs (k in {CELL_SIZES}) is "
            "k consecutive GPUs starting at a multiple of k"
        )
    if start + size > n_gpus:
        return f"{cell} exceeds the {n_gpus} GPUs"
    return None


def is_aligned_cell(gpus: Iterable[int], n_gpus: int) -> bool:
    """True if ``gpus`` (in any order, no repeats) is one aligned cell of ``n_gpus`` GPUs."""
    cell = tuple(sorted(gpus))
    return len(set(cell)) == len(cell) and bool(cell) and cell_problem(cell, n_gpus) is None


def validate_cell(
    gpus: Iterable[Any], n_gpus: int, dop: int | None = None, *, error: type[Exception] = CellError
) -> Cell:
    """``gpus`` as a sorted cell, or ``error`` saying what is wrong with it."""
    # Whole numbers only (numpy's too): int() read 0.9 as GPU 0, '1' as GPU 1 and True as 1.
    try:
        given = tuple(gpus) if not isinstance(gpus, str | bytes) else (gpus,)
        if any(isinstance(g, bool) for g in given):
            raise TypeError
        cell = tuple(sorted(operator.index(g) for g in given))
    except (TypeError, ValueError):
        raise error(f"gpus must be a tuple of GPU indices, got {gpus!r}") from None
    if not cell:
        raise error("gpus is empty: a call needs a cell of 1, 2, 4 or 8 GPUs")
    bad = [g for g in cell if g < 0 or g >= n_gpus]
    if bad:
        raise error(f"GPUs {bad} do not exist (GPUs 0..{n_gpus - 1})")
    if len(set(cell)) != len(cell):
        raise error(f"gpus {cell} repeats a GPU")
    if dop is not None and len(cell) != dop:
        raise error(f"gpus {cell} is a cell of {len(cell)} GPUs but the call asks DoP {dop}")
    problem = cell_problem(cell, n_gpus)
    if problem is not None:
        raise error(f"gpus {problem}")
    return cell


def smallest_cell_for(size_gb: float, gpu_memory_gb: float, n_gpus: int) -> int | None:
    """The fewest GPUs of an aligned cell whose memory holds a model of ``size_gb`` split in
    equal shards (size / k per GPU), or None when no cell of ``n_gpus`` GPUs can."""
    for k in CELL_SIZES:
        if k <= n_gpus and size_gb <= k * gpu_memory_gb:
            return k
    return None


def holds(size_gb: float, gpu_memory_gb: float, k: int, *, replicas: bool = False) -> bool:
    """Whether a cell of ``k`` GPUs of ``gpu_memory_gb`` each holds a model of ``size_gb``:
    split in k shards, or all of it on every GPU for a service run as ``replicas``."""
    return size_gb <= (1 if replicas else k) * gpu_memory_gb


def unit_options_on(
    size_gb: float,
    shapes: Iterable[tuple[int, float]],
    max_units: int,
    *,
    replicas: bool = False,
) -> Cell:
    """``unit_options`` on a cluster of GPU nodes of these (GPUs, GB per GPU) shapes: the
    sizes some node has a cell of that holds the model (a node's GPU count and another's
    memory do not make a cell together)."""
    fits = sorted(
        {
            k
            for n, mem in shapes
            for k in CELL_SIZES
            if k <= n and holds(size_gb, mem, k, replicas=replicas)
        }
    )
    if not fits:
        return ()
    top = max(fits[0], max_units)  # fits[0]: ``smallest_cell_for``
    return tuple(k for k in fits if k <= top)


def unit_options(
    size_gb: float, gpu_memory_gb: float, n_gpus: int, max_units: int, *, replicas: bool = False
) -> Cell:
    """The cell sizes a call of a ``size_gb`` model may run on: from the smallest that holds
    it up to ``max_units`` (at least the smallest), within ``n_gpus``. Empty when none fits.
    A model run as ``replicas`` puts all of it on every GPU, so one GPU must hold it."""
    return unit_options_on(size_gb, ((n_gpus, gpu_memory_gb),), max_units, replicas=replicas)
