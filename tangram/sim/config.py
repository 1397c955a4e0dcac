"""Simulation parameters as dataclasses (the CLI and TOML files fill them)."""

from __future__ import annotations

import argparse
import math
from dataclasses import dataclass, field

from tangram.core.cluster_file import MAX_CORES_PER_NODE, MAX_NODES
from tangram.core.policies import make_policy
from tangram.core.resources import H2D_GBPS_MIN
from tangram.trace.gpu_calibration import GpuCalibration
from tangram.trace.row import TIME_MAX_S

#: Most warm pods a run may keep: one per core of the largest cluster a file may describe
#: (a pod requests at least one core). The pods are a list built at the start: 10**9 of them
#: took minutes and gigabytes before the first event.
WARM_PODS_MAX = MAX_NODES * MAX_CORES_PER_NODE

#: Largest execution-noise sigma (``exec_noise_sigma``, ``gpu_exec_noise_sigma``). The noise
#: multiplies a duration by a log-normal factor of mean 1, so its median is exp(-sigma^2/2)
#: and its variance exp(sigma^2) - 1. At 3 the median factor is 1.1% (a hundred-fold
#: underestimate is the typical draw) and the variance about 8,100, so a run of ten thousand
#: actions still averages near its curves. Past it the noise degenerates: nearly every
#: duration shrinks to nothing while a rare draw carries the whole mean (at 50 the median is
#: exp(-1250), 0 in floating point: every action ran in no time, silently). The spreads
#: measured from live runs (``tangram replay``) lie below 1.
EXEC_NOISE_SIGMA_MAX = 3.0


@dataclass(frozen=True)
class Overheads:
    """System costs the simulator adds to actions. Defaults come from this project's benchmarks.

    ``aoe_grant_s``: writing and reverting a container's cgroup for one action (grant+revoke,
    direct cgroup writes; ``tangram bench aoe``). ``container_start_s``: creating a
    trajectory's container; AOE creates it when the trajectory opens, overlapped with the first
    generation. EOE restore time comes from the
    cluster file (model bytes / host-to-GPU bandwidth + fixed cost); ``eviction_s`` is paid per
    service evicted to make room. ``exec_noise_sigma`` makes real durations deviate from the
    curve (log-normal, seeded), so policies are tested against estimates that are wrong.

    The static Kubernetes baselines pay their own costs (``tangram.sim.pods``): a pod is
    created when it is granted its cores (at the trajectory's open, or later when it waited for
    capacity) and runs its first action ``pod_start_s`` after that. ``pod_start_s`` defaults to
    the Kubernetes pod-startup SLO (p99 <= 5 s for stateless pods, image pulls excluded:
    kubernetes/community sig-scalability/slos/pod_startup_latency.md), which makes every pod
    pay the bound, not a typical draw; the sensitivity experiment varies it from 0 to 60 s.
    ``image_pull_s`` is paid by the first container or pod on each CPU node (the image is
    cached there afterwards, as with ``imagePullPolicy: IfNotPresent``), by AOE and the pods
    alike; 0 assumes images pre-pulled. ``warm_pods`` pods are kept started ahead of demand:
    a granted pod takes a ready one and pays no startup, and each one taken is replaced,
    ready ``pod_start_s`` later. (Warm pods' own CPU requests are not charged to the cluster:
    a simplification in the baseline's favour.)
    """

    aoe_grant_s: float = 0.0005
    container_start_s: float = 1.0
    eviction_s: float = 0.01
    api_call_s: float = 0.0
    exec_noise_sigma: float = 0.0
    #: The GPU calls' own noise sigma (their spread differs from CPU work's: a replay measures
    #: each); None: ``exec_noise_sigma`` for every action.
    gpu_exec_noise_sigma: float | None = None
    pod_start_s: float = 5.0
    image_pull_s: float = 0.0
    warm_pods: int = 0
    #: Added to every GPU call (the executor's dispatch: thread hand-off, admission, release);
    #: a calibration (``tangram calibrate gpu``) measures it. 0: none, as before.
    gpu_call_s: float = 0.0
    #: The simulated restore's copy bandwidth (GB/s) and fixed part (s); None: the cluster
    #: file's ``h2d_gbps`` / ``restore_fixed_s`` (the core's own estimate, as before).
    gpu_h2d_gbps: float | None = None
    gpu_restore_fixed_s: float | None = None
    #: Share of a thread pool's speed lost while its threads outnumber its cores (context
    #: switches, cache and lock-holder effects of time-slicing), for both kinds of
    #: oversubscription the simulator runs: a burstable pod's threads on its CFS share
    #: (``tangram.sim.cfs``, the parallel phase) and a ``tangram`` action told more threads
    #: than its grant (``Start.threads``, its whole run at that grant, so this side is charged
    #: more). 0, the default: time-slicing is free, as both models assumed before; the
    #: robustness benchmark varies it (``--oversubscription``).
    oversubscription_slowdown: float = 0.0

    def __post_init__(self) -> None:
        for name in (
            "gpu_call_s",
            "aoe_grant_s",
            "container_start_s",
            "eviction_s",
            "api_call_s",
            "exec_noise_sigma",
            "pod_start_s",
            "image_pull_s",
        ):
            _require_finite(f"overheads.{name}", getattr(self, name), optional=False)
        for name in ("gpu_restore_fixed_s", "gpu_exec_noise_sigma"):
            _require_finite(f"overheads.{name}", getattr(self, name), optional=True)
        _require_finite("overheads.gpu_h2d_gbps", self.gpu_h2d_gbps, optional=True, positive=True)
        if self.gpu_h2d_gbps is not None and self.gpu_h2d_gbps < H2D_GBPS_MIN:
            raise ValueError(  # (a GPU node's floor: a restore at less takes no finite time)
                f"overheads.gpu_h2d_gbps must be None or >= {H2D_GBPS_MIN:g} GB/s, as a GPU "
                f"node's h2d_gbps, got {self.gpu_h2d_gbps!r}"
            )
        for name in ("exec_noise_sigma", "gpu_exec_noise_sigma"):
            _require_noise_sigma(f"overheads.{name}", getattr(self, name))
        slowdown = self.oversubscription_slowdown
        if not _is_number(slowdown) or not 0 <= slowdown < 1:
            raise ValueError(
                f"overheads.oversubscription_slowdown must lie in [0, 1), got {slowdown!r}"
            )
        if (
            isinstance(self.warm_pods, bool)
            or not isinstance(self.warm_pods, int)
            or not 0 <= self.warm_pods <= WARM_PODS_MAX
        ):
            raise ValueError(
                f"overheads.warm_pods must be an integer in [0, {WARM_PODS_MAX}] (a pod per "
                f"core of the largest cluster file), got {self.warm_pods!r}"
            )


