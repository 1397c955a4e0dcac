"""Cluster TOML files: the bundled ones, and errors that name the file, the key and the problem."""

import pytest

from tangram.core import ClusterFileError, bundled_clusters, load_cluster


def test_bundled_paper_cluster_matches_the_testbed():
    c = load_cluster("paper")
    assert len(c.cpu_nodes) == 15 and {n.cores for n in c.cpu_nodes} == {256}
    assert {n.memory_gb for n in c.cpu_nodes} == {2400}
    assert len(c.gpu_nodes) == 5 and {n.gpus for n in c.gpu_nodes} == {8}
    assert {n.host_memory_gb for n in c.gpu_nodes} == {3000}
    assert [a.name for a in c.apis] == ["search"]
    assert c.total_cores == 3840 and c.total_gpus == 40


def test_local_cluster_fits_this_machine():
    c = load_cluster("local")
    assert c.total_cores <= 2
    assert {"paper", "local"} <= set(bundled_clusters())


@pytest.mark.parametrize(
    ("text", "key", "problem"),
    [
        (
            "[[cpu_node]]\nname='a'\ncores=0\nnuma_domains=1\nmemory_gb=1",
            "cpu_node[0].cores",
            "positive integer",
        ),
        (
            "[[cpu_node]]\nname='a'\ncores=6\nnuma_domains=4\nmemory_gb=1",
            "cpu_node[0].numa_domains",
            "split evenly",
        ),
        ("[[cpu_node]]\nname='a'\ncores=4\nnuma_domains=1", "cpu_node[0].memory_gb", "is required"),
        (
            "[[cpu_node]]\nname='a'\ncores='many'\nnuma_domains=1\nmemory_gb=1",
            "cpu_node[0].cores",
            "must be an integer",
        ),
        (
            "[[gpu_node_group]]\ncount=2\ngpus=3\ngpu_memory_gb=80\nhost_memory_gb=10",
            "gpu_node_group[0].gpus",
            "aligned cells",
        ),
        (
            "[[gpu_node_group]]\ncount=0\ngpus=8\ngpu_memory_gb=80\nhost_memory_gb=10",
            "gpu_node_group[0].count",
            "positive integer",
        ),
        ("[[api]]\nname='s'\nconcurrency=2\nrate='fast'", "api[0].rate", "unknown key"),
        ("[[api]]\nname='s'\nconcurrency=2\nrate_per_s=-1.0", "api[0].rate_per_s", "positive"),
        ("nodes = 3", "nodes", "unknown key"),
        ("name = 'empty'", "cluster", "describes no CPU node"),
        (
            "[[cpu_node]]\nname='a'\ncores=2\nnuma_domains=1\nmemory_gb=1\n[[cpu_node]]\nname='a'\ncores=2\nnuma_domains=1\nmemory_gb=1",
            "cpu",
            "duplicate names",
        ),
        ("[[cpu_node]\nname='a'", "(syntax)", ""),
    ],
)
def test_malformed_file_names_file_key_and_problem(tmp_path, text, key, problem):
    path = tmp_path / "bad.toml"
    path.write_text(text)
    with pytest.raises(ClusterFileError) as err:
        load_cluster(path)
    assert err.value.source == str(path)
    assert err.value.key == key
    assert problem in err.value.problem
    assert str(path) in str(err.value) and key in str(err.value)


def test_unknown_name_lists_bundled_clusters():
    with pytest.raises(ClusterFileError, match="bundled"):
        load_cluster("nonexistent-cluster")


def test_missing_file_is_named(tmp_path):
    with pytest.raises(ClusterFileError, match="no such file"):
        load_cluster(tmp_path / "missing.toml")


def test_scaled_cluster_keeps_node_shape():
    c = load_cluster("paper").scaled(gpu_nodes=2)
    assert c.total_gpus == 16 and c.total_cores == 3840


@pytest.mark.parametrize(
    ("encoding", "named"),
    [("utf-16", "UTF-16"), ("utf-16-be", "UTF-16"), ("utf-32", "UTF-32")],
)
def test_a_cluster_file_in_another_encoding_is_named(tmp_path, encoding, named) -> None:
    """PowerShell's '>' writes UTF-16 with a byte-order mark: the error said only "not valid
    UTF-8 (line 1)"; it names the encoding and how to convert it, as trace files do."""
    text = 'name = "x"\n'
    data = text.encode(encoding) if encoding == "utf-16" else ("\ufeff" + text).encode(encoding)
    path = tmp_path / "c.toml"
    path.write_bytes(data)
    with pytest.raises(ClusterFileError) as info:
        load_cluster(path)
    message = str(info.value)
    assert f"{named} text (the file opens with a {named} byte-order mark" in message
    assert f"iconv -f {named} -t UTF-8" in message
