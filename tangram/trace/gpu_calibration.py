"""A GPU service's calibration record: what a live measurement says a call costs.

``tangram calibrate gpu`` (``tangram.exec.eoe.calibrate``) measures, on the live executor,
the per-call overhead (the hand-off to the executor's thread and back, admission, release),
the restore time (host-to-device copy per GB and its fixed part) and the call time per cell
size with 0..N of the host's cores busy with other work (a CPU-backed device, or a model whose
call needs the host's CPU, shares the host's cores with the CPU sandboxes). The simulator
reads the record (``tangram.sim.gpu_model``) so that a replay from declared curves prices GPU
calls as the live executor does. The record sits below both drivers (``tangram.exec``
writes it, ``tangram.sim`` reads it); it is JSON (or the same keys as TOML) on disk.
"""

from __future__ import annotations

import json
import tomllib
from collections.abc import Mapping
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from tangram.core.resources import H2D_GBPS_MIN
from tangram.trace.errors import TOO_DEEP, TraceError, loads_unique, other_encoding
from tangram.trace.row import TIME_MAX_S, is_nonnegative_number

#: The record's format version (``version`` on disk).
GPU_CALIBRATION_VERSION = 1
#: Shortest call time a record may hold (s; as a replayed duration's floor): a shorter one is
#: no measurement, and 1e-320 s made a slow-down (loaded / idle) infinite or 0, which the
#: replay then failed on as "math domain error" or a ZeroDivisionError.
CALL_S_MIN = 1e-6


class CalibrationError(ValueError):
    """A calibration record that cannot be used, with the field at fault named."""


def _number(where: str, value: Any, *, positive: bool = False) -> float:
    """``value`` as a finite float >= 0 (> 0 if ``positive``), else a CalibrationError; a time
    (a name ending in ``_s`` or ``seconds``) at most ``TIME_MAX_S``, as a trace's times: a call
    overhead of 1e300 s swallowed every duration added to it."""
    if not is_nonnegative_number(value) or (positive and value == 0):
        bound = "> 0" if positive else ">= 0"
        raise CalibrationError(f"{where} must be a finite number {bound}, got {value!r}")
    if where.endswith(("_s", "seconds")) and value > TIME_MAX_S:
        raise CalibrationError(
            f"{where} must be <= {TIME_MAX_S:g} seconds (a trace's longest time), got {value!r}"
        )
    return float(value)


@dataclass(frozen=True)
class CallTime:
    """The median call time (s) at ``dop`` GPUs with ``busy_cores`` host cores busy."""

    dop: int
    busy_cores: float
    seconds: float

    def __post_init__(self) -> None:
        if isinstance(self.dop, bool) or not isinstance(self.dop, int) or self.dop < 1:
            raise CalibrationError(f"call_times: dop must be an integer >= 1, got {self.dop!r}")
        _number("call_times: busy_cores", self.busy_cores)
        _number("call_times: seconds", self.seconds, positive=True)
        if self.seconds < CALL_S_MIN:
            raise CalibrationError(
                f"call_times: seconds must be >= {CALL_S_MIN:g} (a shorter call time is no "
                f"measurement), got {self.seconds!r}"
            )


@dataclass(frozen=True)
class CallOverhead:
    """The mean per-call overhead (s) of calls started with ``busy_cores`` host cores busy."""

    busy_cores: float
    seconds: float

    def __post_init__(self) -> None:
        _number("call_overheads: busy_cores", self.busy_cores)
        _number("call_overheads: seconds", self.seconds)