def _require_noise_sigma(name: str, sigma: float | None) -> None:
    """Refuse a noise sigma past ``EXEC_NOISE_SIGMA_MAX`` (already a finite number >= 0 or
    None), saying why: its draws turn nearly every duration into nothing."""
    if sigma is not None and sigma > EXEC_NOISE_SIGMA_MAX:
        median = math.exp(-0.5 * sigma**2)
        raise ValueError(
            f"{name} must be <= {EXEC_NOISE_SIGMA_MAX:g}, got {sigma!r}: the log-normal "
            f"factor's median exp(-sigma^2/2) would be {median:.3g}, nearly every duration "
            f"shrunk to nothing while rare draws keep the mean at 1"
        )


def _is_number(value: object) -> bool:
    """An int or float, not a bool (``True`` is an int to Python, never a duration here)."""
    return isinstance(value, int | float) and not isinstance(value, bool)


def _require_finite(name: str, value: object, *, optional: bool, positive: bool = False) -> None:
    """Refuse ``value`` unless it is a finite number >= 0 (> 0 where ``positive``; or None
    where ``optional``), and at most ``TIME_MAX_S`` for a time (a name ending in ``_s``).

    Infinity passes a plain ``>= 0`` test, then stalls the simulation or turns its figures
    into inf/NaN; NaN fails every comparison. Both are refused here, naming the field. A time
    past a trace's longest swallows every duration added to it (a container start of 1e300 s
    reported 0 busy core-seconds), as a trace's own times would.
    """
    if optional and value is None:
        return
    finite = _is_number(value) and math.isfinite(value)  # type: ignore[arg-type]
    if finite and name.endswith("_s") and value > TIME_MAX_S:  # type: ignore[operator]
        raise ValueError(
            f"{name} must be <= {TIME_MAX_S:g} seconds (a trace's longest time), got {value!r}"
        )
    if finite and (value > 0 or (value == 0 and not positive)):  # type: ignore[operator]
        return
    either = "None or " if optional else ""
    bound = "> 0" if positive else ">= 0"
    raise ValueError(f"{name} must be {either}a number {bound} and finite, got {value!r}")


