"""The OpenAI-style endpoints of EOE's model services, over HTTP on loopback.

A service (GPU node of 2 CPU-backed devices, no CPU node: no Docker needed) serves a teacher
and a reward model saved here from configs to a temporary directory. The log-probs are checked
against ``transformers``' own forward pass on the same tokens, and the official ``openai``
client calls both endpoints.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import openai
import pytest
import torch

from tangram.core.resources import ClusterSpec, GpuNodeSpec
from tangram.exec.eoe.hf import hf_service, load_model
from tangram.exec.eoe.hf_tiny import HfShape, save_model_dir, words

SHAPE = HfShape(layers=3)


@pytest.fixture(scope="module")
def served(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Any]:
    from tangram.exec.runtime import RuntimeConfig, build_runtime
    from tangram.exec.service import ServeOptions, ServiceThread

    root = tmp_path_factory.mktemp("models")
    teacher = save_model_dir(root / "teacher", "teacher", SHAPE, seed=3)
    reward = save_model_dir(root / "reward", "reward", SHAPE, seed=4)
    cluster = ClusterSpec(
        name="openai-test",
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

    thread = ServiceThread(make, ServeOptions(port=0)).start()
    thread.dirs = {"teacher": teacher, "reward": reward}  # type: ignore[attr-defined]
    try:
        yield thread
    finally:
        thread.stop()


def post(served: Any, path: str, body: Any) -> httpx.Response:
    return httpx.post(served.url + path, json=body, timeout=60.0)


def own_forward(path: Path, ids: list[int]) -> list[float]:
    """``transformers``' log p(token[t] | tokens[:t]) for t >= 1, on the same token ids."""
    model = load_model(path, "teacher")
    tokens = torch.tensor([ids])
    with torch.inference_mode():
        logp = torch.log_softmax(model(input_ids=tokens).logits[0, :-1].float(), -1)
    return logp.gather(-1, tokens[0, 1:, None])[:, 0].tolist()


def test_echo_logprobs_equal_transformers_forward_for_text_and_token_ids(served: Any) -> None:
    texts = [words(12, seed=1), words(4, seed=2)]
    body = {"model": "teacher", "prompt": texts, "echo": True, "logprobs": 0, "max_tokens": 0}
    r = post(served, "/v1/completions", body)
    assert r.status_code == 200, r.text
    doc = r.json()
    assert doc["object"] == "text_completion" and doc["model"] == "teacher"
    assert [c["text"] for c in doc["choices"]] == texts
    tok = load_tokenizer(served)
    for choice, text in zip(doc["choices"], texts, strict=True):
        ids = tok(text, add_special_tokens=False)["input_ids"]
        lp = choice["logprobs"]
        assert lp["tokens"] == text.split()
        assert lp["token_logprobs"][0] is None and len(lp["token_logprobs"]) == len(ids)
        assert lp["token_logprobs"][1:] == pytest.approx(
            own_forward(served.dirs["teacher"], ids), abs=1e-5
        )
        assert lp["text_offset"] == [i for i in range(len(text)) if i == 0 or text[i - 1] == " "]
    # the same prompt as token ids gives the same log-probs (batched with another, padded)
    ids = tok(texts[0], add_special_tokens=False)["input_ids"]
    by_ids = post(served, "/v1/completions", {**body, "prompt": [ids, ids[:3]]}).json()
    assert by_ids["choices"][0]["logprobs"]["token_logprobs"][1:] == pytest.approx(
        doc["choices"][0]["logprobs"]["token_logprobs"][1:], abs=1e-5
    )
    assert by_ids["usage"]["prompt_tokens"] == len(ids) + 3


def test_top_logprobs_hold_the_most_likely_tokens_and_the_prompts_own(served: Any) -> None:
    body = {
        "model": "teacher",
        "prompt": words(6, seed=5),
        "echo": True,
        "logprobs": 2,
        "max_tokens": 0,
    }
    lp = post(served, "/v1/completions", body).json()["choices"][0]["logprobs"]
    assert lp["top_logprobs"][0] is None
    for t, entry in enumerate(lp["top_logprobs"][1:], start=1):
        assert lp["tokens"][t] in entry and 2 <= len(entry) <= 3
        assert max(entry.values()) >= lp["token_logprobs"][t] - 1e-6


