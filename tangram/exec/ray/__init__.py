"""Tangram on a Ray cluster: one scheduler actor, one agent per node (``docs/ray.md``).

``start``/``stop``/``find`` the named scheduler actor, ``RayClient``/``AsyncRayClient`` talk to
it without HTTP, ``RayConfig`` says how. Importing this package does not import Ray.
"""

from tangram.exec.ray.client import AsyncRayClient, RayClient
from tangram.exec.ray.config import RayConfig
from tangram.exec.ray.service import find, start, stop

__all__ = ["AsyncRayClient", "RayClient", "RayConfig", "find", "start", "stop"]
