"""Concurrent calls of many services from a thread pool: the budget is never exceeded, no call
fails for memory, in-use replicas are never evicted, results are right, and the accounting
ends consistent (hypothesis property test), plus a stress run of the real example services."""

from __future__ import annotations

import os
import random
import threading
from concurrent.futures import ThreadPoolExecutor

import pytest
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from tangram.exec.eoe.cells import aligned_cells
from tangram.exec.eoe.manager import EoeManager
from tangram.exec.eoe.registry import ServiceSpec
from tangram.exec.eoe.services import example_tokens, reward_model_spec, teacher_spec
from tangram.exec.eoe.testing import (
    BACKEND,
    UNIT,
    Blob,
    checked_call,
    make_config,
    same_bytes,
)

MAX_DEVICES = (
    4 if BACKEND == "cpu" else (torch.cuda.device_count() if torch.cuda.is_available() else 0)
)
pytestmark = pytest.mark.skipif(MAX_DEVICES == 0, reason="TANGRAM_EOE_BACKEND=cuda but no CUDA GPU")


scenario = st.fixed_dictionaries(
    {
        "devices": st.sampled_from([d for d in (1, 2, 4) if d <= max(MAX_DEVICES, 1)]),
        "calls_per_gpu": st.integers(1, 3),
        "budget_units": st.integers(2, 6),
        "sizes": st.lists(st.integers(1, 6), min_size=2, max_size=7),
        "workspace": st.lists(st.integers(0, 1), min_size=7, max_size=7),
        "calls": st.lists(
            st.tuples(st.integers(0, 6), st.sampled_from([1, 1, 2, 4]), st.booleans()),
            min_size=8,
            max_size=30,
        ),
        "threads": st.integers(2, 8),
        "seed": st.integers(0, 1000),
    }
)


@settings(
    max_examples=int(os.environ.get("EOE_PROPERTY_EXAMPLES", "100")),
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow],
)
@given(scenario)
def test_budget_never_exceeded_under_concurrent_calls(s: dict) -> None:
    cfg = make_config(s["devices"], s["budget_units"], calls_per_gpu=s["calls_per_gpu"])
    rng = random.Random(s["seed"])
    residency_log: list[tuple[str, tuple[int, ...], bool]] = []
    log_lock = threading.Lock()

    def record(service: str, gpus: tuple[int, ...], resident: bool) -> None:
        with log_lock:
            residency_log.append((service, gpus, resident))

    manager = EoeManager(cfg, on_residency_change=record)
    try:
        for dev in manager.devices:
            if hasattr(dev, "reset_peak"):
                dev.reset_peak()
        base = [d.allocated_bytes() for d in manager.devices]
        specs = {}
        for i, units in enumerate(s["sizes"]):
            units = min(units, s["budget_units"] - s["workspace"][i])
            units = max(units, 1)
            ws = s["workspace"][i] * UNIT if units + s["workspace"][i] <= s["budget_units"] else 0
            name = f"svc{i}"
            manager.register(
                ServiceSpec(
                    name,
                    factory=lambda units=units, i=i: Blob(units, i),
                    call=checked_call(rng.uniform(0, 0.003)),
                    dops=(1, 2, 4),
                    workspace_bytes=ws,
                )
            )
            specs[name] = units
        x = torch.arange(5, dtype=torch.float32)
        expected = {name: Blob(units, i)(x) for i, (name, units) in enumerate(specs.items())}

        jobs = []
        for svc_index, dop, explicit in s["calls"]:
            name = f"svc{svc_index % len(specs)}"
            dop = min(dop, s["devices"])
            gpus = rng.choice(aligned_cells(s["devices"], dop)) if explicit else None
            jobs.append((name, dop, gpus))

        with ThreadPoolExecutor(s["threads"]) as pool:
            outcomes = list(pool.map(lambda j: manager.call(j[0], x, dop=j[1], gpus=j[2]), jobs))

        for (name, dop, gpus), out in zip(jobs, outcomes, strict=True):
            assert out.ok, out.message
            assert len(out.gpus) == dop and (gpus is None or out.gpus == gpus)
            assert torch.allclose(out.value, expected[name])
        stats = manager.stats()
        assert stats.errors == 0 and stats.unverified_evictions == 0
        for dev, b, ds in zip(manager.devices, base, stats.devices, strict=True):
            assert dev.peak_allocated_bytes() <= dev.budget_bytes
            assert ds.running_calls == 0
            resident_bytes = sum(
                manager.info(n).resident_bytes
                for n, g in manager.residency().items()
                if dev.index in g
            )
            assert ds.claimed_bytes == resident_bytes  # no workspace or eviction left claimed
            assert same_bytes(dev.allocated_bytes() - b, resident_bytes)
        # The callback's view, replayed, matches the manager's residency.
        replay: dict[str, set[int]] = {}
        for service, gpus, resident in residency_log:
            (
                replay.setdefault(service, set()).update
                if resident
                else replay.setdefault(service, set()).difference_update
            )(gpus)
        assert {k: tuple(sorted(v)) for k, v in replay.items() if v} == manager.residency()
    finally:
        manager.close()


def test_stress_real_services_from_a_thread_pool() -> None:
    """Reward models and teachers of two sizes, 4 devices that hold few of them, 6 threads."""
    devices = min(4, MAX_DEVICES)
    manager = EoeManager(make_config(devices, (3 << 20) / UNIT, calls_per_gpu=2))
    try:
        names = []
        for i in range(3):
            # Workspace estimates: on CUDA the activations count against the budget.
            reward = reward_model_spec(
                f"reward{i}", "tiny", seed=i, workspace_bytes=None, seq_hint=20
            )
            teacher = teacher_spec(
                f"teacher{i}", "tiny", seed=10 + i, workspace_bytes=None, seq_hint=20
            )
            names.append(manager.register(reward).name)
            names.append(manager.register(teacher).name)
        tokens = example_tokens(8, 20, seed=3)
        references = {}
        for name in names:
            references[name] = manager.call(name, tokens).unwrap()
        rng = random.Random(7)
        dops = [d for d in (1, 2, 4) if d <= devices]
        jobs = [(rng.choice(names), rng.choice(dops)) for _ in range(60)]
        with ThreadPoolExecutor(6) as pool:
            outcomes = list(pool.map(lambda j: manager.call(j[0], tokens, dop=j[1]), jobs))
        for (name, dop), out in zip(jobs, outcomes, strict=True):
            assert out.ok, out.message
            assert len(out.gpus) == dop
            assert torch.allclose(out.value, references[name], atol=1e-5)
        stats = manager.stats()
        assert stats.evictions > 0 and stats.hits > 0 and stats.misses > 0
        assert all(d.peak_allocated_bytes <= d.budget_bytes for d in stats.devices)
        assert stats.unverified_evictions == 0
    finally:
        manager.close()
