"""End to end through HTTP on loopback: real containers (tangram-busybox, tangram-python),
CPU-backed EOE services, API endpoints; the runtime drives the ``tangram`` policy."""

from __future__ import annotations

import asyncio
import base64
import collections
import random
import time
from typing import Any

import httpx
import pytest

from tangram.exec.runtime import CommandResult
from tangram.exec.service import AsyncClient, Client, ServiceError

pytestmark = pytest.mark.docker


def wait_running(c: Client, action_id: str, within_s: float = 60.0) -> None:
    """Wait until the core has started ``action_id``: a fixed sleep is not enough on a busy
    machine, where the submission may still be queued after it."""
    deadline = time.monotonic() + within_s
    while (state := c.state(action_id)) != "running":
        assert state == "queued", f"{action_id} is {state}, never seen running"
        assert time.monotonic() < deadline, f"{action_id} did not start within {within_s} s"
        time.sleep(0.02)


def test_results_are_correct(service: Any) -> None:
    from tangram.exec.eoe import example_tokens
    from tangram.exec.eoe.services import build_model

    with Client(service.url) as c:
        info = c.open_trajectory("results", memory_gb=0.5)
        assert info["node"] == "local" and info["container"]
        out = c.run(
            command="echo hello > f.txt; cat f.txt; echo $TANGRAM_CORES", trajectory="results"
        )
        assert out.ok and out.value == CommandResult("hello\n1\n", "", 0, None)
        assert out.units == 1 and out.node == "local" and len(out.cores) == 1
        # The trajectory's files persist; a parallel action gets both cores when they are free.
        out = c.run(
            command="cat f.txt; echo $TANGRAM_CORES",
            trajectory="results",
            max_units=2,
            t1_s=2.0,
            serial_fraction=0.05,
        )
        assert out.value.stdout == "hello\n2\n" and out.units == 2
        out = c.run(command="exit 3", trajectory="results")
        assert out.ok and out.value.exit_code == 3  # a failing command is a result
        tokens = example_tokens(4, 16)
        got = c.run(service="reward", inputs=tokens.tolist(), max_units=2)
        assert got.ok and got.resource == "gpu" and got.node == "local-gpu"
        expected = build_model("RewardModel", "tiny", 0)(tokens).tolist()
        assert got.value == pytest.approx(expected, rel=1e-4, abs=1e-5)
        assert service.call(
            lambda: service.runtime.scheduler.state.gpu["local-gpu"].is_resident(
                "reward", tuple(got.gpus)
            )
        ), "EOE's restore was not reported to the core"
        echo = c.run(endpoint="echo", payload={"a": [1, 2]})
        assert echo.value == {"a": [1, 2]}
        for o in (echo, got):
            t = o.timings
            assert t.act_s == pytest.approx(t.queue_s + t.overhead_s + t.exec_s, abs=2e-6)
        c.close_trajectory("results")
        with pytest.raises(Exception, match="not open"):
            c.run(command="echo", trajectory="results")


