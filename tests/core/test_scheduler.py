"""Scheduler behaviour: rejections with reasons, quotas, static baselines, GPU residency."""

import dataclasses

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

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
from tangram.core.capabilities import Capabilities
from tangram.core.loop import DriverLoop
from tangram.core.policies.base import BasePolicy
from tangram.core.state import CapacityError

CPU2 = (CpuNodeSpec("n0", 8, 2, 16.0), CpuNodeSpec("n1", 8, 2, 16.0))
GPU = (GpuNodeSpec("g0", 8, 80.0, 1000.0, h2d_gbps=20.0, restore_fixed_s=0.1),)
CLUSTER = ClusterSpec("t", CPU2, GPU, (ApiEndpointSpec("search", 2, 1.0, 1),))


def cpu(i, traj="t", **kw):
    return Action(f"c{i}", traj, ResourceKind.CPU, Amdahl(2.0, 0.1), **{"max_units": 4, **kw})


def gpu(i, service="rm", size=10.0, **kw):
    return Action(
        f"g{i}",
        f"tg{i}",
        ResourceKind.GPU,
        Amdahl(1.0, 0.2),
        service=service,
        service_size_gb=size,
        **{"max_units": 8, **kw},
    )


@pytest.mark.parametrize(
    ("action", "reason"),
    [
        (gpu(0, size=700.0), "does not fit any cell"),
        (cpu(0, memory_gb=99.0), "a node has at most 16.0 GB"),
        (cpu(0, node="n9"), "unknown node 'n9'"),
        (
            Action("s", "t", ResourceKind.API, Inelastic(1.0), service="maps"),
            "unknown API endpoint 'maps'",
        ),
    ],
)
def test_infeasible_actions_are_rejected_at_once_with_a_reason(action, reason):
    decisions = Scheduler(CLUSTER, make_policy("tangram")).submit(action, 0.0)
    assert len(decisions) == 1 and isinstance(decisions[0], Reject)
    assert reason in decisions[0].reason


def test_duplicate_ids_are_rejected():
    sched = Scheduler(CLUSTER, make_policy("tangram"))
    sched.submit(cpu(0), 0.0)
    [d] = sched.submit(cpu(0), 0.0)
    assert isinstance(d, Reject) and "duplicate action id" in d.reason


def test_time_may_not_go_backwards():
    sched = Scheduler(CLUSTER, make_policy("tangram"))
    sched.submit(cpu(0), 5.0)
    with pytest.raises(ValueError, match="time went backwards"):
        sched.submit(cpu(1), 4.0)


def test_gpu_actions_need_enough_gpus_for_their_model():
    sched = Scheduler(CLUSTER, make_policy("fixed:1"))
    [d] = sched.submit(gpu(0, size=150.0), 0.0)  # 150 GB needs 2 x 80 GB
    assert isinstance(d, Start) and d.units == 2 and d.gpus in ((0, 1), (2, 3), (4, 5), (6, 7))


def test_resident_cells_are_preferred_and_skip_the_restore():
    sched = Scheduler(CLUSTER, make_policy("tangram"))
    sched.report_residency("g0", (4, 5), "rm", True)
    [d] = sched.submit(gpu(0, max_units=2), 0.0)
    assert d.gpus == (4, 5) and not d.restore and d.est_overhead == 0.0
    [e] = sched.submit(gpu(1, service="judge", size=40.0, max_units=1), 0.0)
    assert e.restore and e.est_overhead == pytest.approx(40.0 / 20.0 + 0.1)


def test_api_concurrency_and_rate_are_respected_with_a_wakeup():
    sched = Scheduler(CLUSTER, make_policy("tangram"))
    calls = [
        Action(f"s{i}", f"t{i}", ResourceKind.API, Inelastic(10.0), service="search")
        for i in range(3)
    ]
    started = [d for d in sched.submit_many(calls, 0.0) if isinstance(d, Start)]
    assert [d.action.id for d in started] == ["s0"]  # burst 1: one token
    assert sched.next_wakeup == pytest.approx(1.0)  # rate 1/s
    assert [d.action.id for d in sched.tick(1.0)] == ["s1"]
    assert sched.tick(2.0) == []  # concurrency 2 reached: waits for a finish, not a token
    assert [d.action.id for d in sched.finish("s0", 10.0)] == ["s2"]


