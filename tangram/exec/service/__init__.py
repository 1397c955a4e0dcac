"""The Tangram service: the live runtime behind an HTTP API, and its Python clients.

``tangram serve`` runs it; ``Client`` / ``AsyncClient`` talk to it; ``ServiceThread`` runs one
in-process on a background thread. See ``docs/live.md``.
"""

from __future__ import annotations

from tangram.exec.service.client import AsyncClient, Client, OverloadedError, ServiceError
from tangram.exec.service.server import ServeOptions, ServiceThread, check_binding, serve

__all__ = [
    "AsyncClient",
    "Client",
    "OverloadedError",
    "ServeOptions",
    "ServiceError",
    "ServiceThread",
    "check_binding",
    "serve",
]
