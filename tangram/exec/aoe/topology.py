"""A node's cores by NUMA domain, and the NUMA-local choice of cores for a grant.

The live runtime passes the scheduler core's decision (an explicit core list) to the manager;
``choose_cores`` is for standalone use (the benchmark, ``profile-cpu``, tests) and follows the
same rule a scheduler would: keep a grant inside one NUMA domain when any domain can hold it.
"""

from __future__ import annotations

import numbers
import os
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path

from tangram.core.numa import numa_picks
from tangram.core.resources import CpuNodeSpec
from tangram.exec.aoe.errors import GrantError

SYS_NODE = Path("/sys/devices/system/node")


def parse_cpulist(text: str) -> tuple[int, ...]:
    """``"0-3,8,10-11"`` -> ``(0, 1, 2, 3, 8, 10, 11)`` (the sysfs / cpuset list format)."""
    cores: set[int] = set()
    for part in text.strip().split(","):
        part = part.strip()
        if not part:
            continue
        lo, _, hi = part.partition("-")
        try:
            first, last = int(lo), int(hi or lo)
        except ValueError:
            raise ValueError(f"not a cpu list: {text!r}") from None
        if last < first:
            raise ValueError(f"not a cpu list (descending range {part!r}): {text!r}")
        cores.update(range(first, last + 1))
    return tuple(sorted(cores))


def format_cpulist(cores: Iterable[int]) -> str:
    """``(0, 1, 2, 5)`` -> ``"0-2,5"``."""
    out: list[str] = []
    run: list[int] = []
    for core in sorted(set(cores)):
        if run and core == run[-1] + 1:
            run.append(core)
            continue
        if run:
            out.append(f"{run[0]}-{run[-1]}" if len(run) > 1 else str(run[0]))
        run = [core]
    if run:
        out.append(f"{run[0]}-{run[-1]}" if len(run) > 1 else str(run[0]))
    return ",".join(out)


@dataclass(frozen=True)
class NumaTopology:
    """The cores of one node, grouped by NUMA domain (each a sorted tuple of core ids)."""

    domains: tuple[tuple[int, ...], ...]

    def __post_init__(self) -> None:
        if not self.domains or any(not d for d in self.domains):
            raise GrantError(
                f"a topology needs at least one non-empty NUMA domain, got {self.domains!r}"
            )
        seen = [c for d in self.domains for c in d]
        # Checked here, where the topology is made: a negative id became a cpuset like '-1-0'
        # that only the engine refused, at the first container's create; True and 1.0 equal
        # core 1 in the ledger but are written 'True' and '1.0'.
        odd = [c for c in seen if isinstance(c, bool) or not isinstance(c, numbers.Integral)]
        if odd or any(c < 0 for c in seen):
            raise GrantError(f"core ids must be whole numbers from 0, got {self.domains!r}")
        if len(seen) != len(set(seen)):
            raise GrantError(f"a core appears in two NUMA domains: {self.domains!r}")

    @property
    def cores(self) -> tuple[int, ...]:
        return tuple(sorted(c for d in self.domains for c in d))

    def domain_of(self, core: int) -> int:
        for i, domain in enumerate(self.domains):
            if core in domain:
                return i
        raise GrantError(f"core {core} is not on this node (cores {format_cpulist(self.cores)})")

    @classmethod
    def from_spec(cls, spec: CpuNodeSpec) -> NumaTopology:
        """The topology the core's ``CpuNodeSpec`` describes (cores numbered domain by domain)."""
        per = spec.cores // spec.numa_domains
        return cls(tuple(tuple(range(d * per, (d + 1) * per)) for d in range(spec.numa_domains)))

    def to_spec(self, name: str, memory_gb: float) -> CpuNodeSpec:
        """A ``CpuNodeSpec`` with this node's core and domain counts (ids may be renumbered)."""
        sizes = {len(d) for d in self.domains}
        domains = len(self.domains) if len(sizes) == 1 else 1
        return CpuNodeSpec(
            name=name, cores=len(self.cores), numa_domains=domains, memory_gb=memory_gb
        )


def read_host_topology(sys_node: Path = SYS_NODE) -> NumaTopology:
    """This machine's NUMA domains from sysfs, limited to the cores this process may use.

    Falls back to one domain of all usable cores when sysfs has no node directory (containers,
    non-NUMA kernels).
    """
    try:
        usable = set(os.sched_getaffinity(0))
    except (AttributeError, OSError):
        usable = set(range(os.cpu_count() or 1))
    domains = []
    nodes = (
        sorted(sys_node.glob("node[0-9]*"), key=lambda p: int(p.name[4:]))
        if sys_node.is_dir()
        else []
    )
    for node in nodes:
        try:
            cores = tuple(c for c in parse_cpulist((node / "cpulist").read_text()) if c in usable)
        except (OSError, ValueError):
            continue
        if cores:
            domains.append(cores)
    if not domains:
        domains = [tuple(sorted(usable))]
    return NumaTopology(tuple(domains))


def as_topology(topology: NumaTopology | CpuNodeSpec) -> NumaTopology:
    return topology if isinstance(topology, NumaTopology) else NumaTopology.from_spec(topology)


def choose_cores(
    topology: NumaTopology | CpuNodeSpec, free: Iterable[int], n: int
) -> tuple[int, ...] | None:
    """``n`` free cores, NUMA-local when possible, or None when fewer than ``n`` are free.

    The rule is the core's (``tangram.core.numa.numa_picks``: one domain by best fit, else the
    fewest domains); within a domain, the lowest core ids; the grant is returned sorted.
    """
    topo = as_topology(topology)
    if n < 1:
        raise GrantError(f"a grant needs at least one core, asked for {n}")
    if n > len(topo.cores):
        raise GrantError(f"asked for {n} cores on a node of {len(topo.cores)}")
    free_set = set(free)
    per_domain = [tuple(c for c in d if c in free_set) for d in topo.domains]
    if sum(len(d) for d in per_domain) < n:
        return None
    return tuple(sorted(c for d, k in numa_picks(per_domain, n) for c in per_domain[d][:k]))
