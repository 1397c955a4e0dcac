"""``tangram calibrate gpu``: a live measurement of a tiny model's call model, in seconds."""

from __future__ import annotations

import json

import pytest

from tangram.cli import main
from tangram.exec.eoe.calibrate import calibrate_gpu, fit_restore, spin, stop
from tangram.exec.eoe.config import EoeConfig
from tangram.exec.eoe.errors import DopNotSupportedError
from tangram.exec.eoe.manager import EoeManager
from tangram.exec.eoe.services import example_tokens, reward_model_spec
from tangram.trace.gpu_calibration import load_gpu_calibration


def test_a_live_calibration_measures_overhead_restore_and_call_times_per_load() -> None:
    with EoeManager(EoeConfig(backend="cpu", devices=2, device_memory_bytes=1 << 28)) as m:
        info = m.register(reward_model_spec("judge", "tiny", dops=(1, 2)))
        record = calibrate_gpu(
            m,
            "judge",
            example_tokens(4, 16),
            busy_levels=[0, 1],
            reps=3,
            host_cpu_node="vm",
            gpu_node="gpu-0",
        )
        stats = m.stats()
    assert record.service == "judge" and record.backend == "cpu"
    # A CPU-backed device's calls compute on the host: one core per GPU of another call.
    assert record.host_cores_per_gpu == 1.0
    assert [(p.dop, p.busy_cores) for p in record.call_times] == [(1, 0), (2, 0), (1, 1), (2, 1)]
    assert all(p.seconds > 0 for p in record.call_times)
    assert 0 < record.call_overhead_s < 1.0
    # A cold call per cell size restored the replicas; one size of replica, so the fit puts
    # all of the time in the bandwidth.
    assert stats.restores >= 3 and record.restore_fixed_s == 0.0
    assert 0 < record.restore_s(info.resident_bytes / (1 << 30)) < stats.restore_s


def test_spinning_processes_are_killed_and_reaped() -> None:
    procs = spin(2)
    stop(procs)
    assert all(p.returncode is not None for p in procs)


def test_a_spin_that_fails_part_way_kills_the_processes_it_started(monkeypatch) -> None:
    """The processes spin started before one failed to start are killed and reaped: they
    were lost to the caller (spin raised before returning them) and spun for ever."""
    import subprocess

    from tangram.exec.eoe import calibrate

    real = subprocess.Popen
    started: list[subprocess.Popen] = []

    def popen(*args: object, **kw: object) -> subprocess.Popen:
        if started:
            raise OSError("no more processes")
        started.append(real(*args, **kw))
        return started[-1]

    monkeypatch.setattr(calibrate.subprocess, "Popen", popen)
    try:
        with pytest.raises(OSError, match="no more processes"):
            spin(2)
        assert started and started[0].returncode is not None
    finally:
        stop(started)


def test_an_interrupt_anywhere_in_spin_leaves_no_process_spinning(monkeypatch) -> None:
    """spin returned its processes after its try: an interrupt (a KeyboardInterrupt) at the
    return left them spinning for ever (a core each, past the calibration's own end), the
    caller never having them to stop. An interrupt at any line of spin (but its handler's)
    now leaves every process it started stopped, or handed back."""
    import inspect
    import subprocess

    from tangram.exec.eoe import calibrate
    from tests.interrupts import interrupted_at, interruptible_lines

    real = subprocess.Popen
    started: list[subprocess.Popen] = []

    def popen(*args: object, **kw: object) -> subprocess.Popen:
        started.append(real(*args, **kw))
        return started[-1]

    monkeypatch.setattr(calibrate.subprocess, "Popen", popen)
    source, first = inspect.getsourcelines(spin)
    handler = next(
        (first + i for i, t in enumerate(source) if t.strip() == "except BaseException:"), 0
    )
    code = spin.__code__
    lines = [ln for ln in interruptible_lines(code) if not handler <= ln <= handler + 2]
    assert lines
    try:
        for line in lines:
            got: list[subprocess.Popen] = []
            with interrupted_at(code, line):
                got = spin(2)
            stop(got)  # (the caller stops what it was handed)
            assert all(p.poll() is not None for p in started), line
    finally:
        stop(started)


