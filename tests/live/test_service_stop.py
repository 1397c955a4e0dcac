"""Stopping the service releases its port whatever the runtime's shutdown does: a
``Runtime.close`` that raises still has the HTTP site cleaned up (it was skipped, the port
left bound, accepting connections nobody answers), in ``serve`` as in ``ServiceThread``; the
close's error still reaches the caller."""

from __future__ import annotations

import asyncio
import socket
from urllib.parse import urlsplit

import pytest

from tangram.core.resources import ApiEndpointSpec, ClusterSpec
from tangram.exec.runtime import ApiExecutor, Runtime, RuntimeConfig
from tangram.exec.runtime.api import echo
from tangram.exec.service import ServeOptions, ServiceThread
from tangram.exec.service.server import serve


class CloseFailed(Exception):
    """What the runtime's close raises here."""


def failing_runtime() -> Runtime:
    """A runtime whose close does its work, then raises (a journal that cannot commit)."""
    cluster = ClusterSpec(name="stop", apis=(ApiEndpointSpec("echo", concurrency=4),))
    runtime = Runtime(cluster, RuntimeConfig(max_pending=8), api=ApiExecutor({"echo": echo}))
    close = runtime.close

    async def close_then_fail(grace_s: float | None = None) -> None:
        await close(grace_s)
        raise CloseFailed("the runtime's close failed")

    runtime.close = close_then_fail  # type: ignore[method-assign]
    return runtime


def refused(url: str) -> bool:
    """True when nothing listens at ``url``'s port any more (a connect is refused)."""
    parts = urlsplit(url)
    try:
        with socket.create_connection((parts.hostname, parts.port), timeout=5):
            return False
    except ConnectionRefusedError:
        return True


def test_serve_releases_the_port_when_the_runtime_close_raises() -> None:
    async def main() -> tuple[str, bool]:
        started: asyncio.Future[str] = asyncio.get_running_loop().create_future()
        task = asyncio.create_task(
            serve(failing_runtime(), ServeOptions(port=0), ready=started.set_result)
        )
        url = await asyncio.wait_for(started, 60)
        task.cancel()
        with pytest.raises(CloseFailed):
            await asyncio.wait_for(task, 60)
        return url, refused(url)

    url, released = asyncio.run(main())
    assert released, f"{url} still listens after serve() returned"


def test_a_service_thread_releases_the_port_when_the_runtime_close_raises() -> None:
    service = ServiceThread(failing_runtime, ServeOptions(port=0)).start()
    service.stop()
    assert isinstance(service._error, CloseFailed), service._error
    assert refused(service.url), f"{service.url} still listens after stop()"


def test_a_service_thread_whose_start_timed_out_stops_once_it_started() -> None:
    """``start`` gave up after ``timeout_s`` (a slow engine) with a ``TimeoutError`` and left
    the thread to finish its start: the service then listened, its runtime and containers
    held, until the process exited, with no handle left to stop it. It now stops as soon as
    its start is done, its port released."""
    import threading

    gate = threading.Event()
    made: list[Runtime] = []

    def slow() -> Runtime:
        gate.wait(30)  # (bounded: a failed test still ends)
        cluster = ClusterSpec(name="slow", apis=(ApiEndpointSpec("echo", concurrency=4),))
        made.append(Runtime(cluster, RuntimeConfig(max_pending=8), api=ApiExecutor({"echo": echo})))
        return made[-1]

    service = ServiceThread(slow, ServeOptions(port=0))
    with pytest.raises(TimeoutError):
        service.start(timeout_s=0.2)
    gate.set()
    assert service._thread is not None
    service._thread.join(60)
    assert not service._thread.is_alive(), "the service went on serving after start gave up"
    assert made and made[0].closing, "its runtime was never closed"
