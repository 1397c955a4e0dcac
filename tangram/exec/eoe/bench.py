"""``tangram bench eoe``: what EOE costs, per model size.

For each size of the example reward model it measures, through a real ``EoeManager``:

- the plain copy of the service's host backup into a preallocated device buffer (the limit a
  restore can reach: on CUDA a pinned host-to-device copy), and the same copy into a freshly
  allocated buffer;
- restore time and bandwidth (a call that misses: allocation, one non-blocking copy of the
  whole backup, rebuilding the module), as a share of the plain copy's bandwidth;
- eviction time (dropping the replica and checking the allocator's figure fell);
- call latency on a hit (resident) and on a miss (evicted first), and the execution alone.

It also serves Hugging Face model directories (``bench_hf``): a teacher saved from a config,
loaded with ``from_pretrained``, restored and called whole on one GPU and split by layers over a
cell of ``--shards`` GPUs (bytes per GPU, restore and hit/miss latency, identical outputs).

On CPU the "device" is host memory: the copies are memcpy, so the figures show the executor's
overheads, not PCIe. Torch is imported only when the benchmark runs.
"""

from __future__ import annotations

import argparse
import statistics
import time
from collections.abc import Iterable
from dataclasses import asdict, dataclass
from typing import Any

from tangram.core.cells import CELL_SIZES
from tangram.exec.eoe.calibrate_cli import BATCH_MAX, REPS_MAX
from tangram.exec.eoe.hf_tiny import HF_SHAPES
from tangram.report import add_json_flag, emit, int_in, positive_int

DEFAULT_SIZES_CPU = ("tiny", "small", "medium", "large")
DEFAULT_SIZES_CUDA = ("small", "medium", "large", "xl-bf16")
MIB = 1 << 20


@dataclass(frozen=True)
class BenchConfig:
    """What to measure: sizes, repetitions, the request shape and the devices."""

    sizes: tuple[str, ...] | None = None
    reps: int = 5
    batch: int = 8
    seq_len: int = 128
    dop: int = 1
    backend: str = "auto"
    #: Directory-loaded models (``hf_tiny.HF_SHAPES`` names); None: the backend's defaults.
    models: tuple[str, ...] | None = None
    #: GPUs of the cell the models are split over.
    shards: int = 2


@dataclass(frozen=True)
class SizeFigures:
    """The figures of one model size (seconds, bytes, GB/s = 1e9 bytes/s)."""

    size: str
    params: int
    replica_bytes: int
    build_s: float
    copy_s: float
    copy_gbps: float
    alloc_copy_s: float
    alloc_copy_gbps: float
    restore_s: float
    restore_gbps: float
    restore_pct_of_copy: float
    evict_s: float
    hit_s: float
    miss_s: float
    exec_s: float
    restore_s_all: tuple[float, ...]
    copy_s_all: tuple[float, ...]


