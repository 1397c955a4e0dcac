"""``tangram sim`` as a researcher steers it: ``--set`` any workload or simulator parameter,
``--gpus`` / ``--cpu-nodes`` to resize a cluster, rejected actions counted and explained, a
clear end when every action is rejected, the default policy compared with each other policy in
words, and a default table that fits 100 columns (``--wide``: every figure)."""

from __future__ import annotations

import dataclasses
import enum
import json
import math
import typing

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from tangram.cli import build_parser, main
from tangram.core import load_cluster
from tangram.sim.cli import TABLE_COLUMNS, configure
from tangram.sim.cluster_size import gpu_node_sizes, resize
from tangram.sim.compare import FIGURES, closing_lines, default_index, phrase
from tangram.sim.config import Overheads, RolloutConfig
from tangram.sim.overrides import OverrideError, Setting, build, coerce
from tangram.sim.workloads import WORKLOADS
from tangram.trace import Trace, write_trace
from tests.trace.rows import row


def sim(capsys, *args: str) -> tuple[int, str, str]:
    """Run ``tangram sim ARGS --quiet`` in-process: (exit code, stdout, stderr)."""
    try:
        code = main(["sim", *args, "--quiet"])
    except SystemExit as exc:  # argparse refusing an argument
        code = int(exc.code)
    out = capsys.readouterr()
    return code, out.out, out.err


def sim_json(capsys, *args: str) -> dict:
    code, out, err = sim(capsys, *args, "--json")
    assert code == 0, err
    return json.loads(out)


def parsed(*args: str):
    return build_parser().parse_args(["sim", *args])


def as_text(value) -> str:
    """A default value as a person would type it after ``--set NAME=``."""

    def plain(v):
        if dataclasses.is_dataclass(v):
            return dataclasses.asdict(v)
        return v.value if isinstance(v, enum.Enum) else str(v)

    if dataclasses.is_dataclass(value) or isinstance(value, tuple | list | dict):
        return json.dumps(value, default=plain)
    return str(value.value if isinstance(value, enum.Enum) else value)


# --- --set: any field of the workload's parameters ---------------------------------------------


@pytest.mark.parametrize("workload", sorted(WORKLOADS))
def test_every_workload_parameter_can_be_set_from_its_text(workload):
    # Derived from the dataclass's fields: a field added later is covered with no change here.
    params_type = WORKLOADS[workload].params_type
    defaults = params_type()
    for field in dataclasses.fields(params_type):
        value = getattr(defaults, field.name)
        args = parsed("--workload", workload, "--set", f"{field.name}={as_text(value)}")
        params, _ = configure(args)
        assert getattr(params, field.name) == value, field.name


@pytest.mark.parametrize("workload", sorted(WORKLOADS))
def test_list_params_names_every_settable_field_in_100_columns(capsys, workload):
    code, out, _ = sim(capsys, "--workload", workload, "--list-params")
    assert code == 0
    names = {line.split()[0] for line in out.splitlines() if line.strip()}
    groups = (WORKLOADS[workload].params_type, Overheads, RolloutConfig)
    assert {f.name for tp in groups for f in dataclasses.fields(tp)} <= names
    assert max(len(line) for line in out.splitlines()) <= 100


def test_a_set_value_reaches_the_generated_trace(capsys):
    doc = sim_json(
        capsys, "--workload", "coding", "--batch", "6", "--set", "exec_mean_s=2.5",
        "--set", "env_max_units=4", "--policy", "tangram",
    )  # fmt: skip
    params = doc["trace_meta"]["params"]
    assert params["exec_mean_s"] == 2.5 and params["env_max_units"] == 4


def test_the_last_setting_of_a_name_wins():
    args = parsed("--workload", "coding", "--set", "exec_mean_s=2", "--set", "exec_mean_s=3")
    params, _ = configure(args)
    assert params.exec_mean_s == 3.0


