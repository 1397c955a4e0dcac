"""k8s-burstable: pods admitted by CPU requests, sharing idle cycles as CFS does (fluid, with a
serial phase on one thread and a parallel phase on the job's threads)."""

import pytest
from hypothesis import given
from hypothesis import strategies as st

from tangram.core import ClusterSpec, CpuNodeSpec
from tangram.sim.cfs import Job, water_fill
from tangram.sim.config import Overheads, SimConfig
from tangram.sim.driver import Simulation
from tangram.sim.metrics import actions_frame, summary
from tangram.sim.workloads import generate
from tangram.trace import Trace, TraceRow

jobs = st.lists(
    st.builds(
        Job,
        work=st.floats(0.01, 100),
        threads=st.floats(0.1, 64),
        weight=st.sampled_from([1.0, 2.0, 4.0]),
        serial=st.sampled_from([0.0, 0.5]),
    ),
    min_size=1,
    max_size=12,
)


@given(jobs, st.integers(1, 64))
def test_the_split_never_exceeds_the_node_or_a_jobs_cap_and_wastes_nothing(js, cores):
    water_fill(js, cores)
    total = sum(j.cores for j in js)
    assert total <= cores + 1e-9
    assert all(-1e-12 <= j.cores <= j.cap + 1e-9 for j in js)
    if total < cores - 1e-9:  # cores left idle only when every job is at its cap
        assert all(j.cores == pytest.approx(j.cap) for j in js)
    # Weighted fairness: a job below its cap has the highest share per weight.
    below = [j.cores / j.weight for j in js if j.cores < j.cap - 1e-9]
    if below:
        assert max(below) - min(below) < 1e-9
        assert all(j.cores / j.weight <= max(below) + 1e-9 for j in js)


ONE_NODE = ClusterSpec("eight", cpu_nodes=(CpuNodeSpec("n", 8, 1, 64.0),))


def cpu_row(traj: str, gen: float, t1: float = 8.0, s: float = 0.0) -> TraceRow:
    return TraceRow(
        action_id=f"{traj}-a0",
        trajectory=traj,
        step=0,
        position=0,
        task="t",
        kind="env",
        gen_before_s=gen,
        resource="cpu",
        t1_s=t1,
        max_units=8,
        serial_fraction=s,
        memory_gb=1.0,
    )


def run(rows, policy: str, **ov):
    overheads = Overheads(aoe_grant_s=0.0, container_start_s=0.0, pod_start_s=0.0, **ov)
    sim = Simulation(
        Trace(tuple(rows), {}), ONE_NODE, SimConfig(policy=policy, overheads=overheads)
    )
    result = sim.run()
    return sim, actions_frame(result).set_index("action_id")


def test_a_lone_busy_pod_runs_on_the_idle_cores_beyond_its_requests():
    # 8 s of perfectly parallel work, 8 threads, pods requesting 2 cores each.
    rows = [cpu_row("A", 1.0), cpu_row("B", 100.0)]
    _, burst = run(rows, "k8s-burstable:2")
    _, static = run(rows, "k8s-static:2")
    assert burst.loc["A-a0", "exec_s"] == pytest.approx(1.0)  # all 8 cores: B's pod is idle
    assert static.loc["A-a0", "exec_s"] == pytest.approx(4.0)  # confined to its 2 cores


def test_busy_pods_share_the_node_by_their_requests():
    # A and B both start at 1 and get 4 cores each (equal requests): 2 s each.
    sim, acts = run([cpu_row("A", 1.0), cpu_row("B", 1.0)], "k8s-burstable:2")
    assert list(acts["exec_s"]) == pytest.approx([2.0, 2.0])
    assert list(acts["units"]) == pytest.approx([4.0, 4.0])
    assert sim._shared["n"].peak == pytest.approx(8.0)


def test_a_job_speeds_up_when_its_neighbour_ends():
    # B (1 s of work at 8 threads) starts with A; both get 4 cores: B ends at 1 + 0.25 = 1.25,
    # having done 1 core-s; A has done 1 of 8 core-s and finishes the other 7 on 8 cores at
    # 1.25 + 7/8 = 2.125.
    _, acts = run([cpu_row("A", 1.0), cpu_row("B", 1.0, t1=1.0)], "k8s-burstable:2")
    assert acts.loc["B-a0", "finish"] == pytest.approx(1.25)
    assert acts.loc["A-a0", "finish"] == pytest.approx(2.125)


def test_an_amdahl_action_alone_takes_its_curves_time_at_its_thread_count():
    # s = 0.5 on 8 threads: T(8) = 8 * (0.5 + 0.5 / 8) = 4.5 s.
    _, acts = run([cpu_row("A", 1.0, s=0.5)], "k8s-burstable:2")
    assert acts.loc["A-a0", "exec_s"] == pytest.approx(4.5)


def test_a_squeezed_job_slows_in_its_parallel_phase_not_below_its_serial_time():
    # A: 8 core-s, s = 0.5 on 8 threads; B: 80 core-s, perfectly parallel; equal requests.
    # A's serial phase (4 core-s) runs on one core (B gets the other 7): 4 s; its parallel
    # phase (4 core-s) gets half the node, 4 cores: 1 s. A takes 5 s, not its 4.5 s alone:
    # a job's mean parallelism (1.78 cores) is not a share it can keep busy while squeezed.
    _, acts = run([cpu_row("A", 1.0, s=0.5), cpu_row("B", 1.0, t1=80.0)], "k8s-burstable:4")
    assert acts.loc["A-a0", "exec_s"] == pytest.approx(5.0)
    # B: 7 cores for 4 s (28 core-s), 4 cores for 1 s (4), then alone on 8: 48 / 8 = 6 s.
    assert acts.loc["B-a0", "exec_s"] == pytest.approx(11.0)


def test_the_node_is_never_oversubscribed_and_work_is_conserved_on_a_real_workload():
    trace = generate("coding", batch=64, seed=2)
    cluster = ClusterSpec(
        "small", cpu_nodes=(CpuNodeSpec("a", 64, 2, 512.0), CpuNodeSpec("b", 64, 2, 512.0))
    )
    sim = Simulation(
        trace,
        cluster,
        SimConfig(policy="k8s-burstable:4", overheads=Overheads(exec_noise_sigma=0.3)),
    )
    result = sim.run()
    assert all(node.peak <= 64 + 1e-6 for node in sim._shared.values())
    acts = actions_frame(result)
    assert set(acts["outcome"]) == {"result"}
    # Busy core-seconds are the work: the trace's one-core times x the seeded noise.
    noise_free = Simulation(trace, cluster, SimConfig(policy="k8s-burstable:4")).run()
    assert summary(noise_free)["busy_core_s"] == pytest.approx(sum(r.t1_s for r in trace.rows))


def test_the_live_runtime_refuses_a_policy_that_shares_cpu_as_cfs():
    from tangram.exec.runtime.config import RuntimeConfig

    with pytest.raises(ValueError, match="CFS"):
        RuntimeConfig(policy="k8s-burstable:2")
