"""What a policy returns: start an action somewhere, resize a running one, defer or reject it,
each with a reason."""

from __future__ import annotations

from dataclasses import dataclass
from typing import NamedTuple

from tangram.core.action import Action


class Start(NamedTuple):
    """Run ``action`` now on ``node`` with ``units`` units.

    ``cores`` are the CPU core ids granted (AOE writes them into the container's cpuset);
    ``gpus`` the aligned GPU cell; ``restore`` says the service must first be restored to that
    cell (EOE). ``in_slot`` marks a static-baseline action running inside cores its trajectory
    already holds. ``est_duration`` is the curve's estimate, ``est_overhead`` the expected restore.
    ``slot_since`` is when that reservation (a pod) was granted: a pod is created then, so the
    simulator starts its startup clock there, not when the trajectory opened. ``threads``
    (non-malleable CPU actions, 0 otherwise: told its units): the thread count the program is
    told (``TANGRAM_CORES``, ``OMP_NUM_THREADS``), at least ``units``; its grant
    may then grow up to that count or shrink below it, its threads time-slicing on its own
    cores (``tangram.core.resize``).

    An immutable record like the others, but a NamedTuple: one is built for every action the
    simulator replays, and a tuple costs a third of a frozen dataclass to build.
    """

    time: float
    action: Action
    node: str
    units: int
    reason: str
    cores: tuple[int, ...] = ()
    gpus: tuple[int, ...] = ()
    restore: bool = False
    in_slot: bool = False
    est_duration: float = 0.0
    est_overhead: float = 0.0
    slot_since: float | None = None
    threads: int = 0


class Resize(NamedTuple):
    """A running malleable CPU action now runs on ``cores`` (``units`` of them, was ``previous``).

    AOE writes the new cpuset (and quota) into the running container; the simulator integrates
    the action's progress at its curve's rate on the old units up to ``time`` and on the new
    ones after. ``cores`` is the whole new set: it keeps the cores it had when it shrinks (the
    highest go) and keeps them all when it grows.
    """

    time: float
    action: Action
    node: str
    units: int
    cores: tuple[int, ...]
    previous: int
    reason: str


@dataclass(frozen=True)
class Defer:
    """The action stays queued although it could have started (the paper's "eviction")."""

    time: float
    action: Action
    reason: str


@dataclass(frozen=True)
class Reject:
    """The action can never run as asked; ``reason`` says why. It leaves the queue."""

    time: float
    action: Action
    reason: str


Decision = Start | Resize | Defer | Reject
