"""``tangram bench eoe``'s directory-loaded models: a Llama-style teacher saved to a temporary
directory (``hf_tiny``), loaded back with ``from_pretrained``, and called whole on one GPU and
split by layers over a cell of ``shards`` GPUs.

Per model: the load (from_pretrained + host backup), the bytes each GPU holds whole and split,
restore (a miss) and hit latencies both ways, and whether the split cell's log-probs are
identical to one GPU's. Torch and transformers are imported only when it runs.
"""

from __future__ import annotations

import statistics
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

DEFAULT_MODELS_CPU = ("hf-tiny", "hf-small")
DEFAULT_MODELS_CUDA = ("hf-small", "hf-medium")
MIB = 1 << 20


@dataclass(frozen=True)
class ModelFigures:
    """One directory-loaded model, whole and split (seconds, bytes)."""

    model: str
    shards: int
    load_s: float
    replica_bytes: int
    #: The most bytes one GPU of the split cell holds (its largest shard).
    shard_bytes: int
    restore_s: float
    hit_s: float
    miss_s: float
    shard_restore_s: float
    shard_hit_s: float
    shard_miss_s: float
    #: The split cell's log-probs equal one GPU's, bit for bit.
    identical: bool


def _median(values: list[float]) -> float:
    return statistics.median(values) if values else float("nan")


def _miss_then_hit(manager: Any, name: str, inputs: Any, gpus: tuple[int, ...]) -> tuple:
    """Evict ``name``, call it twice on ``gpus``: (the miss, the hit)."""
    if manager.residency().get(name):
        manager.evict(name)
    miss = manager.call(name, inputs, gpus=gpus)
    miss.unwrap()
    hit = manager.call(name, inputs, gpus=gpus)
    hit.unwrap()
    if miss.hit or not hit.hit:
        raise RuntimeError(f"{name}: expected a miss then a hit, got {miss.hit}, {hit.hit}")
    return miss, hit


def measure_model(
    model: str, *, shards: int, reps: int, batch: int, seq_len: int, backend: str
) -> ModelFigures:
    """Save ``model`` (an ``HF_SHAPES`` name), serve it whole and in ``shards``, measure."""
    import torch

    from tangram.exec.eoe.config import EoeConfig
    from tangram.exec.eoe.hf import hf_service
    from tangram.exec.eoe.hf_tiny import HF_SHAPES, save_model_dir
    from tangram.exec.eoe.manager import EoeManager

    shape = HF_SHAPES[model]
    seq_len = min(seq_len, shape.max_len)
    with tempfile.TemporaryDirectory(prefix="tangram-bench-hf-") as tmp:
        path = save_model_dir(Path(tmp) / model, "teacher", shape)
        whole = hf_service("whole", path, "teacher", dops=(1,))
        split = hf_service("split", path, "teacher", shards=shards)
        params = sum(p.numel() for p in _meta_model(path).parameters())
        budget = 3 * 4 * params + 64 * MIB if backend == "cpu" else None
        config = EoeConfig(backend=backend, devices=shards, device_memory_bytes=budget)
        with EoeManager(config) as manager:
            t0 = time.perf_counter()
            info = manager.register(whole.spec)
            load_s = time.perf_counter() - t0
            split_info = manager.register(split.spec)
            gen = torch.Generator().manual_seed(0)
            ids = torch.randint(4, shape.vocab, (batch, seq_len), generator=gen)
            inputs = {"input_ids": ids, "attention_mask": torch.ones_like(ids)}
            cell = tuple(range(shards))
            rows: dict[str, list[float]] = {k: [] for k in ("r", "h", "m", "sr", "sh", "sm")}
            identical = True
            for rep in range(reps + 1):  # the first round warms up
                miss, hit = _miss_then_hit(manager, "whole", inputs, (0,))
                manager.evict("whole")  # room for the split cell on GPU 0
                smiss, shit = _miss_then_hit(manager, "split", inputs, cell)
                manager.evict("split")
                identical &= torch.equal(hit.value["token_logprobs"], shit.value["token_logprobs"])
                if rep:
                    for key, value in zip(
                        rows,
                        (miss.restore_s, hit.total_s, miss.total_s)
                        + (smiss.restore_s, shit.total_s, smiss.total_s),
                        strict=True,
                    ):
                        rows[key].append(value)
            if manager.stats().unverified_evictions:
                raise RuntimeError(f"{model}: an eviction did not free the allocator's memory")
    m = {k: _median(v) for k, v in rows.items()}
    return ModelFigures(
        model=model,
        shards=shards,
        load_s=load_s,
        replica_bytes=info.replica_bytes,
        shard_bytes=split_info.resident_bytes,
        restore_s=m["r"],
        hit_s=m["h"],
        miss_s=m["m"],
        shard_restore_s=m["sr"],
        shard_hit_s=m["sh"],
        shard_miss_s=m["sm"],
        identical=identical,
    )


def _meta_model(path: Path) -> Any:
    """The model's structure without weights (to count its parameters)."""
    import torch
    from transformers import AutoConfig, AutoModelForCausalLM

    config = AutoConfig.from_pretrained(str(path), local_files_only=True)
    with torch.device("meta"):
        return AutoModelForCausalLM.from_config(config)


def table(figures: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """The rows ``tangram bench eoe`` prints for the models."""
    return [
        {
            "model": f["model"],
            "MiB": f["replica_bytes"] / MIB,
            "load s": f["load_s"],
            "restore ms": f["restore_s"] * 1e3,
            "hit ms": f["hit_s"] * 1e3,
            "miss ms": f["miss_s"] * 1e3,
            "shards": f["shards"],
            "MiB/GPU split": f["shard_bytes"] / MIB,
            "split restore ms": f["shard_restore_s"] * 1e3,
            "split hit ms": f["shard_hit_s"] * 1e3,
            "split miss ms": f["shard_miss_s"] * 1e3,
            "identical": f["identical"],
        }
        for f in figures
    ]
