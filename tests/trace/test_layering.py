"""The trace package is the ground floor both drivers stand on: it imports neither, and the
names it took over stay importable from where they were."""

from __future__ import annotations

import ast
import subprocess
import sys
from pathlib import Path

import tangram.sim.replay_cli as replay_cli
import tangram.sim.trace as old_trace
import tangram.trace as trace
import tangram.trace.calibrate as calibrate

PACKAGE = Path(trace.__file__).parent


def test_no_module_of_the_trace_package_imports_a_driver() -> None:
    for path in sorted(PACKAGE.glob("*.py")):
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            names = []
            if isinstance(node, ast.Import):
                names = [a.name for a in node.names]
            elif isinstance(node, ast.ImportFrom) and node.module:
                names = [node.module]
            for name in names:
                assert not name.startswith(("tangram.sim", "tangram.exec")), (path.name, name)


def test_importing_the_trace_package_loads_no_driver() -> None:
    code = (
        "import sys, tangram.trace, tangram.trace.calibrate; "
        "print([m for m in sys.modules if m.startswith(('tangram.sim', 'tangram.exec'))])"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "[]"


def test_every_name_of_the_old_trace_module_is_the_new_one() -> None:
    assert old_trace.__all__
    for name in old_trace.__all__:
        assert getattr(old_trace, name) is getattr(trace, name), name


def test_the_replay_cli_still_offers_the_calibration_it_moved() -> None:
    for name in ("Measured", "measure", "replay_trace", "percentiles", "relative_error"):
        assert getattr(replay_cli, name) is getattr(calibrate, name), name
    for name in ("PERCENTILES", "DURATIONS", "MIN_SECONDS"):
        assert getattr(replay_cli, name) == getattr(calibrate, name), name
    assert callable(replay_cli.replay) and callable(replay_cli.main)
