"""The cluster spec from the agents' reports (no Ray needed): node labels read as documented,
bad ones refused naming the label, and the same nodes give the same spec in any order."""

from __future__ import annotations

from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from tangram.core.resources import ApiEndpointSpec
from tangram.exec.ray.nodes import (
    GpuPlan,
    NodeReport,
    cluster_spec,
    core_domains,
    gpu_plan,
    memory_gb,
    node_name,
)

APIS = (ApiEndpointSpec("echo", concurrency=4),)


def test_labels_shape_a_node() -> None:
    labels = {"tangram-cores": "0-3_8", "tangram-gpus": "cpu-4", "tangram-memory-gb": "12"}
    assert core_domains(labels) == ((0, 1, 2, 3, 8),)
    assert core_domains({"tangram-cores": ""}) == ()
    assert gpu_plan(labels, 2.0) == GpuPlan(4, "cpu", 2.0)
    assert gpu_plan({"tangram-gpus": "0"}, 2.0) is None
    assert memory_gb(labels, 64 * 2**30) == 12.0
    assert memory_gb({}, 64 * 2**30) == 64.0
    assert node_name("abcdef0123456789", {}) == "ray-abcdef01"
    assert node_name("abcdef0123456789", {"tangram-name": "cpu-7"}) == "cpu-7"


@pytest.mark.parametrize(
    ("labels", "names"),
    [
        ({"tangram-gpus": "cpu-3"}, "tangram-gpus"),
        ({"tangram-gpus": "tpu-2"}, "tangram-gpus"),
        ({"tangram-gpus": "many"}, "tangram-gpus"),
        ({"tangram-memory-gb": "-1"}, "tangram-memory-gb"),
        # A bare "could not convert string to float", and an infinite node (refused later
        # by the core's spec, which named no label).
        ({"tangram-memory-gb": "lots"}, "tangram-memory-gb"),
        ({"tangram-memory-gb": "inf"}, "tangram-memory-gb"),
        ({"tangram-memory-gb": "nan"}, "tangram-memory-gb"),
    ],
)
def test_bad_labels_are_refused_naming_the_label(labels: dict[str, str], names: str) -> None:
    with pytest.raises(ValueError, match=names):
        gpu_plan(labels, 2.0)
        memory_gb(labels, 1.0)


def report(name: str, cores: int, gpus: int) -> NodeReport:
    domains = (tuple(range(cores)),) if cores else ()
    plan = GpuPlan(gpus, "cpu", 2.0) if gpus else None
    return NodeReport(f"id-{name}", name, domains, 8.0, plan)


nodes = st.lists(
    st.tuples(st.integers(0, 4), st.sampled_from([0, 1, 2, 4, 8])).filter(lambda t: any(t)),
    min_size=1,
    max_size=6,
)


@given(nodes, st.randoms())
def test_the_same_nodes_give_the_same_spec_in_any_order(shapes, rng) -> None:
    reports = [report(f"n{i}", c, g) for i, (c, g) in enumerate(shapes)]
    shuffled = list(reports)
    rng.shuffle(shuffled)
    spec = cluster_spec(reports, APIS)
    assert spec == cluster_spec(shuffled, APIS)
    assert [n.name for n in spec.cpu_nodes] == sorted(r.name for r in reports if r.domains)
    assert [n.gpus for n in spec.gpu_nodes] == [g for _, g in shapes if g]
    assert spec.total_cores == sum(c for c, _ in shapes)


def test_two_nodes_with_one_name_are_refused() -> None:
    with pytest.raises(ValueError, match="tangram-name"):
        cluster_spec([report("a", 1, 0), report("a", 2, 0)], APIS)


def test_the_local_clusters_labels_are_valid_ray_labels() -> None:
    from ray._private.label_utils import validate_node_label_syntax

    from tangram.exec.ray.local import LOCAL_NODES

    for labels in LOCAL_NODES.values():
        validate_node_label_syntax(labels)  # what ``ray start --labels`` checks


@pytest.mark.parametrize("threads", [-1, 0, 1.5, "2", True])
def test_torch_threads_that_is_no_thread_count_is_refused_naming_it(threads: Any) -> None:
    # -1 failed every GPU agent's start with torch's own error, far from the setting; 0 was
    # read as 'torch's default' and 1.5 as 1, without a word.
    from tangram.exec.ray.config import RayConfig

    with pytest.raises(ValueError, match=r"torch_threads must be None or an integer >= 1"):
        RayConfig(torch_threads=threads)


@pytest.mark.parametrize("field", ["ping_every_s", "lost_after_s", "gpu_memory_gb"])
@pytest.mark.parametrize("value", [float("inf"), "1", True, None])
def test_a_fault_bound_that_is_no_finite_number_is_refused_naming_it(
    field: str, value: Any
) -> None:
    # ping_every_s=inf (with lost_after_s=inf) was taken: the watch slept for ever (no ping,
    # no death Ray reports, no join noticed); '1' or None raised TypeError from a comparison,
    # naming nothing; True was 1.
    from tangram.exec.ray.config import RayConfig

    bounds = {"ping_every_s": 1.0, "lost_after_s": 30.0, field: value}
    if field == "ping_every_s" and value == float("inf"):
        bounds["lost_after_s"] = value  # (else refused as fewer than two pings)
    with pytest.raises(ValueError, match=rf"{field} must be a positive number"):
        RayConfig(**bounds)


def test_endpoints_the_cluster_does_not_declare_are_refused_naming_them() -> None:
    """``RayConfig.endpoints`` under a name the cluster's APIs lack (a typo) were taken and
    never called: the declared endpoint's calls went to the built-in demo (fake hits), and
    a value that is no callable failed every call of its endpoint."""
    from tangram.core.resources import ClusterSpec
    from tangram.exec.ray.config import RayConfig

    async def real(payload: Any) -> Any:
        return payload

    with pytest.raises(ValueError, match=r"endpoints.*'serch'.*declares.*search"):
        RayConfig(endpoints={"serch": real})
    with pytest.raises(ValueError, match=r"endpoints\['search'\] must be a callable"):
        RayConfig(endpoints={"search": "http://example"})
    assert RayConfig(endpoints={"search": real}).endpoints == {"search": real}
    file = ClusterSpec(name="f", apis=(ApiEndpointSpec("mine", concurrency=1),))
    assert RayConfig(cluster=file, endpoints={"mine": real}).cluster is file
    with pytest.raises(ValueError, match="'search'"):  # (the file's APIs replace apis)
        RayConfig(cluster=file, endpoints={"search": real})


@pytest.mark.parametrize(
    ("aoe", "says"),
    [
        ({"kil_grace_s": 3.0}, "kil_grace_s"),
        ({"kill_grace_s": -1}, "kill_grace_s"),
        ({"warm_pool": 5}, "warm_pool"),
        ({"topology": None}, "topology"),
        ("kill_grace_s=3", "mapping"),
    ],
    ids=repr,
)
def test_agent_aoe_settings_are_checked_where_they_are_given(aoe: Any, says: str) -> None:
    """``RayConfig.aoe`` went as given to every agent's ``AoeConfig``: a misspelt key, a
    negative grace or a ``topology`` (each agent sets its own) failed every agent's start,
    a Ray actor error per node naming no setting of ``RayConfig``."""
    from tangram.exec.ray.config import RayConfig

    with pytest.raises(ValueError, match=rf"aoe.*{says}"):
        RayConfig(aoe=aoe)
    assert RayConfig(aoe={"kill_grace_s": 3.0}).aoe == {"kill_grace_s": 3.0}