def test_k8s_pods_hold_cores_from_first_action_to_trajectory_close():
    sched = Scheduler(
        ClusterSpec("one", (CpuNodeSpec("n", 8, 1, 64.0),)), make_policy("k8s-static:4")
    )
    [a] = sched.submit(cpu(0, traj="A"), 0.0)
    assert a.in_slot and a.units == 4
    [b] = sched.submit(cpu(1, traj="B"), 0.0)
    assert b.in_slot and set(b.cores).isdisjoint(a.cores)
    assert sched.submit(cpu(2, traj="C"), 0.0) == []  # no pod free: C waits
    assert sched.finish("c0", 1.0) == []  # A's pod stays held while A lives
    assert sched.state.cpu["n"].free_cores == 0
    [again] = sched.submit(cpu(3, traj="A"), 2.0)  # A's next action runs at once in its pod
    assert again.cores == a.cores
    sched.finish("c3", 3.0)
    [c] = sched.close_trajectory("A", 3.0)
    assert c.action.id == "c2" and c.cores == a.cores


def test_sglang_static_dedicates_gpus_per_service_and_rejects_when_none_are_left():
    cluster = ClusterSpec("g", gpu_nodes=(GpuNodeSpec("g0", 8, 80.0, 1000.0),))
    sched = Scheduler(cluster, make_policy("sglang-static:4"))
    assert isinstance(sched.submit(gpu(0, service="a"), 0.0)[0], Start)
    assert isinstance(sched.submit(gpu(1, service="b"), 0.0)[0], Start)
    [d] = sched.submit(gpu(2, service="c"), 0.0)
    assert isinstance(d, Reject) and "no GPUs left to dedicate to 'c'" in d.reason
    assert sched.state.free_gpus == 0  # 2 services x 4 dedicated GPUs, held even when idle
    sched.finish("g0", 1.0)
    assert sched.state.free_gpus == 0


def test_closing_a_trajectory_rejects_its_queued_actions():
    sched = Scheduler(ClusterSpec("one", (CpuNodeSpec("n", 1, 1, 64.0),)), make_policy("tangram"))
    sched.submit(cpu(0, traj="A"), 0.0)
    assert sched.submit(cpu(1, traj="B"), 0.0) == []
    [r] = sched.close_trajectory("B", 1.0)
    assert isinstance(r, Reject) and "closed" in r.reason
    assert sched.queued == 0


def test_containers_wait_for_memory_then_bind():
    sched = Scheduler(ClusterSpec("one", (CpuNodeSpec("n", 4, 1, 10.0),)), make_policy("tangram"))
    assert isinstance(sched.submit(cpu(0, traj="A", memory_gb=8.0), 0.0)[0], Start)
    assert (
        sched.submit(cpu(1, traj="B", memory_gb=8.0), 0.0) == []
    )  # 2 GB left: B's container waits
    sched.finish("c0", 1.0)
    assert sched.queued == 1  # A's container still holds its memory
    [b] = sched.close_trajectory("A", 1.0)
    assert b.action.id == "c1"


def test_cpu_actions_stay_on_their_containers_node():
    sched = Scheduler(CLUSTER, make_policy("tangram"))
    node = sched.open_trajectory("T", 0.0, memory_gb=1.0)
    decisions = sched.submit_many([cpu(i, traj="T") for i in range(3)], 0.0)
    assert {d.node for d in decisions if isinstance(d, Start)} == {node}
    [r] = sched.submit(cpu(9, traj="T", node="n1" if node == "n0" else "n0"), 0.0)
    assert isinstance(r, Reject) and "its container is on" in r.reason


def test_unknown_policy_names_the_known_ones():
    with pytest.raises(ValueError, match="known: "):
        make_policy("sjf")
    with pytest.raises(ValueError, match="fixed:K"):
        make_policy("fixed")


