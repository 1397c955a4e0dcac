"""The engine connections AOE uses stay open while they are used: an action's attach socket
whenever Python's cycle collector runs, and a connection pool while another thread sends on
it (CI saw ``OSError: [Errno 9] Bad file descriptor`` once in 100 concurrent actions)."""

from __future__ import annotations

import gc
import weakref
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import pytest

from tangram.exec.aoe import transport
from tangram.exec.aoe.config import BUSYBOX_IMAGE
from tangram.exec.aoe.engine_pool import SocketPoolAdapter, share_one_pool

pytestmark = pytest.mark.docker


@pytest.fixture
def fresh_client(docker_client: Any) -> Iterator[Any]:
    """A new docker SDK client as ``docker.from_env()`` makes it (its first requests open
    fresh connections: the case where a collected socket wrapper closes the socket), and a
    container to exec in."""
    import docker

    client = docker.from_env()
    box = client.containers.run(BUSYBOX_IMAGE, "sleep 120", detach=True, network_disabled=True)
    yield client, box.id
    box.remove(force=True)
    client.close()


def _echo_exec(api: Any, container_id: str) -> str:
    return api.exec_create(container_id, ["/bin/cat"], stdin=True, stdout=True)["Id"]


def test_an_attached_socket_and_its_owner_survive_a_collection(fresh_client: Any) -> None:
    client, container_id = fresh_client
    attached = transport.Attached(
        client.api.exec_start(_echo_exec(client.api, container_id), socket=True)
    )
    owner = weakref.ref(attached.owner)
    gc.collect()
    assert owner() is not None
    transport.send(attached.sock, b"still here\n", 5.0)
    got = transport.FrameReader(attached.sock).next_frame(5.0)
    attached.close()
    assert got == (1, b"still here\n")


def test_the_sdks_socket_wrapper_is_garbage_once_dropped(fresh_client: Any) -> None:
    """Why ``Attached`` holds the wrapper: nothing else does (it is in a reference cycle with
    its HTTP response), so the collector frees it, and its close may shut the socket (it did
    in CI, and does in a plain script that keeps only ``exec_start(...)._sock``)."""
    client, container_id = fresh_client
    wrapper = weakref.ref(client.api.exec_start(_echo_exec(client.api, container_id), socket=True))
    gc.collect()
    assert wrapper() is None


def test_a_collection_between_attach_and_send_leaves_both_transports_working(
    any_manager: Any, trajectory: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    real_send = transport.send
    collections: list[int] = []

    def send_after_collecting(sock: Any, data: bytes, timeout_s: float) -> None:
        collections.append(gc.collect())  # the moment a dropped wrapper would be freed
        real_send(sock, data, timeout_s)

    monkeypatch.setattr(transport, "send", send_after_collecting)
    traj = trajectory(any_manager)
    outcomes = [any_manager.run_action(traj, f"echo round-{i}", (0,)) for i in range(3)]
    assert len(collections) >= 3  # every action went through the collecting send
    for i, out in enumerate(outcomes):
        assert out.ok and out.text == f"round-{i}\n", (out.status, out.error)


def test_every_request_shares_one_pool_however_many_threads_and_urls(fresh_client: Any) -> None:
    client, container_id = fresh_client
    share_one_pool(client)
    share_one_pool(client)  # idempotent
    adapter = client.api.get_adapter("http+docker://localhost")
    assert isinstance(adapter, SocketPoolAdapter)

    def inspect_a_new_exec(_: int) -> int:
        return client.api.exec_inspect(_echo_exec(client.api, container_id))["ExitCode"] or 0

    with ThreadPoolExecutor(30) as pool:  # 120 distinct exec URLs, 30 at once
        codes = list(pool.map(inspect_a_new_exec, range(60)))
    assert codes == [0] * 60
    assert len(adapter.pools) == 1


def test_sharing_one_pool_leaves_the_threads_already_using_the_client_working() -> None:
    """``AoeManager(client=...)`` gives a caller's client the one pool: a client other threads
    are sending on. Closing the adapter it replaced closed pools under them (ClosedPoolError,
    and the ``'NoneType' object has no attribute 'qsize'`` the one pool was meant to end)."""
    import sys
    import threading
    import time

    import docker

    errors: list[str] = []
    interval = sys.getswitchinterval()
    sys.setswitchinterval(1e-6)  # (threads switch often: the window is a few bytecodes)
    try:
        for _ in range(40):
            client = docker.from_env()
            stop = threading.Event()

            def ping(client: Any = client, stop: threading.Event = stop) -> None:
                while not stop.is_set():
                    try:
                        client.api.ping()
                    except Exception as exc:  # noqa: BLE001 (what the test looks for)
                        errors.append(repr(exc))
                        return

            threads = [threading.Thread(target=ping) for _ in range(16)]
            for t in threads:
                t.start()
            time.sleep(0.05)
            share_one_pool(client)
            time.sleep(0.05)
            stop.set()
            for t in threads:
                t.join()
            client.close()
    finally:
        sys.setswitchinterval(interval)
    assert errors == [], errors[:3]
