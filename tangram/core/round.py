"""The outcome of one elastic round over a domain (shared by the rules that adjust it)."""

from __future__ import annotations

from typing import NamedTuple

from tangram.core.action import Action


class Round(NamedTuple):
    """The outcome of one domain's allocation and eviction (a NamedTuple: one per pass)."""

    kept: list[Action]
    units: list[int]
    evicted: list[Action]
    method: str
    estimate: float
    estimate_without_eviction: float
