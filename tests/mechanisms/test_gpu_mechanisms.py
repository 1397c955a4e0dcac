"""Hand-written GPU cases (issue 11): the default ``tangram`` handles each, ``tangram-paper``
still shows the defect. Traces and clusters live in ``tests/mechanisms/gpu/``; replay one with
``tangram sim --trace tests/mechanisms/gpu/X.jsonl --cluster tests/mechanisms/gpu/X.toml``.

Restore times: size_gb / (cell GPUs x 25 GB/s) + 0.05 s; the simulator adds 0.01 s per
eviction a restore forces; GPUs start warm (each service resident once, smallest cell).
"""

from pathlib import Path

import numpy as np
import pytest

from tangram.core.cluster_file import load_cluster
from tangram.sim.config import RolloutConfig, SimConfig
from tangram.sim.driver import simulate
from tangram.trace.files import load_trace

CASES = Path(__file__).parent / "gpu"


def acts(case: str, policy: str, *, announce_step_end: bool = True) -> dict[str, float]:
    trace = load_trace(CASES / f"{case}.jsonl")
    cluster = load_cluster(CASES / f"{case}.toml")
    rollout = RolloutConfig(announce_step_end=announce_step_end)
    result = simulate(trace, cluster, SimConfig(policy=policy, timeline=False, rollout=rollout))
    assert all(r.outcome == "result" for r in result.actions)
    return {r.row.action_id: r.finish - r.arrival for r in result.actions}


def test_restore_onto_a_larger_cell_is_amortised_over_the_calls_that_follow():
    # One trajectory, ten calls 1 s apart to a 32.8B model (65.6 GB: warm on one 80-GB GPU of
    # four), t1 = 0.8 s, serial fraction 0.25: d(1) = 0.8 s, d(4) = 0.8 x (0.25 + 0.75/4)
    # = 0.35 s; a restore onto the 4-GPU cell takes 65.6 / 100 + 0.05 = 0.706 s.
    # Paper: each call weighs one restore against one call: 0.35 + 0.706 = 1.056 > 0.8, so
    # every call stays on its 1-GPU cell: mean ACT 0.8 s.
    # Default: the restore is shared by the calls expected (the queued one plus the recent
    # one: 0.706 / 2 = 0.353; 0.35 + 0.353 < 0.8): one restore, then nine 0.35-s calls,
    # mean ~0.42 s, as fixed:4 (which always takes the 4-GPU cell).
    paper, default, fixed4 = (
        np.mean(list(acts("restore_amortised", p).values()))
        for p in ("tangram-paper", "tangram", "fixed:4")
    )
    assert paper == pytest.approx(0.8)
    assert default <= 1.02 * fixed4
    assert default < 0.6 * paper


def test_short_calls_do_not_wait_behind_a_long_one_in_a_burst():
    # Two GPUs. At t = 0 one call to a 72.7B model (145.4 GB: both GPUs, 20 s on one, 10 s
    # on two) arrives first, then two 0.2-s calls to a 7.6B model (15.2 GB, not resident:
    # the 72.7B shards leave 7.3 GB per GPU; restore 15.2 / 25 + 0.05 = 0.658 s each).
    # Paper (FCFS): the long call takes both GPUs for 10 s; the short ones then restore and
    # run: 10 + 0.658 + 0.01 + 0.2 = 10.868 s each; mean (10 + 2 x 10.868) / 3 = 10.58 s.
    # Default (short-first across services within 2 s of arrival): the short calls go
    # first, 0.868 s each; the long one then restores (2.958 s) and runs 10 s: ~13.8 s;
    # mean ~5.2 s.
    paper = acts("short_behind_long", "tangram-paper")
    default = acts("short_behind_long", "tangram")
    short = [a for a in paper if not a.startswith("s0-t00000")]
    assert all(paper[a] > 10.0 for a in short)
    assert all(default[a] < 1.0 for a in short)
    assert np.mean(list(default.values())) < 0.6 * np.mean(list(paper.values()))


