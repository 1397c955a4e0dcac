"""A stateful hypothesis model of ids a driver withdraws, forgets and reuses (``Scheduler.forget``
lets a driver that guards ids itself give a new action an ended one's id): every decision is
about the action now holding its id, never a withdrawn or ended one, and each action ends once.
"""

from hypothesis import settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, initialize, invariant, rule

from tangram.core import (
    Action,
    Amdahl,
    ClusterSpec,
    CpuNodeSpec,
    GpuNodeSpec,
    Reject,
    ResourceKind,
    Scheduler,
    Start,
    make_policy,
)
from tests.core.harness import check_invariants

#: Small, so that queues form and ids come back often.
CLUSTER = ClusterSpec(
    "reuse", (CpuNodeSpec("c0", 2, 1, 64.0),), (GpuNodeSpec("g0", 2, 40.0, 500.0),)
)
IDS = [f"x{i}" for i in range(5)]


class IdReuseMachine(RuleBasedStateMachine):
    @initialize(policy=st.sampled_from(["tangram", "tangram-paper", "fixed:1", "k8s-static:1"]))
    def setup(self, policy):
        self.sched = Scheduler(CLUSTER, make_policy(policy), resizable=True)
        self.now = 0.0
        #: id -> the action now holding it (until it ends and is forgotten).
        self.current: dict[str, Action] = {}
        #: ids whose action ended (finished, rejected or withdrawn) and may be forgotten.
        self.ended: set[str] = set()
        self.open: set[str] = set()

    def _apply(self, decisions):
        for d in decisions:
            if isinstance(d, Start | Reject):
                aid = d.action.id
                assert self.current.get(aid) is d.action, f"{aid}: a decision about a stale action"
                assert aid not in self.ended, f"{aid} decided after it ended"
                if isinstance(d, Reject):
                    self.ended.add(aid)

    @rule(
        pick=st.integers(0, len(IDS) - 1),
        gpu=st.sampled_from([False, False, True]),
        traj=st.integers(0, 1),
        t1=st.floats(0.1, 20.0),
        units=st.integers(1, 4),
        dt=st.floats(0.0, 1.0),
    )
    def arrive(self, pick, gpu, traj, t1, units, dt):
        aid = IDS[pick]
        if aid in self.current:  # held (queued, running, or ended and not forgotten)
            return
        self.now += dt
        name = f"t{traj}"
        if gpu:
            action = Action(
                aid,
                name,
                ResourceKind.GPU,
                Amdahl(t1, 0.3),
                arrival=self.now,
                max_units=units,
                service=f"m{traj % 2}",
                service_size_gb=20.0,
            )
        else:
            action = Action(
                aid,
                name,
                ResourceKind.CPU,
                Amdahl(t1, 0.1),
                arrival=self.now,
                max_units=units,
                malleable=traj % 2 == 0,
            )
        self.open.add(name)
        self.current[aid] = action
        self._apply(self.sched.submit(action, self.now))

    @rule(pick=st.integers(0, len(IDS) - 1), dt=st.floats(0.0, 1.0))
    def withdraw(self, pick, dt):
        aid = IDS[pick]
        self.now += dt
        if self.sched.withdraw(aid, self.now):
            assert aid in self.current and aid not in self.ended
            self.ended.add(aid)

    @rule(pick=st.integers(0, len(IDS) - 1), t1=st.floats(0.1, 20.0), dt=st.floats(0.0, 1.0))
    def retry(self, pick, t1, dt):
        """A client cancels a queued action and sends it again under the same id (the driver
        withdraws it, forgets the id and submits the new one at once)."""
        aid = IDS[pick]
        old = self.current.get(aid)
        if old is None or aid in self.ended or aid in self.sched.running:
            return
        self.now += dt
        if not self.sched.withdraw(aid, self.now):
            return
        self.sched.forget(aid)
        again = Action(
            aid,
            old.trajectory,
            old.resource,
            Amdahl(t1, old.curve.serial_fraction),
            arrival=self.now,
            max_units=old.max_units,
            service=old.service,
            service_size_gb=old.service_size_gb,
            malleable=old.malleable,
        )
        self.current[aid] = again
        self._apply(self.sched.submit(again, self.now))

    @rule(pick=st.integers(0, len(IDS) - 1))
    def forget(self, pick):
        aid = IDS[pick]
        if aid in self.ended:
            self.sched.forget(aid)
            self.ended.discard(aid)
            del self.current[aid]

    @rule(pick=st.integers(0, 10**6), dt=st.floats(0.0, 2.0))
    def complete(self, pick, dt):
        if self.sched.running:
            self.now += dt
            ids = sorted(self.sched.running)
            victim = ids[pick % len(ids)]
            assert self.sched.running[victim].action is self.current[victim]
            self.ended.add(victim)
            self._apply(self.sched.finish(victim, self.now))

    @rule(traj=st.integers(0, 1))
    def close(self, traj):
        name = f"t{traj}"
        if name in self.open and not any(
            r.action.trajectory == name for r in self.sched.running.values()
        ):
            self.open.discard(name)
            self._apply(self.sched.close_trajectory(name, self.now))

    @invariant()
    def capacity_is_never_exceeded(self):
        if hasattr(self, "sched"):
            check_invariants(self.sched, {})

    @invariant()
    def the_queues_and_the_running_set_hold_only_the_actions_now_holding_their_ids(self):
        if hasattr(self, "sched"):
            for queue in self.sched.queues.values():
                for action in queue:
                    assert self.current.get(action.id) is action
                    assert action.id not in self.ended
            for aid, running in self.sched.running.items():
                assert self.current.get(aid) is running.action


IdReuseMachine.TestCase.settings = settings(max_examples=150, stateful_step_count=40, deadline=None)
TestIdReuseMachine = IdReuseMachine.TestCase
