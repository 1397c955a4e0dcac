"""Issue 16, defect 11: parked containers take no CPU outside the grants, so granted cores plus
the parked reserve never exceed the node's cores, however many containers are parked and
whatever their background processes do; and those processes are still there, and run again,
at the trajectory's next action."""

from __future__ import annotations

import os
import signal
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import pytest

from tangram.exec.aoe.cgroups import find_cgroup_dirs

pytestmark = pytest.mark.docker

PARKED = 10
#: A background loop that counts its own progress in a file (one line per turn).
SPIN = "(while :; do echo >> /work/count; done) >/dev/null 2>&1 &"
COUNT = "wc -l < /work/count"


def test_parked_containers_use_no_cpu_so_grants_never_oversubscribe(
    manager: Any, trajectory: Any
) -> None:
    trajs = [trajectory(manager, memory_gb=0.125) for _ in range(PARKED)]
    for traj in trajs:
        assert manager.run_action(traj, SPIN, 1).ok
    time.sleep(0.3)  # parking done: whatever the loops were in the middle of has stopped
    used0 = sum(manager.cpu_usage_s(t) for t in trajs)
    counts0 = [manager.run_action(t, COUNT, 1).text for t in trajs[:2]]
    # Meanwhile one action holds every core of the node, busy: granted = the node's cores.
    busy = trajectory(manager, memory_gb=0.125)
    node = len(manager.topology.cores)
    worker = threading.Thread(
        target=manager.run_action,
        args=(busy, "for i in 1 2 3; do (while :; do :; done) & done; wait", node),
        kwargs={"timeout_s": 2.5},
    )
    worker.start()
    time.sleep(0.3)
    u0, t0 = sum(manager.cpu_usage_s(t) for t in trajs), time.monotonic()
    time.sleep(1.5)
    rate = (sum(manager.cpu_usage_s(t) for t in trajs) - u0) / (time.monotonic() - t0)
    worker.join(10)
    assert rate < 0.005, (
        f"{PARKED} parked containers used {rate:.3f} cores outside any grant (node: {node})"
    )
    # The invariant: all the node's cores are there for grants, the parked reserve is nothing.
    assert manager.parked_reserve_cores() == 0.0
    assert used0 > 0  # the loops did run while their actions held cores
    # The background loops survive parking and go on at the next action.
    for traj, before in zip(trajs[:2], counts0, strict=True):
        out = manager.run_action(traj, f"sleep 0.2; {COUNT}", 1)
        assert out.ok and int(out.text) > int(before), (before, out.text)


def test_a_container_that_ends_itself_is_not_left_frozen_behind(
    manager: Any, trajectory: Any
) -> None:
    """A container that ends during an action (here its init is told to stop, from the host:
    an action cannot signal init, which runs under another uid) dies while the action is
    judged: parking it then would freeze a dead container, which runc takes for a paused one
    and never deletes (its cgroups and task stayed behind, 1 time in 8 here)."""
    traj = trajectory(manager, memory_gb=0.125)
    left = []
    for _ in range(6):
        container = manager._trajs[traj].container
        _, dirs = find_cgroup_dirs(container.init_pid)
        started = Path(f"/proc/{container.init_pid}/root/tmp/started")
        with ThreadPoolExecutor(1) as pool:
            running = pool.submit(
                manager.run_action, traj, "touch /tmp/started; sleep 5", 1, timeout_s=10
            )
            assert _appears(started, 10.0), "the action did not start"
            os.kill(container.init_pid, signal.SIGTERM)
            out = running.result(timeout=30)
        assert out.status == "error" and "died" in out.error, out
        manager.recreate(traj)
        if not _gone(dirs["cpu"], 5.0):
            left.append(dirs["cpu"])
    assert not left, f"cgroups of dead containers left behind: {left}"


def _appears(path: Path, within_s: float) -> bool:
    deadline = time.monotonic() + within_s
    while not path.exists():
        if time.monotonic() > deadline:
            return False
        time.sleep(0.05)
    return True


def _gone(path: Path, within_s: float) -> bool:
    deadline = time.monotonic() + within_s
    while path.exists():
        if time.monotonic() > deadline:
            return False
        time.sleep(0.05)
    return True
