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


def test_a_tiling_flag_without_batch_is_refused_before_the_import(tmp_path, capsys):
    """``--seed S`` without ``--batch`` was ignored without a word (the trace written
    untiled, as if the seed had been used); ``--max-offset-s`` was refused, but only once
    every file had been imported. Both are refused at once, and nothing is written."""
    from tangram.cli import main

    ok = write_traj(tmp_path / "r.traj", {"action": "ls", "execution_time": 0.5})
    out = tmp_path / "t.jsonl"
    for flag, value in (("--seed", "3"), ("--max-offset-s", "1.5")):
        assert main(["import", "swe-agent", str(ok), "-o", str(out), flag, value]) == 2
        assert f"{flag} applies to tiling: give --batch N" in capsys.readouterr().err
        assert not out.exists()
    # A refused --max-offset-s reads no file: a missing one is not what is reported.
    argv = ["import", "swe-agent", str(tmp_path / "absent.traj"), "-o", str(out)]
    assert main([*argv, "--max-offset-s", "1"]) == 2
    assert "--max-offset-s applies to tiling" in capsys.readouterr().err
    assert (
        main(["import", "swe-agent", str(ok), "-o", str(out), "--batch", "2", "--seed", "3"]) == 0
    )
