"""The OpenAI-style request shapes, parsed without I/O: invariants over random prompts."""

from __future__ import annotations

from types import SimpleNamespace

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from tangram.exec.eoe.hf_tiny import HfShape, tokenizer
from tangram.exec.service.openai_schema import OpenAiError, padded, prompts

SHAPE = HfShape(words=20, max_len=16)
FRONTEND = SimpleNamespace(
    tokenizer=tokenizer(SHAPE), vocab_size=SHAPE.vocab, max_len=SHAPE.max_len, pad_token_id=0
)
ids_lists = st.lists(
    st.lists(st.integers(4, SHAPE.vocab - 1), min_size=1, max_size=16), min_size=1, max_size=6
)


@settings(max_examples=60, deadline=None)
@given(ids_lists)
def test_token_id_prompts_become_one_right_padded_batch_with_their_own_ids(
    batch: list[list[int]],
) -> None:
    items = prompts(batch, "prompt", FRONTEND)
    assert [list(p.ids) for p in items] == batch
    for p in items:  # each token's offset lies in the decoded text, in order
        assert len(p.offsets) == len(p.ids) and list(p.offsets) == sorted(p.offsets)
        assert all(0 <= o < len(p.text) for o in p.offsets)
    enc = padded(items, 0, top=3)
    assert enc["input_ids"].shape == (len(batch), max(map(len, batch)))
    assert enc["attention_mask"].sum(1).tolist() == [len(b) for b in batch]
    for row, ids in zip(enc["input_ids"].tolist(), batch, strict=True):
        assert row[: len(ids)] == ids and set(row[len(ids) :]) <= {0}
    assert enc["top_k"].tolist() == [3] * len(batch)


@settings(max_examples=40, deadline=None)
@given(ids_lists, st.integers(0, 5), st.integers(0, 15))
def test_an_id_outside_the_vocabulary_is_refused_naming_the_prompt(
    batch: list[list[int]], which: int, where: int
) -> None:
    bad = [list(b) for b in batch]
    row = bad[which % len(bad)]
    row[where % len(row)] = SHAPE.vocab + where
    with pytest.raises(OpenAiError, match="outside the model's vocabulary") as info:
        prompts(bad, "prompt", FRONTEND)
    assert info.value.param == "prompt" and info.value.status == 400


@settings(max_examples=40, deadline=None)
@given(st.lists(st.integers(0, SHAPE.words - 1), min_size=1, max_size=16))
def test_a_text_prompt_is_tokenised_with_the_services_tokenizer(words: list[int]) -> None:
    text = " ".join(f"w{i}" for i in words)
    (item,) = prompts(text, "prompt", FRONTEND)
    assert list(item.ids) == [i + 4 for i in words]  # w0 is id 4 after the 4 specials
    assert item.text == text
    assert [text[o:].split(" ")[0] for o in item.offsets] == text.split(" ")


def test_a_prompt_longer_than_the_model_takes_is_refused_not_truncated() -> None:
    with pytest.raises(OpenAiError, match="at most 16") as info:
        prompts([5] * 17, "prompt", FRONTEND)
    assert info.value.param == "prompt"


def test_an_id_the_tokenizer_has_no_token_for_is_refused_naming_the_prompt() -> None:
    """A model's vocabulary is often padded past its tokenizer's (Qwen2.5: 151,936 rows for
    151,665 tokens): an id in that gap passed the range check, then had no token, and
    ``prompts`` raised a TypeError (a 500) or answered ``null`` tokens. vLLM refuses it."""
    padded_frontend = SimpleNamespace(**{**vars(FRONTEND), "vocab_size": SHAPE.vocab + 8})
    for batch in ([[5, SHAPE.vocab + 1, 6]], [[5, SHAPE.vocab + 1]]):
        with pytest.raises(OpenAiError, match="no token") as info:
            prompts(batch, "prompt", padded_frontend)
        assert info.value.param == "prompt" and info.value.status == 400
        assert str(SHAPE.vocab + 1) in info.value.message
    (item,) = prompts([[5, 6]], "prompt", padded_frontend)
    assert item.ids == (5, 6)