@dataclass(frozen=True)
class GpuCalibration:
    """One service's measured GPU call model (see the module docstring).

    ``host_cpu_node`` / ``gpu_node``: the cluster's CPU node whose cores the calls share and
    the GPU node measured (None: the calls do not share a CPU node's cores; the simulator
    then applies no contention).

    ``host_cores_per_gpu``: the host cores a running call keeps busy per GPU of its cell (a
    CPU-backed device computing on one thread per GPU: 1; a real accelerator: 0, the
    default). The host's busy cores at a call's start (``busy_cores`` of ``call_times``) are
    then the cores CPU actions hold there plus this many per GPU of ``gpu_node`` running
    another call: two CPU-backed calls share the host's cores with each other as with the
    CPU sandboxes.

    ``call_overheads``: the per-call overhead measured live with that many host cores busy
    (the hand-off to the executor's thread waits for a core when the host's are all busy:
    0.5 ms with at most one of this machine's two cores busy, 2.3 ms with both, means of the
    quiet issue-11 run); ``call_overhead_s`` (measured idle) is the busy-0 point unless one is
    given. Empty (the default): ``call_overhead_s`` at every load."""

    service: str
    backend: str
    call_overhead_s: float
    restore_gbps: float
    restore_fixed_s: float
    host_cores: int
    call_times: tuple[CallTime, ...]
    host_cpu_node: str | None = None
    gpu_node: str | None = None
    host_cores_per_gpu: float = 0.0
    call_overheads: tuple[CallOverhead, ...] = ()
    version: int = GPU_CALIBRATION_VERSION

    def __post_init__(self) -> None:
        if not isinstance(self.service, str) or not self.service:
            raise CalibrationError(f"service must be a non-empty string, got {self.service!r}")
        if not isinstance(self.backend, str) or not self.backend:
            raise CalibrationError(f"backend must be a non-empty string, got {self.backend!r}")
        _number("call_overhead_s", self.call_overhead_s)
        _number("restore_gbps", self.restore_gbps, positive=True)
        if self.restore_gbps < H2D_GBPS_MIN:  # (a GPU node's floor: a restore stays finite)
            raise CalibrationError(
                f"restore_gbps must be >= {H2D_GBPS_MIN:g} GB/s, as a GPU node's h2d_gbps "
                f"(a restore at less would take no finite time), got {self.restore_gbps!r}"
            )
        _number("restore_fixed_s", self.restore_fixed_s)
        if (
            isinstance(self.host_cores, bool)
            or not isinstance(self.host_cores, int)
            or self.host_cores < 1
        ):
            raise CalibrationError(f"host_cores must be an integer >= 1, got {self.host_cores!r}")
        if self.version != GPU_CALIBRATION_VERSION:
            raise CalibrationError(
                f"version {self.version!r} is not supported (this Tangram reads "
                f"{GPU_CALIBRATION_VERSION})"
            )
        _number("host_cores_per_gpu", self.host_cores_per_gpu)
        levels = [p.busy_cores for p in self.call_overheads if isinstance(p, CallOverhead)]
        if len(levels) != len(self.call_overheads):
            raise CalibrationError("call_overheads must hold CallOverhead records")
        if len(set(levels)) != len(levels):
            raise CalibrationError("call_overheads: two points at the same busy_cores")
        for key in ("host_cpu_node", "gpu_node"):
            node = getattr(self, key)
            if node is not None and (not isinstance(node, str) or not node):
                # A number or a list reached the simulator's node lookup: a misleading
                # "names GPU node 5" or a TypeError traceback (a list is unhashable).
                raise CalibrationError(f"{key} must be a non-empty node name, got {node!r}")
        if (self.host_cpu_node is None) != (self.gpu_node is None):
            raise CalibrationError("host_cpu_node and gpu_node must be given together or neither")
        seen: set[tuple[int, float]] = set()
        for point in self.call_times:
            if not isinstance(point, CallTime):
                raise CalibrationError(f"call_times must hold CallTime records, got {point!r}")
            key = (point.dop, point.busy_cores)
            if key in seen:
                raise CalibrationError(
                    f"call_times: two points at dop {point.dop}, busy_cores {point.busy_cores}"
                )
            seen.add(key)
        for dop in self.dops:
            if not any(p.busy_cores == 0 for p in self._points(dop)):
                raise CalibrationError(
                    f"call_times: dop {dop} has no point with busy_cores 0 (the idle time "
                    "every slow-down is relative to)"
                )
        if not self.call_times:
            raise CalibrationError("call_times must hold at least one point")

    @property
    def dops(self) -> tuple[int, ...]:
        return tuple(sorted({p.dop for p in self.call_times}))

    def _points(self, dop: int) -> list[CallTime]:
        return sorted((p for p in self.call_times if p.dop == dop), key=lambda p: p.busy_cores)

    def _nearest_dop(self, dop: int) -> int:
        """``dop`` if measured, else the largest measured below it (else the smallest)."""
        below = [d for d in self.dops if d <= dop]
        return below[-1] if below else self.dops[0]

    def call_s(self, dop: int, busy_cores: float = 0.0) -> float:
        """The call time at ``dop`` with ``busy_cores`` busy: linear between measured points,
        flat beyond the last; an unmeasured DoP reads the largest measured one below it."""
        points = self._points(self._nearest_dop(dop))
        if busy_cores <= points[0].busy_cores:
            return points[0].seconds
        for lo, hi in zip(points, points[1:], strict=False):
            if busy_cores <= hi.busy_cores:
                w = (busy_cores - lo.busy_cores) / (hi.busy_cores - lo.busy_cores)
                return lo.seconds + w * (hi.seconds - lo.seconds)
        return points[-1].seconds

    def overhead_s(self, busy_cores: float = 0.0) -> float:
        """The per-call overhead with ``busy_cores`` busy: linear between the points of
        ``call_overheads`` (``call_overhead_s`` at 0 unless measured there), flat beyond."""
        points = sorted((p.busy_cores, p.seconds) for p in self.call_overheads)
        if not points or points[0][0] > 0:
            points.insert(0, (0.0, self.call_overhead_s))
        if busy_cores <= points[0][0]:
            return points[0][1]
        for (b0, t0), (b1, t1) in zip(points, points[1:], strict=False):
            if busy_cores <= b1:
                return t0 + (busy_cores - b0) / (b1 - b0) * (t1 - t0)
        return points[-1][1]

    def slowdown(self, dop: int, busy_cores: float) -> float:
        """How much longer a call at ``dop`` takes with ``busy_cores`` busy than idle."""
        return self.call_s(dop, busy_cores) / self.call_s(dop, 0.0)

    def restore_s(self, size_gb: float, shards: int = 1) -> float:
        """Restore time of ``size_gb`` split over ``shards`` GPUs copied concurrently."""
        return size_gb / (shards * self.restore_gbps) + self.restore_fixed_s

    # --- on disk ------------------------------------------------------------------------------

    def to_dict(self) -> dict[str, Any]:
        out = asdict(self)
        out["call_times"] = [asdict(p) for p in self.call_times]
        if not self.host_cores_per_gpu:  # the default: records written before it read the same
            del out["host_cores_per_gpu"]
        if self.call_overheads:
            out["call_overheads"] = [asdict(p) for p in self.call_overheads]
        else:
            del out["call_overheads"]
        return {k: v for k, v in out.items() if v is not None}

    @classmethod
    def from_dict(cls, data: Mapping[str, Any], where: str = "calibration") -> GpuCalibration:
        """The record from its dict form; a CalibrationError names the field at fault."""
        if not isinstance(data, Mapping):
            raise CalibrationError(f"{where}: expected a table, got {type(data).__name__}")
        fields = set(cls.__dataclass_fields__)
        unknown = sorted(set(data) - fields)
        if unknown:
            raise CalibrationError(f"{where}: unknown field(s) {unknown}; known: {sorted(fields)}")
        required = {"service", "backend", "call_overhead_s", "restore_gbps"}
        required |= {"restore_fixed_s", "host_cores", "call_times"}
        missing = sorted(required - set(data))
        if missing:
            raise CalibrationError(f"{where}: missing field(s) {missing}")
        raw = data["call_times"]
        if not isinstance(raw, list | tuple):
            raise CalibrationError(f"{where}: call_times must be a list of tables")
        points = []
        for i, p in enumerate(raw):
            if not isinstance(p, Mapping) or set(p) != {"dop", "busy_cores", "seconds"}:
                raise CalibrationError(
                    f"{where}: call_times[{i}] must have exactly dop, busy_cores, seconds; "
                    f"got {p!r}"
                )
            try:
                points.append(CallTime(p["dop"], p["busy_cores"], p["seconds"]))
            except CalibrationError as exc:
                raise CalibrationError(f"{where}: call_times[{i}]: {exc}") from None
        raw = data.get("call_overheads", [])
        if not isinstance(raw, list | tuple):
            raise CalibrationError(f"{where}: call_overheads must be a list of tables")
        overheads = []
        for i, p in enumerate(raw):
            if not isinstance(p, Mapping) or set(p) != {"busy_cores", "seconds"}:
                raise CalibrationError(
                    f"{where}: call_overheads[{i}] must have exactly busy_cores, seconds; got {p!r}"
                )
            try:
                overheads.append(CallOverhead(p["busy_cores"], p["seconds"]))
            except CalibrationError as exc:
                raise CalibrationError(f"{where}: call_overheads[{i}]: {exc}") from None
        try:
            return cls(
                **{**dict(data), "call_times": tuple(points), "call_overheads": tuple(overheads)}
            )
        except CalibrationError as exc:
            raise CalibrationError(f"{where}: {exc}") from None

    def write(self, path: str | Path) -> Path:
        """Write the record as JSON to ``path``."""
        path = Path(path)
        path.write_text(json.dumps(self.to_dict(), indent=2) + "\n")
        return path


