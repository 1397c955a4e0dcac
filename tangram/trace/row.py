"""A trace row (format v1): one action, every field checked on construction.

``docs/trace-format.md`` is the schema's reference. Building a row validates it, so a row in
memory is always valid and its errors name the offending field; the readers add the file and
the line or row index.
"""

from __future__ import annotations

import json
import math
import numbers
from collections.abc import Mapping
from dataclasses import MISSING, dataclass, fields
from pathlib import Path
from typing import Any

from tangram.core.cells import CELL_SIZES
from tangram.core.curves import (
    MIN_NORMAL_S,
    Amdahl,
    CurveError,
    ElasticityCurve,
    Inelastic,
    curve_from_dict,
)
from tangram.trace.errors import TraceError

RESOURCES = ("cpu", "gpu", "api")
#: ``sync`` values: "step" = the action arrives once every trajectory of its step reached it.
SYNCS = ("step",)
OUTCOMES = ("result", "error", "timeout")

#: Relative tolerance when checking that a curve's one-unit time agrees with ``t1_s``.
_CURVE_T1_RTOL = 1e-6
#: Largest integer field value: the Parquet layout stores integers as int64.
INT_MAX = 2**63 - 1
#: Largest time a row may carry, seconds (about 31.7 years): far beyond any run, and far below
#: where float seconds stop resolving microseconds (a time of 1e300 s would swallow every
#: duration added to it and report an ACT of 0).
TIME_MAX_S = 1e9


# ---------------------------------------------------------------------------------------------
# Field checks: each returns the normalised value or raises TraceError(field=...).


def _fail(name: str, reason: str) -> TraceError:
    return TraceError(reason, field=name)


def _as_str(name: str, value: Any, *, optional: bool = False) -> str | None:
    if value is None and optional:
        return None
    if not isinstance(value, str):
        raise _fail(name, f"expected a string, got {type(value).__name__} {value!r}")
    if not value:
        raise _fail(name, "must be a non-empty string")
    return value


def is_nonnegative_number(value: Any) -> bool:
    """A finite real number >= 0 and not a bool: the check every seconds-or-size field of an
    outside record (importers, calibration) makes before it is read (one owner for the rule)."""
    if isinstance(value, bool) or not isinstance(value, numbers.Real):
        return False
    try:
        return math.isfinite(value) and value >= 0
    except OverflowError:  # an int past float's range (JSON's 1e400 is inf, 10**400 an int)
        return False


def _as_int(name: str, value: Any, *, minimum: int, optional: bool = False) -> int | None:
    if value is None and optional:
        return None
    if isinstance(value, bool) or not isinstance(value, numbers.Integral):
        raise _fail(name, f"expected an integer, got {type(value).__name__} {value!r}")
    value = int(value)
    if value < minimum:
        raise _fail(name, f"must be >= {minimum}, got {value}")
    if value > INT_MAX:
        raise _fail(name, f"must be <= {INT_MAX} (the format's integers are int64), got {value}")
    return value


def _as_float(
    name: str, value: Any, *, positive: bool = False, optional: bool = False
) -> float | None:
    if value is None and optional:
        return None
    if isinstance(value, bool) or not isinstance(value, numbers.Real):
        raise _fail(name, f"expected a number, got {type(value).__name__} {value!r}")
    try:
        value = float(value)
    except OverflowError:  # a JSON integer past float's range (10**400; 1e400 reads as inf)
        raise _fail(name, "must be a finite number, got an integer past float's range") from None
    if not math.isfinite(value):
        raise _fail(name, f"must be a finite number, got {value!r}")
    if positive and value <= 0:
        raise _fail(name, f"must be > 0 seconds, got {value!r}")
    if positive and value < MIN_NORMAL_S:  # (as the core's curves: a subnormal time underflows)
        raise _fail(
            name,
            f"must be at least {MIN_NORMAL_S:g} seconds (a subnormal time underflows to 0 s "
            f"over several units), got {value!r}",
        )
    if value < 0:
        what = "a time" if name.endswith("_s") else "a size"
        raise _fail(name, f"must be >= 0 ({what} cannot be negative), got {value!r}")
    if name.endswith("_s") and value > TIME_MAX_S:
        raise _fail(
            name, f"must be <= {TIME_MAX_S:g} seconds (the format's longest time), got {value!r}"
        )
    return value


