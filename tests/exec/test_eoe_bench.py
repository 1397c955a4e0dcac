"""``tangram bench eoe``: the CLI wiring, the JSON document, and no torch import before it runs."""

from __future__ import annotations

import argparse
import json
import subprocess
import sys

from tangram.cli import main


def test_bench_eoe_json_has_every_figure(capsys) -> None:
    code = main(
        [
            "bench",
            "eoe",
            "--sizes",
            "tiny",
            "--reps",
            "2",
            "--batch",
            "2",
            "--seq-len",
            "16",
            "--models",
            "hf-tiny",
            "--json",
        ]
    )
    assert code == 0
    doc = json.loads(capsys.readouterr().out)
    assert doc["benchmark"] == "eoe" and doc["backend"] in ("cpu", "cuda") and doc["reps"] == 2
    (fig,) = doc["sizes"]
    assert fig["size"] == "tiny" and fig["replica_bytes"] > 500_000
    for key in ("copy_s", "alloc_copy_s", "restore_s", "evict_s", "hit_s", "miss_s", "exec_s"):
        assert fig[key] > 0, key
    assert fig["restore_gbps"] > 0 and fig["restore_pct_of_copy"] > 0
    assert len(fig["restore_s_all"]) == 2 and len(fig["copy_s_all"]) == 2
    assert fig["miss_s"] >= fig["restore_s"]  # a miss includes its restore
    (model,) = doc["models"]
    assert model["model"] == "hf-tiny" and model["shards"] == doc["shards"] == 2
    assert model["identical"] is True  # the split cell's log-probs equal one GPU's
    # each GPU of the split cell holds about half of the replica
    assert 0.35 * model["replica_bytes"] < model["shard_bytes"] < 0.65 * model["replica_bytes"]
    for key in ("restore_s", "hit_s", "miss_s", "shard_restore_s", "shard_hit_s", "load_s"):
        assert model[key] > 0, key
    assert model["shard_miss_s"] >= model["shard_restore_s"]


def test_bench_eoe_table(capsys) -> None:
    assert (
        main(
            [
                "bench",
                "eoe",
                "--sizes",
                "tiny",
                "--reps",
                "1",
                "--batch",
                "2",
                "--seq-len",
                "8",
                "--dop",
                "2",
                "--backend",
                "cpu",
                "--models",
                "none",
            ]
        )
        == 0
    )
    out = capsys.readouterr().out
    assert "EOE benchmark (medians)" in out and "restore % of copy" in out and "CPU mode" in out
    assert "split by layers" not in out  # --models none


def test_importing_the_package_and_bench_parser_needs_no_torch() -> None:
    code = (
        "import sys, argparse\n"
        "sys.modules['torch'] = None  # any import of torch now fails\n"
        "import tangram.exec.eoe as eoe\n"
        "from tangram.exec.eoe import bench, cells, config\n"
        "p = argparse.ArgumentParser(); sub = p.add_subparsers()\n"
        "bench.register(sub)\n"
        "args = p.parse_args(['eoe', '--sizes', 'tiny', '--json'])\n"
        "assert args.func is bench.main and args.json\n"
        "assert eoe.EoeConfig(backend='cpu').devices is None\n"
        "assert eoe.aligned_cells(4, 2) == ((0, 1), (2, 3))\n"
        "print('ok')\n"
    )
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "ok"


def test_register_adds_the_eoe_parser() -> None:
    from tangram.exec.eoe import bench

    parser = argparse.ArgumentParser()
    bench.register(parser.add_subparsers())
    args = parser.parse_args(["eoe"])
    assert args.reps == 5 and args.dop == 1 and args.backend == "auto" and not args.json


def _bench_refused(monkeypatch, capsys, *flags: str) -> str:
    """Run ``tangram bench eoe`` with ``flags``, no model measured: what it says on stderr
    (it must refuse, measuring nothing)."""
    from tangram.exec.eoe import bench

    measured: list[str] = []
    monkeypatch.setattr(bench, "_measure_size", lambda size, *a: measured.append(size))
    code = main(["bench", "eoe", *flags, "--models", "none", "--reps", "1", "--batch", "1"])
    assert code == 2 and measured == [], measured
    return capsys.readouterr().err


def test_bench_eoe_refuses_a_seq_len_past_a_sizes_max_len_before_measuring(
    monkeypatch, capsys
) -> None:
    """--seq-len 300 (the example models hold 256 positions) measured the size's copies,
    then every call failed: a traceback ending in the service's CallFailedError ('sequence
    length 300 exceeds the model's max_len 256'), naming no flag. Refused first now."""
    err = _bench_refused(monkeypatch, capsys, "--sizes", "tiny", "--seq-len", "300")
    assert "--seq-len 300" in err and "256" in err and "tiny" in err, err


def test_bench_eoe_refuses_an_unknown_size_before_measuring_the_others(monkeypatch, capsys) -> None:
    """--sizes tiny,bogus measured tiny, then failed on bogus (its figures lost), and the
    message named no flag. Every size is checked first now, the refusal naming --sizes."""
    err = _bench_refused(monkeypatch, capsys, "--sizes", "tiny,bogus")
    assert "--sizes" in err and "'bogus'" in err and "tiny" in err, err


def test_bench_eoe_refuses_a_batch_or_reps_past_the_calibration_s_limits(capsys) -> None:
    """--batch and --reps took any positive int (--batch 10**9 set out to make 10**9
    sequences of tokens, hundreds of GB; --reps 10**9 ran for days); `tangram calibrate
    gpu` stops them at 4,096 and 1,000. The same limits here, refused by the parser naming
    the flag, before anything is measured."""
    import pytest

    for flag, value in (("--batch", "4097"), ("--reps", "1001")):
        with pytest.raises(SystemExit) as exit_:
            main(["bench", "eoe", "--sizes", "tiny", "--models", "none", flag, value])
        assert exit_.value.code == 2
        assert flag in capsys.readouterr().err
