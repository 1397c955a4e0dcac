"""Aligned GPU cells for EOE: the core's rule (``tangram.core.cells``) raising EOE's error.

A call at DoP k runs on one aligned cell of k GPUs (k in 1, 2, 4, 8; a cell of size k starts
at a multiple of k). The rule has one owner, ``tangram.core.cells``; this module only turns its
``CellError`` into ``InvalidCellError`` (an ``EoeError``, so it lands in a call's outcome) and
adds ``best_cell``, a generic chooser among cells. Pure Python, no torch.
"""

from __future__ import annotations

import itertools
from collections.abc import Callable, Iterable, Sized
from typing import Any

from tangram.core import cells as core
from tangram.core.cells import CELL_SIZES, Cell, cell_sizes, is_aligned_cell
from tangram.exec.eoe.errors import InvalidCellError, shown

__all__ = [
    "CELL_SIZES",
    "Cell",
    "aligned_cells",
    "best_cell",
    "cell_sizes",
    "is_aligned_cell",
    "validate_cell",
]


def aligned_cells(n_devices: int, size: int) -> tuple[Cell, ...]:
    """Every aligned cell of ``size`` GPUs among devices ``0..n_devices-1``, in index order."""
    try:
        return core.aligned_cells(n_devices, size)
    except core.CellError as exc:
        raise InvalidCellError(str(exc)) from None


def validate_cell(gpus: Iterable[Any], n_devices: int, dop: int | None = None) -> Cell:
    """``gpus`` as a sorted cell, or ``InvalidCellError`` saying what is wrong with it.

    Whatever else reading them raises is that error too: gpus whose repr raised (or holding
    an int past str's digit limit) made the rule's own message raise, and the call was
    reported as the executor's bug."""
    try:
        if not isinstance(gpus, Sized | str | bytes) and isinstance(gpus, Iterable):
            # Read no more than the node holds: gpus=itertools.count() made tuple() run forever.
            given = tuple(itertools.islice(gpus, n_devices + 1))
            if len(given) > n_devices:
                raise InvalidCellError(
                    f"gpus must name at most {n_devices} GPUs (this executor has "
                    f"{n_devices}), got more from {shown(gpus)}"
                )
            gpus = given
        return core.validate_cell(gpus, n_devices, dop, error=InvalidCellError)
    except InvalidCellError:
        raise
    except Exception as exc:
        raise InvalidCellError(
            f"gpus must be a tuple of GPU indices (0..{n_devices - 1}), got {shown(gpus)} "
            f"({type(exc).__name__} reading them)"
        ) from None


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