def test_a_call_waits_for_its_busy_resident_cell_when_that_beats_a_restore():
    # Restore = 40 GB / 20 GB/s + 0.1 s = 2.1 s; the resident cell frees in 1 s: wait.
    cluster = ClusterSpec(
        "g", gpu_nodes=(GpuNodeSpec("g0", 2, 80.0, 500.0, h2d_gbps=20.0, restore_fixed_s=0.1),)
    )
    sched = Scheduler(cluster, make_policy("tangram"))
    sched.report_residency("g0", (0,), "judge", True)

    def call(i):
        return Action(
            f"j{i}",
            f"t{i}",
            ResourceKind.GPU,
            Inelastic(1.0),
            service="judge",
            service_size_gb=40.0,
        )

    [first] = sched.submit(call(0), 0.0)
    assert first.gpus == (0,) and not first.restore
    [wait] = sched.submit(call(1), 0.0)
    # (The default weighs the 2.1-s restore amortised over the calls the service is expected
    # to receive, so the reason names a share of it; the paper's rule names all of it.)
    assert not isinstance(wait, Start) and "waits ~1.000s" in wait.reason
    assert "rather than a" in wait.reason and "s restore" in wait.reason
    [second] = sched.finish("j0", 1.0)
    assert second.gpus == (0,) and not second.restore


def test_scaling_a_cluster_to_any_gpu_count_uses_power_of_two_nodes():
    from tangram.core import load_cluster

    c = load_cluster("paper").scaled_gpus(10)
    assert c.total_gpus == 10 and sorted(n.gpus for n in c.gpu_nodes) == [2, 8]


def test_core_accounting_refuses_double_grants_and_double_returns_across_numa_domains():
    from tangram.core.state import CapacityError, CpuNodeState

    node = CpuNodeState(CpuNodeSpec("n", 8, 2, 1.0))
    node.take_cores((0, 5, 1))  # spans both domains, unsorted
    assert node.free_cores == 5 and 5 not in node.free_by_numa[1]
    with pytest.raises(CapacityError, match="not free"):
        node.take_cores((1, 2))
    with pytest.raises(CapacityError, match="repeat"):
        node.take_cores((6, 6, 4))
    node.give_cores((0, 1))
    with pytest.raises(CapacityError, match="returned twice"):
        node.give_cores((5, 1))
    assert node.free_cores == 7  # 8 - 3 taken + 2 returned; the refused return changed nothing
    assert node.choose_cores(3) == (4, 6, 7)  # best fit: the fullest domain that holds all three
    # Within one domain too, a refused grant or return leaves the free set as it was.
    with pytest.raises(CapacityError, match="repeat"):
        node.take_cores((2, 2))
    node.take_cores((2, 3))
    with pytest.raises(CapacityError, match="returned twice"):
        node.give_cores((3, 3))
    with pytest.raises(CapacityError, match="returned twice"):
        node.give_cores((2, 0))
    assert node.free_by_numa[0] == [0, 1] and node.free_cores == 5
    assert node.usage.cores == 3  # the cluster-wide tally follows every grant and return


def test_granting_takes_what_choose_picks_and_release_returns_it_across_numa_domains():
    from tangram.core.state import CpuNodeState

    node = CpuNodeState(CpuNodeSpec("n", 8, 2, 1.0))
    node.take_cores((0,))
    assert node.choose_cores(5) == (4, 5, 6, 7, 1)  # emptiest domain first, then the next
    cores = node.grant_cores(5)
    assert cores == (4, 5, 6, 7, 1) and node.free_by_numa == [[2, 3], []]
    assert node.free_cores == 2 and node.usage.cores == 6
    node.release_granted(cores)
    assert node.free_by_numa == [[1, 2, 3], [4, 5, 6, 7]] and node.usage.cores == 1
    with pytest.raises(CapacityError, match="9 cores asked, 7 free"):
        node.grant_cores(9)
    for missing in ((8,), (-1,)):
        with pytest.raises(CapacityError, match=f"core {missing[0]} does not exist"):
            node.take_cores(missing)


