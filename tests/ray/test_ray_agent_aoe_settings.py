"""A node agent's ``aoe`` settings made into its ``AoeConfig`` (no Ray, no Docker needed)."""

from __future__ import annotations

from typing import Any

import pytest

from tangram.exec.ray import agent


def test_a_topology_in_the_aoe_settings_is_refused_naming_it(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The agent built ``AoeConfig(topology=..., **settings["aoe"])``: a ``topology`` key
    there (RayConfig refuses it, an agent given its settings otherwise did not) raised a bare
    TypeError ('got multiple values for keyword argument') naming no setting. It is refused
    naming ``aoe`` and ``topology`` before any AOE is started."""
    started: list[Any] = []
    monkeypatch.setattr(agent, "_start_aoe", lambda manager, config: started.append(config))
    labels = {"tangram-cores": "0", "tangram-gpus": "0", "tangram-name": "n1"}
    settings = {"aoe": {"topology": None}}
    with pytest.raises(ValueError, match=r"aoe: topology is set by each agent"):
        agent.NodeAgent("r" * 56, labels, 4 * 2**30, settings)
    assert started == []


@pytest.mark.parametrize("aoe", [{"kill_grace": 1.0}, {"memory_gb": "2"}, ["memory_gb"]])
def test_bad_aoe_settings_are_refused_naming_aoe(monkeypatch: pytest.MonkeyPatch, aoe: Any) -> None:
    """A misspelt key or a bad value is refused naming the ``aoe`` setting (not a bare
    TypeError from the keyword call, or a list's 'dict' conversion error)."""
    monkeypatch.setattr(agent, "_start_aoe", lambda manager, config: pytest.fail("started"))
    labels = {"tangram-cores": "0", "tangram-gpus": "0", "tangram-name": "n1"}
    with pytest.raises(ValueError, match=r"^aoe"):
        agent.NodeAgent("r" * 56, labels, 4 * 2**30, {"aoe": aoe})
