"""``RuntimeConfig``: the live runtime's knobs (policy, admission bound, defaults)."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from tangram.core.policies import make_policy


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
      the deadline) may take to report before the runtime declares the time-out itself.
    - ``close_grace_s``: at shutdown, how long running actions may take to end.
    - ``keep_outcomes``: finished outcomes kept for polling (oldest dropped beyond it; the
      trace keeps every action regardless).
    - ``trace_path``: where the trace is written at shutdown (None: not written).
    """

    policy: str = "tangram"
    max_pending: int = 4096
    default_timeout_s: float = 600.0
    default_memory_gb: float = 1.0
    timeout_grace_s: float = 10.0
    close_grace_s: float = 30.0
    keep_outcomes: int = 200_000
    trace_path: Path | None = None

    def __post_init__(self) -> None:
        policy = make_policy(self.policy)  # raises ValueError naming the known policies
        if getattr(policy, "unbounded", False):
            raise ValueError(
                f"policy {self.policy!r} ignores capacity (a floor for reports, not a schedule); "
                "the live runtime needs a policy that respects the cluster"
            )
        if not isinstance(self.max_pending, int) or self.max_pending < 1:
            raise ValueError(f"max_pending must be a positive integer, got {self.max_pending!r}")
        for name in ("default_timeout_s", "default_memory_gb"):
            if not getattr(self, name) > 0:
                raise ValueError(f"{name} must be positive, got {getattr(self, name)!r}")
        for name in ("timeout_grace_s", "close_grace_s"):
            if not getattr(self, name) >= 0:
                raise ValueError(f"{name} must be >= 0, got {getattr(self, name)!r}")
        if self.keep_outcomes < 1:
            raise ValueError(f"keep_outcomes must be >= 1, got {self.keep_outcomes!r}")