def test_a_burst_whose_keys_tie_keeps_its_arrival_order_across_services():
    # Two GPUs; at t = 0 six calls alternate between "big" (t1 = 3 s) and "small" (0.6 s),
    # both 15.2-GB models, one GPU each (warm: big on GPU 0, small on GPU 1; a restore is
    # 15.2 / 25 + 0.05 = 0.658 s). Every key is 0 + min(4 x d, 2 s) = 2 s: a tie.
    # Ties in arrival order: t0 big 0-3.0 on GPU 0, t1 small 0-0.6 on GPU 1; at 0.6 t2 big
    # restores on GPU 1 (0.658 + 3 = 3.658 beats waiting 2.4 s + 3): done 4.258; at 3.0 t3
    # small waits for GPU 1, where small is resident (the step's six calls are all in, so a
    # restore serves t3 alone: 0.658 s plus the 0.658 s its GPU time costs the queued calls,
    # ``_RobustPass.calls``, loses to waiting 1.258 s): done 4.858; t4 big runs on GPU 0 at
    # 3.0, done 6.0; t5 small on GPU 1 at 4.858, done 5.458. Mean 24.174 / 6 = 4.029 s
    # (amortised over calls to come, t3 restored onto GPU 0 and t4 waited: 4.039 s).
    # Ties by service (stop 22): the big calls took both GPUs first (t2 restored on GPU 1,
    # t4 at 3.0 on GPU 0) and the small ones waited until 3.658: mean 27.232 / 6 = 4.539 s.
    default = acts("burst_ties_across_services", "tangram")
    expected = {0: 3.0, 1: 0.6, 2: 4.258, 3: 4.858, 4: 6.0, 5: 5.458}
    for i, act in expected.items():
        assert default[f"s0-t{i:05d}-a000"] == pytest.approx(act, abs=1e-3)
    assert np.mean(list(default.values())) == pytest.approx(4.029, abs=1e-3)
    # The paper's FCFS queue has no ties to break: the same order (each call weighing one
    # restore, t3 restores onto GPU 0 and t4 waits).
    paper = acts("burst_ties_across_services", "tangram-paper")
    expected.update({3: 4.258, 4: 7.258, 5: 4.858})
    assert paper == pytest.approx({f"s0-t{i:05d}-a000": act for i, act in expected.items()})
    # Unannounced (the trainer never says the step's calls are all in), the default amortises
    # t3's restore over calls to come, as the paper's does: the same order, 4.039 s.
    unannounced = acts("burst_ties_across_services", "tangram", announce_step_end=False)
    assert unannounced == pytest.approx(paper)


def test_a_long_call_waits_for_a_larger_cell_rather_than_run_on_one_gpu():
    # Four GPUs. At t = 0 three 2-s calls to a 7.6B model (15.2 GB) take GPUs 0-2 (one
    # resident; two restore, 0.658 s each: busy until 2.0 and 2.658). At t = 0.5 a call of
    # t1 = 100 s, serial fraction 0.25, up to 4 GPUs, finds one free GPU.
    # Paper: DoP fixed at start on that GPU (restore 0.658): ACT 100.658 s.
    # Default: the 2-GPU cell (2, 3) frees at 2.658; 2.158 s of wait + 100 x (0.25 + 0.75/2)
    # = 62.5 s on it: ACT 64.658 s vs 100.658 s now: 36 s sooner, which
    # pays for the 25 GPU-s it takes beyond a start now and the GPU idle while it waits; a
    # 4-GPU cell is more than half the pool (never waited for). fixed:16 (4 GPUs) 46.1 s.
    paper = acts("wait_for_larger_cell", "tangram-paper")
    default = acts("wait_for_larger_cell", "tangram")
    long = "s0-t00003-a000"
    assert paper[long] == pytest.approx(100.658, abs=1e-3)
    assert default[long] == pytest.approx(64.658, abs=1e-3)
    # The short calls are not delayed by the reservation.
    assert all(default[a] == pytest.approx(paper[a]) for a in paper if a != long)


def restores(case: str, policy: str) -> int:
    trace = load_trace(CASES / f"{case}.jsonl")
    cluster = load_cluster(CASES / f"{case}.toml")
    result = simulate(trace, cluster, SimConfig(policy=policy, timeline=False))
    return sum(r.restored for r in result.actions)


def test_two_services_on_a_small_pool_do_not_take_each_others_gpus_in_turn():
    # Two 80-GB GPUs, two 32.8B models (65.6 GB: one per GPU), warm: a on GPU 0, b on GPU 1.
    # Three trajectories call a, one calls b: ten 0.5-s calls each, 0.2 s of generation
    # before each; a restore takes 65.6 / 25 + 0.05 = 2.674 s (+0.01 per eviction).
    # Paper: at t = 0.2 the first two calls in FCFS order are a's: one runs on GPU 0, the
    # other restores a onto GPU 1 (evicting b), so b's call restores b back, and so on:
    # 18 restores, mean ACT 3.203 s, 2.97x dedicated GPUs per service (sglang-static:1,
    # 1.0775 s). Default: a's calls queue on GPU 0 (0.5 s each) rather than pay a restore
    # that evicts b, whose calls keep its GPU busy: no restore, as dedicated GPUs.
    paper = np.mean(list(acts("restore_thrash", "tangram-paper").values()))
    default = np.mean(list(acts("restore_thrash", "tangram").values()))
    dedicated = np.mean(list(acts("restore_thrash", "sglang-static:1").values()))
    assert paper == pytest.approx(3.2031, abs=1e-3)
    assert restores("restore_thrash", "tangram-paper") == 18
    assert paper > 2.5 * dedicated
    assert default <= 1.02 * dedicated
    assert restores("restore_thrash", "tangram") == 0


