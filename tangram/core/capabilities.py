"""What a policy declares about itself, so the scheduler never has to probe it.

A policy carries one ``Capabilities`` record: whether it keeps the cluster's capacity (the lower
bound does not), whether it decides only about queued actions (so a pass with nothing waiting
may be skipped), and, for such a policy, what its pass would decide for a lone CPU arrival into
an empty queue (so the scheduler may decide that without queueing it). The shortcuts these
allow are switched in ``tangram.core.fastpaths``.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, TypeAlias

if TYPE_CHECKING:
    from tangram.core.options import Options
    from tangram.core.state import CpuNodeState

#: (the action's node, its options) -> the (units, reason) its pass would start it with, or
#: None when its pass would start nothing. (A lone arrival's pass depends on nothing else: the
#: node's free cores and the action's options; the scheduler builds no pass for it.)
AloneRule: TypeAlias = "Callable[[CpuNodeState, Options], tuple[int, str] | None]"


@dataclass(frozen=True)
class Capabilities:
    """A policy's promises to the scheduler (the defaults promise the least)."""

    #: False for a policy that ignores capacity (the lower bound): its starts hold nothing,
    #: containers are not placed, nothing is checked for fit, no node caps an action's units.
    respects_capacity: bool = True
    #: Its pass decides only about queued actions: completions that free units where nothing
    #: waits, with no arrival, decide nothing, so the scheduler may skip that pass.
    queue_driven: bool = False
    #: What its pass decides for a lone CPU arrival into an empty queue (queue-driven only).
    alone: AloneRule | None = None
    #: Its CPU starts share their node's cycles as CFS does (``RuleTraits.shares_cpu``).
    cpu_shared: bool = False
    #: Its CPU grants are weights, lending idle cycles (``RuleTraits.lends_idle``).
    cpu_lends_idle: bool = False
    #: Its passes may resize running malleable actions (``RuleTraits.resizes``): a completion
    #: or lone arrival on a node where one runs needs the full pass.
    resizes: bool = False
    #: It reads the scheduler's ``ArrivalStats`` (``RuleTraits.tracks_arrivals``), which the
    #: scheduler keeps only then.
    tracks_arrivals: bool = False

    def __post_init__(self) -> None:
        if self.alone is not None and not self.queue_driven:
            raise ValueError("a lone-arrival rule ('alone') needs a queue-driven policy")
