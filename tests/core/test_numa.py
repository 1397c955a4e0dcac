"""NUMA core choice: one rule (``numa_picks``), the same cores from the core and from AOE."""

from __future__ import annotations

from hypothesis import given
from hypothesis import strategies as st

from tangram.core.numa import numa_picks
from tangram.core.resources import CpuNodeSpec
from tangram.core.state import CpuNodeState
from tangram.exec.aoe.topology import NumaTopology, choose_cores


@st.composite
def free_sets(draw: st.DrawFn) -> tuple[CpuNodeSpec, set[int], int]:
    domains = draw(st.sampled_from([1, 2, 4]))
    per = draw(st.integers(1, 8))
    spec = CpuNodeSpec("n", domains * per, domains, 64.0)
    free = draw(st.sets(st.integers(0, spec.cores - 1), min_size=1))
    n = draw(st.integers(1, len(free)))
    return spec, free, n


def test_one_domain_by_best_fit_when_any_holds_the_grant() -> None:
    assert numa_picks([[0, 1, 2, 3], [4, 5], [6, 7, 8]], 2) == [(1, 2)]
    assert numa_picks([[0, 1, 2], [3, 4, 5]], 3) == [(0, 3)]  # ties: the lowest domain


def test_spans_the_fewest_domains_most_free_first() -> None:
    assert numa_picks([[0], [1, 2, 3], [4, 5]], 5) == [(1, 3), (2, 2)]
    assert numa_picks([[0], [1, 2], [3, 4]], 5) == [(1, 2), (2, 2), (0, 1)]


@given(free_sets())
def test_picks_take_n_cores_each_within_its_domain(case: tuple) -> None:
    spec, free, n = case
    per = spec.cores // spec.numa_domains
    domains = [
        [c for c in range(d * per, (d + 1) * per) if c in free] for d in range(spec.numa_domains)
    ]
    picks = numa_picks(domains, n)
    assert sum(k for _, k in picks) == n
    assert all(0 < k <= len(domains[d]) for d, k in picks)
    assert len({d for d, _ in picks}) == len(picks)
    if any(len(d) >= n for d in domains):
        assert len(picks) == 1


@given(free_sets())
def test_the_core_and_aoe_choose_the_same_cores(case: tuple) -> None:
    spec, free, n = case
    node = CpuNodeState(spec)
    node.take_cores(tuple(c for c in range(spec.cores) if c not in free))
    topology = NumaTopology.from_spec(spec)
    assert choose_cores(topology, free, n) == tuple(sorted(node.choose_cores(n)))
