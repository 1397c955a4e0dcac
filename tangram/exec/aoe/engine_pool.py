"""One connection pool for the Docker engine's socket, shared by every request.

docker's ``UnixHTTPAdapter`` keys its connection pools by request URL, and every exec has URLs
of its own (``/exec/ID/start``, ``/exec/ID/json``). Past 25 pools it closes the least recently
used one, even while another thread is sending on it: an ``exec_create`` then raised
``AttributeError: 'NoneType' object has no attribute 'qsize'`` (30 threads running execs), and
each pool keeps idle sockets of its own. The engine is one socket, so one pool.

Imports the docker SDK: import this module only where the SDK is known to be installed.
"""

from __future__ import annotations

from typing import Any

from docker.transport.unixconn import UnixHTTPAdapter

#: Idle connections kept to the engine. docker's default (10) is below the actions AOE runs at
#: once; connections beyond it are still made when needed, and closed when given back.
POOL_SIZE = 64


class SocketPoolAdapter(UnixHTTPAdapter):
    """A ``UnixHTTPAdapter`` whose every URL shares the socket's one pool."""

    def get_connection(self, url: str, proxies: Any = None) -> Any:
        return super().get_connection("http+docker://engine", proxies)


def share_one_pool(client: Any) -> Any:
    """Give ``client`` (a ``DockerClient``) one pool for its Unix socket; idempotent. A client
    on another transport (TCP, SSH) is returned unchanged."""
    api = client.api
    adapter = getattr(api, "_custom_adapter", None)
    if not isinstance(adapter, UnixHTTPAdapter) or isinstance(adapter, SocketPoolAdapter):
        return client
    shared = SocketPoolAdapter(
        "http+unix://" + adapter.socket_path,
        adapter.timeout,
        max_pool_size=max(POOL_SIZE, adapter.max_pool_size),
    )
    api.mount("http+docker://", shared)
    api._custom_adapter = shared  # APIClient.get_adapter answers with this attribute
    # The adapter replaced is not closed: threads already using the client may hold one of its
    # pools (closed under them: ClosedPoolError, or the 'qsize' AttributeError above); its
    # pools and their idle connections go with it once no request holds them.
    return client
