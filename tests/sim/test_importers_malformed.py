"""Importers on malformed input: refused naming the file and the record, never imported
silently wrong."""

from __future__ import annotations

import json

import pytest

from tangram.sim.importers import TraceImportError, import_swe_agent


def write_traj(path, *steps, **extra):
    path.write_text(json.dumps({"trajectory": list(steps), **extra}))
    return path


@pytest.mark.parametrize("action", [["ls", "-la"], {"cmd": "ls"}, 3, None])
def test_a_swe_agent_action_that_is_not_a_string_is_refused_naming_the_step(tmp_path, action):
    """A step's ``action`` (the command) that is no string was imported as kind "empty",
    as if the model had run no command: the kind, the command's first token, was lost."""
    ok = {"action": "ls", "execution_time": 0.5}
    path = write_traj(tmp_path / "r.traj", ok, {"action": action, "execution_time": 0.5})
    with pytest.raises(TraceImportError, match=r"r\.traj: trajectory step 1: 'action' must be"):
        import_swe_agent(path)
    # An empty command stays what it was: a step of kind "empty".
    path = write_traj(tmp_path / "r.traj", ok, {"action": "", "execution_time": 0.5})
    assert [r.kind for r in import_swe_agent(path).rows] == ["ls", "empty"]