def test_logprobs_0_still_gives_each_positions_entry_with_the_prompts_own_token(
    served: Any,
) -> None:
    """vLLM answers ``logprobs`` k (0 included) with ``top_logprobs`` a list: None, then per
    position a dict of up to k + 1 entries holding the prompt's own token. With 0 the answer's
    ``top_logprobs`` was null, so a client indexing it (written for vLLM) failed."""
    body = {"model": "teacher", "prompt": words(6, seed=5), "echo": True, "max_tokens": 0}
    lp = post(served, "/v1/completions", {**body, "logprobs": 0}).json()["choices"][0]["logprobs"]
    assert lp["top_logprobs"] is not None, lp
    assert lp["top_logprobs"][0] is None and len(lp["top_logprobs"]) == len(lp["tokens"])
    for t, entry in enumerate(lp["top_logprobs"][1:], start=1):
        assert entry == {lp["tokens"][t]: lp["token_logprobs"][t]}, entry


def test_the_reward_endpoints_give_transformers_scores(served: Any) -> None:
    texts = [words(9, seed=7), words(3, seed=8)]
    model = load_model(served.dirs["reward"], "reward")
    tok = load_tokenizer(served)
    with torch.inference_mode():
        expected = [
            model(input_ids=torch.tensor([tok(t, add_special_tokens=False)["input_ids"]]))
            .logits[0, 0]
            .item()
            for t in texts
        ]
    pooled = post(served, "/pooling", {"model": "rm", "input": texts}).json()
    assert [d["data"][0] for d in pooled["data"]] == pytest.approx(expected, abs=1e-5)
    assert [d["index"] for d in pooled["data"]] == [0, 1]
    rewards = post(served, "/get_reward", {"query": texts, "prompts": ["p", "q"]}).json()
    assert rewards["rewards"] == pytest.approx(expected, abs=1e-5)


def test_the_official_openai_client_calls_both_endpoints(served: Any) -> None:
    client = openai.OpenAI(base_url=served.url + "/v1", api_key="unused", max_retries=0)
    text = words(8, seed=11)
    out = client.completions.create(
        model="teacher", prompt=text, echo=True, logprobs=1, max_tokens=0
    )
    assert out.choices[0].text == text
    assert out.choices[0].logprobs.token_logprobs[0] is None
    assert len(out.choices[0].logprobs.tokens) == 8
    models = client.models.list()
    assert [m.id for m in models] == ["rm", "teacher"]
    # (OpenAI's Model has created, an int: the pydantic model validates when asked.)
    for m in models:
        openai.types.Model.model_validate(m.model_dump())
    pooled = client.post("/pooling", body={"model": "rm", "input": [text]}, cast_to=object)
    assert isinstance(pooled["data"][0]["data"][0], float)
    with pytest.raises(openai.BadRequestError) as info:
        client.completions.create(model="teacher", prompt=text, max_tokens=16)
    assert info.value.body["param"] == "max_tokens"
    with pytest.raises(openai.NotFoundError):
        client.completions.create(model="nope", prompt=text, echo=True, logprobs=0, max_tokens=0)


BAD = [
    ({"prompt": "w1", "echo": True, "logprobs": 0, "max_tokens": 0}, 400, "model"),
    ({"model": "ghost", "prompt": "w1", "echo": True, "logprobs": 0, "max_tokens": 0}, 404, "model"),
    ({"model": "rm", "prompt": "w1", "echo": True, "logprobs": 0, "max_tokens": 0}, 400, "model"),
    ({"model": "teacher", "prompt": "w1", "echo": True, "logprobs": 0}, 400, "max_tokens"),
    ({"model": "teacher", "prompt": "w1", "logprobs": 0, "max_tokens": 0}, 400, "echo"),
    ({"model": "teacher", "prompt": "w1", "echo": True, "max_tokens": 0}, 400, "logprobs"),
    ({"model": "teacher", "prompt": "w1", "echo": True, "logprobs": 99, "max_tokens": 0}, 400, "logprobs"),
    ({"model": "teacher", "prompt": [], "echo": True, "logprobs": 0, "max_tokens": 0}, 400, "prompt"),
    ({"model": "teacher", "prompt": [5, 10**6], "echo": True, "logprobs": 0, "max_tokens": 0}, 400, "prompt"),
    ({"model": "teacher", "prompt": [[1], "w1", 3.5], "echo": True, "logprobs": 0, "max_tokens": 0}, 400, "prompt"),
    ({"model": "teacher", "prompt": " ".join(["w1"] * 300), "echo": True, "logprobs": 0, "max_tokens": 0}, 400, "prompt"),
    ({"model": "teacher", "echo": True, "logprobs": 0, "max_tokens": 0}, 400, "prompt"),
    ({"model": "teacher", "prompt": "w1", "echo": True, "logprobs": 0, "max_tokens": 0, "stream": True}, 400, "stream"),
]  # fmt: skip


