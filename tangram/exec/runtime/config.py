"""``RuntimeConfig``: the live runtime's knobs (policy, admission bound, defaults)."""

from __future__ import annotations

import math
import os
from dataclasses import dataclass
from pathlib import Path

from tangram.core.policies import make_policy
from tangram.exec.runtime.records import MAX_TIMEOUT_S


@dataclass(frozen=True)
class RuntimeConfig:
    """Settings of a ``Runtime``.

    - ``policy``: a registered policy name (``tangram``, ``fixed:4``, ``k8s-static``...): the
      same objects the simulator drives.
    - ``max_pending``: admission bound. An action is pending from its acceptance until its
      outcome; a submission that would exceed the bound is refused at once with a retryable
      ``Overloaded`` error (HTTP 429) instead of waiting and timing out.
    - ``default_timeout_s``: the time limit of an action that gives none (queueing included).
    - ``default_memory_gb``: a trajectory container's memory when the open gives none.
    - ``timeout_grace_s``: how long after its deadline a running CPU action (which AOE kills at
      the deadline), or an API call (cancelled at the deadline), may take to report before the
      runtime declares the time-out itself.
    - ``close_grace_s``: at shutdown, how long running actions may take to end.
    - ``keep_outcomes``, ``keep_outcomes_s``: finished outcomes kept in memory for polling, at
      most this many and this long after they ended (oldest dropped first; a journal answers
      for older ones, and the trace, streamed to disk, keeps every action regardless). Why
      both: memory must not grow with the count of actions (issue 16), and 10,000 outcomes
      or an hour covers any poller still waiting for its action.
    - ``trace_path``: the trace, streamed there as actions end when it is ``.jsonl`` (else
      beside it, ``PATH.partial.jsonl``) and rewritten with a final header at shutdown (None:
      a temporary spool, for ``GET /v1/trace``).
    - ``journal_path``: the journal of accepted ids and their outcomes (``journal.py``), so a
      restarted service never runs an id twice (None: no journal; ids are remembered only
      while their outcome is kept). ``journal_fsync``: sync it to disk before each start and
      at every commit (survives a power loss too; off by default: a killed process loses
      nothing without it, and a sync costs ~0.2 ms here on the path of starts).
      ``journal_keep``, ``journal_keep_s``: its bounds (finished entries beyond the newest
      1,000,000 or accepted over a day ago are deleted: a resend comes within minutes, and
      a small action's entry is about 0.6 KB on disk).
    - ``exclusive_cores``: grant CPU actions exclusive cores (cpuset = the granted cores, a
      CFS quota) even when the policy's grants lend idle cycles
      (``Capabilities.cpu_lends_idle``, the default policy's), whose grants are otherwise CFS
      weights over the node's cores: isolation (no noisy neighbour, warm caches) over work
      conservation (docs/aoe.md, "Weighted grants"). No effect on a policy that does not lend.
    """

    policy: str = "tangram"
    max_pending: int = 4096
    default_timeout_s: float = 600.0
    default_memory_gb: float = 1.0
    timeout_grace_s: float = 10.0
    close_grace_s: float = 30.0
    keep_outcomes: int = 10_000
    keep_outcomes_s: float = 3600.0
    trace_path: Path | None = None
    journal_path: Path | None = None
    journal_fsync: bool = False
    journal_keep: int = 1_000_000
    journal_keep_s: float = 86_400.0
    exclusive_cores: bool = False

    def __post_init__(self) -> None:
        for name in ("trace_path", "journal_path"):
            # (A str, as callers write paths, failed far from here: 'str' object has no
            # attribute 'name', in the Runtime or in the shared-file check below.)
            object.__setattr__(self, name, _path(name, getattr(self, name)))
        policy = make_policy(self.policy)  # raises ValueError naming the known policies
        if not policy.capabilities.respects_capacity:
            raise ValueError(
                f"policy {self.policy!r} ignores capacity (a floor for reports, not a schedule); "
                "the live runtime needs a policy that respects the cluster"
            )
        if policy.capabilities.cpu_shared:
            raise ValueError(
                f"policy {self.policy!r} shares CPU cycles the way CFS does (a simulator "
                "baseline); the live runtime grants exclusive cores"
            )
        for name in ("max_pending", "keep_outcomes", "journal_keep"):
            _check_count(name, getattr(self, name))
        for name in ("default_timeout_s", "default_memory_gb"):
            value = _check_number(name, getattr(self, name))
            if not (math.isfinite(value) and value > 0):
                raise ValueError(f"{name} must be a positive finite number, got {value!r}")
        if self.default_timeout_s > MAX_TIMEOUT_S:
            raise ValueError(
                f"default_timeout_s must be at most {MAX_TIMEOUT_S:g} s (30 days, as an "
                f"action's timeout_s), got {self.default_timeout_s!r}"
            )
        for name in ("timeout_grace_s", "close_grace_s"):
            if not _check_number(name, getattr(self, name)) >= 0:
                raise ValueError(f"{name} must be >= 0, got {getattr(self, name)!r}")
        for name in ("keep_outcomes_s", "journal_keep_s"):
            if not _check_number(name, getattr(self, name)) > 0:
                raise ValueError(f"{name} must be positive, got {getattr(self, name)!r}")
        for name in ("journal_fsync", "exclusive_cores"):
            if not isinstance(getattr(self, name), bool):
                raise ValueError(f"{name} must be true or false, got {getattr(self, name)!r}")
        clash = shared_file(self.journal_path, self.trace_path)
        if clash is not None:
            raise ValueError(
                f"journal_path {str(self.journal_path)!r} and trace_path "
                f"{str(self.trace_path)!r} would share the file {str(clash)!r}: each would "
                "overwrite the other's (give them different paths)"
            )


def _path(name: str, value: object) -> Path | None:
    """``value`` as a ``Path`` (a str or another path-like taken as one), None as None, else
    ``ValueError`` naming ``name``."""
    if value is None or isinstance(value, Path):
        return value
    if isinstance(value, str | os.PathLike) and os.fspath(value):
        return Path(value)
    raise ValueError(f"{name} must be a path (or None), got {value!r}")


def _check_count(name: str, value: object) -> None:
    """``ValueError`` naming ``name`` unless ``value`` is an integer >= 1. A boolean is no
    count: ``max_pending=True`` was an admission bound of 1."""
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise ValueError(f"{name} must be an integer >= 1, got {value!r}")


def _check_number(name: str, value: object) -> float:
    """``value`` when it is a number, else ``ValueError`` naming ``name``: a boolean is no
    number of seconds or gigabytes, and a string was a bare ``TypeError`` from a comparison."""
    if isinstance(value, bool) or not isinstance(value, int | float):
        raise ValueError(f"{name} must be a number, got {type(value).__name__} {value!r}")
    return value


def shared_file(journal: Path | None, trace: Path | None) -> Path | None:
    """A file both the journal at ``journal`` (its database, write-ahead logs, lock and
    SQLite's side files) and the trace at ``trace`` (the file, and the stream it is written
    from) would write, or None. Why: with one path for both, the trace's header overwrote
    the database and SQLite's checkpoints the trace's rows, silently, and neither could be
    read back."""
    if journal is None or trace is None:
        return None
    from tangram.exec.runtime.journal import journal_files
    from tangram.exec.runtime.recorder import stream_path

    trace_files = {trace, stream_path(trace) or trace}
    resolved = {_resolved(p): p for p in trace_files}
    for path in journal_files(journal):
        if _resolved(path) in resolved:
            return path
    return None


def _resolved(path: Path) -> Path:
    try:
        return path.resolve()
    except (OSError, RuntimeError):
        return path.absolute()