def test_a_call_wider_than_every_free_cell_is_not_passed_forever():
    # Two GPUs. Two trajectories send twenty 1-s calls each to a 7.6B model (0.1 s of
    # generation between calls, the second stream 0.5 s later): one GPU is always busy.
    # At t = 0.2 a call to a 72.7B model (145.4 GB: both GPUs; 2 s on two) arrives.
    # Paper: it waits until both GPUs happen to be free together, after the streams end:
    # it starts at 23.06 s (ACT 27.8 s). Default: once it has waited AGING_CAP_S (2 s) the
    # 2-GPU cell is reserved for it (no narrower call starts there); it starts when the
    # running calls end (2.77 s) and restores (2.978 s): ACT 7.55 s.
    paper = acts("wide_call_starves", "tangram-paper")
    default = acts("wide_call_starves", "tangram")
    wide = "s0-t00002-a000"
    assert paper[wide] > 27.0
    assert default[wide] < 8.0
    assert np.mean(list(default.values())) < np.mean(list(paper.values()))


def test_a_long_wide_call_does_not_reserve_a_cell_before_it_has_waited_its_own_run():
    # As wide_call_starves, but the 72.7B call runs 100 s on its two GPUs (t1 = 200 s,
    # serial fraction 0). Reserving after AGING_CAP_S (2 s), as the default did before, held
    # the node for it from ~2.8 s: one 1-s call of each stream then waited for the restore
    # (2.958 s) and its 100-s run: ACT ~105 s each, mean ACT 8.65 s over the 41 calls.
    # Now it reserves only after waiting HEAD_PATIENCE x 100 s: the streams (20 x 1.1 s)
    # pass it, both GPUs free at ~22.9 s, then restore and run: ACT ~125.8 s (its slowdown
    # 1.26), every short call under 1.7 s, mean ACT 4.08 s, as tangram-paper (which never
    # reserves; wide_call_starves is where that starves a short wide call).
    default = acts("head_patience", "tangram")
    paper = acts("head_patience", "tangram-paper")
    wide = "s0-t00002-a000"
    assert max(v for a, v in default.items() if a != wide) < 2.0
    assert default[wide] < 1.3 * 100.0
    assert np.mean(list(default.values())) < 4.2
    assert np.mean(list(default.values())) <= np.mean(list(paper.values())) + 1e-9


def test_short_calls_backfill_beside_a_head_reservation_rather_than_wait_for_its_cells():
    # Two GPUs. At t = 0 a 100-s call (L) and a 1-s call (S0) to a 7.6B model (15.2 GB)
    # restore one copy each (0.658 s): L on GPU 0 until 100.658, S0 leaves a copy on GPU 1,
    # free from 1.658. At t = 0.1 a call W to a 72.7B model (145.4 GB: both GPUs; t1 = 20 s,
    # serial fraction 0.25: 12.5 s on two) finds no 2-GPU cell; once it has waited its run
    # (12.5 s, ``HEAD_PATIENCE``), the next pass (t = 15) reserves (0, 1) for it, ready when
    # L ends (100.658): W restores (2.958 s) and runs, done at 116.146 (ACT 116.046).
    # At t = 15, 20 and 25 three 1-s calls to the 7.6B model arrive. GPU 1 is free, holds the
    # model, and a 1-s call there is done long before W needs it (backfill). Before, ``hold``
    # counted L's busy GPU 0 as a cell the calls could wait for, though it is reserved for W
    # when it frees: each waited "~85 s for a cell holding m7" rather than an unplaceable
    # restore, then for W's run as well: ACT 102.8 / 97.8 / 93.8 s. Now the reserved busy
    # cell is not theirs to count on: each backfills on GPU 1 at once, ACT 1.0 s (as
    # tangram-paper, which reserves nothing); W is unchanged.
    case, wide = "backfill_beside_head", "s0-t00002-a000"
    default, paper = acts(case, "tangram"), acts(case, "tangram-paper")
    short = ("s0-t00003-a000", "s0-t00004-a000", "s0-t00005-a000")
    assert all(default[a] == pytest.approx(1.0, abs=1e-6) for a in short)
    assert default[wide] == pytest.approx(116.046, abs=1e-2)
    assert default[wide] == pytest.approx(paper[wide], abs=1e-6)