@pytest.mark.parametrize(("body", "status", "param"), BAD)
def test_bad_completion_requests_get_an_openai_error_naming_the_field(
    served: Any, body: dict[str, Any], status: int, param: str
) -> None:
    r = post(served, "/v1/completions", body)
    assert r.status_code == status, r.text
    error = r.json()["error"]
    assert error["param"] == param and error["message"] and error["type"]


@pytest.mark.parametrize(
    ("path", "body", "param"),
    [
        ("/pooling", {"model": "rm"}, "input"),
        ("/pooling", {"model": "teacher", "input": "w1"}, "model"),
        ("/pooling", {"model": "rm", "input": [""]}, "input"),
        ("/get_reward", {"query": "w1"}, "query"),
        ("/get_reward", {"query": []}, "query"),
        ("/get_reward", {"query": ["w1"], "model": "teacher"}, "model"),
        ("/get_reward", [1, 2], None),
    ],
)
def test_bad_reward_requests_get_an_openai_error(
    served: Any, path: str, body: Any, param: str | None
) -> None:
    r = post(served, path, body)
    assert r.status_code == 400, r.text
    assert r.json()["error"]["param"] == param


def test_malformed_json_is_refused_in_the_openai_shape(served: Any) -> None:
    r = httpx.post(
        served.url + "/v1/completions",
        content=b"{not json",
        headers={"Content-Type": "application/json"},
        timeout=10,
    )
    assert r.status_code == 400 and r.json()["error"]["message"]


def test_each_request_is_one_traced_gpu_action(served: Any) -> None:
    before = served.runtime.status()["counters"].get("completed", 0)
    body = {"model": "teacher", "prompt": ["w1 w2", "w3 w4 w5"], "echo": True}
    post(served, "/v1/completions", {**body, "logprobs": 0, "max_tokens": 0}).raise_for_status()
    after = served.runtime.status()["counters"].get("completed", 0)
    assert after == before + 1


def load_tokenizer(served: Any) -> Any:
    return hf_service("x", served.dirs["teacher"], "teacher").tokenizer


def test_a_teacher_split_over_two_gpus_is_served_through_the_scheduler(
    tmp_path_factory: pytest.TempPathFactory,
) -> None:
    """Each GPU holds 400 KiB: the ~600 KB teacher fits only split in 2 layer shards, so the
    scheduler grants its calls both GPUs and EOE runs it across them."""
    from tangram.exec.runtime import RuntimeConfig, build_runtime
    from tangram.exec.service import ServeOptions, ServiceThread

    path = save_model_dir(tmp_path_factory.mktemp("split") / "t", "teacher", SHAPE, seed=3)
    cluster = ClusterSpec(
        name="split-test",
        cpu_nodes=(),
        gpu_nodes=(GpuNodeSpec("g", gpus=2, gpu_memory_gb=400 / (1 << 20), host_memory_gb=1.0),),
        apis=(),
    )

    def make() -> Any:
        split = hf_service("t2", path, "teacher", shards=2).spec
        return build_runtime(
            cluster, RuntimeConfig(), cpu=False, gpu_backend="cpu", services=[split]
        )

    thread = ServiceThread(make, ServeOptions(port=0)).start()
    try:
        text = words(10, seed=4)
        body = {"model": "t2", "prompt": text, "echo": True, "logprobs": 0, "max_tokens": 0}
        r = httpx.post(thread.url + "/v1/completions", json=body, timeout=60)
        assert r.status_code == 200, r.text
        ids = hf_service("x", path, "teacher").tokenizer(text, add_special_tokens=False)
        got = r.json()["choices"][0]["logprobs"]["token_logprobs"][1:]
        assert got == pytest.approx(own_forward(path, ids["input_ids"]), abs=1e-5)
        assert thread.runtime.gpu.eoe.residency() == {"t2": (0, 1)}
    finally:
        thread.stop()


