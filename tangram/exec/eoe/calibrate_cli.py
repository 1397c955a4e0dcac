"""``tangram calibrate gpu``: measure a GPU service's call model live and write the record.

    tangram calibrate gpu --example small -o reward.json
    tangram calibrate gpu --model judge=reward:/models/rm -o judge.json
    tangram replay run.jsonl --durations curve --gpu-calibration judge.json

Registers the service on this machine's EOE devices and measures the per-call overhead, the
restore (GB/s and fixed part) and the call time per cell size with 0..N host cores kept busy
(``tangram.exec.eoe.calibrate``). The record names this machine's CPU and GPU nodes as
``tangram serve`` discovers them, so that the simulator applies the host-load slow-down to
calls on that GPU node while CPU actions hold that CPU node's cores.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from typing import Any

from tangram.report import add_json_flag, check_out_file, emit, int_in, path_arg, write_out_file

#: Bounds on the measurement's sizes (each past it ran silently for minutes, or asked the
#: allocator for hundreds of GB, before failing): devices on one node, sequences per call,
#: tokens per sequence, calls per measured point.
DEVICES_MAX = 64
BATCH_MAX = 4096
SEQ_LEN_MAX = 32_768
REPS_MAX = 1000


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser(
        "calibrate",
        help="measure a live executor's costs for the simulator (gpu: a GPU service)",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    what = p.add_subparsers(dest="what", metavar="WHAT", required=True)
    g = what.add_parser("gpu", help="a GPU service's call model (overhead, restore, call time)")
    src = g.add_mutually_exclusive_group(required=True)
    src.add_argument(
        "--model",
        metavar="NAME=KIND[/SHARDS]:PATH",
        help="a Hugging Face model directory, as `tangram serve --model`",
    )
    src.add_argument(
        "--example", metavar="SIZE", help="the example reward model (tiny, small, ...)"
    )
    g.add_argument("--backend", choices=("auto", "cpu", "cuda"), default="auto")
    g.add_argument(
        "--devices",
        type=int_in(1, DEVICES_MAX, "no GPU node has more"),
        default=2,
        help=f"devices to use (default 2, at most {DEVICES_MAX})",
    )
    g.add_argument(
        "--batch",
        type=int_in(1, BATCH_MAX, "one call's inputs must fit a device"),
        default=8,
        help=f"sequences per call (default 8, at most {BATCH_MAX})",
    )
    g.add_argument(
        "--seq-len",
        type=int_in(1, SEQ_LEN_MAX, "longer than the contexts served here"),
        default=64,
        help=f"tokens per sequence (default 64, at most {SEQ_LEN_MAX})",
    )
    g.add_argument(
        "--reps",
        type=int_in(1, REPS_MAX, "a median of more calls moves no further"),
        default=5,
        help=f"calls per measured point (default 5, at most {REPS_MAX})",
    )
    g.add_argument(
        "--busy",
        type=_levels,
        help="host cores kept busy, comma-separated (default 0 up to the host's cores)",
    )
    g.add_argument(  # (an empty path, '.', measured it all before failing: refused here)
        "-o", "--out", type=path_arg, required=True, help="the record (JSON) to write"
    )
    add_json_flag(g)
    g.set_defaults(func=run)


def _levels(text: str) -> list[int]:
    try:
        levels = [int(x) for x in text.split(",") if x.strip()]
    except ValueError:
        raise argparse.ArgumentTypeError(f"--busy {text!r}: expected integers like 0,1,2") from None
    if not levels or any(x < 0 for x in levels):
        raise argparse.ArgumentTypeError(f"--busy {text!r}: expected integers >= 0 like 0,1,2")
    if len(set(levels)) != len(levels):  # (measured twice, then refused by the record)
        raise argparse.ArgumentTypeError(f"--busy {text!r}: each level once, like 0,1,2")
    cores = os.cpu_count() or 1
    if max(levels) > cores:  # the record would say host_cores beside levels it never had
        raise argparse.ArgumentTypeError(
            f"--busy {text!r}: this machine has {cores} cores to keep busy"
        )
    return levels


def _service(args: argparse.Namespace) -> tuple[Any, Any]:
    """(service spec, call inputs) for ``--model`` or ``--example``."""
    import torch

    from tangram.exec.eoe import example_tokens, reward_model_spec
    from tangram.exec.eoe.services import SIZES

    if args.example is not None:
        if args.example not in SIZES:
            raise ValueError(f"--example {args.example!r}: one of {sorted(SIZES)}")
        _check_seq_len(args.seq_len, SIZES[args.example].max_len, f"--example {args.example}")
        spec = reward_model_spec("reward", args.example, dops=(1, 2))
        vocab = SIZES[args.example].vocab
        return spec, example_tokens(args.batch, args.seq_len, vocab)
    from tangram.exec.eoe.hf import service_from_arg

    service = service_from_arg(args.model)
    _check_seq_len(args.seq_len, service.max_len, f"--model {service.spec.name}")
    gen = torch.Generator().manual_seed(0)
    ids = torch.randint(0, service.vocab_size, (args.batch, args.seq_len), generator=gen)
    return service.spec, ids


def _check_seq_len(seq_len: int, max_len: int, model: str) -> None:
    """``ValueError`` naming ``--seq-len`` when it is past the model's positions: each call
    of the calibration then failed, found only once the manager was made and the first
    call ran, as a traceback naming no flag."""
    if seq_len > max_len:
        raise ValueError(
            f"--seq-len {seq_len}: {model} holds at most {max_len} tokens per sequence"
        )


def run(args: argparse.Namespace) -> int:
    # Checked before measuring: a missing directory was found only after the whole
    # calibration, the measurement lost.
    check_out_file("--out", args.out)
    if args.out.suffix == ".toml":  # (``load_gpu_calibration`` reads a .toml file as TOML)
        raise ValueError(
            f"--out {str(args.out)!r}: the record is written as JSON, and a .toml record is "
            "read as TOML (tangram replay --gpu-calibration); give a .json path"
        )
    import torch

    from tangram.exec.eoe import EoeConfig, EoeManager
    from tangram.exec.eoe.calibrate import calibrate_gpu
    from tangram.exec.runtime import discover_cluster

    torch.set_num_threads(1)  # as the live runtime's CPU-backed devices run
    spec, inputs = _service(args)
    cluster, _ = discover_cluster()
    try:
        manager = EoeManager(EoeConfig(backend=args.backend, devices=args.devices))
    except RuntimeError as exc:  # e.g. --backend cuda where torch sees no CUDA GPU
        raise ValueError(f"--backend {args.backend}: {exc}") from None
    with manager:
        manager.register(spec)
        # A CPU-backed device computes on the host's cores: name the nodes that share them.
        shared = manager.backend == "cpu" and bool(cluster.gpu_nodes)
        try:
            record = calibrate_gpu(
                manager,
                spec.name,
                inputs,
                busy_levels=args.busy,
                reps=args.reps,
                host_cpu_node=cluster.cpu_nodes[0].name if shared else None,
                gpu_node=cluster.gpu_nodes[0].name if shared else None,
            )
        except RuntimeError as exc:  # a measurement that failed (the call's own error), not input
            print(f"tangram calibrate gpu: {exc}; no record written", file=sys.stderr)
            return 1
    write_out_file("--out", args.out, json.dumps(record.to_dict(), indent=2) + "\n")
    emit(
        args.json,
        record.to_dict(),
        {
            f"{spec.name}: wrote {args.out}": [
                {
                    "dop": p.dop,
                    "busy cores": p.busy_cores,
                    "call (s)": p.seconds,
                    "slow-down": record.slowdown(p.dop, p.busy_cores),
                }
                for p in record.call_times
            ],
            "overhead and restore": [
                {
                    "call overhead (s)": record.call_overhead_s,
                    "restore GB/s": record.restore_gbps,
                    "restore fixed (s)": record.restore_fixed_s,
                }
            ],
        },
    )
    return 0
