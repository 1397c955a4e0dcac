"""AI coding (SWE-style agentic RL): CPU sandbox actions, then a test-based reward.

Each trajectory is one agent rollout in its own container: the policy generates (on the
training cluster), runs a command in the sandbox (an ``env`` action), generates again, and so
on; after the last generation the test suite runs in the same container as the reward (a
``reward`` action, more parallel than the environment actions). Both are CPU actions elastic
by Amdahl's law. Sources of every default are in the field comments and in
``docs/workloads.md``: [paper] = ARL-Tangram (arXiv 2603.13019) via ``paper-notes.md``;
[stats §n] = ``real-traces/latency-stats.md`` section n; [ours] = our choice.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from tangram.core.cluster_file import MAX_CORES_PER_NODE
from tangram.sim.workloads.base import (
    REWARD_SYNCS,
    counts_lognormal,
    expected_count,
    lognormal_mean,
    meta_for,
    require,
    require_count_max,
    require_finite,
    row,
    streams,
    times,
)
from tangram.trace import Trace, TraceRow

TASK = "coding"


@dataclass(frozen=True)
class CodingParams:
    """Distributions of the AI-coding workload (every one seeded from its own stream)."""

    #: Median env actions per trajectory. [stats §1.7] TraceLab: 25 tool calls per session (p50).
    env_actions_median: float = 25.0
    #: Log-space sigma of the env-action count. [stats §2] chosen so the mean is 28.8, the
    #: Copilot coding agent's tool calls per session (8.68 M calls / 301 k sessions).
    env_actions_sigma: float = 0.53
    #: Cap on env actions per trajectory (an RL max-turns limit), at most ``COUNT_MAX``
    #: (100,000). [ours]
    env_actions_max: int = 100
    #: Mean execution time of a coding action (env and reward) at its ``max_units``, seconds.
    #: [paper] 0.975 s at batch 1280, where queueing was 0.015 s: with cores to spare the
    #: elastic scheduler runs each action at its largest useful DoP. The one-core means
    #: (``env_t1_mean_s()``, ``reward_t1_mean_s()``) are derived from it.
    exec_mean_s: float = 0.975
    #: Log-space sigma of env-action times. [stats §4] SWE-agent execution_time p50 0.24 s,
    #: p90 0.76 s: ln(0.76/0.24)/1.2816 = 0.90.
    env_t1_sigma: float = 0.90
    #: Beta(alpha, beta) of env actions' serial fraction: mean 0.85, nearly two-valued (about
    #: 85% of commands near s = 1, 15% near 0). [profiles: docs/profiles.md,
    #: experiments/results/profiles/coding_actions.pooled.json] measured in the sandbox image:
    #: grep -r 1.0 and pip install 0.88 (fits of the fastest runs), compileall -j 0.025 and
    #: make -j 0.015 (one-core decompositions: lower bounds); mixed 0.8 serial commands (the
    #: recorded agent commands in shared/real-traces are all serial) and 0.05 of each other
    #: kind, moment-matched. (The paper profiles E(m) offline but publishes no values; the
    #: previous default, Beta(2, 2) with mean 0.5, was ours.)
    env_serial_alpha: float = 0.0815
    env_serial_beta: float = 0.0142
    #: Most cores an env action can use. [ours; the paper's largest fixed-DoP ablation is 16]
    env_max_units: int = 16
    #: Mean one-core time of the test-based reward relative to an env action's. [ours] a test
    #: suite is several times heavier than one agent command.
    reward_t1_ratio: float = 8.0
    #: Log-space sigma of reward times. [ours]
    reward_t1_sigma: float = 0.5
    #: Beta(alpha, beta) of the reward's serial fraction: mean 0.128, the measured serial part of
    #: a ``pytest -n`` suite (start-up and collection over the whole run on one core, a lower
    #: bound) [profiles, as above]; alpha + beta = 7, the spread of the previous default
    #: Beta(1, 6) [ours].
    reward_serial_alpha: float = 0.895
    reward_serial_beta: float = 6.11
    #: Most cores the reward can use. [ours]
    reward_max_units: int = 32
    #: Share of a trajectory's life its actions are busy: sum(t1) / (sum(t1) + sum(gen)).
    #: [paper] the environment is in use about 47% of an AI-coding trajectory's life.
    busy_share: float = 0.47
    #: Log-space sigma of the LLM generation before each action; its mean is derived from
    #: ``busy_share``. [stats §1.6] TraceLab LLM time per step p50 4.9 s, p90 20.2 s:
    #: ln(20.2/4.9)/1.2816 = 1.105.
    gen_sigma: float = 1.105
    #: Container memory per trajectory, uniform in [min, max], rounded to 0.5 GB. [ours]
    memory_gb_min: float = 2.0
    memory_gb_max: float = 4.0
    #: Mean one-core time of a setup action at trajectory start (check out the repository,
    #: install its dependencies), seconds; 0 = none. Every trajectory of a step starts it at
    #: the step's first instant: a batch-wide burst. [ours] off by default: the paper's
    #: published means (``exec_mean_s``) are calibrated without one, and it publishes no setup
    #: time; SkyRL reports ~20 s to start a container on a 224-core box (field notes).
    setup_t1_mean_s: float = 0.0
    #: Log-space sigma of setup times. [ours]
    setup_t1_sigma: float = 0.5
    #: Amdahl serial fraction of the setup (downloads and installs parallelise poorly). [ours]
    setup_serial_fraction: float = 0.7
    #: Most cores a setup action can use. [ours]
    setup_max_units: int = 8
    #: When the reward runs: "trajectory" = right after the trajectory's last generation (the
    #: paper's asynchronous rollout, VeRL async); "step" = batch-synchronous, once every
    #: trajectory of the step has finished its rollout (synchronous GRPO loops). [paper] async.
    reward_sync: str = "trajectory"

    def __post_init__(self) -> None:
        require_finite(self)
        require(self.env_actions_median >= 1, "env_actions_median", "must be >= 1")
        require_count_max(self, "env_actions_max")
        for name in ("exec_mean_s", "reward_t1_ratio"):
            require(getattr(self, name) > 0, name, "must be > 0")
        for name in (
            "env_actions_sigma",
            "env_t1_sigma",
            "reward_t1_sigma",
            "gen_sigma",
        ):
            require(getattr(self, name) >= 0, name, "must be >= 0")
        for name in (
            "env_serial_alpha",
            "env_serial_beta",
            "reward_serial_alpha",
            "reward_serial_beta",
        ):
            require(getattr(self, name) > 0, name, "must be > 0")
        # At most a node's cores: the policies that respect capacity cap there anyway, and
        # lower-bound (which ignores it) listed every count up to 10**8 and ran out of memory.
        for name in ("env_max_units", "reward_max_units", "setup_max_units"):
            value = getattr(self, name)
            require(
                1 <= value <= MAX_CORES_PER_NODE,
                name,
                f"must lie in [1, {MAX_CORES_PER_NODE}] (a node's most cores), got {value!r}",
            )
        require(0 < self.busy_share < 1, "busy_share", "must lie in (0, 1)")
        require(
            0 <= self.memory_gb_min <= self.memory_gb_max, "memory_gb_min", "must be in [0, max]"
        )
        require(self.setup_t1_mean_s >= 0, "setup_t1_mean_s", "must be >= 0 (0: no setup)")
        require(self.setup_t1_sigma >= 0, "setup_t1_sigma", "must be >= 0")
        require(0 <= self.setup_serial_fraction <= 1, "setup_serial_fraction", "must lie in [0, 1]")
        require(
            self.reward_sync in REWARD_SYNCS,
            "reward_sync",
            f"must be one of {list(REWARD_SYNCS)}, got {self.reward_sync!r}",
        )

    def expected_env_actions(self) -> float:
        return expected_count(
            self.env_actions_median, self.env_actions_sigma, 1, self.env_actions_max
        )

    def env_t1_mean_s(self) -> float:
        """Mean one-core time of an env action, so that the mean execution time of all coding
        actions at their ``max_units`` is ``exec_mean_s``.

        At m units an Amdahl action takes t1 * (s + (1 - s) / m); t1 and s are drawn
        independently, so its mean is E[t1] * a with a = E[s] * (1 - 1/m) + 1/m. With n env
        actions and one reward (mean t1 = ratio * env mean) per trajectory:
        env mean = exec_mean * E[n + 1] / (E[n] * a_env + ratio * a_reward).
        """
        n = self.expected_env_actions()
        a_env = _mean_time_factor(self.env_serial_alpha, self.env_serial_beta, self.env_max_units)
        a_reward = _mean_time_factor(
            self.reward_serial_alpha, self.reward_serial_beta, self.reward_max_units
        )
        return self.exec_mean_s * (n + 1.0) / (n * a_env + self.reward_t1_ratio * a_reward)

    def reward_t1_mean_s(self) -> float:
        """Mean one-core time of the test-based reward."""
        return self.reward_t1_ratio * self.env_t1_mean_s()

    def gen_mean_s(self) -> float:
        """Mean generation before an action, so that E[sum t1] / E[life] = ``busy_share``.

        A trajectory with n env actions has n + 1 generations (one before each env action and
        one before the reward), so gen_mean = (1 - b) / b * E[sum t1] / E[n + 1].
        """
        n = self.expected_env_actions()
        busy = n * self.env_t1_mean_s() + self.reward_t1_mean_s()
        return (1.0 - self.busy_share) / self.busy_share * busy / (n + 1.0)


def _mean_time_factor(alpha: float, beta: float, units: int) -> float:
    """E[s + (1 - s) / m] for s ~ Beta(alpha, beta): mean time at m units over time on one."""
    mean_s = alpha / (alpha + beta)
    return mean_s * (1.0 - 1.0 / units) + 1.0 / units


_STREAMS = (
    "env_actions",
    "env_t1",
    "env_serial",
    "reward_t1",
    "reward_serial",
    "gen",
    "memory",
    "setup_t1",
)


def generate_coding(params: CodingParams, *, batch: int, steps: int, seed: int) -> Trace:
    """``steps`` RL steps of ``batch`` coding trajectories each (closed-loop: no arrival times)."""
    rng = streams(seed, _STREAMS)
    gen_mean = params.gen_mean_s()
    env_mean, reward_mean = params.env_t1_mean_s(), params.reward_t1_mean_s()
    rows: list[TraceRow] = []
    for step in range(steps):
        n_env = counts_lognormal(
            rng["env_actions"],
            params.env_actions_median,
            params.env_actions_sigma,
            1,
            params.env_actions_max,
            batch,
        )
        total = int(n_env.sum())
        env_t1 = times(lognormal_mean(rng["env_t1"], env_mean, params.env_t1_sigma, total))
        env_s = np.round(
            rng["env_serial"].beta(params.env_serial_alpha, params.env_serial_beta, total), 4
        )
        reward_t1 = times(
            lognormal_mean(rng["reward_t1"], reward_mean, params.reward_t1_sigma, batch)
        )
        reward_s = np.round(
            rng["reward_serial"].beta(params.reward_serial_alpha, params.reward_serial_beta, batch),
            4,
        )
        gen = times(lognormal_mean(rng["gen"], gen_mean, params.gen_sigma, total + batch))
        memory = (
            np.round(rng["memory"].uniform(params.memory_gb_min, params.memory_gb_max, batch) * 2)
            / 2
        )
        setup = (
            times(
                lognormal_mean(
                    rng["setup_t1"], params.setup_t1_mean_s, params.setup_t1_sigma, batch
                )
            )
            if params.setup_t1_mean_s > 0
            else None
        )
        first = 0 if setup is None else 1  # the env actions' first position
        k = 0  # index into the per-env-action arrays
        g = 0  # index into the generation array
        for i in range(batch):
            mem = float(memory[i])
            if setup is not None:
                rows.append(
                    row(
                        TASK,
                        step,
                        i,
                        0,
                        "setup",
                        gen_before_s=0.0,
                        resource="cpu",
                        t1_s=setup[i],
                        max_units=params.setup_max_units,
                        serial_fraction=params.setup_serial_fraction,
                        memory_gb=mem,
                    )
                )
            for pos in range(first, first + int(n_env[i])):
                rows.append(
                    row(
                        TASK,
                        step,
                        i,
                        pos,
                        "env",
                        gen_before_s=gen[g],
                        resource="cpu",
                        t1_s=env_t1[k],
                        max_units=params.env_max_units,
                        serial_fraction=float(env_s[k]),
                        memory_gb=mem,
                    )
                )
                k += 1
                g += 1
            pos = first + int(n_env[i])
            rows.append(
                row(
                    TASK,
                    step,
                    i,
                    pos,
                    "reward",
                    gen_before_s=gen[g],
                    resource="cpu",
                    t1_s=reward_t1[i],
                    max_units=params.reward_max_units,
                    serial_fraction=float(reward_s[i]),
                    memory_gb=mem,
                    sync=REWARD_SYNCS[params.reward_sync],
                )
            )
            g += 1
    return Trace(tuple(rows), meta_for("coding", params, batch=batch, steps=steps, seed=seed))