def test_k8s_pods_are_requested_when_trajectories_open_and_granted_fcfs():
    sched = Scheduler(
        ClusterSpec("one", (CpuNodeSpec("n", 8, 1, 64.0),)), make_policy("k8s-static:4")
    )
    for traj in ("A", "B", "C"):
        sched.open_trajectory(traj, 0.0, memory_gb=1.0)
    assert sched.state.cpu["n"].free_cores == 0  # A and B hold pods before any action; C waits
    assert sched.submit(cpu(0, traj="C"), 1.0) == []
    [a] = sched.submit(cpu(1, traj="A"), 1.0)
    assert a.in_slot and a.units == 4
    sched.finish("c1", 2.0)
    [c] = sched.close_trajectory("B", 3.0)  # B never ran an action, yet held its pod until now
    assert c.action.id == "c0" and c.time == 3.0


def test_a_queued_action_can_be_withdrawn_and_never_starts():
    sched = Scheduler(ClusterSpec("one", (CpuNodeSpec("n", 1, 1, 64.0),)), make_policy("tangram"))
    sched.submit(cpu(0, traj="A"), 0.0)
    assert sched.submit(cpu(1, traj="B"), 0.0) == []
    assert sched.withdraw("c1", 0.5) is True
    assert sched.withdraw("c1", 0.5) is False  # not waiting any more
    assert sched.withdraw("c0", 0.5) is False  # running: too late
    assert sched.finish("c0", 1.0) == [] and sched.queued == 0


def test_actions_a_withdrawn_head_held_back_start_at_the_withdrawal():
    # fixed:2 on 3 cores: c0 runs on 2; the FCFS head c1 needs 2 and waits, and c2 (one
    # core, which is free) waits behind it. Withdrawn at 0.5, c1 no longer holds c2 back: c2
    # starts at 0.5, not at c0's end (the next event, 2 s later without a pass here).
    sched = Scheduler(ClusterSpec("one", (CpuNodeSpec("n", 3, 1, 64.0),)), make_policy("fixed:2"))
    [c0] = sched.submit(cpu(0, traj="A"), 0.0)
    assert c0.units == 2
    assert sched.submit(cpu(1, traj="B"), 0.0) == []
    assert sched.submit(cpu(2, traj="C", max_units=1), 0.0) == []
    assert sched.withdraw("c1", 0.5) is True
    [c2] = sched.after_withdrawals(0.5)
    assert isinstance(c2, Start) and c2.action.id == "c2" and c2.time == 0.5
    assert sched.after_withdrawals(0.6) == []  # each withdrawal's pass runs once


def test_the_driver_loop_runs_the_pass_a_withdrawal_calls_for():
    started: list[tuple[str, float]] = []

    class Host:
        request_flush = handed = settled = None

        def start(self, start: Start) -> None:
            started.append((start.action.id, start.time))

        def reject(self, reject: object) -> None:
            raise AssertionError(f"nothing is rejected here: {reject}")

        defer = resize = pass_failed = reject

        def arm_wakeup(self, when: float) -> None:
            pass

    sched = Scheduler(ClusterSpec("one", (CpuNodeSpec("n", 3, 1, 64.0),)), make_policy("fixed:2"))
    loop = DriverLoop(sched, Host())  # type: ignore[arg-type]
    for action in (cpu(0, traj="A"), cpu(1, traj="B"), cpu(2, traj="C", max_units=1)):
        loop.arrive(action)
    loop.flush(0.0)
    assert started == [("c0", 0.0)]
    assert loop.withdraw("c1", 0.5) is True
    assert started == [("c0", 0.0), ("c2", 0.5)]


