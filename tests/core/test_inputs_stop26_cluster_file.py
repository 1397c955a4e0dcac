"""Cluster files: every bad value is refused naming the file and the key (stop 26's hunt)."""

import math

import pytest

from tangram.core.cluster_file import (
    MAX_CORES_PER_NODE,
    MAX_NODES,
    ClusterFileError,
    load_cluster,
    parse_cluster,
)
from tangram.core.resources import Prices, SpecError

NODE = "cores = 8\nnuma_domains = 1\nmemory_gb = 64\n"
ONE_NODE = f'[[cpu_node]]\nname = "n0"\n{NODE}'


def write(tmp_path, text: str | bytes):
    path = tmp_path / "c.toml"
    path.write_bytes(text if isinstance(text, bytes) else text.encode())
    return path


def refused(tmp_path, text: str | bytes, key: str, problem: str) -> None:
    path = write(tmp_path, text)
    with pytest.raises(ClusterFileError, match=f"{path}: {key}: {problem}"):
        load_cluster(path)


def test_a_group_count_of_true_is_not_one_node(tmp_path):
    refused(
        tmp_path,
        f"[[cpu_node_group]]\ncount = true\n{NODE}",
        r"cpu_node_group\[0\].count",
        "must be a positive integer, got True",
    )


def test_a_group_prefix_must_be_a_string(tmp_path):
    refused(
        tmp_path,
        f"[[cpu_node_group]]\ncount = 2\nprefix = 5\n{NODE}",
        r"cpu_node_group\[0\].prefix",
        "must be a string, got 5",
    )


def test_a_description_must_be_a_string(tmp_path):
    refused(tmp_path, f"description = 5\n{ONE_NODE}", "description", "must be a string")


@pytest.mark.parametrize("value", ["-1.0", "nan", "inf"])
def test_prices_must_be_finite_and_not_negative(tmp_path, value):
    text = f"{ONE_NODE}[prices]\ngpu_hour = {value}\n"
    refused(tmp_path, text, "prices.gpu_hour", "must be a finite number >= 0")


@pytest.mark.parametrize("value", [-0.5, math.nan, math.inf, True])
def test_prices_own_their_rule(value):
    with pytest.raises(SpecError, match="api_call: must be a finite number >= 0"):
        Prices(api_call=value)


@pytest.mark.parametrize("cores", [MAX_CORES_PER_NODE + 1, 10**12, 10**23])
def test_cores_per_node_are_bounded(tmp_path, cores):
    text = f'[[cpu_node]]\nname = "n0"\ncores = {cores}\nnuma_domains = 1\nmemory_gb = 64\n'
    refused(tmp_path, text, r"cpu_node\[0\].cores", f"at most {MAX_CORES_PER_NODE} per node")


def test_nodes_per_cluster_are_bounded_before_they_are_built(tmp_path):
    text = f"[[cpu_node_group]]\ncount = 1000000000\n{NODE}"
    refused(tmp_path, text, r"cpu_node_group\[0\].count", f"must be at most {MAX_NODES}")


def test_single_nodes_count_toward_the_bound(tmp_path):
    text = f"{ONE_NODE}[[cpu_node_group]]\ncount = {MAX_NODES}\n{NODE}"
    refused(tmp_path, text, r"cpu_node_group\[0\].count", f"must be at most {MAX_NODES - 1}")


def test_the_bound_itself_loads(tmp_path):
    cluster = load_cluster(write(tmp_path, f"[[cpu_node_group]]\ncount = {MAX_NODES}\n{NODE}"))
    assert len(cluster.cpu_nodes) == MAX_NODES


def test_invalid_utf8_names_the_file(tmp_path):
    refused(tmp_path, b'name = "x"\n\xff\xfe bad\n', r"\(file\)", r"not valid UTF-8 \(line 2\)")


