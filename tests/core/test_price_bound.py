"""A price is bounded, so every cost figure stays finite.

``[prices] cpu_core_hour = 1e308`` passed (finite, >= 0): a replay's cost (price x
core-hours) overflowed to ``inf`` in the table and ``null`` in ``--json``, naming no key.
"""

from __future__ import annotations

import math

import pytest

from tangram.core.cluster_file import ClusterFileError, load_cluster
from tangram.core.resources import PRICE_MAX, Prices, SpecError


@pytest.mark.parametrize("key", ["cpu_core_hour", "gpu_hour", "api_call"])
@pytest.mark.parametrize("value", [1e308, PRICE_MAX * 2])
def test_a_price_above_the_bound_is_refused_naming_it(key, value):
    with pytest.raises(SpecError, match=rf"{key}: must be .*<= 1e\+06"):
        Prices(**{key: value})


def test_a_cluster_file_names_the_price_key(tmp_path):
    path = tmp_path / "c.toml"
    path.write_text(
        '[[cpu_node]]\nname = "n0"\ncores = 8\nnuma_domains = 1\nmemory_gb = 64\n'
        "[prices]\ncpu_core_hour = 1e308\n"
    )
    with pytest.raises(ClusterFileError, match=r"prices\.cpu_core_hour"):
        load_cluster(path)


def test_at_the_bound_the_largest_cluster_costs_a_finite_amount():
    """4096 nodes of 4096 cores for 1e12 s (10**3 steps of the longest trace time)."""
    prices = Prices(cpu_core_hour=PRICE_MAX, gpu_hour=PRICE_MAX)
    assert math.isfinite(4096 * 4096 * 1e12 / 3600 * prices.cpu_core_hour)