def test_2000_concurrent_actions_each_get_exactly_one_outcome(service: Any) -> None:
    """Many clients submit 2,000 mixed actions at once (and resend some, as after a lost
    answer); every action ends exactly once and ran exactly once."""
    rng = random.Random(2000)
    n_traj = 16
    trajs = [f"load-{i}" for i in range(n_traj)]
    gpu_before = service.call(lambda: service.runtime.gpu.eoe.stats().calls)
    actions: list[dict[str, Any]] = []
    for i in range(2000):
        roll = rng.random()
        aid = f"load-a{i}"
        if roll < 0.4:
            actions.append(
                dict(
                    id=aid,
                    command=f"echo {aid} >> /work/log; echo {aid}",
                    trajectory=trajs[i % n_traj],
                    t1_s=0.005,
                )
            )
        elif roll < 0.8:
            actions.append(dict(id=aid, endpoint="counted", payload={"key": aid, "s": 0.0}))
        else:
            actions.append(dict(id=aid, service="reward", inputs=[[i % 500, 1, 2, 3]]))
    resend = set(rng.sample(range(2000), 100))

    async def main() -> dict[str, Any]:
        clients = [AsyncClient(service.url, retries=20) for _ in range(8)]
        try:
            await asyncio.gather(*(clients[0].open_trajectory(t, memory_gb=0.25) for t in trajs))
            queue: asyncio.Queue[int] = asyncio.Queue()
            for i in range(2000):
                queue.put_nowait(i)
            outcomes: dict[str, list[Any]] = collections.defaultdict(list)

            async def worker(c: AsyncClient) -> None:
                while not queue.empty():
                    i = queue.get_nowait()
                    out = await c.run(**actions[i])
                    outcomes[out.action_id].append(out)
                    if i in resend:  # the same submission again: the same outcome, no new run
                        again = await c.run(**actions[i])
                        assert again == out

            await asyncio.gather(*(worker(clients[k % 8]) for k in range(200)))
            logs = await asyncio.gather(
                *(clients[0].run(command="cat /work/log", trajectory=t) for t in trajs)
            )
            await asyncio.gather(*(clients[0].close_trajectory(t) for t in trajs))
            return {"outcomes": outcomes, "logs": logs}
        finally:
            for c in clients:
                await c.aclose()

    t0 = time.perf_counter()
    got = asyncio.run(main())
    elapsed = time.perf_counter() - t0
    outcomes = got["outcomes"]
    assert len(outcomes) == 2000
    assert all(len(v) == 1 for v in outcomes.values())
    bad = [v[0] for v in outcomes.values() if not v[0].ok]
    assert not bad, bad[:3]
    for a in actions:
        out = outcomes[a["id"]][0]
        if "command" in a:
            assert out.value.stdout == f"{a['id']}\n"
        elif "endpoint" in a:
            assert out.value == {"key": a["id"]}
        else:
            assert isinstance(out.value, list) and len(out.value) == 1
    ran_cpu = collections.Counter(line for log in got["logs"] for line in log.value.stdout.split())
    assert set(ran_cpu) == {a["id"] for a in actions if "command" in a}
    assert max(ran_cpu.values()) == 1, "a CPU action ran twice"
    api_ids = [a["id"] for a in actions if "endpoint" in a]
    assert all(service.calls.calls[i] == 1 for i in api_ids), "an API action ran twice"
    assert service.calls.peak <= 3, "the counted endpoint's quota (3) was exceeded"
    gpu_after = service.call(lambda: service.runtime.gpu.eoe.stats().calls)
    assert gpu_after - gpu_before == sum(1 for a in actions if "service" in a)
    status = Client(service.url).status()
    assert status["pending"] == 0 and status["held"]["cores"] == 0
    print(f"2000 mixed actions over HTTP in {elapsed:.1f} s")


def test_a_container_killed_mid_action_fails_that_action_only(
    service: Any, docker_client: Any
) -> None:
    with Client(service.url) as c:
        victim = c.open_trajectory("victim", memory_gb=0.25)
        other = c.open_trajectory("bystander", memory_gb=0.25)
        doomed = c.submit(command="sleep 30", trajectory="victim", timeout_s=60)
        deadline = time.time() + 20
        while c.state(doomed) != "running":
            assert time.time() < deadline
            time.sleep(0.05)
        time.sleep(0.3)
        docker_client.containers.get(victim["container"]).kill()
        out = c.result(doomed, wait_s=30)
        assert out is not None and out.status == "error"
        assert out.error.code == "container_failure" and "died" in out.error.message
        fine = c.run(command="echo alive", trajectory=other["id"])
        assert fine.ok and fine.value.stdout == "alive\n"
        again = c.run(command="echo x", trajectory="victim")
        assert again.status == "error" and again.error.code == "container_failure"
        fresh = c.recreate_trajectory("victim")
        assert fresh["container"] != victim["container"]
        assert c.run(command="echo back", trajectory="victim").value.stdout == "back\n"
        c.close_trajectory("victim")
        c.close_trajectory("bystander")
        assert c.status()["held"]["cores"] == 0


def test_executors_that_raise_fail_their_actions_only(service: Any) -> None:
    async def main() -> list[Any]:
        async with AsyncClient(service.url) as c:
            return await asyncio.gather(
                c.run(service="broken", inputs=[[1.0, 2.0, 3.0, 4.0]]),
                c.run(endpoint="faulty", payload="p"),
                c.run(service="reward", inputs=[[1, 2, 3]]),
                c.run(endpoint="echo", payload="fine"),
            )

    broken, faulty, reward, echo = asyncio.run(main())
    assert broken.status == "error" and broken.error.code == "call_failed"
    assert "crashed on purpose" in broken.error.message
    assert faulty.status == "error" and faulty.error.code == "endpoint_failed"
    assert reward.ok and echo.ok


