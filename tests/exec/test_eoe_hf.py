"""EOE services from Hugging Face model directories, and sharded cells.

The models are small Llama-style checkpoints made here from configs (``hf_tiny``), saved to a
temporary directory and loaded back from local files only, as a real checkpoint would be.
"""

from __future__ import annotations

import itertools
from pathlib import Path
from typing import Any

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from tangram.exec.eoe import EoeConfig, EoeManager, ServiceSpecError, ServiceTooLargeError
from tangram.exec.eoe.hf import hf_service, load_model, reward_scores
from tangram.exec.eoe.hf_tiny import HfShape, save_model_dir, words
from tangram.exec.eoe.sharding import cut
from tangram.exec.eoe.testing import BACKEND, blob_spec, missing_devices
from tests.exec.eoe_setup import eoe_manager

SHAPE = HfShape(layers=4)


@pytest.fixture(scope="module")
def dirs(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    root = tmp_path_factory.mktemp("hf")
    return {
        "teacher": save_model_dir(root / "teacher", "teacher", SHAPE, seed=0),
        "reward": save_model_dir(root / "reward", "reward", SHAPE, seed=1),
    }


def manager(devices: int = 2, mib: int = 64) -> EoeManager:
    """``devices`` devices with room for ``mib`` MiB of services each (``eoe_manager``)."""
    return eoe_manager(devices, mib)


def batch(tokenizer: Any, n: int = 3) -> dict[str, torch.Tensor]:
    """``n`` sequences of different lengths, right-padded, with their attention mask."""
    texts = [words(6 + 5 * i, seed=i) for i in range(n)]
    enc = tokenizer(texts, padding=True, return_tensors="pt")
    return {"input_ids": enc["input_ids"], "attention_mask": enc["attention_mask"]}


def reference_logprobs(path: Path, inputs: dict[str, torch.Tensor]) -> torch.Tensor:
    """What ``transformers`` itself gives: log p(token[t+1] | tokens[:t+1])."""
    model = load_model(path, "teacher")
    with torch.inference_mode():
        logits = model(**inputs).logits[:, :-1].float()
    ids = inputs["input_ids"][:, 1:]
    return torch.log_softmax(logits, -1).gather(-1, ids.unsqueeze(-1)).squeeze(-1)


def reference_scores(path: Path, inputs: dict[str, torch.Tensor]) -> torch.Tensor:
    model = load_model(path, "reward")
    with torch.inference_mode():
        return model(**inputs).logits[:, 0].float()


#: How close a device's result is to transformers' on the host (bit for bit on CPU devices).
ATOL = 1e-4 if BACKEND == "cuda" else 1e-5


def pick(kind: str) -> Any:
    """The comparable tensor of a ``kind`` service's result."""
    return (lambda v: v["token_logprobs"]) if kind == "teacher" else (lambda v: v)


@pytest.mark.parametrize("kind", ["teacher", "reward"])
def test_a_directory_service_gives_identical_outputs_after_evict_and_restore(
    dirs: dict[str, Path], kind: str
) -> None:
    svc = hf_service(kind, dirs[kind], kind)
    inputs = batch(svc.tokenizer)
    with manager(devices=1) as m:
        m.register(svc.spec)
        first = m.call(kind, inputs).unwrap()
        assert m.residency() == {kind: (0,)}
        assert m.evict(kind).gpus == (0,) and m.residency() == {}
        again = m.call(kind, inputs)
        assert again.ok and again.restored_gpus == (0,) and not again.hit
    assert torch.equal(pick(kind)(first), pick(kind)(again.value))
    reference = (reference_logprobs if kind == "teacher" else reference_scores)(dirs[kind], inputs)
    assert torch.allclose(pick(kind)(first), reference, atol=ATOL, rtol=0)


@pytest.mark.parametrize("kind", ["teacher", "reward"])
def test_replicas_on_another_gpu_and_at_dop_2_give_the_same_outputs(
    dirs: dict[str, Path], kind: str
) -> None:
    svc = hf_service(kind, dirs[kind], kind)
    inputs = batch(svc.tokenizer)
    with manager() as m:
        m.register(svc.spec)
        first = m.call(kind, inputs, gpus=(0,)).unwrap()
        other = m.call(kind, inputs, gpus=(1,))
        assert other.ok and other.restored_gpus == (1,) and not other.hit
        wide = m.call(kind, inputs, dop=2)  # data-parallel replicas on (0, 1), both resident
        assert wide.ok and wide.hit and wide.gpus == (0, 1)
    assert torch.equal(pick(kind)(first), pick(kind)(other.value))
    assert torch.allclose(pick(kind)(first), pick(kind)(wide.value), atol=ATOL, rtol=0)


def test_the_host_backup_holds_the_safetensors_weights(dirs: dict[str, Path]) -> None:
    from safetensors import safe_open

    svc = hf_service("teacher", dirs["teacher"], "teacher")
    with manager(devices=1) as m:
        m.register(svc.spec)
        backup = m._service("teacher").backup
        host = dict(backup.host_module().named_parameters(remove_duplicate=False))
    with safe_open(str(dirs["teacher"] / "model.safetensors"), framework="pt") as f:
        keys = list(f.keys())
        assert keys
        for key in keys:
            assert torch.equal(host[key], f.get_tensor(key)), key
    # the tied output embedding is stored once and shared
    assert host["lm_head.weight"].data_ptr() == host["model.embed_tokens.weight"].data_ptr()


@pytest.mark.parametrize("kind", ["teacher", "reward"])
def test_a_two_shard_cell_holds_half_on_each_device_and_matches_one_device(
    dirs: dict[str, Path], kind: str
) -> None:
    whole = hf_service(f"{kind}-1", dirs[kind], kind)
    split = hf_service(f"{kind}-2", dirs[kind], kind, shards=2)
    inputs = batch(whole.tokenizer)
    with manager() as m:
        one = m.register(whole.spec)
        info = m.register(split.spec)
        assert (info.shards, info.dops, info.parallelism) == (2, (2,), "layers")
        assert (one.shards, one.parallelism) == (1, "replicas")
        single = m.call(whole.spec.name, inputs, gpus=(0,)).unwrap()
        m.evict(whole.spec.name)
        base = [d.allocated_bytes for d in m.stats().devices]
        out = m.call(split.spec.name, inputs)  # the default DoP is its shard count
        assert out.ok and out.gpus == (0, 1) and out.restored_gpus == (0, 1)
        held = [d.allocated_bytes - b for d, b in zip(m.stats().devices, base, strict=True)]
        assert sum(held) == pytest.approx(one.replica_bytes, abs=2048)
        for h in held:  # about size/k on each: no GPU holds the whole model
            assert 0.35 * one.replica_bytes < h < 0.65 * one.replica_bytes
        assert info.resident_bytes == max(held)
        again = m.call(split.spec.name, inputs).unwrap()
    assert torch.allclose(pick(kind)(out.value), pick(kind)(single), atol=ATOL, rtol=0)
    assert torch.equal(pick(kind)(again), pick(kind)(out.value))
    if BACKEND != "cuda":  # CPU devices: bit for bit
        assert torch.equal(pick(kind)(out.value), pick(kind)(single))


def test_one_evicted_shard_is_restored_alone_and_outputs_stay_identical(
    dirs: dict[str, Path],
) -> None:
    split = hf_service("t2", dirs["teacher"], "teacher", shards=2)
    inputs = batch(split.tokenizer)
    with manager() as m:
        m.register(split.spec)
        first = m.call("t2", inputs).unwrap()
        assert m.evict("t2", gpus=[1]).gpus == (1,)
        assert m.residency() == {"t2": (0,)}
        again = m.call("t2", inputs)
        assert again.restored_gpus == (1,)
        # a shard is no replica: the service cannot run on one GPU
        alone = m.call("t2", inputs, gpus=(0,))
        assert not alone.ok and "DoP" in alone.message
    assert torch.equal(first["token_logprobs"], again.value["token_logprobs"])


def test_a_model_larger_than_one_device_runs_split_over_two(dirs: dict[str, Path]) -> None:
    whole = hf_service("big", dirs["teacher"], "teacher")
    split = hf_service("big2", dirs["teacher"], "teacher", shards=2)
    budget = 400 * 1024  # the tiny teacher takes ~600 KB: more than one device, half fits
    with EoeManager(EoeConfig(backend="cpu", devices=2, device_memory_bytes=budget)) as m:
        with pytest.raises(ServiceTooLargeError, match="shards=k"):
            m.register(whole.spec)
        m.register(split.spec)
        assert m.call("big2", batch(split.tokenizer)).ok


def test_bad_directories_and_specs_are_refused_naming_the_problem(
    dirs: dict[str, Path], tmp_path: Path
) -> None:
    with pytest.raises(ServiceSpecError, match="does not exist"):
        hf_service("x", tmp_path / "nowhere", "teacher")
    with pytest.raises(ServiceSpecError, match="no config.json"):
        hf_service("x", tmp_path, "teacher")
    with pytest.raises(ServiceSpecError, match="kind must be one of"):
        hf_service("x", dirs["teacher"], "judge")
    with pytest.raises(ServiceSpecError, match="dops must be"):
        hf_service("x", dirs["teacher"], "teacher", shards=2, dops=(1, 2))
    with pytest.raises(ServiceSpecError, match="shards must be one of"):
        hf_service("x", dirs["teacher"], "teacher", shards=3)
    # one tensor-holding unit cannot be cut into two shards
    with manager() as m, pytest.raises(ServiceSpecError, match="cannot split the module into 2"):
        m.register(blob_spec("blob", shards=2, dops=(2,)))
    # more shards than units (embeddings, 4 layers, norm, rotary table)
    too_many = hf_service("t8", dirs["teacher"], "teacher", shards=8)
    m8 = EoeManager(EoeConfig(backend="cpu", devices=8, device_memory_bytes=1 << 24))
    with m8, pytest.raises(ServiceSpecError, match="7 units cannot be cut into 8"):
        m8.register(too_many.spec)


def test_a_reward_model_without_a_pad_token_is_refused(tmp_path: Path) -> None:
    import json

    path = save_model_dir(tmp_path / "r", "reward", SHAPE)
    config = json.loads((path / "config.json").read_text())
    config["pad_token_id"] = None
    (path / "config.json").write_text(json.dumps(config))
    tok = json.loads((path / "tokenizer_config.json").read_text())
    tok.pop("pad_token", None)
    (path / "tokenizer_config.json").write_text(json.dumps(tok))
    with pytest.raises(ServiceSpecError, match="pad_token_id"):
        hf_service("r", path, "reward")


def test_the_teacher_gives_the_top_k_tokens_when_asked(dirs: dict[str, Path]) -> None:
    svc = hf_service("teacher", dirs["teacher"], "teacher")
    inputs = batch(svc.tokenizer, n=2)
    inputs["top_k"] = torch.full((2,), 3)
    with manager(devices=1) as m:
        m.register(svc.spec)
        out = m.call("teacher", inputs).unwrap()
    assert out["top_ids"].shape == (*out["token_logprobs"].shape, 3)
    best = out["top_logprobs"][..., 0]
    assert torch.all(best >= out["token_logprobs"] - 1e-6)
    assert torch.all(out["top_logprobs"][..., :-1] >= out["top_logprobs"][..., 1:])


@pytest.mark.parametrize("kind", ["teacher", "reward"])
def test_a_sequence_longer_than_the_model_takes_is_refused(
    dirs: dict[str, Path], kind: str
) -> None:
    """A raw call's ids past the model's max_position_embeddings ran (a Llama extrapolates
    its positions silently; a model with learned positions looks one up past its table: on a
    CUDA device a device-side assert). The OpenAI-style routes refuse such a prompt; the raw
    path now does too, naming both lengths."""
    svc = hf_service(kind, dirs[kind], kind)
    ids = torch.ones((1, svc.max_len + 1), dtype=torch.long)
    with manager(devices=1) as m:
        m.register(svc.spec)
        out = m.call(kind, ids)
        assert not out.ok and "ValueError" in out.message, out
        assert f"{svc.max_len + 1} tokens" in out.message and str(svc.max_len) in out.message
        assert m.call(kind, ids[:, : svc.max_len]).ok


@pytest.mark.parametrize(
    "top_k", [5, torch.tensor([-3, -3]), torch.tensor([1.5, 1.5]), torch.full((2,), 10_000)]
)
def test_a_top_k_that_is_no_count_within_the_vocabulary_is_refused(
    dirs: dict[str, Path], top_k: Any
) -> None:
    """top_k=5 (no tensor) was 'AttributeError: int object has no attribute max', one past
    the vocabulary 'selected index k out of range', a negative k gave no top tokens without a
    word and 1.5 gave one."""
    svc = hf_service("teacher", dirs["teacher"], "teacher")
    inputs = {**batch(svc.tokenizer, n=2), "top_k": top_k}
    with manager(devices=1) as m:
        m.register(svc.spec)
        out = m.call("teacher", inputs)
    assert not out.ok and "ValueError" in out.message and "'top_k'" in out.message, out


@pytest.mark.parametrize("top_k", [torch.tensor([0, 3]), torch.tensor([1, 2]), torch.full((3,), 3)])
def test_a_top_k_that_is_not_one_k_per_sequence_is_refused(
    dirs: dict[str, Path], top_k: torch.Tensor
) -> None:
    """top_k repeats one k for each sequence of the batch. Different counts ran on one GPU
    (each sequence got the largest k) but not on two: cut with the batch, [0, 3] gave one
    piece no top tokens and the merge kept the first piece's keys (none for anyone), [1, 2]
    failed to merge; a length other than the batch's failed only at DoP 2."""
    svc = hf_service("teacher", dirs["teacher"], "teacher")
    inputs = {**batch(svc.tokenizer, n=2), "top_k": top_k}
    with manager(devices=1) as m:
        m.register(svc.spec)
        out = m.call("teacher", inputs)
    assert not out.ok and "ValueError" in out.message and "'top_k'" in out.message, out


ILL_FORMED = {
    "no tokens": (torch.ones((2, 0), dtype=torch.long), None, "at least one"),
    "no sequences": (torch.ones((0, 4), dtype=torch.long), None, "at least one"),
    "a mask of halves": (torch.ones((2, 4), dtype=torch.long), torch.full((2, 4), 0.5), "0 or 1"),
    "a negative mask": (torch.ones((2, 4), dtype=torch.long), torch.full((2, 4), -5), "0 or 1"),
    "an empty sequence": (
        torch.ones((2, 4), dtype=torch.long),
        torch.tensor([[1, 1, 0, 0], [0, 0, 0, 0]]),
        "no real token",
    ),
}


@pytest.mark.parametrize("kind", ["teacher", "reward"])
@pytest.mark.parametrize("case", sorted(ILL_FORMED))
def test_ill_formed_ids_and_masks_are_refused_naming_the_problem(
    dirs: dict[str, Path], kind: str, case: str
) -> None:
    """Empty ids failed with torch's words ('index -1 is out of bounds for dimension 1 with
    size 0', 'cannot reshape tensor of 0 elements'); a mask of 0.5 or -5, or a sequence with
    no real token, gave a result computed on it without a word."""
    ids, mask, says = ILL_FORMED[case]
    inputs: Any = ids if mask is None else {"input_ids": ids, "attention_mask": mask}
    svc = hf_service(kind, dirs[kind], kind)
    with manager(devices=1) as m:
        m.register(svc.spec)
        out = m.call(kind, inputs)
    assert not out.ok and "ValueError" in out.message and says in out.message, out


def _best_cut(sizes: list[int], parts: int) -> int:
    """The smallest largest run over every way to cut (brute force)."""
    n = len(sizes)
    best = None
    for inner in itertools.combinations(range(1, n), parts - 1):
        bounds = (0, *inner, n)
        worst = max(sum(sizes[a:b]) for a, b in itertools.pairwise(bounds))
        best = worst if best is None else min(best, worst)
    assert best is not None
    return best


@settings(max_examples=200, deadline=None)
@given(st.lists(st.integers(0, 1000), min_size=1, max_size=9), st.integers(1, 8))
def test_cut_gives_contiguous_nonempty_shards_with_the_smallest_largest_one(
    sizes: list[int], parts: int
) -> None:
    if len(sizes) < parts:
        with pytest.raises(ValueError, match="cannot be cut"):
            cut(sizes, parts)
        return
    starts = cut(sizes, parts)
    assert starts[0] == 0 and len(starts) == parts
    assert all(a < b for a, b in itertools.pairwise(starts))  # non-empty, in order
    bounds = (*starts, len(sizes))
    worst = max(sum(sizes[a:b]) for a, b in itertools.pairwise(bounds))
    assert worst == _best_cut(sizes, parts)


@pytest.mark.skipif(
    BACKEND != "cuda" or missing_devices(2) is not None,
    reason="CUDA-only: needs TANGRAM_EOE_BACKEND=cuda and 2 GPUs (experiments/gpu_eoe_check.sh)",
)
def test_cuda_shards_live_on_their_gpus_and_activations_follow(dirs: dict[str, Path]) -> None:
    whole = hf_service("w", dirs["teacher"], "teacher")
    split = hf_service("s", dirs["teacher"], "teacher", shards=2)
    inputs = batch(whole.tokenizer)
    with manager(mib=256) as m:
        m.register(whole.spec)
        m.register(split.spec)
        one = m.call("w", inputs, gpus=(0,)).unwrap()["token_logprobs"]
        m.evict("w")
        before = [torch.cuda.memory_allocated(i) for i in range(2)]
        two = m.call("s", inputs).unwrap()["token_logprobs"]
        grew = [torch.cuda.memory_allocated(i) - before[i] for i in range(2)]
        assert all(g > 0 for g in grew)
    assert torch.allclose(one, two, atol=1e-4)


def test_serve_model_arguments_name_kind_and_path(dirs: dict[str, Path]) -> None:
    from tangram.exec.eoe.hf import service_from_arg

    svc = service_from_arg(f"judge=reward:{dirs['reward']}")
    assert (svc.spec.name, svc.kind, svc.path) == ("judge", "reward", dirs["reward"])
    assert svc.spec.frontend is svc
    split = service_from_arg(f"t=teacher/2:{dirs['teacher']}")
    assert (split.spec.shards, split.spec.dops) == (2, (2,))
    bad_ones = ("judge", "judge=reward", f"=reward:{dirs['reward']}", "judge=:x", "t=teacher/x:p")
    for bad in (*bad_ones, "t=teacher/\u00b2:p"):  # (a superscript 2: int() refused it bare)
        with pytest.raises(ValueError, match=r"NAME=KIND\[/SHARDS\]:PATH"):
            service_from_arg(bad)


def test_a_served_model_named_as_an_example_replaces_it(dirs: dict[str, Path]) -> None:
    # tangram serve registers its examples (reward, teacher) beside every --model: a user's
    # teacher called "teacher" failed at start ("service 'teacher' is already registered",
    # naming no flag). It now replaces the example; a name given twice is refused.
    from tangram.exec.service_cli import served_services

    services = served_services([f"teacher=teacher:{dirs['teacher']}"])
    by_name = {spec.name: spec for spec in services}
    assert sorted(by_name) == ["reward", "teacher"]
    assert by_name["teacher"].frontend.path == dirs["teacher"]
    both = served_services([f"t=teacher:{dirs['teacher']}", f"j=reward:{dirs['reward']}"])
    assert sorted(spec.name for spec in both) == ["j", "reward", "t", "teacher"]
    with pytest.raises(ValueError, match="--model: service name 't' is given twice"):
        served_services([f"t=teacher:{dirs['teacher']}", f"t=reward:{dirs['reward']}"])


def test_the_backup_is_read_straight_from_the_safetensors_not_from_a_loaded_model(
    dirs: dict[str, Path],
) -> None:
    from tangram.exec.eoe.backup import LazyWeights
    from tangram.exec.eoe.hf import load_lazy

    built = hf_service("teacher", dirs["teacher"], "teacher").spec.factory()
    assert isinstance(built, LazyWeights)  # parameters on meta: the weights are read once
    assert all(p.device.type == "meta" for p in built.module.parameters())
    assert all(b.device.type == "cpu" for b in built.module.buffers())  # rotary tables built
    assert built.module.lm_head.weight is built.module.model.embed_tokens.weight  # still tied
    half = load_lazy(dirs["teacher"], "teacher", "bfloat16")
    assert half is not None and {p.dtype for p in half.module.parameters()} == {torch.bfloat16}
    # a checkpoint that lacks a parameter (a causal LM has no reward head) is left to
    # from_pretrained, which initialises what is missing
    assert load_lazy(dirs["teacher"], "reward") is None


def test_a_reward_prompt_ending_in_the_pad_id_is_scored_at_its_own_last_token(
    dirs: dict[str, Path],
) -> None:
    """The attention mask says which tokens are real: a query ending in the pad token's id
    (pad = EOS in many reward models; OpenRLHF's queries end in EOS) was scored one token
    early, as if that token were padding."""
    model = load_model(dirs["reward"], "reward")
    pad = int(model.config.pad_token_id)
    ids = torch.tensor([[5, 6, pad], [5, 6, pad]])
    mask = torch.tensor([[1, 1, 1], [1, 1, 0]])
    with torch.inference_mode():
        got = reward_scores(model, {"input_ids": ids, "attention_mask": mask})
        model.config.pad_token_id = pad + 1  # an id absent from the sequence: the last token
        whole = model(input_ids=ids[:1]).logits[0, 0].float()
        short = model(input_ids=ids[1:, :2]).logits[0, 0].float()
    assert torch.allclose(got, torch.stack([whole, short]), atol=ATOL)
    assert not torch.allclose(got[0], got[1], atol=ATOL)  # the pad-id token counts


def test_building_without_weights_touches_no_other_thread_and_always_undoes_itself() -> None:
    """A model built without weights (``load_lazy``) moves its parameters to meta by patching
    ``nn.Module.register_parameter`` for as long as it builds. Another thread's modules built
    meanwhile got meta parameters too (an example service registered at the same time failed:
    no data), and two builds that overlapped left the patch in place for good: every module
    the process made after had no weights."""
    import threading

    from torch import nn

    from tangram.exec.eoe.hf import _parameters_on_meta

    original = nn.Module.register_parameter
    first, second = _parameters_on_meta(), _parameters_on_meta()
    first.__enter__()
    second.__enter__()  # (another thread's build, as far as the patch can tell)
    try:
        assert nn.Linear(2, 2).weight.device.type == "meta"  # this build: no weights
        built: list[nn.Module] = []
        other = threading.Thread(target=lambda: built.append(nn.Linear(2, 2)))
        other.start()
        other.join(10)
        assert built[0].weight.device.type == "cpu"  # another thread's module keeps its own
    finally:
        first.__exit__(None, None, None)  # the first to start ends first
        second.__exit__(None, None, None)
        left = nn.Module.register_parameter
        nn.Module.register_parameter = original  # type: ignore[method-assign]  # (the suite's)
    assert left is original


@pytest.mark.parametrize("kind", ["teacher", "reward"])
def test_token_ids_of_any_integer_dtype_give_the_int64_result_and_others_are_refused(
    dirs: dict[str, Path], kind: str
) -> None:
    """Ids of uint8, int8 or int16 passed the check and failed in the embedding with torch's
    words ('Expected tensor for argument #1 'indices' to have one of the following scalar
    types: Long, Int'); bool ids did too, and complex ids were '"min_all" not implemented for
    'ComplexFloat''. Integer ids of any width now give the int64 result; bool and complex
    ones are refused naming 'input_ids'."""
    svc = hf_service(kind, dirs[kind], kind)
    ids = torch.randint(4, 60, (2, 6), generator=torch.Generator().manual_seed(0))
    with manager(devices=1) as m:
        m.register(svc.spec)
        want = pick(kind)(m.call(kind, ids).unwrap())
        for dtype in (torch.uint8, torch.int8, torch.int16, torch.int32):
            out = m.call(kind, ids.to(dtype))
            assert out.ok, (dtype, out.message)
            assert torch.equal(pick(kind)(out.value), want), dtype
        for dtype in (torch.bool, torch.complex64):
            out = m.call(kind, {"input_ids": ids.to(dtype)})
            assert not out.ok and "ValueError" in out.message, out
            assert "'input_ids' must be a 2-D array of integer token ids" in out.message


@pytest.mark.parametrize("dtype", ["int8", "bool", "bf16", "cuda", "nn"])
def test_a_dtype_that_is_no_floating_point_type_is_refused_naming_it(
    dirs: dict[str, Path], dtype: str
) -> None:
    """hf_service(dtype='int8') (or 'bool') registered, the weights cast to it, and every call
    failed with torch's words ('expected m1 and m2 to have the same dtype'); 'bf16' and
    'cuda' failed only at register, as the factory's AttributeError or TypeError."""
    with pytest.raises(ServiceSpecError, match=f"dtype must be one of .*got {dtype!r}"):
        hf_service("x", dirs["teacher"], "teacher", dtype=dtype)


def test_raw_reward_ids_ending_in_the_pad_id_are_scored_at_their_last_token(
    dirs: dict[str, Path],
) -> None:
    """Ids sent without an attention mask are all real tokens, but were scored by
    transformers, which takes the pad token's id for padding: a sequence ending in it (pad =
    EOS in many reward models) was scored one token early, unlike the same ids with a mask
    of ones (459c542 mended the masked calls only)."""
    model = load_model(dirs["reward"], "reward")
    pad = int(model.config.pad_token_id)
    ids = torch.tensor([[5, 6, pad], [7, 8, pad]])
    with torch.inference_mode():
        raw = reward_scores(model, ids)
        ones = reward_scores(model, {"input_ids": ids, "attention_mask": torch.ones_like(ids)})
    assert torch.equal(raw, ones)


@pytest.mark.parametrize("kind", ["teacher", "reward"])
def test_a_tokenizers_own_batch_encoding_is_taken_as_inputs_at_every_dop(
    dirs: dict[str, Path], kind: str
) -> None:
    """What the tokenizer returns (a BatchEncoding: a Mapping, not a dict) was refused by the
    service's call ('input_ids' must be a 2-D array..., got BatchEncoding), and at DoP 2 it
    was not split: each replica would have run the whole batch."""
    svc = hf_service(kind, dirs[kind], kind)
    texts = [words(6 + 5 * i, seed=i) for i in range(3)]
    encoded = svc.tokenizer(texts, padding=True, return_tensors="pt")
    with manager() as m:
        m.register(svc.spec)
        plain = m.call(kind, dict(encoded)).unwrap()
        for dop in (1, 2):
            out = m.call(kind, encoded, dop=dop)
            assert out.ok, out.message
            assert torch.allclose(pick(kind)(out.value), pick(kind)(plain), atol=ATOL, rtol=0)


def _scaled_llama_classes() -> type:
    """A Llama causal LM with a trained persistent buffer (its logits' scale, 1 when built),
    registered with the Auto classes under its own model type, as a checkpoint's would be."""
    from transformers import AutoConfig, AutoModelForCausalLM, LlamaConfig, LlamaForCausalLM

    class ScaledLlamaConfig(LlamaConfig):
        model_type = "tangram-scaled-llama"

    class ScaledLlama(LlamaForCausalLM):
        config_class = ScaledLlamaConfig

        def __init__(self, config: Any) -> None:
            super().__init__(config)
            self.register_buffer("logit_scale", torch.ones(()))

        def forward(self, *args: Any, **kwargs: Any) -> Any:
            out = super().forward(*args, **kwargs)
            out.logits = out.logits * self.logit_scale
            return out

    AutoConfig.register(ScaledLlamaConfig.model_type, ScaledLlamaConfig, exist_ok=True)
    AutoModelForCausalLM.register(ScaledLlamaConfig, ScaledLlama, exist_ok=True)
    return ScaledLlama


def test_a_checkpoints_persistent_buffers_are_loaded_as_from_pretrained_loads_them(
    tmp_path: Path,
) -> None:
    """load_lazy read only the parameters from the safetensors: a persistent buffer kept the
    value the model is built with, so a service from a checkpoint with a trained buffer
    answered differently from the model transformers loads from the same directory."""
    from transformers import LlamaConfig

    from tangram.exec.eoe.hf_tiny import tokenizer

    base = save_model_dir(tmp_path / "base", "teacher", SHAPE, seed=0)
    scaled = _scaled_llama_classes()
    config = LlamaConfig.from_pretrained(str(base)).to_dict()
    config.pop("model_type", None)
    model = scaled(scaled.config_class(**config)).eval()
    model.logit_scale.fill_(2.5)  # trained: not the value it is built with
    path = tmp_path / "scaled"
    model.save_pretrained(str(path))
    tokenizer(SHAPE).save_pretrained(str(path))
    svc = hf_service("scaled", path, "teacher")
    inputs = batch(svc.tokenizer)
    with manager(devices=1) as m:
        m.register(svc.spec)
        got = m.call("scaled", inputs).unwrap()["token_logprobs"]
    assert float(load_model(path, "teacher").logit_scale) == 2.5
    assert torch.allclose(got, reference_logprobs(path, inputs), atol=ATOL, rtol=0)
