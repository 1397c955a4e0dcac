"""Running the service: ``serve`` (the CLI's foreground server) and ``ServiceThread`` (a
server on a background thread with its own event loop, for tests, notebooks and benchmarks).

Binding beyond loopback without a token is refused: anyone who can reach the port could run
commands in the containers.
"""

from __future__ import annotations

import asyncio
import contextlib
import ipaddress
import logging
import signal
import threading
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path

from aiohttp import web

from tangram.exec.runtime import Runtime
from tangram.exec.service.app import ServiceApp, check_seconds
from tangram.exec.service.connections import GuardedSite
from tangram.exec.service.limits import DEFAULT_MAX_OUTPUT_BYTES, ConnectionLimits
from tangram.exec.service.sandbox_fusion import RunCodeSettings

log = logging.getLogger(__name__)


def is_loopback(host: str) -> bool:
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


def check_binding(host: str, token: str | bool | None) -> None:
    """Refuse to serve beyond loopback without a token, the operator's or tenants' (``token``
    true: some client must authenticate; ``ValueError`` says what to do)."""
    if not is_loopback(host) and not token:
        raise ValueError(
            f"binding {host!r} exposes the service beyond this machine; give a token "
            "(--token or TANGRAM_TOKEN, or tenants' --client NAME=TOKEN) so that only its "
            "holders can run actions"
        )


@dataclass(frozen=True)
class ServeOptions:
    """How the service serves (``docs/live.md``, "Running it").

    ``max_output_bytes``: the server's cap on a CPU action's output per stream (a request
    asking for more is refused with a 400 naming it; also the default). ``limits``: the
    time-outs for reading a request's headers and body and the bound on open connections.
    """

    host: str = "127.0.0.1"
    port: int = 8765
    token: str | None = None
    #: Tenants: name -> token, each client with ids of its own (``tenants``); ``token`` is then
    #: the operator's.
    clients: Mapping[str, str] = field(default_factory=dict)
    #: The most actions one tenant may have pending (None: only the runtime's shared bound).
    tenant_max_pending: int | None = None
    #: The most trajectories one tenant may have open (None: only the node's memory).
    tenant_max_trajectories: int | None = None
    trace_path: Path | None = None
    run_code: RunCodeSettings = RunCodeSettings()
    max_wait_s: float = 300.0
    max_output_bytes: int = DEFAULT_MAX_OUTPUT_BYTES
    limits: ConnectionLimits = ConnectionLimits()

    def __post_init__(self) -> None:
        check_seconds("max_wait_s", self.max_wait_s)
        cap = self.max_output_bytes
        if isinstance(cap, bool) or not isinstance(cap, int) or cap < 1:
            raise ValueError(f"max_output_bytes must be a positive integer, got {cap!r}")


async def start_site(runtime: Runtime, opts: ServeOptions) -> tuple[web.AppRunner, str]:
    """Start the runtime and an HTTP site for it; returns the runner and the base URL."""
    runner: web.AppRunner | None = None
    try:
        check_binding(opts.host, bool(opts.token or opts.clients))
        await runtime.start()
        app = ServiceApp(
            runtime,
            token=opts.token,
            clients=dict(opts.clients),
            tenant_max_pending=opts.tenant_max_pending,
            tenant_max_trajectories=opts.tenant_max_trajectories,
            trace_path=opts.trace_path,
            run_code_settings=opts.run_code,
            max_wait_s=opts.max_wait_s,
            max_output_bytes=opts.max_output_bytes,
            body_timeout_s=opts.limits.body_timeout_s,
        ).build()
        runner = web.AppRunner(app, shutdown_timeout=5.0, **opts.limits.handler_kwargs())
        await runner.setup()
        site = GuardedSite(
            runner,
            opts.host,
            opts.port,
            opts.limits,
            on_refused=lambda: runtime.counters.update(("refused_connections",)),
        )
        await site.start()
    except BaseException:
        # (The address taken, say: the runtime it started is closed, its journal's lock
        # released; it stayed started, and a second start was refused the journal. A runtime
        # whose own start failed stops its executors: they were left running.)
        if runner is not None:
            with contextlib.suppress(Exception):
                await runner.cleanup()
        await runtime.close(grace_s=0.0)
        raise
    return runner, site.name


