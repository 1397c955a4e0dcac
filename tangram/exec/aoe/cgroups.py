"""The grant itself: set a container's cpuset and CFS quota, on cgroup v1, v2 or via docker.

A grant is three writes: the cores the container may run on (``cpuset.cpus``), how much CPU
time it may use per period (v1 ``cpu.cfs_quota_us``; v2 ``cpu.max`` = "quota period"), and
the thaw of its freezer. Parking freezes the container (so it takes no CPU at all outside a
grant, and granted cores are never shared with parked containers), writes the near-zero quota
back and widens the cpuset to the whole node. A resize (a malleable action's grant grows or
shrinks while it runs) is the first two writes alone. Writing the files takes microseconds;
``docker update`` with ``docker pause``/``unpause`` does the same through the engine in
milliseconds, and is the fallback when the files are not reachable (a remote engine, a
non-root manager, an unfamiliar cgroup layout).

A *weighted* grant (``grant_weighted``; for a policy whose CPU grants lend idle cycles,
``Capabilities.cpu_lends_idle``) is a CFS weight instead: the cpuset is the whole pool of cores
the executor manages, there is no quota, and the weight is proportional to the granted units
(v2 ``cpu.weight`` = 100 x units, v1 and docker ``cpu.shares`` = 1024 x units), so the cycles a
serial phase leaves idle go to the node's other actions. Its resize is one write, the weight
(``reweigh``); park writes the default weight back along with the usual park settings.

The container's cgroup is found from its init process: ``/proc/PID/cgroup`` gives the path in
each hierarchy and ``/proc/self/mountinfo`` where each hierarchy is mounted, so both the
``cgroupfs`` (``/docker/ID``) and the ``systemd`` (``system.slice/docker-ID.scope``) drivers
work without guessing.
"""

from __future__ import annotations

import contextlib
import os
from abc import ABC, abstractmethod
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from tangram.exec.aoe.errors import AoeError
from tangram.exec.aoe.topology import format_cpulist

#: The empty child cgroup a v1 container's freezer keeps frozen (``CgroupV1._keep_freezer_on``).
KEEP_FROZEN = "tangram-keep-frozen"


class CgroupGone(AoeError):
    """The container's cgroup disappeared (the container exited or was removed)."""


def _write(path: Path, value: str) -> None:
    """Write ``value`` to a cgroup file: ``CgroupGone`` when it is gone, ``AoeError`` naming
    the file for any other failure, the open's included (its callers suppress or catch
    ``AoeError``; a bare OSError from the open, EACCES or ENODEV, went past them)."""
    try:
        fd = os.open(path, os.O_WRONLY | os.O_TRUNC)  # TRUNC: as `echo >`; harmless on cgroupfs
    except FileNotFoundError as exc:
        raise CgroupGone(f"cgroup file {path} is gone (container stopped?)") from exc
    except OSError as exc:
        raise AoeError(f"cannot open {path} to write {value!r}: {exc}") from exc
    try:
        os.write(fd, value.encode())
    except OSError as exc:
        raise AoeError(f"writing {value!r} to {path} failed: {exc}") from exc
    finally:
        os.close(fd)


def _read(path: Path) -> str:
    try:
        return path.read_text()
    except FileNotFoundError as exc:
        raise CgroupGone(f"cgroup file {path} is gone (container stopped?)") from exc


def _keyed(text: str, key: str) -> int | None:
    for line in text.splitlines():
        name, _, value = line.partition(" ")
        if name == key:
            return int(value)
    return None


@dataclass(frozen=True)
class Freezer:
    """How one cgroup version freezes a cgroup and everything below it: the file, its two
    values, and how to read that the freezing is complete (processes stuck in the kernel can
    make it lag behind the write)."""

    file: str
    frozen: str
    thawed: str
    #: The file to read, and the test on its text, that the freezing is complete.
    done_file: str
    done: Callable[[str], bool]

    def freeze(self, directory: Path) -> None:
        _write(directory / self.file, self.frozen)

    def thaw(self, directory: Path) -> None:
        _write(directory / self.file, self.thawed)

    def is_frozen(self, directory: Path) -> bool:
        return self.done(_read(directory / self.done_file))


