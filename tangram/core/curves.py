"""Elasticity curves: how long an action takes on m units of its key elastic resource.

A curve maps units -> seconds. The paper writes T(m) = T1 / (E(m) * m) with E(m) in (0, 1];
every curve here refuses, on construction, a shape where more units would make the action
slower (T non-increasing <=> E(m) * m non-decreasing), because the allocator relies on it.
Curves serialise to plain dicts (``to_dict`` / ``curve_from_dict``) so traces can carry them.
"""

from __future__ import annotations

import bisect
import math
import numbers
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

#: Relative slack when checking monotonicity, so float noise in profiled points is not fatal.
_REL_TOL = 1e-9


class CurveError(ValueError):
    """A curve whose parameters are invalid or would make more units slower."""


class ElasticityCurve:
    """Base class: ``duration(units)`` in seconds for integer ``units >= 1``."""

    kind: str = "abstract"

    def duration(self, units: int) -> float:  # pragma: no cover - interface
        raise NotImplementedError

    #: True when T is convex in the units for any unit grid (so the check can be skipped).
    always_convex: bool = False

    def durations(self, units: Sequence[int]) -> tuple[float, ...]:
        """``duration`` for many unit counts at once (subclasses vectorise it)."""
        return tuple(self.duration(u) for u in units)

    def convex_on(self, units: Sequence[int]) -> bool:
        """``is_convex_on`` with a shortcut for curve families that are always convex."""
        return self.always_convex or self.is_convex_on(units)

    @property
    def t1(self) -> float:
        """Time on one unit."""
        return self.duration(1)

    def speedup(self, units: int) -> float:
        """S(m) = T(1) / T(m) = E(m) * m."""
        return self.t1 / self.duration(units)

    def efficiency(self, units: int) -> float:
        """E(m) = S(m) / m."""
        return self.speedup(units) / units

    def is_convex_on(self, units: Sequence[int]) -> bool:
        """True when the per-unit gain of each step along ``units`` never increases.

        Convex T (equivalently a concave speedup m*E(m), since 1/x is convex and decreasing)
        is what makes the marginal-gain allocation exactly optimal for a sum of durations.
        """
        gains = []
        for lo, hi in zip(units, units[1:], strict=False):
            gains.append((self.duration(lo) - self.duration(hi)) / (hi - lo))
        return all(b <= a * (1 + 1e-9) + 1e-12 for a, b in zip(gains, gains[1:], strict=False))

    def to_dict(self) -> dict[str, Any]:  # pragma: no cover - interface
        raise NotImplementedError


#: The smallest normal float, ``sys.float_info.min`` written out (the core imports only what
#: tests/test_layering.py allows).
MIN_NORMAL_S = 2.0**-1022


def _check_positive(name: str, value: float) -> float:
    if not isinstance(value, int | float) or isinstance(value, bool):
        raise CurveError(f"{name} must be a number, got {value!r}")
    if not math.isfinite(value) or value <= 0:
        raise CurveError(f"{name} must be a positive finite number of seconds, got {value!r}")
    if value < MIN_NORMAL_S:
        # A subnormal time: an Amdahl curve's parallel part over m units underflows to 0 s.
        raise CurveError(f"{name} must be at least {MIN_NORMAL_S:g} s, got {value!r}")
    return float(value)


@dataclass(frozen=True)
class Inelastic(ElasticityCurve):
    """One fixed duration whatever the units (an API call, a single-threaded tool)."""

    seconds: float
    kind: str = field(default="inelastic", init=False)
    always_convex = True

    def __post_init__(self) -> None:
        _check_positive("inelastic duration", self.seconds)

    def duration(self, units: int) -> float:
        _check_units(units)
        return self.seconds

    def durations(self, units: Sequence[int]) -> tuple[float, ...]:
        return (self.seconds,) * len(units)

    def to_dict(self) -> dict[str, Any]:
        return {"kind": self.kind, "t1": self.seconds}


