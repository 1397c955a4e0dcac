"""The metrics' tables and summary at the edges: a run of no action, one action, nothing ran."""

from __future__ import annotations

import math

import pandas as pd
import pytest

from tangram.core.cluster_file import load_cluster
from tangram.sim.config import SimConfig
from tangram.sim.driver import simulate
from tangram.sim.metrics import (
    actions_frame,
    by_kind,
    steps_frame,
    summary,
    trajectories_frame,
    write_results,
)
from tangram.trace import Trace


@pytest.mark.parametrize("policy", ["tangram", "lower-bound"])
def test_a_run_of_no_action_has_named_empty_tables_and_an_undefined_summary(tmp_path, policy):
    """An empty trace simulates to a run of no action; its action table had no columns, so
    summary and by_kind failed with KeyError 'outcome' (which the CLI's handler would print
    as the error "outcome"), and write_results wrote Parquet files of no column."""
    result = simulate(Trace((), {}), load_cluster("local"), SimConfig(policy=policy))
    row = summary(result)
    assert row["actions"] == row["rejected"] == 0
    assert math.isnan(row["act_mean_s"]) and math.isnan(row["step_mean_s"])
    assert by_kind(result).empty
    full = actions_frame(result)
    assert full.empty and {"outcome", "act_s", "queue_s"} <= set(full.columns)
    assert {"duration_s"} <= set(trajectories_frame(result).columns)
    assert {"rollout_s", "duration_s"} <= set(steps_frame(result).columns)
    paths = write_results(result, tmp_path)
    written = pd.read_parquet(paths["actions"])
    assert list(written.columns) == list(full.columns) and written.empty
