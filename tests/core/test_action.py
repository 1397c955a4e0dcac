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


def test_a_replicated_service_restores_the_whole_model_on_each_gpu_and_must_fit_one() -> None:
    """The core's two forms of a k-GPU service: k shards of size/k (the default, EOE's layer
    shards) or k whole data-parallel replicas (``service_replicas``)."""
    from tangram.core.cells import unit_options
    from tangram.core.resources import GpuNodeSpec

    node = GpuNodeSpec("g", gpus=8, gpu_memory_gb=80.0, host_memory_gb=1000.0, h2d_gbps=25.0)
    assert node.restore_s(100.0, 4) == pytest.approx(100.0 / (4 * 25.0) + node.restore_fixed_s)
    for k in (1, 2, 4, 8):  # every GPU loads all 100 GB over its own link, all at once
        assert node.restore_s(100.0, k, replicas=True) == pytest.approx(4.0 + node.restore_fixed_s)
    assert unit_options(144.0, 80.0, 8, 8) == (2, 4, 8)  # a 72B bf16 teacher: 2+ shards
    assert unit_options(144.0, 80.0, 8, 8, replicas=True) == ()  # no GPU holds a whole copy
    assert unit_options(30.0, 80.0, 8, 4, replicas=True) == (1, 2, 4)
    gpu = Action("a", "t", ResourceKind.GPU, Inelastic(1.0), service="m", service_size_gb=1.0)
    assert gpu.service_replicas is False
    assert dataclasses.replace(gpu, service_replicas=True).service_replicas is True
