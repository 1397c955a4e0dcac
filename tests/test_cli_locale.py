"""The command's output under a locale that cannot encode every name it prints."""

import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def test_non_ascii_cluster_name_under_an_ascii_locale(tmp_path):
    """Under LC_ALL=C without UTF-8 mode stdout is ASCII: a cluster file's name (UTF-8,
    "café") printed in tangram sim's heading ended the command after the run with "error:
    'ascii' codec can't encode character" and no results; it is written escaped."""
    cluster = tmp_path / "f.toml"
    cluster.write_bytes(
        b'name = "caf\xc3\xa9"\n[[cpu_node]]\nname = "n\xc5\x93ud"\ncores = 2\n'
        b"numa_domains = 1\nmemory_gb = 8\n"
        b'[[gpu_node]]\nname = "g"\ngpus = 2\ngpu_memory_gb = 2\nhost_memory_gb = 8\n'
    )
    env = {
        **os.environ,
        "LC_ALL": "C",
        "LANG": "C",
        "PYTHONUTF8": "0",
        "PYTHONCOERCECLOCALE": "0",
        "PYTHONIOENCODING": "",
        "PYTHONPATH": os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")]),
    }
    args = ["sim", "--cluster", str(cluster), "--workload", "random", "--seed", "1"]
    out = subprocess.run(
        [sys.executable, "-m", "tangram.cli", *args, "--quiet", "--policy", "tangram"],
        capture_output=True,
        env=env,
        timeout=300,
    )
    assert out.returncode == 0, out.stderr.decode("utf-8", "replace")[-2000:]
    assert b"random on caf\\xe9:" in out.stdout