def test_mopd_teachers_are_set_as_a_json_array_of_objects(capsys):
    teachers = '[{"name": "small", "params_b": 7}, {"name": "big", "params_b": 70, "share": 3}]'
    doc = sim_json(
        capsys, "--workload", "mopd", "--batch", "40", "--set", f"teachers={teachers}",
        "--policy", "tangram",
    )  # fmt: skip
    names = [t["name"] for t in doc["trace_meta"]["params"]["teachers"]]
    assert names == ["small", "big"]
    assert doc["trace_meta"]["params"]["teachers"][1]["share"] == 3.0


@dataclasses.dataclass(frozen=True)
class Inner:
    k: int = 1
    label: str = "a"


@dataclasses.dataclass(frozen=True)
class P:
    """A parameter dataclass with every kind of field ``--set`` parses."""

    flag: bool = False
    limit: float | None = None
    sizes: tuple[int, ...] = (1, 2)
    pair: tuple[str, float] = ("x", 1.0)
    inner: Inner = Inner()
    mode: typing.Literal["equal", "zipf"] = "equal"


def test_booleans_optionals_and_tuples_parse_by_type():
    got = build(
        P,
        [
            Setting("flag", "yes"),
            Setting("limit", "none"),
            Setting("sizes", "4, 8,16"),
            Setting("pair", '["y", 2]'),
            Setting("inner.k", "5"),
            Setting("mode", "zipf"),
        ],
        "P",
    )
    assert got == P(True, None, (4, 8, 16), ("y", 2.0), Inner(5, "a"), "zipf")
    assert build(P, [Setting("limit", "2.5")], "P").limit == 2.5
    with pytest.raises(
        OverrideError, match=r"--set mode=uniform: expected one of \['equal', 'zipf'\]"
    ):
        build(P, [Setting("mode", "uniform")], "P")
    with pytest.raises(
        OverrideError, match=r"--set sizes=4,x \[item 1\]: expected an integer, got 'x'"
    ):
        build(P, [Setting("sizes", "4,x")], "P")


@settings(max_examples=200, deadline=None)
@given(
    st.integers(-(10**12), 10**12),
    st.floats(allow_nan=False),
    st.lists(st.floats(allow_nan=False, allow_infinity=False), max_size=5),
    st.booleans(),
)
def test_values_written_as_text_read_back_exactly(i, x, xs, b):
    assert coerce(int, str(i), "i") == i
    assert coerce(float, repr(x), "x") == x
    assert coerce(tuple[float, ...], ",".join(map(repr, xs)), "xs") == tuple(xs)
    assert coerce(tuple[float, ...], json.dumps(xs), "xs") == tuple(xs)
    assert coerce(bool, str(b).lower(), "b") is b
    assert coerce(int | None, "none", "n") is None


@pytest.mark.parametrize(
    ("setting", "named"),
    [
        ("exec_mean_z=2", "'exec_mean_z' (did you mean 'exec_mean_s'?)"),
        ("exec_mean_s=fast", "--set exec_mean_s=fast: expected a number, got 'fast'"),
        ("env_max_units=2.5", "--set env_max_units=2.5: expected an integer, got '2.5'"),
        ("exec_mean_s=-1", "--set exec_mean_s=-1: exec_mean_s"),  # refused by CodingParams
        ("overheads.container_start_s=-1", "--set overheads.container_start_s=-1"),
        ("overheads.start_s=1", "overheads has no parameter 'start_s'"),
        ("rollout.mode=sideways", "--set rollout.mode=sideways"),
    ],
)
def test_set_refuses_an_unknown_name_or_a_bad_value_naming_it(capsys, setting, named):
    code, out, err = sim(capsys, "--workload", "coding", "--batch", "4", "--set", setting)
    assert code == 2
    assert named in err and "Traceback" not in err
    assert out == ""


def test_an_unknown_name_lists_the_workloads_parameters(capsys):
    code, _, err = sim(capsys, "--workload", "mopd", "--set", "nope=1")
    assert code == 2
    for field in dataclasses.fields(WORKLOADS["mopd"].params_type):
        assert field.name in err


