"""How a GPU makes room for a call (``plan_room``), as a specification: least recently used
first, never a replica in use, never past the budget; wait when running calls hold the bytes,
fail when memory outside the executor does; restore only what is missing."""

from __future__ import annotations

import random

import pytest
from hypothesis import given
from hypothesis import strategies as st

from tangram.exec.eoe.plan_room import (
    GpuMemory,
    ReplicaState,
    Verdict,
    eviction_targets,
    lru,
    pin_only,
    plan_evict,
    plan_gpu,
    plan_room,
)


def books(*replicas: ReplicaState) -> dict[tuple[str, int], ReplicaState]:
    return {(r.service, r.gpu): r for r in replicas}


def memory(budget: int, *replicas: ReplicaState, extra: int = 0, foreign: int = 0) -> GpuMemory:
    """A GPU whose claims are its replicas' plus ``extra`` (running calls' workspaces)."""
    return GpuMemory(budget, sum(r.claim for r in replicas) + extra, foreign)


OLD = ReplicaState("old", 0, 30, last_used=1)
MID = ReplicaState("mid", 0, 30, last_used=2)
NEW = ReplicaState("new", 0, 30, last_used=3)


# --- one GPU -----------------------------------------------------------------------------------


def test_free_room_evicts_nothing() -> None:
    plan = plan_gpu("svc", 0, 10, books(OLD), memory(100, OLD))
    assert plan.verdict is Verdict.GO and plan.evict == () and "70 bytes free" in plan.reason


def test_nothing_to_claim_needs_no_room() -> None:
    plan = plan_gpu("svc", 0, 0, books(OLD), GpuMemory(10, 10, 50))
    assert plan.verdict is Verdict.GO and plan.evict == ()


def test_least_recently_used_leave_first_and_no_more_than_needed() -> None:
    reps = books(NEW, OLD, MID)  # insertion order does not matter
    plan = plan_gpu("svc", 0, 50, reps, memory(100, NEW, OLD, MID))
    assert plan.verdict is Verdict.GO
    assert plan.evict == (("old", 0), ("mid", 0))


def test_a_pinned_or_restoring_replica_never_leaves() -> None:
    pinned = ReplicaState("old", 0, 30, pins=1, last_used=1)
    restoring = ReplicaState("mid", 0, 30, ready=False)
    plan = plan_gpu(
        "svc", 0, 40, books(pinned, restoring, NEW), memory(100, pinned, restoring, NEW)
    )
    assert plan.verdict is Verdict.GO and plan.evict == (("new", 0),)


def test_the_services_own_replica_never_leaves_for_its_workspace() -> None:
    own = ReplicaState("svc", 0, 60, last_used=0)
    plan = plan_gpu("svc", 0, 30, books(own, OLD), memory(100, own, OLD))
    assert plan.evict == (("old", 0),)


def test_wait_when_running_calls_pin_what_would_have_to_go() -> None:
    pinned = ReplicaState("old", 0, 60, pins=1)
    plan = plan_gpu("svc", 0, 50, books(pinned), memory(100, pinned))
    assert plan.verdict is Verdict.WAIT and plan.evict == ()
    assert "running calls hold 60 bytes" in plan.reason


def test_wait_for_a_running_calls_workspace() -> None:
    plan = plan_gpu("svc", 0, 50, books(), memory(100, extra=60))
    assert plan.verdict is Verdict.WAIT


def test_never_when_memory_outside_the_executor_holds_the_bytes() -> None:
    pinned = ReplicaState("old", 0, 30, pins=1)
    plan = plan_gpu("svc", 0, 50, books(pinned), memory(100, pinned, foreign=60))
    assert plan.verdict is Verdict.NEVER
    assert plan.reason == (
        "service 'svc' needs 50 bytes on GPU 0 but cannot get them: budget 100, claimed by the "
        "executor 30, used outside the executor 60"
    )


def test_never_when_nothing_else_holds_the_gpu() -> None:
    plan = plan_gpu("svc", 0, 50, books(), GpuMemory(100, 0, 70))
    assert plan.verdict is Verdict.NEVER


# --- a cell ------------------------------------------------------------------------------------


def test_a_cell_restores_where_the_service_is_missing_and_claims_workspace_everywhere() -> None:
    here = ReplicaState("svc", 0, 40)
    other = ReplicaState("other", 1, 50, last_used=5)
    reps = books(here, other)
    mem = {0: memory(100, here), 1: memory(100, other)}
    plan = plan_room("svc", (0, 1), reps, mem, resident_bytes=40, workspace_bytes=20)
    assert plan.verdict is Verdict.GO
    assert plan.restore == (1,) and plan.evict == (("other", 1),)
    assert [(p.gpu, p.need) for p in plan.gpus] == [(0, 20), (1, 60)]