def test_a_call_backfills_on_a_reserved_gpu_holding_its_model_without_a_restore():
    # Two GPUs, as ``backfill_beside_head``: a 100-s call L and a 1-s call to a 7.6B model
    # (15.2 GB) restore a copy each (0.658 s): L holds GPU 0 until 100.658, GPU 1 keeps a
    # copy. A 72.7B call W (both GPUs, 12.5 s) reserves (0, 1) once it has waited its run,
    # ready when L ends: it restores (2.958 s) and runs, done at 116.146 (ACT 116.046). At
    # t = 99.3 a 1-s call B of the 7.6B model: GPU 1 is free and holds the model, and B there
    # is done at 100.3, before W needs it (100.658). Before, the backfill test added a
    # restore on every cell (100.958 > 100.658): B was kept off GPU 1, found no other cell,
    # and restored after W's run, ACT 116.146 + 0.658 + 0.01 (an eviction) + 1 - 99.3 =
    # 18.514 s. Now the restore counts only on a cell that does not hold the model: B
    # backfills on GPU 1, ACT 1.0 s (as tangram-paper, which reserves nothing); W unchanged.
    case, wide, late = "backfill_on_resident_copy", "s0-t00002-a000", "s0-t00003-a000"
    default, paper = acts(case, "tangram"), acts(case, "tangram-paper")
    assert default[late] == pytest.approx(1.0, abs=1e-6)
    assert paper[late] == pytest.approx(1.0, abs=1e-6)
    assert default[wide] == pytest.approx(116.046, abs=1e-2)
    assert default[wide] == pytest.approx(paper[wide], abs=1e-6)


def test_a_call_waits_for_a_copy_of_its_width_not_a_free_copy_of_another():
    # Eight GPUs, a 32.8B model (65.6 GB; restore 65.6 / 25 + 0.05 = 2.674 s on one GPU,
    # 65.6 / 100 + 0.05 = 0.706 s on four). At t = 0 call A (t1 = 4 s, serial fraction 0.25,
    # up to 4 GPUs: 1.75 s on four) restores a 4-GPU sharded copy on (0-3), done at 2.456,
    # which drops the warm 1-GPU copy on GPU 0; at t = 0.01 call C (0.5 s, one GPU) restores
    # a 1-GPU copy on GPU 4, done at 3.184. (Arriving with A, C would claim the warm copy, and
    # A's restore now goes elsewhere: ``claimed_copy_kept``.) At t = 2.8 call B (1 s, one GPU)
    # arrives: the free 4-GPU copy cannot serve a 1-GPU call (a sharded copy serves its own
    # cell), C's copy frees in 0.384 s. Before, ``hold`` matched B to the free 4-GPU copy
    # (any width up to the copy's), so B neither waited for C's copy nor weighed a restore
    # against it; priced as a restore by the round, it restored one on GPU 5: ACT 2.674 + 1
    # = 3.674 s (as tangram-paper). Now B waits 0.384 s for GPU 4 and runs there: 1.384 s.
    default, paper = acts("copy_width", "tangram"), acts("copy_width", "tangram-paper")
    call, first = "s0-t00002-a000", "s0-t00000-a000"
    assert paper[call] == pytest.approx(3.674, abs=1e-3)
    assert default[call] == pytest.approx(1.384, abs=1e-3)
    assert default[first] == pytest.approx(paper[first])


def test_a_copy_a_call_claimed_is_not_placed_over_by_another_call_of_the_pass():
    # Four GPUs, a 7.6B model (15.2 GB) warm on GPU 0 (one 1-GPU copy). At t = 0 call B
    # (t1 = 4 s, serial fraction 0.25, up to 2 GPUs: 2.5 s on two) and call A (0.5 s, one
    # GPU). ``hold``, in arrival order: B on the free copy would be done at 4 s; a 2-GPU
    # restore (15.2 / 50 + 0.05 = 0.354 s) and 2.5 s end it at 2.854 s, so B restores; A
    # claims the free copy and the round prices it free there. Placement goes widest first:
    # B's restore charges nothing on (0, 1) or (2, 3) (the copy on GPU 0 is its own service's,
    # of another shape), and took (0, 1), which drops that copy: A, priced free, restored a
    # 1-GPU copy on GPU 2, ACT 0.658 + 0.5 = 1.158 s (as tangram-paper). Now the claimed copy
    # is kept out of the other calls' placement: B restores on (2, 3), A runs on GPU 0: 0.5 s.
    case, a, b = "claimed_copy_kept", "s0-t00001-a000", "s0-t00000-a000"
    default, paper = acts(case, "tangram"), acts(case, "tangram-paper")
    assert paper[a] == pytest.approx(1.158, abs=1e-3)
    assert default[a] == pytest.approx(0.5, abs=1e-6)
    assert default[b] == pytest.approx(2.854, abs=1e-3)
    assert paper[b] == pytest.approx(default[b], abs=1e-6)