@pytest.mark.parametrize("value", [5, "local", [1, 2], None])
def test_a_cluster_that_is_not_a_table_is_refused_as_such(value):
    with pytest.raises(ClusterFileError, match=r"header: \(cluster\): must be a table"):
        parse_cluster(value, "header")


GPU_NODE = 'name = "g0"\ngpus = 1\ngpu_memory_gb = 80\nhost_memory_gb = 100\n'


@pytest.mark.parametrize("value", ["inf", "nan", "-inf"])
@pytest.mark.parametrize(
    ("table", "key"),
    [
        ("cpu_node", "memory_gb"),
        ("gpu_node", "gpu_memory_gb"),
        ("gpu_node", "host_memory_gb"),
        ("gpu_node", "h2d_gbps"),
        ("gpu_node", "restore_fixed_s"),
        ("api", "rate_per_s"),
    ],
)
def test_sizes_rates_and_times_must_be_finite(tmp_path, table, key, value):
    # TOML reads inf as a float: restore_fixed_s = inf passed '>= 0' and gave an infinite mean
    # ACT, then a ZeroDivisionError in tangram sim's closing words; the others passed silently.
    body = {"cpu_node": f'name = "n0"\n{NODE}', "gpu_node": GPU_NODE}
    body["api"] = 'name = "search"\nconcurrency = 2\n'
    lines = [line for line in body[table].splitlines() if not line.startswith(f"{key} =")]
    text = f"[[{table}]]\n" + "\n".join([*lines, f"{key} = {value}"]) + "\n"
    refused(tmp_path, text, rf"{table}\[0\].{key}", "must be a (positive )?finite number")


@pytest.mark.parametrize("name", ["cluster", "cluster.toml"])
def test_a_directory_is_named_as_one_not_as_missing(tmp_path, name):
    # It was 'no such file' for a path that exists.
    (tmp_path / name).mkdir()
    with pytest.raises(ClusterFileError, match="a directory, not a cluster file"):
        load_cluster(tmp_path / name)


@pytest.mark.parametrize(
    ("text", "key", "problem"),
    [
        (f'[[cpu_node]]\nname = ""\n{NODE}', r"cpu_node\[0\].name", "must be a non-empty name"),
        (
            f'{ONE_NODE}[[api]]\nname = " "\nconcurrency = 1\n',
            r"api\[0\].name",
            "must be a non-empty name",
        ),
        (
            f'{ONE_NODE}[[cpu_node]]\nname = "n0 "\n{NODE}',
            r"cpu_node\[1\].name",
            "must not begin or end with whitespace, got 'n0 '",
        ),
        (
            'name = "x\\ty"\n' + ONE_NODE,
            "name",
            "must not hold control characters",
        ),
        (f'name = ""\n{ONE_NODE}', "name", "must be a non-empty name"),
        (
            f'[[cpu_node_group]]\ncount = 2\nprefix = " n"\n{NODE}',
            r"cpu_node_group\[0\].prefix",
            "must not begin or end with whitespace",
        ),
    ],
)
def test_a_name_that_cannot_be_told_apart_or_called_is_refused(tmp_path, text, key, problem):
    # An empty node or API name was accepted (an API of name "" no trace row can call), and
    # "n0 " beside "n0" made two nodes that print the same.
    refused(tmp_path, text, key, problem)


def test_a_group_with_an_empty_prefix_still_names_its_nodes(tmp_path):
    spec = load_cluster(write(tmp_path, f'[[cpu_node_group]]\ncount = 2\nprefix = ""\n{NODE}'))
    assert [n.name for n in spec.cpu_nodes] == ["0", "1"]


@pytest.mark.parametrize("name", ["", "  "])
def test_an_empty_cluster_name_is_refused_as_empty(name):
    # Path("") is ".": it was refused as "a directory, not a cluster file" (--cluster '').
    with pytest.raises(ClusterFileError, match=r"\(name\): empty; give a path or a bundled"):
        load_cluster(name)
