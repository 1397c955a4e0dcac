"""Configuration of the AOE executor: the manager's settings and the per-task sandbox.

Both are frozen dataclasses so a configuration can be shared between threads and logged as
is. The sandbox is strict by default; every field that loosens it is named by
``SandboxConfig.relaxations()`` so the manager can log a warning instead of relaxing silently.
"""

from __future__ import annotations

import math
import numbers
import posixpath
import re
from collections.abc import Mapping
from dataclasses import dataclass, field, fields
from typing import Literal

from tangram.core.resources import CpuNodeSpec
from tangram.exec.aoe.errors import AoeError
from tangram.exec.aoe.topology import NumaTopology

#: Images built by ``scripts/ensure-docker.sh``.
BUSYBOX_IMAGE = "tangram-busybox"
PYTHON_IMAGE = "tangram-python"
#: Built by ``scripts/ensure-compilers-image.sh`` when a language needs it (C, C++, Java, Go,
#: Node, Rust on top of tangram-python).
COMPILERS_IMAGE = "tangram-compilers"

#: The unprivileged account both images carry (``sandbox``, uid/gid 1000).
SANDBOX_USER = "1000:1000"
#: The longest time-out an action may have (30 days, the runtime's bound on an action's
#: ``timeout_s``): a time-out is a finite number of seconds, else the action has no end.
MAX_TIMEOUT_S = 30 * 86400.0
#: The longest ``AoeConfig.kill_grace_s``: a kill's effect shows in milliseconds (a process
#: stuck in the kernel, seconds); a grace of 1e9 s, finite, held the caller of an action
#: that outlived its kill for ever, never 'stuck', and each exec-transport action whose exit
#: code the engine never recorded as long.
MAX_KILL_GRACE_S = 3600.0
#: The most output an action may keep per stream (``max_output_bytes``, 1 GiB): the manager
#: holds it in memory, so 10**12 let one chatty action grow it without limit.
MAX_OUTPUT_BYTES = 1 << 30

#: The largest memory limit of a container, in GB (1 PiB, past any machine): 1e15 GB passed,
#: and the engine, which reads the limit as a 64-bit count of bytes, refused every open.
MAX_MEMORY_GB = 1 << 20
#: The largest ``SandboxConfig.work_size_mb``/``tmp_size_mb`` (1 PiB, ``MAX_MEMORY_GB``): a
#: tmpfs counts against the memory limit, so a larger one could never be filled; 10**12 MB
#: passed (the tmpfs showed 931P) and past 2**63 bytes the engine refused every open.
MAX_TMPFS_MB = MAX_MEMORY_GB * 1024
#: The largest ``SandboxConfig.pids_limit``: the kernel's most pids (``PID_MAX_LIMIT``, 2**22
#: on 64-bit); a larger limit limits nothing, and past 2**63 the engine cannot read it.
MAX_PIDS_LIMIT = 1 << 22