def test_an_interrupt_anywhere_in_stop_leaves_no_process_spinning() -> None:
    """stop killed its processes in a plain loop: an interrupt (a second Ctrl-C during a
    calibration's clean-up) killing the first left the others spinning for ever. An
    interrupt at any line of stop (but its finally's, which Python cannot cover) now
    leaves every one killed and reaped."""
    import inspect

    from tests.interrupts import interrupted_at, interruptible_lines

    source, first = inspect.getsourcelines(stop)
    finallies = [first + i for i, t in enumerate(source) if t.strip() == "finally:"]
    start = min(finallies, default=first + len(source))
    code = stop.__code__
    lines = [ln for ln in interruptible_lines(code) if ln < start]
    assert lines
    for line in lines:
        procs = spin(2)
        try:
            with interrupted_at(code, line):
                stop(procs)
            assert all(p.returncode is not None for p in procs), line
        finally:
            for p in procs:
                p.kill()
                p.wait()


def test_the_restore_fit_separates_bandwidth_from_the_fixed_cost() -> None:
    gbps, fixed = fit_restore([(1.0, 0.6), (2.0, 1.1), (4.0, 2.1)])  # 0.1 s + GB / 2
    assert gbps == pytest.approx(2.0) and fixed == pytest.approx(0.1)
    assert fit_restore([(0.5, 0.2), (0.5, 0.3), (0.5, 0.25)]) == (pytest.approx(2.0), 0.0)


def test_the_command_writes_a_record_the_replay_reads(tmp_path, capsys) -> None:
    out = tmp_path / "judge.json"
    argv = ["calibrate", "gpu", "--example", "tiny", "--backend", "cpu"]
    assert main([*argv, "--reps", "1", "--busy", "0", "-o", str(out), "--json"]) == 0
    record = load_gpu_calibration(out)
    assert json.loads(capsys.readouterr().out) == record.to_dict()
    assert record.dops == (1, 2) and record.host_cores >= 1


@pytest.mark.parametrize(
    ("devices", "service_dops", "dops", "match"),
    [
        (2, (1, 2), [], r"no DoP can be measured: .*DoPs \(1, 2\).* 2 devices"),
        (2, (1, 2), [1, 4], r"DoPs \[4\] cannot be measured: .*DoPs \(1, 2\).* 2 devices"),
    ],
)
def test_a_calibration_with_no_dop_that_fits_names_the_dops_and_the_devices(
    devices: int, service_dops: tuple[int, ...], dops: list[int] | None, match: str
) -> None:
    """It failed with 'no restore ... was measured' (no DoP left to measure) or a failed call
    at DoP 1, naming neither the service's DoPs nor the devices."""
    with EoeManager(EoeConfig(backend="cpu", devices=devices, device_memory_bytes=1 << 28)) as m:
        m.register(reward_model_spec("judge", "tiny", dops=service_dops))
        with pytest.raises(ValueError, match=match):
            calibrate_gpu(m, "judge", example_tokens(2, 8), dops=dops, busy_levels=[0], reps=1)


def test_a_service_no_dop_of_which_fits_the_devices_is_refused_before_calibrating() -> None:
    """A service of DoPs (2,) on 1 device: refused when registered (naming its DoPs and the
    devices), so no calibration starts on it; it was registered and calibrate_gpu said so."""
    with EoeManager(EoeConfig(backend="cpu", devices=1, device_memory_bytes=1 << 28)) as m:
        with pytest.raises(DopNotSupportedError, match=r"DoPs \(2,\).* 1 GPUs"):
            m.register(reward_model_spec("judge", "tiny", dops=(2,)))
        assert m.services() == ()


def test_a_service_without_dop_1_is_calibrated_at_its_own_dops() -> None:
    """The overhead was measured with calls at DoP 1, which a service of DoPs (2,) refuses:
    its calibration failed although its DoP fitted the devices."""
    with EoeManager(EoeConfig(backend="cpu", devices=2, device_memory_bytes=1 << 28)) as m:
        m.register(reward_model_spec("judge", "tiny", dops=(2,)))
        record = calibrate_gpu(m, "judge", example_tokens(2, 8), busy_levels=[0], reps=1)
    assert [p.dop for p in record.call_times] == [2] and record.call_overhead_s > 0


