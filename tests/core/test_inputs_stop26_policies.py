"""Policy names are parsed strictly, and the static GPU baseline's rejection reason tells the
truth about what its replicas hold (stop 26's hunt)."""

import pytest

from tangram.core.policies import make_policy
from tangram.sim.config import SimConfig
from tangram.sim.driver import simulate
from tangram.sim.metrics import actions_frame
from tangram.sim.workloads.random_instances import RandomParams, random_instance


def test_lower_bound_refuses_an_argument_it_would_ignore():
    with pytest.raises(ValueError, match="'lower-bound:3': lower-bound takes no argument"):
        make_policy("lower-bound:3")


@pytest.mark.parametrize("name", ["k8s-static", "tangram", "fixed", "lower-bound"])
def test_an_empty_argument_is_refused_naming_the_policy(name):
    with pytest.raises(ValueError, match=f"policy '{name}:': nothing after ':'"):
        make_policy(f"{name}:")


def test_policies_without_an_argument_still_build():
    assert make_policy("lower-bound") is not None
    assert make_policy("k8s-static").name == "k8s-static:4"


def test_the_dedicated_gpu_reason_counts_the_gpus_really_held():
    # Random instance 3 of the mixed family: 2 GPUs, a first service takes both (its share
    # is 4), the next services find none left.
    trace, cluster = random_instance(RandomParams(family="mixed"), seed=3)
    result = simulate(trace, cluster, SimConfig(policy="k8s-static:1", seed=3))
    acts = actions_frame(result)
    reasons = set(acts.loc[acts["outcome"] == "rejected", "reason"])
    no_gpus = [r for r in reasons if "no GPUs left to dedicate" in r]
    assert no_gpus, reasons
    total = cluster.total_gpus
    for reason in no_gpus:
        assert f"1 service already holds {total} of {total} GPUs, up to 4 each" in reason