class CountingPolicy(BasePolicy):
    """Starts every queued CPU action on one core; counts the passes it is given."""

    name = "counting"

    def __init__(self, queue_driven: bool) -> None:
        self.capabilities = Capabilities(queue_driven=queue_driven)
        self.passes = 0

    def schedule(self, ctx) -> None:
        self.passes += 1
        for domain in list(ctx.dirty):
            for action in ctx.queue(domain):
                if ctx.state.cpu[domain[1]].free_cores:
                    ctx.start_on_cores(action, domain[1], 1, "one core")


@pytest.mark.parametrize("queue_driven", [True, False])
def test_a_completion_nobody_waits_for_skips_the_pass_only_for_queue_driven_policies(
    queue_driven,
):
    policy = CountingPolicy(queue_driven)
    sched = Scheduler(ClusterSpec("one", (CpuNodeSpec("n", 1, 1, 16.0),)), policy)
    first, second = cpu(1, max_units=1), cpu(2, max_units=1)
    sched.submit_many([first, second], 0.0)  # one core: the second waits
    assert sched.finish("c1", 1.0) and policy.passes == 2  # someone waited: a pass, it starts
    assert sched.finish("c2", 2.0) == [] and sched.state.cpu["n"].free_cores == 1
    assert policy.passes == (2 if queue_driven else 3)  # nobody waits: skipped when allowed
    with pytest.raises(ValueError, match="time went backwards"):
        sched.finish_many([], 1.0)


def test_the_bundled_rules_say_which_policies_may_skip_idle_passes():
    for name in ("tangram", "tangram-paper", "fixed:4", "lower-bound"):
        assert make_policy(name).capabilities.queue_driven
    # A static pod is granted to a waiting trajectory whatever is queued; replicas are
    # deployed by observing arrivals: those policies see every pass.
    assert not make_policy("k8s-static").capabilities.queue_driven
    assert not make_policy("sglang-static").capabilities.queue_driven
    # The paper's rule decides a lone arrival alone; the default's pass may shrink a running
    # malleable action or make the arrival wait for cores, so it needs the full pass.
    assert make_policy("tangram-paper").capabilities.alone is not None
    assert make_policy("tangram").capabilities.alone is None
    assert make_policy("tangram").capabilities.resizes
    assert make_policy("fixed:4").capabilities.alone is None
    assert not make_policy("lower-bound").capabilities.respects_capacity


def test_a_policy_must_declare_its_capabilities():
    class Undeclared:
        name = "undeclared"

        def schedule(self, ctx) -> None: ...

    with pytest.raises(TypeError, match="declares no capabilities"):
        Scheduler(CLUSTER, Undeclared())
    with pytest.raises(ValueError, match="needs a queue-driven policy"):
        Capabilities(alone=lambda node, opts: None)


def test_a_rule_must_declare_that_it_observes():
    from tangram.core.policies.base import DomainRule

    with pytest.raises(TypeError, match="declare traits = RuleTraits"):

        class Watcher(DomainRule):
            def observe(self, ctx) -> None: ...


def test_start_on_cores_picks_numa_local_cores_and_refuses_the_wrong_node_or_size():
    sched = Scheduler(CLUSTER, CountingPolicy(True))
    node = sched.open_trajectory("t", 0.0, memory_gb=1.0)
    ctx = sched._begin(0.0)
    sched._enqueue(ctx, cpu(1))
    other = "n1" if node == "n0" else "n0"
    with pytest.raises(CapacityError, match="its container is on"):
        ctx.start_on_cores(ctx.scheduler.queues[("cpu", node)].live["c1"], other, 2, "x")
    with pytest.raises(CapacityError, match="not one of its options"):
        ctx.start_on_cores(ctx.scheduler.queues[("cpu", node)].live["c1"], node, 5, "x")
    start = ctx.start_on_cores(ctx.scheduler.queues[("cpu", node)].live["c1"], node, 3, "x")
    assert start.cores == (0, 1, 2) and sched.state.cpu[node].free_cores == 5  # one NUMA domain
    assert sched.state.held_cores == 3 and "c1" in sched.running


