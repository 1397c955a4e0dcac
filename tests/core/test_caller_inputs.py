"""The scheduler's callers' inputs and call orders: a refused input raises naming what is
wrong and leaves the scheduler as it was; nothing malformed is accepted silently."""

import pytest

from tangram.core import (
    Action,
    ActionError,
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
from tangram.core.demand import ServiceDemand
from tangram.core.loop import DriverLoop
from tangram.core.resources import SpecError

ONE = ClusterSpec("one", (CpuNodeSpec("n", 4, 1, 16.0),))


def cpu(aid, traj, memory_gb=1.0, units=1):
    return Action(aid, traj, ResourceKind.CPU, Inelastic(1.0), max_units=units, memory_gb=memory_gb)


def test_an_id_waiting_for_its_containers_memory_is_not_forgotten():
    """forget kept the ids of queued and running actions but not of one whose container
    waited for memory: a new action under that id was admitted beside it, and when the first
    one's container found room it started over the second's running record (whose cores were
    then never returned)."""
    sched = Scheduler(ONE, make_policy("tangram"))
    sched.submit(cpu("a", "A", memory_gb=10.0), 0.0)
    assert sched.submit(cpu("b", "B", memory_gb=10.0), 0.0) == []  # its container waits
    sched.forget("b")
    (again,) = sched.submit(cpu("b", "C"), 1.0)
    assert isinstance(again, Reject) and "duplicate" in again.reason
    sched.finish("a", 2.0)
    (start,) = sched.close_trajectory("A", 2.0)
    assert isinstance(start, Start) and start.action.trajectory == "B"
    sched.finish("b", 3.0)
    assert sched.state.cpu["n"].free_cores == 4 and not sched.running


def _snapshot(sched):
    """What a refused call must leave as it was: the running set, queues, free units."""
    node = sched.state.cpu["n"]
    return (
        {aid: r.start for aid, r in sched.running.items()},
        {d: list(q) for d, q in sched.queues.items()},
        [list(d) for d in node.free_by_numa],
        node.free_cores,
        node.memory_free_gb,
        sched.state.held_cores,
        sched.now,
    )


@pytest.mark.parametrize("policy", ["tangram", "fixed:1"])
def test_a_finish_given_twice_at_one_instant_is_refused_and_changes_nothing(policy):
    """finish_many with an id twice passed the check (each was running) and popped it twice:
    its cores were returned, then a bare KeyError left the pass undone (the action queued
    behind it never started, its id not running, whatever the caller then did)."""
    sched = Scheduler(ONE, make_policy(policy))
    sched.submit_many([cpu(f"a{i}", f"T{i}") for i in range(5)], 0.0)  # a4 waits
    before = _snapshot(sched)
    with pytest.raises(ValueError, match="'a0' given twice"):
        sched.finish_many(["a1", "a0", "a0"], 1.0)
    assert _snapshot(sched) == before
    (start,) = sched.finish_many(["a0"], 1.0)
    assert start.action.id == "a4"


BAD_TIMES = [float("nan"), float("inf"), -float("inf"), 4.0]


@pytest.mark.parametrize("now", BAD_TIMES)
@pytest.mark.parametrize("event", ["lone", "batch", "finish", "tick", "close", "withdraw"])
def test_an_event_at_a_time_not_finite_or_before_the_cores_is_refused_changing_nothing(event, now):
    """NaN compared false with every time and was taken (decisions at time NaN); an infinite
    time was taken and every later event refused as going backwards; and a lone CPU arrival
    at an earlier time was marked seen before its time was checked, so the same action sent
    again at the right time was refused as a duplicate."""
    sched = Scheduler(ONE, make_policy("fixed:1"))
    sched.submit_many([cpu(f"a{i}", "T") for i in range(5)], 5.0)  # a4 queued
    before = _snapshot(sched)
    calls = {
        "lone": lambda: sched.submit(cpu("b", "T"), now),
        "batch": lambda: sched.submit_many([cpu("b", "T"), cpu("c", "U")], now),
        "finish": lambda: sched.finish("a0", now),
        "tick": lambda: sched.tick(now),
        "close": lambda: sched.close_trajectory("T", now),
        "withdraw": lambda: sched.withdraw("a4", now),
    }
    with pytest.raises(ValueError, match="finite number|went backwards"):
        calls[event]()
    assert _snapshot(sched) == before and sched.trajectories["T"].node == "n"
    assert [d.action.id for d in sched.finish("a0", 6.0)] == ["a4"]
    assert sched.submit(cpu("b", "T"), 6.0) == [] and "b" in sched.domain_of  # no duplicate


@pytest.mark.parametrize("now", BAD_TIMES)
def test_an_open_at_a_bad_time_places_no_container(now):
    """open_trajectory placed the container (its memory taken) and then raised 'time went
    backwards' from the pass it began, leaving the trajectory open on a call that failed; a
    NaN or infinite time was taken."""
    sched = Scheduler(ONE, make_policy("tangram"))
    sched.submit(cpu("a", "T"), 5.0)
    before = _snapshot(sched)
    with pytest.raises(ValueError, match="finite number|went backwards"):
        sched.open_trajectory("U", now, memory_gb=4.0)
    assert _snapshot(sched) == before and "U" not in sched.trajectories
    assert sched.open_trajectory("U", 6.0, memory_gb=4.0) == "n"


@pytest.mark.parametrize("memory_gb", [-4.0, float("nan"), float("inf"), "4", None, True])
def test_an_open_with_memory_not_a_finite_number_at_least_zero_is_refused(memory_gb):
    """A negative memory_gb was taken from the node's free memory, which grew past the node's
    (16 GB node, -5: 21 GB free), so containers were placed in memory it does not have; NaN
    or inf left the trajectory unplaced as if memory were short, a string raised a bare
    TypeError."""
    sched = Scheduler(ONE, make_policy("tangram"))
    sched.submit(cpu("a", "T", memory_gb=2.0), 0.0)
    before = _snapshot(sched)
    with pytest.raises(ValueError, match="'U': memory_gb must be a finite number >= 0"):
        sched.open_trajectory("U", 1.0, memory_gb=memory_gb)
    assert _snapshot(sched) == before and "U" not in sched.trajectories


@pytest.mark.parametrize(
    ("field", "value"),
    [
        ("memory_gb", float("nan")),
        ("memory_gb", float("inf")),
        ("memory_gb", "2"),
        ("memory_gb", True),
        ("service_size_gb", float("nan")),
        ("service_size_gb", None),
        ("max_units", True),
        ("arrival", "0"),
        ("arrival", True),
    ],
)
def test_an_action_field_that_is_no_finite_amount_is_refused_naming_it(field, value):
    """A NaN memory_gb was taken: the action's container compared false with every node's
    free memory and waited for memory for ever (never started or rejected); a string raised a
    bare TypeError naming no field; True was taken as 1 unit."""
    with pytest.raises(ActionError, match=f"{field} must be"):
        Action("a", "T", ResourceKind.CPU, Inelastic(1.0), **{field: value})


GPU_CLUSTER = ClusterSpec("g", gpu_nodes=(GpuNodeSpec("g0", 4, 40.0, 100.0),))


@pytest.mark.parametrize(
    ("node", "gpus", "service", "size_gb", "error", "match"),
    [
        ("g9", (0,), "rm", None, KeyError, "unknown GPU node 'g9'"),
        ("g0", (-1,), "rm", None, ValueError, r"gpus \(-1,\) are not distinct GPUs"),
        ("g0", (0, 1, 2, 7), "rm", None, ValueError, "are not distinct GPUs of its 4"),
        ("g0", (1, 1), "rm", None, ValueError, "are not distinct"),
        ("g0", (0,), "rm", float("inf"), ValueError, "size_gb must be a finite number"),
        ("g0", (0,), "rm", float("nan"), ValueError, "size_gb must be a finite number"),
        ("g0", (0,), "", None, ValueError, "service must be a non-empty name"),
    ],
)
@pytest.mark.parametrize("resident", [True, False])
def test_a_residency_report_of_gpus_the_node_lacks_is_refused_changing_nothing(
    node, gpus, service, size_gb, error, match, resident
):
    """GPU -1 was read as the node's last (a copy recorded on a GPU it is not on, calls placed
    there as resident); GPUs past the node's recorded the ones before them and raised a bare
    IndexError; an unknown node a bare KeyError; an infinite size was kept as the model's."""
    sched = Scheduler(GPU_CLUSTER, make_policy("tangram"))
    sched.report_residency("g0", (2, 3), "rm", True, 10.0)
    state = sched.state.gpu["g0"]
    before = ([set(r) for r in state.resident], [dict(s) for s in state.shape], dict(state.size_gb))
    with pytest.raises(error, match=match):
        sched.report_residency(node, gpus, service, resident, size_gb)
    after = ([set(r) for r in state.resident], [dict(s) for s in state.shape], dict(state.size_gb))
    assert after == before


@pytest.mark.parametrize(
    ("field", "value"),
    [
        ("replica_gpus", 3),
        ("replica_gpus", 1.5),
        ("replica_gpus", True),
        ("gpu_seconds", float("inf")),
        ("size_gb", float("nan")),
        ("size_gb", -5.0),
    ],
)
def test_a_demand_of_no_cell_or_no_finite_amount_is_refused_naming_the_field(field, value):
    """replica_gpus of 3 (or 1.5) was taken, and sglang-sized raised a CapacityError (or a
    TypeError) out of the pass of the first GPU call, which stayed queued with nothing to start
    it; a NaN or negative size_gb, an infinite load were taken."""
    fields = {"service": "m", "replica_gpus": 1, "gpu_seconds": 10.0, "size_gb": 10.0}
    with pytest.raises(ValueError, match=f"{field} must be"):
        ServiceDemand(**{**fields, field: value})


def test_a_service_expected_twice_is_refused_before_the_policy_hears_of_it():
    """Declared twice, the later demand replaced the earlier in sglang-sized's table and the
    first GPU call's pass raised 'declared twice' from the sizing, the call queued for ever."""
    sched = Scheduler(GPU_CLUSTER, make_policy("sglang-sized"))
    with pytest.raises(ValueError, match="service 'm' is declared twice"):
        sched.expect((ServiceDemand("m", 1, 10.0), ServiceDemand("m", 2, 5.0)))
    with pytest.raises(ValueError, match="no ServiceDemand"):
        sched.expect(({"service": "m"},))
    sched.expect((ServiceDemand("m", 2, 10.0),))
    call = Action("g", "T", ResourceKind.GPU, Inelastic(1.0), max_units=4, service="m")
    (start,) = sched.submit(call, 0.0)
    assert isinstance(start, Start) and start.gpus == (0, 1)


class _Host:
    request_flush = handed = settled = None

    def __init__(self):
        self.decided = []

    def start(self, d):
        self.decided.append(d)

    reject = defer = start

    def arm_wakeup(self, when):
        pass

    def pass_failed(self, arrived, finished, error):
        raise error


def test_events_after_the_loop_is_detached_are_dropped_before_the_core_sees_them():
    """detach promised that later events are dropped, but a flush with a buffered arrival
    still handed it to the core, which started it (its cores held for good, nobody to run
    it) before the loop raised a bare KeyError for want of a handler; a close or a node join
    changed the core the same way."""
    sched = Scheduler(ONE, make_policy("tangram"))
    host = _Host()
    loop = DriverLoop(sched, host)
    loop.arrive(cpu("a", "T"))
    loop.flush(0.0)
    assert [d.action.id for d in host.decided] == ["a"]
    loop.detach()
    before = _snapshot(sched)
    loop.arrive(cpu("b", "T"))
    loop.finish("a")
    loop.flush(1.0)
    loop.close_trajectory("T", 1.0)
    loop.add_node(CpuNodeSpec("m", 4, 1, 16.0), 1.0)
    loop.wake(1.0, 1.0)
    assert _snapshot(sched) == before and "b" not in sched.admission.seen
    assert not loop.arrivals and not loop.finishes
    assert list(sched.trajectories) == ["T"] and list(sched.state.cpu) == ["n"]


@pytest.mark.parametrize(
    ("field", "value"),
    [("service", ["m"]), ("service", 5), ("service", ""), ("node", 5), ("task", None), ("kind", 3)],
)
def test_an_action_naming_its_service_or_node_by_no_string_is_refused(field, value):
    """service=['m'] was taken: the GPU call's queueing raised 'unhashable type' with the
    action half queued (in the domain's queue, not its service's), and the pass never ran;
    a number passed as a service or node name, None as a task label."""
    fields = {"service": "m", field: value}
    with pytest.raises(ActionError, match=f"{field} must be"):
        Action("g", "T", ResourceKind.GPU, Inelastic(1.0), **fields)


@pytest.mark.parametrize("now", BAD_TIMES)
def test_a_pass_after_withdrawals_at_a_bad_time_keeps_the_domains_for_the_next(now):
    """after_withdrawals took the withdrawals' domains and then its pass refused the time:
    the domains were lost, so the actions a withdrawn one held back waited for the next event
    (fixed:2 on 4 cores: a 2-core FCFS head withdrawn, the one behind it stayed queued)."""
    sched = Scheduler(ONE, make_policy("fixed:2"))
    sched.submit_many([cpu("r", "R", units=2), cpu("s", "S", units=1)], 5.0)  # 1 core free
    sched.submit_many([cpu("h", "H", units=2), cpu("b", "B", units=1)], 5.0)  # h heads
    assert set(sched.domain_of) == {"h", "b"}
    assert sched.withdraw("h", 5.0)
    with pytest.raises(ValueError, match="finite number|went backwards"):
        sched.after_withdrawals(now)
    assert sched.withdraw("nobody", 5.0) is False  # (no new withdrawal: the old domains only)
    (start,) = sched.after_withdrawals(5.0)
    assert start.action.id == "b"


@pytest.mark.parametrize("junk", [None, "a9", {"id": "a9"}])
def test_an_arrival_that_is_no_action_is_refused_before_the_completions_beside_it(junk):
    """advance returned the finished action's units and then raised an AttributeError on the
    arrival beside it: the finish was taken but its pass never ran (the action waiting for
    those units stayed queued), though the call was refused."""
    sched = Scheduler(ONE, make_policy("fixed:1"))
    sched.submit_many([cpu(f"a{i}", f"T{i}") for i in range(5)], 0.0)  # a4 waits
    before = _snapshot(sched)
    with pytest.raises(TypeError, match="an arrival must be an Action"):
        sched.advance(1.0, finished=["a0"], arrived=[cpu("b", "B"), junk])
    assert _snapshot(sched) == before and "b" not in sched.admission.seen
    assert [d.action.id for d in sched.finish("a0", 1.0)] == ["a4"]


@pytest.mark.parametrize("trajectory", ["", None, 7])
def test_an_open_of_a_trajectory_no_action_can_name_is_refused(trajectory):
    """open_trajectory('') placed a container (its memory held until a close) for a
    trajectory no action can belong to (an Action refuses an empty trajectory id)."""
    sched = Scheduler(ONE, make_policy("tangram"))
    before = _snapshot(sched)
    with pytest.raises(ValueError, match="a trajectory needs a non-empty string id"):
        sched.open_trajectory(trajectory, 0.0, memory_gb=4.0)
    assert _snapshot(sched) == before and not sched.trajectories


@pytest.mark.parametrize("units", [1.5, 2.0, True])
def test_a_curve_point_at_units_that_are_no_whole_number_is_refused(units):
    """Tabulated and fit_amdahl read units with int(): a point measured at 1.5 units was
    taken as one at 1 (the tabulated curve then timed 1 unit at 1.5 units' time), True as 1;
    the curve dicts (a trace's, the service's) refused them already."""
    from tangram.core.curves import CurveError, Tabulated, fit_amdahl

    with pytest.raises(CurveError, match="units must be a whole number"):
        Tabulated(((1, 4.0), (units, 3.0), (4, 1.0)))
    with pytest.raises(CurveError, match="units must be a whole number"):
        fit_amdahl([(units, 3.0), (4, 1.0)])


@pytest.mark.parametrize(
    ("make", "key"),
    [
        (lambda: CpuNodeSpec("n", True, 1, 16.0), "cores"),
        (lambda: CpuNodeSpec("n", 4, True, 16.0), "numa_domains"),
        (lambda: GpuNodeSpec("g", True, 40.0, 100.0), "gpus"),
        (lambda: ApiEndpointSpec("web", True), "concurrency"),
        (lambda: ApiEndpointSpec("web", 2, 1.0, True), "burst"),
    ],
)
def test_a_node_or_endpoint_counted_by_a_bool_is_refused(make, key):
    """True passed isinstance(_, int) (and 'in (1, 2, 4, 8)'), so a node added with cores=True
    (add_node, ClusterSpec) was taken as one core, gpus=True as one GPU."""
    with pytest.raises(SpecError, match=f"{key}: must be"):
        make()


def test_a_residency_report_may_name_its_gpus_and_size_by_numpy_numbers():
    """(The check added above took only Python ints and floats.)"""
    import numpy as np

    sched = Scheduler(GPU_CLUSTER, make_policy("tangram"))
    sched.report_residency("g0", (np.int64(2), np.int64(3)), "rm", True, np.float32(10.0))
    assert sched.state.gpu["g0"].is_resident("rm", (2, 3))
    assert sched.state.gpu["g0"].size_gb == {"rm": 10.0}


def test_a_copy_reported_on_gpus_out_of_order_serves_the_calls_on_its_cell():
    """A copy reported as (1, 0) was recorded as restored on the cell (1, 0), which no call
    runs on (cells ascend), so a call on (0, 1) was priced a restore of a copy already there."""
    sched = Scheduler(GPU_CLUSTER, make_policy("tangram"))
    sched.report_residency("g0", (1, 0), "rm", True, 30.0)
    assert sched.state.gpu["g0"].is_resident("rm", (0, 1))
    call = Action(
        "g", "T", ResourceKind.GPU, Inelastic(1.0), max_units=2, service="rm", service_size_gb=30.0
    )
    (start,) = sched.submit(call, 0.0)
    assert start.gpus == (0, 1) and not start.restore


@pytest.mark.parametrize("name", ["", None, 5, ("n",)])
@pytest.mark.parametrize(
    "make",
    [
        lambda name: CpuNodeSpec(name, 4, 1, 16.0),
        lambda name: GpuNodeSpec(name, 2, 80.0, 100.0),
        lambda name: ApiEndpointSpec(name, 1),
        lambda name: ClusterSpec(name, (CpuNodeSpec("n", 4, 1, 16.0),)),
    ],
    ids=["cpu", "gpu", "api", "cluster"],
)
def test_a_node_endpoint_or_cluster_built_in_python_needs_a_non_empty_string_name(make, name):
    """Cluster files refuse an empty name; a ClusterSpec built in Python took '', None or a
    number as a node's or endpoint's name: one no action can name (an Action refuses an
    empty or non-string node or service), its capacity there for nothing."""
    with pytest.raises(SpecError, match="non-empty string name") as err:
        make(name)
    assert err.value.key == "name"


def test_an_open_of_an_open_trajectory_asking_another_node_or_more_memory_is_refused():
    """An open of a trajectory already open returned its node whatever it asked: pinned to
    another node, or asking more memory than its container holds, the caller was answered
    as if granted (its container on the old node, its memory never reserved)."""
    two = ClusterSpec("two", (CpuNodeSpec("n", 4, 1, 16.0), CpuNodeSpec("m", 4, 1, 16.0)))
    sched = Scheduler(two, make_policy("tangram"))
    assert sched.open_trajectory("T", 0.0, memory_gb=4.0, node="n") == "n"
    free = sched.state.cpu["n"].memory_free_gb
    with pytest.raises(ValueError, match=r"'T' is open on node 'n'.*'m'"):
        sched.open_trajectory("T", 1.0, memory_gb=4.0, node="m")
    with pytest.raises(ValueError, match=r"'T' is open with 4.0 GB.*8.0 GB"):
        sched.open_trajectory("T", 1.0, memory_gb=8.0)
    assert sched.now == 0.0 and sched.state.cpu["n"].memory_free_gb == free
    assert sched.trajectories["T"].memory_gb == 4.0
    # The same, or less, or no node named: its node, nothing changes.
    assert sched.open_trajectory("T", 1.0, memory_gb=4.0, node="n") == "n"
    assert sched.open_trajectory("T", 1.0, memory_gb=1.0) == "n"
    assert sched.state.cpu["n"].memory_free_gb == free
