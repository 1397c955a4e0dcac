"""The action table's phases, as a specification: the moves it allows (each one, and nothing
else), what leaving the core does, and how long ended actions are kept for polling."""

from __future__ import annotations

import itertools
from typing import Any

import pytest

from tangram.exec.runtime.actions import (
    MOVES,
    STARTED,
    WAITING,
    ActionTable,
    LiveAction,
    Phase,
    PhaseError,
    move,
)

A, Q, R, F, OUT = Phase.ARRIVING, Phase.QUEUED, Phase.RUNNING, Phase.FINISHING, Phase.OUT


def record(action_id: str = "a", phase: Phase = A, **kw: Any) -> LiveAction:
    """A live record with only what the table reads (the rest is not looked at)."""
    fields: dict[str, Any] = dict(
        id=action_id,
        seq=0,
        spec=None,
        action=None,
        traj=f"~{action_id}",
        fingerprint="",
        arrival=0.0,
        deadline=1.0,
        future=None,
        max_units=1,
        size_gb=0.0,
        memory_gb=0.0,
        executor=None,
    )
    fields.update(kw)
    rec = LiveAction(**fields)
    rec.phase = phase
    return rec


def test_the_allowed_moves_are_exactly_these() -> None:
    assert set(MOVES) == {(A, Q), (A, OUT), (Q, R), (Q, OUT), (R, F), (F, OUT)}
    assert all(isinstance(why, str) and why for why in MOVES.values()), "each move says when"


@pytest.mark.parametrize(("src", "dst"), sorted(MOVES, key=lambda m: (m[0].value, m[1].value)))
def test_every_allowed_move_is_made(src: Phase, dst: Phase) -> None:
    rec = record(phase=src)
    move(rec, dst)
    assert rec.phase is dst


REFUSED = [(a, b) for a, b in itertools.product(Phase, Phase) if (a, b) not in MOVES]


@pytest.mark.parametrize(("src", "dst"), REFUSED, ids=[f"{a.value}-{b.value}" for a, b in REFUSED])
def test_every_other_move_is_refused_and_changes_nothing(src: Phase, dst: Phase) -> None:
    rec = record(phase=src)
    with pytest.raises(PhaseError, match=f"{src.value} -> {dst.value}"):
        move(rec, dst)
    assert rec.phase is src


def test_out_is_final_and_a_phase_is_never_re_entered() -> None:
    assert not [b for a, b in MOVES if a is OUT]
    assert all(a is not b for a, b in MOVES)
    with pytest.raises(PhaseError, match="out goes to nothing"):
        move(record(phase=OUT), Q)


def test_the_life_of_an_action_that_runs_and_one_that_never_does() -> None:
    ran = record("ran")
    for phase in (Q, R, F, OUT):
        move(ran, phase)
    withdrawn = record("withdrawn")
    move(withdrawn, OUT)  # cancelled before any pass saw it
    assert ran.phase is withdrawn.phase is OUT


def test_leaving_the_core_drops_the_action_from_its_trajectory() -> None:
    active: dict[str, LiveAction] = {}
    rec = record("a", active=active)
    active["a"] = rec
    move(rec, Q)
    move(rec, R)
    move(rec, F)
    assert "a" in active, "finishing: the core still holds its units"
    move(rec, OUT)
    assert active == {}


def test_waiting_and_started_split_the_phases_the_core_holds() -> None:
    assert {A, Q} == WAITING and {R, F} == STARTED
    assert not WAITING & STARTED and OUT not in WAITING | STARTED


def test_the_table_keeps_ended_actions_up_to_its_bound_but_never_one_the_core_holds() -> None:
    table = ActionTable(keep=2)
    recs = [record(f"a{i}", phase=OUT) for i in range(4)]
    held = record("held", phase=F)  # ended (its outcome given) but its finish not yet passed
    for rec in [held, *recs]:
        table.add(rec)
    table.retire(held)
    table.retire(recs[0])
    table.retire(recs[1])
    assert "held" in table and "a0" in table, "the oldest is still held: nothing is dropped"
    move(held, OUT)
    table.retire(recs[2])
    assert "held" not in table and "a0" not in table and "a1" in table and "a2" in table
    assert len(table) == 3  # a1 and a2 ended, a3 not yet
    with pytest.raises(ValueError, match="already"):
        table.add(record("a3"))


def test_one_action_the_core_holds_for_ever_does_not_keep_every_later_outcome() -> None:
    """An ended action the core still holds (its call never returns: an EOE call that hangs,
    an endpoint that swallows its cancel) stopped the table from dropping anything after it:
    every later outcome was kept, its record in memory (and its id in the core's set), for
    as long as that one call hung: memory grew with every action. The others are dropped
    past the bounds as usual; the held one is kept until it is out, then dropped."""
    table = ActionTable(keep=2)
    held = record("held", phase=F)
    table.add(held)
    table.retire(held)
    for i in range(100):
        rec = record(f"a{i}", phase=OUT)
        table.add(rec)
        table.retire(rec)
    assert len(table) <= 3 and "held" in table and "a99" in table and "a0" not in table
    move(held, OUT)
    last = record("last", phase=OUT)
    table.add(last)
    table.retire(last)
    assert "held" not in table and len(table) == 2


def test_waiting_counts_actions_without_an_outcome_by_phase_name() -> None:
    table = ActionTable(keep=10)
    for i, phase in enumerate([A, A, Q, R, F]):
        table.add(record(f"w{i}", phase=phase))
    table.add(record("done", phase=OUT, outcome=object()))
    assert table.waiting() == {"arriving": 2, "queued": 1, "running": 1, "finishing": 1}
