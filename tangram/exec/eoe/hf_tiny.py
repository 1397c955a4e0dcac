"""Small Hugging Face model directories made locally from configs, for tests, demos and
``tangram bench eoe`` (nothing can be fetched from a hub here): a Llama-style causal LM (the
teacher) or one-label sequence classifier (the reward model), random weights from a seed, saved
with ``save_pretrained`` (config.json + model.safetensors) beside a word-level tokenizer
(tokenizer.json) whose words are ``w0``, ``w1``, ...
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from tangram.exec.eoe.hf import REWARD, TEACHER

SPECIALS = ("<pad>", "<unk>", "<s>", "</s>")


@dataclass(frozen=True)
class HfShape:
    """The shape of a small Llama-style model."""

    words: int = 60
    hidden: int = 64
    layers: int = 4
    heads: int = 4
    kv_heads: int = 2
    max_len: int = 256

    @property
    def vocab(self) -> int:
        return len(SPECIALS) + self.words


#: Named shapes for the benchmark: weight bytes in fp32 are about 0.3 MB, 14 MB and 110 MB.
HF_SHAPES: dict[str, HfShape] = {
    "hf-tiny": HfShape(),
    "hf-small": HfShape(words=4092, hidden=256, layers=8, heads=8, kv_heads=4),
    "hf-medium": HfShape(words=8188, hidden=512, layers=12, heads=8, kv_heads=4),
}


def tokenizer(shape: HfShape) -> object:
    """A word-level fast tokenizer over ``w0`` .. ``w{words-1}`` (split on whitespace)."""
    from tokenizers import Tokenizer, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    vocab = {tok: i for i, tok in enumerate(SPECIALS)}
    for i in range(shape.words):
        vocab[f"w{i}"] = len(vocab)
    tok = Tokenizer(models.WordLevel(vocab, unk_token="<unk>"))
    tok.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    return PreTrainedTokenizerFast(
        tokenizer_object=tok,
        unk_token="<unk>",
        pad_token="<pad>",
        bos_token="<s>",
        eos_token="</s>",
    )


def save_model_dir(
    path: str | Path, kind: str, shape: HfShape | str = "hf-tiny", *, seed: int = 0
) -> Path:
    """Save a ``kind`` model ("teacher" or "reward") of ``shape`` and its tokenizer in ``path``."""
    import torch
    from transformers import LlamaConfig, LlamaForCausalLM, LlamaForSequenceClassification

    from tangram.exec.eoe.hf import _quiet

    _quiet()
    shape = HF_SHAPES[shape] if isinstance(shape, str) else shape
    config = LlamaConfig(
        vocab_size=shape.vocab,
        hidden_size=shape.hidden,
        intermediate_size=2 * shape.hidden,
        num_hidden_layers=shape.layers,
        num_attention_heads=shape.heads,
        num_key_value_heads=shape.kv_heads,
        max_position_embeddings=shape.max_len,
        pad_token_id=0,
        bos_token_id=2,
        eos_token_id=3,
        tie_word_embeddings=kind == TEACHER,
        num_labels=1,
    )
    classes = {TEACHER: LlamaForCausalLM, REWARD: LlamaForSequenceClassification}
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        model = classes[kind](config).eval()
    path = Path(path)
    path.mkdir(parents=True, exist_ok=True)
    model.save_pretrained(str(path))
    tokenizer(shape).save_pretrained(str(path))
    return path


def words(n: int, seed: int = 0, vocab_words: int = 60) -> str:
    """A text of ``n`` random words of the tiny tokenizer, from ``seed``."""
    import random

    rng = random.Random(seed)
    return " ".join(f"w{rng.randrange(vocab_words)}" for _ in range(n))
