"""An output path holding a byte the locale cannot decode (``--out $'o\\xe9'`` under
``LC_ALL=C``: Python keeps it as a surrogate escape) failed once the run was done as "'utf-8'
codec can't encode character '\\udce9' ...: surrogates not allowed": pyarrow encodes a path as
strict UTF-8. Parquet is written (and read) through a file Python opens, which takes it."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from tangram.trace import load_trace, write_trace
from tests.trace.rows import row

pytestmark = pytest.mark.skipif(
    os.fsencode("\udce9") != b"\xe9", reason="the file system encoding keeps no undecodable byte"
)

ODD = "o\udce9"  # the name b"o\xe9" as Python decodes it from the command line


def test_sim_results_at_an_undecodable_path_are_written(tmp_path) -> None:
    from tangram.core.cluster_file import load_cluster
    from tangram.sim.config import SimConfig
    from tangram.sim.driver import simulate
    from tangram.sim.metrics import write_results
    from tangram.trace import Trace

    out = tmp_path / ODD
    result = simulate(Trace([row()], {}), load_cluster("local"), SimConfig(policy="tangram"))
    paths = write_results(result, out)
    assert all(Path(p).is_file() for p in paths.values())
    assert [os.fsencode(p.name) for p in tmp_path.iterdir()] == [b"o\xe9"]


def test_a_parquet_trace_at_an_undecodable_path_round_trips(tmp_path) -> None:
    from tangram.trace import Trace

    path = tmp_path / f"{ODD}.parquet"
    trace = Trace([row()], {})
    write_trace(trace, path)
    assert load_trace(path).rows == trace.rows


@pytest.mark.parametrize("locale", [{"LC_ALL": "C"}, {"LC_ALL": "C", "PYTHONIOENCODING": "utf-8"}])
def test_sim_out_from_the_command_line(tmp_path, locale) -> None:
    """The command line itself, as the shell hands it the byte: under LC_ALL=C, and with a
    strict UTF-8 stdout (a UTF-8 locale's), which failed printing the path after the run."""
    env = {**os.environ, **locale, "PYTHONPATH": str(Path(__file__).parent.parent)}
    env.pop("PYTHONUTF8", None)
    proc = subprocess.run(
        [sys.executable, "-m", "tangram.cli", "sim", "--workload", "coding", "--batch", "2",
         "--policy", "tangram", "--out", b"o\xe9", "--quiet"],
        cwd=tmp_path, env=env, capture_output=True, timeout=300,
    )  # fmt: skip
    assert proc.returncode == 0, proc.stderr.decode(errors="replace")
    assert b"surrogates" not in proc.stderr
    assert b"results: o\xe9/" in proc.stdout
    assert os.path.isfile(os.path.join(os.fsencode(tmp_path), b"o\xe9", b"tangram.actions.parquet"))
