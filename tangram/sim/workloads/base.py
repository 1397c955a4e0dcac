"""Shared pieces of the workload generators: seeded streams, distributions, ids, metadata.

Every random quantity a generator draws comes from its own named stream. A stream's seed is
derived from the generator seed and a stable hash of the stream's name (not from the order in
which streams are created), so changing one distribution's parameters, or adding a new
distribution, leaves every other stream's draws unchanged.
"""

from __future__ import annotations

import dataclasses
import json
import math
import zlib
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import Any

import numpy as np

from tangram.trace import Trace, TraceError, TraceRow
from tangram.trace.row import TIME_MAX_S

#: Bump when a generator's algorithm changes so that the same seed no longer gives the same trace.
GENERATOR_VERSION = 1

#: z-score of the 90th percentile of a standard normal (to turn p50/p90 into a log-normal sigma).
Z90 = 1.2815515655446004

#: When a reward or judge runs (a workload's ``*_sync`` parameter) -> the trace row's ``sync``
#: value: "trajectory" right after its trajectory's rollout (None: not held), "step" once every
#: trajectory of the step has finished its rollout (batch-synchronous).
REWARD_SYNCS: dict[str, str | None] = {"trajectory": None, "step": "step"}

#: Generated times are rounded to this many decimals (microseconds): exact JSON round trips and
#: compact files, far below any scheduling effect.
TIME_DECIMALS = 6


def streams(seed: int, names: Iterable[str]) -> dict[str, np.random.Generator]:
    """One independent generator per name, seeded from (seed, crc32(name))."""
    return {
        name: np.random.default_rng(
            np.random.SeedSequence(entropy=seed, spawn_key=(zlib.crc32(name.encode()),))
        )
        for name in names
    }


def sigma_from_p50_p90(p50: float, p90: float) -> float:
    """Log-space standard deviation of the log-normal with this median and 90th percentile."""
    return math.log(p90 / p50) / Z90


def lognormal_median(
    rng: np.random.Generator, median: float, sigma: float, size: int
) -> np.ndarray:
    """Log-normal draws with the given median and log-space sigma."""
    return median * np.exp(sigma * rng.standard_normal(size))


def lognormal_mean(rng: np.random.Generator, mean: float, sigma: float, size: int) -> np.ndarray:
    """Log-normal draws with the given mean and log-space sigma (median = mean / e^(s^2/2))."""
    return lognormal_median(rng, mean * math.exp(-0.5 * sigma * sigma), sigma, size)


def counts_lognormal(
    rng: np.random.Generator, median: float, sigma: float, lo: int, hi: int, size: int
) -> np.ndarray:
    """Integer counts: a log-normal rounded to the nearest integer and clipped to [lo, hi]."""
    return np.clip(np.rint(lognormal_median(rng, median, sigma, size)), lo, hi).astype(np.int64)


#: Largest cap a count parameter (``*_max``: actions, searches per trajectory) may take:
#: far beyond any RL max-turns limit, and small enough for ``expected_count`` to sum quickly.
COUNT_MAX = 100_000


def expected_count(median: float, sigma: float, lo: int, hi: int) -> float:
    """E[counts_lognormal(...)], exactly, from the log-normal CDF (used to derive scales).

    The sum stops at the first count whose upper CDF is 1.0 in floats: every later term is
    k * (1.0 - 1.0) = 0, so the total is bit for bit the full sum's, in O(where the mass ends)
    rather than O(hi)."""

    def cdf(x: float) -> float:
        if x <= 0:
            return 0.0
        if sigma == 0:
            return 1.0 if x >= median else 0.0
        return 0.5 * (1.0 + math.erf(math.log(x / median) / (sigma * math.sqrt(2.0))))

    total = 0.0
    for k in range(lo, hi + 1):
        below = 0.0 if k == lo else cdf(k - 0.5)
        above = 1.0 if k == hi else cdf(k + 0.5)
        total += k * (above - below)
        if above == 1.0:
            break
    return total


def times(values: np.ndarray, *, positive: bool = True) -> list[float]:
    """Seconds rounded to microseconds as Python floats; ``positive`` keeps them > 0."""
    out = np.round(values, TIME_DECIMALS)
    if positive:
        out = np.maximum(out, 10.0**-TIME_DECIMALS)
    return [float(x) for x in out]


def trajectory_id(step: int, index: int) -> str:
    return f"s{step}-t{index:05d}"


def action_id(step: int, index: int, position: int) -> str:
    return f"s{step}-t{index:05d}-a{position:03d}"


def row(task: str, step: int, index: int, position: int, kind: str, **fields: Any) -> TraceRow:
    """One generated action: ids from (step, trajectory index, position), the rest as given."""
    return TraceRow(
        action_id=action_id(step, index, position),
        trajectory=trajectory_id(step, index),
        step=step,
        position=position,
        task=task,
        kind=kind,
        **fields,
    )


def meta_for(name: str, params: Any, *, batch: int, steps: int, seed: int) -> dict[str, Any]:
    """Trace metadata: workload, every parameter, batch, steps, seed and provenance.

    Passed through JSON so the in-memory trace equals the one read back from a file.
    """
    meta = {
        "workload": name,
        "params": dataclasses.asdict(params),
        "batch": batch,
        "steps": steps,
        "seed": seed,
        "source": f"generated by tangram.sim.workloads.{name}",
        "generator_version": GENERATOR_VERSION,
    }
    return json.loads(json.dumps(meta))


