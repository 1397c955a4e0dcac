"""The static baselines: a pod of fixed cores per trajectory, dedicated GPUs per service.

``StaticPods`` (Kubernetes): a trajectory asks for a pod of K cores on its container's node
when it opens (or with its first CPU action if it was never opened); pods are granted strictly
FCFS per node when K cores are free, and held until the trajectory closes, busy or not. Its
actions run inside the pod at their largest option not above K; until the pod is granted, they
queue.

``BurstablePods`` (Kubernetes, burstable QoS): pods request R cores and set no limit. They
are admitted by their requests like the static pods, but an action in a pod is not confined
to R cores: it may run as many threads as it has on the node's idle cycles, shared among the
node's busy pods in proportion to their requests (CFS weights; ``tangram.sim.cfs``).

``DedicatedGpus`` (SGLang-style serving): the first call of a service reserves G GPUs for it
for the rest of the run, as replicas of its smallest cell (the tensor-parallel degree its
memory needs); its calls queue FCFS per service and run one per replica. A service that finds
no GPU left to reserve has its calls rejected, with the arithmetic in the reason.

``SizedGpus`` (SGLang as operators size it): the same serving, but the GPU budget is split
among the services in proportion to the load each is expected to get (``tangram.core.demand``:
popularity x call cost), and every replica is deployed before the first call is served.
"""

from __future__ import annotations

from tangram.core.action import Action
from tangram.core.backlog import GPU_DOMAIN, Domain
from tangram.core.context import Context
from tangram.core.demand import ServiceDemand, size_replicas
from tangram.core.gpu_placement import host_holds, place_cell
from tangram.core.options import Options
from tangram.core.policies.base import DomainRule, RuleTraits
from tangram.core.resources import GpuNodeSpec, ResourceKind


class StaticPods(DomainRule):
    # A pod is granted to a waiting trajectory whatever is queued, and arrivals are observed.
    traits = RuleTraits(observes=True)

    def __init__(self, cores_per_pod: int) -> None:
        self.k = cores_per_pod
        self.slots: dict[str, tuple[str, tuple[int, ...]]] = {}
        #: trajectory -> when its pod was granted (created): its startup is counted from then.
        self.granted_at: dict[str, float] = {}
        self.busy: set[str] = set()
        #: node -> trajectories waiting for a pod there, FCFS (insertion order).
        self.waiting: dict[str, dict[str, None]] = {}

    def _in_pod(self, opts: Options, cores: tuple[int, ...]) -> tuple[int, tuple[int, ...], str]:
        """(units, cores, reason) of an action in a pod of ``cores``: its largest option that
        fits, on that many of the pod's cores."""
        units = opts.units[max(opts.best_within(len(cores)), 0)]
        return units, cores[:units], f"k8s-static: in its pod of {len(cores)} cores"

    def _start_in_slot(self, ctx: Context, action: Action) -> None:
        node, cores = self.slots[action.trajectory]
        units, granted, reason = self._in_pod(ctx.options(action), cores)
        self.busy.add(action.trajectory)
        ctx.start(
            action,
            node,
            units,
            reason,
            cores=granted,
            in_slot=True,
            slot_since=self.granted_at[action.trajectory],
        )

    def _start_next(self, ctx: Context, trajectory: str) -> None:
        """Run the trajectory's oldest queued CPU action in its idle pod, if it has one."""
        if trajectory in self.slots and trajectory not in self.busy:
            nxt = next(
                (a for a in ctx.queued_of_trajectory(trajectory) if a.resource is ResourceKind.CPU),
                None,
            )
            if nxt is not None:
                self._start_in_slot(ctx, nxt)

    def _grant(self, ctx: Context, node_name: str, *, start: bool) -> None:
        """Give pods to waiting trajectories of a node, strictly FCFS, while K cores are free."""
        node = ctx.state.cpu[node_name]
        size = min(self.k, node.spec.cores)
        waiting = self.waiting.get(node_name, {})
        while waiting and node.free_cores >= size:
            trajectory = next(iter(waiting))
            del waiting[trajectory]
            cores = node.choose_cores(size)
            ctx.hold_cores(node_name, cores)
            self.slots[trajectory] = (node_name, cores)
            self.granted_at[trajectory] = ctx.now
            if start:
                self._start_next(ctx, trajectory)

    def on_trajectory_open(self, ctx: Context, trajectory: str, node: str) -> None:
        # The pod is requested when the trajectory starts and held until it ends.
        if trajectory not in self.slots:
            self.waiting.setdefault(node, {})[trajectory] = None
            self._grant(ctx, node, start=False)

    def observe(self, ctx: Context) -> None:
        for running in ctx.finished:
            if running.start.in_slot and running.action.resource is ResourceKind.CPU:
                self.busy.discard(running.action.trajectory)
                self._start_next(ctx, running.action.trajectory)
        for action in ctx.arrived:
            if action.resource is not ResourceKind.CPU:
                continue
            traj = action.trajectory
            if traj in self.slots:
                self._start_next(ctx, traj)
            else:  # a trajectory never opened explicitly asks for its pod with its first action
                node = ctx.node_of(action)
                if node is not None and traj not in self.waiting.get(node, {}):
                    self.waiting.setdefault(node, {})[traj] = None

    def schedule_domain(self, ctx: Context, domain: Domain) -> None:
        self._grant(ctx, domain[1], start=True)

    def on_trajectory_close(self, ctx: Context, trajectory: str) -> None:
        for waiting in self.waiting.values():
            waiting.pop(trajectory, None)
        slot = self.slots.pop(trajectory, None)
        self.granted_at.pop(trajectory, None)
        self.busy.discard(trajectory)
        if slot is not None:
            ctx.unhold_cores(*slot)


