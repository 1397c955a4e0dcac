"""Action records: immutable, validated, with the unit options their resource allows."""

import dataclasses

import pytest

from tangram.core import Action, ActionError, Amdahl, Inelastic, ResourceKind


def cpu(**kw):
    base = dict(
        id="a", trajectory="t", resource=ResourceKind.CPU, curve=Amdahl(2.0, 0.1), max_units=4
    )
    return Action(**{**base, **kw})


def test_actions_are_immutable():
    with pytest.raises(dataclasses.FrozenInstanceError):
        cpu().max_units = 8


def test_units_by_resource():
    assert cpu(max_units=3).allowed_units() == (1, 2, 3)
    assert cpu(max_units=300).allowed_units(cap=4) == (1, 2, 3, 4)
    gpu = Action("g", "t", ResourceKind.GPU, Amdahl(1.0, 0.2), max_units=6, service="rm")
    assert gpu.allowed_units() == (1, 2, 4)
    api = Action("s", "t", "api", Inelastic(0.5), service="search")
    assert api.resource is ResourceKind.API and api.allowed_units() == (1,)


@pytest.mark.parametrize(
    ("kw", "message"),
    [
        (dict(id=""), "action id must be a non-empty string"),
        (dict(resource="tpu"), "resource must be one of"),
        (dict(max_units=0), "max_units must be an integer >= 1"),
        (dict(arrival=-1.0), "arrival must be a finite time >= 0"),
        (dict(resource=ResourceKind.GPU), "must name its service"),
        (dict(resource=ResourceKind.API, service="s", max_units=1), "API action is inelastic"),
        (dict(curve="fast"), "curve must be an ElasticityCurve"),
        (dict(memory_gb=-2.0), "memory_gb"),
    ],
)
def test_bad_fields_are_named(kw, message):
    with pytest.raises(ActionError, match=message):
        cpu(**kw)