def test_an_overloaded_pass_weighs_the_restore_it_can_do_now():
    # Two GPUs: a 32.8B model "big" (65.6 GB) warm on GPU 0, a 7.6B "small" (15.2 GB) on
    # GPU 1; the two do not fit on one 80-GB GPU. At t = 0 call A (big, 2 s, one GPU) takes
    # GPU 0 and a 0.3-s small call GPU 1. At 0.1 call B (big, t1 = 1 s, serial fraction
    # 0.25, up to 2 GPUs) arrives, at 0.2 ten 0.3-s small calls: 11 queued on 2 GPUs, more
    # than ``OVERLOADED`` (4) per GPU, so the pass is the paper's. At 0.3 GPU 1 frees and B
    # heads the queue; its copy (GPU 0) frees in 1.7 s. Before, the wait was compared with
    # the restore at B's widest size (2 GPUs: 65.6 / 50 + 0.05 = 1.362 s), though only a
    # 1-GPU cell is free: B restored there (2.674 s) over small's only copy, ACT 3.884 s, and
    # the small calls waited for GPU 0 (free at 2.0) to restore their model: mean ACT 3.60 s
    # (as tangram-paper, whose rule this stays). Now the restore it can do now is the 1-GPU
    # one (2.674 s > 1.7 s): B waits and runs on GPU 0 at 2.0 (ACT 2.9 s), the small calls
    # run back to back on GPU 1 (ACT 0.4 ... 3.1 s): mean ACT 1.75 s.
    case, b = "overloaded_restore_size", "s0-t00001-a000"
    default, paper = acts(case, "tangram"), acts(case, "tangram-paper")
    assert paper[b] == pytest.approx(3.884, abs=1e-3)
    assert default[b] == pytest.approx(2.9, abs=1e-3)
    assert np.mean(list(default.values())) == pytest.approx(22.7 / 13, abs=1e-3)
    assert np.mean(list(paper.values())) > 3.5


def test_a_busy_services_copies_grow_with_its_load():
    # One 8-GPU node; a 32.8-GB model warm on one GPU; t1 = 0.6 s, serial fraction 0.25:
    # d(4) = 0.6 x (0.25 + 0.75/4) = 0.2625 s; a restore onto 4 GPUs 32.8 / 100 + 0.05 =
    # 0.378 s. Trajectory 0 sends twelve calls 0.1 s apart from t = 0, trajectory 1 the same
    # from t = 2. The first call restores a 4-GPU copy (amortised over the expected calls);
    # at t = 2.191 that copy is busy until 2.353 (wait and run: 0.424 s).
    # Before: another copy was amortised over the calls queued behind only (one restore for
    # one call: 0.378 + 0.2625 = 0.64 s > 0.424), so the two streams took turns on one copy,
    # each call waiting ~0.16 s: mean ACT 0.377 s. Now, with room in the pool's memory, a
    # further copy shares the calls expected (2.6 here, with the copy that exists): 0.378 /
    # 2.6 + 0.2625 = 0.408 s < 0.424: a second copy, then each stream has its own: mean ACT
    # 0.298 s, as fixed:4 (0.294). tangram-paper (one restore against one call) 0.405 s.
    default = np.mean(list(acts("copies_grow_with_load", "tangram").values()))
    paper = np.mean(list(acts("copies_grow_with_load", "tangram-paper").values()))
    fixed4 = np.mean(list(acts("copies_grow_with_load", "fixed:4").values()))
    assert restores("copies_grow_with_load", "tangram") == 2
    assert default <= 1.02 * fixed4
    assert paper > 1.3 * default