def test_a_cell_stops_at_its_first_gpu_that_cannot_go() -> None:
    pinned = ReplicaState("other", 0, 80, pins=1)
    reps = books(pinned)
    mem = {0: memory(100, pinned), 1: GpuMemory(100, 0, 0)}
    plan = plan_room("svc", (0, 1), reps, mem, resident_bytes=40, workspace_bytes=0)
    assert plan.verdict is Verdict.WAIT and [p.gpu for p in plan.gpus] == [0]
    assert plan.evict == () and plan.restore == ()


def test_only_pin_when_resident_everywhere_and_no_workspace() -> None:
    reps = books(ReplicaState("svc", 0, 10), ReplicaState("svc", 1, 10, ready=False))
    assert pin_only("svc", (0, 1), reps, 0)
    assert not pin_only("svc", (0, 1), reps, 5)
    assert not pin_only("svc", (0, 1, 2, 3), reps, 0)


def test_lru_lists_ready_replicas_oldest_first() -> None:
    restoring = ReplicaState("r", 0, 10, ready=False)
    elsewhere = ReplicaState("e", 1, 10)
    assert lru([NEW, restoring, OLD, elsewhere, MID], 0) == [OLD, MID, NEW]


# --- explicit eviction -------------------------------------------------------------------------


def test_explicit_eviction_takes_all_or_none() -> None:
    reps = books(ReplicaState("svc", 0, 10), ReplicaState("svc", 2, 10, pins=1), OLD)
    plan = plan_evict("svc", (0, 1, 2), reps)
    assert plan.busy == (2,) and plan.reason.endswith(
        "in use on GPUs [2]; it cannot be evicted now"
    )
    plan = plan_evict("svc", (0, 1), reps)
    assert plan.busy == () and plan.evict == (("svc", 0),)
    restoring = books(ReplicaState("svc", 0, 10, ready=False))
    assert plan_evict("svc", (0,), restoring).busy == (0,)


def test_eviction_targets() -> None:
    assert eviction_targets(None, 3) == (0, 1, 2)
    assert eviction_targets([2, 0, 2], 3) == (0, 2)
    with pytest.raises(ValueError, match=r"GPUs \[3\] do not exist"):
        eviction_targets([3], 3)


def test_eviction_targets_read_from_an_endless_iterable_are_bounded() -> None:
    """gpus=itertools.count() made list() run forever (the eviction hung); an unsized
    iterable is read for at most 4,096 GPUs (MAX_NAMED), and past that refused naming gpus."""

    def endless():
        yield from range(4096 + 10)
        raise AssertionError("read past the bound")

    with pytest.raises(ValueError, match="gpus must name at most 4096 GPUs"):
        eviction_targets(endless(), 3)
    assert eviction_targets(iter([2, 0, 2]), 3) == (0, 2)


@pytest.mark.parametrize("gpus", [["0"], [0, "1"], [1.0], [True], 0])
def test_eviction_targets_that_are_no_gpu_indices_are_refused_naming_them(gpus: object) -> None:
    """A GPU that is no index was a bare TypeError from sorting or comparing ('<' not
    supported...), or taken as an index (True as GPU 1, 1.0 as GPU 1)."""
    with pytest.raises(ValueError, match="GPU indices"):
        eviction_targets(gpus, 3)  # type: ignore[arg-type]


# --- properties ----------------------------------------------------------------------------------

replica_sets = st.lists(
    st.tuples(
        st.integers(1, 60),  # claim
        st.booleans(),  # ready
        st.integers(0, 2),  # pins
    ),
    max_size=8,
)
gpus = st.tuples(
    replica_sets,
    st.integers(0, 60),  # workspaces of running calls
    st.integers(0, 80),  # foreign
    st.integers(50, 300),  # budget
    st.integers(0, 120),  # need
    st.booleans(),  # the service itself has a replica here
    st.randoms(use_true_random=False),
)


def scene(draw: tuple) -> tuple[dict, GpuMemory, int]:
    raw, extra, foreign, budget, need, own, rng = draw
    reps = [
        ReplicaState(f"s{i}", 0, claim, ready, pins, last_used=i)
        for i, (claim, ready, pins) in enumerate(raw)
    ]
    if own:
        reps.append(ReplicaState("svc", 0, 20, last_used=-1))  # oldest, idle: still never chosen
    rng.shuffle(reps)
    return books(*reps), memory(budget, *reps, extra=extra, foreign=foreign), need