def test_a_queue_keeps_only_what_is_queued_not_its_history():
    from tangram.core.scheduler import FcfsQueue

    queue = FcfsQueue()
    for i in range(5000):  # churn: each action queued, then started; one stays behind
        action = cpu(i)
        queue.push(action)
        if i != 7:
            queue.remove(action.id)
        queue.compact()
    assert len(queue) == 1 and len(queue.items) <= 2 * 64 + 2
    assert [a.id for a in queue] == ["c7"]
    queue.remove("c7")
    queue.compact()
    assert queue.items == [] and list(queue) == []


@settings(max_examples=200, deadline=None)
@given(
    st.integers(0, 300),
    st.lists(st.tuples(st.integers(0, 3), st.integers(0, 199)), max_size=300),
)
def test_a_queue_read_out_of_order_keeps_its_front_free_of_dead_entries(first, script):
    """Starts out of FCFS order (shortest first) leave dead entries at the front behind a live
    oldest one, which every reader of the front skips: after ``compact`` the first FRONT live
    entries have at most FRONT_DEAD dead ones among them, and the queue still reads its live
    actions in order."""
    from tangram.core.backlog import FRONT, FRONT_DEAD, FcfsQueue

    queue = FcfsQueue()
    for i in range(first):
        queue.push(cpu(i))
    pushed = first
    for push, pick in script:
        if push == 0 or len(queue.live) < 2:
            queue.push(cpu(pushed))
            pushed += 1
        else:  # one of the first live ones but the oldest, as a shortest-first start
            live = list(queue.live)
            queue.remove(live[1 + pick % (min(len(live), FRONT) - 1)])
        queue.compact()
        live_seen = dead = 0
        for action in queue.items[queue.head :]:
            if live_seen == FRONT:
                break
            if queue.live.get(action.id) is action:
                live_seen += 1
            else:
                dead += 1
        assert dead <= FRONT_DEAD
        assert [a.id for a in queue] == list(queue.live)


def test_options_copy_pickle_and_replace_keep_their_derived_fields_true():
    import copy
    import pickle

    from tangram.core.scheduler import Options

    opts = Options((1, 2, 3), (3.0, 2.0, 2.0), True)
    assert pickle.loads(pickle.dumps(opts)) == opts == copy.deepcopy(opts) == copy.copy(opts)
    faster = opts._replace(durations=(3.0, 2.0, 1.0))
    assert faster.fastest == 2 and opts.fastest == 1
    assert opts._replace(units=(1, 2, 4)).consecutive is False
    with pytest.raises(ValueError, match="fastest is derived"):
        opts._replace(fastest=0)


class UnboundedOnCores(BasePolicy):
    """An unbounded policy that starts CPU actions through start_on_cores."""

    name = "unbounded-cores"
    capabilities = Capabilities(respects_capacity=False)

    def schedule(self, ctx) -> None:
        for action in ctx.arrived:
            ctx.start_on_cores(action, ctx.node_of(action) or "n", 4, "all of them")


def test_an_unbounded_policy_holds_no_cores_when_it_starts_on_cores():
    sched = Scheduler(ClusterSpec("one", (CpuNodeSpec("n", 4, 1, 16.0),)), UnboundedOnCores())
    for i in range(3):  # more 4-core starts than the node has: none holds anything
        (start,) = sched.submit(cpu(i), float(i))
        assert start.cores == () and sched.state.cpu["n"].free_cores == 4
        sched.finish(f"c{i}", float(i) + 0.5)


class StartsWhileWalking(BasePolicy):
    """Starts and rejects a trajectory's actions while walking its queue."""

    name = "walker"

    def schedule(self, ctx) -> None:
        for action in ctx.queued_of_trajectory("t"):
            if action.id == "c0":
                ctx.reject(action, "first one refused")
                ctx.reject(ctx.scheduler.queues[ctx.scheduler.domain_of["c1"]].live["c1"], "c1 too")
            else:
                ctx.start_on_cores(action, ctx.node_of(action), 1, "the rest run")