def test_a_busy_level_given_twice_is_measured_once_and_refused_at_once_by_the_cli(
    tmp_path, capsys
) -> None:
    """busy_levels=[0, 0] measured the level twice, then the record refused the two points
    at the same level ('call_times: two points at dop 1, busy_cores 0'), after the whole
    measurement; `--busy 0,0` did the same from the command line instead of refusing it."""
    with EoeManager(EoeConfig(backend="cpu", devices=1, device_memory_bytes=1 << 28)) as m:
        m.register(reward_model_spec("judge", "tiny", dops=(1,)))
        record = calibrate_gpu(m, "judge", example_tokens(2, 8), busy_levels=[0, 0], reps=1)
    assert [(p.dop, p.busy_cores) for p in record.call_times] == [(1, 0)]
    argv = ["calibrate", "gpu", "--example", "tiny", "--devices", "1", "--reps", "1"]
    with pytest.raises(SystemExit) as exit_info:
        main([*argv, "--busy", "0,0", "-o", str(tmp_path / "c.json")])
    assert exit_info.value.code == 2 and not (tmp_path / "c.json").exists()
    assert "--busy '0,0': each level once" in capsys.readouterr().err


def test_a_seq_len_past_the_example_models_positions_is_refused_before_measuring(
    tmp_path, capsys, monkeypatch
) -> None:
    """`--example tiny --seq-len 300` (the example models hold 256 positions; --seq-len is
    taken up to 32,768) made the manager, then the first calibration call failed: a
    traceback ('calibration call of 'reward' at DoP 1 failed: ... sequence length 300
    exceeds the model's max_len 256'), naming no flag. Refused first now, naming --seq-len
    and the model's limit."""
    from tangram.exec.eoe import calibrate

    started: list[str] = []
    monkeypatch.setattr(calibrate, "calibrate_gpu", lambda *a, **k: started.append("x"))
    argv = ["calibrate", "gpu", "--example", "tiny", "--backend", "cpu", "--devices", "1"]
    out = tmp_path / "c.json"
    code = main([*argv, "--seq-len", "300", "--reps", "1", "--busy", "0", "-o", str(out)])
    err = capsys.readouterr().err
    assert code == 2 and started == [] and not out.exists(), err
    assert "--seq-len 300" in err and "256" in err, err


def test_a_calibration_call_that_fails_ends_the_cli_with_its_error_not_a_traceback(
    tmp_path, capsys, monkeypatch
) -> None:
    """A call that failed inside the service raised RuntimeError ('calibration call of ...
    failed: ...') out of `tangram calibrate gpu` as a traceback (the CLI catches ValueError,
    an input's error). It now prints the failure and exits 1, writing no record."""
    from tangram.exec.eoe import calibrate

    def failed(*args, **kwargs):
        raise RuntimeError("calibration call of 'reward' at DoP 1 failed: out of memory")

    monkeypatch.setattr(calibrate, "calibrate_gpu", failed)
    argv = ["calibrate", "gpu", "--example", "tiny", "--backend", "cpu", "--devices", "1"]
    out = tmp_path / "c.json"
    code = main([*argv, "--reps", "1", "--busy", "0", "-o", str(out)])
    err = capsys.readouterr().err
    assert code == 1 and not out.exists(), err
    assert "DoP 1 failed: out of memory; no record written" in err and "Traceback" not in err


@pytest.mark.parametrize(
    ("kwargs", "match"),
    [
        ({"reps": 0}, r"reps must be a positive int, got 0"),
        ({"reps": True}, r"reps must be a positive int, got True"),
        ({"busy_levels": [-1]}, r"busy_levels must be whole numbers from 0 to \d+.*got \[-1\]"),
        ({"busy_levels": [10**6]}, r"busy_levels must be whole numbers from 0 to \d+"),
        ({"busy_levels": [0.5]}, r"busy_levels must be whole numbers"),
    ],
)
def test_calibrate_gpu_refuses_bad_reps_and_busy_levels_before_measuring(
    monkeypatch, kwargs: dict, match: str
) -> None:
    """calibrate_gpu(reps=0) failed as statistics' 'no median for empty data', naming no
    argument; busy_levels=[-1] was measured whole, then refused by the record; and
    busy_levels=[10**6] (the CLI's --busy stops at the host's cores, the function did not)
    set out to start a million spinning processes. Each is refused first now, naming the
    argument, with no call made and no process started."""
    from tangram.exec.eoe import calibrate

    spun: list[int] = []
    monkeypatch.setattr(calibrate, "spin", lambda n: spun.append(n) or [])
    with EoeManager(EoeConfig(backend="cpu", devices=1, device_memory_bytes=1 << 28)) as m:
        m.register(reward_model_spec("judge", "tiny", dops=(1,)))
        with pytest.raises(ValueError, match=match):
            calibrate_gpu(m, "judge", example_tokens(2, 8), **{"busy_levels": [0], **kwargs})
        assert spun == [] and m.stats().calls == 0
