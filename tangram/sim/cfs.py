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

import heapq
import math
from dataclasses import dataclass

#: A job whose work left takes less than this at its current share counts as done (float
#: error over many re-splits; trace times are microseconds).
_DONE_WITHIN_S = 1e-6


def serial_fraction(threads: int, speedup: float) -> float:
    """The serial fraction a speed-up of ``speedup`` on ``threads`` implies (Amdahl's law
    solved for s), clipped to [0, 1]; 0 on one thread."""
    if threads <= 1:
        return 0.0
    return min(1.0, max(0.0, (threads / speedup - 1.0) / (threads - 1.0)))


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
    #: ``SharedNode``'s bookkeeping: its work per second now, when its work was last brought
    #: up to date, whether it shares the unsettled cores, and its heap entry's epoch.
    rate: float = 0.0
    since: float = 0.0
    flexible: bool = False
    epoch: int = 0

    def __post_init__(self) -> None:
        if not self.total:
            self.total = self.work
        self.in_serial = self.serial > 0

    @classmethod
    def amdahl(cls, work: float, threads: int, speedup: float, weight: float) -> Job:
        """A job whose curve gives ``speedup`` on its ``threads``: the serial fraction that
        speed-up implies (Amdahl's law solved for s) is its serial phase."""
        return cls(work, float(threads), weight, serial=serial_fraction(threads, speedup) * work)

    @property
    def cap(self) -> float:
        """Most cores it can keep busy now: one in its serial phase, its threads after."""
        return min(1.0, self.threads) if self.in_serial else self.threads

    def phase_left(self) -> float:
        """Work left in its current phase (core-seconds)."""
        return self.serial if self.in_serial else self.work


