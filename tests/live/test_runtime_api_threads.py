"""Plain (blocking) endpoints run on the API executor's thread pool (``API_THREADS``). A call
still waiting for a thread when its action is cancelled (a deadline, a client's cancel) never
runs: it ran later all the same, after its client had been told it timed out, its effects
unseen by anyone. Its outcome says it never started (no start time, no units, no execution
time), as the other never-ran paths' do: it showed a start and an ``exec_s`` equal to its wait
for a thread, so a client could not tell a resend was safe. No Docker."""

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
    never = [o for o in outs if o.start_s is None]
    assert len(never) == n - API_THREADS, [(o.start_s, o.units) for o in outs]
    for o in never:
        assert o.units is None and o.timings.exec_s == 0.0, o
        assert o.error is not None and "never started" in o.error.message, o.error
    started = [o for o in outs if o.start_s is not None]
    assert all(o.units == 1 for o in started), started


def test_a_call_still_waiting_for_a_thread_cancelled_by_its_client_never_started() -> None:
    """The client's cancel of a call the core started but no thread took: it ended with a
    start time, one unit and an ``exec_s`` of its wait; it never ran, and now says so."""
    release = threading.Event()

    def blocking(payload: Any) -> Any:
        release.wait(10)  # (bounded: the test sets it)
        return payload

    n = API_THREADS + 1  # the last waits for a thread
    cluster = ClusterSpec(name="plain", apis=(ApiEndpointSpec("plain", concurrency=n),))

    async def main() -> Any:
        config = RuntimeConfig(timeout_grace_s=0.05)
        async with Runtime(cluster, config, api=ApiExecutor({"plain": blocking})) as rt:
            ids = [await rt.submit(ActionSpec(ApiWork("plain", i), timeout_s=30)) for i in range(n)]
            for _ in range(500):  # bounded: 5 s for the core to start them all
                if all(rt.host.table.get(i).task is not None for i in ids):  # type: ignore[union-attr]
                    break
                await asyncio.sleep(0.01)
            await asyncio.sleep(0.05)
            out = await asyncio.wait_for(rt.cancel(ids[-1]), 10)
            release.set()
            await asyncio.wait_for(asyncio.gather(*(rt.result(i) for i in ids[:-1])), 10)
            return out

    out = asyncio.run(main())
    assert out.status == "error" and out.error is not None, out
    assert out.error.code == "cancelled" and "never started" in out.error.message, out.error
    assert out.start_s is None and out.units is None and out.timings.exec_s == 0.0, out