_CAPABILITY = re.compile(r"^(CAP_)?[A-Z_]+$")
#: The capabilities Linux has (``capabilities(7)``, to 5.9's CHECKPOINT_RESTORE), and docker's
#: ``ALL``: another name passed the pattern above, and every open failed at the engine
#: ('invalid CapAdd: unknown capability'), naming no setting.
_CAPABILITIES = frozenset(
    [
        "ALL",
        "CHOWN",
        "DAC_OVERRIDE",
        "DAC_READ_SEARCH",
        "FOWNER",
        "FSETID",
        "KILL",
        "SETGID",
        "SETUID",
        "SETPCAP",
        "LINUX_IMMUTABLE",
        "NET_BIND_SERVICE",
        "NET_BROADCAST",
        "NET_ADMIN",
        "NET_RAW",
        "IPC_LOCK",
        "IPC_OWNER",
        "SYS_MODULE",
        "SYS_RAWIO",
        "SYS_CHROOT",
        "SYS_PTRACE",
        "SYS_PACCT",
        "SYS_ADMIN",
        "SYS_BOOT",
        "SYS_NICE",
        "SYS_RESOURCE",
        "SYS_TIME",
        "SYS_TTY_CONFIG",
        "MKNOD",
        "LEASE",
        "AUDIT_WRITE",
        "AUDIT_CONTROL",
        "SETFCAP",
        "MAC_OVERRIDE",
        "MAC_ADMIN",
        "SYSLOG",
        "WAKE_ALARM",
        "BLOCK_SUSPEND",
        "AUDIT_READ",
        "PERFMON",
        "BPF",
        "CHECKPOINT_RESTORE",
    ]
)
#: Where the work dir may not be: the root, the container's other writable places (a reset
#: empties those on its own), the kernel's file systems.
_NOT_WORK_DIRS = frozenset({"/", "/tmp", "/dev", "/dev/shm", "/dev/mqueue", "/proc", "/sys"})
#: The kernel's file systems, inside which the engine mounts no work dir.
_KERNEL_DIRS = ("/proc", "/sys")
#: The image's system directories: a work dir's empty tmpfs over one hides the image's own
#: files there (its passwd, shell, libraries), and every action then fails naming no setting.
#: Only the directories themselves: a work dir inside one (``/usr/src/app``) hides nothing.
_SYSTEM_DIRS = frozenset(
    {"/bin", "/boot", "/etc", "/lib", "/lib32", "/lib64", "/libx32", "/sbin", "/usr", "/var"}
    | {f"/usr/{d}" for d in ("bin", "include", "lib", "lib32", "lib64", "libexec", "local")}
    | {"/usr/sbin", "/usr/share", "/var/lib"}
)
#: The most containers a warm pool may hold, per key or in all: each parked one holds its
#: memory limit's tmpfs and a process tree on the node, so beyond this it is a typo, not a pool.
MAX_POOLED = 1_024
#: The most threads a warm pool resets, creates and removes containers on (each a blocking
#: engine call: more than the engine serves at once only queue there).
MAX_POOL_WORKERS = 64
#: The largest uid or gid the engine takes (runc: "uids and gids must be in range
#: 0-2147483647").
MAX_ID = 2**31 - 1
#: A number the engine reads as a uid or gid (Go's Atoi: a sign allowed, ASCII digits).
_ID_NUMBER = re.compile(r"[+-]?[0-9]+\Z")
#: A user or group name the engine may look up in the image: no whitespace or control
#: character (never in a passwd or group file), no ':' (their field separator), not opening
#: with '-' or '+' (no account's; a '+' line is NIS's), at most 256 characters.
_ID_NAME = re.compile(r"[^\s\x00-\x1f\x7f:+\-][^\s\x00-\x1f\x7f:]{0,255}\Z")
#: A docker volume name (no '/': a path would be bind-mounted from the host, read-write).
_VOLUME = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.-]{0,200}\Z")


def _int_in(value: object, low: int, high: int) -> bool:
    """Whether ``value`` is an int (not a bool: True passed as 1) in [``low``, ``high``]."""
    return not isinstance(value, bool) and isinstance(value, int) and low <= value <= high


def _whole_number(digits: str) -> int | None:
    """``digits`` as a number when they are ASCII digits (docker reads no other), else None:
    ``str.isdigit`` also takes '²', which ``int`` then refuses with a ValueError."""
    return int(digits) if digits.isascii() and digits.isdigit() else None


def user_problem(user: str) -> str | None:
    """Why the engine could never run as ``user`` (None when it may): the form it takes is
    ``USER[:GROUP]``, each a name or a number in [0, ``MAX_ID``], either part empty (the
    image's user or the user's group). Anything else failed only at the container's start,
    with the engine's message ('unable to find user  1000', 'uids and gids must be in
    range'), at the first open or the warm pool's first fill. Whether a name exists is the
    image's to say, at the start."""
    if len(user.split(":")) > 2:
        return "must be USER or USER:GROUP (one ':' at most)"
    for part, what in zip(user.split(":"), ("user", "group"), strict=False):
        if not part:
            continue
        if _ID_NUMBER.match(part):
            if not 0 <= int(part) <= MAX_ID:
                return f"the {what} id {part} is out of the engine's range 0-{MAX_ID}"
        elif not _ID_NAME.match(part):
            return (
                f"the {what} {part!r} is no name or id (a name has no whitespace, control "
                "character or ':', opens with neither '-' nor '+', and has at most 256 "
                "characters)"
            )
    return None


