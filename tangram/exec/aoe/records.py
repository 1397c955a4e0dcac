"""Immutable records the AOE executor hands out: containers, grants and action outcomes."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Literal

Status = Literal["ok", "error", "timeout"]

#: Keys of ``ActionOutcome.timings`` (seconds): waiting for the container and the cores,
#: writing the grant, running the command (transport included), writing the revoke, and the
#: whole ``run_action`` call. ``overhead_s`` is total - queue - exec: what AOE itself adds.
TIMING_KEYS = ("queue_s", "grant_s", "exec_s", "revoke_s", "total_s", "overhead_s")


@dataclass(frozen=True)
class ContainerHandle:
    """A trajectory's container: the docker id and what it was created with."""

    traj_id: str
    container_id: str
    name: str
    image: str
    memory_gb: float
    #: How many containers this trajectory has had (1 for the first, +1 per ``recreate``).
    generation: int = 1

    @property
    def short_id(self) -> str:
        return self.container_id[:12]


@dataclass(frozen=True)
class GrantRecord:
    """One grant of cores to an action, with monotonic start and end times (seconds)."""

    traj_id: str
    action_id: str
    cores: tuple[int, ...]
    quota_cores: float
    granted_at: float
    revoked_at: float


@dataclass(frozen=True)
class ActionOutcome:
    """Exactly one per action: what it printed, how it ended, and how long each phase took.

    ``status`` is ``ok`` when the command ran and exited 0; ``error`` when it exited non-zero,
    could not be found, printed more than allowed, or its container died (``error`` says
    which); ``timeout`` when it was killed at its time-out.
    """

    traj_id: str
    action_id: str
    status: Status
    exit_code: int | None
    stdout: bytes
    stderr: bytes
    error: str | None
    cores: tuple[int, ...]
    quota_cores: float
    timings: Mapping[str, float] = field(default_factory=dict)

    @property
    def ok(self) -> bool:
        return self.status == "ok"

    @property
    def text(self) -> str:
        """stdout decoded as UTF-8 (undecodable bytes replaced)."""
        return self.stdout.decode("utf-8", "replace")


@dataclass(frozen=True)
class KillReport:
    """What killing an action did, so its outcome can say it truthfully."""

    #: How its processes were found: ``cgroup`` (all of them, whatever they did) or
    #: ``marker`` (those still carrying the action's environment marker).
    by: Literal["cgroup", "marker"]
    #: How many of its processes were still alive after the kill (None: not known).
    survivors: int | None
    #: The action cgroup could not be thawed after the kill: the container takes no more
    #: actions (it is marked dead, to be recreated).
    left_frozen: bool = False
