"""MOPD (multi-teacher on-policy distillation): teacher log-prob calls on GPU.

Each trajectory is one student rollout routed to one of nine teacher models by its domain;
after the student generates its response (length / decode speed: minutes for reasoning
responses, which spreads a batch's teacher calls over the step), the teacher computes
log-probs over the response (a ``teacher``
action on GPU, elastic over tensor-parallel GPUs, calling that teacher's service). Teacher
sizes are a plausible 7B-72B mix at bf16; the time on one GPU grows with the teacher's size
(prefill FLOPs are proportional to parameters). Sources: [paper] = ARL-Tangram via
``paper-notes.md``; [stats §n] = ``real-traces/latency-stats.md``; [ours] = our choice.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import numpy as np

from tangram.core.cells import CELL_SIZES
from tangram.sim.workloads.base import (
    lognormal_mean,
    lognormal_median,
    meta_for,
    require,
    require_count_max,
    require_finite,
    row,
    streams,
    times,
)
from tangram.trace import Trace, TraceRow

TASK = "mopd"


@dataclass(frozen=True)
class TeacherSpec:
    """A teacher model: its service name, size in billions of parameters, routing share."""

    name: str
    params_b: float
    share: float = 1.0

    def __post_init__(self) -> None:
        require_finite(self, prefix=f"teacher {self.name!r}: ")


#: Nine teachers [paper: "9 teacher models"]; which ones is ours: open models of 7B-72B that a
#: multi-domain distillation would plausibly use (general, math, code, reasoning), equal shares.
DEFAULT_TEACHERS: tuple[TeacherSpec, ...] = (
    TeacherSpec("qwen2.5-72b-instruct", 72.7),
    TeacherSpec("qwen2.5-math-72b-instruct", 72.7),
    TeacherSpec("qwen2.5-coder-32b-instruct", 32.8),
    TeacherSpec("qwen3-32b", 32.8),
    TeacherSpec("qwq-32b", 32.8),
    TeacherSpec("qwen2.5-14b-instruct", 14.8),
    TeacherSpec("deepseek-r1-distill-qwen-14b", 14.8),
    TeacherSpec("qwen3-8b", 8.2),
    TeacherSpec("qwen2.5-7b-instruct", 7.6),
)


#: zipf_order -> the teachers from most to least popular (stable: ties keep the listed order).
ZIPF_ORDERS: dict[str, Callable[[tuple[TeacherSpec, ...]], list[TeacherSpec]]] = {
    "largest-first": lambda ts: sorted(ts, key=lambda t: -t.params_b),
    "smallest-first": lambda ts: sorted(ts, key=lambda t: t.params_b),
    "listed": list,
}


@dataclass(frozen=True)
class MopdParams:
    """Distributions of the MOPD workload (every one seeded from its own stream)."""

    #: The teachers and their routing shares. [paper] 9 teachers; [ours] which and their sizes.
    teachers: tuple[TeacherSpec, ...] = DEFAULT_TEACHERS
    #: Bytes per parameter of the teachers' weights (bf16). [ours]
    bytes_per_param: float = 2.0
    #: Share-weighted mean time of a teacher call on one GPU, seconds. [paper] mean execution
    #: per MOPD action 0.621 s at batch 2048 (0.705 s at 3072). Taken as the one-GPU time: the
    #: paper does not say the DoP, log-prob passes parallelise poorly over GPUs, and a FLOPs
    #: estimate (2 * 32 B mean parameters * 5-9 k tokens at ~500 TFLOP/s) gives 0.6-1.2 s.
    t1_mean_s: float = 0.621
    #: Size-independent part of a teacher call's mean time (launch, tokenisation). [ours]
    t1_fixed_s: float = 0.1
    #: Log-space sigma of a call's time around its teacher's mean (sequence length). [ours]
    t1_sigma: float = 0.5
    #: Amdahl serial fraction of a log-prob pass over tensor-parallel GPUs. [ours]
    serial_fraction: float = 0.25
    #: Most GPUs a teacher call can use. [paper] the baseline gives each teacher 4 GPUs.
    max_units: int = 4
    #: Teacher calls per trajectory (one log-prob pass per student turn). [ours] 1: the paper
    #: describes one log-prob pass over each response.
    calls_per_trajectory: int = 1
    #: With several calls per trajectory, whether the teacher's server keeps the conversation's
    #: prefix cached, so a call computes only its turn's new tokens; without it, call j
    #: recomputes every turn up to j (its time scales with the tokens so far over the turn's).
    #: [SGLang RadixAttention and vLLM v1 automatic prefix caching are on by default]
    prefix_cache: bool = True
    #: Which teacher a trajectory is routed to: "shares" (each teacher's ``share``: equal by
    #: default) or "zipf" (the i-th teacher in ``zipf_order`` gets weight 1 / i^zipf_exponent).
    #: [paper] silent on routing; [ours] equal by default.
    popularity: str = "shares"
    #: Zipf exponent of the skew (1 = classic Zipf). [ours]
    zipf_exponent: float = 1.0
    #: Order of the Zipf ranking: "largest-first" (the biggest teachers most called),
    #: "smallest-first", or "listed" (the ``teachers`` order). [ours]
    zipf_order: str = "largest-first"
    #: Median student response length, tokens (the generation before each teacher call).
    #: [ours] a quarter of a 32k-token response limit, as in long-reasoning RL.
    response_tokens_median: float = 8192.0
    #: Log-space sigma of the response length. [ours]
    response_tokens_sigma: float = 0.7
    #: Response length limit, tokens (generation is cut there). [ours]
    response_tokens_max: int = 32768
    #: Decode speed of one student sequence, tokens/s: generation time = tokens / speed.
    #: [stats §1.8] TraceLab median normalised decode speed 40.7 tok/s.
    decode_tok_s: float = 40.7

    def __post_init__(self) -> None:
        require_finite(self)
        require(len(self.teachers) >= 1, "teachers", "need at least one teacher")
        names = [t.name for t in self.teachers]
        # A name is the service each call names: an empty one failed as a generated trace
        # row's field ('service'), not as this setting.
        require(
            all(isinstance(n, str) and n for n in names),
            "teachers",
            f"each teacher needs a non-empty name, got {names}",
        )
        require(len(set(names)) == len(names), "teachers", f"duplicate names in {names}")
        for t in self.teachers:
            require(
                t.params_b > 0 and t.share > 0,
                "teachers",
                f"{t.name}: params_b and share must be > 0",
            )
        require(self.bytes_per_param > 0, "bytes_per_param", "must be > 0")
        require(0 <= self.t1_fixed_s < self.t1_mean_s, "t1_fixed_s", "must lie in [0, t1_mean_s)")
        require(self.t1_sigma >= 0, "t1_sigma", "must be >= 0")
        require(0 <= self.serial_fraction <= 1, "serial_fraction", "must lie in [0, 1]")
        require(self.max_units in CELL_SIZES, "max_units", f"must be one of {CELL_SIZES}")
        require_count_max(self, "calls_per_trajectory")  # 100,001 ran for minutes, silently
        require(self.response_tokens_median >= 1, "response_tokens_median", "must be >= 1")
        require(self.response_tokens_sigma >= 0, "response_tokens_sigma", "must be >= 0")
        require(self.response_tokens_max >= 1, "response_tokens_max", "must be >= 1")
        require(self.decode_tok_s > 0, "decode_tok_s", "must be > 0")
        require(
            self.popularity in ("shares", "zipf"),
            "popularity",
            f"must be 'shares' or 'zipf', got {self.popularity!r}",
        )
        require(self.zipf_exponent >= 0, "zipf_exponent", "must be >= 0")
        require(
            self.zipf_order in ZIPF_ORDERS,
            "zipf_order",
            f"must be one of {list(ZIPF_ORDERS)}, got {self.zipf_order!r}",
        )

    def routing(self) -> np.ndarray:
        """Each teacher's probability of being routed a trajectory (``popularity``)."""
        if self.popularity == "zipf":
            ranked = ZIPF_ORDERS[self.zipf_order](self.teachers)
            rank = {t.name: i + 1 for i, t in enumerate(ranked)}
            shares = np.array(
                [rank[t.name] ** -self.zipf_exponent for t in self.teachers], dtype=float
            )
        else:
            shares = np.array([t.share for t in self.teachers], dtype=float)
        return shares / shares.sum()

    def teacher_t1_means(self) -> np.ndarray:
        """Per-teacher mean one-GPU time: fixed + k * params_b (prefill FLOPs grow with the
        parameter count), k set so the share-weighted mean equals ``t1_mean_s``."""
        sizes = np.array([t.params_b for t in self.teachers], dtype=float)
        k = (self.t1_mean_s - self.t1_fixed_s) / float(self.routing() @ sizes)
        return self.t1_fixed_s + k * sizes

    def size_gb(self, teacher: TeacherSpec) -> float:
        return round(teacher.params_b * self.bytes_per_param, 3)