@dataclass(frozen=True)
class Amdahl(ElasticityCurve):
    """T(m) = T1 * (s + (1 - s) / m): a serial fraction s and a perfectly parallel rest."""

    t1_seconds: float
    serial_fraction: float
    kind: str = field(default="amdahl", init=False)
    #: T1 (s + (1 - s)/m) is convex in m: the marginal gain T1 (1 - s) / (m (m + 1)) falls.
    always_convex = True

    def __post_init__(self) -> None:
        _check_positive("amdahl t1", self.t1_seconds)
        s = self.serial_fraction
        if not isinstance(s, int | float) or not 0.0 <= s <= 1.0:
            raise CurveError(f"amdahl serial_fraction must lie in [0, 1], got {s!r}")

    @classmethod
    def prevalidated(cls, t1_seconds: float, serial_fraction: float) -> Amdahl:
        """A curve from parameters a validating record already checked (a trace row: t1 > 0
        and finite, s in [0, 1]); skips ``__post_init__``, as the replay builds one per action."""
        curve = object.__new__(cls)
        object.__setattr__(
            curve,
            "__dict__",
            {"t1_seconds": t1_seconds, "serial_fraction": serial_fraction, "kind": "amdahl"},
        )
        return curve

    def duration(self, units: int) -> float:
        _check_units(units)
        s = self.serial_fraction
        return self.t1_seconds * (s + (1.0 - s) / units)

    @property
    def t1(self) -> float:
        """Time on one unit: ``duration(1)``'s arithmetic without its calls (the CPU queue
        order reads it for every newcomer's key and drain)."""
        s = self.serial_fraction
        return self.t1_seconds * (s + (1.0 - s) / 1)

    def durations(self, units: Sequence[int]) -> tuple[float, ...]:
        if units and units[0] < 1:
            _check_units(units[0])
        t1, s = self.t1_seconds, self.serial_fraction
        serial, parallel = t1 * s, t1 * (1.0 - s)
        return tuple([serial + parallel / u for u in units])

    def to_dict(self) -> dict[str, Any]:
        return {"kind": self.kind, "t1": self.t1_seconds, "serial_fraction": self.serial_fraction}


@dataclass(frozen=True)
class Tabulated(ElasticityCurve):
    """Profiled (units, seconds) points; between them, monotone (PCHIP-like) interpolation.

    Interpolation is done on the speedup against log2(units) with Fritsch-Carlson slopes, so it
    never overshoots: a monotone table gives a monotone curve. Beyond the last point the curve
    stays flat (no extrapolated speedup that was never measured).
    """

    points: tuple[tuple[int, float], ...]
    kind: str = field(default="tabulated", init=False)

    def __post_init__(self) -> None:
        if len(self.points) < 1:
            raise CurveError("tabulated curve needs at least one (units, seconds) point")
        pts = sorted((_whole_units("tabulated curve", u), float(t)) for u, t in self.points)
        units = [u for u, _ in pts]
        if units[0] != 1:
            raise CurveError(
                f"tabulated curve must include units=1 (time on one unit); got units {units}"
            )
        if len(set(units)) != len(units):
            raise CurveError(f"tabulated curve has repeated units: {units}")
        for u, t in pts:
            _check_positive(f"tabulated duration at {u} units", t)
        for (u0, t0), (u1, t1) in zip(pts, pts[1:], strict=False):
            if t1 > t0 * (1 + _REL_TOL):
                raise CurveError(
                    f"more units would make the action slower: {t0:g}s at {u0} units but "
                    f"{t1:g}s at {u1} units (E(m)*m must not decrease)"
                )
        object.__setattr__(self, "points", tuple(pts))
        # Knots of the interpolation (speedup against log2 units), computed once.
        xs = [math.log2(u) for u in units]
        ys = [pts[0][1] / t for _, t in pts]
        slopes = _pchip_slopes(xs, ys)
        if not all(map(math.isfinite, ys + slopes)):
            # The interpolation would give NaN durations (even on one unit).
            raise CurveError(
                f"tabulated curve's speed-ups overflow a float: {pts[0][1]:g}s at 1 unit "
                f"against {min(t for _, t in pts):g}s"
            )
        object.__setattr__(self, "_knots", (xs, ys, slopes))

    def duration(self, units: int) -> float:
        _check_units(units)
        pts = self.points
        if units >= pts[-1][0]:
            return pts[-1][1]
        xs, ys, slopes = self._knots  # type: ignore[attr-defined]
        x = math.log2(units)
        i = bisect.bisect_right(xs, x) - 1
        h = xs[i + 1] - xs[i]
        tt = (x - xs[i]) / h
        m0, m1 = slopes[i] * h, slopes[i + 1] * h
        h00, h10 = 2 * tt**3 - 3 * tt**2 + 1, tt**3 - 2 * tt**2 + tt
        h01, h11 = -2 * tt**3 + 3 * tt**2, tt**3 - tt**2
        speedup = h00 * ys[i] + h10 * m0 + h01 * ys[i + 1] + h11 * m1
        return pts[0][1] / speedup

    def to_dict(self) -> dict[str, Any]:
        return {"kind": self.kind, "points": [[u, t] for u, t in self.points]}


