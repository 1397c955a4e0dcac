"""DeepSearch: web-search API calls during the rollout, an LLM judge on GPU as the reward.

Each trajectory alternates generation and ``search`` actions (API, inelastic, one call slot of
the search endpoint's quota); after its final answer an LLM judge scores it (a ``judge`` action
on GPU, elastic over tensor-parallel GPUs). Sources: [paper] = ARL-Tangram via
``paper-notes.md``; [stats §n] = ``real-traces/latency-stats.md``; [ours] = our choice.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from tangram.core.cells import CELL_SIZES
from tangram.sim.workloads.base import (
    REWARD_SYNCS,
    counts_lognormal,
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

TASK = "deepsearch"


@dataclass(frozen=True)
class DeepSearchParams:
    """Distributions of the DeepSearch workload (every one seeded from its own stream)."""

    #: Median search calls per trajectory. [stats §1.7, §2] TraceLab 7.8 tool-triggered steps
    #: per request (mean); Copilot 7.3 tool calls per turn (mean).
    searches_median: float = 7.0
    #: Log-space sigma of the search count. [stats §1.7] TraceLab tool calls per request p90 30:
    #: ln(30/7)/1.2816 = 1.135.
    searches_sigma: float = 1.135
    #: Cap on searches per trajectory (an RL max-turns limit), at most ``COUNT_MAX``
    #: (100,000). [ours]
    searches_max: int = 64
    #: Median search-call latency, seconds. [stats §1.2] TraceLab "web / lookup" p50 ~6 s.
    search_median_s: float = 6.0
    #: Log-space sigma of search latency. [stats §1.2] web / lookup p25 2.1 s, p90 60 s, p99
    #: 260 s (sigmas 1.56, 1.80, 1.62).
    search_sigma: float = 1.6
    #: Client timeout: no search call is longer. [ours]
    search_timeout_s: float = 300.0
    #: The search endpoint's name: the API quota named "search" in tangram/clusters/*.toml.
    search_service: str = "search"
    #: The judge model. [ours; the paper says only "an LLM judge on GPU"]
    judge_service: str = "qwen2.5-32b-instruct-judge"
    #: Judge weights in GB: 32.8 B parameters at bf16 (2 bytes each). [ours]
    judge_size_gb: float = 65.6
    #: Median judge call on one GPU, seconds: prefill of question + answer and a ~32-token
    #: verdict at ~40 tok/s. [stats §1.8] median decode 40.7 tok/s; [ours] the token counts.
    judge_t1_median_s: float = 1.0
    #: Log-space sigma of judge times (answer length varies). [ours]
    judge_t1_sigma: float = 0.4
    #: Amdahl serial fraction of a judge call over tensor-parallel GPUs. [ours]
    judge_serial_fraction: float = 0.3
    #: Most GPUs a judge call can use (power of two). [ours]
    judge_max_units: int = 4
    #: Median LLM generation before each action, seconds. [stats §1.6] TraceLab per step p50 4.9 s.
    gen_median_s: float = 4.9
    #: Log-space sigma of generation. [stats §1.6] p90 20.2 s: ln(20.2/4.9)/1.2816 = 1.105.
    gen_sigma: float = 1.105
    #: When the judge runs: "trajectory" = after the trajectory's final answer (asynchronous
    #: rollout, as the paper runs VeRL); "step" = batch-synchronous, once every trajectory of
    #: the step has answered. [paper] async.
    judge_sync: str = "trajectory"

    def __post_init__(self) -> None:
        require_finite(self)
        require(
            self.judge_sync in REWARD_SYNCS,
            "judge_sync",
            f"must be one of {list(REWARD_SYNCS)}, got {self.judge_sync!r}",
        )
        for name in ("search_service", "judge_service"):  # named by every call's row
            value = getattr(self, name)
            require(
                isinstance(value, str) and bool(value),
                name,
                f"must be a non-empty service name, got {value!r}",
            )
        require(self.searches_median >= 1, "searches_median", "must be >= 1")
        require_count_max(self, "searches_max")
        for name in ("search_median_s", "search_timeout_s", "judge_t1_median_s", "gen_median_s"):
            require(getattr(self, name) > 0, name, "must be > 0")
        for name in ("searches_sigma", "search_sigma", "judge_t1_sigma", "gen_sigma"):
            require(getattr(self, name) >= 0, name, "must be >= 0")
        require(self.judge_size_gb >= 0, "judge_size_gb", "must be >= 0")
        require(0 <= self.judge_serial_fraction <= 1, "judge_serial_fraction", "must lie in [0, 1]")
        require(
            self.judge_max_units in CELL_SIZES, "judge_max_units", f"must be one of {CELL_SIZES}"
        )


_STREAMS = ("searches", "search_t1", "judge_t1", "gen")


def generate_deepsearch(params: DeepSearchParams, *, batch: int, steps: int, seed: int) -> Trace:
    """``steps`` RL steps of ``batch`` DeepSearch trajectories each (closed-loop)."""
    rng = streams(seed, _STREAMS)
    rows: list[TraceRow] = []
    for step in range(steps):
        n_search = counts_lognormal(
            rng["searches"],
            params.searches_median,
            params.searches_sigma,
            1,
            params.searches_max,
            batch,
        )
        total = int(n_search.sum())
        search_t1 = times(
            np.minimum(
                lognormal_median(
                    rng["search_t1"], params.search_median_s, params.search_sigma, total
                ),
                params.search_timeout_s,
            )
        )
        judge_t1 = times(
            lognormal_median(
                rng["judge_t1"], params.judge_t1_median_s, params.judge_t1_sigma, batch
            )
        )
        gen = times(
            lognormal_median(rng["gen"], params.gen_median_s, params.gen_sigma, total + batch)
        )
        k = g = 0
        for i in range(batch):
            for pos in range(int(n_search[i])):
                rows.append(
                    row(
                        TASK,
                        step,
                        i,
                        pos,
                        "search",
                        gen_before_s=gen[g],
                        resource="api",
                        t1_s=search_t1[k],
                        max_units=1,
                        service=params.search_service,
                    )
                )
                k += 1
                g += 1
            pos = int(n_search[i])
            rows.append(
                row(
                    TASK,
                    step,
                    i,
                    pos,
                    "judge",
                    gen_before_s=gen[g],
                    resource="gpu",
                    t1_s=judge_t1[i],
                    max_units=params.judge_max_units,
                    serial_fraction=params.judge_serial_fraction,
                    service=params.judge_service,
                    service_size_gb=params.judge_size_gb,
                    sync=REWARD_SYNCS[params.judge_sync],
                )
            )
            g += 1
    return Trace(tuple(rows), meta_for("deepsearch", params, batch=batch, steps=steps, seed=seed))
