"""Closing a trajectory removes its work volume before its id is free again (stop 28's diff
review): a trajectory reopened under the same id in between mounted the same volume, whose
name is the id's, with the closed trajectory's files in it. Stand-in containers, no engine."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from types import SimpleNamespace
from typing import Any

import pytest

from tangram.exec.aoe import manager as aoe_manager
from tangram.exec.aoe.errors import AoeError


class _Containers:
    """What ``close_trajectory`` and ``open_trajectory`` call, recording the order."""

    def __init__(self) -> None:
        self.events: list[str] = []
        self.manager: aoe_manager.AoeManager | None = None
        self.fail_volume = False
        self.fail_retire = False
        #: Volumes removal was asked for again at a reopen (the stale volume of a close).
        self.retried: list[str] = []
        self.reopen_during_removal = True
        #: Every container started and every one retired, in order (for the leak checks).
        self.started: list[SimpleNamespace] = []
        self.retired: list[SimpleNamespace] = []
        #: Called inside ``start`` (after the container is made): a shutdown racing it.
        self.during_start: Callable[[], None] | None = None

    def blueprint(self, traj_id: str, *_: object) -> SimpleNamespace:
        made = SimpleNamespace(traj_id=traj_id, generation=1)
        made.next_generation = lambda after=0: made
        return made

    def start(self, blueprint: SimpleNamespace) -> SimpleNamespace:
        self.events.append(f"start {blueprint.traj_id}")
        made = SimpleNamespace(
            blueprint=blueprint,
            handle=SimpleNamespace(short_id=f"c{len(self.started)}", traj_id=blueprint.traj_id),
        )
        self.started.append(made)
        if self.during_start is not None:
            self.during_start()
        return made

    def discard(self, container: SimpleNamespace) -> None:
        self.retire(container)

    def close_pool(self) -> None:
        self.events.append("close pool")

    def remove_leftovers(self) -> None:
        self.events.append("remove leftovers")

    def retire(self, container: SimpleNamespace) -> None:
        self.events.append(f"retire {container.blueprint.traj_id}")
        self.retired.append(container)
        if self.fail_retire:
            raise AoeError("could not remove container c: engine unreachable")

    def remove_volume(self, container: SimpleNamespace) -> None:
        if not self.reopen_during_removal:  # a reopen's retry of a close's stale volume
            self.retried.append(container.blueprint.traj_id)
            if self.fail_volume:
                raise AoeError("could not remove work volume v: volume is in use")
            return
        # Another client reopens the same id while the volume is being removed.
        assert self.manager is not None
        outcome: list[str] = []

        def reopen() -> None:
            try:
                self.manager.open_trajectory(container.blueprint.traj_id)  # type: ignore[union-attr]
                outcome.append("reopened")
            except AoeError as exc:
                outcome.append(str(exc))

        thread = threading.Thread(target=reopen)
        thread.start()
        thread.join(10)
        self.events.append(f"reopen during removal: {outcome[0]}")
        if self.fail_volume:
            raise AoeError("could not remove work volume v: volume is in use")
        self.events.append(f"volume {container.blueprint.traj_id} removed")


def manager_with(containers: _Containers) -> aoe_manager.AoeManager:
    mgr = object.__new__(aoe_manager.AoeManager)
    mgr._containers = containers  # type: ignore[assignment]
    mgr._trajs = {}
    mgr._stale_volumes = {}
    mgr._left_generation = {}
    mgr._lock = threading.Lock()
    mgr._closed = False
    mgr._reaper = None
    mgr.ledger = SimpleNamespace(close=lambda reason: None)  # type: ignore[assignment]
    containers.manager = mgr
    return mgr


def test_the_volume_goes_before_the_id_is_free_again():
    containers = _Containers()
    mgr = manager_with(containers)
    mgr.open_trajectory("t1")
    mgr.close_trajectory("t1")
    assert containers.events[:2] == ["start t1", "retire t1"]
    assert "already has a container" in containers.events[2]  # the reopen was refused
    assert containers.events[3] == "volume t1 removed"
    assert not mgr._trajs
    mgr.open_trajectory("t1")  # after the close, the id is free (and its volume new)


def test_a_volume_that_cannot_be_removed_does_not_fail_the_close(caplog: pytest.LogCaptureFixture):
    containers = _Containers()
    containers.fail_volume = True
    mgr = manager_with(containers)
    mgr.open_trajectory("t1")
    mgr.close_trajectory("t1")
    assert not mgr._trajs and "could not remove work volume" in caplog.text


def test_a_retire_that_raises_still_removes_the_volume_and_frees_the_id():
    """The container could not be removed: the close says so, but its volume is still removed
    (it would otherwise stay on the host disk) and the id is free again."""
    containers = _Containers()
    containers.fail_retire = True
    mgr = manager_with(containers)
    mgr.open_trajectory("t1")
    with pytest.raises(AoeError, match="could not remove container"):
        mgr.close_trajectory("t1")
    assert containers.events[-1] == "volume t1 removed"
    assert not mgr._trajs


def test_a_reopen_never_mounts_a_volume_its_close_could_not_remove():
    """The close's container outlived its retire, so its volume was in use and stayed; a
    reopen of the id would have mounted it, the closed trajectory's files in it. Now the
    reopen removes it first, or is refused while it cannot."""
    containers = _Containers()
    containers.fail_retire = containers.fail_volume = True
    mgr = manager_with(containers)
    mgr.open_trajectory("t1")
    with pytest.raises(AoeError, match="could not remove container"):
        mgr.close_trajectory("t1")
    containers.reopen_during_removal = False
    with pytest.raises(AoeError, match="earlier close is still there"):
        mgr.open_trajectory("t1")
    assert containers.retried == ["t1"] and "t1" not in mgr._trajs
    containers.fail_volume = False  # the container is gone now: its volume can go
    mgr.open_trajectory("t1")
    assert containers.retried == ["t1", "t1"] and "t1" in mgr._trajs
    assert containers.events[-1] == "start t1"
    assert not mgr._stale_volumes


def _unretired(containers: _Containers) -> list[str]:
    """The containers started and never retired (left running), by short id."""
    return [c.handle.short_id for c in containers.started if c not in containers.retired]


class _ShutdownFirst:
    """A trajectory lock the manager is shut down under while its next holder waits."""

    def __init__(self, mgr: aoe_manager.AoeManager) -> None:
        self.mgr, self.lock = mgr, threading.Lock()

    def __enter__(self) -> None:
        self.mgr.shutdown()
        self.lock.acquire()

    def __exit__(self, *exc: object) -> None:
        self.lock.release()


def test_a_recreate_that_waited_through_a_shutdown_starts_no_container():
    """A recreate waiting for its trajectory's lock (an action ran) while the manager shut
    down went on after it: it retired the container the shutdown had already retired and
    started a fresh one that nothing would ever remove (the reaper had been released)."""
    containers = _Containers()
    mgr = manager_with(containers)
    mgr.open_trajectory("t1")
    mgr._trajs["t1"].lock = _ShutdownFirst(mgr)  # type: ignore[assignment]
    with pytest.raises(AoeError, match="shut down"):
        mgr.recreate("t1")
    assert containers.events.count("start t1") == 1, containers.events
    assert _unretired(containers) == [] and len(containers.retired) == 1


def test_a_recreate_whose_start_a_shutdown_overtook_removes_what_it_made():
    """The shutdown came while a recreate made the new container: it skipped the trajectory
    (its old container retired, the new one not yet in place), and the recreate then put the
    new container in place, in a shut-down manager, for ever."""
    containers = _Containers()
    mgr = manager_with(containers)
    mgr.open_trajectory("t1")
    containers.during_start = mgr.shutdown
    with pytest.raises(AoeError, match="shut down"):
        mgr.recreate("t1")
    assert _unretired(containers) == [], containers.events


def test_an_open_whose_start_a_shutdown_overtook_says_so_and_removes_what_it_made():
    """The container was discarded, but the error said the trajectory "was opened twice at
    once", naming a race with another open that never happened."""
    containers = _Containers()
    mgr = manager_with(containers)
    containers.during_start = mgr.shutdown
    with pytest.raises(AoeError, match="shut down") as raised:
        mgr.open_trajectory("t1")
    assert "twice" not in str(raised.value)
    assert _unretired(containers) == []