def _pchip_slopes(xs: list[float], ys: list[float]) -> list[float]:
    """Fritsch-Carlson monotone cubic slopes (what scipy's PchipInterpolator uses)."""
    n = len(xs)
    if n == 1:
        return [0.0]
    deltas = [(ys[i + 1] - ys[i]) / (xs[i + 1] - xs[i]) for i in range(n - 1)]
    if n == 2:
        return [deltas[0], deltas[0]]
    slopes = [0.0] * n
    for i in range(1, n - 1):
        d0, d1 = deltas[i - 1], deltas[i]
        if d0 * d1 <= 0:
            slopes[i] = 0.0
        else:
            w1 = 2 * (xs[i + 1] - xs[i]) + (xs[i] - xs[i - 1])
            w2 = (xs[i + 1] - xs[i]) + 2 * (xs[i] - xs[i - 1])
            slopes[i] = (w1 + w2) / (w1 / d0 + w2 / d1)
    for end, d, dn in (
        (0, deltas[0], deltas[1] if n > 2 else deltas[0]),
        (n - 1, deltas[-1], deltas[-2] if n > 2 else deltas[-1]),
    ):
        slopes[end] = 0.0 if d == 0 else d
        if d * dn < 0 or d == 0:
            slopes[end] = 0.0
    return slopes


def _check_units(units: int) -> None:
    if units < 1:
        raise CurveError(f"units must be >= 1, got {units}")


@dataclass(frozen=True)
class FitReport:
    """A fitted curve with its goodness of fit (relative RMS error over the points)."""

    curve: ElasticityCurve
    rel_rms_error: float
    points: tuple[tuple[int, float], ...]


def fit_amdahl(measurements: Sequence[tuple[int, float]]) -> FitReport:
    """Fit T(m) = a + b / m (a = T1 * s, b = T1 * (1 - s)) to measured (units, seconds).

    Bounded least squares (scipy) with a, b >= 0 keeps the fit physical: a fitted curve can
    never make more units slower. Imported lazily so the core stays importable with numpy only.
    """
    from scipy.optimize import lsq_linear  # local: the core itself needs only numpy

    if len(measurements) < 2:
        raise CurveError("fitting needs at least two (units, seconds) measurements")
    pts = tuple(sorted((_whole_units("measurement", u), float(t)) for u, t in measurements))
    for u, t in pts:
        if u < 1:
            raise CurveError(f"measurement at units={u}: units must be >= 1")
        _check_positive(f"measured duration at {u} units", t)
    if len({u for u, _ in pts}) < 2:
        raise CurveError("fitting needs measurements at two or more distinct unit counts")
    # Relative residuals: weight each row by 1/t so short and long points count alike.
    a_mat = [[1.0 / t, 1.0 / (u * t)] for u, t in pts]
    rhs = [1.0] * len(pts)
    sol = lsq_linear(a_mat, rhs, bounds=([0.0, 0.0], [math.inf, math.inf]), method="bvls")
    a, b = (float(x) for x in sol.x)
    if a + b <= 0:
        raise CurveError(f"fit degenerated to a zero-duration curve on {pts}")
    curve = Amdahl(t1_seconds=a + b, serial_fraction=a / (a + b))
    errs = [(curve.duration(u) - t) / t for u, t in pts]
    return FitReport(curve, math.sqrt(sum(e * e for e in errs) / len(errs)), pts)