_STREAMS = ("teacher", "t1", "response_tokens")


def generate_mopd(params: MopdParams, *, batch: int, steps: int, seed: int) -> Trace:
    """``steps`` RL steps of ``batch`` distillation trajectories each (closed-loop)."""
    rng = streams(seed, _STREAMS)
    means = params.teacher_t1_means()
    calls = params.calls_per_trajectory
    rows: list[TraceRow] = []
    for step in range(steps):
        teacher = rng["teacher"].choice(len(params.teachers), size=batch, p=params.routing())
        unit = lognormal_mean(rng["t1"], 1.0, params.t1_sigma, batch * calls)
        t1 = times(unit * np.repeat(means[teacher], calls))
        tokens = np.minimum(
            lognormal_median(
                rng["response_tokens"],
                params.response_tokens_median,
                params.response_tokens_sigma,
                batch * calls,
            ),
            params.response_tokens_max,
        )
        gen = times(tokens / params.decode_tok_s)
        if not params.prefix_cache and calls > 1:
            # Call j recomputes turns 0..j: its time grows by the tokens so far over its own.
            per_traj = tokens.reshape(batch, calls)
            growth = (np.cumsum(per_traj, axis=1) / per_traj).ravel()
            t1 = times(np.asarray(t1) * growth)
        for i in range(batch):
            spec = params.teachers[int(teacher[i])]
            for pos in range(calls):
                j = i * calls + pos
                rows.append(
                    row(
                        TASK,
                        step,
                        i,
                        pos,
                        "teacher",
                        gen_before_s=gen[j],
                        resource="gpu",
                        t1_s=t1[j],
                        max_units=params.max_units,
                        serial_fraction=params.serial_fraction,
                        service=spec.name,
                        service_size_gb=params.size_gb(spec),
                    )
                )
    return Trace(tuple(rows), meta_for("mopd", params, batch=batch, steps=steps, seed=seed))