@pytest.mark.parametrize("method", ["open_trajectory", "recreate"])
def test_a_start_a_shutdown_overtook_keeps_the_watchdog_until_its_discard(
    method: str, monkeypatch: pytest.MonkeyPatch
):
    """An open or recreate whose start a shutdown overtook discards the container it made
    after the shutdown's sweep; the shutdown had released the watchdog already, so a
    discard the engine refused left the container for good. The watchdog is now released
    by the last start in flight, after its discard: it sweeps what the discard left."""
    containers = _Containers()
    mgr = manager_with(containers)
    if method == "recreate":
        mgr.open_trajectory("t1")
    watchdog = object()
    mgr._reaper = watchdog  # type: ignore[assignment]

    def release(held: object) -> None:
        if held is not None:
            assert held is watchdog
            containers.events.append("release watchdog")

    monkeypatch.setattr(aoe_manager.reaper, "release", release)

    def shutdown_then_refuse() -> None:
        mgr.shutdown()
        containers.fail_retire = True  # the engine refuses the discard's removal

    containers.during_start = shutdown_then_refuse
    with pytest.raises(AoeError, match="shut down"):
        getattr(mgr, method)("t1")
    events = containers.events
    assert events.count("release watchdog") == 1, events
    assert events[-2:] == ["retire t1", "release watchdog"], events
    mgr.shutdown()  # (idempotent: nothing released twice)
    assert containers.events.count("release watchdog") == 1