def test_workload_parameters_need_a_workload(capsys):
    code, _, err = sim(capsys, "--set", "exec_mean_s=2")
    assert code == 2 and "need --workload" in err


def test_set_without_an_equals_sign_is_refused(capsys):
    code, _, err = sim(capsys, "--set", "exec_mean_s")
    assert code == 2 and "expected NAME=VALUE, got 'exec_mean_s'" in err


def test_overheads_are_set_generically_and_the_old_flags_still_work():
    _, built = configure(parsed("--set", "overheads.container_start_s=2", "--grant-s", "0.01"))
    assert built["overheads"].container_start_s == 2.0
    assert built["overheads"].aoe_grant_s == 0.01
    # A --set after the old flag of the same field wins; rollout fields too.
    _, built = configure(
        parsed("--container-start-s", "3", "--set", "overheads.container_start_s=4", "--open-loop",
               "--set", "rollout.announce_step_end=false")
    )  # fmt: skip
    assert built["overheads"].container_start_s == 4.0
    assert built["rollout"].mode == "open" and built["rollout"].announce_step_end is False
    # (rollout.train_s with open loop is refused: it has no steps to train after.)
    _, built = configure(parsed("--train-s", "3", "--set", "rollout.train_s=5"))
    assert built["rollout"].train_s == 5.0


def test_a_set_overhead_changes_the_run_and_is_recorded(capsys):
    run = ("--workload", "coding", "--batch", "6", "--policy", "k8s-static")
    quick = sim_json(capsys, *run, "--set", "overheads.pod_start_s=0")
    slow = sim_json(capsys, *run, "--set", "overheads.pod_start_s=30")
    assert slow["overheads"]["pod_start_s"] == 30.0
    assert slow["settings"] == ["overheads.pod_start_s=30"]
    # A pod's first action waits for its startup (less the generation it overlaps).
    assert slow["results"][0]["overhead_mean_s"] > quick["results"][0]["overhead_mean_s"]
    assert slow["results"][0]["step_mean_s"] > quick["results"][0]["step_mean_s"] + 10


# --- --gpus / --cpu-nodes ------------------------------------------------------------------


def test_gpus_come_in_whole_nodes_and_a_remainder_in_powers_of_two():
    assert gpu_node_sizes(40, 8) == [8] * 5
    assert gpu_node_sizes(36, 8) == [8, 8, 8, 8, 4]
    assert gpu_node_sizes(7, 8) == [4, 2, 1]
    assert gpu_node_sizes(0, 8) == []
    paper = load_cluster("paper")
    small = resize(paper, gpus=36, cpu_nodes=2)
    assert small.total_gpus == 36 and [n.gpus for n in small.gpu_nodes] == [8, 8, 8, 8, 4]
    assert small.gpu_nodes[-1].host_memory_gb == paper.gpu_nodes[0].host_memory_gb / 2
    assert small.total_cores == 2 * paper.cpu_nodes[0].cores
    assert len({n.name for n in small.gpu_nodes}) == 5
    assert small.name == "paper[gpus=36,cpu_nodes=2]"
    assert resize(paper) is paper


def test_resizing_a_cluster_of_mixed_shapes_or_no_template_is_refused():
    paper = load_cluster("paper")
    mixed = resize(paper, gpus=12)  # 8 + 4: two shapes
    with pytest.raises(ValueError, match="GPU nodes of 2 shapes"):
        resize(mixed, gpus=16)
    with pytest.raises(ValueError, match="no GPU node whose shape could be copied"):
        resize(resize(paper, gpus=0), gpus=8)