def register(subparsers: argparse._SubParsersAction) -> None:
    parser = subparsers.add_parser(
        "eoe",
        help="EOE GPU executor: restore vs plain copy bandwidth, eviction, hit/miss latency",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument(
        "--sizes",
        help="comma-separated model sizes (tiny, small, medium, large, xl, xl-bf16); default "
        f"{','.join(DEFAULT_SIZES_CPU)} on CPU, {','.join(DEFAULT_SIZES_CUDA)} on CUDA",
    )
    # Bounded as `tangram calibrate gpu` bounds them: --batch 10**9 set out to make hundreds
    # of GB of tokens, --reps 10**9 ran for days, each without a word.
    parser.add_argument(
        "--reps",
        type=int_in(1, REPS_MAX, "a median of more calls moves no further"),
        default=5,
        help=f"measured repetitions per figure (at most {REPS_MAX})",
    )
    parser.add_argument(
        "--batch",
        type=int_in(1, BATCH_MAX, "one call's inputs must fit a device"),
        default=8,
        help=f"sequences per call (at most {BATCH_MAX})",
    )
    parser.add_argument(
        "--seq-len",
        type=positive_int,
        default=128,
        help="tokens per sequence (at most the sizes' max_len, 256)",
    )
    parser.add_argument("--dop", type=int, default=1, choices=CELL_SIZES, help="DoP of the calls")
    parser.add_argument("--backend", default="auto", choices=("auto", "cpu", "cuda"))
    parser.add_argument(
        "--models",
        help="comma-separated directory-loaded models (hf-tiny, hf-small, hf-medium) or 'none'; "
        "default hf-tiny,hf-small on CPU, hf-small,hf-medium on CUDA",
    )
    parser.add_argument(
        "--shards", type=int, default=2, choices=CELL_SIZES[1:], help="GPUs to split models over"
    )
    add_json_flag(parser)
    parser.set_defaults(func=main)


def main(args: argparse.Namespace) -> int:
    if args.reps < 1:
        raise SystemExit("--reps must be >= 1")
    config = BenchConfig(
        sizes=tuple(s.strip() for s in args.sizes.split(",") if s.strip()) if args.sizes else None,
        reps=args.reps,
        batch=args.batch,
        seq_len=args.seq_len,
        dop=args.dop,
        backend=args.backend,
        models=_names(args.models, HF_SHAPES),
        shards=args.shards,
    )
    document = run(config)
    rows = [
        {
            "size": f["size"],
            "MiB": f["replica_bytes"] / MIB,
            "copy GB/s": f["copy_gbps"],
            "alloc+copy GB/s": f["alloc_copy_gbps"],
            "restore GB/s": f["restore_gbps"],
            "restore % of copy": f["restore_pct_of_copy"],
            "restore ms": f["restore_s"] * 1e3,
            "evict ms": f["evict_s"] * 1e3,
            "hit ms": f["hit_s"] * 1e3,
            "miss ms": f["miss_s"] * 1e3,
            "exec ms": f["exec_s"] * 1e3,
        }
        for f in document["sizes"]
    ]
    setup = [{k: v for k, v in document.items() if k not in ("sizes", "note")}]
    from tangram.exec.eoe.bench_hf import table

    setup = [{k: v for k, v in setup[0].items() if k != "models"}]
    tables = {"EOE benchmark (medians)": rows, "setup": setup}
    if document["models"]:
        tables["model directories, whole and split by layers (medians)"] = table(document["models"])
    emit(args.json, document, tables)
    if not args.json:
        print(f"\n{document['note']}")
    return 0


def _names(
    text: str | None, known: Iterable[str] = (), flag: str = "--models"
) -> tuple[str, ...] | None:
    """A comma-separated list of names ('none': empty; None: the defaults); a name not in
    ``known`` (when given) is a ``ValueError`` naming the flag and the known names."""
    if text is None:
        return None
    if text.strip() == "none":
        return ()
    names = tuple(s.strip() for s in text.split(",") if s.strip())
    known = sorted(known)
    unknown = [n for n in names if known and n not in known]
    if unknown:
        raise ValueError(f"{flag}: unknown {unknown}; known: {known} (or 'none')")
    return names


def _median(values: list[float]) -> float:
    return statistics.median(values) if values else float("nan")


def _timed_copy(dst: Any, src: Any, device: Any) -> float:
    t0 = time.perf_counter()
    with device.context():
        dst.copy_(src, non_blocking=True)
    device.synchronize()
    return time.perf_counter() - t0


def _measure_size(size: str, config: BenchConfig, backend: str) -> SizeFigures:
    import torch

    from tangram.exec.eoe.config import EoeConfig
    from tangram.exec.eoe.manager import EoeManager
    from tangram.exec.eoe.services import example_tokens, reward_model_spec, size_of

    shape = size_of(size)
    budget = None
    if backend == "cpu":
        budget = 2 * shape.approx_bytes + 64 * MIB
    manager = EoeManager(EoeConfig(backend=backend, devices=config.dop, device_memory_bytes=budget))
    try:
        name = f"reward-{size}"
        info = manager.register(reward_model_spec(name, shape))
        backup = manager._services[name].backup  # the very bytes a restore copies
        device = manager.devices[0]
        tokens = example_tokens(config.batch * config.dop, config.seq_len, shape.vocab)

        # The limit: one copy of the backup into a preallocated device buffer.
        dst = torch.empty(backup.nbytes, dtype=torch.uint8, device=device.torch_device)
        _timed_copy(dst, backup.buffer, device)  # warm-up
        copies = [_timed_copy(dst, backup.buffer, device) for _ in range(config.reps)]
        del dst
        fresh = []
        for _ in range(config.reps):
            t0 = time.perf_counter()
            buf = torch.empty(backup.nbytes, dtype=torch.uint8, device=device.torch_device)
            with device.context():
                buf.copy_(backup.buffer, non_blocking=True)
            device.synchronize()
            fresh.append(time.perf_counter() - t0)
            del buf

        restores, evicts, misses, hits, execs = [], [], [], [], []
        for rep in range(config.reps + 1):  # the first round warms up (allocator, caches)
            if manager.residency().get(name):
                evicted = manager.evict(name)
                if rep:
                    evicts.append(evicted.evict_s)
            miss = manager.call(name, tokens, dop=config.dop)
            miss.unwrap()
            hit = manager.call(name, tokens, dop=config.dop)
            hit.unwrap()
            if miss.hit or not hit.hit:
                raise RuntimeError(f"{size}: expected a miss then a hit, got {miss.hit}, {hit.hit}")
            if rep:
                restores.append(miss.restore_s)
                misses.append(miss.total_s)
                hits.append(hit.total_s)
                execs.append(hit.exec_s)
        if manager.stats().unverified_evictions:
            raise RuntimeError(f"{size}: an eviction did not free the allocator's memory")
        # A restore at DoP k copies k replicas; bandwidth is bytes moved per second.
        moved = backup.nbytes * config.dop
        copy_s, restore_s, fresh_s = _median(copies), _median(restores), _median(fresh)
        copy_gbps = backup.nbytes / copy_s / 1e9
        restore_gbps = moved / restore_s / 1e9
        return SizeFigures(
            size=size,
            params=info.weight_bytes // (4 if shape.dtype == "float32" else 2),
            replica_bytes=backup.nbytes,
            build_s=info.build_s,
            copy_s=copy_s,
            copy_gbps=copy_gbps,
            alloc_copy_s=fresh_s,
            alloc_copy_gbps=backup.nbytes / fresh_s / 1e9,
            restore_s=restore_s,
            restore_gbps=restore_gbps,
            restore_pct_of_copy=100.0 * restore_gbps / copy_gbps,
            evict_s=_median(evicts),
            hit_s=_median(hits),
            miss_s=_median(misses),
            exec_s=_median(execs),
            restore_s_all=tuple(restores),
            copy_s_all=tuple(copies),
        )
    finally:
        manager.close()


def _check_sizes(sizes: tuple[str, ...], seq_len: int) -> None:
    """``ValueError`` naming the flag, before anything is measured, for a size not in
    ``SIZES`` or a ``seq_len`` past a size's ``max_len``: each was found as its size came
    to be measured, after the sizes before it (their figures lost), and a long sequence
    only once the size's copies were measured, as a traceback from the service's call."""
    from tangram.exec.eoe.services import SIZES

    unknown = [s for s in sizes if s not in SIZES]
    if unknown:
        raise ValueError(
            f"--sizes {','.join(sizes)!r}: unknown size {unknown[0]!r}; known: {', '.join(SIZES)}"
        )
    short = [s for s in sizes if seq_len > SIZES[s].max_len]
    if short:
        raise ValueError(
            f"--seq-len {seq_len}: size {short[0]!r} holds at most {SIZES[short[0]].max_len} "
            "tokens per sequence"
        )


def run(config: BenchConfig) -> dict[str, Any]:
    """Measure every size; a JSON-ready document."""
    import torch

    from tangram.exec.eoe.config import EoeConfig
    from tangram.exec.eoe.devices import nvml_gpus, resolve_backend

    backend = resolve_backend(EoeConfig(backend=config.backend))
    sizes = config.sizes or (DEFAULT_SIZES_CUDA if backend == "cuda" else DEFAULT_SIZES_CPU)
    _check_sizes(sizes, config.seq_len)
    figures = [asdict(_measure_size(size, config, backend)) for size in sizes]
    from tangram.exec.eoe.bench_hf import DEFAULT_MODELS_CPU, DEFAULT_MODELS_CUDA, measure_model

    models = config.models
    if models is None:
        models = DEFAULT_MODELS_CUDA if backend == "cuda" else DEFAULT_MODELS_CPU
    shards = config.shards
    if backend == "cuda":  # a split cell needs that many GPUs: with fewer, the whole model only
        shards = min(shards, max(1, torch.cuda.device_count()))
    model_figures = [
        asdict(
            measure_model(
                m,
                shards=shards,
                reps=config.reps,
                batch=config.batch,
                seq_len=config.seq_len,
                backend=backend,
            )
        )
        for m in models
    ]
    if backend == "cuda":
        device_name = torch.cuda.get_device_name(0)
        note = (
            "CUDA: 'copy' is a pinned host-to-device copy of the backup's bytes into a "
            "preallocated buffer (the limit); a restore adds allocation and rebuilding the "
            "module (overlapped with the copy). Target: restore >= 80% of copy bandwidth."
        )
    else:
        device_name = "cpu (logical devices in host memory)"
        note = (
            "CPU mode: every 'device' is host memory, so 'copy' is a memcpy between two host "
            "buffers and a restore is malloc + memcpy + rebuilding the module; first touch of "
            "freshly allocated pages (see 'alloc+copy') costs most of the gap. These figures "
            "test the executor's logic and overheads, not a GPU link; run "
            "experiments/gpu_eoe_check.sh on a GPU machine for the real costs."
        )
    return {
        "benchmark": "eoe",
        "backend": backend,
        "device": device_name,
        "torch": torch.__version__,
        "nvml_gpus": len(nvml_gpus()),
        "reps": config.reps,
        "batch": config.batch,
        "seq_len": config.seq_len,
        "dop": config.dop,
        "threads": torch.get_num_threads(),
        "note": note,
        "sizes": figures,
        "shards": shards,
        "models": model_figures,
    }
