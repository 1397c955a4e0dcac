"""``RayConfig``: how Tangram runs on a Ray cluster (names, node labels, fault bounds)."""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from tangram.core.resources import ApiEndpointSpec, ClusterSpec
from tangram.exec.runtime.config import RuntimeConfig
from tangram.exec.runtime.records import is_finite_number

#: Ray node labels a deployment may set on a node (``ray start --labels``) to shape its agent:
#: the host cores its containers get (a cpulist, "" for none), its GPUs ("cpu-N" for N
#: CPU-backed devices, "0" for none; absent: what NVML finds), its Tangram name, its
#: container memory in GB.
LABEL_CORES = "tangram-cores"
LABEL_GPUS = "tangram-gpus"
LABEL_NAME = "tangram-name"
LABEL_MEMORY = "tangram-memory-gb"


@dataclass(frozen=True)
class RayConfig:
    """Settings of the scheduler actor and its node agents.

    - ``namespace``, ``name``: where the detached scheduler actor is found by name.
    - ``runtime``: the same ``RuntimeConfig`` as the single-node service (policy, bounds).
    - ``apis``: the API endpoints of the cluster (called from the scheduler actor).
    - ``endpoints``: extra endpoint callables by name (``builtin_endpoints`` otherwise), each
      under a name the cluster declares (``apis``, or the cluster file's).
    - ``services``: EOE service specs every GPU agent registers (None: ``reward``, ``teacher``).
    - ``gpu_memory_gb``: memory of each CPU-backed GPU device (GPUs found by NVML say theirs).
    - ``ping_every_s``, ``lost_after_s``: the scheduler pings every agent this often; one that
      leaves a ping unanswered for ``lost_after_s`` after it was sent is lost (its node too):
      its running actions end with ``node_lost``. An agent whose process died is lost at once (Ray says so).
    - ``aoe``: keyword arguments of each agent's ``AoeConfig`` (e.g. ``kill_grace_s``,
      ``warm_pool``).
    - ``prewarm``: ``/run_code`` python containers each CPU agent has made for its warm pool
      at its start (``tangram serve --prewarm``; needs ``aoe["warm_pool"]`` on; 0: none).
    - ``torch_threads``: threads of torch in each GPU agent (CPU-backed devices share the
      node's cores: 1 keeps a call on one core); None leaves torch's default.
    - ``http``: ``ServeOptions`` of an HTTP service in the scheduler actor (None: Ray only).
    - ``direct_calls``: the calls on actions' paths (run a CPU action, call a GPU service,
      open and close a container) go to each agent over a direct, authenticated TCP
      connection (``channel``) instead of Ray actor calls: about 2 ms less per action here.
    - ``cluster``: a cluster file's spec: its nodes (and APIs, replacing ``apis``) are the
      cluster, matched to Ray nodes by their ``tangram-name`` label; a declared node with no
      Ray node yet is fenced until one joins (capacity added without a restart). None: the
      spec comes from the Ray nodes alive at the start.
    - ``join_new_nodes``: a Ray node that joins (or was up at the start) under a Tangram name
      the cluster lacks, with or without a cluster file, gets an agent and its CPU and GPU
      nodes are added to the core with the shape its agent reports (``Scheduler.add_node``),
      without a restart. False: such a node is only listed (``status()["unplaced_nodes"]``)
      and the cluster keeps the nodes it started with (and the file's).
    """

    namespace: str = "tangram"
    name: str = "tangram-scheduler"
    runtime: RuntimeConfig = field(default_factory=RuntimeConfig)
    apis: tuple[ApiEndpointSpec, ...] = (
        ApiEndpointSpec("echo", concurrency=256),
        ApiEndpointSpec("search", concurrency=8, rate_per_s=20.0, burst=4),
    )
    endpoints: Mapping[str, Callable[[Any], Any]] | None = None
    services: Sequence[Any] | None = None
    gpu_memory_gb: float = 2.0
    ping_every_s: float = 0.5
    lost_after_s: float = 3.0
    aoe: Mapping[str, Any] = field(default_factory=dict)
    prewarm: int = 0
    torch_threads: int | None = None
    http: Any = None
    cluster: ClusterSpec | None = None
    direct_calls: bool = True
    join_new_nodes: bool = True

    def __post_init__(self) -> None:
        for name, unit in (("ping_every_s", "s"), ("lost_after_s", "s"), ("gpu_memory_gb", "GB")):
            value = getattr(self, name)
            # (inf pings, with an inf lost_after_s: the watch slept for ever, no ping sent, no
            # death or join noticed; '1' or None: a TypeError naming nothing; True: 1)
            if not (is_finite_number(value) and value > 0):
                raise ValueError(f"{name} must be a positive number ({unit}), got {value!r}")
        if self.lost_after_s < 2 * self.ping_every_s:
            raise ValueError(
                f"lost_after_s ({self.lost_after_s:g}) must be at least two pings "
                f"({2 * self.ping_every_s:g} s)"
            )
        if isinstance(self.prewarm, bool) or not isinstance(self.prewarm, int) or self.prewarm < 0:
            raise ValueError(f"prewarm must be an integer >= 0, got {self.prewarm!r}")
        threads = self.torch_threads
        if threads is not None and (
            isinstance(threads, bool) or not isinstance(threads, int) or threads < 1
        ):  # (-1 failed each GPU agent's start in torch; 0 read as its default, 1.5 as 1)
            raise ValueError(f"torch_threads must be None or an integer >= 1, got {threads!r}")
        self._check_endpoints()
        self._check_aoe()

    def _check_aoe(self) -> None:
        """``ValueError`` naming the setting when ``aoe`` is no ``AoeConfig`` its agents
        could make (each adds its node's ``topology``): given as is to every agent, a
        misspelt key or a bad value failed each agent's start, a Ray actor error per node
        naming no setting of this config."""
        from tangram.exec.aoe.config import AoeConfig

        if not isinstance(self.aoe, Mapping):
            raise ValueError(f"aoe must be a mapping of AoeConfig settings, got {self.aoe!r}")
        if "topology" in self.aoe:
            raise ValueError("aoe: topology is set by each agent from its node's cores")
        try:
            AoeConfig(**dict(self.aoe))
        except Exception as exc:  # noqa: BLE001 - AoeError, an unknown key's TypeError: named
            raise ValueError(f"aoe: {exc}") from None

    def _check_endpoints(self) -> None:
        """``ValueError`` for an endpoint under a name the cluster's APIs lack (the file's
        when ``cluster`` is given, else ``apis``), or one that is no callable. Taken, a
        typo's callable was never called (the declared endpoint's calls went to the
        built-in demo, fake hits) and a non-callable failed each call of its endpoint."""
        declared = {a.name for a in (self.cluster.apis if self.cluster is not None else self.apis)}
        for name, fn in (self.endpoints or {}).items():
            if name not in declared:
                raise ValueError(
                    f"endpoints: {name!r} is no API endpoint the cluster declares "
                    f"({sorted(declared)}): declare it (apis, or the cluster file's [[api]])"
                )
            if not callable(fn):
                raise ValueError(f"endpoints[{name!r}] must be a callable, got {type(fn).__name__}")