#: The freezers by cgroup version: v1's ``freezer`` controller, v2's ``cgroup.freeze``.
FREEZERS: dict[int, Freezer] = {
    1: Freezer(
        "freezer.state", "FROZEN", "THAWED", "freezer.state", lambda t: t.strip() == "FROZEN"
    ),
    2: Freezer("cgroup.freeze", "1", "0", "cgroup.events", lambda t: _keyed(t, "frozen") == 1),
}


#: Which of ``find_cgroup_dirs``'s directories holds a container's freezer, by cgroup version.
FREEZER_DIR: dict[int, str] = {1: "freezer", 2: "unified"}

#: A container's CPU weight when no weighted grant set it: v2 ``cpu.weight``, v1 (and docker)
#: ``cpu.shares``; the kernel's defaults, what park writes back.
DEFAULT_WEIGHT = 100
DEFAULT_SHARES = 1024


#: The kernel's least CFS quota a period (µs): less is raised to it, so ``plan_action`` refuses
#: a ``quota_cores`` under ``MIN_QUOTA_US / cfs_period_us`` rather than report one not applied.
MIN_QUOTA_US = 1_000
#: The least units of a weighted grant: v2 ``cpu.weight`` 1 (``weight_of`` raises any less to
#: it), so ``plan_action`` refuses fewer rather than report a weight not applied.
MIN_WEIGHT_UNITS = 1 / DEFAULT_WEIGHT


def weight_of(units: float) -> int:
    """v2 ``cpu.weight`` of a weighted grant of ``units`` cores: 100 per core, in the kernel's
    range [1, 10000]."""
    return min(10_000, max(1, round(DEFAULT_WEIGHT * units)))


def shares_of(units: float) -> int:
    """v1 ``cpu.shares`` (docker ``cpu_shares``) of a weighted grant of ``units`` cores: 1024
    per core, in the kernel's range [2, 262144]."""
    return min(262_144, max(2, round(DEFAULT_SHARES * units)))


class CpuControl(ABC):
    """What the manager needs of a container's cgroup: grant, park, and read usage."""

    #: ``cgroup-v1``, ``cgroup-v2`` or ``docker-update``; reported by the benchmark.
    kind: str = "abstract"
    #: CPU a parked container can still take, in cores: none, every control freezes it. (The
    #: 1%-of-a-core parking quota that stays below the freezer is a second line only.)
    parked_cores: float = 0.0

    def __init__(self, period_us: int, park_quota_us: int, park_cores: tuple[int, ...]) -> None:
        self.period_us = period_us
        self.park_quota_us = park_quota_us
        self.park_cpus = format_cpulist(park_cores)
        #: A weighted grant changed the container's weight: park writes the default back (an
        #: exclusive grant never touches it, so its park is the writes it always was).
        self.weight_set = False

    def quota_us(self, quota_cores: float) -> int:
        """CFS quota for ``quota_cores`` cores' worth of CPU time (at least the kernel's 1 ms)."""
        return max(MIN_QUOTA_US, round(quota_cores * self.period_us))

    @abstractmethod
    def grant(self, cores: tuple[int, ...], quota_cores: float) -> None:
        """Let the container run on ``cores`` for ``quota_cores`` cores' worth of time."""

    @abstractmethod
    def resize(self, cores: tuple[int, ...], quota_cores: float) -> None:
        """A running grant's new cores and quota (a malleable action grew or shrank): the
        cpuset, then the quota; no freezer write (it runs)."""

    @abstractmethod
    def grant_weighted(self, pool: tuple[int, ...], units: float) -> None:
        """Let the container run on any core of ``pool`` with no quota, at the CPU weight of
        ``units`` cores (``weight_of``/``shares_of``); thaw last."""

    @abstractmethod
    def reweigh(self, units: float) -> None:
        """A running weighted grant's new size: one write, the weight (it runs)."""

    @abstractmethod
    def park(self) -> None:
        """Frozen, on the near-zero quota, between actions (memory, files and processes
        untouched: they go on at the next grant)."""

    @abstractmethod
    def unthrottle(self) -> None:
        """Thawed, no quota at all: for tearing the container down (throttled or frozen
        processes die slowly, if at all)."""

    @abstractmethod
    def usage_ns(self) -> int:
        """CPU time the container has used since it started, nanoseconds."""

    def pids(self) -> list[int] | None:
        """Host pids of the container's processes, or None when they cannot be listed here."""
        return None

    def background(self, on: bool) -> None:  # noqa: B027 - optional, no-op by default
        """The container's CPU weight at the lowest (on) or back at the default (off): work
        that holds no grant (a warm pool's reset) runs on idle cycles only. No-op by default."""

    def oom_kills(self) -> int | None:
        """How many processes the OOM killer has killed in the container, when known."""
        return None