# -- stop 26's hunt ------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("path", "body", "param"),
    [
        ("/v1/completions", {"model": "teacher", "prompt": "w1 \ud800 w2", "echo": True, "logprobs": 0, "max_tokens": 0}, "prompt"),
        ("/pooling", {"model": "rm", "input": "\udfff"}, "input"),
        ("/get_reward", {"query": ["\ud800"]}, "query"),
    ],
)  # fmt: skip
def test_a_lone_surrogate_is_the_clients_error_naming_the_field(
    served: Any, path: str, body: Any, param: str
) -> None:
    """It was a 500 with a traceback in the log (the tokenizer's TypeError). (JSON may
    carry one as an escape, \\ud800, which Python's json reads as a lone surrogate.)"""
    r = httpx.post(
        served.url + path,
        content=json.dumps(body).encode(),
        headers={"Content-Type": "application/json"},
        timeout=60.0,
    )
    assert r.status_code == 400, r.text
    assert r.json()["error"]["param"] == param


def test_a_request_of_too_many_tokens_in_all_is_refused(served: Any) -> None:
    """1024 prompts of 256 tokens with 20 log-probs made a 149 MB answer."""
    prompt = " ".join(["w1"] * 250)
    body = {"model": "teacher", "prompt": [prompt] * 300, "echo": True, "logprobs": 20}
    r = post(served, "/v1/completions", {**body, "max_tokens": 0})
    assert r.status_code == 400, r.text[:300]
    assert "in all" in r.json()["error"]["message"] and r.json()["error"]["param"] == "prompt"


def test_a_text_too_long_for_any_tokenisation_is_refused_before_tokenising(served: Any) -> None:
    """A 37 MB query was tokenised in full (84 s, the event loop held) before its length was
    checked."""
    r = post(served, "/get_reward", {"query": ["w1 " * 2_000_000]})
    assert r.status_code == 400 and "characters" in r.json()["error"]["message"], r.text[:300]


