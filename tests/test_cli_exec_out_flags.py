"""The live executors' output flags (``tangram calibrate gpu -o``, ``tangram profile-cpu
--out``) take a path as the offline commands do (``tangram.report.path_arg``): an empty one
refused by the parser, a missing directory or a directory refused before the run, a file that
cannot be written an error naming the flag, and a name holding a byte the locale cannot
decode (a surrogate escape) written as that byte.

``calibrate gpu -o ''`` measured the whole service, then ended in an IsADirectoryError
traceback ('.'); ``-o nodir/x.json`` measured it all before "No such file or directory"
naming no flag; an unwritable file (``/proc/version``) was an OSError traceback."""

from __future__ import annotations

import json
import os
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest

from tangram.cli import main

CALIBRATE = ["calibrate", "gpu", "--example", "tiny", "--backend", "cpu", "--reps", "1"]
CALIBRATE += ["--busy", "0"]

undecodable = pytest.mark.skipif(
    os.fsencode("\udce9") != b"\xe9", reason="the file system encoding keeps no undecodable byte"
)


@pytest.fixture
def no_calibration(monkeypatch: pytest.MonkeyPatch) -> None:
    """A calibration that fails the test if it starts (the flag must be refused before)."""
    from tangram.exec.eoe import calibrate_cli

    def ran(args: Any) -> Any:
        raise AssertionError("the calibration ran before the output flag was checked")

    monkeypatch.setattr(calibrate_cli, "_service", ran)


def test_calibrate_refuses_an_empty_out_in_the_parser(
    no_calibration: None, capsys: pytest.CaptureFixture[str]
) -> None:
    with pytest.raises(SystemExit) as exited:
        main([*CALIBRATE, "-o", ""])
    err = capsys.readouterr().err
    assert exited.value.code == 2 and "empty path" in err and "--out" in err, err


@pytest.mark.parametrize("where", ["missing/x.json", "."])
def test_calibrate_refuses_an_out_it_cannot_write_before_measuring(
    where: str, no_calibration: None, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    out = tmp_path / where
    assert main([*CALIBRATE, "-o", str(out)]) == 2
    err = capsys.readouterr().err
    assert f"--out {str(out)!r}" in err, err
    assert ("no directory" if where != "." else "a directory, not a file") in err, err


def test_calibrate_names_the_flag_when_writing_fails(capsys: pytest.CaptureFixture[str]) -> None:
    if not os.path.exists("/proc/version"):
        pytest.skip("no /proc/version to fail writing")
    assert main([*CALIBRATE, "-o", "/proc/version"]) == 2
    err = capsys.readouterr().err
    assert "--out '/proc/version': cannot write it" in err, err


@undecodable
def test_calibrate_writes_an_out_holding_an_undecodable_byte(tmp_path: Path) -> None:
    assert main([*CALIBRATE, "-o", str(tmp_path / "o\udce9.json")]) == 0
    assert [os.fsencode(p.name) for p in tmp_path.iterdir()] == [b"o\xe9.json"]


@pytest.fixture
def fake_profile(monkeypatch: pytest.MonkeyPatch) -> None:
    """``profile-cpu`` without Docker: a manager that does nothing and a made-up profile."""
    from tangram.exec.aoe import manager, profile

    class _Manager:
        def __init__(self, *args: Any, **kwargs: Any) -> None:
            pass

        def __enter__(self) -> _Manager:
            return self

        def __exit__(self, *exc: object) -> None:
            pass

    made = SimpleNamespace(
        to_dict=lambda: {"curve": {"1": 1.0}},
        fit=SimpleNamespace(rel_rms_error=0.0),
        rows=lambda: [{"cores": 1}],
        image="img",
    )
    monkeypatch.setattr(manager, "AoeManager", _Manager)
    monkeypatch.setattr(profile, "profile_command", lambda *a, **k: made)


@undecodable
def test_profile_cpu_writes_an_out_holding_an_undecodable_byte(
    fake_profile: None, tmp_path: Path
) -> None:
    out = tmp_path / "o\udce9.json"
    assert main(["profile-cpu", "--out", str(out), "--", "true"]) == 0
    assert [os.fsencode(p.name) for p in tmp_path.iterdir()] == [b"o\xe9.json"]
    assert json.loads(out.read_text()) == {"curve": {"1": 1.0}}


@pytest.mark.parametrize("where", ["missing/x.json", "."])
def test_profile_cpu_refuses_an_out_it_cannot_write_before_profiling(
    where: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    out = tmp_path / where
    assert main(["profile-cpu", "--out", str(out), "--", "true"]) == 2  # (no Docker needed)
    assert f"--out {str(out)!r}" in capsys.readouterr().err


def test_calibrate_refuses_a_toml_out_before_measuring(
    no_calibration: None, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """The record is written as JSON, but a ``.toml`` record is read as TOML
    (``load_gpu_calibration``, ``tangram replay --gpu-calibration``): ``-o rec.toml`` wrote a
    file the replay then refused as "not valid toml", after the whole calibration."""
    out = tmp_path / "rec.toml"
    assert main([*CALIBRATE, "-o", str(out)]) == 2
    err = capsys.readouterr().err
    assert f"--out {str(out)!r}" in err and ".json" in err, err
    assert not out.exists()


@pytest.mark.parametrize("command", ["calibrate", "profile-cpu"])
@pytest.mark.parametrize("existing", [False, True])
def test_an_out_that_cannot_be_written_is_refused_before_the_run(
    command: str,
    existing: bool,
    no_calibration: None,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    """A directory (or file) the user may not write was found only when the record was
    written, after the whole calibration or profile ("cannot write it"); ``tangram sim --out``
    refuses it before its run (``metrics.check_out_dir``), and so do these now. (Root writes
    anywhere: the permission is denied through ``os.access``.)"""
    out = tmp_path / "rec.json"
    if existing:
        out.write_text("{}")
    denied = out if existing else tmp_path
    real = os.access
    monkeypatch.setattr(os, "access", lambda p, mode: Path(p) != denied and real(p, mode))
    argv = [*CALIBRATE, "-o", str(out)] if command == "calibrate" else [
        "profile-cpu", "--out", str(out), "--", "true"
    ]  # fmt: skip
    assert main(argv) == 2  # (profile-cpu: before the container engine is asked for)
    err = capsys.readouterr().err
    assert f"--out {str(out)!r}" in err and "not writable" in err, err
