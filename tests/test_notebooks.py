"""notebooks/results.ipynb: generated reproducibly from notebooks/make_results_notebook.py and
executes (kernel python3) against the experiments' outputs, producing figures."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import nbformat
import pytest

ROOT = Path(__file__).resolve().parents[1]
NOTEBOOKS = ROOT / "notebooks"
RESULTS = ROOT / "experiments" / "results"
sys.path.insert(0, str(NOTEBOOKS))

import make_results_notebook  # noqa: E402

pytest.importorskip("nbclient")
pytest.importorskip("ipykernel")

NEEDED = (
    "coding_act.csv",
    "cpu_scaling.csv",
    "mopd_gpu_savings.csv",
    "mopd_gpu_savings_runs.csv",
    "robustness_runs.csv",
)


def results_dir(tmp_path_factory) -> Path:
    """The committed results; where they are missing, smoke runs of the experiments it reads."""
    if all((RESULTS / n).exists() for n in NEEDED) and list(
        RESULTS.glob("coding_b*_s0_*.actions.parquet")
    ):
        return RESULTS
    out = tmp_path_factory.mktemp("results")
    for script in ("coding_act.py", "cpu_scaling.py", "mopd_gpu_savings.py", "robustness.py"):
        subprocess.run(
            [sys.executable, str(ROOT / "experiments" / script), "--smoke", "--out", str(out)],
            check=True,
            cwd=ROOT,
            capture_output=True,
            timeout=300,
        )
    return out


def test_committed_notebook_matches_generator():
    committed = nbformat.read(NOTEBOOKS / "results.ipynb", as_version=4)
    built = make_results_notebook.build()
    assert [c.source for c in committed.cells] == [c.source for c in built.cells], (
        "notebooks/results.ipynb is stale: run python notebooks/make_results_notebook.py"
    )


def test_results_notebook_executes_with_figures(tmp_path_factory, monkeypatch):
    from nbclient import NotebookClient

    monkeypatch.setenv("TANGRAM_RESULTS", str(results_dir(tmp_path_factory)))
    monkeypatch.setenv("MPLBACKEND", "module://matplotlib_inline.backend_inline")
    nb = make_results_notebook.build()
    NotebookClient(
        nb, timeout=180, kernel_name="python3", resources={"metadata": {"path": str(NOTEBOOKS)}}
    ).execute()  # raises CellExecutionError on any error
    errors = [
        o
        for c in nb.cells
        if c.cell_type == "code"
        for o in c.get("outputs", [])
        if o.output_type == "error"
    ]
    assert not errors
    images = [
        o
        for c in nb.cells
        if c.cell_type == "code"
        for o in c.get("outputs", [])
        if o.output_type in ("display_data", "execute_result") and "image/png" in o.get("data", {})
    ]
    assert len(images) >= 5  # ACT CDFs, breakdown, cost vs ACT, utilisation, robustness
    assert os.environ["TANGRAM_RESULTS"]