def test_gpus_and_cpu_nodes_resize_the_simulated_cluster(capsys):
    doc = sim_json(
        capsys, "--workload", "mopd", "--batch", "16", "--gpus", "36", "--cpu-nodes", "1",
        "--policy", "tangram",
    )  # fmt: skip
    [row] = doc["results"]
    assert doc["cluster"] == "paper[gpus=36,cpu_nodes=1]"
    assert row["provisioned_gpu_s"] == pytest.approx(36 * row["makespan_s"])
    assert row["provisioned_core_s"] == pytest.approx(256 * row["makespan_s"])


def test_negative_sizes_are_refused(capsys):
    code, _, err = sim(capsys, "--gpus", "-8")
    assert code == 2 and "--gpus" in err and "must be >= 0" in err


# --- rejected actions --------------------------------------------------------------------


def gpu_trace(n: int = 3) -> Trace:
    """GPU actions with no generation: a step that rejects all of them lasts 0 s."""
    rows = [
        row(
            action_id=f"a{i}",
            trajectory=f"t{i}",
            kind="judge",
            gen_before_s=0.0,
            resource="gpu",
            t1_s=1.0,
            max_units=1,
            service="m",
            service_size_gb=1.0,
        )  # fmt: skip
        for i in range(n)
    ]
    return Trace(tuple(rows), {})


def test_a_run_where_every_action_is_rejected_ends_with_a_clear_message(tmp_path, capsys):
    # Before: ZeroDivisionError (step 0 s under both policies) in the closing line.
    path = write_trace(gpu_trace(), tmp_path / "gpu.jsonl")
    code, out, err = sim(capsys, "--trace", str(path), "--gpus", "0")
    assert code == 1
    assert "Traceback" not in err
    err = " ".join(err.split())
    assert "every action was rejected" in err
    assert "GPU action but the cluster has no GPU node" in err
    assert "3 of 3 actions rejected" in out
    assert "0.00x" not in out and "inf" not in out and "nan" not in out
    # With --json the document still comes (every action counted as rejected), then the message.
    code, out, err = sim(capsys, "--trace", str(path), "--gpus", "0", "--json")
    assert code == 1 and "every action was rejected" in err
    assert [(r["actions"], r["rejected"]) for r in json.loads(out)["results"]] == [(3, 3)] * 2


def test_every_rejected_action_is_counted_and_act_is_over_the_actions_that_ran(capsys):
    # Coding (CPU) and MOPD (GPU) trajectories on a cluster without GPUs.
    coding, mopd = WORKLOADS["coding"](batch=5, seed=1), WORKLOADS["mopd"](batch=4, seed=2)
    rows = list(coding.rows) + [
        dataclasses.replace(r, action_id=f"m-{r.action_id}", trajectory=f"m-{r.trajectory}")
        for r in mopd.rows
    ]
    mixed = Trace(tuple(rows), {})
    gpu_rows = sum(r.resource == "gpu" for r in rows)
    import tempfile

    with tempfile.TemporaryDirectory() as tmp:
        path = write_trace(mixed, f"{tmp}/mixed.jsonl")
        both = sim_json(capsys, "--trace", str(path), "--gpus", "0", "--out", tmp)
        import pandas as pd

        for row in both["results"]:
            assert row["actions"] == len(rows) and row["rejected"] == gpu_rows
            acts = pd.read_parquet(both["files"][row["policy"]]["actions"])
            ran = acts[acts["outcome"] == "result"]
            assert len(ran) + row["rejected"] == row["actions"]  # none left out
            assert set(ran["resource"]) == {"cpu"}
            assert row["act_mean_s"] == pytest.approx(ran["act_s"].mean())
            assert both["rejected_reasons"][row["policy"]] == {
                "GPU action but the cluster has no GPU node": gpu_rows
            }
        code, out, _ = sim(capsys, "--trace", str(path), "--gpus", "0")
    assert code == 0
    assert f"tangram: {gpu_rows} of {len(rows)} actions rejected" in out
    assert f"{gpu_rows} x GPU action but the cluster has no GPU node" in out
    assert "ACT over the actions that ran" in out


# --- the closing line ----------------------------------------------------------------------