class BurstablePods(StaticPods):
    """Pods of R requested cores and no limit: admitted by requests, sharing idle cycles."""

    traits = RuleTraits(observes=True, shares_cpu=True)

    def _in_pod(self, opts: Options, cores: tuple[int, ...]) -> tuple[int, tuple[int, ...], str]:
        # No limit: the action runs all its threads (its largest option); how many cores it
        # gets at each instant is CFS's split of the node, not a grant.
        reason = f"k8s-burstable: in its pod (requests {len(cores)} cores, no limit)"
        return opts.units[-1], cores, reason


def _hold_replicas(
    ctx: Context,
    service: str,
    tp: int,
    count: int,
    size_gb: float = 0.0,
    replicas: bool = False,
    host_gb: float = 0.0,
) -> list[tuple[str, tuple[int, ...]]]:
    """Place and hold up to ``count`` replicas of ``tp`` GPUs for ``service`` (fewer when the
    pool runs out), on nodes whose GPUs hold its model and whose host memory holds its calls'
    ``host_gb``; the (node, cell) of each."""
    cells = []
    for _ in range(count):
        spot = place_cell(ctx.state, tp, f"dedicated:{service}", size_gb, replicas, host_gb)
        if spot is None:
            break
        ctx.hold_cell(spot[0], spot[1], f"dedicated:{service}")
        cells.append(spot)
    return cells