class CgroupV1(CpuControl):
    """cgroup v1: separate ``cpu``, ``cpuset`` and ``cpuacct`` (and ``memory``) hierarchies."""

    kind = "cgroup-v1"

    def __init__(
        self, dirs: dict[str, Path], period_us: int, park_quota_us: int, park_cores: tuple[int, ...]
    ) -> None:
        super().__init__(period_us, park_quota_us, park_cores)
        self.cpu = dirs["cpu"]
        self.cpuset = dirs["cpuset"]
        self.cpuacct = dirs.get("cpuacct", dirs["cpu"])
        self.memory = dirs.get("memory")
        self.freezer = dirs["freezer"]
        if int(_read(self.cpu / "cpu.cfs_period_us")) != period_us:
            _write(self.cpu / "cpu.cfs_period_us", str(period_us))
        self._keep_freezer_on()

    def _keep_freezer_on(self) -> None:
        """Hold an empty child cgroup frozen for the container's life (runc removes it with
        the container). v1's freezer flips a kernel static key, patching code on every CPU,
        when the first cgroup of the host freezes and when the last one thaws: 80 us to 4 ms
        per park or grant here when a lone container was the only frozen one, 7 us with this
        child keeping the key on. Best effort: without it parking only costs more."""
        keep = self.freezer / KEEP_FROZEN
        with contextlib.suppress(OSError, AoeError):
            keep.mkdir(exist_ok=True)
            FREEZERS[1].freeze(keep)

    def grant(self, cores: tuple[int, ...], quota_cores: float) -> None:
        # Narrow the cores first, then raise the quota, then thaw: never more CPU than granted.
        _write(self.cpuset / "cpuset.cpus", format_cpulist(cores))
        _write(self.cpu / "cpu.cfs_quota_us", str(self.quota_us(quota_cores)))
        FREEZERS[1].thaw(self.freezer)

    def resize(self, cores: tuple[int, ...], quota_cores: float) -> None:
        _write(self.cpuset / "cpuset.cpus", format_cpulist(cores))
        _write(self.cpu / "cpu.cfs_quota_us", str(self.quota_us(quota_cores)))

    def grant_weighted(self, pool: tuple[int, ...], units: float) -> None:
        # Frozen until the last write: the weight, the pool, no quota, then thaw.
        self.weight_set = True
        _write(self.cpu / "cpu.shares", str(shares_of(units)))
        _write(self.cpuset / "cpuset.cpus", format_cpulist(pool))
        _write(self.cpu / "cpu.cfs_quota_us", "-1")
        FREEZERS[1].thaw(self.freezer)

    def reweigh(self, units: float) -> None:
        _write(self.cpu / "cpu.shares", str(shares_of(units)))

    def park(self) -> None:
        FREEZERS[1].freeze(self.freezer)
        _write(self.cpu / "cpu.cfs_quota_us", str(self.park_quota_us))
        _write(self.cpuset / "cpuset.cpus", self.park_cpus)
        if self.weight_set:
            _write(self.cpu / "cpu.shares", str(DEFAULT_SHARES))
            self.weight_set = False

    def unthrottle(self) -> None:
        FREEZERS[1].thaw(self.freezer)  # first: the quota's file may be gone already
        _write(self.cpu / "cpu.cfs_quota_us", "-1")

    def usage_ns(self) -> int:
        return int(_read(self.cpuacct / "cpuacct.usage"))

    def background(self, on: bool) -> None:
        _write(self.cpu / "cpu.shares", "128" if on else "1024")

    def pids(self) -> list[int] | None:
        return [int(p) for p in _read(self.cpu / "cgroup.procs").split()]

    def oom_kills(self) -> int | None:
        if self.memory is None:
            return None
        try:
            return _keyed(_read(self.memory / "memory.oom_control"), "oom_kill")
        except CgroupGone:
            return None


