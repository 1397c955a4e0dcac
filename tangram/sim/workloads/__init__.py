"""Workload generators for the paper's three agentic-RL workloads, behind one registry.

``WORKLOADS`` maps a name to a :class:`Workload` (callable: ``WORKLOADS[name](params, batch=,
steps=, seed=)``); :func:`generate` builds the parameters from keyword overrides. Every
distribution is a named, documented field of the workload's parameter dataclass, with its
source; ``docs/workloads.md`` tabulates them.
"""

from __future__ import annotations

from typing import Any

from tangram.sim.workloads.base import Workload
from tangram.sim.workloads.coding import CodingParams, generate_coding
from tangram.sim.workloads.deepsearch import DeepSearchParams, generate_deepsearch
from tangram.sim.workloads.mopd import MopdParams, TeacherSpec, generate_mopd
from tangram.sim.workloads.random_instances import RandomParams, generate_random, instance_batch
from tangram.sim.workloads.stats import summarize
from tangram.trace import Trace

WORKLOADS: dict[str, Workload] = {
    "coding": Workload(
        "coding",
        CodingParams,
        1280,
        generate_coding,
        "AI coding: CPU sandbox env actions and a test-based reward (paper batch 1280)",
    ),
    "deepsearch": Workload(
        "deepsearch",
        DeepSearchParams,
        2048,
        generate_deepsearch,
        "DeepSearch: search API calls and an LLM judge on GPU (paper batch 2048)",
    ),
    "mopd": Workload(
        "mopd",
        MopdParams,
        2048,
        generate_mopd,
        "MOPD: log-prob calls to 9 teacher models on GPU (paper batch 2048)",
    ),
    "random": Workload(
        "random",
        RandomParams,
        40,
        generate_random,
        "small random instances (trace + cluster) of a family: cpu, gpu or mixed",
        batch_for=lambda params, seed: instance_batch(params.family, seed),
    ),
}


def generate(
    name: str, *, batch: int | None = None, steps: int = 1, seed: int = 0, **overrides: Any
) -> Trace:
    """Generate workload ``name``: default parameters with ``overrides`` applied.

    ``batch`` is trajectories per RL step (default: the paper's batch for that workload).
    """
    try:
        workload = WORKLOADS[name]
    except KeyError:
        raise ValueError(
            f"unknown workload {name!r}; known: {', '.join(sorted(WORKLOADS))}"
        ) from None
    return workload(workload.params_with(**overrides), batch=batch, steps=steps, seed=seed)


__all__ = [
    "WORKLOADS",
    "CodingParams",
    "DeepSearchParams",
    "MopdParams",
    "RandomParams",
    "TeacherSpec",
    "Workload",
    "generate",
    "summarize",
]