def test_the_default_policy_is_compared_with_each_other_policy(capsys):
    code, out, _ = sim(
        capsys, "--workload", "coding", "--batch", "8", "--policy", "k8s-static",
        "--policy", "tangram", "--policy", "fixed:1",
    )  # fmt: skip
    assert code == 0
    words = " ".join(out.split("ACT over the actions that ran")[1].split())
    assert "tangram vs k8s-static: mean ACT" in words
    assert "tangram vs fixed:1: mean ACT" in words
    assert "k8s-static vs" not in words and "fixed:1 vs" not in words
    assert "0.00x" not in out and "inf" not in out


def test_the_first_policy_is_the_default_without_a_tangram_policy():
    rows = [{"policy": "k8s-static"}, {"policy": "fixed:1"}, {"policy": "tangram-x"}]
    assert default_index(rows) == 2
    assert default_index(rows[:2]) == 0


def test_ratios_with_a_zero_or_unknown_side_are_worded():
    held = next(f for f in FIGURES if f.key == "held_core_s")
    assert phrase(held, 0.0, 0.0) is None  # nothing of this kind held: not a figure to compare
    assert phrase(held, 0.0, 12.5) == "held core-s 0.000 vs 12.500"
    assert phrase(held, 12.5, 0.0) == "held core-s 12.500 vs 0.000"
    # Ours first, as in "0.000 vs 12.500": ours unknown read "(3.000 vs -)", as if ours were 3.
    assert phrase(held, float("nan"), 3.0) == "held core-s unknown for ours (- vs 3.000)"
    assert phrase(held, 3.0, float("nan")) == "held core-s unknown for theirs (3.000 vs -)"
    assert phrase(held, 2.0, 5.0) == "held core-s 2.50x fewer"
    assert phrase(held, 5.0, 2.0) == "held core-s 2.50x more"
    assert phrase(held, 5.0, 5.01) == "held core-s the same"


def test_infinite_figures_and_ratios_past_floats_range_are_worded():
    # An infinite mean ACT (a restore at 1e-307 GB/s) gave a ratio of 0: ZeroDivisionError.
    act = next(f for f in FIGURES if f.key == "act_mean_s")
    assert phrase(act, math.inf, 2.0) == "mean ACT inf vs 2.000 s"
    assert phrase(act, 2.0, math.inf) == "mean ACT 2.000 vs inf s"
    assert phrase(act, math.inf, math.inf) == "mean ACT inf vs inf s"
    assert phrase(act, 1e-300, 1e300) == "mean ACT 1e-300 vs 1e+300 s"
    assert phrase(act, 1.0, 1e300) == "mean ACT 1e+300x lower"  # not 301 digits
    assert phrase(act, 1.0, 12345.678) == "mean ACT 12345.68x lower"


def test_closing_lines_never_print_zero_or_infinite_ratios():
    base = {
        "actions": 10, "rejected": 0, "act_mean_s": 1.0, "act_p99_s": 2.0, "step_mean_s": 0.0,
        "held_core_s": 0.0, "held_gpu_s": 0.0, "cost_usd": 1.0,
    }  # fmt: skip
    rows = [
        {**base, "policy": "tangram"},
        {**base, "policy": "k8s-static", "held_core_s": 40.0, "step_mean_s": 3.0},
    ]
    text = " ".join(" ".join(closing_lines(rows)).split())
    assert "held core-s 0.000 vs 40.000" in text and "step 0.000 vs 3.000 s" in text
    assert "0.00x" not in text and "inf" not in text


