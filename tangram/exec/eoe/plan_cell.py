"""Which cell a call runs on: the request's checks, the cells that can hold the service, and the
choice among the free ones (most replicas resident first), so the manager only carries it out.

Pure: plain data in (a ``ServiceInfo``, the node's per-GPU figures), a decision out; no threads,
locks, torch or clock. The manager calls it under its condition and retries when it says "none
free yet".
"""

from __future__ import annotations

import numbers
from collections.abc import Collection, Iterable, Sequence
from dataclasses import dataclass
from typing import Any, NamedTuple

from tangram.exec.eoe.cells import Cell, aligned_cells, validate_cell
from tangram.exec.eoe.errors import (
    DopNotSupportedError,
    InvalidCellError,
    ServiceTooLargeError,
    shown,
)
from tangram.exec.eoe.records import ServiceInfo


@dataclass(frozen=True)
class Request:
    """A call's checked request: its DoP and the scheduler's cell (None: the manager chooses)."""

    dop: int
    cell: Cell | None


def check_request(
    info: ServiceInfo, dop: int | None, gpus: Iterable[Any] | None, budgets: Sequence[int]
) -> Request:
    """The request with its DoP filled in, or the error that makes it impossible on this node.

    ``dop`` defaults to ``len(gpus)``, or the service's shards (1 unless split by layers); it must be one of the service's DoPs and fit the
    node; ``gpus``, if given, must be an aligned cell of ``dop`` GPUs each of whose budgets
    holds the service (``DopNotSupportedError``, ``InvalidCellError``, ``ServiceTooLargeError``).
    """
    n = len(budgets)
    cell = validate_cell(gpus, n) if gpus is not None else None
    if dop is None:
        dop = len(cell) if cell is not None else info.shards
    # A whole number (numpy's too): 2.0 reached range() as 'unexpected TypeError', True ran as 1.
    if isinstance(dop, bool) or not isinstance(dop, numbers.Integral) or dop not in info.dops:
        raise DopNotSupportedError(
            f"service {info.name!r} supports DoPs {info.dops}, not {shown(dop)}"
        )
    if dop > n:
        raise DopNotSupportedError(
            f"DoP {dop} needs a cell of {dop} GPUs but this executor has {n}"
        )
    if cell is not None:
        cell = validate_cell(cell, n, dop)
    if info.home is not None and (info.home >= n or cell not in (None, (info.home,))):
        raise InvalidCellError(
            f"service {info.name!r} runs on GPU {info.home} only (its engine lives there), "
            f"not on {cell if cell is not None else f'this executor of {n} GPUs'}"
        )
    need = info.need_bytes
    small = [g for g in (cell or ()) if budgets[g] < need]
    if small:
        raise ServiceTooLargeError(
            f"service {info.name!r} needs {need} bytes per GPU but GPUs {small} of cell {cell} "
            f"have budgets of {[budgets[g] for g in small]} bytes"
        )
    return Request(dop, cell)


def cells_for(info: ServiceInfo, request: Request, budgets: Sequence[int]) -> tuple[Cell, ...]:
    """The cells the call may run on: the scheduler's one, or else every aligned cell of its
    DoP whose budgets each hold one replica plus workspace (``ServiceTooLargeError`` if none)."""
    if request.cell is not None:
        return (request.cell,)
    if info.home is not None:
        return ((info.home,),)
    need = info.need_bytes
    fit = tuple(
        c for c in aligned_cells(len(budgets), request.dop) if all(budgets[g] >= need for g in c)
    )
    if not fit:
        raise ServiceTooLargeError(
            f"service {info.name!r} needs {need} bytes per GPU; no cell of {request.dop} GPUs "
            "has that"
        )
    return fit


@dataclass(frozen=True)
class NodeLoad:
    """What the choice reads of the node, per GPU: budget, bytes claimed, calls running."""

    budgets: tuple[int, ...]
    claimed: tuple[int, ...]
    busy: tuple[int, ...]
    calls_per_gpu: int

    def has_slot(self, cell: Cell) -> bool:
        """True when every GPU of ``cell`` runs fewer calls than it may."""
        busy, limit = self.busy, self.calls_per_gpu
        return all(busy[g] < limit for g in cell)


class CellRank(NamedTuple):
    """How good a free cell is for a service; smaller is better, compared field by field."""

    #: GPUs of the cell without a replica of the service (each would need a restore).
    missing: int
    #: Bytes the missing replicas need beyond the room the executor has not claimed.
    short_bytes: int
    #: Calls running on the cell's GPUs.
    running_calls: int
    #: The cell's first GPU: ties go to the lowest index.
    first_gpu: int


def rank_cell(cell: Cell, held: Collection[int], need: int, load: NodeLoad) -> CellRank:
    """The rank of ``cell`` for a service with replicas on ``held`` and ``need`` bytes per GPU."""
    budgets, claimed, busy = load.budgets, load.claimed, load.busy
    missing = short = running = 0
    for g in cell:
        lacking = 0 if g in held else need
        missing += g not in held
        short += max(0, lacking - (budgets[g] - claimed[g]))
        running += busy[g]
    return CellRank(missing, short, running, cell[0])


@dataclass(frozen=True)
class CellChoice:
    """The cell a call runs on, and why (``rank`` is None for the scheduler's own cell)."""

    cell: Cell
    rank: CellRank | None = None

    @property
    def reason(self) -> str:
        if self.rank is None:
            return f"cell {self.cell}: the scheduler's, and it has a free call slot"
        r = self.rank
        return (
            f"cell {self.cell}: the best free one, {len(self.cell) - r.missing} of "
            f"{len(self.cell)} replicas resident, {r.short_bytes} bytes short, "
            f"{r.running_calls} calls running"
        )


def choose_cell(
    cells: Sequence[Cell],
    load: NodeLoad,
    *,
    held: Collection[int] = (),
    need: int = 0,
    given: bool = False,
) -> CellChoice | None:
    """The cell to run on now, or None when none of ``cells`` has a free slot yet (wait).

    ``given``: ``cells`` is the scheduler's one cell, taken as it is once free. Otherwise the
    free cell of the smallest ``rank_cell`` wins: most replicas of the service already there,
    then fewest bytes to evict, then least busy, then lowest index.
    """
    if given:
        (cell,) = cells
        return CellChoice(cell) if load.has_slot(cell) else None
    best: tuple[CellRank, Cell] | None = None
    for cell in cells:
        if load.has_slot(cell):
            rank = rank_cell(cell, held, need, load)
            if best is None or rank < best[0]:  # ties: the first in order
                best = (rank, cell)
    return None if best is None else CellChoice(best[1], best[0])