def test_tokens_and_top_logprobs_keys_are_text_not_byte_level_pieces() -> None:
    """vLLM (as OpenAI) answers each token as its text (' world'); with a byte-level BPE
    tokenizer (Llama 3's, Qwen's) the answer carried the vocabulary's pieces ('Ġworld',
    'hÃ©llo' for 'héllo'), so a client joining or matching tokens got mojibake."""
    import torch

    from tangram.exec.service.openai_schema import CompletionRequest, completion_doc

    tok = _byte_level_tokenizer()
    frontend = SimpleNamespace(tokenizer=tok, vocab_size=len(tok), max_len=64, pad_token_id=0)
    text = "hello world héllo"
    for prompt in (text, list(tok(text, add_special_tokens=False)["input_ids"])):
        (item,) = prompts(prompt, "prompt", frontend)
        n = len(item.ids)
        value = {
            "token_logprobs": torch.zeros(1, n - 1),
            "top_ids": torch.tensor([[[item.ids[2]]] * (n - 1)]),
            "top_logprobs": torch.full((1, n - 1, 1), -1.0),
        }
        doc = completion_doc(CompletionRequest("m", (item,), 1), value, frontend)
        lp = doc["choices"][0]["logprobs"]
        assert "".join(lp["tokens"]) == text, lp["tokens"]
        assert lp["tokens"][1] == " world", lp["tokens"]
        assert lp["top_logprobs"][1] == {" héllo": -1.0, " world": 0.0}, lp["top_logprobs"]
        assert lp["text_offset"] == [text.index(t) if t.strip() else 11 for t in lp["tokens"]]


def test_offsets_of_ids_that_do_not_tokenise_back_count_the_token_texts() -> None:
    """Ids whose text tokenises to other ids (' héllo', 'h', 'e': the text gives ' héllo',
    'he') had their offsets counted by vocabulary piece: 'ĠhÃ©llo' is 7 characters, ' héllo'
    6, so the offsets were (0, 7, 8), the last past the 8-character text. They count the
    tokens' texts, as the answer's tokens and vLLM's offsets do: (0, 6, 7)."""
    tok = _byte_level_tokenizer()
    frontend = SimpleNamespace(tokenizer=tok, vocab_size=len(tok), max_len=64, pad_token_id=0)
    vocab = tok.get_vocab()
    ids = [vocab["ĠhÃ©llo"], vocab["h"], vocab["e"]]
    (item,) = prompts(ids, "prompt", frontend)
    assert item.text == " héllohe"
    assert tok(item.text, add_special_tokens=False)["input_ids"] != ids
    assert item.offsets == (0, 6, 7)


