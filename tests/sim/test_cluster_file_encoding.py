"""Cluster files are UTF-8 (TOML is) whatever the locale: read and written as such."""

import os
import subprocess
import sys
import textwrap
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]

SCRIPT = textwrap.dedent(
    """
    import locale, pathlib, sys, types
    assert locale.getpreferredencoding(False).lower() not in ("utf-8", "utf8")
    import tangram.core.cluster_file as cf
    from tangram.sim.instances import write_instance
    from tangram.sim.workloads.random_instances import RandomParams, random_instance

    tmp = pathlib.Path(sys.argv[1])
    (tmp / "cafe.toml").write_bytes(
        b'name = "caf\\xc3\\xa9"\\ndescription = "2 c\\xc5\\x93urs"\\n'
        b'[[cpu_node]]\\nname = "n\\xc5\\x93ud"\\ncores = 2\\nnuma_domains = 1\\nmemory_gb = 8\\n'
    )
    # A bundled cluster (tangram/clusters/*.toml) with a non-ASCII byte, and a path to one.
    cf.resources = types.SimpleNamespace(files=lambda package: tmp)
    bundled = cf.load_cluster("cafe")
    assert bundled.name == "caf\\u00e9" and bundled.cpu_nodes[0].name == "n\\u0153ud", bundled
    assert cf.load_cluster(tmp / "cafe.toml") == bundled
    # An instance written out for `tangram sim --trace T --cluster C` reads back equal.
    trace, _ = random_instance(RandomParams(family="cpu"), seed=1)
    paths = write_instance(trace, bundled, tmp / "out", "inst")
    assert cf.load_cluster(paths["cluster"]) == bundled
    print("ok")
    """
)


def test_cluster_files_are_utf8_under_a_non_utf8_locale(tmp_path):
    """Under LC_ALL=C without UTF-8 mode, the locale's encoding is ASCII: a bundled cluster
    was read, and an instance's cluster written (``tangram bench robustness --out``), in it,
    so a non-ASCII name or description was a UnicodeDecodeError or UnicodeEncodeError
    traceback (a latin-1 locale wrote a file load_cluster then refused as not UTF-8)."""
    env = {
        **os.environ,
        "LC_ALL": "C",
        "LANG": "C",
        "PYTHONUTF8": "0",
        "PYTHONCOERCECLOCALE": "0",
        "PYTHONPATH": os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")]),
    }
    out = subprocess.run(
        [sys.executable, "-c", SCRIPT, str(tmp_path)],
        capture_output=True,
        text=True,
        encoding="utf-8",
        env=env,
        timeout=300,
    )
    assert out.returncode == 0 and out.stdout.strip() == "ok", out.stderr[-3000:]
