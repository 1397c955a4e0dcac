"""Which cell a call runs on (``plan_cell``), as a specification: the request's checks, the
cells that can hold a service, and the choice among free cells, resident ones first."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from tangram.exec.eoe.cells import aligned_cells, cell_sizes, is_aligned_cell
from tangram.exec.eoe.errors import DopNotSupportedError, InvalidCellError, ServiceTooLargeError
from tangram.exec.eoe.plan_cell import (
    CellRank,
    NodeLoad,
    Request,
    cells_for,
    check_request,
    choose_cell,
    rank_cell,
)
from tangram.exec.eoe.records import ServiceInfo


def service(dops: tuple[int, ...] = (1, 2, 4), resident: int = 100, workspace: int = 0):
    return ServiceInfo(
        name="svc",
        dops=dops,
        weight_bytes=resident,
        replica_bytes=resident,
        resident_bytes=resident,
        workspace_bytes=workspace,
        pinned=False,
        build_s=0.0,
    )


def idle(n: int, budget: int = 1000, calls_per_gpu: int = 1) -> NodeLoad:
    return NodeLoad((budget,) * n, (0,) * n, (0,) * n, calls_per_gpu)


# --- the request -------------------------------------------------------------------------------


def test_dop_defaults_to_the_cell_size_or_one() -> None:
    budgets = (1000,) * 4
    assert check_request(service(), None, None, budgets) == Request(1, None)
    assert check_request(service(), None, (2, 3), budgets) == Request(2, (2, 3))
    assert check_request(service(), 2, [3, 2], budgets) == Request(2, (2, 3))  # sorted


def test_a_dop_the_service_does_not_declare_or_the_node_cannot_hold_is_refused() -> None:
    with pytest.raises(DopNotSupportedError, match="supports DoPs"):
        check_request(service(dops=(1,)), 2, None, (1000,) * 4)
    with pytest.raises(DopNotSupportedError, match="this executor has 2"):
        check_request(service(), 4, None, (1000,) * 2)


def test_the_schedulers_cell_must_be_aligned_and_hold_the_service() -> None:
    with pytest.raises(InvalidCellError, match="not an aligned cell"):
        check_request(service(), None, (1, 2), (1000,) * 4)
    with pytest.raises(InvalidCellError, match="asks DoP 1"):
        check_request(service(), 1, (0, 1), (1000,) * 4)
    with pytest.raises(ServiceTooLargeError, match=r"GPUs \[3\] of cell \(2, 3\)"):
        check_request(service(resident=500), None, (2, 3), (1000, 1000, 1000, 400))


def test_the_manager_may_choose_among_the_cells_that_hold_the_service() -> None:
    budgets = (1000, 400, 1000, 1000)
    assert cells_for(service(resident=500), Request(1, None), budgets) == ((0,), (2,), (3,))
    assert cells_for(service(resident=500), Request(2, None), budgets) == ((2, 3),)
    assert cells_for(service(), Request(2, (0, 1)), budgets) == ((0, 1),)  # the scheduler's
    with pytest.raises(ServiceTooLargeError, match="no cell of 4 GPUs"):
        cells_for(service(resident=500), Request(4, None), budgets)


# --- the choice ----------------------------------------------------------------------------------


def test_the_schedulers_cell_is_taken_once_it_has_a_free_slot() -> None:
    free = idle(4)
    busy = NodeLoad(free.budgets, free.claimed, (0, 0, 1, 0), 1)
    choice = choose_cell(((2, 3),), free, given=True)
    assert choice is not None and choice.cell == (2, 3) and "scheduler's" in choice.reason
    assert choose_cell(((2, 3),), busy, given=True) is None  # wait
    assert choose_cell(((0, 1),), busy, given=True).cell == (0, 1)


def test_a_resident_cell_is_preferred_then_the_least_short_then_the_least_busy() -> None:
    load = NodeLoad((1000,) * 4, (0, 950, 0, 0), (0, 0, 1, 0), 2)
    cells = aligned_cells(4, 1)
    assert choose_cell(cells, load, held={3}, need=100).cell == (3,)  # resident
    assert choose_cell(cells, load, held=(), need=100).cell == (0,)  # room, idle, lowest
    busy_first = NodeLoad((1000,) * 4, (0, 0, 0, 0), (1, 0, 0, 0), 2)
    assert choose_cell(cells, busy_first, need=100).cell == (1,)  # least busy
    short = NodeLoad((1000,) * 4, (950, 950, 0, 950), (0, 0, 1, 0), 2)
    choice = choose_cell(cells, short, need=100)
    assert choice.cell == (2,) and choice.rank == CellRank(1, 0, 1, 2)
    assert "0 of 1 replicas resident, 0 bytes short, 1 calls running" in choice.reason


def test_no_free_cell_means_wait() -> None:
    load = NodeLoad((1000,) * 2, (0, 0), (1, 1), 1)
    assert choose_cell(aligned_cells(2, 1), load, need=1) is None


# --- properties ----------------------------------------------------------------------------------

nodes = st.integers(1, 8).flatmap(
    lambda n: st.tuples(
        st.just(n),
        st.sampled_from(cell_sizes(n)),
        st.lists(st.integers(0, 3), min_size=n, max_size=n),  # busy
        st.lists(st.integers(0, 1000), min_size=n, max_size=n),  # claimed
        st.sets(st.integers(0, n - 1)),  # held
        st.integers(1, 3),  # calls per GPU
        st.integers(0, 1000),  # need
    )
)


@given(nodes)
def test_the_choice_is_an_aligned_cell_with_a_free_slot_and_the_most_replicas(node) -> None:
    n, size, busy, claimed, held, limit, need = node
    load = NodeLoad((1000,) * n, tuple(claimed), tuple(busy), limit)
    cells = aligned_cells(n, size)
    choice = choose_cell(cells, load, held=held, need=need)
    free = [c for c in cells if all(busy[g] < limit for g in c)]
    if not free:
        assert choice is None
        return
    assert choice is not None and choice.cell in free and is_aligned_cell(choice.cell, n)
    most = max(sum(g in held for g in c) for c in free)
    assert sum(g in held for g in choice.cell) == most  # prefers resident cells
    assert choice.rank == min(rank_cell(c, held, need, load) for c in free)
    assert choose_cell(cells, load, held=held, need=need) == choice  # deterministic


@given(nodes)
def test_the_schedulers_cell_is_never_swapped_for_another(node) -> None:
    n, size, busy, claimed, held, limit, need = node
    load = NodeLoad((1000,) * n, tuple(claimed), tuple(busy), limit)
    for cell in aligned_cells(n, size):
        choice = choose_cell((cell,), load, held=held, need=need, given=True)
        assert (choice is not None) == all(busy[g] < limit for g in cell)
        assert choice is None or choice.cell == cell
