"""The ``random`` workload: seeded instances (trace + cluster) whose families have their shape."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

from tangram.cli import main
from tangram.core.cells import smallest_cell_for
from tangram.core.cluster_file import load_cluster
from tangram.sim.instances import cluster_toml, trace_cluster, write_instance
from tangram.sim.workloads import WORKLOADS, generate
from tangram.sim.workloads.random_instances import (
    CORE_CHOICES,
    FAMILIES,
    TRAJECTORIES,
    RandomParams,
    instance_batch,
    random_instance,
)
from tangram.trace import load_trace

SEEDS = range(30)


def instances(family: str):
    return [random_instance(RandomParams(family=family), seed=s) for s in SEEDS]


@pytest.mark.parametrize("family", FAMILIES)
def test_the_same_seed_gives_the_same_instance_and_another_seed_another(family):
    a, ca = random_instance(RandomParams(family=family), seed=11)
    b, cb = random_instance(RandomParams(family=family), seed=11)
    assert a == b and ca == cb
    c, _ = random_instance(RandomParams(family=family), seed=12)
    assert a.rows != c.rows


def test_families_draw_unrelated_instances_from_one_seed():
    traces = [random_instance(RandomParams(family=f), seed=5)[0] for f in FAMILIES]
    assert len({len(t) for t in traces} | {t.meta["trajectories"] for t in traces}) > 1


def test_batch_is_the_trajectories_per_step_and_instances_draw_it_from_2_to_40():
    trace = generate("random", batch=7, steps=2, seed=3)
    assert len(trace.trajectories()) == 14 and trace.steps() == [0, 1]
    batches = [instance_batch("cpu", s) for s in range(200)]
    assert min(batches) >= TRAJECTORIES[0] and max(batches) <= TRAJECTORIES[1]
    assert len(set(batches)) > 20  # spread over the range, not one value


def test_the_cli_default_batch_replays_the_benchmarks_instance():
    """`tangram sim --workload random --seed S` (no --batch) is the benchmark's instance S."""
    for family in FAMILIES:
        for seed in (101, 146):
            bench, _ = random_instance(RandomParams(family=family), seed=seed)
            cli = generate("random", seed=seed, family=family)
            assert cli.meta["trajectories"] == instance_batch(family, seed)
            assert cli.rows == bench.rows


def test_cpu_instances_have_one_or_two_nodes_of_4_to_64_cores_and_heavy_mixed_tails():
    sigmas, synced, long_mix = [], [], 0
    for trace, cluster in instances("cpu"):
        assert 1 <= len(cluster.cpu_nodes) <= 2 and not cluster.gpu_nodes and not cluster.apis
        assert all(n.cores in CORE_CHOICES and 4 <= n.cores <= 64 for n in cluster.cpu_nodes)
        assert {r.resource for r in trace.rows} == {"cpu"}
        assert 2 <= trace.meta["trajectories"] <= 40
        sigmas.append(trace.meta["sigma"])
        synced.append(trace.meta["synced"])
        kinds = {r.kind for r in trace.rows}
        long_mix += kinds == {"long", "short"}
        if trace.meta["synced"]:  # every first action arrives at the step's start
            assert all(r.gen_before_s == 0 for r in trace.rows if r.position == 0)
        else:
            assert all(r.gen_before_s > 0 for r in trace.rows)
    assert max(sigmas) > 1.5 and min(sigmas) < 0.5  # log-normal sigma drawn up to 2
    assert 0.2 < np.mean(synced) < 0.8  # about half the instances synchronised
    assert long_mix >= 10  # long and short actions in the same instance