def test_a_long_call_on_one_gpu_does_not_make_the_pool_look_busy_until_it_ends():
    # Four GPUs, a 7.6B model (15.2 GB) warm on GPU 0. At t = 0 a 400-s call takes GPU 0 and
    # two 2-s calls restore onto GPUs 1 and 2 (0.658 s: busy until 2.658). At t = 0.5 a call
    # of t1 = 100 s, serial fraction 0.4, up to 4 GPUs, finds GPU 3 free: now, restore and
    # run 0.658 + 100 = 100.658 s; on the 2-GPU cell (2, 3), free at 2.658: wait 2.158,
    # restore 0.354, run 100 x (0.4 + 0.6/2) = 70 s: ACT 72.512 s, 28.1 s sooner.
    # What the wait costs the others: the 40.05 GPU-s it takes beyond a start now
    # (2 x 70.354 - 100.658), counted while calls wait. Before, "while calls wait" ran to the
    # last running call's end plus the queued work over the pool (400 + 100/4): busy the
    # whole run, 40.05 + 2.158 idle > 28.1, so it ran 100.658 s on one GPU, as tangram-paper
    # does. Now the queued work (100 GPU-s) is poured onto the GPUs as each frees (GPU 3 at
    # 0.5, GPUs 1-2 at 2.658, GPU 0 at 400): placed by 2.658 + 97.842 / 3 = 35.27 s, so the
    # 40.05 GPU-s count for (35.27 - 2.658) / 70.354 = 46% of them: 18.6 + 2.158 < 28.1.
    paper = acts("long_call_not_a_busy_pool", "tangram-paper")
    default = acts("long_call_not_a_busy_pool", "tangram")
    long = "s0-t00003-a000"
    assert paper[long] == pytest.approx(100.658, abs=1e-3)
    assert default[long] == pytest.approx(72.512, abs=1e-3)
    assert all(default[a] == pytest.approx(paper[a]) for a in paper if a != long)


def step_s(case: str, policy: str) -> float:
    trace = load_trace(CASES / f"{case}.jsonl")
    cluster = load_cluster(CASES / f"{case}.toml")
    result = simulate(trace, cluster, SimConfig(policy=policy, timeline=False))
    return float(np.mean([s.end - s.start for s in result.steps if s.end is not None]))


def test_a_call_that_outlasts_the_others_sees_the_cells_they_free():
    # Eight GPUs, a 7.6B model (15.2 GB) warm on GPU 0. At t = 0 one call of t1 = 100 s,
    # serial fraction 0.25, up to 4 GPUs (62.5 s on two, 43.75 s on four), and six 1-s
    # one-GPU calls. The round gives the long call 2 GPUs, the short ones one each (a 4-GPU
    # cell would take two of theirs: one deferral at a time never frees it). Placed in its
    # turn (largest cell first) the long call saw nothing running, so no larger cell to wait
    # for, and ran 62.5 s plus its 0.354-s restore: done at 62.85 s (tangram-paper too).
    # Placed after the short calls, its cell kept for it meanwhile, it sees their cells free
    # at 1.658 s (0.658-s restore + 1 s) and waits for a 4-GPU one: (4-7), since a restore
    # onto (0-3) would drop the warm 1-GPU copy on GPU 0 (``own_drop``); the short calls'
    # copies on 4-7 then serve it with no restore: 1.658 + 43.75 = 45.408 s (on (0-3), with
    # its 0.202-s restore, 45.61 s), 1.5 s behind fixed:16. The short calls restore and run (1.658 s, as
    # under tangram-paper) but the first, which claimed the warm copy on GPU 0: the long
    # call's cell is kept clear of it, and it runs there at once (1.0 s; ``claimed_copy_kept``).
    case, long, first = "long_call_placed_last", "s0-t00000-a000", "s0-t00001-a000"
    default, paper, fixed16 = (acts(case, p) for p in ("tangram", "tangram-paper", "fixed:16"))
    assert paper[long] == pytest.approx(62.854, abs=1e-3)
    assert default[long] == pytest.approx(45.408, abs=1e-3)
    assert default[long] <= 1.05 * fixed16[long]
    assert default[first] == pytest.approx(1.0, abs=1e-6)
    assert paper[first] == pytest.approx(1.658, abs=1e-3)
    assert all(default[a] == pytest.approx(paper[a]) for a in default if a not in (long, first))