@dataclass(frozen=True)
class RolloutConfig:
    """Closed-loop rollout: a step's trajectories run, then the model trains for ``train_s``."""

    train_s: float = 0.0
    #: "closed": trajectories alternate generation and actions (trace order and gen times);
    #: "open": every action arrives at its trace ``arrival_s`` regardless of the others.
    mode: str = "closed"
    #: Closed loop: the trainer tells the scheduler when the step's last action is submitted
    #: (``Scheduler.submissions_done``; a synchronous RL trainer knows its batch and each
    #: trajectory's last call), so the default's GPU rule stops amortising restores over
    #: calls that will not come. False: the core never learns it (as live, unless the trainer
    #: calls ``POST /v1/submissions``). Open loop never announces.
    announce_step_end: bool = True

    def __post_init__(self) -> None:
        if self.mode not in ("closed", "open"):
            raise ValueError(f"rollout.mode must be 'closed' or 'open', got {self.mode!r}")
        if not isinstance(self.announce_step_end, bool):
            raise ValueError(
                f"rollout.announce_step_end must be true or false, got {self.announce_step_end!r}"
            )
        _require_finite("rollout.train_s", self.train_s, optional=False)
        if self.mode == "open" and self.train_s > 0:
            # Open loop has no steps to train after: the phase was ignored without a word.
            raise ValueError(
                f"rollout.train_s (--train-s) is the training after each closed-loop step; an "
                f"open-loop replay (rollout.mode=open) has none, got train_s={self.train_s!r}"
            )


@dataclass(frozen=True)
class SimConfig:
    policy: str = "tangram"
    seed: int = 0
    overheads: Overheads = field(default_factory=Overheads)
    rollout: RolloutConfig = field(default_factory=RolloutConfig)
    #: Record cluster usage after every event (for utilisation plots and held resource-seconds);
    #: off saves time and memory, and held figures become NaN.
    timeline: bool = True
    #: What the GPUs hold when the run starts. True (``"once"``): every GPU service of the
    #: trace resident once (a run in steady state: EOE keeps models after use, and the static
    #: baselines deploy their replicas before the run), placed largest first on the emptiest
    #: GPUs at the smallest cell its memory allows. ``"plan"``: the replicas the declared
    #: demand sizes (``size_replicas``, what ``sglang-sized`` deploys) resident, for every
    #: policy: the static baseline's head start given to all, as after steps that warmed the
    #: pool to the load. False: cold GPUs.
    warm_gpus: bool | str = True
    #: Where a trajectory's container goes: "policy" (the core places it, at its open or its
    #: first CPU action) or "observed" (on the node a live run recorded, ``obs_node``, when the
    #: trace has one and the cluster has that node). A replay of a live run uses "observed":
    #: live, containers are placed when trajectories open, an event the trace does not keep.
    placement: str = "policy"
    #: Measured GPU call models, one per service (``tangram.sim.gpu_model``): each prices its
    #: service's calls (dispatch overhead, restore, call time vs cell size and host load)
    #: instead of ``overheads``' GPU figures. Empty: none, as before.
    gpu_calibrations: tuple[GpuCalibration, ...] = ()

    def __post_init__(self) -> None:
        if not warm_gpus_known(self.warm_gpus):
            raise ValueError(f"warm_gpus must be true, false or 'plan', got {self.warm_gpus!r}")
        if self.placement not in PLACEMENTS:
            raise ValueError(f"placement must be one of {list(PLACEMENTS)}, got {self.placement!r}")
        services = [c.service for c in self.gpu_calibrations]
        if len(set(services)) != len(services):
            raise ValueError(f"gpu_calibrations: one record per service, got {services}")


#: ``SimConfig.warm_gpus`` values besides true and false (``"once"`` is ``True``'s name).
WARM_GPUS = ("once", "plan")


#: The ``--warm-gpus`` choices of ``tangram sim`` and ``tangram bench robustness``, as
#: ``SimConfig.warm_gpus`` values.
WARM_GPUS_FLAG: dict[str, bool | str] = {"once": True, "plan": "plan", "cold": False}


def warm_gpus_flag(value: bool | str) -> str:
    """The ``--warm-gpus`` choice that gives the ``SimConfig.warm_gpus`` ``value``."""
    if isinstance(value, str):
        return value
    return "once" if value else "cold"


def warm_gpus_known(value: object) -> bool:
    """Whether ``value`` is a ``SimConfig.warm_gpus`` (a bool, not a number equal to one)."""
    return isinstance(value, bool) or (isinstance(value, str) and value in WARM_GPUS)


#: ``SimConfig.placement`` values.
PLACEMENTS = ("policy", "observed")


def policy_arg(text: str) -> str:
    """An argparse type for a policy name (``name`` or ``name:K``), returned as typed: an
    unknown one, or a bad ``:K``, is refused naming the flag before anything runs. It was
    refused later naming no flag ("unknown policy 'bogus'"), under ``tangram bench
    robustness`` after its progress bar had started."""
    try:
        make_policy(text)
    except ValueError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None
    return text
