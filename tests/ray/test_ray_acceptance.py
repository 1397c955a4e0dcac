"""The single-node service's acceptance, on a 3-node Ray cluster: 2,000 mixed CPU/GPU/API
actions from 200 requesters over HTTP and Ray-native clients, spread over the nodes; every
action has exactly one outcome, none ran twice, no core or GPU granted twice at once."""

from __future__ import annotations

import asyncio
import collections
import random
import time
from pathlib import Path
from typing import Any

from tangram.exec.ray import AsyncRayClient
from tangram.exec.service import AsyncClient


def overlaps(spans: list[tuple[float, float, str]]) -> list[tuple[str, str]]:
    """Pairs of spans that overlap in time (sorted by start; touching is not overlapping)."""
    spans = sorted(spans)
    return [(a[2], b[2]) for a, b in zip(spans, spans[1:], strict=False) if b[0] < a[1]]


def most_at_once(spans: list[tuple[float, float]]) -> int:
    events = sorted([(s, 1) for s, _ in spans] + [(e, -1) for _, e in spans])
    now = peak = 0
    for _, step in events:
        now += step
        peak = max(peak, now)
    return peak


def test_2000_mixed_actions_from_200_requesters_each_end_once(
    ray_cluster: Any, tmp_path: Path
) -> None:
    rng = random.Random(2000)
    trajs = [f"acc-{i}" for i in range(16)]
    calls_file = tmp_path / "api-calls.txt"
    actions: list[dict[str, Any]] = []
    for i in range(2000):
        roll, aid = rng.random(), f"acc-a{i}"
        if roll < 0.4:
            cmd = f"echo {aid} >> /work/log; echo {aid}"
            actions.append(dict(id=aid, command=cmd, trajectory=trajs[i % 16], t1_s=0.005))
        elif roll < 0.8:
            payload = {"key": aid, "file": str(calls_file)}
            actions.append(dict(id=aid, endpoint="counted", payload=payload))
        else:
            actions.append(dict(id=aid, service="reward", inputs=[[i % 500, 1, 2, 3]]))
    resend = set(rng.sample(range(2000), 100))
    handles = ray_cluster.handle.agent_handles.remote()

    async def main() -> dict[str, Any]:
        import ray

        agents = await handles
        gpu_before = {n: (await a.stats.remote())["calls"] for n, a in agents.items()}
        http = [AsyncClient(ray_cluster.info["url"], retries=20) for _ in range(4)]
        native = [AsyncRayClient(ray_cluster.handle, retries=20) for _ in range(4)]
        clients: list[Any] = [c for pair in zip(http, native, strict=True) for c in pair]
        try:
            opened = await asyncio.gather(
                *(clients[k % 8].open_trajectory(t, memory_gb=0.25) for k, t in enumerate(trajs))
            )
            queue: asyncio.Queue[int] = asyncio.Queue()
            for i in range(2000):
                queue.put_nowait(i)
            outcomes: dict[str, list[Any]] = collections.defaultdict(list)

            async def worker(c: Any) -> None:
                while not queue.empty():
                    i = queue.get_nowait()
                    out = await c.run(**actions[i])
                    outcomes[out.action_id].append(out)
                    if i in resend:  # the same submission again: the same outcome, no new run
                        assert await c.run(**actions[i]) == out

            t0 = time.perf_counter()
            await asyncio.gather(*(worker(clients[k % 8]) for k in range(200)))
            elapsed = time.perf_counter() - t0
            logs = await asyncio.gather(
                *(clients[0].run(command="cat /work/log", trajectory=t) for t in trajs)
            )
            await asyncio.gather(*(clients[1].close_trajectory(t) for t in trajs))
            gpu_after = {n: (await a.stats.remote())["calls"] for n, a in agents.items()}
            status = await native[0].status()
            return dict(
                outcomes=outcomes,
                logs=logs,
                opened=opened,
                elapsed=elapsed,
                status=status,
                gpu=sum(gpu_after.values()) - sum(gpu_before.values()),
                ray=ray,
            )
        finally:
            for c in http:
                await c.aclose()

    got = asyncio.run(main())
    outcomes = got["outcomes"]
    assert len(outcomes) == 2000
    assert all(len(v) == 1 for v in outcomes.values()), "an action had two outcomes"
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
    # Spread: containers on both CPU nodes, GPU calls on every GPU node.
    assert {t["node"] for t in got["opened"]} == {"w1", "w2"}
    gpu_nodes = collections.Counter(o[0].node for o in outcomes.values() if o[0].resource == "gpu")
    assert set(gpu_nodes) == {"head", "w1", "w2"}, gpu_nodes
    # None ran twice: CPU by the containers' logs, API by the endpoint's, GPU by EOE's counts.
    ran_cpu = collections.Counter(line for log in got["logs"] for line in log.value.stdout.split())
    assert set(ran_cpu) == {a["id"] for a in actions if "command" in a}
    assert max(ran_cpu.values()) == 1, "a CPU action ran twice"
    lines = [line.split() for line in calls_file.read_text().splitlines()]
    api_runs = collections.Counter(key for key, _, _ in lines)
    assert set(api_runs) == {a["id"] for a in actions if "endpoint" in a}
    assert max(api_runs.values()) == 1, "an API action ran twice"
    assert most_at_once([(float(s), float(e)) for _, s, e in lines]) <= 3, "quota exceeded"
    assert got["gpu"] == sum(1 for a in actions if "service" in a)
    # No core (per node) and no GPU (per node) was granted to two actions at once.
    spans: dict[tuple[str, str, int], list[tuple[float, float, str]]] = collections.defaultdict(
        list
    )
    for (out,) in outcomes.values():
        assert out.start_s is not None
        for core in out.cores:
            spans[(out.node, "core", core)].append((out.start_s, out.end_s, out.action_id))
        for gpu in out.gpus:
            spans[(out.node, "gpu", gpu)].append((out.start_s, out.end_s, out.action_id))
    assert {k[0] for k in spans if k[1] == "core"} == {"w1", "w2"}
    for key, held in spans.items():
        assert not overlaps(held), (key, overlaps(held)[:3])
    status = got["status"]
    assert status["pending"] == 0 and status["held"]["cores"] == 0
    up = {name for name, n in status["nodes"].items() if n["alive"]}
    assert up == {"head", "w1", "w2"}  # no node was lost under the load (w3 is not started)
    print(f"2000 mixed actions over 3 Ray nodes in {got['elapsed']:.1f} s")