@pytest.mark.xfail(
    strict=True,
    reason="open (issue 11): a long call's width is fixed at start, and at t = 0 nothing "
    "seen says four short trajectories follow; going wide loses mean ACT to sglang-sized, "
    "staying narrow loses the step to fixed:16 (see the comment)",
)
def test_long_calls_do_not_take_the_pool_from_the_short_calls_that_follow():
    # Four GPUs, a 7.6B model (15.2 GB) warm on GPU 0; restore onto a 2-GPU cell 0.354 s.
    # At t = 0 two calls of t1 = 40 s, serial fraction 0.25, up to 2 GPUs (25 s on two);
    # at t = 0.1 four trajectories of ten 0.5-s one-GPU calls, 0.5 s apart (10 s each).
    # Default (as tangram-paper and fixed:16): the round sees only the two long calls, each
    # takes a 2-GPU cell (uncontended): done at 25.354; the four first short calls wait
    # until then (ACT 25.754), the rest run at once: mean (2 x 25.354 + 4 x 25.754 +
    # 36 x 0.5) / 42 = 4.089 s, step 25.354 + 0.5 + 9 x 1.0 = 34.854 s.
    # sglang-sized: four 1-GPU replicas; the long calls run 40 s on one each, the short
    # ones share the other two: mean 2.405 s (+70% for the default), step 40.0 s.
    # A schedule that wins both lets the long calls wait for the short trajectories (done by
    # 9.6 s) and then take 2-GPU cells: mean ~2.2 s, step ~35 s; narrow starts (fixed:1) give
    # mean 2.483 s but step 40.658 s (fixed:16 beats that by 17%). What the rule sees at
    # t = 0 (two calls, four free GPUs) does not tell the two cases apart.
    case = "long_calls_take_the_pool"
    default = np.mean(list(acts(case, "tangram").values()))
    sized = np.mean(list(acts(case, "sglang-sized").values()))
    assert default <= 1.05 * sized
    assert step_s(case, "tangram") <= 1.05 * step_s(case, "fixed:16")


def test_a_call_waits_for_its_copy_inside_a_reserved_cell_when_done_before_it_is_needed():
    # Four 80-GB GPUs, warm: a 120-GB model "m60" on (0, 1), a 32.8B "m32" (65.6 GB) on
    # GPU 2, a 7.6B "m7" (15.2 GB) on GPU 3. At t = 0 a 6-s m32 call A runs on GPU 2, a 50-s
    # m7 call on GPU 3, a 100-s m7 call restores m7 on GPU 0 (beside m60's shard). At 0.1 a
    # 2-GPU m60 call W (2 s) finds no free pair; at t = 3 (a 0.1-s m7 call restores on
    # GPU 1) it has waited its run and reserves (2, 3), ready when the 50-s call ends.
    # At t = 5 call B (m32, 1 s) arrives. Its copy, GPU 2, frees at 6 and is in W's cell:
    # run there, B is done at 7, long before W needs it (backfill). Before, ``hold`` left a
    # busy reserved cell out of the copies a call may wait for, so B restored m32 on GPU 1
    # (2.674 s; evicting m60's shard and m7, charged 4.242 s): ACT 3.694 s. Now B waits
    # 1 s and runs on its copy: ACT 2.0 s. tangram-paper waits for a copy outside any
    # reservation: until 50, then restores: 48.694 s. The others are unchanged.
    case, b = "wait_on_reserved_copy", "s0-t00005-a000"
    default, paper = acts(case, "tangram"), acts(case, "tangram-paper")
    assert default[b] == pytest.approx(2.0, abs=1e-6)
    assert paper[b] == pytest.approx(48.694, abs=1e-3)
    assert all(default[a] == pytest.approx(paper[a]) for a in default if a != b)


def test_a_reservation_made_mid_pass_moves_the_deadlines_of_the_copies_queued_on():
    # Four 80-GB GPUs; warm: a 32.8B "m32" (65.6 GB) on GPU 2, a 7.6B "m7" on GPU 3 (the
    # 72.7B "m72", 145.4 GB, restores where it runs). At t = 0 a 4-s m32 call A runs on GPU 2, a 6-s
    # m7 call on GPU 3, and a 2.5-s and a 100-s call of a third model restore on GPUs 0 and
    # 1 (0.668 s). At 0.05 a 0.5-s m32 call B0 finds no free GPU; at 0.1 a 2-GPU m72 call W
    # (2 s) finds no free pair; at 2.4 a 3-s m32 call B2. At 3.168 GPU 0 frees and one pass
    # runs B0, W, B2 in that order: B0 queues on A's copy (free at 4, done 4.5); W, patient,
    # reserves (2, 3), ready at 6; B2 weighs its copy after B0 (4.5 + 3 = 7.5) against a
    # restore on GPU 0 (2.674 + 3 s, evictions charged). Before, B2 read its copy's cell as
    # the pass had found it before W's reservation (no deadline), waited "~1.332 s", could
    # not run there (done after 6), and restored on GPU 0 only at 4.0: ACT 7.284 s (as
    # tangram-paper). Now the reservation moves the deadlines of the copies the pass queued
    # on: B2 restores at 3.168, ACT 6.452 s; B0 and W unchanged.
    case, b2 = "reserved_mid_pass", "s0-t00006-a000"
    default, paper = acts(case, "tangram"), acts(case, "tangram-paper")
    assert default[b2] == pytest.approx(6.452, abs=1e-3)
    assert paper[b2] == pytest.approx(7.284, abs=1e-3)
    assert all(default[a] == pytest.approx(paper[a]) for a in default if a != b2)


