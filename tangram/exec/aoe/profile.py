"""Profiling a command's CPU elasticity: run it at 1..N cores, fit an Amdahl curve.

Each core count runs the command ``repeat`` times (after ``warmup`` untimed runs) in one
container, granted that many NUMA-local cores; the duration of a run is the action's
``exec_s`` (the command plus the transport's round trip, about 2 ms with the runner), and a
point is the median of its runs. ``tangram.core.curves.fit_amdahl`` turns the points into the
curve traces and the simulator read (``curve.to_dict()``).
"""

from __future__ import annotations

import statistics
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

from tangram.core.curves import FitReport, fit_amdahl
from tangram.exec.aoe.errors import AoeError
from tangram.exec.aoe.manager import AoeManager
from tangram.exec.aoe.topology import choose_cores


@dataclass(frozen=True)
class ProfilePoint:
    """The runs at one core count and their median."""

    cores: int
    runs: tuple[float, ...]

    @property
    def median_s(self) -> float:
        return statistics.median(self.runs)


@dataclass(frozen=True)
class CpuProfile:
    """A command's measured durations by core count and the Amdahl curve fitted to them."""

    command: str | tuple[str, ...]
    image: str
    points: tuple[ProfilePoint, ...]
    fit: FitReport

    def rows(self) -> list[dict[str, Any]]:
        t1 = self.points[0].median_s
        return [
            {
                "cores": p.cores,
                "median_s": p.median_s,
                "min_s": min(p.runs),
                "max_s": max(p.runs),
                "runs": len(p.runs),
                "speedup": t1 / p.median_s,
                "fitted_s": self.fit.curve.duration(p.cores),
            }
            for p in self.points
        ]

    def to_dict(self) -> dict[str, Any]:
        return {
            "command": self.command if isinstance(self.command, str) else list(self.command),
            "image": self.image,
            "points": self.rows(),
            "curve": self.fit.curve.to_dict(),
            "rel_rms_error": self.fit.rel_rms_error,
        }


def profile_command(
    manager: AoeManager,
    command: str | Sequence[str],
    *,
    max_cores: int | None = None,
    repeat: int = 3,
    warmup: int = 1,
    timeout_s: float = 600.0,
    image: str | None = None,
    memory_gb: float | None = None,
    progress: Callable[[int, int, float], None] | None = None,
) -> CpuProfile:
    """Measure ``command`` at 1..``max_cores`` cores (default: every core of the node)."""
    total = len(manager.topology.cores)
    top = total if max_cores is None else max_cores
    if not 1 <= top <= total:
        raise AoeError(f"max_cores must be in [1, {total}] on this node, got {max_cores}")
    if top < 2:
        raise AoeError("fitting a curve needs at least two core counts: max_cores must be >= 2")
    if repeat < 1 or warmup < 0:
        raise AoeError(f"repeat must be >= 1 and warmup >= 0, got {repeat} and {warmup}")
    traj = f"profile-{manager.session[:8]}"
    handle = manager.open_trajectory(traj, memory_gb, image=image)
    try:
        points = []
        for m in range(1, top + 1):
            cores = choose_cores(manager.topology, manager.topology.cores, m)
            assert cores is not None
            runs = []
            for i in range(warmup + repeat):
                out = manager.run_action(traj, command, cores, timeout_s=timeout_s)
                if not out.ok:
                    tail = out.stderr.decode(errors="replace").strip()[-400:]
                    raise AoeError(f"the command failed at {m} core(s): {out.error}\n{tail}")
                if i >= warmup:
                    runs.append(out.timings["exec_s"])
                    if progress:
                        progress(m, len(runs), out.timings["exec_s"])
            points.append(ProfilePoint(m, tuple(runs)))
    finally:
        manager.close_trajectory(traj)
    fit = fit_amdahl([(p.cores, p.median_s) for p in points])
    cmd = command if isinstance(command, str) else tuple(command)
    return CpuProfile(cmd, handle.image, tuple(points), fit)