def test_unknown_trajectory_and_conflicts(service: Any) -> None:
    url = service.url
    r = httpx.post(f"{url}/v1/actions", json={"command": "echo", "trajectory": "ghost"})
    assert r.status_code == 404 and r.json()["error"]["code"] == "unknown_trajectory"
    assert "ghost" in r.json()["error"]["message"]
    r = httpx.post(f"{url}/v1/actions", json={"command": "echo hi"})
    assert r.status_code == 400 and "needs a trajectory" in r.json()["error"]["message"]
    r = httpx.post(f"{url}/v1/actions", json={"service": "nope", "inputs": [[1]]})
    assert r.status_code == 400 and "unknown GPU service 'nope'" in r.json()["error"]["message"]
    r = httpx.post(f"{url}/v1/trajectories", json={"id": "dup", "memory_gb": 0.25})
    assert r.status_code == 201
    r = httpx.post(f"{url}/v1/trajectories", json={"id": "dup"})
    assert r.status_code == 409 and "already open" in r.json()["error"]["message"]
    r = httpx.post(f"{url}/v1/trajectories", json={"id": "huge", "memory_gb": 1000})
    assert r.status_code == 400 and "could never be placed" in r.json()["error"]["message"]
    r = httpx.post(f"{url}/v1/trajectories", json={"memory_gb": "lots"})
    assert r.status_code == 400
    assert httpx.delete(f"{url}/v1/trajectories/dup").status_code == 200
    assert httpx.delete(f"{url}/v1/trajectories/dup").status_code == 404


def test_timeouts_and_cancellation_of_container_actions(service: Any) -> None:
    with Client(service.url) as c:
        c.open_trajectory("slowpoke", memory_gb=0.25)
        out = c.run(command="sleep 10", trajectory="slowpoke", timeout_s=1.0)
        assert out.status == "timeout" and out.timings.act_s < 5
        running = c.submit(command="sleep 5", trajectory="slowpoke", timeout_s=30)
        queued = c.submit(command="echo never", trajectory="slowpoke", timeout_s=30)
        wait_running(c, running)  # (a fixed 0.3 s may be too short on a busy machine)
        with pytest.raises(Exception, match="cannot interrupt") as info:
            c.cancel(running)
        assert info.value.status == 409
        # The second action waits on the trajectory's container (AOE runs one action of a
        # trajectory at a time) or in the core: either way it is not yet done.
        cancelled = c.cancel(queued) if c.state(queued) == "queued" else None
        if cancelled is not None:
            assert cancelled.error.code == "cancelled"
        assert c.result(running, wait_s=30).ok
        c.close_trajectory("slowpoke")


def test_run_code_speaks_sandbox_fusion(service: Any) -> None:
    with Client(service.url) as c:
        r = c.run_code("import sys\nprint(sys.stdin.read()[::-1])", stdin="abc")
        assert r["status"] == "Success" and r["run_result"]["stdout"] == "cba\n"
        assert r["run_result"]["return_code"] == 0 and r["compile_result"] is None
        assert r["run_result"]["execution_time"] > 0
        r = c.run_code("echo $((6*7)) && exit 2", language="bash")
        assert r["status"] == "Failed" and r["run_result"]["status"] == "Finished"
        assert r["run_result"]["return_code"] == 2 and r["run_result"]["stdout"] == "42\n"
        r = c.run_code("while True: pass", run_timeout=1)
        assert r["status"] == "Failed" and r["run_result"]["status"] == "TimeLimitExceeded"
        files = {"data/in.txt": base64.b64encode(b"41").decode()}
        code = "n = int(open('data/in.txt').read())\nopen('out.txt', 'w').write(str(n + 1))"
        r = c.run_code(code, files=files, fetch_files=["out.txt", "missing.txt"])
        assert r["status"] == "Success"
        assert r["files"] == {"out.txt": base64.b64encode(b"42").decode()}
        big = "x = 1\n" * 40_000  # 240 kB: more than one shell argument can carry
        r = c.run_code(big + "print(x)")
        assert r["status"] == "Success" and r["run_result"]["stdout"] == "1\n"
        # A request that cannot run is a 400 (its body: SandboxError and the error document).
        with pytest.raises(ServiceError, match="not supported"):
            c.run_code("IDENTIFICATION DIVISION.", language="cobol")
        with pytest.raises(ServiceError, match="run_timeout"):
            c.run_code("print(1)", run_timeout=-1)
        # verl's exact request shape
        verl = {
            "compile_timeout": 10,
            "run_timeout": 10,
            "code": "print('verl')",
            "stdin": None,
            "memory_limit_MB": 1024,
            "language": "python",
            "files": {},
            "fetch_files": [],
        }
        r = httpx.post(f"{service.url}/run_code", json=verl, timeout=60).json()
        assert r["status"] == "Success" and r["run_result"]["stdout"] == "verl\n"
        assert not service.runtime.trajectories(), "a /run_code container was left open"


def test_metrics_and_status(service: Any) -> None:
    with Client(service.url) as c:
        c.run(endpoint="echo", payload=1)
        text = c.metrics()
        for name in (
            "tangram_actions_submitted_total",
            "tangram_actions_completed_total",
            "tangram_action_act_seconds_bucket",
            "tangram_actions_pending",
            "tangram_cores_held",
        ):
            assert name in text
        status = c.status()
        assert status["policy"] == "tangram" and status["executors"]["cpu"] == "local"
        assert "reward" in status["executors"]["gpu_services"]


