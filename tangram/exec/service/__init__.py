"""The Tangram service: the live runtime behind an HTTP API, and its Python clients.

``tangram serve`` runs it; ``Client`` / ``AsyncClient`` talk to it; ``ServiceThread`` runs one
in-process on a background thread. See ``docs/live.md``.

The names below are imported lazily, so that a light module of the package (``limits``, the
settings ``tangram serve --help`` shows) does not load aiohttp, httpx and the runtime.
"""

from __future__ import annotations

import importlib
from typing import Any

_EXPORTS = {
    "AsyncClient": "tangram.exec.service.client",
    "Client": "tangram.exec.service.client",
    "OverloadedError": "tangram.exec.service.client",
    "ServiceError": "tangram.exec.service.client",
    "ServeOptions": "tangram.exec.service.server",
    "ServiceThread": "tangram.exec.service.server",
    "check_binding": "tangram.exec.service.server",
    "serve": "tangram.exec.service.server",
}

__all__ = sorted(_EXPORTS)


def __getattr__(name: str) -> Any:
    module = _EXPORTS.get(name)
    if module is None:
        raise AttributeError(f"module 'tangram.exec.service' has no attribute {name!r}")
    return getattr(importlib.import_module(module), name)