def test_gpu_instances_hold_several_services_of_several_sizes_some_above_one_gpu():
    above_one_gpu = skewed = 0
    for trace, cluster in instances("gpu"):
        assert 1 <= len(cluster.gpu_nodes) <= 2 and not cluster.cpu_nodes
        assert all(n.gpus in (2, 4, 8) for n in cluster.gpu_nodes)
        services = {r.service: r.service_size_gb for r in trace.rows}
        assert {r.resource for r in trace.rows} == {"gpu"}
        for r in trace.rows:  # max_units never below the smallest cell that holds the model
            assert r.max_units >= smallest_cell_for(r.service_size_gb, 80.0, 8)
        above_one_gpu += any(size > 80 for size in services.values())
        calls = np.array(sorted(_counts(trace).values(), reverse=True))
        skewed += len(calls) > 1 and calls[0] >= 3 * calls[-1]
    assert above_one_gpu >= 10 and skewed >= 5


def _counts(trace) -> dict[str, int]:
    out: dict[str, int] = {}
    for r in trace.rows:
        out[r.service] = out.get(r.service, 0) + 1
    return out


def test_mixed_instances_mix_cpu_gpu_and_api_actions_on_a_cluster_with_all_three():
    both = 0
    for trace, cluster in instances("mixed"):
        assert (
            cluster.cpu_nodes and cluster.gpu_nodes and [a.name for a in cluster.apis] == ["search"]
        )
        resources = {r.resource for r in trace.rows}
        both += resources == {"cpu", "gpu", "api"}
        assert all(r.service == "search" for r in trace.rows if r.resource == "api")
    assert both >= 20


def test_an_unknown_family_is_an_error_naming_the_parameter():
    with pytest.raises(ValueError, match="family"):
        WORKLOADS["random"].params_with(family="tpu")


def test_the_cluster_travels_in_the_trace_and_round_trips_through_files(tmp_path):
    trace, cluster = random_instance(RandomParams(family="mixed"), seed=4)
    paths = write_instance(trace, cluster, tmp_path, "inst")
    back = load_trace(paths["trace"])
    assert back == trace and trace_cluster(back) == cluster
    assert load_cluster(paths["cluster"]) == cluster
    assert cluster_toml(load_cluster(paths["cluster"])) == cluster_toml(cluster)


def test_tangram_sim_runs_a_random_instance_on_its_own_cluster(capsys):
    assert main(["sim", "--workload", "random", "--seed", "3", "--batch", "6", "--json",
                 "--set", "family=gpu", "--policy", "tangram"]) == 0  # fmt: skip
    doc = json.loads(capsys.readouterr().out)
    assert doc["cluster"] == "random-gpu-3"
    assert doc["results"][0]["actions"] == len(generate("random", batch=6, seed=3, family="gpu"))


def test_tangram_sim_cluster_flag_still_wins_over_the_traces_cluster(capsys, tmp_path: Path):
    assert main(["sim", "--workload", "random", "--batch", "4", "--cluster", "paper",
                 "--policy", "tangram", "--json"]) == 0  # fmt: skip
    assert json.loads(capsys.readouterr().out)["cluster"] == "paper"
    assert main(["sim", "--policy", "tangram", "--json"]) == 0  # bundled trace: paper as before
    assert json.loads(capsys.readouterr().out)["cluster"] == "paper"


def test_bench_sim_runs_a_random_instance_on_its_own_cluster():
    """``tangram bench sim --workload random`` ran the instance on the paper cluster, not the
    cluster the instance carries (which ``tangram sim`` uses), so its rate was of another
    problem; it runs on the instance's cluster and names it."""
    from tangram.sim.bench import run_bench
    from tangram.sim.config import SimConfig
    from tangram.sim.driver import simulate
    from tangram.sim.instances import trace_cluster
    from tangram.sim.workloads import generate

    row = run_bench(workload="random", batch=4, repeats=1, seed=3)
    trace = generate("random", batch=4, steps=1, seed=3)
    own = trace_cluster(trace)
    assert own is not None and own.name != "paper"
    assert row["cluster"] == own.name
    expected = simulate(trace, own, SimConfig(policy="tangram", seed=3)).makespan
    assert row["simulated_s"] == pytest.approx(expected)
    assert run_bench(workload="coding", batch=4, repeats=1)["cluster"] == "paper"
