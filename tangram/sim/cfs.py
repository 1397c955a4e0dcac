"""CPU time shared the way Linux CFS shares it among pods with requests and no limits.

A burstable Kubernetes pod (CPU requests, no limit) is admitted by its requests but may run
on any idle cycle of its node: CFS gives each runnable cgroup CPU time in proportion to its
weight (``cpu.shares`` / ``cpu.weight``, set from the requests), and what one cannot use goes
to the others. The fluid model here:

- each running action is a job of ``work`` core-seconds (its one-core time) that can keep at
  most ``cap`` cores busy (its speed-up at its thread count: an Amdahl program's average
  parallelism), weighted by its pod's requests;
- the node's cores are split by weighted water-filling: every job gets min(cap, weight x L),
  with the level L chosen so the node is fully used or every job is at its cap;
- a job progresses at the cores it gets, so alone it takes its curve's time at its thread
  count, and it finishes when its work is done; every start or end re-splits the node.

The model is work-conserving at every instant (serial phases of one job lend their idle cores
to others perfectly), which favours the baseline: real CFS loses some of that to wake-up
latency and cache effects.
"""

from __future__ import annotations

from dataclasses import dataclass

#: A job whose work left takes less than this at its current share counts as done (float
#: error over many re-splits; trace times are microseconds).
_DONE_WITHIN_S = 1e-6


@dataclass
class Job:
    """One running action on a shared node (mutable: its work drains)."""

    work: float
    cap: float
    weight: float
    cores: float = 0.0
    #: The work it started with (core-seconds): ``work`` drains to 0.
    total: float = 0.0

    def __post_init__(self) -> None:
        if not self.total:
            self.total = self.work


def water_fill(jobs: list[Job], capacity: float) -> None:
    """Set each job's ``cores``: min(cap, weight x L), the largest L with sum <= capacity."""
    if not jobs:
        return
    # Jobs saturate in order of cap / weight; the rest share what is left by weight.
    order = sorted(jobs, key=lambda j: j.cap / j.weight)
    left, weights = capacity, sum(j.weight for j in jobs)
    for i, job in enumerate(order):
        level = left / weights
        if job.cap <= job.weight * level:
            job.cores = job.cap
            left -= job.cap
            weights -= job.weight
        else:
            for rest in order[i:]:
                rest.cores = rest.weight * level
            return


class SharedNode:
    """The running jobs of one node and when the next of them finishes."""

    def __init__(self, cores: int) -> None:
        self.capacity = float(cores)
        self.jobs: dict[str, Job] = {}
        self.since = 0.0  # when the jobs' work was last brought up to date
        #: Bumped at every re-split: a wake-up armed before it is stale.
        self.version = 0
        #: The most cores in use at any instant (sum of the jobs' shares), for checks.
        self.peak = 0.0

    def _drain(self, now: float) -> None:
        dt = now - self.since
        if dt > 0:
            for job in self.jobs.values():
                job.work -= job.cores * dt
        self.since = now

    def _split(self) -> None:
        water_fill(list(self.jobs.values()), self.capacity)
        self.peak = max(self.peak, sum(j.cores for j in self.jobs.values()))
        self.version += 1

    def add(self, now: float, job_id: str, job: Job) -> None:
        self._drain(now)
        self.jobs[job_id] = job
        self._split()

    def finish_due(self, now: float) -> list[tuple[str, Job]]:
        """Bring work up to ``now``; remove and return the jobs that are done."""
        self._drain(now)
        done = [
            (k, j) for k, j in self.jobs.items() if j.work <= _DONE_WITHIN_S * max(j.cores, 1e-3)
        ]
        for k, _ in done:
            del self.jobs[k]
        if done:
            self._split()
        return done

    def next_finish(self) -> float | None:
        """When the first running job will be done at the current split (None: no job)."""
        times = [self.since + max(j.work, 0.0) / j.cores for j in self.jobs.values() if j.cores > 0]
        return min(times) if times else None
