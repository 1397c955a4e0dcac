"""Aligned GPU cells: groups of 1, 2, 4 or 8 GPUs where a cell of size k starts at a multiple of k.

This is the buddy structure of the paper's GPU manager (and of ``tangram.core``): a call at
DoP k runs on one cell of k GPUs. Pure Python, no torch.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Sequence
from typing import Any

from tangram.exec.eoe.errors import InvalidCellError
from tangram.exec.eoe.registry import CELL_SIZES

Cell = tuple[int, ...]


def aligned_cells(n_devices: int, size: int) -> tuple[Cell, ...]:
    """Every aligned cell of ``size`` GPUs among devices ``0..n_devices-1``, in index order."""
    if size not in CELL_SIZES:
        raise InvalidCellError(f"cell size must be one of {CELL_SIZES}, got {size!r}")
    return tuple(
        tuple(range(start, start + size)) for start in range(0, n_devices - size + 1, size)
    )


def cell_sizes(n_devices: int) -> tuple[int, ...]:
    """The cell sizes that fit in ``n_devices`` devices."""
    return tuple(s for s in CELL_SIZES if s <= n_devices)


def is_aligned_cell(gpus: Sequence[int], n_devices: int) -> bool:
    """True if ``gpus`` (in any order) is one aligned cell among ``n_devices`` devices."""
    cell = tuple(sorted(gpus))
    size = len(cell)
    if size not in CELL_SIZES or len(set(cell)) != size:
        return False
    start = cell[0]
    return (
        start % size == 0
        and cell == tuple(range(start, start + size))
        and (start + size <= n_devices)
    )


def validate_cell(gpus: Iterable[Any], n_devices: int, dop: int | None = None) -> Cell:
    """``gpus`` as a sorted cell, or ``InvalidCellError`` saying what is wrong with it."""
    try:
        cell = tuple(sorted(int(g) for g in gpus))
    except (TypeError, ValueError):
        raise InvalidCellError(f"gpus must be a tuple of GPU indices, got {gpus!r}") from None
    if not cell:
        raise InvalidCellError("gpus is empty: a call needs a cell of 1, 2, 4 or 8 GPUs")
    bad = [g for g in cell if g < 0 or g >= n_devices]
    if bad:
        raise InvalidCellError(
            f"GPUs {bad} do not exist (this executor has GPUs 0..{n_devices - 1})"
        )
    if len(set(cell)) != len(cell):
        raise InvalidCellError(f"gpus {cell} repeats a GPU")
    if dop is not None and len(cell) != dop:
        raise InvalidCellError(
            f"gpus {cell} is a cell of {len(cell)} GPUs but the call asks DoP {dop}"
        )
    if not is_aligned_cell(cell, n_devices):
        raise InvalidCellError(
            f"gpus {cell} is not an aligned cell: a cell of k GPUs (k in {CELL_SIZES}) is "
            f"k consecutive GPUs starting at a multiple of k"
        )
    return cell


def best_cell(
    cells: Iterable[Cell], usable: Callable[[Cell], bool], key: Callable[[Cell], Any]
) -> Cell | None:
    """The usable cell with the smallest ``key`` (ties: the first in order), or None."""
    best: tuple[Any, Cell] | None = None
    for cell in cells:
        if not usable(cell):
            continue
        k = key(cell)
        if best is None or k < best[0]:
            best = (k, cell)
    return None if best is None else best[1]
