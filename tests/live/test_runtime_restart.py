"""Kill -9 and restart (issue 16, defect 2): a ``tangram serve`` killed with SIGKILL while
actions are in flight, restarted on the same journal, answers the clients' resends with one
outcome each (``result``, ``error`` or ``unknown``) and runs none of them a second time.

Runs are counted outside the server: API calls by the endpoint the service forwards to (an
HTTP server in this test), CPU commands by a marker file each run creates in the trajectory's
work volume, which every container of the trajectory mounts, in either server process (read
on the host through the volume's mount point, so a second run is visible whichever container
or server process made it). Bounded: every wait has a deadline, and the whole test a time limit.
"""

from __future__ import annotations

import asyncio
import collections
import contextlib
import json
import os
import select
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

from tangram.exec.runtime import Outcome
from tangram.trace import load_trace

#: ``tangram serve`` itself, its containers' work dir on docker volumes named from ``argv[1]``
#: (each trajectory's own: ``argv[1]-<digest of its id>``; the command line has no flag for
#: the sandbox; this is the only change).
LAUNCHER = """
import functools, sys
import tangram.exec.aoe as aoe
from tangram.exec.aoe.config import SandboxConfig
aoe.AoeConfig = functools.partial(aoe.AoeConfig, sandbox=SandboxConfig(work_volume=sys.argv[1]))
from tangram.cli import main
sys.exit(main(sys.argv[2:]))
"""

#: A CPU action: one marker file per run, then it runs long enough to be killed in flight.
MARK = "mktemp /work/run-{id}.XXXXXX >/dev/null && sleep {s}"

LIMIT_S = 240.0


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def serve(port: int, api_port: int, state: Path, volume: str) -> tuple[subprocess.Popen, str]:
    """Start the service; returns it and its URL once it listens (within 120 s)."""
    cmd = [sys.executable, "-c", LAUNCHER, volume, "serve", "--no-gpu", "--json"]
    cmd += ["--port", str(port), "--journal", str(state / "journal.sqlite")]
    cmd += ["--trace", str(state / "run.jsonl"), "--api", f"search=http://127.0.0.1:{api_port}/"]
    log = (state / f"serve-{time.monotonic_ns()}.log").open("w")
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=log, text=True)
    assert proc.stdout is not None
    ready, _, _ = select.select([proc.stdout], [], [], 120.0)
    line = proc.stdout.readline() if ready else ""
    if not line:
        proc.kill()
        raise AssertionError(f"tangram serve did not start: {Path(log.name).read_text()[-3000:]}")
    return proc, json.loads(line)["url"]


def markers(docker_client: Any, volume: str) -> collections.Counter[str]:
    """Runs per CPU action id, from their marker files in the volume (none before it exists)."""
    try:
        work = Path(docker_client.volumes.get(volume).attrs["Mountpoint"])
    except Exception:  # noqa: BLE001 - not made yet: no run yet
        return collections.Counter()
    return collections.Counter(p.name.split(".")[0][len("run-") :] for p in work.glob("run-*"))


async def until(check: Any, what: str, timeout_s: float = 60.0) -> None:
    deadline = time.monotonic() + timeout_s
    while not check():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout_s} s waiting for {what}")
        await asyncio.sleep(0.05)


async def reopen(client: Any, trajectory: str, timeout_s: float = 60.0) -> None:
    """Open ``trajectory`` on the restarted service, retrying while the killed one's container
    is being reaped (bounded)."""
    from tangram.exec.service import ServiceError

    deadline = time.monotonic() + timeout_s
    while True:
        try:
            await client.open_trajectory(trajectory)
            return
        except ServiceError:
            if time.monotonic() > deadline:
                raise
            await asyncio.sleep(0.2)


async def counting_endpoint(calls: collections.Counter[str]) -> tuple[Any, int]:
    """The API the service forwards ``search`` to: counts each call by its key, then sleeps
    its ``s`` seconds (so calls are in flight at the kill)."""
    from aiohttp import web

    async def handle(request: web.Request) -> web.Response:
        body = await request.json()
        calls[body["key"]] += 1
        await asyncio.sleep(float(body.get("s", 0)))
        return web.json_response({"key": body["key"]})

    app = web.Application()
    app.router.add_post("/", handle)
    runner = web.AppRunner(app, shutdown_timeout=0.5)
    await runner.setup()
    port = free_port()
    await web.TCPSite(runner, "127.0.0.1", port).start()
    return runner, port