#: Most trajectories one generated trace may hold (batch x steps): far beyond an RL step (the
#: paper's 1536), and a few GB of rows (about 30 actions and 1.4 ms of generation each); a
#: batch of 10**8 ran for hours, silently, on its way to running out of memory.
TRAJECTORIES_MAX = COUNT_MAX


def check_run_args(batch: int, steps: int, seed: int) -> None:
    for label, value, minimum in (("batch", batch, 1), ("steps", steps, 1), ("seed", seed, 0)):
        if isinstance(value, bool) or not isinstance(value, int) or value < minimum:
            raise ValueError(f"{label} must be an integer >= {minimum}, got {value!r}")
    if batch * steps > TRAJECTORIES_MAX:
        raise ValueError(
            f"batch x steps must be at most {TRAJECTORIES_MAX:,} trajectories, got {batch} x "
            f"{steps} = {batch * steps:,}"
        )


@dataclass(frozen=True)
class Workload:
    """A registered generator: its parameter dataclass, default batch and the function.

    Calling it, ``workload(params, batch=..., steps=..., seed=...)``, returns a :class:`Trace`.
    """

    name: str
    params_type: type
    default_batch: int
    fn: Callable[..., Trace]
    description: str
    #: The default batch drawn per seed, ``(params, seed) -> batch``, where the generator's
    #: instances each draw their own (``random``: instance ``seed`` of the robustness
    #: benchmark is then ``--workload random --seed seed``); None: ``default_batch``.
    batch_for: Callable[[Any, int], int] | None = None

    def __call__(
        self, params: Any = None, *, batch: int | None = None, steps: int = 1, seed: int = 0
    ) -> Trace:
        params = self.params_type() if params is None else params
        if not isinstance(params, self.params_type):
            raise TypeError(
                f"{self.name} takes {self.params_type.__name__}, got {type(params).__name__}"
            )
        if batch is None:
            batch = self.default_batch if self.batch_for is None else self.batch_for(params, seed)
        check_run_args(batch, steps, seed)
        try:
            return self.fn(params, batch=batch, steps=steps, seed=seed)
        except TraceError as exc:
            raise ValueError(self._drew_past_the_format(params, exc)) from None

    def _drew_past_the_format(self, params: Any, exc: TraceError) -> str:
        """Why a generation failed: settings each within bounds can draw a time the trace
        format refuses (``exec_mean_s=1e9`` draws some t1_s > 1e9 s; a sigma of 40 draws
        generations of 1e15 s). The bare TraceError named a generated field, never the
        settings behind it: name those that differ from the defaults."""
        defaults = self.params_type()
        changed = [
            f"{f.name}={getattr(params, f.name)!r}"
            for f in dataclasses.fields(params)
            if getattr(params, f.name) != getattr(defaults, f.name)
        ]
        settings = (
            f"the settings changed from the defaults: {', '.join(changed)}"
            if changed
            else "at the default settings"
        )
        return f"workload {self.name!r} drew an action the trace format refuses ({exc}); {settings}"

    def params_with(self, **overrides: Any) -> Any:
        """Default parameters with some replaced; an unknown name is a clear error."""
        known = {f.name for f in dataclasses.fields(self.params_type)}
        unknown = sorted(set(overrides) - known)
        if unknown:
            raise ValueError(
                f"workload {self.name!r} has no parameter {unknown[0]!r}; "
                f"its parameters: {', '.join(sorted(known))}"
            )
        return dataclasses.replace(self.params_type(), **overrides)


def require(ok: bool, name: str, problem: str) -> None:
    """Parameter validation helper: raises ValueError naming the parameter."""
    if not ok:
        raise ValueError(f"{name}: {problem}")


def require_finite(params: Any, prefix: str = "") -> None:
    """Every number of a parameter dataclass (or in a tuple field) is finite, and every time
    (a field ending in ``_s``) at most the trace format's ``TIME_MAX_S``: an infinite or
    overflowing setting would otherwise fail later, as a numpy overflow or as an error
    naming a generated trace field instead of the setting. Run first in ``__post_init__``."""
    for f in dataclasses.fields(params):
        value = getattr(params, f.name)
        items = value if isinstance(value, tuple) else (value,)
        for item in items:
            if isinstance(item, bool) or not isinstance(item, int | float):
                continue
            name = f"{prefix}{f.name}"
            require(_finite(item), name, f"must be a finite number, got {item!r}")
            if f.name.endswith("_s"):
                require(
                    item <= TIME_MAX_S,
                    name,
                    f"must be <= {TIME_MAX_S:g} seconds (a trace's longest time), got {item!r}",
                )


def _finite(value: float) -> bool:
    """True for a finite number (an integer too large for a float is not)."""
    try:
        return math.isfinite(value)
    except OverflowError:
        return False


def require_count_max(params: Any, name: str) -> None:
    """A count cap parameter lies in [1, ``COUNT_MAX``]."""
    value = getattr(params, name)
    require(1 <= value <= COUNT_MAX, name, f"must lie in [1, {COUNT_MAX}], got {value!r}")
