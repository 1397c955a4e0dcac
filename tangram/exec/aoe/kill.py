"""Killing one action and nothing else: its processes are those whose environment carries
``TANGRAM_ACTION_ID=<id>``, so the kill takes the command, its children and its background
processes, and keeps the container, its PID 1 and every other action's processes."""

from __future__ import annotations

import contextlib
import logging
import os
import signal
from typing import TYPE_CHECKING, Any

from tangram.exec.aoe.cgroups import CgroupGone
from tangram.exec.aoe.transport import ACTION_ENV

if TYPE_CHECKING:
    from tangram.exec.aoe.lifecycle import Container

log = logging.getLogger(__name__)


def kill_action(client: Any, container: Container, aid: str, why: str) -> None:
    """Kill every process of action ``aid`` (found by its environment), keep the rest."""
    try:
        pids = container.control.pids()
    except CgroupGone:
        return
    killed = _kill_visible(pids or [], f"{ACTION_ENV}={aid}".encode())
    if not killed:
        _kill_inside(client, container, aid)
    log.info("killed action %s in %s (%s)", aid, container.handle.short_id, why)


def _kill_visible(pids: list[int], marker: bytes) -> int:
    """SIGKILL the host processes among ``pids`` whose environment holds ``marker``; how many."""
    killed = 0
    for pid in pids:
        try:
            with open(f"/proc/{pid}/environ", "rb") as f:
                environ = f.read().split(b"\0")
        except OSError:
            continue
        if marker in environ:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
                killed += 1
    return killed


def _kill_inside(client: Any, container: Container, aid: str) -> None:
    """Fallback when the container's processes are not visible from here: kill from inside."""
    script = (
        "for p in /proc/[0-9]*; do "
        f"if tr '\\0' '\\n' < $p/environ 2>/dev/null | grep -qx '{ACTION_ENV}={aid}'; "
        "then kill -9 ${p#/proc/} 2>/dev/null; fi; done"
    )
    with contextlib.suppress(Exception):
        client.api.exec_start(
            client.api.exec_create(
                container.handle.container_id,
                ["/bin/sh", "-c", script],
                user=container.blueprint.sandbox.user,
            )["Id"]
        )