class CgroupV2(CpuControl):
    """cgroup v2: one directory with ``cpu.max``, ``cpuset.cpus`` and ``cpu.stat``."""

    kind = "cgroup-v2"

    def __init__(
        self, directory: Path, period_us: int, park_quota_us: int, park_cores: tuple[int, ...]
    ) -> None:
        super().__init__(period_us, park_quota_us, park_cores)
        self.dir = directory

    def grant(self, cores: tuple[int, ...], quota_cores: float) -> None:
        _write(self.dir / "cpuset.cpus", format_cpulist(cores))
        _write(self.dir / "cpu.max", f"{self.quota_us(quota_cores)} {self.period_us}")
        FREEZERS[2].thaw(self.dir)

    def resize(self, cores: tuple[int, ...], quota_cores: float) -> None:
        _write(self.dir / "cpuset.cpus", format_cpulist(cores))
        _write(self.dir / "cpu.max", f"{self.quota_us(quota_cores)} {self.period_us}")

    def grant_weighted(self, pool: tuple[int, ...], units: float) -> None:
        self.weight_set = True
        _write(self.dir / "cpu.weight", str(weight_of(units)))
        _write(self.dir / "cpuset.cpus", format_cpulist(pool))
        _write(self.dir / "cpu.max", f"max {self.period_us}")
        FREEZERS[2].thaw(self.dir)

    def reweigh(self, units: float) -> None:
        _write(self.dir / "cpu.weight", str(weight_of(units)))

    def park(self) -> None:
        FREEZERS[2].freeze(self.dir)
        _write(self.dir / "cpu.max", f"{self.park_quota_us} {self.period_us}")
        _write(self.dir / "cpuset.cpus", self.park_cpus)
        if self.weight_set:
            _write(self.dir / "cpu.weight", str(DEFAULT_WEIGHT))
            self.weight_set = False

    def unthrottle(self) -> None:
        FREEZERS[2].thaw(self.dir)
        _write(self.dir / "cpu.max", f"max {self.period_us}")

    def usage_ns(self) -> int:
        usec = _keyed(_read(self.dir / "cpu.stat"), "usage_usec")
        if usec is None:
            raise AoeError(f"{self.dir / 'cpu.stat'} has no usage_usec line")
        return usec * 1000

    def pids(self) -> list[int] | None:
        return [int(p) for p in _read(self.dir / "cgroup.procs").split()]

    def background(self, on: bool) -> None:
        _write(self.dir / "cpu.weight", "12" if on else "100")

    def oom_kills(self) -> int | None:
        try:
            return _keyed(_read(self.dir / "memory.events"), "oom_kill")
        except (CgroupGone, ValueError):
            return None