@dataclass(frozen=True)
class SandboxConfig:
    """How one trajectory's container is confined. The defaults are the strict sandbox.

    - ``network``: False gives the container no network at all (``network_mode=none``).
    - ``user``: the uid:gid actions run as (``USER[:GROUP]``, each a name or an id in
      [0, 2147483647], else refused here); root is a relaxation.
    - ``read_only_root``: the image's filesystem is read-only; only ``work_dir`` and ``/tmp``
      (tmpfs) are writable.
    - ``work_dir``, ``work_size_mb``: the writable working directory (a plain absolute path,
      not the root, /tmp, /dev, /proc or /sys, nor inside the last two, nor a system
      directory such as /etc, /usr or /lib, whose files it would hide), a tmpfs of that size (MB, at most
      ``MAX_TMPFS_MB``, as ``tmp_size_mb``) owned by the sandbox user (counts against the memory limit), or the named docker volume
      ``work_volume`` when given: each trajectory gets its own (``work_volume``-<digest>),
      which survives its ``recreate`` and a restart of the service, and is removed when the
      trajectory closes; another live manager's trajectory on it is refused (never shared).
    - ``memory_limit``: False lifts the per-trajectory memory limit; ``pids_limit`` None lifts
      the process-count limit.
    - ``no_new_privileges`` and ``drop_all_capabilities``; ``cap_add`` gives some back.
    """

    network: bool = False
    user: str = SANDBOX_USER
    read_only_root: bool = True
    work_dir: str = "/work"
    work_size_mb: int = 1024
    work_volume: str | None = None
    tmp_size_mb: int = 64
    memory_limit: bool = True
    pids_limit: int | None = 256
    no_new_privileges: bool = True
    drop_all_capabilities: bool = True
    cap_add: tuple[str, ...] = ()

    def __post_init__(self) -> None:
        # Each field of its own type first: network='no' (a string, so truthy) gave the
        # container a network, and user=1000 or work_dir=None raised a bare AttributeError
        # far from here, naming neither the field nor the fault.
        for name in (
            "network",
            "read_only_root",
            "memory_limit",
            "no_new_privileges",
            "drop_all_capabilities",
        ):
            value = getattr(self, name)
            if not isinstance(value, bool):
                raise AoeError(f"SandboxConfig.{name} must be True or False, got {value!r}")
        for name in ("user", "work_dir"):
            value = getattr(self, name)
            if not isinstance(value, str):
                raise AoeError(f"SandboxConfig.{name} must be a string, got {value!r}")
        problem = user_problem(self.user)
        if problem:
            raise AoeError(f"SandboxConfig.user {self.user!r}: {problem}")
        if self.work_volume is not None and not isinstance(self.work_volume, str):
            raise AoeError(
                f"SandboxConfig.work_volume must be None or a string, got {self.work_volume!r}"
            )
        if self.work_volume is not None and not _VOLUME.match(self.work_volume):
            raise AoeError(
                f"SandboxConfig.work_volume must be a docker volume name ([A-Za-z0-9_.-], no "
                f"'/': a host path would be bind-mounted read-write), got {self.work_volume!r}"
            )
        if not self.work_dir.startswith("/"):
            raise AoeError(
                f"SandboxConfig.work_dir must be an absolute path, got {self.work_dir!r}"
            )
        if posixpath.normpath(self.work_dir) != self.work_dir or self.work_dir in _NOT_WORK_DIRS:
            # '/work/../tmp' mounted a second tmpfs over /tmp, '/tmp' replaced /tmp's own
            # (mode 1777, 64 MB) with the work dir's, '/' failed the engine's create
            raise AoeError(
                "SandboxConfig.work_dir must be a plain absolute path (no '..', '.', '//' or "
                f"trailing '/') other than {', '.join(sorted(_NOT_WORK_DIRS))}, "
                f"got {self.work_dir!r}"
            )
        if self.work_dir in _SYSTEM_DIRS:  # (its tmpfs hid the image's files there)
            raise AoeError(
                f"SandboxConfig.work_dir must not be a system directory "
                f"({', '.join(sorted(_SYSTEM_DIRS))}): its empty tmpfs would hide the image's "
                f"files there, got {self.work_dir!r}"
            )
        inside = next((d for d in _KERNEL_DIRS if self.work_dir.startswith(d + "/")), None)
        if inside is not None:  # (the engine refused every start, naming no setting)
            raise AoeError(
                f"SandboxConfig.work_dir must not be inside {inside} (the kernel's: the engine "
                f"mounts nothing there), got {self.work_dir!r}"
            )
        for name in ("work_size_mb", "tmp_size_mb"):
            value = getattr(self, name)
            if not _int_in(value, 1, MAX_TMPFS_MB):
                raise AoeError(
                    f"SandboxConfig.{name} must be a positive integer at most {MAX_TMPFS_MB} "
                    f"(MB, 1 PiB), got {value!r}"
                )
        if self.pids_limit is not None and not _int_in(self.pids_limit, 8, MAX_PIDS_LIMIT):
            # (2**70 passed, and every open failed at the engine naming no setting)
            raise AoeError(
                f"SandboxConfig.pids_limit must be None (no limit) or from 8 to "
                f"{MAX_PIDS_LIMIT} (the kernel's most pids), got {self.pids_limit!r}"
            )
        if not isinstance(self.cap_add, tuple):
            raise AoeError(
                f"SandboxConfig.cap_add must be a tuple, got {type(self.cap_add).__name__}"
            )
        for cap in self.cap_add:
            if (
                not isinstance(cap, str)
                or not _CAPABILITY.match(cap)
                or cap.removeprefix("CAP_") not in _CAPABILITIES
            ):
                raise AoeError(f"SandboxConfig.cap_add: {cap!r} is not a capability name")

    @property
    def numeric_uid(self) -> int | None:
        """The uid actions run as when ``user`` gives it as a number (None for a name, which
        the image resolves: only it knows the uid)."""
        uid = self.user.strip().partition(":")[0].strip()
        return _whole_number(uid[1:] if uid[:1] == "+" else uid)

    @property
    def runs_as_root(self) -> bool:
        """Whether actions run as uid 0: any spelling docker reads as it (its uid part 0, 00,
        +0 or root, whatever the group; an empty one is the image's user, root in ours)."""
        uid = self.user.strip().partition(":")[0].strip()
        if uid in ("", "root"):
            return True
        return _whole_number(uid[1:] if uid[:1] in "+-" else uid) == 0

    def relaxations(self) -> tuple[str, ...]:
        """Human-readable names of every way this sandbox is looser than the default one."""
        out = []
        if self.network:
            out.append("network enabled")
        if self.runs_as_root and not self.user.strip().partition(":")[0].strip():
            # An empty uid part is the image's user (its Config.User), which need not be
            # root: this config cannot see the image, so it says whose user it is.
            out.append(
                f"runs as the image's user (user={self.user!r}: its Config.User, root when it "
                "names none)"
            )
        elif self.runs_as_root:
            out.append(f"runs as root (user={self.user!r})")
        if not self.read_only_root:
            out.append("writable root filesystem")
        if not self.memory_limit:
            out.append("no memory limit")
        if self.pids_limit is None:
            out.append("no pids limit")
        if not self.no_new_privileges:
            out.append("new privileges allowed")
        if not self.drop_all_capabilities:
            out.append("default capabilities kept")
        if self.cap_add:
            out.append(f"capabilities added: {', '.join(self.cap_add)}")
        if self.work_volume:
            out.append(
                f"work dir on docker volumes {self.work_volume}-<trajectory> (host disk, no size "
                "limit, not charged to the memory limit; removed when the trajectory closes)"
            )
        return tuple(out)


