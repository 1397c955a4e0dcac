"""The closing words of ``tangram sim``: the default policy against each other policy, in words.

The default policy is the first ``tangram*`` policy run (else the first). Each other policy gets
one sentence: per figure, how many times lower or higher the default's is (the values are in
the table). A
figure both policies have at 0 (held GPU-s of a CPU-only workload) is left out; one at 0 on one
side only is worded ("0 vs 12.5"), never printed as a ratio of 0 or infinity, and so is one
that is infinite or whose ratio leaves float's range (figures of 1e-300 and 1e300; a cluster's
restore bandwidth, which once made a restore take forever at 1e-307 GB/s, is now held to
``H2D_GBPS_MIN``); one that is unknown (NaN: no action ran, or the
timeline was off) is said to be unknown. A ratio past 100,000 is written in 3 digits.
"""

from __future__ import annotations

import math
import textwrap
from collections.abc import Collection, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from tangram.report import format_number

WIDTH = 100


@dataclass(frozen=True)
class Figure:
    """A compared summary figure: its key, how it is named, and the words for less and more."""

    key: str
    label: str
    less: str
    more: str
    unit: str = ""
    #: The resource the figure counts (None: every action's): left out of a run whose trace
    #: has no such action, as the table leaves out its column.
    resource: str | None = None


FIGURES: tuple[Figure, ...] = (
    Figure("act_mean_s", "mean ACT", "lower", "higher", " s"),
    Figure("act_p99_s", "p99 ACT", "lower", "higher", " s"),
    Figure("step_mean_s", "step", "shorter", "longer", " s"),
    Figure("held_core_s", "held core-s", "fewer", "more", resource="cpu"),
    Figure("held_gpu_s", "held GPU-s", "fewer", "more", resource="gpu"),
    Figure("cost_usd", "cost", "lower", "higher", " USD"),
)

#: Ratios within this relative distance of 1 are said to be "the same".
SAME = 0.005


def default_index(rows: Sequence[Mapping[str, Any]]) -> int:
    """Index of the default policy: the first whose name starts with ``tangram``, else 0."""
    for i, row in enumerate(rows):
        if str(row["policy"]).startswith("tangram"):
            return i
    return 0


def _number(value: Any) -> float:
    try:
        return float(value)
    except (TypeError, ValueError):
        return math.nan


def phrase(figure: Figure, ours: Any, theirs: Any) -> str | None:
    """How ``ours`` compares with ``theirs`` for one figure, in words; None if both are 0."""
    a, b = _number(ours), _number(theirs)
    if math.isnan(a) or math.isnan(b):
        if math.isnan(a) and math.isnan(b):
            return f"{figure.label} unknown for both"
        # Ours first, as in "0 vs 12.5": the unknown side reads "-".
        if math.isnan(a):
            return f"{figure.label} unknown for ours (- vs {format_number(b)}{figure.unit})"
        return f"{figure.label} unknown for theirs ({format_number(a)}{figure.unit} vs -)"
    if a == 0 and b == 0:
        return None
    ratio = b / a if a != 0 else math.inf
    if a == 0 or b == 0 or math.isinf(a) or math.isinf(b) or ratio in (0.0, math.inf):
        return f"{figure.label} {format_number(a)} vs {format_number(b)}{figure.unit}"
    if abs(ratio - 1) <= SAME:
        return f"{figure.label} the same"
    if ratio > 1:
        return f"{figure.label} {_times(ratio)}x {figure.less}"
    return f"{figure.label} {_times(1 / ratio)}x {figure.more}"


def _times(ratio: float) -> str:
    """A ratio > 1 for the closing words: 2 decimals, 3 digits past 100,000 (not 300)."""
    return f"{ratio:.2f}" if ratio < 1e5 else f"{ratio:.3g}"


def sentence(
    ours: Mapping[str, Any],
    theirs: Mapping[str, Any],
    resources: Collection[str] | None = None,
) -> str:
    """One policy against another: every figure that applies (``resources``: those the trace
    uses; None: all), and the rejections if any."""
    head = f"{ours['policy']} vs {theirs['policy']}: "
    ran_ours = int(ours["actions"]) - int(ours["rejected"])
    ran_theirs = int(theirs["actions"]) - int(theirs["rejected"])
    if ran_ours == 0 or ran_theirs == 0:
        idle = [r["policy"] for r, n in ((ours, ran_ours), (theirs, ran_theirs)) if n == 0]
        return head + f"{' and '.join(idle)} rejected every action: no ACT to compare"
    figures = [
        f for f in FIGURES if resources is None or f.resource is None or f.resource in resources
    ]
    parts = [p for f in figures if (p := phrase(f, ours[f.key], theirs[f.key])) is not None]
    if int(ours["rejected"]) or int(theirs["rejected"]):
        parts.append(
            f"rejected {ours['rejected']} vs {theirs['rejected']} of {ours['actions']} "
            "(ACT is over the actions that ran)"
        )
    return head + ", ".join(parts)


def closing_lines(
    rows: Sequence[Mapping[str, Any]],
    width: int = WIDTH,
    resources: Collection[str] | None = None,
) -> list[str]:
    """The default policy against each other policy, one wrapped sentence each; held figures
    only for the ``resources`` the trace uses (a GPU-only trace's held core-s, 0 for a policy
    and unknown for ``lower-bound``, read "held core-s unknown for theirs (0.000 vs -)")."""
    if len(rows) < 2:
        return []
    d = default_index(rows)
    lines: list[str] = []
    for i, row in enumerate(rows):
        if i != d:
            lines += textwrap.wrap(
                sentence(rows[d], row, resources), width=width, subsequent_indent="  "
            )
    return lines
