"""``tangram serve`` and ``tangram bench service`` as commands (API work only: no Docker)."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest

from tangram.cli import main as cli_main
from tangram.exec.service import Client
from tangram.trace import load_trace


def test_serve_refuses_a_public_address_without_a_token(
    capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.delenv("TANGRAM_TOKEN", raising=False)
    assert cli_main(["serve", "--host", "0.0.0.0", "--no-cpu", "--no-gpu"]) == 2
    err = capsys.readouterr().err
    assert "token" in err and "0.0.0.0" in err


def test_serve_runs_until_sigterm_and_writes_its_trace(tmp_path: Path) -> None:
    trace = tmp_path / "serve.jsonl"
    env = {**os.environ, "TANGRAM_TOKEN": "tok"}
    proc = subprocess.Popen(
        [sys.executable, "-m", "tangram.cli", "serve", "--no-cpu", "--no-gpu", "--port", "0"]
        + ["--json", "--trace", str(trace)],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env=env,
    )
    try:
        assert proc.stdout is not None
        info = json.loads(proc.stdout.readline())
        assert info["url"].startswith("http://127.0.0.1:") and info["token"] is True
        assert info["cpu"] is None and info["gpu"] is None and "echo" in info["api"]
        with Client(info["url"], token="tok") as c:
            for i in range(3):
                assert c.run(endpoint="echo", payload=i).value == i
            assert c.run(endpoint="search", payload={"query": "q"}).value["query"] == "q"
    finally:
        proc.send_signal(signal.SIGTERM)
        _, err = proc.communicate(timeout=60)
    assert proc.returncode == 0, err
    assert len(load_trace(trace)) == 4


def test_bench_service_json(capsys: pytest.CaptureFixture[str]) -> None:
    code = cli_main(
        ["bench", "service", "--requests", "200", "--clients", "8", "--warmup", "20", "--json"]
    )
    assert code == 0
    doc = json.loads(capsys.readouterr().out)
    for phase in ("wait", "submit", "single_client"):
        assert doc[phase]["per_s"] > 0
        assert doc[phase]["round_trip"]["p50_ms"] > 0
    assert doc["wait"]["service_act"]["p99_ms"] >= doc["wait"]["service_act"]["p50_ms"]


@pytest.mark.parametrize(
    ("flags", "needle"),
    [
        (["--port", "70000"], "--port"),
        (["--port", "-1"], "--port"),
        (["--warm-pool", "-1"], "--warm-pool"),
        (["--prewarm", "-3"], "--prewarm"),
        (["--no-journal", "--journal-fsync"], "--journal-fsync"),
        (["--ray-fixed-nodes"], "--ray-fixed-nodes"),
        (["--trace", "run.txt"], "unknown trace file type"),
        (["--trace", "."], "--trace"),
        (["--journal", "."], "--journal"),
        (["--trace", "run.jsonl", "--journal", "run.jsonl"], "would share the file"),
        (["--journal", f"{__file__}/j.sqlite"], "give another --journal path"),
        (["--trace", "run.parquet", "--journal", "run.parquet.partial.jsonl"], "would share"),
        (["--policy", "lower-bound"], "ignores capacity"),
        (["--default-timeout-s", "1e12"], "default_timeout_s"),
        (["--default-timeout-s", "inf"], "--default-timeout-s"),
        (["--no-gpu", "--model", "x=reward:/nowhere"], "--no-gpu"),
        (["--api", "nosuch=http://127.0.0.1:9/"], "nosuch"),
        (["--api", "echo=http://127.0.0.1:9/", "--api", "echo=http://127.0.0.1:8/"], "twice"),
        (["--api", "echo=http://u:pw@127.0.0.1:12ab/"], "--api echo: its URL cannot be used"),
        (["--api", "echo=http://[bad-host]/"], "--api echo: its URL cannot be used"),
        (["--api", "echo=http://xn--bad-host/"], "--api echo: its URL cannot be used"),
        (["--api", "echo=http:///path"], "--api echo: its URL has no host"),
    ],
    ids=lambda v: " ".join(v) if isinstance(v, list) else v,
)
def test_serve_refuses_at_start_what_would_fail_later(
    capsys: pytest.CaptureFixture[str], flags: list[str], needle: str
) -> None:
    """Each was accepted (or a traceback): a capacity-blind policy ran 8 searches on a 4-call
    endpoint, a 1e12-s default time-out failed every CPU action, a bad --trace lost the run's
    trace at shutdown, an undeclared --api NAME answered 400 on every call (stop 26's hunt)."""
    try:
        code = cli_main(["serve", "--no-cpu", "--no-gpu", "--port", "0", *flags])
    except SystemExit as exit_:  # argparse's own refusal of a flag's value
        code = exit_.code
    assert code == 2
    err = capsys.readouterr().err
    assert needle in err and "Traceback" not in err, err


def test_serve_names_an_address_it_cannot_listen_on(capsys: pytest.CaptureFixture[str]) -> None:
    import socket

    with socket.socket() as busy:
        busy.bind(("127.0.0.1", 0))
        busy.listen()
        port = str(busy.getsockname()[1])
        code = cli_main(["serve", "--no-cpu", "--no-gpu", "--no-journal", "--port", port])
    assert code == 2
    err = capsys.readouterr().err
    assert f"cannot listen on 127.0.0.1:{port}" in err and "Traceback" not in err, err


def test_serve_that_fails_after_its_executors_are_made_stops_them(
    capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    """``tangram serve`` refused a setting checked once the runtime was built (here
    ``--memory-gb`` beyond the CPU node) and exited, its executors never stopped: AOE's
    warm containers (``--prewarm``), watchdog and Docker client, EOE's devices. They are
    stopped before the refusal."""
    import tangram.exec.runtime as runtime_package
    from tangram.core.resources import ClusterSpec, CpuNodeSpec
    from tangram.exec.runtime import CpuExecutor, Runtime
    from tests.live.test_service_ids import FakeAoe

    stopped: list[str] = []

    class Recording(FakeAoe):
        def shutdown(self) -> None:
            stopped.append("aoe")
            super().shutdown()

    node = CpuNodeSpec("local", cores=2, numa_domains=1, memory_gb=4.0)

    def build(cluster: object, config: object, **kw: object) -> Runtime:
        cpu = CpuExecutor(Recording(), node)
        return Runtime(ClusterSpec(name="c", cpu_nodes=(node,)), config, cpu=cpu)  # type: ignore[arg-type]

    monkeypatch.setattr(runtime_package, "build_runtime", build)
    code = cli_main(["serve", "--no-gpu", "--no-journal", "--port", "0", "--memory-gb", "100"])
    assert code == 2
    err = capsys.readouterr().err
    assert "--memory-gb 100" in err and "Traceback" not in err, err
    assert stopped == ["aoe"]


@pytest.mark.parametrize(
    "flags",
    [["--policy", "nosuch"], ["--max-pending", "0"], ["--header-timeout-s", "0"]],
    ids=lambda v: " ".join(v),
)
def test_a_serve_that_fails_before_serving_removes_its_temporary_journal(
    capsys: pytest.CaptureFixture[str],
    monkeypatch: pytest.MonkeyPatch,
    tmp_path: Path,
    flags: list[str],
) -> None:
    """On a random port without a trace the journal is in a temporary directory; a start
    that failed after it was made (the runtime's settings, the connection limits) left it
    behind until the interpreter exited (or a garbage collection): a process that tries
    several starts collected them. It is removed before the refusal."""
    import tempfile

    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path))
    try:
        code = cli_main(["serve", "--no-cpu", "--no-gpu", "--port", "0", *flags])
    except SystemExit as exit_:  # argparse's own refusal of a flag's value
        code = exit_.code
    assert code == 2, capsys.readouterr().err
    assert not list(tmp_path.glob("tangram-journal-*")), "the temporary journal was left"


