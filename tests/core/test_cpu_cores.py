"""NUMA core accounting: grants, checked takes and returns against a plain set model."""

import pytest
from hypothesis import given
from hypothesis import strategies as st

from tangram.core import CpuNodeSpec
from tangram.core.state import CapacityError, CpuNodeState

ops = st.lists(
    st.one_of(
        st.tuples(st.just("grant"), st.integers(1, 16)),
        st.tuples(st.just("release"), st.integers(0, 10)),
        st.tuples(st.just("take"), st.lists(st.integers(0, 15), min_size=1, max_size=6)),
        st.tuples(st.just("give"), st.lists(st.integers(0, 15), min_size=1, max_size=6)),
    ),
    max_size=40,
)


@given(ops)
def test_core_accounting_matches_a_set_model(operations):
    node = CpuNodeState(CpuNodeSpec("n", 16, 4, 8.0))
    free = set(range(16))
    granted: list[tuple[int, ...]] = []  # what a running action holds
    held: set[int] = set()  # static reservations (take/give)
    for op, arg in operations:
        if op == "grant":
            if arg > len(free):
                with pytest.raises(CapacityError, match="cores asked"):
                    node.grant_cores(arg)
                continue
            expected = node.choose_cores(arg)
            cores = node.grant_cores(arg)
            assert cores == expected and len(set(cores)) == arg and set(cores) <= free
            domains = {c // 4 for c in cores}
            if any(len([c for c in free if c // 4 == d]) >= arg for d in range(4)):
                assert len(domains) == 1  # one NUMA domain whenever one can hold them all
            free -= set(cores)
            granted.append(cores)
        elif op == "release" and granted:
            cores = granted.pop(arg % len(granted))
            node.release_granted(cores)
            free |= set(cores)
        elif op == "take":
            cores = tuple(arg)
            if len(set(cores)) == len(cores) and set(cores) <= free:
                node.take_cores(cores)
                free -= set(cores)
                held |= set(cores)
            else:
                with pytest.raises(CapacityError):
                    node.take_cores(cores)
        elif op == "give":
            cores = tuple(arg)
            if len(set(cores)) != len(cores) or set(cores) & free:
                with pytest.raises(CapacityError, match="returned twice"):
                    node.give_cores(cores)
            elif set(cores) <= held:
                node.give_cores(cores)
                free |= set(cores)
                held -= set(cores)
            else:
                continue  # some are a running action's: returning those is not the holder's call
        assert [c for d in node.free_by_numa for c in d] == sorted(free)  # each list sorted
        assert node.free_cores == len(free) and node.usage.cores == 16 - len(free)
