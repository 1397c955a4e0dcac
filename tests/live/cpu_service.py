"""A CPU-only ``tangram serve`` on a thread for the /run_code and verl tool tests (no GPU
executor, no torch services): ``cpu_only_service(docker_client, ...)`` yields the running
``ServiceThread`` and stops it after."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

from tests.live.conftest import live_cluster


def cpu_only_service(
    docker_client: Any, *, max_pending: int = 256, warm_pool: int = 0, run_code: Any = None
) -> Iterator[Any]:
    """The service, its AOE manager with a warm pool of ``warm_pool`` per key (0: none);
    ``run_code``: the ``/run_code`` settings (None: the defaults)."""
    from tangram.exec.aoe import AoeConfig
    from tangram.exec.aoe.config import WarmPoolConfig
    from tangram.exec.runtime import RuntimeConfig, build_runtime
    from tangram.exec.service import ServeOptions, ServiceThread

    def make() -> Any:
        return build_runtime(
            live_cluster(),
            RuntimeConfig(max_pending=max_pending, default_timeout_s=120.0),
            gpu=False,
            aoe_config=AoeConfig(kill_grace_s=3.0, warm_pool=WarmPoolConfig(warm_pool)),
            docker_client=docker_client,
        )

    options = ServeOptions(port=0) if run_code is None else ServeOptions(port=0, run_code=run_code)
    thread = ServiceThread(make, options)
    thread.start()
    try:
        yield thread
    finally:
        thread.stop()