def load_gpu_calibration(path: str | Path) -> GpuCalibration:
    """Read a record from a ``.json`` or ``.toml`` file."""
    path = Path(path)
    try:
        text = path.read_text(encoding="utf-8-sig")  # (a byte-order mark may open it)
    except OSError as exc:
        raise CalibrationError(f"{path}: cannot read the calibration: {exc}") from None
    except UnicodeDecodeError as exc:  # JSON and TOML are UTF-8; the bare error named no file
        if why := other_encoding(path.read_bytes()[:4]):  # (UTF-16: "not UTF-8 text (byte 0)")
            raise CalibrationError(f"{path}: {why}; a calibration record is JSON or TOML") from None
        raise CalibrationError(
            f"{path}: not UTF-8 text (byte {exc.start}): a calibration record is JSON or TOML"
        ) from None
    try:
        data = tomllib.loads(text) if path.suffix == ".toml" else loads_unique(text)
    except (json.JSONDecodeError, tomllib.TOMLDecodeError) as exc:
        raise CalibrationError(
            f"{path}: not valid {path.suffix.lstrip('.') or 'JSON'}: {exc}"
        ) from None
    except TraceError as exc:  # a repeated key (JSON would keep its last value), or too deep
        key = f"key {exc.field!r}: " if exc.field else ""
        raise CalibrationError(f"{path}: {key}{exc.reason}") from None
    except RecursionError:  # (TOML arrays nested past the parser's recursion)
        raise CalibrationError(f"{path}: {TOO_DEEP.replace('JSON', 'TOML')}") from None
    return GpuCalibration.from_dict(data, str(path))