def test_the_shutdown_removes_the_volumes_closes_could_not(caplog: pytest.LogCaptureFixture):
    """A closed trajectory's work volume that its close could not remove (its container
    outlived the retire) was tried again only by a reopen of the id: after the shutdown it
    stayed on the host's disk for good, and a later manager's trajectory of the same id (a
    restarted service's) mounted the closed one's files. The shutdown, its containers
    gone, now removes it (a failure logged)."""
    containers = _Containers()
    mgr = manager_with(containers)
    mgr.open_trajectory("t1")
    mgr.open_trajectory("t2")
    containers.reopen_during_removal, containers.fail_volume = False, True
    mgr.close_trajectory("t1")
    mgr.close_trajectory("t2")
    assert containers.retried == ["t1", "t2"] and set(mgr._stale_volumes) == {"t1", "t2"}
    real_remove_volume = containers.remove_volume

    def t2_still_refused(container: SimpleNamespace) -> None:
        containers.fail_volume = container.blueprint.traj_id == "t2"
        real_remove_volume(container)

    containers.remove_volume = t2_still_refused  # type: ignore[method-assign]
    mgr.shutdown()
    assert containers.retried == ["t1", "t2", "t1", "t2"], containers.retried
    assert mgr._stale_volumes == {} and "closed trajectory 't2'" in caplog.text


def test_a_retire_that_fails_with_an_engine_error_does_not_stop_the_shutdown(
    caplog: pytest.LogCaptureFixture,
):
    """The shutdown logged a retire's ``AoeError`` and went on, but any other error (the
    docker SDK's ConnectionError or APIError from a removal) stopped it there: the later
    trajectories' containers, the leftovers sweep and the watchdog's release were all
    skipped, and a second shutdown returned at once (already closed)."""
    containers = _Containers()
    mgr = manager_with(containers)
    mgr.open_trajectory("t1")
    mgr.open_trajectory("t2")
    real_retire = containers.retire

    def retire(container: SimpleNamespace) -> None:
        real_retire(container)
        if container.blueprint.traj_id == "t1":
            raise ConnectionError("engine unreachable")

    containers.retire = retire  # type: ignore[method-assign]
    mgr.shutdown()
    assert "retire t2" in containers.events and "remove leftovers" in containers.events
    assert "engine unreachable" in caplog.text


def test_an_id_a_caller_chose_never_refuses_another_trajectorys_action():
    """A manager-made action id was ``<trajectory>.<n>``, which a caller may choose too: while
    trajectory u's action ran under the id "t.2" it chose, trajectory t's next action (given
    no id) was refused with "action id 't.2' already holds cores", an id t never chose. The
    ids the manager makes now hold a character no caller's id may."""
    from tangram.exec.aoe.config import AoeConfig
    from tangram.exec.aoe.ledger import CoreLedger
    from tangram.exec.aoe.topology import NumaTopology

    containers = _Containers()
    mgr = manager_with(containers)
    mgr.config = AoeConfig()
    mgr.topology = NumaTopology(((0, 1),))
    mgr.ledger = CoreLedger(mgr.topology)
    mgr._action_seq = 0
    ran: list[str] = []

    def run(container: SimpleNamespace, aid: str, plan: object, *rest: object) -> str:
        mgr.ledger.acquire(aid, 1)  # held: the action still runs
        ran.append(aid)
        return aid

    mgr._actions = SimpleNamespace(run=run)  # type: ignore[assignment]
    mgr.open_trajectory("t")
    mgr.open_trajectory("u")
    mgr.run_action("u", "sleep 9", action_id="t.2")
    mgr.run_action("t", "true")
    assert ran[0] == "t.2" and ran[1] != "t.2"