@dataclass(frozen=True)
class WarmPoolConfig:
    """The warm pool of parked containers (``pool.py``); ``max_per_key`` 0 turns it off.

    - ``max_per_key``: parked containers per (image, memory, sandbox) at most.
    - ``max_total``: parked (or resetting) containers of all keys at most.
    - ``window_s``: a key keeps as many parked as it had in use at once over this window.
    - ``prewarm_s``: how long a ``prewarm`` count holds without demand.
    - ``workers``: threads that reset, create and remove pool containers.
    """

    max_per_key: int = 0
    max_total: int = 32
    window_s: float = 60.0
    prewarm_s: float = 600.0
    workers: int = 4

    def __post_init__(self) -> None:
        for name in ("max_per_key", "max_total"):
            value = getattr(self, name)
            if not _int_in(value, 0, MAX_POOLED):
                raise AoeError(
                    f"WarmPoolConfig.{name} must be an integer >= 0 and at most {MAX_POOLED}, "
                    f"got {value!r}"
                )
        if not _int_in(self.workers, 1, MAX_POOL_WORKERS):
            raise AoeError(
                f"WarmPoolConfig.workers must be >= 1 and at most {MAX_POOL_WORKERS}, "
                f"got {self.workers!r}"
            )
        for name in ("window_s", "prewarm_s"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, numbers.Real):
                # ('60' raised a bare TypeError from the comparison below)
                raise AoeError(f"WarmPoolConfig.{name} must be a number, got {value!r}")
            if not (value > 0 and math.isfinite(value)):  # NaN fails it too
                raise AoeError(f"WarmPoolConfig.{name} must be positive and finite, got {value}")

    @property
    def enabled(self) -> bool:
        return self.max_per_key > 0 and self.max_total > 0