def _byte_level_tokenizer():  # type: ignore[no-untyped-def]
    """A small byte-level BPE tokenizer (as Llama 3's and Qwen's are), trained here."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    bpe = Tokenizer(models.BPE())
    bpe.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    bpe.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=300,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        special_tokens=["<pad>"],
    )
    bpe.train_from_iterator(["hello world, the world says héllo"] * 10, trainer)
    return PreTrainedTokenizerFast(tokenizer_object=bpe, pad_token="<pad>")


def test_ids_decoding_to_one_text_keep_the_highest_log_prob_in_top_logprobs() -> None:
    """``top_logprobs`` is keyed by token text, and distinct ids can share one (a byte-level
    tokenizer's lone bytes all decode to '\\ufffd'): the entry kept the last, lowest log-prob
    of them and dropped the prompt's own token's, so it ranked a text below what the model
    gave it and below the position's own ``token_logprobs``."""
    import torch

    from tangram.exec.service.openai_schema import CompletionRequest, Prompt, completion_doc

    texts = {4: "a", 5: "\ufffd", 6: "\ufffd", 7: "\ufffd"}
    tok = SimpleNamespace(batch_decode=lambda rows, **_: [texts[r[0]] for r in rows])
    frontend = SimpleNamespace(tokenizer=tok)
    item = Prompt((4, 7), "a\ufffd", (0, 1))
    value = {
        "token_logprobs": torch.tensor([[-3.0]]),
        "top_ids": torch.tensor([[[5, 6]]]),
        "top_logprobs": torch.tensor([[[-1.0, -2.0]]]),
    }
    for top in (2, 0):  # with 0, the prompt's own token alone
        doc = completion_doc(CompletionRequest("m", (item,), top), value, frontend)
        lp = doc["choices"][0]["logprobs"]
        assert lp["tokens"] == ["a", "\ufffd"]
        want = -1.0 if top else -3.0
        assert lp["top_logprobs"] == [None, {"\ufffd": want}], lp["top_logprobs"]


def test_a_log_prob_of_minus_infinity_is_vllms_floor_so_the_answer_is_strict_json() -> None:
    """A token the model gives probability 0 (-inf) went out as ``-Infinity``, which JSON
    lacks (strict parsers refuse the whole answer); vLLM answers -9999.0 there, in
    ``token_logprobs`` and ``top_logprobs`` alike."""
    import json

    import torch

    from tangram.exec.service.openai_schema import CompletionRequest, Prompt, completion_doc

    texts = {4: "a", 5: "b", 6: "c", 7: "d"}
    tok = SimpleNamespace(batch_decode=lambda rows, **_: [texts[r[0]] for r in rows])
    frontend = SimpleNamespace(tokenizer=tok)
    item = Prompt((4, 7), "ad", (0, 1))
    value = {
        "token_logprobs": torch.tensor([[-float("inf")]]),
        "top_ids": torch.tensor([[[5, 6]]]),
        "top_logprobs": torch.tensor([[[-0.5, -float("inf")]]]),
    }
    doc = completion_doc(CompletionRequest("m", (item,), 2), value, frontend)
    lp = doc["choices"][0]["logprobs"]
    assert lp["token_logprobs"] == [None, -9999.0]
    assert lp["top_logprobs"] == [None, {"b": -0.5, "c": -9999.0, "d": -9999.0}]
    json.dumps(doc, allow_nan=False)  # (raises on -inf or NaN)


@pytest.mark.parametrize("where", ["token_logprobs", "top_logprobs"])
@pytest.mark.parametrize("bad", [float("nan"), float("inf")])
def test_a_log_prob_that_is_not_finite_is_an_error_naming_its_prompt(
    where: str, bad: float
) -> None:
    """A NaN (or +inf) log-prob is no floor's to raise: it went out as ``NaN``, which JSON
    lacks (strict parsers refused the answer, Python's read a NaN that poisons training).
    It is a 500 naming the prompt, as vLLM's server fails to encode it too."""
    import torch

    from tangram.exec.service.openai_schema import CompletionRequest, Prompt, completion_doc

    texts = {4: "a", 5: "b", 6: "c", 7: "d"}
    tok = SimpleNamespace(batch_decode=lambda rows, **_: [texts[r[0]] for r in rows])
    frontend = SimpleNamespace(tokenizer=tok)
    items = (Prompt((4, 7), "ad", (0, 1)), Prompt((4, 5), "ab", (0, 1)))
    value = {
        "token_logprobs": torch.tensor([[-1.0], [-2.0]]),
        "top_ids": torch.tensor([[[5, 6]], [[5, 6]]]),
        "top_logprobs": torch.tensor([[[-0.5, -1.0]], [[-0.5, -1.0]]]),
    }
    value[where][1, 0, ...] = bad
    with pytest.raises(OpenAiError) as caught:
        completion_doc(CompletionRequest("m", items, 2), value, frontend)
    error = caught.value
    assert (error.status, error.code, error.param) == (500, "non_finite_logprob", "prompt")
    assert "prompt[1]" in error.message