def test_walking_a_trajectorys_queue_skips_what_left_it_meanwhile():
    sched = Scheduler(CLUSTER, StartsWhileWalking())
    decisions = sched.submit_many([cpu(i) for i in range(4)], 0.0)
    assert [(type(d).__name__, d.action.id) for d in decisions] == [
        ("Reject", "c0"),
        ("Reject", "c1"),
        ("Start", "c2"),
        ("Start", "c3"),
    ]


def test_a_rule_that_rewrites_schedule_domain_gets_no_inherited_shortcut():
    from tangram.core.policies.base import CompositePolicy
    from tangram.core.policies.elastic import ElasticCpu
    from tangram.core.policies.elastic_gpu import ElasticGpu
    from tangram.core.policies.fifo_api import FifoApi

    class OneCore(ElasticCpu):
        def schedule_domain(self, ctx, domain):
            for action in ctx.queue(domain):
                ctx.start_on_cores(action, domain[1], 1, "always one core")

    policy = CompositePolicy("one-core", cpu=OneCore(), gpu=ElasticGpu(), api=FifoApi())
    assert not policy.capabilities.queue_driven and policy.capabilities.alone is None
    sched = Scheduler(CLUSTER, policy)
    node = sched.open_trajectory("t", 0.0, memory_gb=1.0)
    (start,) = sched.submit(cpu(1), 1.0)  # a lone arrival into an empty queue: its own rule
    assert (start.units, start.reason, start.node) == (1, "always one core", node)


def test_a_lone_arrival_the_rule_starts_wrongly_stays_queued():
    from tangram.core.policies import make_policy

    policy = make_policy("tangram")
    bug = dataclasses.replace(policy.capabilities, alone=lambda node, opts: (99, "a bug"))
    policy.capabilities = bug  # not one of its options
    sched = Scheduler(CLUSTER, policy)
    sched.open_trajectory("t", 0.0, memory_gb=1.0)
    with pytest.raises(CapacityError, match="99 units is not one of its options"):
        sched.submit(cpu(1), 1.0)
    assert sched.queued == 1 and "c1" not in sched.running  # not lost


def test_an_ended_actions_id_can_be_forgotten_but_not_a_waiting_or_running_one():
    sched = Scheduler(ClusterSpec("one", (CpuNodeSpec("n", 1, 1, 64.0),)), make_policy("tangram"))
    sched.submit_many([cpu(0, traj="A"), cpu(1, traj="B")], 0.0)  # c0 runs, c1 waits
    sched.forget("c0")
    sched.forget("c1")
    (again,) = sched.submit(cpu(1, traj="B"), 0.1)  # still known: refused as a duplicate
    assert isinstance(again, Reject) and "duplicate" in again.reason
    sched.finish("c0", 1.0)
    sched.forget("c0")  # ended: the driver guards its ids, the core may forget it
    assert not any(isinstance(d, Reject) for d in sched.submit(cpu(0, traj="A"), 2.0))


def test_a_forgotten_id_reused_while_its_dead_entry_is_queued_reads_as_the_new_action():
    """A runtime may reuse a forgotten action id; the queue's dead entry of the old action
    must not come back as live (it did: the old action was started, or a KeyError raised)."""
    from tangram.core.backlog import FcfsQueue

    queue = FcfsQueue()
    old, other, new = cpu(0), cpu(1), cpu(0)
    queue.push(other)
    queue.push(old)
    queue.remove(old.id)
    queue.push(new)
    queue.compact()
    assert [a for a in queue] == [other, new] and [a is new for a in queue] == [False, True]


def _serial(aid: str, traj: str, at: float, t1: float) -> Action:
    """A one-core CPU action of ``t1`` seconds."""
    return Action(aid, traj, ResourceKind.CPU, Amdahl(t1, 0.0), arrival=at, max_units=1)


def _one_core_tangram(trajectories) -> Scheduler:
    """``tangram`` on one node of one core, the trajectories open."""
    cluster = ClusterSpec("one", cpu_nodes=(CpuNodeSpec("n", 1, 1, 64.0),))
    sched = Scheduler(cluster, make_policy("tangram"), resizable=True)
    for traj in trajectories:
        sched.open_trajectory(traj, 0.0, memory_gb=0.01)
    return sched