def test_trace_of_the_live_run(service: Any, tmp_path: Any) -> None:
    from tangram.trace import load_trace

    with Client(service.url) as c:
        c.write_trace(tmp_path / "live.jsonl")
    trace = load_trace(tmp_path / "live.jsonl")
    assert len(trace) > 100
    kinds = collections.Counter(r.resource for r in trace.rows)
    assert set(kinds) == {"cpu", "gpu", "api"}
    for r in trace.rows:
        assert r.obs_outcome in ("result", "error", "timeout")
        if r.obs_units is not None:
            assert r.obs_node is not None
            assert r.obs_queue_s >= 0 and r.obs_overhead_s >= 0 and r.obs_exec_s >= 0


def test_gpu_timeout_holds_the_cell_until_the_call_returns(service: Any) -> None:
    with Client(service.url) as c:
        out = c.run(service="sleepy", inputs=1.0, timeout_s=0.3)
        assert out.status == "timeout" and "runs on" in out.error.message
        assert out.timings.act_s < 0.9
        # The next call gets a cell once the sleeper returns; nothing is lost or doubled.
        after = c.run(service="sleepy", inputs=0.0)
        assert after.ok and after.value == "woke"
        deadline = time.time() + 10
        while c.status()["held"]["gpus"]:
            assert time.time() < deadline
            time.sleep(0.05)


def test_a_full_node_refuses_or_waits_for_memory(service: Any) -> None:
    async def main() -> None:
        async with AsyncClient(service.url, retries=0) as c:
            await c.open_trajectory("big-a", memory_gb=12)
            with pytest.raises(Exception) as info:
                await c.open_trajectory("big-b", memory_gb=8)
            assert info.value.status == 503 and info.value.code == "capacity_short"
            assert info.value.retryable
            waiting = asyncio.create_task(c.open_trajectory("big-b", memory_gb=8, wait_s=30))
            await asyncio.sleep(0.5)
            assert not waiting.done()
            await c.close_trajectory("big-a")
            opened = await waiting
            assert opened["id"] == "big-b"
            await c.close_trajectory("big-b")

    asyncio.run(main())


def test_closing_a_trajectory_ends_its_queued_actions(service: Any) -> None:
    with Client(service.url) as c:
        c.open_trajectory("closing", memory_gb=0.25)
        first = c.submit(
            command="sleep 3; echo done", trajectory="closing", max_units=2, t1_s=2.0,
            serial_fraction=0.0,
        )  # fmt: skip
        wait_running(c, first)  # running when the close comes: it finishes, the rest do not
        rest = [
            c.submit(command="echo late", trajectory="closing", max_units=2, t1_s=2.0)
            for _ in range(3)
        ]
        c.close_trajectory("closing")
        assert c.result(first).value.stdout == "done\n"
        for r in rest:
            out = c.result(r)
            assert out.status == "error" and out.error.code == "trajectory_closed"
        assert c.status()["held"]["cores"] == 0


@pytest.mark.parametrize("policy", ["fixed:2", "k8s-static:1"])
def test_other_policies_drive_the_executors(policy: str, docker_client: Any) -> None:
    """``fixed:2`` gives every action 2 cores; ``k8s-static:1`` a 1-core pod per trajectory,
    held until the trajectory closes (so two trajectories on two cores, not three)."""
    from tangram.exec.aoe import AoeConfig
    from tangram.exec.eoe import example_tokens
    from tangram.exec.runtime import ActionSpec, CpuWork, GpuWork, RuntimeConfig, build_runtime
    from tests.live.conftest import live_cluster

    async def main() -> None:
        rt = build_runtime(
            live_cluster(),
            RuntimeConfig(policy=policy, default_timeout_s=60),
            gpu_backend="cpu",
            aoe_config=AoeConfig(kill_grace_s=3.0),
            docker_client=docker_client,
        )
        async with rt:
            trajs = [f"p{i}" for i in range(2)]
            await asyncio.gather(*(rt.open_trajectory(t, memory_gb=0.25) for t in trajs))
            outs = await asyncio.gather(
                *(
                    rt.run(
                        ActionSpec(
                            CpuWork("echo $TANGRAM_CORES"), trajectory=trajs[i % 2], max_units=2
                        )
                    )
                    for i in range(8)
                )
            )
            assert all(o.ok for o in outs), [o.error for o in outs if not o.ok]
            cores = {o.value.stdout.strip() for o in outs}
            assert cores == ({"2"} if policy == "fixed:2" else {"1"})
            if policy == "fixed:2":
                gpu = await rt.run(ActionSpec(GpuWork("reward", example_tokens(2, 8)), max_units=2))
                assert gpu.ok and gpu.units == 2
            for t in trajs:
                await rt.close_trajectory(t)
            assert rt.scheduler.state.held_cores == 0

    asyncio.run(main())