Transport = Literal["runner", "exec"]
CgroupMode = Literal["auto", "direct", "docker"]


@dataclass(frozen=True)
class AoeConfig:
    """Settings of an ``AoeManager``.

    - ``image``: default image of a trajectory's container (``tangram-busybox``).
    - ``sandbox``: default ``SandboxConfig``; ``open_trajectory`` may override it per task.
    - ``memory_gb``: default memory limit of a container (at most ``MAX_MEMORY_GB``, 1 PiB).
    - ``cfs_period_us``/``park_quota_us``: the CFS period, and the quota of a parked container
      (1 ms per 100 ms = 1% of one core: the kernel's minimum quota is 1 ms); a parked
      container is also frozen, so the quota only bounds it while it thaws or freezes.
    - ``cgroup_mode``: ``direct`` writes the container's cgroup files (microseconds),
      ``docker`` calls ``docker update`` (milliseconds), ``auto`` uses direct writes when the
      cgroup files are writable and falls back to ``docker update`` otherwise.
    - ``transport``: ``runner`` sends commands to one long-lived shell per container over its
      exec stream (about a millisecond per action); ``exec`` runs one ``docker exec`` per
      action (tens of milliseconds).
    - ``topology``: None reads the host's NUMA topology from sysfs.
    - ``default_timeout_s``, ``max_output_bytes``: per-action defaults (each stream; the
      latter at most ``MAX_OUTPUT_BYTES``, 1 GiB).
    - ``kill_grace_s``: after a kill, how long to wait for an action's end before declaring the
      transport broken and restarting it.
    - ``use_init``: run docker's init (tini) as PID 1 so background processes are reaped.
    - ``cleanup_orphans``: on start, remove containers of dead managers (by label).
    - ``reaper``: start a watchdog process that removes this manager's containers when the
      manager's process dies, even by SIGKILL.
    - ``warm_pool``: parked containers handed to new trajectories (off by default).
    """

    image: str = BUSYBOX_IMAGE
    sandbox: SandboxConfig = field(default_factory=SandboxConfig)
    memory_gb: float = 1.0
    cfs_period_us: int = 100_000
    park_quota_us: int = 1_000
    cgroup_mode: CgroupMode = "auto"
    transport: Transport = "runner"
    topology: NumaTopology | CpuNodeSpec | None = None
    default_timeout_s: float = 600.0
    max_output_bytes: int = 1 << 20
    kill_grace_s: float = 5.0
    use_init: bool = True
    cleanup_orphans: bool = True
    reaper: bool = True
    docker_base_url: str | None = None
    warm_pool: WarmPoolConfig = field(default_factory=WarmPoolConfig)

    def __post_init__(self) -> None:
        self._check_types()
        if self.cgroup_mode not in ("auto", "direct", "docker"):
            raise AoeError(
                f"AoeConfig.cgroup_mode must be auto, direct or docker, got {self.cgroup_mode!r}"
            )
        if self.transport not in ("runner", "exec"):
            raise AoeError(f"AoeConfig.transport must be runner or exec, got {self.transport!r}")
        if not 1_000 <= self.cfs_period_us <= 1_000_000:
            raise AoeError(
                f"AoeConfig.cfs_period_us must be in [1000, 1000000], got {self.cfs_period_us}"
            )
        if not 1_000 <= self.park_quota_us <= self.cfs_period_us:
            raise AoeError(
                f"AoeConfig.park_quota_us must be in [1000, cfs_period_us={self.cfs_period_us}] "
                f"(the kernel's minimum quota is 1000 us), got {self.park_quota_us}"
            )
        for name in ("memory_gb", "default_timeout_s", "kill_grace_s"):
            value = getattr(self, name)
            if not (value > 0 and math.isfinite(value)):  # NaN fails it too
                raise AoeError(f"AoeConfig.{name} must be positive and finite, got {value!r}")
        if self.memory_gb > MAX_MEMORY_GB:
            raise AoeError(
                f"AoeConfig.memory_gb must be at most {MAX_MEMORY_GB} (1 PiB), got "
                f"{self.memory_gb!r}"
            )
        if self.kill_grace_s > MAX_KILL_GRACE_S:
            raise AoeError(
                f"AoeConfig.kill_grace_s must be at most {MAX_KILL_GRACE_S:g} s, got "
                f"{self.kill_grace_s!r}"
            )
        if self.default_timeout_s > MAX_TIMEOUT_S:
            raise AoeError(
                f"AoeConfig.default_timeout_s must be at most {MAX_TIMEOUT_S:g} s (30 days), "
                f"got {self.default_timeout_s!r}"
            )
        if not 1 <= self.max_output_bytes <= MAX_OUTPUT_BYTES:
            raise AoeError(
                f"AoeConfig.max_output_bytes must be positive and at most {MAX_OUTPUT_BYTES} "
                f"(1 GiB), got {self.max_output_bytes}"
            )

    def _check_types(self) -> None:
        """Each field of its own type, else an ``AoeError`` naming it: max_output_bytes=1.5
        failed every action naming the action's argument, cfs_period_us=100000.0 every open
        (the engine's JSON refusal), reaper='no' (truthy) started the watchdog, a sandbox
        given as a dict raised a bare AttributeError at the start, memory_gb='2' a bare
        TypeError here."""
        for name in ("cfs_period_us", "park_quota_us", "max_output_bytes"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int):
                raise AoeError(f"AoeConfig.{name} must be a whole number, got {value!r}")
        for name in ("memory_gb", "default_timeout_s", "kill_grace_s"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, numbers.Real):
                raise AoeError(f"AoeConfig.{name} must be a number, got {value!r}")
        for name in ("use_init", "cleanup_orphans", "reaper"):
            value = getattr(self, name)
            if not isinstance(value, bool):
                raise AoeError(f"AoeConfig.{name} must be True or False, got {value!r}")
        if not isinstance(self.image, str) or not self.image:
            raise AoeError(f"AoeConfig.image must be an image name, got {self.image!r}")
        if not isinstance(self.sandbox, SandboxConfig):
            raise AoeError(
                f"AoeConfig.sandbox must be a SandboxConfig, got {type(self.sandbox).__name__}"
            )
        if not isinstance(self.warm_pool, WarmPoolConfig):
            raise AoeError(
                f"AoeConfig.warm_pool must be a WarmPoolConfig, got {type(self.warm_pool).__name__}"
            )
        if self.topology is not None and not isinstance(self.topology, NumaTopology | CpuNodeSpec):
            # (a string or a count passed, and the manager's start raised a bare AttributeError)
            raise AoeError(
                "AoeConfig.topology must be None (this machine's), a NumaTopology or a "
                f"CpuNodeSpec, got {type(self.topology).__name__} {self.topology!r}"
            )
        url = self.docker_base_url
        if url is not None and (not isinstance(url, str) or not url.strip()):
            # ("" passed, and ``connect`` took it for none: the default engine, silently)
            raise AoeError(
                f"AoeConfig.docker_base_url must be None (the default engine) or a non-empty "
                f"URL, got {url!r}"
            )

    @classmethod
    def for_node(cls, topology: NumaTopology, settings: object) -> AoeConfig:
        """The config of a node agent: its ``topology`` with the ``aoe`` ``settings`` (a
        mapping of the other fields). ``ValueError`` opening with 'aoe' and naming the setting
        for anything else: a ``topology`` key raised a bare TypeError (a keyword given twice),
        a misspelt key one naming no setting."""
        if not isinstance(settings, Mapping):
            raise ValueError(f"aoe must be a mapping of AoeConfig settings, got {settings!r}")
        if "topology" in settings:  # (each agent's own cores: one topology cannot fit all)
            raise ValueError("aoe: topology is set by each agent from its node's cores")
        known = {f.name for f in fields(cls)}
        unknown = sorted(str(k) for k in settings if k not in known)
        if unknown:
            raise ValueError(f"aoe: {', '.join(unknown)} is no AoeConfig setting")
        try:
            return cls(topology=topology, **dict(settings))
        except AoeError as exc:
            raise ValueError(f"aoe: {exc}") from None

    def describe(self) -> dict[str, object]:
        """The settings as a plain dict (for logs and benchmark reports)."""
        return {f.name: getattr(self, f.name) for f in fields(self) if f.name != "topology"}