def test_refusals_and_retryable_ends_keep_their_status_and_back_off_hint(
    served: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A full service answered 429 without Retry-After, and a call the shutdown ended while it
    waited (retryable) answered 500."""
    from types import SimpleNamespace

    from tangram.exec.runtime.errors import Overloaded
    from tangram.exec.runtime.records import ErrorInfo

    body = {"model": "rm", "input": "w1 w2"}

    async def full(spec: Any) -> Any:
        raise Overloaded("too many actions pending", retry_after_s=2.5)

    monkeypatch.setattr(served.runtime, "run", full)
    r = post(served, "/pooling", body)
    assert r.status_code == 429 and r.headers["Retry-After"] == "3", r.headers
    assert r.json()["error"]["type"] == "rate_limit_error"

    async def shut(spec: Any) -> Any:
        error = ErrorInfo("shutting_down", "the runtime is shutting down", retryable=True)
        return SimpleNamespace(ok=False, status="error", error=error)

    monkeypatch.setattr(served.runtime, "run", shut)
    r = post(served, "/pooling", body)
    assert r.status_code == 503 and r.headers["Retry-After"] == "1", r.text
    assert r.json()["error"]["code"] == "shutting_down"

    async def no_memory(spec: Any) -> Any:  # started, but the call did not run: retryable
        error = ErrorInfo("restore_out_of_memory", "the restore ran out of memory", True)
        return SimpleNamespace(ok=False, status="error", error=error, start_s=1.0)

    monkeypatch.setattr(served.runtime, "run", no_memory)
    r = post(served, "/pooling", body)
    assert r.status_code == 503 and "x-should-retry" not in r.headers, r.headers
    assert "not run again" not in r.json()["error"]["message"]


@pytest.mark.parametrize(
    ("extra", "param"),
    [
        ({"max_tokens": False}, "max_tokens"),
        ({"max_tokens": 0.0}, "max_tokens"),
        ({"n": True}, "n"),
        ({"best_of": 0}, "best_of"),
        ({"temperature": -1}, "temperature"),
        ({"top_p": 2}, "top_p"),
        ({"stop": ["\n"]}, "stop"),
        ({"logit_bias": {"5": 1}}, "logit_bias"),
    ],
)
def test_values_that_were_accepted_and_ignored_are_refused_naming_them(
    served: Any, extra: dict[str, Any], param: str
) -> None:
    body = {"model": "teacher", "prompt": "w1 w2", "echo": True, "logprobs": 0, "max_tokens": 0}
    r = post(served, "/v1/completions", {**body, **extra})
    assert r.status_code == 400 and r.json()["error"]["param"] == param, r.text


def test_pooling_serves_float_encoding_only(served: Any) -> None:
    body = {"model": "rm", "input": "w1 w2"}
    assert post(served, "/pooling", {**body, "encoding_format": "float"}).status_code == 200
    r = post(served, "/pooling", {**body, "encoding_format": "base64"})
    assert r.status_code == 400 and r.json()["error"]["param"] == "encoding_format"


def test_a_call_the_shutdown_cut_after_it_started_is_not_retried_by_openai_clients(
    served: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A GPU call the shutdown cut while it ran was answered 500, which the official client
    retries by itself (every 5xx): the call ran again. The answer now says
    ``x-should-retry: false`` (which the client obeys) and that it is not run again."""
    from types import SimpleNamespace

    from tangram.exec.runtime.records import ErrorInfo

    calls: list[Any] = []

    async def cut(spec: Any) -> Any:
        calls.append(spec)
        error = ErrorInfo("shutting_down", "the runtime shut down while the action ran (5 s)")
        return SimpleNamespace(ok=False, status="error", error=error, start_s=1.0)

    monkeypatch.setattr(served.runtime, "run", cut)
    r = post(served, "/pooling", {"model": "rm", "input": "w1 w2"})
    assert r.status_code == 500 and r.headers["x-should-retry"] == "false", r.headers
    assert "not run again" in r.json()["error"]["message"]
    calls.clear()
    client = openai.OpenAI(base_url=served.url + "/v1", api_key="x", max_retries=2)
    with pytest.raises(openai.InternalServerError):
        client.completions.create(
            model="teacher", prompt="w1 w2", max_tokens=0, echo=True, logprobs=0
        )
    assert len(calls) == 1, "the client did not send the call again"


def test_an_answer_that_fails_after_the_call_ran_is_not_retried_by_openai_clients(
    served: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A call that ran but whose answer could not be made (the service's value of a shape
    the route cannot read) was a plain 500, which OpenAI's clients retry by themselves: the
    call ran again, and again. It now says ``x-should-retry: false``."""
    from types import SimpleNamespace

    calls: list[Any] = []

    async def odd(spec: Any) -> Any:
        calls.append(spec)
        return SimpleNamespace(ok=True, status="result", error=None, value=["?"], start_s=1.0)

    monkeypatch.setattr(served.runtime, "run", odd)
    r = post(served, "/pooling", {"model": "rm", "input": "w1 w2"})
    assert r.status_code == 500 and r.headers["x-should-retry"] == "false", r.headers
    assert len(calls) == 1


@pytest.mark.parametrize(("path", "field"), [("/pooling", "input"), ("/get_reward", "query")])
def test_a_score_that_is_not_finite_is_an_error_naming_its_input(
    served: Any, monkeypatch: pytest.MonkeyPatch, path: str, field: str
) -> None:
    """A reward model's NaN or infinite score went out as ``NaN``/``Infinity``, which JSON
    lacks: strict parsers refused the answer and Python's read a NaN that poisons training.
    It is a 500 naming the inputs (vLLM's server refuses to encode it too), not retried."""
    from types import SimpleNamespace

    async def odd(spec: Any) -> Any:
        value = torch.tensor([0.5, float("nan"), float("-inf")])
        return SimpleNamespace(ok=True, status="result", error=None, value=value, start_s=1.0)

    def strict(name: str) -> Any:
        raise AssertionError(f"not JSON: {name}")

    monkeypatch.setattr(served.runtime, "run", odd)
    texts = ["w1", "w2", "w3"]
    body = {"model": "rm", "input": texts} if field == "input" else {"query": texts}
    r = post(served, path, body)
    doc = json.loads(r.text, parse_constant=strict)
    assert r.status_code == 500 and r.headers["x-should-retry"] == "false", (r.status_code, doc)
    error = doc["error"]
    assert error["code"] == "non_finite_score" and error["param"] == field, error
    assert f"{field}[1]: nan" in error["message"] and f"{field}[2]: -inf" in error["message"]
    assert f"{field}[0]" not in error["message"]
