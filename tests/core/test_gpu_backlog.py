"""The GPU rule's backlog arithmetic (``gpu_waits``): when the queued work is placed on the
pool's GPUs as they free, and what a call waiting for a larger cell costs the calls queued
behind it."""

import pytest

from tangram.core.policies.gpu_waits import Backlog, blocked, filled


def test_filled_pours_the_work_onto_the_gpus_as_they_free():
    assert filled([0.0, 0.0, 0.0, 0.0], 8.0) == pytest.approx(2.0)
    # GPU 3 free at 0.5, GPUs 1-2 at 2.658, GPU 0 at 400: 2.158 GPU-s by 2.658, then three
    # GPUs share the remaining 97.842: 2.658 + 32.614.
    assert filled([0.5, 2.658, 2.658, 400.0], 100.0) == pytest.approx(35.272, abs=1e-3)
    # A long call's GPU is only reached when the others have filled up to its end.
    assert filled([1.0, 300.0], 500.0) == pytest.approx(400.5)
    assert filled([], 1.0) == float("inf")


def test_holding_the_last_gpus_costs_each_queued_call_the_shift_of_the_drain():
    # Four GPUs on node g: GPUs 0-1 busy until 20, GPU 2 until 1.79, GPU 3 free now (0).
    # Queued: a 51-s call (its own work left out) and three short calls, 1.3 GPU-s in all.
    # Now: the long call takes GPU 3 until 51; the shorts run on GPU 2 from 1.79: done by
    # 3.09. Waiting for the cell (2, 3) from 1.79 to 1.79 + 32: the shorts wait for GPUs
    # 0-1 at 20: done by 20.65. Each of the three is ~17.6 s later: 52.7 s in all.
    b = Backlog({("g", 0): 20.0, ("g", 1): 20.0, ("g", 2): 1.79, ("g", 3): 0.0}, 52.3, 4)
    cost = blocked(b, 51.0, "g", 1, 51.0, "g", (2, 3), 1.79 + 32.0)
    assert cost == pytest.approx(3 * (20.65 - 3.09), abs=1e-6)
    # With nothing queued behind it, holding the cell costs nobody anything.
    assert blocked(Backlog(b.free_at, 51.0, 1), 51.0, "g", 1, 51.0, "g", (2, 3), 33.79) == 0.0
