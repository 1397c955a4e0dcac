"""The service's bounds on what a client may hold: output per stream, time to send a request,
connections open. Plain settings (no aiohttp), so that ``tangram serve --help`` shows them
without loading the service; ``connections`` applies them.

- ``DEFAULT_MAX_OUTPUT_BYTES``: the server's cap on a CPU action's output per stream (1 MiB,
  AOE's own default); a request asking for more is refused with a 400 naming the cap.
- ``ConnectionLimits.header_timeout_s``: a connection must send a request's headers within
  this time of opening (or of its previous answer); otherwise it is closed. An idle
  keep-alive connection closes after it too.
- ``ConnectionLimits.body_timeout_s``: a body must arrive within this time of its headers
  (else 408, and the connection is closed).
- ``ConnectionLimits.max_connections``: at most this many connections are open at once; one
  more is answered 429 ``overloaded`` (the clients retry it) and closed.
- ``ConnectionLimits.max_connections_per_client``: at most this many of them from one peer
  address (None: no bound of its own), so that one client cannot take them all; one more
  from it is answered as one beyond ``max_connections`` is.
- ``ConnectionLimits.tenant_max_connections``: at most this many of them serving one tenant
  (counted from a connection's first request with the tenant's token until it closes; None:
  no bound of its own), so that one tenant, from many addresses, cannot take them all; one
  more request of it on another connection is answered 429 ``overloaded`` and its connection
  closed.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

#: The cap of ``max_output_bytes`` (and its default): AOE's default, 1 MiB per stream.
DEFAULT_MAX_OUTPUT_BYTES = 1 << 20
#: How long aiohttp keeps reading (and dropping) the rest of a body it did not read.
LINGER_S = 2.0


@dataclass(frozen=True)
class ConnectionLimits:
    """Time-outs for reading requests and the bound on open connections (module doc)."""

    header_timeout_s: float = 15.0
    body_timeout_s: float = 60.0
    max_connections: int = 1024
    max_connections_per_client: int | None = None
    tenant_max_connections: int | None = None

    def __post_init__(self) -> None:
        for name in ("header_timeout_s", "body_timeout_s"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int | float) or not value > 0:
                raise ValueError(f"{name} must be a positive number of seconds, got {value!r}")
        count = self.max_connections
        if isinstance(count, bool) or not isinstance(count, int) or count < 1:
            raise ValueError(f"max_connections must be a positive integer, got {count!r}")
        for name in ("max_connections_per_client", "tenant_max_connections"):
            each = getattr(self, name)
            if each is not None and (
                isinstance(each, bool) or not isinstance(each, int) or each < 1
            ):
                raise ValueError(f"{name} must be a positive integer or None, got {each!r}")

    def handler_kwargs(self) -> dict[str, Any]:
        """The settings of aiohttp's connection handlers that carry these limits (access log
        off): the runner's, and ``GuardedSite``'s for the handlers it makes. aiohttp's
        keep-alive timer closes a connection still waiting for a request's headers, so it is
        the header time-out."""
        return {
            "access_log": None,
            "keepalive_timeout": self.header_timeout_s,
            "lingering_time": LINGER_S,
        }
