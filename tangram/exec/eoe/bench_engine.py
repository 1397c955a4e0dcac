"""Restore bandwidth of the engine backend against a plain pinned copy of the same bytes.

    python -m tangram.exec.eoe.bench_engine [--model hf-medium] [--engines module,vllm] [--reps 5]

An engine service is restored by its own wake-up (``engine.py``): ``module`` is
``ModuleEngine`` (weights back from pinned host memory, tensor by tensor), ``vllm`` is vLLM's
``LLM.wake_up()`` after ``sleep(level=1)`` (needs CUDA and vLLM). Each restore is a miss
through a real ``EoeManager`` (evict = sleep, call = wake + run); its bandwidth is the weight
bytes over the restore time, set against one pinned host-to-device copy of as many bytes
(the goal: >= 80%). On CPU the "copy" is a memcpy and the figures only check the plumbing.
"""

from __future__ import annotations

import argparse
import json
import statistics
import tempfile
import time
from pathlib import Path
from typing import Any

from tangram.exec.eoe.calibrate_cli import REPS_MAX
from tangram.report import int_in

MIB = 1 << 20
#: The engines measured: ``ModuleEngine`` and vLLM's.
ENGINES = ("module", "vllm")


def plain_copy_s(nbytes: int, device: str, reps: int) -> float:
    """Median seconds of one (pinned, on CUDA) host-to-device copy of ``nbytes``."""
    import torch

    cuda = device.startswith("cuda")
    src = torch.empty(nbytes, dtype=torch.uint8, pin_memory=cuda)
    dst = torch.empty(nbytes, dtype=torch.uint8, device=device)
    times = []
    for _ in range(reps + 1):
        t0 = time.perf_counter()
        dst.copy_(src, non_blocking=True)
        if cuda:
            torch.cuda.synchronize()
        times.append(time.perf_counter() - t0)
    return statistics.median(times[1:])


def _factory(kind: str, path: Path, device: str) -> Any:
    from tangram.exec.eoe.engine import ModuleEngine, VllmEngine
    from tangram.exec.eoe.hf import load_model, teacher_logprobs

    if kind == "module":
        return lambda: ModuleEngine(load_model(path, "teacher"), device, teacher_logprobs)
    return lambda: VllmEngine(str(path), dtype="float32", gpu_memory_utilization=0.3)


def measure(kind: str, path: Path, backend: str, reps: int) -> dict[str, Any]:
    """Misses of an engine service: restore seconds and bandwidth vs a plain copy."""
    import torch

    from tangram.exec.eoe.config import EoeConfig
    from tangram.exec.eoe.engine import engine_spec
    from tangram.exec.eoe.manager import EoeManager

    device = "cuda:0" if backend == "cuda" else "cpu"
    budget = None if backend == "cuda" else 1 << 32
    ids = torch.randint(4, 60, (4, 32), generator=torch.Generator().manual_seed(0))
    inputs = {"prompt_token_ids": ids.tolist()} if kind == "vllm" else ids
    with EoeManager(EoeConfig(backend=backend, devices=1, device_memory_bytes=budget)) as m:
        claim = (1 << 30) if backend == "cpu" else int(0.4 * torch.cuda.mem_get_info()[1])
        info = m.register(
            engine_spec("e", _factory(kind, path, device), home=0, memory_bytes=claim)
        )
        restores = []
        for rep in range(reps + 1):
            m.evict("e")
            out = m.call("e", inputs)
            out.unwrap()
            if rep:
                restores.append(out.restore_s)
    nbytes = info.weight_bytes
    restore_s = statistics.median(restores)
    copy_s = plain_copy_s(nbytes, device, reps)
    return {
        "engine": kind,
        "weight_bytes": nbytes,
        "restore_s": restore_s,
        "restore_gbps": nbytes / restore_s / 1e9,
        "copy_s": copy_s,
        "copy_gbps": nbytes / copy_s / 1e9,
        "restore_pct_of_copy": 100.0 * copy_s / restore_s,
        "restore_s_all": restores,
    }


def main(argv: list[str] | None = None) -> int:
    import importlib.util

    import torch

    from tangram.exec.eoe.hf_tiny import HF_SHAPES, save_model_dir

    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--model", default="hf-medium", help="an hf_tiny.HF_SHAPES name")
    p.add_argument("--engines", default="module,vllm", help=f"comma-separated, of {ENGINES}")
    # (--reps 0 failed after the whole run as statistics' "no median for empty data")
    p.add_argument(  # (bounded as in `tangram calibrate gpu`: 10**9 ran for days)
        "--reps",
        type=int_in(1, REPS_MAX, "a median of more calls moves no further"),
        default=5,
        help=f"measured misses (1 to {REPS_MAX})",
    )
    p.add_argument("--backend", default="auto", choices=("auto", "cpu", "cuda"))
    args = p.parse_args(argv)
    kinds = [k.strip() for k in args.engines.split(",") if k.strip()]
    unknown = [k for k in kinds if k not in ENGINES]
    if unknown or not kinds:  # (any other name was run as vLLM: an ImportError on CPU)
        p.error(f"--engines {args.engines!r}: each of {ENGINES}, comma-separated")
    if args.model not in HF_SHAPES:  # (was a bare KeyError once the run began)
        p.error(f"--model {args.model!r}: one of {sorted(HF_SHAPES)}")
    backend = args.backend
    if backend == "auto":
        backend = "cuda" if torch.cuda.is_available() else "cpu"
    rows, skipped = [], {}
    with tempfile.TemporaryDirectory(prefix="tangram-engine-") as tmp:
        path = save_model_dir(Path(tmp) / args.model, "teacher", args.model)
        for kind in kinds:
            if kind == "vllm" and (backend != "cuda" or importlib.util.find_spec("vllm") is None):
                skipped[kind] = "needs CUDA and vLLM"
                continue
            rows.append(measure(kind, path, backend, args.reps))
    print(
        json.dumps({"backend": backend, "model": args.model, "engines": rows, "skipped": skipped})
    )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
