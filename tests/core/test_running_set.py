"""The running set's per-domain indexes (wide resizable actions, sorted finishes kept sorted
through every change, busy core-seconds) against plain selections over its running actions."""

import heapq

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from tangram.core.action import Action
from tangram.core.curves import Amdahl
from tangram.core.decision import Start
from tangram.core.resources import ResourceKind
from tangram.core.running import RunningSet, resizable

DOMAINS = [("cpu", "n0", 0), ("cpu", "n1", 0)]

# One step: (operation, action number, units, domain index, malleable).
steps = st.lists(
    st.tuples(
        st.sampled_from(["start", "resize", "end"]),
        st.integers(0, 11),
        st.integers(1, 9),
        st.integers(0, 1),
        st.booleans(),
    ),
    max_size=60,
)


def _start(number: int, units: int, malleable: bool) -> Start:
    action = Action(
        f"a{number}",
        f"t{number}",
        ResourceKind.CPU,
        Amdahl(10.0, 0.1),
        max_units=16,
        malleable=malleable,
    )
    # (Starts half a second apart, some in a static pod's slot: finishes tie and interleave.)
    return Start(
        number % 4 * 0.5,
        action,
        "n",
        units,
        "test",
        cores=tuple(range(units)),
        est_duration=5.0,
        in_slot=number % 5 == 4,
    )


@settings(max_examples=200, deadline=None)
@given(steps, st.integers(1, 6))
def test_the_widest_and_the_finishes_match_a_plain_selection_after_any_starts_resizes_and_ends(
    script, n
):
    runs = RunningSet()
    for op, number, units, d, malleable in script:
        action_id = f"a{number}"
        if op == "start" and action_id not in runs:
            runs.add(_start(number, units, malleable), DOMAINS[d])
        elif op == "resize" and action_id in runs:
            old = runs.by_id[action_id]
            start = old.start._replace(units=units, cores=tuple(range(units)))
            # (A resize moves the estimated finish too: later on fewer cores, sooner on more.)
            runs.replace(old._replace(start=start, est_finish=old.est_finish + 4.0 / units - 1.0))
        elif op == "end" and action_id in runs:
            runs.pop(action_id)
        for domain in DOMAINS:
            wide = [
                r
                for r in runs.by_domain.get(domain, {}).values()
                if resizable(r) and r.start.units > 1
            ]
            assert set(runs.wide.get(domain, {})) == {r.action.id for r in wide}
            expected = heapq.nlargest(n, wide, key=lambda r: (r.start.units, r.action.id))
            assert runs.widest(domain, n) == expected
            for now in (0.0, 5.0, 5.5, 6.0, 9.0):  # before, at and between the finishes
                assert runs.finishes(domain, now) == sorted(
                    (max(r.est_finish, now), r.start.units)
                    for r in runs.by_domain.get(domain, {}).values()
                    if not r.start.in_slot
                )
                assert runs.busy_core_seconds(domain, now) == pytest.approx(
                    sum(
                        max(0.0, r.est_finish - now) * r.start.units
                        for r in runs.by_domain.get(domain, {}).values()
                        if not r.start.in_slot
                    )
                )
