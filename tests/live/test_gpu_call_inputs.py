"""Inputs of a raw GPU action (``POST /v1/actions`` with ``service`` + ``inputs``) to a model
directory's service: ill-formed ones end that action with an error naming what is wrong,
and never with a result. (The OpenAI-style routes check their prompts; these go to the model
as sent.) A GPU node of CPU-backed devices: no Docker, no GPU needed."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import httpx
import pytest

from tangram.core.resources import ClusterSpec, GpuNodeSpec
from tangram.exec.eoe.hf import hf_service
from tangram.exec.eoe.hf_tiny import HfShape, save_model_dir
from tangram.exec.runtime import RuntimeConfig, build_runtime
from tangram.exec.service import ServeOptions, ServiceThread


@pytest.fixture(scope="module")
def served(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ServiceThread]:
    root = tmp_path_factory.mktemp("models")
    teacher = save_model_dir(root / "teacher", "teacher", HfShape(layers=2), seed=3)
    reward = save_model_dir(root / "reward", "reward", HfShape(layers=2), seed=4)
    cluster = ClusterSpec(
        name="gpu-inputs",
        cpu_nodes=(),
        gpu_nodes=(GpuNodeSpec("g", gpus=2, gpu_memory_gb=1.0, host_memory_gb=4.0),),
        apis=(),
    )

    def make() -> Any:
        return build_runtime(
            cluster,
            RuntimeConfig(default_timeout_s=60.0),
            cpu=False,
            gpu_backend="cpu",
            services=[
                hf_service("teacher", teacher, "teacher").spec,
                hf_service("rm", reward, "reward").spec,
            ],
        )

    with ServiceThread(make, ServeOptions(port=0)) as thread:
        yield thread


#: (service, inputs, a word the error must hold).
BAD_INPUTS = [
    ("teacher", {"input_ids": [[999999, 1]]}, "input_ids"),
    ("teacher", [[-1, 1]], "input_ids"),
    ("rm", {"input_ids": [[5, 999999]], "attention_mask": [[1, 1]]}, "input_ids"),
    ("teacher", {"input_ids": [[5, 6]], "attention_mask": [[1]]}, "attention_mask"),
    ("rm", {"input_ids": [[5, 6, 7]], "attention_mask": [[1, 1]]}, "attention_mask"),
    ("teacher", {"input_ids": [[5, 6]], "attention_mask": "x"}, "attention_mask"),
    ("teacher", {"input_ids": [[5.5, 6]]}, "input_ids"),
    ("teacher", {"input_ids": [5, 6]}, "input_ids"),
]


@pytest.mark.parametrize(("service", "inputs", "word"), BAD_INPUTS, ids=lambda v: str(v)[:40])
def test_ill_formed_inputs_end_the_call_with_an_error_naming_them(
    served: ServiceThread, service: str, inputs: Any, word: str
) -> None:
    """Token ids outside the vocabulary were looked up anyway ('index out of range in self';
    on a CUDA device an out-of-range lookup is a device-side assert, which leaves the
    process's CUDA context unusable for every later call); an attention mask shorter than
    the ids gave a result, silently computed on a mask that does not fit."""
    body = {"service": service, "inputs": inputs, "wait": 60}
    r = httpx.post(f"{served.url}/v1/actions", json=body, timeout=90)
    assert r.status_code == 200, r.text
    outcome = r.json()["outcome"]
    assert outcome["status"] == "error", outcome
    assert word in outcome["error"]["message"], outcome["error"]


def test_well_formed_inputs_still_run(served: ServiceThread) -> None:
    for service, inputs in (
        ("teacher", [[5, 6, 7]]),
        ("teacher", {"input_ids": [[5, 6, 0]], "attention_mask": [[1, 1, 0]]}),
        ("rm", {"input_ids": [[5, 6], [7, 0]], "attention_mask": [[1, 1], [1, 0]]}),
    ):
        body = {"service": service, "inputs": inputs, "wait": 60}
        r = httpx.post(f"{served.url}/v1/actions", json=body, timeout=90)
        assert r.status_code == 200 and r.json()["outcome"]["status"] == "result", r.text
