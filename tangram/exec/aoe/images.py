"""Reaching the Docker engine and making sure Tangram's local images exist.

No registry is reachable where Tangram runs its tests, so images are built locally by
``scripts/ensure-docker.sh`` (busybox-static rootfs, or a debootstrapped Debian with
python3) and cached by the engine. This module connects to the engine with a clear error, and
can run that script when the engine or an image is missing.
"""

from __future__ import annotations

import subprocess
from pathlib import Path
from typing import Any

from tangram.exec.aoe.config import BUSYBOX_IMAGE, PYTHON_IMAGE
from tangram.exec.aoe.errors import EngineUnavailable

#: The script, when running from a source checkout.
ENSURE_SCRIPT = Path(__file__).resolve().parents[3] / "scripts" / "ensure-docker.sh"

IMAGES = (BUSYBOX_IMAGE, PYTHON_IMAGE)


def connect(base_url: str | None = None) -> Any:
    """A docker SDK client that has answered a ping, or ``EngineUnavailable`` saying why."""
    try:
        import docker
        import docker.errors
    except ImportError as exc:
        raise EngineUnavailable(
            "the docker SDK is not installed: pip install 'tangram-arl[exec]' (or docker>=7)"
        ) from exc
    from tangram.exec.aoe.engine_pool import share_one_pool

    try:
        client = docker.DockerClient(base_url=base_url) if base_url else docker.from_env()
        share_one_pool(client)
        client.ping()
    except docker.errors.DockerException as exc:
        where = base_url or "the default socket (DOCKER_HOST or /var/run/docker.sock)"
        raise EngineUnavailable(
            f"no Docker engine answers at {where}: {exc}. Start one with scripts/ensure-docker.sh"
        ) from exc
    return client


def ensure_engine(python_image: bool = True, script: Path = ENSURE_SCRIPT) -> None:
    """Run ``scripts/ensure-docker.sh`` (install, start dockerd, build missing images)."""
    if not script.exists():
        raise EngineUnavailable(
            f"{script} not found: run Tangram from a source checkout or start "
            "Docker and build the tangram-busybox/tangram-python images yourself"
        )
    args = [str(script)] + ([] if python_image else ["--no-python"])
    done = subprocess.run(args, capture_output=True, text=True, check=False)
    if done.returncode != 0:
        raise EngineUnavailable(
            f"{script.name} failed (exit {done.returncode}):\n{done.stderr.strip()}"
        )


def has_image(client: Any, name: str) -> bool:
    import docker.errors

    try:
        client.images.get(name)
        return True
    except docker.errors.ImageNotFound:
        return False