@pytest.mark.parametrize(
    "flags",
    [["--header-timeout-s", "0"], ["--max-output-bytes", "0"], ["--max-connections", "0"]],
    ids=lambda v: " ".join(v),
)
def test_serve_refusing_a_setting_after_its_executors_are_made_stops_them(
    capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch, flags: list[str]
) -> None:
    """The connection limits and the serve options were checked after the runtime was built
    (and its warm containers made, ``--prewarm``): their refusal left its executors running,
    AOE's containers in Docker after the process exited. Every executor made is stopped (they
    are now checked first: none is made)."""
    import tangram.exec.runtime as runtime_package
    from tangram.core.resources import ClusterSpec, CpuNodeSpec
    from tangram.exec.runtime import CpuExecutor, Runtime
    from tests.live.test_service_ids import FakeAoe

    made: list[str] = []
    stopped: list[str] = []

    class Recording(FakeAoe):
        def shutdown(self) -> None:
            stopped.append("aoe")
            super().shutdown()

    node = CpuNodeSpec("local", cores=2, numa_domains=1, memory_gb=4.0)

    def build(cluster: object, config: object, **kw: object) -> Runtime:
        made.append("aoe")
        cpu = CpuExecutor(Recording(), node)
        return Runtime(ClusterSpec(name="c", cpu_nodes=(node,)), config, cpu=cpu)  # type: ignore[arg-type]

    monkeypatch.setattr(runtime_package, "build_runtime", build)
    args = ["serve", "--no-gpu", "--no-journal", "--port", "0", "--prewarm", "0", *flags]
    try:
        code = cli_main(args)
    except SystemExit as exit_:  # argparse's own refusal of a flag's value
        code = exit_.code
    assert code == 2, capsys.readouterr().err
    assert stopped == made, "the executors were left running"
