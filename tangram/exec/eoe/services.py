"""Two real, small example services built in code: a reward model and a teacher.

They stand in for the GPU services of agentic RL (an LLM judge scoring trajectories, a
distillation teacher giving per-token log-probs, as in the paper's DeepSearch and MOPD
workloads) in tests, demos and benchmarks. Both are pre-norm causal transformers with random
weights drawn from a fixed seed, so every build of a size is identical; ``SIZES`` names a
ladder of sizes (from under 1 MB to several GB) so benchmarks can sweep model size.

- reward model: tokens (B, T) -> one score per sequence (B,), a linear head on the last
  token's hidden state;
- teacher: tokens (B, T) -> log p(token[t+1] | tokens[:t+1]) for each position, (B, T-1);
  its output embedding is tied to its input embedding (a shared weight, as in many LMs).
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import TYPE_CHECKING, Any

from tangram.core.cells import CELL_SIZES
from tangram.exec.eoe.registry import ServiceSpec

if TYPE_CHECKING:
    import torch


@dataclass(frozen=True)
class TransformerSize:
    """Shape of an example model; ``approx_bytes`` estimates its weight bytes."""

    vocab: int = 512
    d_model: int = 64
    layers: int = 2
    heads: int = 4
    max_len: int = 256
    dtype: str = "float32"

    def __post_init__(self) -> None:
        if self.d_model % self.heads:
            raise ValueError(f"d_model {self.d_model} is not a multiple of heads {self.heads}")
        for name in ("vocab", "d_model", "layers", "heads", "max_len"):
            if getattr(self, name) < 1:
                raise ValueError(f"{name} must be >= 1, got {getattr(self, name)}")
        if self.dtype not in ("float32", "bfloat16", "float16"):
            raise ValueError(f"dtype must be float32, bfloat16 or float16, got {self.dtype!r}")

    @property
    def approx_params(self) -> int:
        d = self.d_model
        per_layer = 12 * d * d + 13 * d  # qkv + out + 4x MLP (weights and biases) + 2 norms
        return self.vocab * d + self.max_len * d + self.layers * per_layer + 2 * d

    @property
    def approx_bytes(self) -> int:
        return self.approx_params * (4 if self.dtype == "float32" else 2)


#: Named sizes; fp32 unless suffixed. Weight bytes are approximate (the reward head adds d+1).
SIZES: dict[str, TransformerSize] = {
    "tiny": TransformerSize(vocab=512, d_model=64, layers=2, heads=4),  # ~0.6 MB
    "small": TransformerSize(vocab=4096, d_model=256, layers=4, heads=8),  # ~17 MB
    "medium": TransformerSize(vocab=8192, d_model=512, layers=8, heads=8),  # ~118 MB
    "large": TransformerSize(vocab=16384, d_model=1024, layers=12, heads=16),  # ~670 MB
    "xl": TransformerSize(vocab=32768, d_model=2048, layers=16, heads=16),  # ~3.5 GB
    "xl-bf16": TransformerSize(
        vocab=32768, d_model=2048, layers=16, heads=16, dtype="bfloat16"
    ),  # ~1.7 GB
}


def size_of(size: str | TransformerSize) -> TransformerSize:
    if isinstance(size, TransformerSize):
        return size
    try:
        return SIZES[size]
    except KeyError:
        raise ValueError(f"unknown model size {size!r}; known: {', '.join(SIZES)}") from None


def _modules() -> Any:
    """Build the module classes on first use, so importing this file needs no torch."""
    global _MODULES
    if _MODULES is not None:
        return _MODULES
    import torch
    import torch.nn.functional as F
    from torch import nn

    class Block(nn.Module):
        """Pre-norm causal self-attention + MLP."""

        def __init__(self, d: int, heads: int) -> None:
            super().__init__()
            self.heads = heads
            self.norm1 = nn.LayerNorm(d)
            self.qkv = nn.Linear(d, 3 * d)
            self.out = nn.Linear(d, d)
            self.norm2 = nn.LayerNorm(d)
            self.up = nn.Linear(d, 4 * d)
            self.down = nn.Linear(4 * d, d)

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            b, t, d = x.shape
            q, k, v = self.qkv(self.norm1(x)).split(d, dim=-1)
            q, k, v = (z.view(b, t, self.heads, d // self.heads).transpose(1, 2) for z in (q, k, v))
            att = F.scaled_dot_product_attention(q, k, v, is_causal=True)
            x = x + self.out(att.transpose(1, 2).reshape(b, t, d))
            return x + self.down(F.gelu(self.up(self.norm2(x))))

    class Trunk(nn.Module):
        """Token + position embeddings and the blocks; returns hidden states (B, T, d)."""

        def __init__(self, size: TransformerSize) -> None:
            super().__init__()
            self.max_len = size.max_len
            self.embed = nn.Embedding(size.vocab, size.d_model)
            self.pos = nn.Embedding(size.max_len, size.d_model)
            self.blocks = nn.ModuleList(Block(size.d_model, size.heads) for _ in range(size.layers))
            self.norm = nn.LayerNorm(size.d_model)
            # A buffer, so that buffers are exercised by backup/restore too.
            self.register_buffer("positions", torch.arange(size.max_len), persistent=False)

        def forward(self, tokens: torch.Tensor) -> torch.Tensor:
            t = tokens.shape[1]
            if t > self.max_len:
                raise ValueError(f"sequence length {t} exceeds the model's max_len {self.max_len}")
            x = self.embed(tokens) + self.pos(self.positions[:t])
            for block in self.blocks:
                x = block(x)
            return self.norm(x)

    class RewardModel(nn.Module):
        """A reward-model head on the trunk: one scalar score per sequence."""

        def __init__(self, size: TransformerSize) -> None:
            super().__init__()
            self.trunk = Trunk(size)
            self.head = nn.Linear(size.d_model, 1)

        def forward(self, tokens: torch.Tensor) -> torch.Tensor:
            hidden = self.trunk(tokens)
            return self.head(hidden[:, -1]).squeeze(-1).float()

    class TeacherLM(nn.Module):
        """A causal LM with tied input/output embeddings."""

        def __init__(self, size: TransformerSize) -> None:
            super().__init__()
            self.trunk = Trunk(size)
            self.lm_head = nn.Linear(size.d_model, size.vocab, bias=False)
            self.lm_head.weight = self.trunk.embed.weight

        def forward(self, tokens: torch.Tensor) -> torch.Tensor:
            return self.lm_head(self.trunk(tokens))

    _MODULES = {"RewardModel": RewardModel, "TeacherLM": TeacherLM}
    return _MODULES


_MODULES: dict[str, Any] | None = None


def build_model(kind: str, size: str | TransformerSize = "tiny", seed: int = 0) -> torch.nn.Module:
    """A ``RewardModel`` or ``TeacherLM`` of ``size``, random-initialised from ``seed``, in eval
    mode, with ``requires_grad`` off. The global RNG is left untouched."""
    import torch

    shape = size_of(size)
    cls = _modules()[kind]
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        model = cls(shape)
    model = model.to(getattr(torch, shape.dtype)).eval()
    model.requires_grad_(False)
    return model


def check_tokens(module: torch.nn.Module, tokens: Any) -> torch.Tensor:
    """``tokens`` when they are token ids the example model can take, else ``ValueError``
    naming what is wrong: a 2-D integer tensor (batch, tokens) of at least one token, every
    id within the vocabulary. A call's inputs come as the client sent them: an id past the
    vocabulary was looked up anyway ('index out of range in self' on a CPU-backed device; on
    a CUDA device a device-side assert, after which every call of the process fails)."""
    import torch

    if not isinstance(tokens, torch.Tensor) or tokens.ndim != 2:
        shape = getattr(tokens, "shape", None)
        got = type(tokens).__name__ + ("" if shape is None else f" {tuple(shape)}")
        raise ValueError(f"tokens must be a 2-D tensor of token ids (batch, tokens), got {got}")
    if tokens.is_floating_point() or tokens.is_complex() or tokens.dtype == torch.bool:
        raise ValueError(f"tokens must be integer token ids, got dtype {tokens.dtype}")
    tokens = tokens.long()  # uint8, int16...: the embedding takes int64 (torch refused them)
    if tokens.shape[1] < 1:
        raise ValueError(
            f"tokens must hold at least one token per sequence, got {tuple(tokens.shape)}"
        )
    vocab = module.trunk.embed.num_embeddings
    if tokens.numel() and (int(tokens.min()) < 0 or int(tokens.max()) >= vocab):
        raise ValueError(f"tokens hold ids outside the model's vocabulary [0, {vocab})")
    return tokens


def score(module: torch.nn.Module, tokens: torch.Tensor) -> torch.Tensor:
    """Call function of the reward model: scores (B,) for token ids (B, T)."""
    return module(check_tokens(module, tokens))


def token_logprobs(module: torch.nn.Module, tokens: torch.Tensor) -> torch.Tensor:
    """Call function of the teacher: log-prob of each next token, (B, T-1), in float32."""
    import torch

    tokens = check_tokens(module, tokens)
    logits = module(tokens[:, :-1]).float()
    logp = torch.log_softmax(logits, dim=-1)
    return logp.gather(-1, tokens[:, 1:].unsqueeze(-1)).squeeze(-1)


def _workspace(size: TransformerSize, batch: int, seq_len: int, logits: bool) -> int:
    """A rough activation estimate for ``batch`` x ``seq_len`` (bytes, fp32)."""
    act = 4 * batch * seq_len * (8 * size.d_model + (2 * size.vocab if logits else 0))
    return int(act)


def reward_model_spec(
    name: str = "reward",
    size: str | TransformerSize = "tiny",
    *,
    seed: int = 0,
    dops: tuple[int, ...] = CELL_SIZES,
    workspace_bytes: int | None = 0,
    batch_hint: int = 8,
    seq_hint: int = 128,
) -> ServiceSpec:
    """The example reward-model service. ``workspace_bytes=None`` reserves an activation
    estimate for a batch of ``batch_hint`` sequences of ``seq_hint`` tokens."""
    shape = size_of(size)
    ws = (
        _workspace(shape, batch_hint, seq_hint, False)
        if workspace_bytes is None
        else workspace_bytes
    )
    return ServiceSpec(
        name=name,
        factory=lambda: build_model("RewardModel", shape, seed),
        call=score,
        dops=dops,
        workspace_bytes=ws,
        description=f"reward model {shape}",
    )


def teacher_spec(
    name: str = "teacher",
    size: str | TransformerSize = "tiny",
    *,
    seed: int = 1,
    dops: tuple[int, ...] = CELL_SIZES,
    workspace_bytes: int | None = 0,
    batch_hint: int = 8,
    seq_hint: int = 128,
) -> ServiceSpec:
    """The example teacher service (per-token log-probs)."""
    shape = size_of(size)
    ws = (
        _workspace(shape, batch_hint, seq_hint, True)
        if workspace_bytes is None
        else workspace_bytes
    )
    return ServiceSpec(
        name=name,
        factory=lambda: build_model("TeacherLM", shape, seed),
        call=token_logprobs,
        dops=dops,
        workspace_bytes=ws,
        description=f"teacher LM {shape}",
    )


def example_tokens(
    batch: int = 8, seq_len: int = 32, vocab: int = 512, seed: int = 0
) -> torch.Tensor:
    """Random token ids (batch, seq_len) from ``seed``, for calls to the example services."""
    import torch

    gen = torch.Generator().manual_seed(seed)
    return torch.randint(0, vocab, (batch, seq_len), generator=gen)


def scaled(size: str | TransformerSize, **changes: Any) -> TransformerSize:
    """``size`` with some fields changed (e.g. ``scaled("small", dtype="bfloat16")``)."""
    return replace(size_of(size), **changes)
