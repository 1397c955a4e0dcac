"""Warm pools: parked containers per (image, memory, sandbox), ready for the next trajectory.

Opening a trajectory takes a parked container of its key when one is there (no create, no
runner start: only its execution is left to pay); a container whose trajectory closed comes
back here and is reset in the background (``reset.reset``: processes killed, writable dirs
emptied, parked again), never reused dirty: a reset that fails removes it.

Size: each key keeps as many containers (parked, in use and being reset together) as it had
busy (in use or being reset) at once during the last ``window_s`` (its recent demand), and
never more than ``max_per_key``; all keys together
at most ``max_total``. A container coming back beyond that is removed, and a key below it is
filled by creating containers in the background. ``prewarm`` fills a key before demand shows.
"""

from __future__ import annotations

import contextlib
import itertools
import logging
import numbers
import threading
import time
from collections import Counter, deque
from collections.abc import Callable
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass
from typing import TYPE_CHECKING

from tangram.exec.aoe.config import SandboxConfig, WarmPoolConfig
from tangram.exec.aoe.errors import AoeError
from tangram.exec.aoe.reset import KEEPER_UID

if TYPE_CHECKING:
    from tangram.exec.aoe.lifecycle import Container

log = logging.getLogger(__name__)


def prewarm_count(count: object) -> int:
    """``count`` as a number of containers to prewarm; ``AoeError`` naming it unless it is a
    whole number from 0 (not a bool): a string raised a bare TypeError from ``max``, True made
    one container and a negative count passed as 0."""
    if isinstance(count, bool) or not isinstance(count, numbers.Integral) or count < 0:
        raise AoeError(f"prewarm count must be a whole number of containers from 0, got {count!r}")
    return int(count)


@dataclass(frozen=True)
class PoolKey:
    """What makes two containers interchangeable: the same image, memory limit and sandbox."""

    image: str
    memory_gb: float
    sandbox: SandboxConfig

    def describe(self) -> str:
        return f"{self.image}/{self.memory_gb:g}GB"


@dataclass(frozen=True)
class PoolStats:
    """A snapshot of the pool for ``/metrics`` and the benchmark."""

    parked: dict[str, int]
    in_use: dict[str, int]
    target: dict[str, int]
    resetting: int
    counters: dict[str, int]


class Demand:
    """The most containers of a key busy at once (in use or being reset after use) over the
    last ``window_s`` seconds."""

    def __init__(self, window_s: float) -> None:
        self.window_s = window_s
        self.busy: Counter[PoolKey] = Counter()
        self._peaks: dict[PoolKey, deque[tuple[float, int]]] = {}

    def change(self, key: PoolKey, delta: int, now: float) -> bool:
        """Count ``delta`` more busy; True (a caller records that it counted in the same
        line, where no interrupt lands between the two)."""
        self.busy[key] += delta
        marks = self._peaks.setdefault(key, deque())
        marks.append((now, self.busy[key]))
        self._trim(marks, now)
        return True

    def peak(self, key: PoolKey, now: float) -> int:
        marks = self._peaks.get(key)
        if not marks:
            return self.busy[key]
        self._trim(marks, now)
        return max([self.busy[key], *(n for _, n in marks)])

    def forget(self, key: PoolKey) -> None:
        """Drop an idle key's count and marks."""
        self.busy.pop(key, None)
        self._peaks.pop(key, None)

    def _trim(self, marks: deque[tuple[float, int]], now: float) -> None:
        while marks and marks[0][0] < now - self.window_s:
            marks.popleft()


