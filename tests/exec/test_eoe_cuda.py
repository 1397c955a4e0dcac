"""Checks that need a CUDA GPU (skipped here): pinned backups, real frees seen by
torch.cuda.memory_allocated, a real torch.cuda.OutOfMemoryError caught during restore, and
restore bandwidth against a plain pinned copy. Run by experiments/gpu_eoe_check.sh."""

from __future__ import annotations

import pytest
import torch

from tangram.exec.eoe.config import EoeConfig
from tangram.exec.eoe.devices import nvml_gpus
from tangram.exec.eoe.errors import RestoreOutOfMemoryError
from tangram.exec.eoe.manager import EoeManager
from tangram.exec.eoe.services import example_tokens, reward_model_spec, teacher_spec

pytestmark = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")

MIB = 1 << 20


def test_nvml_sees_the_gpus_and_budget_defaults_to_a_fraction() -> None:
    assert len(nvml_gpus()) >= torch.cuda.device_count()
    with EoeManager(EoeConfig(backend="cuda", devices=1, memory_fraction=0.5)) as m:
        fig = m.stats().devices[0]
        assert fig.backend == "cuda" and fig.nvml_total_bytes is not None
        assert abs(fig.budget_bytes - 0.5 * fig.nvml_total_bytes) < MIB


def test_pinned_backup_restore_is_exact_and_eviction_frees_cuda_memory() -> None:
    with EoeManager(EoeConfig(backend="cuda", devices=1)) as m:
        info = m.register(teacher_spec("t", "small"))
        assert info.pinned and m._services["t"].backup.buffer.is_pinned()
        tokens = example_tokens(4, 64, vocab=4096)
        first = m.call("t", tokens).unwrap()
        before = torch.cuda.memory_allocated(0)
        freed = m.evict("t")
        after = torch.cuda.memory_allocated(0)
        assert before - after >= info.replica_bytes == freed.bytes_freed
        again = m.call("t", tokens)
        assert again.ok and not again.hit and torch.equal(again.value, first)
        assert m.stats().unverified_evictions == 0


def test_real_cuda_oom_during_restore_is_an_error_for_that_call() -> None:
    free, total = torch.cuda.mem_get_info(0)
    with EoeManager(EoeConfig(backend="cuda", devices=1, device_memory_bytes=total)) as m:
        m.register(reward_model_spec("r", "medium"))
        m.register(reward_model_spec("tiny", "tiny"))
        # Fill the GPU outside the manager's view of the allocator's figure.
        hog = torch.empty(int(free - 64 * MIB), dtype=torch.uint8, device="cuda:0")
        try:
            m._live[0] = torch.cuda.memory_allocated(0)  # pretend the hog is ours: plan ignores it
            out = m.call("r", example_tokens(2, 16, vocab=8192))
            assert isinstance(out.error, RestoreOutOfMemoryError), out.message
            m._live[0] = 0
        finally:
            del hog
            torch.cuda.empty_cache()
        assert m.call("tiny", example_tokens(2, 16)).ok
        assert m.call("r", example_tokens(2, 16, vocab=8192)).ok


def test_restore_reaches_most_of_the_plain_copy_bandwidth() -> None:
    from tangram.exec.eoe.bench import BenchConfig, run

    doc = run(BenchConfig(sizes=("large",), reps=3, backend="cuda"))
    (fig,) = doc["sizes"]
    assert fig["restore_pct_of_copy"] >= 80, fig
