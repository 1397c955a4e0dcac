"""``tangram replay``: a recorded live run replayed in the simulator, ACT errors reported."""

from __future__ import annotations

import asyncio
import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from tangram.cli import main as cli_main
from tangram.core.resources import ApiEndpointSpec, ClusterSpec
from tangram.exec.runtime import ActionSpec, ApiExecutor, ApiWork, Runtime, RuntimeConfig
from tangram.sim.replay_cli import replay
from tangram.trace import Trace, TraceRow, load_trace, write_trace
from tangram.trace.calibrate import measure, percentiles, relative_error, replay_trace
from tests.live.conftest import CallLog, faulty_endpoints

ROOT = Path(__file__).resolve().parents[2]


def record_api_run(path: Path, concurrency: int = 2) -> Path:
    """A live run of sleeping API calls that queue on a quota of ``concurrency``."""
    cluster = ClusterSpec(name="replay-test", apis=(ApiEndpointSpec("slow", concurrency),))

    async def main() -> None:
        rt = Runtime(
            cluster,
            RuntimeConfig(trace_path=path),
            api=ApiExecutor(faulty_endpoints(CallLog())),
        )
        async with rt:

            async def agent(k: int) -> None:
                for i in range(6):
                    await asyncio.sleep(0.01 * ((k + i) % 3))
                    s = 0.02 + 0.01 * ((k * 7 + i) % 5)
                    await rt.run(ActionSpec(ApiWork("slow", {"s": s}), trajectory=f"t{k}", t1_s=s))

            await asyncio.gather(*(agent(k) for k in range(5)))

    asyncio.run(main())
    return path


def test_replay_of_a_live_run_matches_its_act(tmp_path: Path) -> None:
    path = record_api_run(tmp_path / "live.jsonl")
    trace = load_trace(path)
    assert len(trace) == 30 and trace.meta["policy"] == "tangram"
    live_queue = sum(r.obs_queue_s for r in trace.rows)
    assert live_queue > 0.1, "the run should queue on the quota"
    report = replay(path)
    assert report.actions == 30 and report.policy == "tangram"
    assert set(report.by_resource) == {"api"}
    # How late the machine ran the live run: its sleeps overshoot when the event loop waits
    # for a CPU (a loaded machine), and so does the hand-over from one finished call to the
    # next queued one, which the replay charges as the run's mean overhead.
    slowdown = max(r.obs_exec_s / r.t1_s for r in trace.rows)
    on_time = slowdown <= 1.1
    # Replayed with the measured durations: close when the machine kept time. Under load the
    # late hand-overs lengthen the live queue on the quota, and the replay can only err short
    # (p50 -11% at load 6 with every duration measured): what holds either way.
    for key in ("p50", "p95", "mean"):
        err = report.error[key]
        assert (abs(err) if on_time else err) < 0.10, (key, slowdown, report.error)
    # With the declared curves the simulator predicts execution from t1_s (the sleep asked
    # for). On a machine that delivered it, the replay is close; on a loaded one the sleeps
    # overshoot, and the replay can only err short: what holds either way.
    # A few overshooting sleeps lengthen the live queue on the quota for every action behind
    # them, so the two-sided bound needs every sleep on time, not the median (under load the
    # median was 1.05 while the replay erred 34% short).
    curve = replay(path, durations="curve")
    if on_time:
        assert abs(curve.error["p50"]) < 0.25, (slowdown, curve.error)
    else:
        assert curve.error["p50"] < 0.05, (slowdown, curve.error)


def test_replay_cli_json(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    path = record_api_run(tmp_path / "live.jsonl")
    assert cli_main(["replay", str(path), "--json"]) == 0
    doc = json.loads(capsys.readouterr().out)
    assert set(doc["error"]) == {"p50", "p90", "p95", "p99", "mean"}
    assert doc["live"]["p50"] > 0 and doc["sim"]["p50"] > 0
    assert doc["measured"]["api_overhead_s"] >= 0
    assert cli_main(["replay", str(path)]) == 0
    text = capsys.readouterr().out
    assert "error (sim-live)/live" in text and "p95" in text


def test_replay_refuses_a_trace_without_observations(tmp_path: Path) -> None:
    generated = ROOT / "traces" / "coding.jsonl.gz"
    if not generated.exists():
        rows = (TraceRow("a", "t", 0, 0, "x", "env", 0.0, "cpu", 1.0, 1),)
        write_trace(Trace(rows, {"policy": "tangram"}), tmp_path / "g.jsonl")
        generated = tmp_path / "g.jsonl"
    code = cli_main(["replay", str(generated), "--policy", "tangram", "--cluster", "local"])
    assert code == 2


def test_observed_durations_rescale_each_curve() -> None:
    base = dict(trajectory="t", step=0, task="x", kind="k", gen_before_s=0.0, arrival_s=0.0)
    obs = dict(obs_arrival_s=0.0, obs_queue_s=0.0, obs_overhead_s=0.0, obs_outcome="result")
    rows = (
        TraceRow("a", position=0, resource="cpu", t1_s=2.0, max_units=4, serial_fraction=0.5,
                 obs_units=2, obs_exec_s=3.0, obs_node="n", **base, **obs),
        TraceRow("b", position=1, resource="cpu", t1_s=2.0, max_units=2,
                 curve={"kind": "tabulated", "points": [[1, 2.0], [2, 1.0]]},
                 obs_units=2, obs_exec_s=0.5, obs_node="n", **base, **obs),
        TraceRow("c", position=2, resource="cpu", t1_s=2.0, max_units=1, obs_units=None,
                 obs_exec_s=0.0, **base, **{**obs, "obs_outcome": "timeout"}),
    )  # fmt: skip
    trace = Trace(rows, {})
    out = replay_trace(trace, measure(trace), "observed")
    assert [r.action_id for r in out.rows] == ["a", "b"]  # c never started
    by_id = {r.action_id: r for r in out.rows}
    assert by_id["a"].curve_object().duration(2) == pytest.approx(3.0)
    assert by_id["b"].curve_object().duration(2) == pytest.approx(0.5)
    assert by_id["b"].curve_object().duration(1) == pytest.approx(1.0)


def test_percentiles_and_errors() -> None:
    p = percentiles([1.0, 2.0, 3.0, 4.0])
    assert p["p50"] == 2.5 and p["mean"] == 2.5
    assert relative_error({"p50": 1.1}, {"p50": 1.0})["p50"] == pytest.approx(0.1)


@pytest.mark.docker
def test_fidelity_experiment_smoke(tmp_path: Path, docker_client: Any) -> None:
    done = subprocess.run(
        [sys.executable, "experiments/fidelity.py", "--smoke", "--out", str(tmp_path)],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    for name in ("fidelity.md", "fidelity.json", "fidelity.claims.csv"):
        assert (tmp_path / name).stat().st_size > 0
    doc = json.loads((tmp_path / "fidelity.json").read_text())
    err = doc["runs"][0]["replay"]["observed"]["error"]
    # The live run's ACTs carry the machine's load, which the replay does not model: quiet,
    # the errors are 0-2% (stop 32, three runs); inside the whole suite one run's p50 was off
    # by 11.5% (the fresh clone of stop 32). The bound catches a replay that models the run
    # wrongly, not a busy machine; the fidelity figures of record are experiments/fidelity.py's.
    assert abs(err["p50"]) < 0.25 and abs(err["p95"]) < 0.25, err