class WarmPool:
    """The parked containers of one manager, with their resets and fills on worker threads.

    ``create(key)`` makes a new parked container of a key, ``reset(c)`` returns None when a
    container is clean again (else why not), ``remove(c)`` removes one and ``alive(c)`` says
    whether a parked one still runs; the lifecycle provides all four."""

    def __init__(
        self,
        config: WarmPoolConfig,
        create: Callable[[PoolKey], Container],
        reset: Callable[[Container], str | None],
        remove: Callable[[Container], None],
        clock: Callable[[], float] = time.monotonic,
        alive: Callable[[Container], bool] = lambda c: True,
    ) -> None:
        self.config = config
        self._create, self._reset, self._remove = create, reset, remove
        self._alive = alive
        self._clock = clock
        self._lock = threading.Lock()
        self._parked: dict[PoolKey, list[Container]] = {}
        self._filling: Counter[PoolKey] = Counter()  # being created
        self._resetting: Counter[PoolKey] = Counter()
        self._demand = Demand(config.window_s)
        self.counters: Counter[str] = Counter()
        self._closed = False
        self._jobs = ThreadPoolExecutor(config.workers, thread_name_prefix="tangram-pool")
        #: The submitted jobs that carry a container (a reset or a removal), until they end:
        #: one that ``close`` cancels before it ran still has its container to remove.
        self._queued: dict[Future[None], Container] = {}
        self._seq = itertools.count(1)
        #: A key's prewarmed count and until when it holds without demand.
        self._floor: dict[PoolKey, tuple[int, float]] = {}

    @staticmethod
    def poolable(sandbox: SandboxConfig) -> bool:
        """Whether containers of ``sandbox`` are pooled (``unpooled_because`` says why not)."""
        return WarmPool.unpooled_because(sandbox) is None

    @staticmethod
    def unpooled_because(sandbox: SandboxConfig) -> str | None:
        """Why containers of ``sandbox`` are not pooled, None when they are. Only a strict
        sandbox is pooled: its actions can write nothing but the dirs a reset empties and
        cannot reach the keeper (no root, no capabilities, read-only root). A container on a
        named work volume is its trajectory's. Nor one whose actions run as a name (the image
        says its uid) or as the keeper's uid: a reset spares the keeper's uid, so the last
        user's processes survived it into the next trajectory (another client's), and its
        actions could signal and ptrace the keeper and init."""
        rules = (
            (sandbox.work_volume is None, "a named work_volume is its trajectory's"),
            (
                sandbox.numeric_uid is not None,
                f"user {sandbox.user!r} is a name (give the uid, e.g. '1000:1000')",
            ),
            (sandbox.numeric_uid != KEEPER_UID, f"user runs as the keeper's uid {KEEPER_UID}"),
            (not sandbox.runs_as_root, "actions run as root"),
            (sandbox.read_only_root, "the root filesystem is writable"),
            (sandbox.drop_all_capabilities, "capabilities are kept"),
            (sandbox.no_new_privileges, "new privileges are allowed"),
            (not sandbox.cap_add, "cap_add gives capabilities back"),
        )
        return next((why for ok, why in rules if not ok), None)

    def next_name(self) -> str:
        """A unique suffix for a pool container's name."""
        return f"pool{next(self._seq)}"

    # -- the trajectories' side -----------------------------------------------------------

    def take(self, key: PoolKey) -> Container | None:
        """A clean parked container of ``key`` that still runs (counted busy), or None
        (counted busy anyway: the caller creates one, which comes back here at its end).

        A parked container that died while it waited (killed, removed by someone else) is
        removed, never handed out: its trajectory's first action would fail, blamed on a
        client that had only opened it."""
        # Counted busy, and maybe a parked container popped: an interrupt (a
        # KeyboardInterrupt) before it was handed out lost it, running, and kept the key
        # counted busy for good; the container goes back to the parked ones instead.
        held: Container | None = None
        counted = False
        try:
            with self._lock:
                self._forget_idle()
                counted = self._demand.change(key, +1, self._clock())
            while True:
                with self._lock:
                    parked = self._parked.get(key)
                    held = found = parked.pop() if parked else None
                # Looked at outside the lock: the engine may be asked (milliseconds).
                if found is None or self._alive(found):
                    break
                log.warning("warm pool: parked container %s died; removed", found.handle.short_id)
                with self._lock:
                    self.counters["died_parked"] += 1
                held = None
                self._submit(self._remove_job, key, found)
            with self._lock:
                self.counters["hits" if found else "misses"] += 1
            self._refill(key)
            return found
        except BaseException:
            with self._lock:
                if counted:
                    self._demand.change(key, -1, self._clock())
                if held is not None:
                    self._parked.setdefault(key, []).append(held)
            raise

    def untake(self, key: PoolKey) -> None:
        """A ``take`` whose container was never made (its create failed)."""
        with self._lock:
            self._demand.change(key, -1, self._clock())

    def give_back(self, key: PoolKey, container: Container) -> None:
        """A container that served a trajectory: reset it in the background, then park it if
        the key still wants it, else remove it."""
        with self._lock:
            stale = [] if self._closed else self._make_room(key, returning=True)
            keep = not self._closed and self._room(key, returning=True)
            if keep:
                self._resetting[key] += 1  # still busy until its reset ends
            else:
                self._demand.change(key, -1, self._clock())
                self.counters["removed_surplus"] += 1
        self._remove_all(stale)
        self._submit(self._reset_job if keep else self._remove_job, key, container)

    def prewarm(self, key: PoolKey, count: int) -> None:
        """Create up to ``count`` parked containers of ``key`` now (bounded by the limits);
        they are kept while ``prewarm_s`` lasts even without demand. ``AoeError`` once the
        pool is closed (it made nothing, and its caller took the prewarm for done)."""
        count = prewarm_count(count)
        with self._lock:
            if self._closed:
                raise AoeError("the warm pool is closed: nothing can be prewarmed")
            self._floor[key] = (count, self._clock() + self.config.prewarm_s)
        self._refill(key)

    # -- sizing ---------------------------------------------------------------------------

    def target(self, key: PoolKey) -> int:
        """Parked containers ``key`` should have: its recent peak in use (or its prewarm
        floor), at most ``max_per_key``. Caller holds the lock."""
        now = self._clock()
        floor, until = self._floor.get(key, (0, 0.0))
        want = max(self._demand.peak(key, now), floor if now < until else 0)
        return min(self.config.max_per_key, want)

    def _held(self) -> int:
        """Containers the pool holds: parked, being created, being reset."""
        parked = sum(len(v) for v in self._parked.values())
        return parked + sum(self._filling.values()) + sum(self._resetting.values())

    def _room(self, key: PoolKey, returning: bool = False) -> bool:
        """Whether one more container of ``key`` fits its target (counting the busy ones,
        which come back) and the pool's total; ``returning``: the one asking is busy now."""
        return self._wants(key, returning) and self._held() < self.config.max_total

    def _wants(self, key: PoolKey, returning: bool = False) -> bool:
        """Whether ``key`` is below its target (counting the busy ones, which come back)."""
        mine = len(self._parked.get(key, ())) + self._filling[key] + self._demand.busy[key]
        return mine - returning < self.target(key)

    def _make_room(self, key: PoolKey, returning: bool = False) -> list[tuple[PoolKey, Container]]:
        """When ``key`` wants one more container and the pool's total is full, take out parked
        containers of other keys beyond their own target (no demand for them within the
        window), each key's oldest first, for the caller to remove. Caller holds the lock.

        Parked containers went only when one came back: keys nobody asked for any more (one
        per memory limit a client's /run_code requests gave) kept the total full for ever,
        and every other key's containers were removed as surplus."""
        stale: list[tuple[PoolKey, Container]] = []
        for other, parked in self._parked.items():
            if self._held() < self.config.max_total or not self._wants(key, returning):
                break
            if other == key:
                continue
            busy = self._filling[other] + self._demand.busy[other]
            surplus = min(len(parked), len(parked) + busy - self.target(other))
            for _ in range(surplus):
                if self._held() < self.config.max_total:
                    break
                stale.append((other, parked.pop(0)))
                self.counters["removed_stale"] += 1
        return stale

    def _remove_all(self, stale: list[tuple[PoolKey, Container]]) -> None:
        for key, container in stale:
            self._submit(self._remove_job, key, container)

    def _refill(self, key: PoolKey) -> None:
        while True:
            with self._lock:
                if self._closed:
                    return
                stale = self._make_room(key)
                room = self._room(key)
                if room:
                    self._filling[key] += 1
            self._remove_all(stale)
            if not room:
                return
            self._submit(self._fill_job, key, None)

    # -- jobs (worker threads) ------------------------------------------------------------

    def _submit(
        self,
        job: Callable[[PoolKey, Container | None], None],
        key: PoolKey,
        container: Container | None,
    ) -> None:
        try:
            with self._lock:
                future = self._jobs.submit(job, key, container)
                if container is not None:
                    self._queued[future] = container
        except RuntimeError:  # shut down: remove it here
            if container is not None:
                self._remove_quietly(container)
            return
        if container is not None:
            future.add_done_callback(self._job_ended)

    def _job_ended(self, future: Future[None]) -> None:
        """A job ended (or ``close`` cancelled it: its container is then left to ``close``)."""
        if not future.cancelled():
            with self._lock:
                self._queued.pop(future, None)

    def _reset_job(self, key: PoolKey, container: Container | None) -> None:
        assert container is not None
        t0 = self._clock()
        try:
            why = self._reset(container)
        except Exception as exc:  # noqa: BLE001 - any failure retires it
            why = f"{type(exc).__name__}: {exc}"
        self._settle(key, container, why, "resets", self._clock() - t0)

    def _fill_job(self, key: PoolKey, _: Container | None) -> None:
        try:
            container = self._create(key)
        except Exception as exc:  # noqa: BLE001 - a failed fill is logged, not raised
            log.warning("warm pool: creating a %s container failed: %s", key.describe(), exc)
            with self._lock:
                self._filling[key] -= 1
                self.counters["create_failed"] += 1
            return
        self._settle(key, container, None, "created", 0.0)

    def _remove_job(self, key: PoolKey, container: Container | None) -> None:
        assert container is not None
        self._remove_quietly(container)

    def _settle(
        self, key: PoolKey, container: Container, why: str | None, counter: str, took_s: float
    ) -> None:
        """Park a clean container (if still wanted), remove any other."""
        with self._lock:
            if counter == "resets":
                self._resetting[key] -= 1
                self._demand.change(key, -1, self._clock())
            else:
                self._filling[key] -= 1
            if why is not None:
                self.counters["reset_failed"] += 1
            else:
                self.counters[counter] += 1
                if counter == "resets":
                    self.counters["reset_us_total"] += round(took_s * 1e6)
            keep = why is None and not self._closed
            if keep:
                self._parked.setdefault(key, []).append(container)
        if why is not None:
            log.info("warm pool: container %s retired: %s", container.handle.short_id, why)
        if not keep:
            self._remove_quietly(container)

    def _remove_quietly(self, container: Container) -> None:
        """Remove ``container``; any failure is logged, not raised: it mostly runs on a worker
        thread, where an error other than ``AoeError`` (the engine's own) was kept in a future
        nobody reads, the container left in the engine without a word (the shutdown's sweep
        of the session removes it at the latest)."""
        try:
            self._remove(container)
        except Exception as exc:  # noqa: BLE001 - AoeError or the engine's own errors
            log.warning("warm pool: removing %s failed: %s", container.handle.short_id, exc)

    # -- reporting and shutdown -----------------------------------------------------------

    def _forget_idle(self) -> None:
        """Forget the keys with nothing parked, busy, being made or reset, no demand within
        the window and no prewarm floor. Caller holds the lock. Every key ever seen stayed
        in these tables and in /metrics' gauges: a client's /run_code memory limits, one key
        each, grew the service's memory and every scrape without bound."""
        now = self._clock()
        for key in set(self._parked) | set(self._demand.busy) | set(self._floor):
            _, until = self._floor.get(key, (0, 0.0))
            if (
                self._parked.get(key)
                or self._filling[key]
                or self._resetting[key]
                or self._demand.peak(key, now)
                or now < until
            ):
                continue
            for table in (self._parked, self._filling, self._resetting, self._floor):
                table.pop(key, None)
            self._demand.forget(key)

    def stats(self) -> PoolStats:
        with self._lock:
            self._forget_idle()
            keys = set(self._parked) | set(self._demand.busy)
            return PoolStats(
                parked={k.describe(): len(self._parked.get(k, ())) for k in keys},
                in_use={k.describe(): self._demand.busy[k] - self._resetting[k] for k in keys},
                target={k.describe(): self.target(k) for k in keys},
                resetting=sum(self._resetting.values()),
                counters=dict(self.counters),
            )

    def close(self) -> None:
        """Stop taking work, let running jobs end, remove every parked container and every
        container whose reset or removal was still queued (those jobs are cancelled: a pool
        used alone, with no manager's sweep after it, left them in the engine)."""
        with self._lock:
            self._closed = True
        self._jobs.shutdown(wait=True, cancel_futures=True)
        with self._lock:
            parked = [c for cs in self._parked.values() for c in cs]
            parked += [c for f, c in self._queued.items() if f.cancelled()]
            self._parked.clear()
            self._queued.clear()
        for container in parked:
            with contextlib.suppress(Exception):
                self._remove(container)