@pytest.mark.parametrize("traj_id", [123, None, b"t1", "", "a\x00b", "a\ud800b"])
def test_a_trajectory_id_that_is_no_text_is_refused_naming_it(traj_id: object):
    """A trajectory id that is not text (a number, None, bytes) raised a bare TypeError from
    deep in the container's naming (``re.sub``), naming neither the argument nor the fault;
    an empty one, one with NUL or a lone surrogate went into the container's labels, where
    the engine cannot hold them as given."""
    containers = _Containers()
    mgr = manager_with(containers)
    with pytest.raises(AoeError, match="trajectory id"):
        mgr.open_trajectory(traj_id)  # type: ignore[arg-type]
    assert containers.started == []


def test_an_action_waiting_for_its_trajectorys_previous_one_ends_at_its_deadline():
    """The wait for the trajectory's lock (its previous action still running) had no end but
    that action's: one whose deadline passed meanwhile kept its caller's thread until then
    (up to the previous action's own time-out), and only then ended "late". It now ends at
    its deadline, unrun."""
    from tangram.exec.aoe.config import AoeConfig
    from tangram.exec.aoe.execution import ActionRunner
    from tangram.exec.aoe.ledger import CoreLedger
    from tangram.exec.aoe.topology import NumaTopology

    containers = _Containers()
    mgr = manager_with(containers)
    mgr.config = AoeConfig()
    mgr.topology = NumaTopology(((0, 1),))
    mgr.ledger = CoreLedger(mgr.topology)
    mgr._action_seq = 0
    mgr._actions = ActionRunner(None, mgr.ledger, None)  # type: ignore[arg-type]
    mgr.open_trajectory("t")
    lock = mgr._trajs["t"].lock
    lock.acquire()  # the previous action runs
    outcomes: list[object] = []
    soon = time.monotonic() + 0.2
    waiter = threading.Thread(
        target=lambda: outcomes.append(mgr.run_action("t", "true", deadline=soon))
    )
    waiter.start()
    try:
        waiter.join(30)
        assert not waiter.is_alive(), "the action waited past its deadline for its trajectory"
        out = outcomes[0]
        assert out.status == "timeout" and "before it started" in out.error  # type: ignore[attr-defined]
        assert out.cores == () and set(out.timings) == {"queue_s", "total_s", "overhead_s"}  # type: ignore[attr-defined]
    finally:
        lock.release()
        waiter.join(10)


@pytest.mark.parametrize("pool", [5, (0, "1"), [[0], [1]]])
def test_a_weighted_pool_that_is_no_core_list_is_refused_naming_it(pool: object):
    """A weighted action's pool that was no list of core ids (a number, a mix of types,
    unhashable items) raised a bare TypeError from ``set``/``sorted``, naming neither the
    argument nor the fault, where a pool with an unknown core is a GrantError naming it."""
    from tangram.exec.aoe.config import AoeConfig
    from tangram.exec.aoe.ledger import CoreLedger
    from tangram.exec.aoe.topology import NumaTopology

    containers = _Containers()
    mgr = manager_with(containers)
    mgr.config = AoeConfig()
    mgr.topology = NumaTopology(((0, 1),))
    mgr.ledger = CoreLedger(mgr.topology)
    mgr._action_seq = 0
    mgr.open_trajectory("t")
    with pytest.raises(AoeError, match="pool"):
        mgr.run_action("t", "true", (0,), weighted=True, pool=pool)  # type: ignore[arg-type]


@pytest.mark.parametrize("traj_id", [["t1"], {"t": 1}, {"t1"}])
def test_an_unhashable_trajectory_id_is_refused_naming_it(traj_id: Any) -> None:
    """An action, close or recreate naming its trajectory by an unhashable value (a list, a
    dict) raised a bare TypeError from the trajectories' table ('unhashable type'), naming
    neither the argument nor the fault; it is now an ``UnknownTrajectory`` (an ``AoeError``)
    naming the id."""
    from tangram.exec.aoe.errors import UnknownTrajectory

    mgr = manager_with(_Containers())
    for call in (
        lambda: mgr.close_trajectory(traj_id),
        lambda: mgr.recreate(traj_id),
        lambda: mgr.run_action(traj_id, "true"),
        lambda: mgr.handle(traj_id),
    ):
        with pytest.raises(UnknownTrajectory, match="trajectory id"):
            call()