async def serve(
    runtime: Runtime, opts: ServeOptions, ready: Callable[[str], None] | None = None
) -> None:
    """Serve until SIGINT/SIGTERM, then shut the runtime down (trace written if configured)."""
    runner, url = await start_site(runtime, opts)
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGINT, signal.SIGTERM):
        with contextlib.suppress(NotImplementedError, RuntimeError):
            loop.add_signal_handler(sig, stop.set)
    if ready is not None:
        ready(url)
    try:
        await stop.wait()
    finally:
        await shut_down(runtime, runner)


async def shut_down(runtime: Runtime, runner: web.AppRunner) -> None:
    """Close the runtime (its in-flight requests get their outcomes), then the HTTP site. The
    site is cleaned up even when the close raises (the error still propagates): skipped, the
    port stayed bound, accepting connections nobody would answer."""
    try:
        await runtime.close()
    finally:
        await runner.cleanup()


class ServiceThread:
    """A service on a background thread: ``start()`` returns once it listens (``url``),
    ``stop()`` shuts the runtime down and stops the loop.

    ``make_runtime`` is called on the service's thread (executors are made there).
    """

    def __init__(self, make_runtime: Callable[[], Runtime], opts: ServeOptions | None = None):
        self.make_runtime = make_runtime
        self.opts = opts or ServeOptions(port=0)
        self.url = ""
        self.runtime: Runtime | None = None
        self.loop: asyncio.AbstractEventLoop | None = None
        self._thread: threading.Thread | None = None
        self._ready = threading.Event()
        self._error: BaseException | None = None
        self._stop: asyncio.Event | None = None
        #: Set once the service is to stop (``stop``, or a ``start`` that gave up): a service
        #: still starting then stops as soon as it started.
        self._stopping = threading.Event()

    def start(self, timeout_s: float = 120.0) -> ServiceThread:
        """Start the service's thread; returns once it listens. A start that takes longer
        than ``timeout_s`` raises ``TimeoutError`` and the service is told to stop: it stops
        once its start is done (it went on serving, its runtime held, with no handle left)."""
        self._thread = threading.Thread(target=self._main, name="tangram-service", daemon=True)
        self._thread.start()
        if not self._ready.wait(timeout_s):
            self._request_stop()
            raise TimeoutError(
                f"the service did not start within {timeout_s} s; it stops once its start is done"
            )
        if self._error is not None:
            raise RuntimeError(f"the service failed to start: {self._error}") from self._error
        return self

    def _main(self) -> None:
        loop = asyncio.new_event_loop()
        self.loop = loop
        asyncio.set_event_loop(loop)
        try:
            loop.run_until_complete(self._run())
        except BaseException as exc:  # noqa: BLE001 - reported to start()
            self._error = exc
            self._ready.set()
        finally:
            loop.close()

    async def _run(self) -> None:
        self._stop = asyncio.Event()
        self.runtime = self.make_runtime()
        runner, self.url = await start_site(self.runtime, self.opts)
        self._ready.set()
        if self._stopping.is_set():  # (told to stop while it started)
            self._stop.set()
        try:
            await self._stop.wait()
        finally:
            await shut_down(self.runtime, runner)

    def call(self, fn: Callable[[], object], timeout_s: float = 60.0) -> object:
        """Run ``fn`` (a coroutine function or a plain one) on the service's loop."""
        assert self.loop is not None

        async def wrapper() -> object:
            result = fn()
            if asyncio.iscoroutine(result):
                result = await result
            return result

        return asyncio.run_coroutine_threadsafe(wrapper(), self.loop).result(timeout_s)

    def stop(self, timeout_s: float = 120.0) -> None:
        """Shut the service down and wait (up to ``timeout_s``) for its thread to end."""
        self._request_stop()
        if self._thread is not None and self._thread.is_alive():
            self._thread.join(timeout_s)

    def _request_stop(self) -> None:
        """Tell the service to stop: now if it serves, else once its start is done (``_run``
        reads ``_stopping`` after its start; ``_stop`` exists from ``_run``'s first step)."""
        self._stopping.set()
        loop, stop = self.loop, self._stop
        if loop is not None and stop is not None and loop.is_running():
            with contextlib.suppress(RuntimeError):  # (the loop closed meanwhile)
                loop.call_soon_threadsafe(stop.set)

    def __enter__(self) -> ServiceThread:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()