def test_a_killed_service_restarted_on_its_journal_runs_nothing_twice(
    docker_client: Any, tmp_path: Path
) -> None:
    from tangram.exec.aoe.lifecycle import id_digest
    from tangram.exec.service import AsyncClient

    state = tmp_path / "state"
    state.mkdir()
    name = f"tangram-restart-{os.getpid()}-{time.monotonic_ns()}"
    volume = f"{name}-{id_digest('rt')}"  # trajectory rt's own (the image makes /work 1000's)
    calls: collections.Counter[str] = collections.Counter()
    procs: list[subprocess.Popen] = []
    runs: collections.Counter[str] = collections.Counter()

    async def scenario() -> None:
        runner, api_port = await counting_endpoint(calls)
        port = free_port()
        proc, url = serve(port, api_port, state, name)
        procs.append(proc)
        # 12 retries: the resends outlast a restart (back-off up to 10 s each)
        async with AsyncClient(url, retries=12) as c:
            await c.open_trajectory("rt")
            api = {"endpoint": "search", "timeout_s": 120.0}
            cpu = {"trajectory": "rt", "timeout_s": 120.0}
            done = {
                "done-api": {**api, "payload": {"key": "done-api", "s": 0}},
                "done-cpu": {**cpu, "command": MARK.format(id="done-cpu", s=0)},
            }
            before = {i: await c.run(id=i, **a) for i, a in done.items()}
            assert all(o.status == "result" for o in before.values()), before
            flying = {
                f"fly-{k}": {**api, "payload": {"key": f"fly-{k}", "s": 60}} for k in range(3)
            }
            flying |= {
                f"cpu-{k}": {**cpu, "command": MARK.format(id=f"cpu-{k}", s=60)} for k in range(2)
            }
            tasks = {i: asyncio.create_task(c.run(id=i, **a)) for i, a in flying.items()}
            await until(
                lambda: (
                    all(calls[f"fly-{k}"] for k in range(3))
                    and markers(docker_client, volume)["cpu-0"]
                ),
                "the API calls and the first command to run",
            )
            proc.send_signal(signal.SIGKILL)  # cpu-1 waits behind cpu-0 in its trajectory
            proc.wait(30)
            streamed = load_trace(state / "run.jsonl")  # valid after a kill -9
            assert {r.action_id for r in streamed.rows} == set(done)

            proc, _ = serve(port, api_port, state, name)  # same port, same journal
            procs.append(proc)
            await reopen(c, "rt")  # so a resent command could run again, were it allowed to
            outs: dict[str, Any] = {}
            for i, task in tasks.items():  # the clients' own resends, after the restart
                try:
                    outs[i] = await asyncio.wait_for(task, 120.0)
                except Exception as exc:  # noqa: BLE001 - an error at the client counts
                    outs[i] = exc
            assert all(isinstance(o, Outcome) for o in outs.values()), outs
            assert {i: o.status for i, o in outs.items()} == dict.fromkeys(flying, "unknown")
            assert all(o.error.code == "outcome_unknown" for o in outs.values())

            # the same ids resent once more after the restart: journaled outcomes, no run
            for i, a in done.items():
                assert await c.run(id=i, **a) == before[i]
            for i, a in flying.items():
                assert (await c.run(id=i, **a)).status == "unknown"
            fresh = await c.run(id="after", **{**cpu, "command": MARK.format(id="after", s=0)})
            assert fresh.status == "result"
            metrics = await c.metrics()
            assert 'tangram_actions_completed_total{status="unknown"} 5.0' in metrics
            await asyncio.sleep(0.5)  # any run a resend caused would have made its marker by now
            runs.update(markers(docker_client, volume))
            await c.close_trajectory("rt")  # its work volume goes with it
            assert not markers(docker_client, volume), "the closed trajectory's volume stayed"
        await runner.cleanup()

    try:
        asyncio.run(asyncio.wait_for(scenario(), LIMIT_S))
    finally:
        for proc in procs:
            if proc.poll() is None:
                proc.send_signal(signal.SIGTERM)
                try:
                    proc.wait(60)
                except subprocess.TimeoutExpired:
                    proc.kill()
    with contextlib.suppress(Exception):  # (if a failure left it)
        docker_client.volumes.get(volume).remove(force=True)
    assert dict(calls) == {"done-api": 1, "fly-0": 1, "fly-1": 1, "fly-2": 1}, "each ran once"
    assert runs["done-cpu"] == 1 and runs["cpu-0"] == 1 and runs["after"] == 1
    assert runs["cpu-1"] <= 1 and max(runs.values()) == 1, f"a command ran twice: {runs}"