class DockerUpdate(CpuControl):
    """The same grant through the engine's API (``docker update``): slower, works anywhere."""

    kind = "docker-update"

    def __init__(
        self,
        api: Any,
        container_id: str,
        period_us: int,
        park_quota_us: int,
        park_cores: tuple[int, ...],
    ) -> None:
        super().__init__(period_us, park_quota_us, park_cores)
        self.api = api
        self.container_id = container_id

    def _update(self, quota_us: int | None, cpus: str | None, shares: int | None = None) -> None:
        import docker.errors

        fields = {"cpu_quota": quota_us, "cpuset_cpus": cpus, "cpu_shares": shares}
        try:
            self.api.update_container(
                self.container_id, **{k: v for k, v in fields.items() if v is not None}
            )
        except docker.errors.NotFound as exc:
            raise CgroupGone(f"container {self.container_id[:12]} is gone") from exc
        except docker.errors.APIError as exc:
            raise AoeError(f"docker update of {self.container_id[:12]} failed: {exc}") from exc

    def _pause(self, paused: bool) -> None:
        """``docker pause``/``unpause`` (the engine's freezer); already so is fine."""
        import docker.errors

        call = self.api.pause if paused else self.api.unpause
        try:
            call(self.container_id)
        except docker.errors.NotFound as exc:
            raise CgroupGone(f"container {self.container_id[:12]} is gone") from exc
        except docker.errors.APIError as exc:
            if ("is not paused" if not paused else "is already paused") in str(exc):
                return  # the state wanted (docker 20.10 says so with a 500, later ones a 409)
            what = "pause" if paused else "unpause"
            raise AoeError(f"docker {what} of {self.container_id[:12]} failed: {exc}") from exc

    def grant(self, cores: tuple[int, ...], quota_cores: float) -> None:
        self._update(self.quota_us(quota_cores), format_cpulist(cores))
        self._pause(False)

    def resize(self, cores: tuple[int, ...], quota_cores: float) -> None:
        self._update(self.quota_us(quota_cores), format_cpulist(cores))  # one engine call

    def grant_weighted(self, pool: tuple[int, ...], units: float) -> None:
        self.weight_set = True
        self._update(-1, format_cpulist(pool), shares_of(units))  # one engine call
        self._pause(False)

    def reweigh(self, units: float) -> None:
        self._update(None, None, shares_of(units))

    def park(self) -> None:
        self._pause(True)
        shares = DEFAULT_SHARES if self.weight_set else None  # in the same engine call
        self._update(self.park_quota_us, self.park_cpus, shares)
        self.weight_set = False

    def unthrottle(self) -> None:
        self._pause(False)
        self._update(-1, self.park_cpus)

    def usage_ns(self) -> int:
        stats = self.api.stats(self.container_id, stream=False)
        return int(stats["cpu_stats"]["cpu_usage"]["total_usage"])

    def pids(self) -> list[int] | None:
        try:
            top = self.api.top(self.container_id, ps_args="-o pid")
        except Exception:  # noqa: BLE001 - best effort; the caller falls back to docker exec
            return None
        return [int(row[0]) for row in top.get("Processes") or []]


# --- discovery ------------------------------------------------------------------------------


@dataclass(frozen=True)
class CgroupMount:
    """One cgroup hierarchy as mounted here: v1 (with its controllers) or v2 (unified)."""

    version: int
    mountpoint: Path
    root: str
    controllers: frozenset[str]


def read_mounts(mountinfo: Path = Path("/proc/self/mountinfo")) -> list[CgroupMount]:
    """The cgroup hierarchies mounted in this process's mount namespace."""
    mounts = []
    for line in mountinfo.read_text().splitlines():
        left, _, right = line.partition(" - ")
        fields, rfields = left.split(), right.split()
        if len(fields) < 5 or len(rfields) < 3:
            continue
        fstype = rfields[0]
        if fstype == "cgroup":
            opts = set(rfields[2].split(","))
            mounts.append(CgroupMount(1, Path(fields[4]), fields[3], frozenset(opts)))
        elif fstype == "cgroup2":
            mounts.append(CgroupMount(2, Path(fields[4]), fields[3], frozenset()))
    return mounts


def _join(mount: CgroupMount, path: str) -> Path:
    """The directory of cgroup ``path`` under ``mount`` (minding a mount of a sub-tree)."""
    if mount.root not in ("/", "") and path.startswith(mount.root):
        path = path[len(mount.root) :]
    return mount.mountpoint / path.lstrip("/")