@dataclass(frozen=True)
class TraceRow:
    """One action of a trace (format v1). Construction validates every field.

    Times are seconds, at most ``TIME_MAX_S``; integers fit the Parquet layout's int64
    (``INT_MAX``). ``t1_s`` is the action's execution time on one unit of its key elastic
    ``resource``; how it scales with more units is ``serial_fraction`` (Amdahl) or ``curve``
    (a dict from ``ElasticityCurve.to_dict()``); with neither the action is inelastic.
    ``gen_before_s`` is the LLM generation that precedes the action on the training cluster
    (not managed by Tangram); ``gen_after_s`` the generation after a trajectory's last action.
    ``arrival_s`` set means an open-loop trace (absolute submission times); ``None`` means the
    rollout model decides arrivals. ``sync="step"`` (closed loop) holds the action, once its
    generation is done, until every trajectory of its step has reached its own ``sync`` action
    or ended: a batch-synchronous reward or judge. ``malleable`` (v3, CPU only): the program
    uses whatever cores it is given while it runs, up to ``max_units`` (see ``Action.malleable``).
    ``service_replicas`` (v3, GPU only): the service runs as whole replicas, one per GPU of its
    cell, not as size/k shards (``Action.service_replicas``). ``obs_*`` fields are what a live
    run observed (``None`` in
    generated traces).
    """

    action_id: str
    trajectory: str
    step: int
    position: int
    task: str
    kind: str
    gen_before_s: float
    resource: str
    t1_s: float
    max_units: int
    serial_fraction: float | None = None
    curve: dict[str, Any] | None = None
    service: str | None = None
    service_size_gb: float = 0.0
    memory_gb: float = 0.0
    arrival_s: float | None = None
    gen_after_s: float = 0.0
    sync: str | None = None
    malleable: bool = False
    service_replicas: bool = False
    obs_arrival_s: float | None = None
    obs_units: int | None = None
    obs_queue_s: float | None = None
    obs_overhead_s: float | None = None
    obs_exec_s: float | None = None
    obs_outcome: str | None = None
    obs_node: str | None = None

    def __post_init__(self) -> None:
        put = object.__setattr__
        for name in ("action_id", "trajectory", "task", "kind"):
            put(self, name, _as_str(name, getattr(self, name)))
        put(self, "step", _as_int("step", self.step, minimum=0))
        put(self, "position", _as_int("position", self.position, minimum=0))
        put(self, "gen_before_s", _as_float("gen_before_s", self.gen_before_s))
        if self.resource not in RESOURCES:
            raise _fail("resource", f"must be one of {list(RESOURCES)}, got {self.resource!r}")
        put(self, "resource", str(self.resource))  # a ResourceKind becomes its plain value
        put(self, "t1_s", _as_float("t1_s", self.t1_s, positive=True))
        put(self, "max_units", _as_int("max_units", self.max_units, minimum=1))
        if self.resource == "gpu" and self.max_units not in CELL_SIZES:
            raise _fail(
                "max_units",
                f"a gpu action's max_units must be a power of two <= 8 {list(CELL_SIZES)}, "
                f"got {self.max_units}",
            )
        if self.resource == "api" and self.max_units != 1:
            raise _fail("max_units", f"an api action takes one call slot (1), got {self.max_units}")
        self._check_elasticity()
        put(self, "service", _as_str("service", self.service, optional=True))
        if self.resource in ("gpu", "api") and self.service is None:
            raise _fail(
                "service", f"a {self.resource} action must name its service (model or endpoint)"
            )
        for name in ("service_size_gb", "memory_gb", "gen_after_s"):
            put(self, name, _as_float(name, getattr(self, name)))
        for name in ("arrival_s", "obs_arrival_s", "obs_queue_s", "obs_overhead_s", "obs_exec_s"):
            put(self, name, _as_float(name, getattr(self, name), optional=True))
        if self.sync is not None and self.sync not in SYNCS:
            raise _fail("sync", f"must be one of {list(SYNCS)} or null, got {self.sync!r}")
        if not isinstance(self.malleable, bool):
            raise _fail("malleable", f"must be true or false, got {self.malleable!r}")
        if self.malleable and self.resource != "cpu":
            raise _fail(
                "malleable", f"only a cpu action can be malleable, not a {self.resource} one"
            )
        if not isinstance(self.service_replicas, bool):
            raise _fail("service_replicas", f"must be true or false, got {self.service_replicas!r}")
        if self.service_replicas and self.resource != "gpu":
            raise _fail(
                "service_replicas",
                f"only a gpu action's service has replicas, not a {self.resource} one",
            )
        put(self, "obs_units", _as_int("obs_units", self.obs_units, minimum=1, optional=True))
        self._check_obs_units()
        if self.obs_outcome is not None and self.obs_outcome not in OUTCOMES:
            raise _fail(
                "obs_outcome", f"must be one of {list(OUTCOMES)} or null, got {self.obs_outcome!r}"
            )
        put(self, "obs_node", _as_str("obs_node", self.obs_node, optional=True))

    def _check_elasticity(self) -> None:
        s, curve = self.serial_fraction, self.curve
        if s is not None:
            s = _as_float("serial_fraction", s)
            if s > 1:
                raise _fail("serial_fraction", f"must lie in [0, 1], got {s!r}")
            object.__setattr__(self, "serial_fraction", s)
        if curve is not None:
            if not isinstance(curve, Mapping):
                raise _fail(
                    "curve", f"expected an object (a curve dict), got {type(curve).__name__}"
                )
            if s is not None:
                raise _fail("curve", "give serial_fraction or curve, not both")
            try:
                built = curve_from_dict(curve)
            except CurveError as exc:
                raise _fail("curve", str(exc)) from None
            if abs(built.t1 - self.t1_s) > _CURVE_T1_RTOL * self.t1_s:
                raise _fail(
                    "curve",
                    f"the curve's time on one unit ({built.t1:g} s) differs from t1_s ({self.t1_s:g} s)",
                )
            try:  # JSON-native (lists, not tuples) so a written and re-read row compares equal
                object.__setattr__(self, "curve", json.loads(json.dumps(dict(curve))))
            except (TypeError, ValueError) as exc:
                raise _fail("curve", f"must be JSON-serialisable: {exc}") from None
        if self.resource == "api" and (
            s is not None or (curve is not None and curve.get("kind") != "inelastic")
        ):
            raise _fail(
                "serial_fraction" if s is not None else "curve",
                "an api action is inelastic; leave serial_fraction and curve empty",
            )

    def _check_obs_units(self) -> None:
        """Observed units a replay can use: a CPU or API action is never granted more than its
        ``max_units`` (a replay rescales the curve to T(obs_units) = the observed time, so
        1000 observed cores on a 1-core action would make it ~10x longer, silently); a GPU
        call runs on an aligned cell, which may be wider than ``max_units`` where its model
        needs more GPUs than that to fit (``tangram.core.cells.unit_options``)."""
        if self.obs_units is None:
            return
        if self.resource == "gpu":
            if self.obs_units not in CELL_SIZES:
                raise _fail(
                    "obs_units",
                    f"a gpu call runs on a cell of {list(CELL_SIZES)} GPUs, got {self.obs_units}",
                )
        elif self.obs_units > self.max_units:
            raise _fail(
                "obs_units",
                f"{self.obs_units} units observed but max_units is {self.max_units}: "
                f"{self.resource} grants never exceed max_units",
            )

    def curve_object(self) -> ElasticityCurve:
        """The elasticity curve: Amdahl(t1, s) if ``serial_fraction`` is set, the ``curve`` dict
        rebuilt if given, else Inelastic(t1)."""
        if self.serial_fraction is not None:  # both checked when the row was built
            return Amdahl.prevalidated(self.t1_s, self.serial_fraction)
        if self.curve is not None:
            return curve_from_dict(self.curve)
        return Inelastic(self.t1_s)