@given(gpus)
def test_a_plan_evicts_only_idle_replicas_of_others_in_lru_order(draw: tuple) -> None:
    reps, mem, need = scene(draw)
    plan = plan_gpu("svc", 0, need, reps, mem)
    victims = [reps[k] for k in plan.evict]
    assert all(v.ready and v.pins == 0 and v.service != "svc" and v.gpu == 0 for v in victims)
    idle = [r for r in lru(reps.values(), 0) if r.service != "svc" and r.pins == 0]
    assert victims == idle[: len(victims)]  # the least recently used idle ones, in order
    assert plan.verdict is Verdict.GO or not victims


@given(gpus)
def test_a_go_never_exceeds_the_budget_and_evicts_no_more_than_needed(draw: tuple) -> None:
    reps, mem, need = scene(draw)
    plan = plan_gpu("svc", 0, need, reps, mem)
    if plan.verdict is not Verdict.GO:
        return
    freed = sum(reps[k].claim for k in plan.evict)
    assert mem.claimed - freed + mem.foreign + need <= mem.budget or need == 0
    if plan.evict:
        last = reps[plan.evict[-1]].claim
        assert mem.room + freed - last < need  # one victim fewer would not have done


@given(gpus)
def test_wait_only_when_running_calls_hold_what_is_missing_never_otherwise(draw: tuple) -> None:
    reps, mem, need = scene(draw)
    plan = plan_gpu("svc", 0, need, reps, mem)
    idle = sum(r.claim for r in reps.values() if r.ready and not r.pins and r.service != "svc")
    own = reps["svc", 0].claim if ("svc", 0) in reps else 0
    can_now = need == 0 or mem.room + idle >= need
    held_by_calls = mem.claimed - idle - own
    could_later = held_by_calls > 0 and mem.budget - mem.foreign - own >= need
    expected = Verdict.GO if can_now else Verdict.WAIT if could_later else Verdict.NEVER
    assert plan.verdict is expected


@given(gpus, st.randoms(use_true_random=False))
def test_a_plan_depends_on_the_books_not_on_their_order(draw: tuple, rng: random.Random) -> None:
    reps, mem, need = scene(draw)
    shuffled = list(reps.items())
    rng.shuffle(shuffled)
    assert plan_gpu("svc", 0, need, dict(shuffled), mem) == plan_gpu("svc", 0, need, reps, mem)


cells = st.tuples(
    st.sampled_from([(0,), (0, 1), (0, 1, 2, 3)]),
    st.lists(st.tuples(st.integers(0, 3), st.integers(1, 60), st.integers(0, 1)), max_size=10),
    st.sets(st.integers(0, 3)),  # GPUs where the service is resident
    st.integers(1, 80),  # resident bytes
    st.integers(0, 30),  # workspace bytes
)


@given(cells)
def test_a_cell_plan_restores_exactly_the_missing_replicas_and_keeps_every_gpu_in_budget(
    draw: tuple,
) -> None:
    cell, raw, resident_on, resident, workspace = draw
    reps = [
        ReplicaState(f"s{i}", g, claim, pins=pins, last_used=i)
        for i, (g, claim, pins) in enumerate(raw)
    ]
    reps += [ReplicaState("svc", g, resident) for g in sorted(resident_on)]
    by_key = books(*reps)
    on = {g: [r for r in by_key.values() if r.gpu == g] for g in range(4)}
    # The books never claim more than a budget: budgets start at 150 or what is claimed.
    mem = {g: memory(max(150, sum(r.claim for r in on[g])), *on[g]) for g in range(4)}
    plan = plan_room("svc", cell, by_key, mem, resident_bytes=resident, workspace_bytes=workspace)
    if plan.verdict is not Verdict.GO:
        assert plan.gpus[-1].verdict is plan.verdict
        assert all(p.verdict is Verdict.GO for p in plan.gpus[:-1])
        return
    assert plan.restore == tuple(g for g in cell if g not in resident_on)
    assert {g for _, g in plan.evict} <= set(cell)
    for g in cell:
        freed = sum(by_key[k].claim for k in plan.evict if k[1] == g)
        need = workspace + (resident if g in plan.restore else 0)
        assert mem[g].claimed - freed + need <= mem[g].budget