class DedicatedGpus(DomainRule):
    # Replicas are deployed as the first call of each service is observed.
    traits = RuleTraits(observes=True)
    #: The policy's name, as its reasons say it.
    label = "sglang-static"

    def __init__(self, gpus_per_service: int) -> None:
        self.gpus_per_service = gpus_per_service
        self.replicas: dict[str, list[tuple[str, tuple[int, ...]]]] = {}
        self.busy: dict[tuple[str, tuple[int, ...]], str] = {}
        self.unservable: dict[str, str] = {}

    def _dedicate(self, ctx: Context, action: Action) -> None:
        service = action.service or ""
        tp = ctx.options(action).units[0]
        cells = _hold_replicas(
            ctx,
            service,
            tp,
            max(1, self.gpus_per_service // tp),
            action.service_size_gb,
            action.service_replicas,
            action.memory_gb,  # (the first call's: a later one needing more may find none)
        )
        if cells:
            self.replicas[service] = cells
        else:
            # What the replicas really hold: a service may get fewer GPUs than its share.
            held = sum(len(gpus) for cells in self.replicas.values() for _, gpus in cells)
            owners = len(self.replicas)
            services = (
                "1 service already holds" if owners == 1 else f"{owners} services already hold"
            )
            self.unservable[service] = (
                f"sglang-static: no GPUs left to dedicate to {service!r} ({services} "
                f"{held} of {sum(n.spec.gpus for n in ctx.state.gpu.values())} GPUs, "
                f"up to {self.gpus_per_service} each)"
            )

    def observe(self, ctx: Context) -> None:
        for running in ctx.finished:
            if running.start.in_slot and running.action.resource is ResourceKind.GPU:
                self.busy.pop((running.start.node, running.start.gpus), None)
        for action in ctx.arrived:
            service = action.service or ""
            if (
                action.resource is ResourceKind.GPU
                and service not in self.replicas
                and service not in self.unservable
            ):
                self._dedicate(ctx, action)

    def schedule_domain(self, ctx: Context, domain: Domain) -> None:
        assert domain == GPU_DOMAIN
        for service in ctx.services_waiting():
            if service in self.unservable:
                for action in ctx.queued_of_service(service):
                    ctx.reject(action, self.unservable[service])
                continue
            free = [r for r in self.replicas.get(service, []) if r not in self.busy]
            for action in ctx.queued_of_service(service):
                tp = len(self.replicas[service][0][1])
                if tp not in ctx.options(action).units:
                    ctx.reject(
                        action,
                        f"sglang-static: {service} was deployed with {tp}-GPU replicas but this call "
                        f"needs one of {ctx.options(action).units} GPUs ({action.service_size_gb} GB)",
                    )
                    continue
                # Only a replica on a node whose host memory holds the call (not reserved per
                # call: the node's whole host memory is the bound).
                fits = [
                    r
                    for r in self.replicas[service]
                    if host_holds(action.memory_gb, _spec(ctx, r[0]))
                ]
                if not fits:
                    ctx.reject(action, self._no_host_memory(ctx, action))
                    continue
                spot = next((r for r in free if r in fits), None)
                if spot is None:
                    break  # (FCFS within the service: it waits for one of its replicas)
                free.remove(spot)
                node, cell = spot
                self.busy[(node, cell)] = action.id
                ctx.start(
                    action,
                    node,
                    len(cell),
                    f"sglang-static: replica {cell} of {service} on {node}",
                    gpus=cell,
                    in_slot=True,
                )

    def _no_host_memory(self, ctx: Context, action: Action) -> str:
        """Why the call cannot run on its service's replicas: their nodes lack its host memory."""
        service = action.service or ""
        nodes = sorted({node for node, _ in self.replicas[service]})
        most = max(_spec(ctx, n).host_memory_gb for n in nodes)
        return (
            f"{self.label}: {service}'s replicas are on {', '.join(nodes)}, with at most {most} GB "
            f"of host memory; this call needs {action.memory_gb} GB"
        )


def _spec(ctx: Context, node: str) -> GpuNodeSpec:
    """The GPU node's spec."""
    return ctx.state.gpu[node].spec


class SizedGpus(DedicatedGpus):
    """Replicas per service sized to its expected load within ``total_gpus`` (None: all GPUs).

    The sizing needs the expected demand (``expect``); without it every service that calls
    gets one replica of its smallest cell, and the reason says that no demand was declared.
    """

    traits = RuleTraits(observes=True)
    label = "sglang-sized"

    def __init__(self, total_gpus: int | None = None) -> None:
        super().__init__(gpus_per_service=1)
        self.total_gpus = total_gpus
        self.demands: dict[str, ServiceDemand] = {}
        self.plan: dict[str, int] | None = None
        self.deployed = False

    def expect(self, demands: tuple[ServiceDemand, ...]) -> None:
        self.demands = {d.service: d for d in demands}

    def _deploy_all(self, ctx: Context) -> None:
        """Size and place every declared service's replicas, largest replicas first."""
        total = sum(n.spec.gpus for n in ctx.state.gpu.values())
        budget = total if self.total_gpus is None else min(self.total_gpus, total)
        self.plan = size_replicas(self.demands.values(), budget)
        for d in sorted(self.demands.values(), key=lambda d: (-d.replica_gpus, d.service)):
            cells = _hold_replicas(
                ctx,
                d.service,
                d.replica_gpus,
                self.plan[d.service],
                d.size_gb,
                d.replicas,
                d.host_gb,
            )
            if cells:
                self.replicas[d.service] = cells
            else:
                self.unservable[d.service] = (
                    f"sglang-sized: no replica of {d.replica_gpus} GPUs left for {d.service!r} "
                    f"in a budget of {budget} GPUs sized by load {self._plan_text()}"
                )
        self.deployed = True

    def _plan_text(self) -> str:
        return "(" + ", ".join(f"{s}: {n}" for s, n in sorted((self.plan or {}).items())) + ")"

    def observe(self, ctx: Context) -> None:
        if not self.deployed and self.demands:
            self._deploy_all(ctx)
        super().observe(ctx)
