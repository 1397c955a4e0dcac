"""The layers hold: core at the bottom, then the trace vocabulary, then the two drivers side by
side, the command line on top; the core imports no clock, no event loop, no Docker, no torch."""

from __future__ import annotations

import ast
import importlib.util
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def _graph():
    spec = importlib.util.spec_from_file_location("import_graph", ROOT / "scripts/import_graph.py")
    module = importlib.util.module_from_spec(spec)
    sys.modules["import_graph"] = module
    spec.loader.exec_module(module)
    return module


def test_no_layer_imports_a_sibling_or_a_layer_above():
    graph = _graph()
    assert graph.violations() == []
    edges = graph.layer_edges()
    assert not any(src == "exec" and dst == "sim" for src, dst in edges)
    assert not any(src == "sim" and dst == "exec" for src, dst in edges)
    assert {dst for src, dst in edges if src == "core"} <= {"report", "clusters"}


def test_the_core_imports_no_clock_event_loop_docker_or_torch():
    allowed = {"__future__", "bisect", "collections", "dataclasses", "enum", "functools"}
    allowed |= {"heapq", "importlib", "math", "numpy", "pathlib", "scipy", "tangram", "tomllib"}
    allowed |= {"typing", "numbers", "itertools", "operator", "abc", "re", "array"}
    found = set()
    for path in (ROOT / "tangram/core").rglob("*.py"):
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Import):
                found |= {a.name.split(".")[0] for a in node.names}
            elif isinstance(node, ast.ImportFrom) and not node.level:
                found.add((node.module or "").split(".")[0])
    assert found <= allowed, sorted(found - allowed)


def test_importing_the_live_runtime_loads_nothing_of_the_simulator():
    code = (
        "import sys, tangram.exec.runtime, tangram.exec.service; "
        "print([m for m in sys.modules if m.startswith(('tangram.sim', 'simpy'))])"
    )
    import subprocess

    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "[]", out.stdout
