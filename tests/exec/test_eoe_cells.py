"""Aligned GPU cells: enumeration, validation with clear errors, and choice."""

from __future__ import annotations

import pytest

from tangram.exec.eoe.cells import (
    aligned_cells,
    best_cell,
    cell_sizes,
    is_aligned_cell,
    validate_cell,
)
from tangram.exec.eoe.errors import InvalidCellError


def test_aligned_cells_of_an_8_gpu_node() -> None:
    assert aligned_cells(8, 1) == tuple((g,) for g in range(8))
    assert aligned_cells(8, 2) == ((0, 1), (2, 3), (4, 5), (6, 7))
    assert aligned_cells(8, 4) == ((0, 1, 2, 3), (4, 5, 6, 7))
    assert aligned_cells(8, 8) == (tuple(range(8)),)
    for size in (1, 2, 4, 8):
        for cell in aligned_cells(8, size):
            assert cell[0] % size == 0 and len(cell) == size


def test_aligned_cells_of_odd_device_counts() -> None:
    assert aligned_cells(3, 2) == ((0, 1),)
    assert aligned_cells(3, 4) == ()
    assert aligned_cells(6, 4) == ((0, 1, 2, 3),)
    assert cell_sizes(3) == (1, 2) and cell_sizes(8) == (1, 2, 4, 8)
    with pytest.raises(InvalidCellError, match="cell size"):
        aligned_cells(8, 3)


def test_is_aligned_cell() -> None:
    assert is_aligned_cell((2, 3), 4)
    assert is_aligned_cell((3, 2), 4)  # any order
    assert not is_aligned_cell((1, 2), 4)
    assert not is_aligned_cell((0, 2), 4)
    assert not is_aligned_cell((0, 1, 2), 4)
    assert not is_aligned_cell((4, 5), 5)


@pytest.mark.parametrize(
    ("gpus", "n", "dop", "words"),
    [
        ((1, 2), 4, None, "not an aligned cell"),
        ((0, 1, 2), 4, None, "not an aligned cell"),
        ((0, 1), 4, 1, "asks DoP 1"),
        ((4,), 4, None, r"GPUs \[4\] do not exist"),
        ((-1,), 4, None, "do not exist"),
        ((0, 0), 4, None, "repeats"),
        ((), 4, None, "empty"),
        (("a",), 4, None, "tuple of GPU indices"),
    ],
)
def test_validate_cell_errors(gpus: tuple, n: int, dop: int | None, words: str) -> None:
    with pytest.raises(InvalidCellError, match=words):
        validate_cell(gpus, n, dop)


def _endless(limit: int = 100):
    """GPU indices without end (stands in for itertools.count(), which read forever): it
    fails the test once read past ``limit``."""
    yield from range(limit)
    raise AssertionError(f"read past {limit} GPUs")


def test_validate_cell_reads_no_more_gpus_than_the_node_holds() -> None:
    """gpus=itertools.count() made tuple() run forever (the call hung, never refused); the
    reading stops past the node's GPU count and the cell is refused naming gpus."""
    with pytest.raises(InvalidCellError, match="gpus must name at most 4 GPUs"):
        validate_cell(_endless(), 4)
    assert validate_cell(iter([1, 0]), 4) == (0, 1)
    assert validate_cell((g for g in [3, 2]), 4, 2) == (2, 3)


def test_validate_cell_sorts() -> None:
    assert validate_cell([5, 4], 8, 2) == (4, 5)


def test_best_cell_takes_smallest_key_among_usable() -> None:
    cells = aligned_cells(8, 2)
    chosen = best_cell(cells, lambda c: c != (0, 1), lambda c: -c[0] if c[0] < 6 else 0)
    assert chosen == (4, 5)
    assert best_cell(cells, lambda c: False, lambda c: 0) is None
    assert best_cell(cells, lambda c: True, lambda c: 0) == (0, 1)  # ties: first


def test_the_rule_has_one_owner_the_core() -> None:
    from tangram.core import cells as core
    from tangram.exec.eoe import bench, cells, registry, services

    assert cells.CELL_SIZES is registry.CELL_SIZES is core.CELL_SIZES
    assert cells.is_aligned_cell is core.is_aligned_cell and cells.cell_sizes is core.cell_sizes
    assert services.reward_model_spec.__kwdefaults__["dops"] is core.CELL_SIZES
    assert services.teacher_spec.__kwdefaults__["dops"] is core.CELL_SIZES
    assert bench.CELL_SIZES is core.CELL_SIZES
    for n in range(1, 9):
        for size in cell_sizes(n):
            assert aligned_cells(n, size) == core.aligned_cells(n, size)


def test_validate_cell_raises_the_eoe_error_which_is_also_a_value_error() -> None:
    with pytest.raises(InvalidCellError) as caught:
        validate_cell((1, 2), 4, 2)
    assert isinstance(caught.value, ValueError)