def find_cgroup_dirs(
    pid: int, proc: Path = Path("/proc"), mountinfo: Path = Path("/proc/self/mountinfo")
) -> tuple[int, dict[str, Path]]:
    """Cgroup version and controller -> directory for process ``pid``.

    v1 when the ``cpu`` controller is on a v1 hierarchy (this includes hybrid hosts whose
    unified hierarchy has no controllers); v2 otherwise, with every controller in one
    directory (key ``unified``). Raises ``AoeError`` when the layout cannot be read.
    """
    try:
        lines = (proc / str(pid) / "cgroup").read_text().splitlines()
    except OSError as exc:
        raise AoeError(f"cannot read /proc/{pid}/cgroup: {exc}") from exc
    mounts = read_mounts(mountinfo)
    v1 = {c: m for m in mounts if m.version == 1 for c in m.controllers}
    v2 = next((m for m in mounts if m.version == 2), None)
    paths_v1: dict[str, str] = {}
    path_v2: str | None = None
    for line in lines:
        hier, _, rest = line.partition(":")
        controllers, _, path = rest.partition(":")
        if hier == "0" and controllers == "":
            path_v2 = path
        for c in controllers.split(","):
            if c:
                paths_v1[c] = path
    if "cpu" in v1 and "cpu" in paths_v1:
        dirs = {
            c: _join(v1[c], paths_v1[c])
            for c in ("cpu", "cpuset", "cpuacct", "memory", "pids", "freezer")
            if c in v1 and c in paths_v1
        }
        if "cpuset" not in dirs:
            raise AoeError("cgroup v1 host without a cpuset hierarchy: cannot pin cores")
        return 1, dirs
    if v2 is not None and path_v2 is not None:
        return 2, {"unified": _join(v2, path_v2)}
    raise AoeError(f"no cgroup hierarchy with the cpu controller found for pid {pid}")


def container_cgroup_dirs(
    pid: int,
    container_id: str,
    proc: Path = Path("/proc"),
    mountinfo: Path = Path("/proc/self/mountinfo"),
) -> tuple[int, dict[str, Path]]:
    """``find_cgroup_dirs`` of container ``container_id``'s init, host pid ``pid``;
    ``AoeError`` naming the cgroup found when it is not that container's (its id not in the
    path): an init that exited, its pid given to another process since it was seen the
    container's, would have that process's cgroup (a host service's) written."""
    version, dirs = find_cgroup_dirs(pid, proc, mountinfo)
    foreign = sorted({str(d) for d in dirs.values() if container_id not in str(d)})
    if foreign:
        raise AoeError(
            f"process {pid}'s cgroup {foreign[0]} is not container {container_id[:12]}'s "
            "(its init exited and the pid went to another process?)"
        )
    return version, dirs


def direct_control(
    pid: int,
    period_us: int,
    park_quota_us: int,
    park_cores: tuple[int, ...],
    proc: Path = Path("/proc"),
    mountinfo: Path = Path("/proc/self/mountinfo"),
    *,
    container_id: str | None = None,
) -> CpuControl:
    """A file-writing ``CpuControl`` for the container whose init has host pid ``pid``.

    Raises ``AoeError`` naming the missing or unwritable file when direct writes cannot work,
    or, given ``container_id``, naming the cgroup found when it is not that container's (its
    id not in the path): an init that exited at once may have its pid given to a host
    process, whose cgroup (a host service's) was then frozen at the park and granted."""
    if container_id is not None:
        version, dirs = container_cgroup_dirs(pid, container_id, proc, mountinfo)
    else:
        version, dirs = find_cgroup_dirs(pid, proc, mountinfo)
    if version == 1:
        if "freezer" not in dirs:
            raise AoeError("cgroup v1 host without a freezer hierarchy: cannot park by freezing")
        needed = [
            dirs["cpu"] / "cpu.cfs_quota_us",
            dirs["cpuset"] / "cpuset.cpus",
            dirs["freezer"] / "freezer.state",
        ]
    else:
        needed = [dirs["unified"] / name for name in ("cpu.max", "cpuset.cpus", "cgroup.freeze")]
    for path in needed:
        if not os.access(path, os.W_OK):
            why = "missing" if not path.exists() else "not writable by this user"
            raise AoeError(f"cannot grant by direct cgroup writes: {path} is {why}")
    if version == 1:
        return CgroupV1(dirs, period_us, park_quota_us, park_cores)
    return CgroupV2(dirs["unified"], period_us, park_quota_us, park_cores)
