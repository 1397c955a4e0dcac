"""An executor's own runtime error (a ``LiveError``: its code, status and retryability) from
a container's open or recreate reaches the client as itself. The runtime wrapped every
executor error in a plain 500 ('could not create the container', code ``error``, not to be
retried): a multi-node executor's ``node_lost`` (the node lost while the container was made:
nothing made, the open to be sent again and placed on a node alive) was a 500 over HTTP,
where the Ray-native API answered it 503, retryable."""

from __future__ import annotations

import threading
from typing import Any

import pytest

from tangram.exec.runtime.errors import ERRORS, NodeLostError
from tangram.exec.service import Client, ServeOptions, ServiceError, ServiceThread
from tests.live.test_service_ids import FakeAoe, fake_cpu_runtime


class _LosesNodes(FakeAoe):
    """A stand-in AOE whose first open and every recreate fail with ``node_lost``."""

    def __init__(self) -> None:
        super().__init__()
        self.failed = threading.Event()

    def open_trajectory(self, traj: str, memory_gb: float, *, image: str | None = None) -> Any:
        if not self.failed.is_set():
            self.failed.set()
            raise NodeLostError("node n0 was lost: its agent died (test)")
        return super().open_trajectory(traj, memory_gb, image=image)

    def recreate(self, traj: str) -> Any:
        raise NodeLostError("node n0 was lost: its agent died (test)")


def test_node_lost_is_a_registered_retryable_503() -> None:
    assert ERRORS["node_lost"] is NodeLostError
    assert NodeLostError.http_status == 503 and NodeLostError.retryable


def test_an_executors_node_lost_from_an_open_or_recreate_is_a_retryable_503() -> None:
    aoe = _LosesNodes()
    with (
        ServiceThread(lambda: fake_cpu_runtime(aoe), ServeOptions(port=0)) as svc,
        Client(svc.url, retries=0) as c,
    ):
        with pytest.raises(ServiceError) as err:
            c.open_trajectory("t")
        assert (err.value.status, err.value.code) == (503, "node_lost"), err.value
        assert err.value.retryable and "node n0 was lost" in err.value.message
        assert c.trajectories() == []  # nothing opened: the id is free
        assert c.open_trajectory("t")["id"] == "t"  # sent again, it opens
        with pytest.raises(ServiceError) as err:
            c.recreate_trajectory("t")
        assert (err.value.status, err.value.code) == (503, "node_lost"), err.value
        c.close_trajectory("t")