#: Field names in schema order, and which of them a row must carry.
FIELDS: tuple[str, ...] = tuple(f.name for f in fields(TraceRow))
REQUIRED: frozenset[str] = frozenset(f.name for f in fields(TraceRow) if f.default is MISSING)
_DEFAULTS: dict[str, Any] = {f.name: f.default for f in fields(TraceRow) if f.name not in REQUIRED}
#: Each optional field's default (a trace whose rows all leave a newer field at its default
#: is written as an older version).
FIELD_DEFAULTS: dict[str, Any] = dict(_DEFAULTS)


def row_from_mapping(record: Mapping[str, Any]) -> TraceRow:
    """Build a row from a mapping of field -> value, naming any missing or unknown field."""
    if not isinstance(record, Mapping):
        raise TraceError(f"a row must be a JSON object, got {type(record).__name__}")
    unknown = [k for k in record if k not in _DEFAULTS and k not in REQUIRED]
    if unknown:
        raise TraceError(
            f"unknown field (format v1 fields: {', '.join(FIELDS)})", field=str(unknown[0])
        )
    for name in FIELDS:
        if name in REQUIRED and name not in record:
            raise TraceError("missing required field", field=name)
    # An optional field given as null means its default (docs/trace-format.md): a null
    # ``memory_gb`` or ``malleable`` was refused as "expected a number" / "true or false".
    return TraceRow(**{k: v for k, v in record.items() if v is not None or k in REQUIRED})


def row_to_mapping(row: TraceRow, *, drop_defaults: bool = False) -> dict[str, Any]:
    """The row as a plain dict in schema order; optionally without fields at their defaults."""
    out = {name: getattr(row, name) for name in FIELDS}
    if drop_defaults:
        out = {k: v for k, v in out.items() if k in REQUIRED or v != _DEFAULTS[k]}
    return out


def parse_record(record: Any, where: str, path: str | Path | None) -> TraceRow:
    """A row from one record of a file or frame; its errors name ``where`` in ``path``."""
    try:
        return row_from_mapping(record)
    except TraceError as exc:
        raise exc.located(where=where, path=path) from None
    except TypeError as exc:  # pragma: no cover - row_from_mapping checks names first
        raise TraceError(str(exc), where=where, path=path) from None