def _whole_units(what: str, units: Any) -> int:
    """A point's units as an int: a whole number, not a bool (int() made 1.5 units 1 and
    True 1, so a point was read at a unit count it was never measured at)."""
    if isinstance(units, bool) or not isinstance(units, numbers.Integral):
        raise CurveError(
            f"{what}: units must be a whole number (an integer), "
            f"got {type(units).__name__} {units!r}"
        )
    return int(units)


def _curve_number(kind: str, key: str, value: Any) -> float:
    """A curve dict's number as a float: a JSON number, not a string or a boolean."""
    if isinstance(value, bool) or not isinstance(value, int | float):
        raise CurveError(
            f"{kind} curve: {key!r} must be a number, got {type(value).__name__} {value!r}"
        )
    try:
        return float(value)
    except OverflowError:
        raise CurveError(f"{kind} curve: {key!r} is too large, got {value!r}") from None


def _curve_points(value: Any) -> tuple[tuple[int, float], ...]:
    """A tabulated curve's ``points``: [units, seconds] pairs, units a whole number."""
    if not isinstance(value, list | tuple):
        raise CurveError(
            f"tabulated curve: 'points' must be a list of [units, seconds] pairs, "
            f"got {type(value).__name__} {value!r}"
        )
    out = []
    for i, point in enumerate(value):
        if not isinstance(point, list | tuple) or len(point) != 2:
            raise CurveError(
                f"tabulated curve: points[{i}] must be a [units, seconds] pair, got {point!r}"
            )
        units, secs = point
        if isinstance(units, bool) or not isinstance(units, int):
            raise CurveError(
                f"tabulated curve: points[{i}] units must be a whole number (an integer), "
                f"got {type(units).__name__} {units!r}"
            )
        out.append((units, _curve_number("tabulated", f"points[{i}] seconds", secs)))
    return tuple(out)


#: Each curve kind's keys (besides ``kind``), all required: what ``to_dict`` writes.
_CURVE_KEYS: Mapping[str, tuple[str, ...]] = {
    "inelastic": ("t1",),
    "amdahl": ("t1", "serial_fraction"),
    "tabulated": ("points",),
}

_CURVE_BUILDERS: Mapping[str, Callable[[Mapping[str, Any]], ElasticityCurve]] = {
    "inelastic": lambda d: Inelastic(_curve_number("inelastic", "t1", d["t1"])),
    "amdahl": lambda d: Amdahl(
        _curve_number("amdahl", "t1", d["t1"]),
        _curve_number("amdahl", "serial_fraction", d["serial_fraction"]),
    ),
    "tabulated": lambda d: Tabulated(_curve_points(d["points"])),
}


def curve_from_dict(data: Mapping[str, Any]) -> ElasticityCurve:
    """Rebuild a curve from ``to_dict`` output, exactly its keys with values of their types;
    names the unknown kind, the missing or unknown key, or the malformed value."""
    kind = data.get("kind")
    if not isinstance(kind, str) or kind not in _CURVE_BUILDERS:
        raise CurveError(f"unknown curve kind {kind!r}; known: {sorted(_CURVE_BUILDERS)}")
    keys = _CURVE_KEYS[kind]
    missing = [k for k in keys if k not in data]
    if missing:
        raise CurveError(f"{kind} curve is missing key {missing[0]!r}")
    unknown = [str(k) for k in data if k != "kind" and k not in keys]
    if unknown:
        raise CurveError(
            f"{kind} curve has unknown key {unknown[0]!r} (its keys: 'kind', "
            f"{', '.join(repr(k) for k in keys)})"
        )
    try:
        return _CURVE_BUILDERS[kind](data)
    except (TypeError, ValueError) as exc:
        if isinstance(exc, CurveError):
            raise
        raise CurveError(f"{kind} curve has a malformed value: {exc}") from None