def test_a_scheduler_starts_the_new_action_of_a_reused_id_not_the_withdrawn_one():
    sched = _one_core_tangram(["R", "O"] + [f"X{i}" for i in range(5)])
    sched.advance(0.0, arrived=[_serial("r", "R", 0.0, 100.0)])  # holds the node's one core
    waiting = [_serial(f"x{i}", f"X{i}", 1.0, 5.0) for i in range(5)]
    sched.advance(1.0, arrived=[_serial("o", "O", 1.0, 50.0), *waiting])
    for i in range(5):
        sched.withdraw(f"x{i}", 2.0)
    sched.advance(3.0, arrived=[_serial("y", "X0", 3.0, 7.0)])  # a pass: the queue compacts
    sched.forget("x0")
    reused = _serial("x0", "X1", 4.0, 1.0)
    sched.advance(4.0, arrived=[reused])
    started = [d.action for d in sched.advance(100.0, finished=["r"]) if isinstance(d, Start)]
    assert len(started) == 1 and started[0] is reused  # (the shortest, and the live x0)


def _withdraw(sched: Scheduler) -> None:
    assert sched.withdraw("x", 2.0)


def _close(sched: Scheduler) -> None:
    sched.close_trajectory("X", 2.0)  # x is rejected


@pytest.mark.parametrize("take_back", [_withdraw, _close], ids=["withdrawn", "trajectory-closed"])
def test_a_taken_back_actions_shortest_first_key_does_not_order_a_new_action_of_its_id(
    take_back,
):
    """The CPU rule caches each queued action's key by id. An action taken back without a
    decision of the policy's (withdrawn, or rejected as its trajectory closed) must take its
    key with it, or a later action reusing the forgotten id is ordered as the old one (here a
    100-s newcomer's key put a 1-s action behind a 30-s one)."""
    sched = _one_core_tangram("RXMY")
    sched.advance(0.0, arrived=[_serial("r", "R", 0.0, 100.0)])  # holds the node's one core
    sched.advance(1.0, arrived=[_serial("x", "X", 1.0, 100.0), _serial("m", "M", 1.0, 30.0)])
    take_back(sched)
    sched.forget("x")
    sched.advance(4.0, arrived=[_serial("x", "Y", 4.0, 1.0)])
    started = [d.action for d in sched.advance(100.0, finished=["r"]) if isinstance(d, Start)]
    assert [(a.id, a.curve.t1) for a in started] == [("x", 1.0)]


def test_a_withdrawn_gpu_call_leaves_no_reservation_or_wait_record_behind():
    from tangram.core.policies.gpu_waits import Reservation

    sched = Scheduler(CLUSTER, make_policy("tangram"))
    sched.advance(0.0, arrived=[gpu(i) for i in range(12)])  # more calls than GPUs
    queued = next(iter(sched.backlog.queues[("gpu", "*")]))
    waits = sched.policy.rules["gpu"].waits
    waits.by_action[queued.id] = Reservation(queued, "g0", (0, 1), 5.0, 9.0)
    waits.waited.add(queued.id)
    waits.head = queued.id
    assert sched.withdraw(queued.id, 1.0)
    assert queued.id not in waits.by_action and queued.id not in waits.waited
    assert waits.head is None


def test_a_policy_without_the_optional_withdraw_hook_can_still_have_actions_withdrawn():
    class Plain:  # (the Policy protocol, not BasePolicy: no on_withdraw)
        name = "plain"
        capabilities = Capabilities()

        def schedule(self, ctx) -> None:  # starts nothing: every action stays queued
            pass

        def on_trajectory_open(self, ctx, trajectory, node) -> None:
            pass

        def on_trajectory_close(self, ctx, trajectory) -> None:
            pass

        def expect(self, demands) -> None:
            pass

    sched = Scheduler(CLUSTER, Plain())
    sched.submit(cpu(0, traj="a"), 0.0)
    assert sched.withdraw("c0", 1.0) and sched.queued == 0
