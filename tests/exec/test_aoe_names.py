"""Issue 16, defect 1: one trajectory's open must never destroy another's container. Ids that
once mapped to the same container name open side by side, each in its own container; a
container that holds a name this manager wanted, and that it does not own, is left alone."""

from __future__ import annotations

from typing import Any

import pytest

from tangram.exec.aoe import AoeError
from tangram.exec.aoe.lifecycle import container_name

pytestmark = pytest.mark.docker

#: Pairs of ids the old naming (first 48 "safe" characters, the rest "-") mapped to one name.
COLLIDING = [
    ("a!", "a?"),
    (".", ".."),
    ("траектория", "проба"),
    ("数据", "模型"),
    ("x" * 49 + "1", "x" * 49 + "2"),
]


@pytest.mark.parametrize("first,second", COLLIDING, ids=lambda s: ascii(s)[:12])
def test_colliding_ids_open_side_by_side_each_in_its_own_container(
    manager: Any, docker_client: Any, first: str, second: str
) -> None:
    opened = []
    try:
        for traj in (first, second):
            manager.open_trajectory(traj, memory_gb=0.25)
            opened.append(traj)
            out = manager.run_action(traj, f"echo {len(traj)} > /work/me", 1)
            assert out.ok, out
        ids = {manager.handle(t).container_id for t in opened}
        assert len(ids) == 2, "two trajectories share one container"
        for traj in opened:
            # Each container is still there, running, labelled with its own full id.
            info = docker_client.api.inspect_container(manager.handle(traj).container_id)
            assert info["State"]["Running"]
            assert info["Config"]["Labels"]["tangram.aoe.trajectory"] == traj
            seen = manager.run_action(traj, "cat /work/me", 1)
            assert seen.text.strip() == str(len(traj))
    finally:
        for traj in opened:
            manager.close_trajectory(traj)


def test_a_container_we_do_not_own_holding_our_name_survives_and_the_open_fails_clearly(
    manager: Any, docker_client: Any
) -> None:
    traj = "squatted"
    name = container_name(manager.session, manager._containers.blueprint(traj, None, None, None))
    squatter = docker_client.containers.run(
        "tangram-busybox", ["sleep", "infinity"], name=name, detach=True, init=True
    )
    try:
        with pytest.raises(AoeError, match="already taken.*left alone"):
            manager.open_trajectory(traj)
        squatter.reload()
        assert squatter.status == "running", "the open removed a container it does not own"
        assert traj not in manager.trajectories()
    finally:
        squatter.remove(force=True)
