"""``tangram bench sim`` names the policy by its normal name, as ``tangram bench robustness``
does: ``--policy k8s-static:04`` (or plain ``k8s-static``) was shown as typed, not as the
``k8s-static:4`` it ran, so two spellings of one policy read as two policies."""

from __future__ import annotations

import json

import pytest

from tangram.cli import main as cli_main
from tangram.sim.bench import run_bench


@pytest.mark.parametrize("typed", ["k8s-static:04", "k8s-static"])
def test_the_row_names_the_canonical_policy(typed):
    row = run_bench(batch=2, policy=typed, repeats=1)
    assert row["policy"] == "k8s-static:4"


def test_the_json_report_names_the_canonical_policy(capsys):
    assert (
        cli_main(
            ["bench", "sim", "--batch", "2", "--repeats", "1", "--policy", "fixed:01", "--json"]
        )
        == 0
    )
    assert json.loads(capsys.readouterr().out)["policy"] == "fixed:1"
