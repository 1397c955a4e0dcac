"""A node's ``tangram-cores`` label checked against the host where its agent starts (no Ray
needed): a core the host lacks, or a range too large to expand, is refused naming the label
before anything is made."""

from __future__ import annotations

import time
from pathlib import Path

import pytest

from tangram.exec.ray.agent import NodeAgent
from tangram.exec.ray.nodes import MAX_CORE_ID, core_domains, online_cores

HOST = frozenset({0, 1})


@pytest.mark.parametrize("text", ["0-3", "1_7", "2"])
def test_a_core_the_host_lacks_is_refused_naming_the_label(text: str) -> None:
    """Taken, the node joined with cores no container could be given: every container's
    create failed there, each open a 500."""
    with pytest.raises(ValueError, match=r"tangram-cores.*no core .*its cores: 0-1"):
        core_domains({"tangram-cores": text}, HOST)
    assert core_domains({"tangram-cores": "0-1"}, HOST) == ((0, 1),)
    assert core_domains({"tangram-cores": "1"}, HOST) == ((1,),)


@pytest.mark.parametrize("text", ["0-999999999", f"0_{MAX_CORE_ID + 1}"])
def test_a_range_too_large_to_expand_is_refused_at_once(text: str) -> None:
    """'0-999999999' was expanded to a billion core ids before any check (minutes and
    gigabytes in the agent)."""
    t0 = time.monotonic()
    with pytest.raises(ValueError, match="tangram-cores.*core ids go up to"):
        core_domains({"tangram-cores": text})
    assert time.monotonic() - t0 < 5.0  # (generous: the expansion took minutes)


def test_a_label_that_is_no_cpulist_names_the_label() -> None:
    with pytest.raises(ValueError, match="tangram-cores"):
        core_domains({"tangram-cores": "3-1"}, HOST)


def test_the_host_s_online_cores_are_read_from_sysfs(tmp_path: Path) -> None:
    online = tmp_path / "online"
    online.write_text("0-3,8\n")
    assert online_cores(online) == frozenset({0, 1, 2, 3, 8})
    assert online_cores(tmp_path / "missing")  # (else 0..cpu_count-1)


def test_an_agent_on_a_label_naming_cores_the_host_lacks_does_not_start() -> None:
    """The agent refuses the label before it makes AOE (no container, no Docker call)."""
    beyond = max(online_cores()) + 1
    labels = {"tangram-name": "n", "tangram-cores": f"0-{beyond}", "tangram-gpus": "0"}
    with pytest.raises(ValueError, match=f"tangram-cores.*no core {beyond}"):
        NodeAgent("abcdef0123456789", labels, 8 * 2**30, {})
