"""Time-slicing's cost (``Overheads.oversubscription_slowdown``): threads that outnumber their
cores lose a share of their speed, charged alike to a burstable pod's parallel phase
(``tangram.sim.cfs``) and to a ``tangram`` action told more threads than its grant."""

from pathlib import Path

import pytest

from tangram.core.cluster_file import load_cluster
from tangram.sim.cfs import Job, SharedNode
from tangram.sim.config import Overheads, SimConfig
from tangram.sim.driver import simulate
from tangram.trace.files import load_trace

CASES = Path(__file__).parents[1] / "mechanisms" / "cpu"


def test_a_pod_whose_threads_outnumber_its_cores_runs_slower_by_the_share():
    # 8 core-seconds of parallel work, 4 threads, alone on 2 cores: 2 x 0.8 = 1.6 core-s per
    # second at a slowdown of 0.2, so 5 s (4 s when time-slicing is free).
    for slowdown, ends in ((0.0, 4.0), (0.2, 5.0)):
        node = SharedNode(2, slowdown)
        node.add(0.0, "a", Job(8.0, 4.0, 1.0))
        assert node.next_finish() == pytest.approx(ends)


def test_a_pod_on_as_many_cores_as_threads_pays_nothing():
    node = SharedNode(4, 0.2)
    node.add(0.0, "a", Job(8.0, 4.0, 1.0))
    assert node.next_finish() == pytest.approx(2.0)


def test_a_told_action_pays_only_while_its_grant_is_below_its_threads():
    # wait_for_cores: A (100 s on one core, serial fraction 0) starts at 0.1 s on the one free
    # core told 16 threads; at 2 s it grows to 16. At a slowdown of 0.2 its first 1.9 s do
    # 1.9 x 0.8 / 100 = 0.0152 of its work; the rest on 16 cores (no longer oversubscribed)
    # takes 0.9848 x 100 / 16 = 6.155 s: ACT 8.055 s (8.03125 s when time-slicing is free).
    trace = load_trace(CASES / "wait_for_cores.jsonl")
    cluster = load_cluster(CASES / "wait_for_cores.toml")
    acts = {}
    for slowdown in (0.0, 0.2):
        ov = Overheads(aoe_grant_s=0.0, container_start_s=0.0, oversubscription_slowdown=slowdown)
        result = simulate(trace, cluster, SimConfig(policy="tangram", overheads=ov))
        (a,) = [r for r in result.actions if r.row.action_id == "s0-t00015-a000"]
        acts[slowdown] = a.finish - a.arrival
    assert acts[0.0] == pytest.approx(1.9 + 0.981 * 100 / 16)
    assert acts[0.2] == pytest.approx(1.9 + (1 - 1.9 * 0.8 / 100) * 100 / 16)


@pytest.mark.parametrize("bad", [-0.1, 1.0, True])
def test_a_slowdown_outside_zero_to_one_is_refused_naming_it(bad):
    with pytest.raises(ValueError, match="oversubscription_slowdown"):
        Overheads(oversubscription_slowdown=bad)
