"""CPU time shared the way Linux CFS shares it among pods with requests and no limits.

A burstable Kubernetes pod (CPU requests, no limit) is admitted by its requests but may run
on any idle cycle of its node: CFS gives each runnable cgroup CPU time in proportion to its
weight (``cpu.shares`` / ``cpu.weight``, set from the requests), and what one cannot use goes
to the others. The fluid model here:

- each running action is a job of ``work`` core-seconds (its one-core time), weighted by its
  pod's requests, in two phases: its serial work (the curve's serial fraction at its thread
  count T, ``Job.amdahl``) runs one thread, so it can keep at most one core busy; the rest keeps
  at most T cores busy. Alone on enough cores it takes its curve's time at T
  (s w + (1 - s) w / T); squeezed to fewer cores its parallel phase slows, never its serial one,
  and the cores its serial phase leaves idle go to the other jobs;
- the node's cores are split by weighted water-filling: every job gets min(cap, weight x L),
  with the level L chosen so the node is fully used or every job is at its cap;
- a job progresses at the cores it gets, so alone it takes its curve's time at its thread
  count, and it finishes when its work is done; every start or end re-splits the node.

The default policy's grants run the same way (``ElasticTuning.lend_idle_cycles``): a job
weighted by its grant, with its told thread count, re-weighted when the core resizes it.

The model is work-conserving at every instant (serial phases of one job lend their idle cores
to others perfectly), which favours the baseline: real CFS loses some of that to wake-up
latency and cache effects. (Until issue 11 a job was one phase capped at its mean parallelism,
speed-up(T) cores: alone on 2 cores a 16-thread job with serial fraction 0.5 then took its
16-core time, 0.53 t1, where its program needs 0.75 t1; the two phases fix that.)
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
    #: Most cores its parallel phase keeps busy (its thread count).
    threads: float
    weight: float
    cores: float = 0.0
    #: The work it started with (core-seconds): ``work`` drains to 0.
    total: float = 0.0
    #: Work left of its serial phase (one thread), done first.
    serial: float = 0.0
    #: In its serial phase (until ``SharedNode.finish_due`` sees that phase's work done).
    in_serial: bool = False

    def __post_init__(self) -> None:
        if not self.total:
            self.total = self.work
        self.in_serial = self.serial > 0

    @classmethod
    def amdahl(cls, work: float, threads: int, speedup: float, weight: float) -> Job:
        """A job whose curve gives ``speedup`` on its ``threads``: the serial fraction that
        speed-up implies (Amdahl's law solved for s) is its serial phase."""
        s = (threads / speedup - 1.0) / (threads - 1.0) if threads > 1 else 0.0
        return cls(work, float(threads), weight, serial=min(1.0, max(0.0, s)) * work)

    @property
    def cap(self) -> float:
        """Most cores it can keep busy now: one in its serial phase, its threads after."""
        return min(1.0, self.threads) if self.in_serial else self.threads

    def phase_left(self) -> float:
        """Work left in its current phase (core-seconds)."""
        return self.serial if self.in_serial else self.work


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


def _cores(job: Job) -> float:
    """Work per second when time-slicing is free: its cores."""
    return job.cores


class SharedNode:
    """The running jobs of one node and when the next of them finishes. ``slowdown``: the
    share of speed a job's parallel phase loses while it gets fewer cores than its threads
    (time-slicing is not free; ``Overheads.oversubscription_slowdown``)."""

    def __init__(self, cores: int, slowdown: float = 0.0) -> None:
        self.capacity = float(cores)
        self.slowdown = slowdown
        self.jobs: dict[str, Job] = {}
        self.since = 0.0  # when the jobs' work was last brought up to date
        #: Bumped at every re-split: a wake-up armed before it is stale.
        self.version = 0
        #: The most cores in use at any instant (sum of the jobs' shares), for checks.
        self.peak = 0.0

    def _rate(self, job: Job) -> float:
        """Work per second: its cores, less the slowdown when its parallel phase's threads
        outnumber them."""
        if self.slowdown and not job.in_serial and job.cores < job.threads:
            return job.cores * (1.0 - self.slowdown)
        return job.cores

    def _drain(self, now: float) -> None:
        dt = now - self.since
        if dt > 0:
            rate = self._rate if self.slowdown else _cores
            for job in self.jobs.values():
                done = rate(job) * dt
                job.work -= done
                if job.in_serial:
                    job.serial -= done
        self.since = now

    def _split(self) -> None:
        water_fill(list(self.jobs.values()), self.capacity)
        self.peak = max(self.peak, sum(j.cores for j in self.jobs.values()))
        self.version += 1

    def add(self, now: float, job_id: str, job: Job) -> None:
        self._drain(now)
        self.jobs[job_id] = job
        self._split()

    def reweigh(self, now: float, job_id: str, job: Job, weight: float) -> None:
        """``job``'s weight is ``weight`` from ``now`` (work up to now at the old split); a job
        still in its overhead (not yet added) just starts with it."""
        self._drain(now)
        job.weight = weight
        if job_id in self.jobs:
            self._split()

    def finish_due(self, now: float) -> list[tuple[str, Job]]:
        """Bring work up to ``now``; remove and return the jobs that are done (and re-split
        when one is done or ended its serial phase)."""
        self._drain(now)
        done = [
            (k, j) for k, j in self.jobs.items() if j.work <= _DONE_WITHIN_S * max(j.cores, 1e-3)
        ]
        for k, _ in done:
            del self.jobs[k]
        phased = False
        for j in self.jobs.values():
            if j.in_serial and j.serial <= _DONE_WITHIN_S * max(j.cores, 1e-3):
                j.serial, j.in_serial, phased = 0.0, False, True
        if done or phased:
            self._split()
        return done

    def next_finish(self) -> float | None:
        """When the first running job ends its phase at the current split (None: no job)."""
        times = [
            self.since + max(j.phase_left(), 0.0) / self._rate(j)
            for j in self.jobs.values()
            if j.cores > 0
        ]
        return min(times) if times else None