@dataclass
class StaticJob:
    """A job whose thread count is at most its weight: it always gets its cap (one core in its
    serial phase, its threads after), so its phases' times are fixed when it starts and the
    driver ends it with one timer, as an exclusive grant. The node keeps only the cores it
    uses at each instant, which matter to jobs that can use more than their weight."""

    weight: float
    threads: float
    #: When its work begins (after its overhead), its serial phase ends, and it ends.
    begin: float
    serial_end: float
    end: float
    #: The cores counted for it in ``SharedNode.static_cores`` now.
    counted: float = 0.0

    def cap_at(self, t: float) -> float:
        if t < self.begin:
            return 0.0
        if t < self.serial_end:
            return min(1.0, self.threads)
        return self.threads if t < self.end else 0.0

    @property
    def work(self) -> float:
        """Its whole work, core-seconds (what it has left at its begin)."""
        return self.left_at(self.begin)[0]

    def left_at(self, t: float) -> tuple[float, float]:
        """(work, serial work) left at ``t``, core-seconds."""
        parallel = (self.end - max(t, self.serial_end)) * self.threads
        serial = max(0.0, self.serial_end - max(t, self.begin)) * min(1.0, self.threads)
        return serial + max(0.0, parallel), serial


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
    """The running jobs of one node and when the next of them ends a phase. ``slowdown``: the
    share of speed a job's parallel phase loses while it gets fewer cores than its threads
    (time-slicing is not free; ``Overheads.oversubscription_slowdown``).

    Kept in time per event that does not grow with the node's jobs. The weights never sum
    past the node (they are grants or requests the core admitted), so the water level is at
    least 1 and a job whose cap is at most its weight always gets its cap: it is *settled*,
    its rate changes only at its own phase end, and that end sits in a heap. Only the other
    jobs, which can use more than their weight, share what the settled ones leave, and only
    they are re-split at each event. A job's work is brought up to date only when its rate
    changes (``Job.since``).
    """

    def __init__(self, cores: int, slowdown: float = 0.0) -> None:
        self.capacity = float(cores)
        self.slowdown = slowdown
        self.jobs: dict[str, Job] = {}
        #: Jobs whose cap exceeds their weight: they share what the settled jobs leave.
        self.flexible: dict[str, Job] = {}
        #: Cores the settled jobs use (the sum of their caps) and the sum of all weights.
        self.settled_cores = 0.0
        self.weights = 0.0
        #: (phase end, sequence, job id, job's epoch) of the settled jobs; stale entries (the
        #: job's epoch moved on) are skipped.
        self._ends: list[tuple[float, int, str, int]] = []
        #: Static jobs (``StaticJob``), the cores they use now, and their phase changes ahead
        #: (time, sequence, job id), applied lazily (``_static_to``).
        self.static: dict[str, StaticJob] = {}
        self.static_cores = 0.0
        self._changes: list[tuple[float, int, str]] = []
        self._seq = 0
        #: The most cores in use at any instant (sum of the jobs' shares), for checks.
        self.peak = 0.0

    def _rate(self, job: Job) -> float:
        """Work per second: its cores, less the slowdown when its parallel phase's threads
        outnumber them."""
        if self.slowdown and not job.in_serial and job.cores < job.threads:
            return job.cores * (1.0 - self.slowdown)
        return job.cores

    @staticmethod
    def _bring(job: Job, now: float) -> None:
        """Its work (and serial work) up to ``now`` at its current rate."""
        dt = now - job.since
        if dt > 0:
            done = job.rate * dt
            job.work -= done
            if job.in_serial:
                job.serial -= done
        job.since = now

    def _settle(self, job_id: str, job: Job, now: float) -> None:
        """File ``job`` (brought to ``now``) as settled or flexible by its current cap."""
        cap = job.cap
        job.epoch += 1
        if cap <= job.weight:
            job.cores = cap
            job.rate = self._rate(job)
            self.settled_cores += cap
            self._seq += 1
            end = now + max(job.phase_left(), 0.0) / job.rate if job.rate > 0 else math.inf
            heapq.heappush(self._ends, (end, self._seq, job_id, job.epoch))
            job.flexible = False
        else:
            self.flexible[job_id] = job
            job.flexible = True

    def _unsettle(self, job_id: str, job: Job) -> None:
        """Take ``job`` out of its file (its heap entry goes stale)."""
        job.epoch += 1
        if job.flexible:
            del self.flexible[job_id]
        else:
            self.settled_cores -= job.cores

    def _static_to(self, now: float) -> None:
        """Apply the static jobs' phase changes up to ``now`` to ``static_cores``."""
        changes = self._changes
        while changes and changes[0][0] <= now:
            _, _, job_id = heapq.heappop(changes)
            job = self.static.get(job_id)
            if job is not None:
                cap = job.cap_at(now)
                self.static_cores += cap - job.counted
                job.counted = cap

    def add_static(self, now: float, job_id: str, job: StaticJob) -> None:
        """A static job starts (its timer is the driver's): its weight is held from now."""
        self._admit(job_id, job.weight)
        self.static[job_id] = job
        self._static_to(now)
        job.counted = job.cap_at(now)
        self.static_cores += job.counted
        if job.begin > now:
            self._seq += 1
            heapq.heappush(self._changes, (job.begin, self._seq, job_id))
        if job.serial_end > max(now, job.begin):
            self._seq += 1
            heapq.heappush(self._changes, (job.serial_end, self._seq, job_id))
        if self.flexible:
            self._split(now)

    def remove_static(self, now: float, job_id: str) -> StaticJob:
        """A static job ended, or is resized (``StaticJob.left_at`` says what it had left)."""
        job = self.static.pop(job_id)
        self._static_to(now)
        self.static_cores -= job.counted
        self.weights -= job.weight
        if self.flexible:
            self._split(now)
        return job

    def _admit(self, job_id: str, weight: float) -> None:
        if self.weights + weight > self.capacity + 1e-9:
            raise ValueError(
                f"job {job_id!r}: weights {self.weights + weight:g} would exceed the node's "
                f"{self.capacity:g} cores (a grant or request the core never admits)"
            )
        self.weights += weight

    def _split(self, now: float) -> None:
        """Water-fill what the settled and static jobs leave among the flexible ones (brought
        to ``now``)."""
        flexible = list(self.flexible.values())
        for job in flexible:
            self._bring(job, now)
        self._static_to(now)
        used = self.settled_cores + self.static_cores
        water_fill(flexible, self.capacity - used)
        for job in flexible:
            job.rate = self._rate(job)
            used += job.cores
        self.peak = max(self.peak, used)

    def add(self, now: float, job_id: str, job: Job) -> None:
        self._admit(job_id, job.weight)
        job.since = now
        self.jobs[job_id] = job
        self._settle(job_id, job, now)
        self._split(now)

    def reweigh(self, now: float, job_id: str, job: Job, weight: float) -> None:
        """``job``'s weight is ``weight`` from ``now`` (work up to now at the old split); a job
        still in its overhead (not yet added) just starts with it."""
        if job_id not in self.jobs:
            job.weight = weight
            return
        if self.weights - job.weight + weight > self.capacity + 1e-9:
            raise ValueError(f"job {job_id!r}: reweighed to {weight:g}, weights exceed the node")
        self._bring(job, now)
        self._unsettle(job_id, job)
        self.weights += weight - job.weight
        job.weight = weight
        self._settle(job_id, job, now)
        self._split(now)

    def _phase_done(self, job: Job) -> bool:
        return job.phase_left() <= _DONE_WITHIN_S * max(job.cores, 1e-3)

    def finish_due(self, now: float) -> list[tuple[str, Job]]:
        """Bring work up to ``now``; remove and return the jobs that are done (and re-split
        when one is done or ended its serial phase)."""
        ended: list[tuple[str, Job]] = []
        ends = self._ends
        while ends and ends[0][0] <= now + _DONE_WITHIN_S:
            _, _, job_id, epoch = heapq.heappop(ends)
            job = self.jobs.get(job_id)
            if job is None or job.epoch != epoch:
                continue  # stale: ended, reweighed or refiled since
            self._bring(job, now)
            # Its heap entry is its phase's end: that phase is over (whatever float error
            # the subtraction left).
            if job.in_serial:
                job.serial = 0.0
            else:
                job.work = 0.0
            ended.append((job_id, job))
        for job_id, job in list(self.flexible.items()):
            self._bring(job, now)
            if self._phase_done(job):
                ended.append((job_id, job))
        if not ended:
            if self.flexible and self._changes and self._changes[0][0] <= now:
                self._split(now)  # a static job's phase changed what the flexible ones share
            return []
        done = []
        for job_id, job in ended:
            self._unsettle(job_id, job)
            if job.in_serial and job.work > _DONE_WITHIN_S * max(job.cores, 1e-3):
                job.serial, job.in_serial = 0.0, False
                self._settle(job_id, job, now)
            else:
                del self.jobs[job_id]
                self.weights -= job.weight
                done.append((job_id, job))
        self._split(now)
        return done

    def next_finish(self) -> float | None:
        """When the first running job ends its phase at the current split (None: no job)."""
        ends = self._ends
        while ends and (ends[0][2] not in self.jobs or self.jobs[ends[0][2]].epoch != ends[0][3]):
            heapq.heappop(ends)
        times = [ends[0][0]] if ends else []
        if self.flexible:  # a static job's phase change re-splits what they share
            changes = self._changes
            while changes and changes[0][2] not in self.static:
                heapq.heappop(changes)
            if changes:
                times.append(changes[0][0])
        times.extend(
            j.since + max(j.phase_left(), 0.0) / j.rate
            for j in self.flexible.values()
            if j.rate > 0
        )
        return min(times) if times else None
