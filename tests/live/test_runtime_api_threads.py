"""Plain (blocking) endpoints run on the API executor's thread pool (``API_THREADS``). A call
still waiting for a thread when its action is cancelled (a deadline, a client's cancel) never
runs: it ran later all the same, after its client had been told it timed out, its effects
unseen by anyone. No Docker."""

from __future__ import annotations

import asyncio
import threading
from typing import Any

from tangram.core.resources import ApiEndpointSpec, ClusterSpec
from tangram.exec.runtime import ActionSpec, ApiExecutor, ApiWork, Runtime, RuntimeConfig
from tangram.exec.runtime.api import API_THREADS


def test_a_call_still_waiting_for_a_thread_at_its_deadline_never_runs() -> None:
    release = threading.Event()
    ran: list[Any] = []
    lock = threading.Lock()

    def blocking(payload: Any) -> Any:
        with lock:
            ran.append(payload)
        release.wait(10)  # (bounded: the test sets it)
        return payload

    n = API_THREADS + 4  # more calls than threads: 4 wait for one
    cluster = ClusterSpec(name="plain", apis=(ApiEndpointSpec("plain", concurrency=n),))

    async def main() -> list[Any]:
        config = RuntimeConfig(timeout_grace_s=0.05)
        async with Runtime(cluster, config, api=ApiExecutor({"plain": blocking})) as rt:
            ids = [
                await rt.submit(ActionSpec(ApiWork("plain", i), timeout_s=0.3)) for i in range(n)
            ]
            outs = await asyncio.wait_for(asyncio.gather(*(rt.result(i) for i in ids)), 10)
            release.set()
            for _ in range(200):  # bounded: 2 s for the threads to finish what they ran
                if all(rt.host.table.get(i).task.done() for i in ids):  # type: ignore[union-attr]
                    break
                await asyncio.sleep(0.01)
            return outs

    outs = asyncio.run(main())
    assert [o.status for o in outs] == ["timeout"] * n
    assert len(ran) == API_THREADS, f"{len(ran)} calls ran, {API_THREADS} threads had started"
