"""A stateful hypothesis model: random interleavings of arrivals, completions, trajectory closes
and rate ticks, for every policy, with the capacity invariants checked after each step."""

from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, initialize, invariant, rule

from tangram.core import (
    Action,
    Amdahl,
    ApiEndpointSpec,
    ClusterSpec,
    CpuNodeSpec,
    GpuNodeSpec,
    Inelastic,
    Reject,
    ResourceKind,
    Scheduler,
    Start,
    make_policy,
)
from tests.core.harness import check_invariants

CLUSTER = ClusterSpec(
    "stateful",
    (CpuNodeSpec("c0", 4, 2, 12.0), CpuNodeSpec("c1", 8, 2, 12.0)),
    (GpuNodeSpec("g0", 4, 40.0, 500.0), GpuNodeSpec("g1", 2, 40.0, 500.0)),
    (ApiEndpointSpec("web", 2, 3.0, 2),),
)


class SchedulerMachine(RuleBasedStateMachine):
    @initialize(policy=st.sampled_from(["tangram", "fixed:2", "k8s-static:2", "sglang-static:2"]))
    def setup(self, policy):
        self.sched = Scheduler(CLUSTER, make_policy(policy))
        self.now = 0.0
        self.n = 0
        self.open: set[str] = set()
        self.ended: dict[str, str] = {}
        self.submitted: set[str] = set()
        self.finished: set[str] = set()
        self.traj_nodes: dict[str, str] = {}

    def _apply(self, decisions):
        for d in decisions:
            if isinstance(d, Start | Reject):
                assert d.action.id not in self.ended, f"{d.action.id} decided twice"
                self.ended[d.action.id] = type(d).__name__

    @rule(
        kind=st.sampled_from(list(ResourceKind)),
        traj=st.integers(0, 5),
        t1=st.floats(0.1, 3.0),
        units=st.integers(1, 8),
        dt=st.floats(0.0, 1.0),
        mem=st.sampled_from([0.0, 2.0, 5.0]),
    )
    def arrive(self, kind, traj, t1, units, dt, mem):
        self.now += dt
        self.n += 1
        name = f"t{traj}"
        if kind is ResourceKind.CPU:
            a = Action(
                f"a{self.n}",
                name,
                kind,
                Amdahl(t1, 0.2),
                arrival=self.now,
                max_units=units,
                memory_gb=mem,
            )
        elif kind is ResourceKind.GPU:
            m = units % 3
            a = Action(
                f"a{self.n}",
                name,
                kind,
                Amdahl(t1, 0.3),
                arrival=self.now,
                max_units=units,
                service=f"m{m}",
                service_size_gb=(10.0, 50.0, 30.0)[m],
            )
        else:
            a = Action(f"a{self.n}", name, kind, Inelastic(t1), arrival=self.now, service="web")
        self.open.add(name)
        self.submitted.add(a.id)
        self._apply(self.sched.submit(a, self.now))

    @rule(pick=st.integers(0, 10**6), dt=st.floats(0.0, 1.0))
    def complete(self, pick, dt):
        if self.sched.running:
            self.now += dt
            ids = sorted(self.sched.running)
            victim = ids[pick % len(ids)]
            self.finished.add(victim)
            self._apply(self.sched.finish(victim, self.now))

    @rule(traj=st.integers(0, 5))
    def close(self, traj):
        name = f"t{traj}"
        if name in self.open and not any(
            r.action.trajectory == name for r in self.sched.running.values()
        ):
            self.open.discard(name)
            self.traj_nodes.pop(name, None)
            self._apply(self.sched.close_trajectory(name, self.now))

    @rule(dt=st.floats(0.0, 2.0))
    def tick(self, dt):
        self.now += dt
        self._apply(self.sched.tick(self.now))

    @invariant()
    def capacity_is_never_exceeded(self):
        if hasattr(self, "sched"):
            check_invariants(self.sched, self.traj_nodes)

    @invariant()
    def every_action_is_in_exactly_one_place(self):
        if hasattr(self, "sched"):
            queued = {a.id for q in self.sched.queues.values() for a in q} | set(
                self.sched.admission.waiting_for_memory
            )
            running = set(self.sched.running)
            rejected = {a for a, verdict in self.ended.items() if verdict == "Reject"}
            for aid in self.submitted:
                places = (
                    (aid in queued) + (aid in running) + (aid in self.finished) + (aid in rejected)
                )
                assert places == 1, f"{aid} is in {places} places"


TestSchedulerMachine = SchedulerMachine.TestCase
