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


@pytest.mark.parametrize("status", [float("nan"), float("inf"), 3, ["submitted"]])
def test_a_swe_agent_exit_status_that_is_not_a_string_is_refused_naming_the_file(tmp_path, status):
    """``info.exit_status`` goes to the trace's header: a NaN there (Python's json writes and
    reads it) was carried into the written trace, refused at the writing as the output's
    header rather than as this file's; any other non-string was carried as it was."""
    step = {"action": "ls", "execution_time": 0.5}
    path = write_traj(tmp_path / "r.traj", step, info={"exit_status": status})
    with pytest.raises(TraceImportError, match=r"r\.traj: 'info.exit_status' must be a string"):
        import_swe_agent(path)
    for ok in ("submitted", None):
        path = write_traj(tmp_path / "r.traj", step, info={"exit_status": ok})
        assert import_swe_agent(path).meta["exit_status"] == {"r": ok}