def test_a_reservation_is_charged_the_restore_it_forces_on_a_queued_copy():
    # Eight 80-GB GPUs; warm: a 32.8B "q" (65.6 GB) on GPU 0, a 7.6B "m7" on GPU 1 and a
    # 7.6B "w" on GPU 2. At t = 0 a 4-s q call runs on GPU 0 and six 1-GPU m7 calls run on
    # GPU 1 (3.5 s), GPUs 3-4 (3.5 s) and 5-7 (3.8 s), the five restoring m7 first (0.658 s):
    # cell (0-3) is free at 4.158, cell (4-7) at 4.458.
    # At 3.0 a 0.5-s q call Q waits for q's copy (free at 4.0) rather than a 2.674-s restore,
    # and a w call W (4 s on 1 GPU, perfectly parallel, up to 4) could start on GPU 2 now
    # (done at 7.0). Before, W reserved cell (0-3) (4.158 + 0.202 restore + 1.0 = 5.36, ACT
    # 2.36): Q lost GPU 0 to the reservation and restored q on GPU 4 at 4.158 (ACT 4.342).
    # Now holding (0-3) is also charged q's restore (Q queued, no other copy: 2.674 s),
    # which W's saving (7.0 - 5.36 = 1.64 s) does not pay; cell (4-7) displaces no queued
    # call: W reserves it (done 5.66, ACT 2.66) and Q runs on its copy at 4.0 (ACT 1.5).
    # tangram-paper never waits: W runs 4.0 s on GPU 2, Q 1.5 s.
    case, q, w = "reservation_displaces_queued_copy", "s0-t00007-a000", "s0-t00008-a000"
    default, paper = acts(case, "tangram"), acts(case, "tangram-paper")
    assert default[q] == pytest.approx(1.5, abs=1e-6)
    assert default[w] == pytest.approx(2.66, abs=1e-3)
    assert paper[q] == pytest.approx(1.5, abs=1e-6)
    assert paper[w] == pytest.approx(4.0, abs=1e-6)
    assert all(default[a] == pytest.approx(paper[a]) for a in default if a != w)


def test_a_restore_that_drops_the_services_narrower_copy_is_charged_for_its_calls():
    # Four 80-GB GPUs; warm: a 7.6B "m" (15.2 GB) on GPU 0. Three 0.5-s 1-GPU calls at 0,
    # 0.6 and 1.2 run on that copy. At 2.0 a call A that may take 4 GPUs (1 s on 1, serial
    # half: 0.625 s on 4) arrives, and three 0.5-s 1-GPU calls at 2.05. Before, A restored m
    # as 4-GPU shards (15.2 / 100 + 0.05 = 0.202 s; ACT 0.827), which drops the whole copy on
    # GPU 0: the three narrow calls waited for A and then restored (0.658 s): ACT 1.935 s each.
    # Now the restore is also charged the copy it drops for the calls that cannot run on 4
    # GPUs: 3 of the 4 seen x the 0.658-s restore, no other 1-GPU copy left (~0.49 s), so A
    # runs on its copy (1.0 s) and the narrow calls restore at once on GPUs 1-3 (1.158 s).
    # Mean ACT 1.162 -> 0.853 s. tangram-paper restores as before.
    case, a = "widening_drops_own_copy", "s0-t00003-a000"
    narrow = ("s0-t00004-a000", "s0-t00005-a000", "s0-t00006-a000")
    default, paper = acts(case, "tangram"), acts(case, "tangram-paper")
    assert default[a] == pytest.approx(1.0, abs=1e-6)
    assert paper[a] == pytest.approx(0.827, abs=1e-3)
    assert all(default[n] == pytest.approx(1.158, abs=1e-3) for n in narrow)
    assert all(paper[n] == pytest.approx(1.935, abs=1e-3) for n in narrow)
    assert np.mean(list(default.values())) < 0.75 * np.mean(list(paper.values()))
