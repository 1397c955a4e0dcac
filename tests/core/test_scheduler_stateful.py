"""A stateful hypothesis model: random interleavings of arrivals, completions, trajectory closes,
opens, withdrawals and rate ticks, for every policy, with the capacity invariants checked after
each step; between them, calls a careless driver makes (unknown or repeated ids, times going
backwards or not finite, reports of GPUs a node lacks), each refused changing nothing."""

import pytest
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


def snapshot(sched):
    """Everything a refused call must leave as it was."""
    st_ = sched.state
    return (
        sched.now,
        sched.wakeup,
        {aid: r.start for aid, r in sched.running.items()},
        {d: [a.id for a in q] for d, q in sched.queues.items()},
        dict(sched.options),
        list(sched.admission.waiting_for_memory),
        {t: (s.node, s.memory_gb) for t, s in sched.trajectories.items()},
        set(sched.admission.seen),
        {
            n: ([list(d) for d in c.free_by_numa], c.memory_free_gb, c.containers)
            for n, c in st_.cpu.items()
        },
        {
            n: (
                list(g.owner),
                [set(r) for r in g.resident],
                [dict(s) for s in g.shape],
                dict(g.size_gb),
            )
            for n, g in st_.gpu.items()
        },
        {n: (a.in_flight, a.tokens, a.refilled_at) for n, a in st_.api.items()},
        (st_.usage.cores, st_.usage.gpus, st_.usage.api_calls),
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
        self.withdrawn: set[str] = set()

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

    @rule(pick=st.integers(0, 10**6), dt=st.floats(0.0, 1.0))
    def withdraw(self, pick, dt):
        waiting = sorted(self.sched.domain_of) + sorted(self.sched.admission.waiting_for_memory)
        if waiting:
            self.now += dt
            aid = waiting[pick % len(waiting)]
            assert self.sched.withdraw(aid, self.now)
            self.withdrawn.add(aid)
            self._apply(self.sched.after_withdrawals(self.now))

    @rule(traj=st.integers(0, 5), mem=st.sampled_from([0.0, 2.0, 5.0, 20.0]))
    def open_trajectory(self, traj, mem):
        name = f"t{traj}"
        self.open.add(name)
        placed = self.sched.trajectories.get(name)
        if placed is not None and placed.node is not None and mem > placed.memory_gb:
            with pytest.raises(ValueError, match="open with"):  # (a container never grows so)
                self.sched.open_trajectory(name, self.now, memory_gb=mem)
            return
        self.sched.open_trajectory(name, self.now, memory_gb=mem)

    @rule(data=st.data())
    def refused(self, data):
        """A call the core must refuse, leaving everything as it was."""
        sched = self.sched
        running, queued = sorted(sched.running), sorted(sched.domain_of)
        ended = sorted(self.finished)
        bad_time = data.draw(st.sampled_from([float("nan"), float("inf"), self.now - 1.0]))
        calls = [
            (KeyError, lambda: sched.finish("nobody", self.now)),
            (ValueError, lambda: sched.tick(bad_time)),
            (ValueError, lambda: sched.close_trajectory("t0", bad_time)),
            (ValueError, lambda: sched.open_trajectory("t9", bad_time, memory_gb=1.0)),
            (ValueError, lambda: sched.open_trajectory("t9", self.now, memory_gb=-1.0)),
            (ValueError, lambda: sched.withdraw("nobody", bad_time)),
            (KeyError, lambda: sched.report_residency("g9", (0,), "m0", True)),
            (ValueError, lambda: sched.report_residency("g1", (-1,), "m0", True)),
            (ValueError, lambda: sched.report_residency("g1", (0, 2), "m0", False)),
        ]
        if running:
            victim = data.draw(st.sampled_from(running))
            calls.append((ValueError, lambda: sched.finish_many([victim, victim], self.now)))
            calls.append((ValueError, lambda: sched.finish(victim, bad_time)))
        busy = sorted(
            {
                r.action.trajectory
                for r in sched.running.values()
                if r.action.resource is ResourceKind.CPU
            }
        )
        if busy:  # its container (memory, a pod's cores) would be freed under a running action
            calls.append(
                (
                    ValueError,
                    lambda: sched.close_trajectory(data.draw(st.sampled_from(busy)), self.now),
                )
            )
        if queued:
            calls.append(
                (KeyError, lambda: sched.finish(data.draw(st.sampled_from(queued)), self.now))
            )
        if ended:
            calls.append(
                (KeyError, lambda: sched.finish(data.draw(st.sampled_from(ended)), self.now))
            )
        error, call = data.draw(st.sampled_from(calls))
        before = snapshot(sched)
        with pytest.raises(error):
            call()
        assert snapshot(sched) == before

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
                    (aid in queued)
                    + (aid in running)
                    + (aid in self.finished)
                    + (aid in rejected)
                    + (aid in self.withdrawn)
                )
                assert places == 1, f"{aid} is in {places} places"


TestSchedulerMachine = SchedulerMachine.TestCase