def test_closing_lines_leave_out_held_figures_of_resources_the_trace_does_not_use():
    """A GPU-only trace against lower-bound (held figures unknown) read "held core-s unknown
    for theirs (0.000 vs -)": core-s the trace never uses. Left out, as the table leaves out
    its column."""
    base = {
        "actions": 2, "rejected": 0, "act_mean_s": 4.0, "act_p99_s": 5.0, "step_mean_s": 6.0,
        "held_core_s": 0.0, "held_gpu_s": 12.1, "cost_usd": 1.0,
    }  # fmt: skip
    floor = {**base, "policy": "lower-bound", "held_core_s": math.nan, "held_gpu_s": math.nan}
    rows = [{**base, "policy": "tangram"}, floor]
    text = " ".join(" ".join(closing_lines(rows, resources={"gpu"})).split())
    assert "held core-s" not in text and "held GPU-s unknown for theirs" in text
    assert "held core-s unknown" in " ".join(closing_lines(rows))  # all figures without it


# --- the table ---------------------------------------------------------------------------


def test_the_default_output_fits_100_columns_and_wide_shows_every_figure(capsys):
    policies = ["--policy", "tangram", "--policy", "k8s-static", "--policy", "fixed:16",
                "--policy", "lower-bound"]  # fmt: skip
    code, out, _ = sim(capsys, "--workload", "coding", "--batch", "8", *policies)
    assert code == 0
    assert max(len(line) for line in out.splitlines()) <= 100
    for header in ("policy", "actions", "rejected", "ACT mean", "ACT p50", "ACT p99", "step"):
        assert header in out
    code, wide, _ = sim(capsys, "--workload", "coding", "--batch", "8", "--wide", *policies)
    assert code == 0
    header = next(line for line in wide.splitlines() if line.startswith("policy"))
    assert header.split() == TABLE_COLUMNS


def test_json_keeps_every_figure(capsys):
    doc = sim_json(capsys, "--workload", "coding", "--batch", "4", "--policy", "tangram")
    assert set(TABLE_COLUMNS) <= set(doc["results"][0])
    assert {"trace", "trace_meta", "cluster", "results", "files"} <= set(doc)


@pytest.mark.parametrize(
    ("kw", "flag"), [({"gpus": 10**9}, "--gpus"), ({"cpu_nodes": 10**8}, "--cpu-nodes")]
)
def test_a_resize_past_the_cluster_files_bound_is_refused_before_building(
    kw: dict[str, int], flag: str
) -> None:
    """--gpus 1e9 or --cpu-nodes 1e8 built nodes for minutes without a word (stop 26's hunt);
    the bound is the cluster file's (``MAX_NODES`` of a kind)."""
    with pytest.raises(ValueError, match=flag):
        resize(load_cluster("paper"), **kw)


def test_open_loop_needs_arrivals_and_replays_a_trace_that_has_them(capsys, tmp_path):
    """--open-loop on a closed-loop trace sent every action at t=0, each trajectory's
    positions at once, without a word (stop 26's hunt)."""
    code, _, err = sim(capsys, "--workload", "coding", "--batch", "2", "--open-loop")
    assert code == 2 and "closed-loop" in err and "arrival_s" in err
    timed = [row(action_id=f"a{i}", trajectory=f"t{i}", arrival_s=float(i)) for i in range(3)]
    path = tmp_path / "open.jsonl"
    write_trace(Trace(timed, {}), path)
    code, _, err = sim(capsys, "--trace", str(path), "--cluster", "local", "--open-loop")
    assert code == 0, err


@pytest.mark.parametrize(
    ("flag", "value", "named"),
    [
        ("--train-s", "nan", "--train-s nan: expected a number"),
        ("--train-s", "inf", "--train-s inf: rollout.train_s must be"),
        ("--grant-s", "-1", "--grant-s -1.0: overheads.aoe_grant_s must be"),
        ("--container-start-s", "nan", "--container-start-s nan:"),
        ("--exec-noise", "99", "--exec-noise 99.0: overheads.exec_noise_sigma must be"),
    ],
)
def test_an_old_flag_is_refused_naming_the_flag_not_a_set(capsys, flag, value, named):
    # The error named '--set rollout.train_s=nan', a --set the user never gave.
    code, out, err = sim(capsys, "--workload", "coding", "--batch", "4", flag, value)
    assert code == 2
    assert named in err and "--set" not in err, err
