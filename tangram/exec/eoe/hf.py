"""EOE services from local Hugging Face model directories: a causal LM as a teacher (per-token
log-probs of given sequences) and a sequence-classification model as a reward model (a score
per sequence), loaded with ``transformers`` from local files only (no hub at run time).

``hf_service(name, path, kind)`` gives an ``HfService``: its ``spec`` (register it with an
``EoeManager``) and its tokenizer, which front ends (the OpenAI-style routes) use to turn text
into token ids. At registration the model is built from the directory's config with its
parameters on the ``meta`` device (buffers such as rotary tables are computed as usual; the
persistent buffers the checkpoint holds are read from it, as ``from_pretrained`` does), and
the host backup reads each parameter straight from the safetensors files into its place
(``backup.LazyWeights``): the weights are held once on the host, not twice. A checkpoint whose
names do not cover every parameter (renamed keys, a head it lacks) is loaded with
``from_pretrained(path, local_files_only=True)`` instead. Restores copy from the backup.

Inputs of both kinds: a LongTensor of token ids (B, T), or a mapping (a dict, or the
tokenizer's own ``BatchEncoding``) with ``input_ids`` and ``attention_mask`` (B, T) for a
right-padded batch of different lengths; a teacher's dict may
add ``top_k`` (a LongTensor (B,) repeating one k) for the k most likely tokens at each position.
Outputs: the teacher's ``{"token_logprobs": (B, T-1)}`` (log p(token[t+1] | tokens[:t+1]),
float32; plus ``top_ids``/``top_logprobs`` (B, T-1, k) when asked), the reward model's scores
(B,) float32. Tensors batch on dim 0, so data-parallel replicas split and merge them.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Iterator, Mapping
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from tangram.exec.eoe.backup import LazyWeights
from tangram.exec.eoe.errors import ServiceSpecError
from tangram.exec.eoe.registry import ServiceSpec

if TYPE_CHECKING:
    import torch

TEACHER = "teacher"
REWARD = "reward"


def _as_batch(module: torch.nn.Module, inputs: Any) -> tuple[torch.Tensor, torch.Tensor | None]:
    """(input_ids, attention_mask or None) from a tensor or a mapping (a dict, the tokenizer's
    ``BatchEncoding``), checked against the model (``ValueError`` naming the member): the ids a 2-D integer array within its vocabulary, the
    mask of their shape. A raw GPU action's inputs come as the client wrote them: an id past
    the vocabulary was looked up anyway (on a CUDA device a device-side assert, after which the
    process's calls all fail), and a mask of another shape gave a result computed on it."""
    import torch

    ids, mask = inputs, None
    if isinstance(inputs, Mapping):
        if "input_ids" not in inputs:
            raise ValueError("inputs must have 'input_ids'")
        ids, mask = inputs["input_ids"], inputs.get("attention_mask")
    if (
        not isinstance(ids, torch.Tensor)
        or ids.ndim != 2
        or ids.is_floating_point()
        or ids.is_complex()
        or ids.dtype == torch.bool
    ):
        raise ValueError(
            "'input_ids' must be a 2-D array of integer token ids (batch, tokens), got "
            f"{_described(ids)}"
        )
    # Integer ids of any width (uint8, int16...): the embedding takes int64 (torch's words
    # were 'Expected tensor for argument #1 'indices' to have one of ... Long, Int').
    ids = ids.long()
    if not ids.shape[0] or not ids.shape[1]:  # torch's words were 'cannot reshape ...'
        raise ValueError(
            "'input_ids' must hold at least one sequence of at least one token, got shape "
            f"{tuple(ids.shape)}"
        )
    longest = getattr(getattr(module, "config", None), "max_position_embeddings", None)
    if isinstance(longest, int) and ids.shape[1] > longest:
        # A Llama extrapolated its positions silently; learned positions were looked up past
        # their table (on a CUDA device, a device-side assert).
        raise ValueError(
            f"'input_ids' holds {ids.shape[1]} tokens per sequence; the model takes at most "
            f"{longest} (max_position_embeddings)"
        )
    vocab = module.get_input_embeddings().num_embeddings
    if ids.numel() and (int(ids.min()) < 0 or int(ids.max()) >= vocab):
        raise ValueError(f"'input_ids' has token ids outside the model's vocabulary [0, {vocab})")
    if mask is not None and (not isinstance(mask, torch.Tensor) or mask.shape != ids.shape):
        raise ValueError(
            f"'attention_mask' must have the shape of 'input_ids' {tuple(ids.shape)}, got "
            f"{_described(mask)}"
        )
    if mask is not None:  # else a result computed on such a mask came back without a word
        if not bool(((mask == 0) | (mask == 1)).all()):
            raise ValueError("'attention_mask' must hold 0 or 1 for each token")
        empty = (~(mask != 0).any(dim=1)).nonzero().flatten().tolist()
        if empty:
            raise ValueError(f"'attention_mask' marks no real token in sequence(s) {empty[:8]}")
    return ids, mask


def _described(value: Any) -> str:
    """A value's kind, shape and dtype for an error message (not its contents)."""
    shape = getattr(value, "shape", None)
    dtype = getattr(value, "dtype", None)
    kind = type(value).__name__ if dtype is None else f"{type(value).__name__} of {dtype}"
    return kind if shape is None else f"{kind} {tuple(shape)}"


def teacher_logprobs(module: torch.nn.Module, inputs: Any) -> dict[str, torch.Tensor]:
    """Call function of a causal LM: each next token's log-prob (and the top k when asked)."""
    import torch

    ids, mask = _as_batch(module, inputs)
    top_k = inputs.get("top_k") if isinstance(inputs, Mapping) else None
    if top_k is not None:
        if (
            not isinstance(top_k, torch.Tensor)
            or top_k.is_floating_point()
            or top_k.is_complex()
            or top_k.dtype == torch.bool
        ):
            raise ValueError(
                f"'top_k' must be a tensor of integer counts (B,), got {_described(top_k)}"
            )
        # One k for the batch: cut with it across replicas, different counts (or a length
        # other than the batch's) gave pieces that do not merge, or merged without the top.
        batch = ids.shape[0]
        if (
            top_k.ndim > 1
            or (top_k.ndim == 1 and top_k.shape[0] != batch)
            or (top_k.numel() and bool((top_k != top_k.reshape(-1)[0]).any()))
        ):
            raise ValueError(
                f"'top_k' must repeat one k for each of the {batch} sequences, shape "
                f"({batch},); got {_described(top_k)} of counts {sorted(set(top_k.flatten().tolist()))[:8]}"
            )
    logits = module(input_ids=ids, attention_mask=mask, use_cache=False).logits
    logp = torch.log_softmax(logits[:, :-1].float(), dim=-1)
    out = {"token_logprobs": logp.gather(-1, ids[:, 1:].unsqueeze(-1)).squeeze(-1)}
    if top_k is not None:
        vocab = logp.shape[-1]
        if top_k.numel() and (int(top_k.min()) < 0 or int(top_k.max()) > vocab):
            raise ValueError(f"'top_k' must be counts in [0, {vocab}] (the vocabulary)")
    if top_k is not None and top_k.numel() and int(top_k.max()) > 0:
        values, indices = logp.topk(int(top_k.max()), dim=-1)
        out["top_logprobs"], out["top_ids"] = values, indices
    return out


def reward_scores(module: torch.nn.Module, inputs: Any) -> torch.Tensor:
    """Call function of a one-label sequence classifier: its score per sequence, (B,) float32.

    Each sequence is scored at its last token the attention mask marks as real (without a
    mask, every token is real: its last token, even when it is the pad id). (Left to
    ``transformers``, the token is found from the config's ``pad_token_id``: a prompt that
    ends in that id, as OpenRLHF's queries end in EOS where pad = EOS, was scored before it.)
    The classifier's head (``score``) is applied to the base model's hidden state there; a
    model without that layout is scored by ``transformers`` as before."""
    import torch

    ids, mask = _as_batch(module, inputs)
    if mask is None:  # ids sent without a mask are all real tokens, the pad id's too
        mask = torch.ones_like(ids)
    base, head = getattr(module, "base_model", None), getattr(module, "score", None)
    if base is None or base is module or not callable(head):
        return module(input_ids=ids, attention_mask=mask, use_cache=False).logits[:, 0].float()
    hidden = base(input_ids=ids, attention_mask=mask, use_cache=False).last_hidden_state
    positions = torch.arange(ids.shape[1], device=mask.device)
    last = (positions * (mask != 0)).argmax(dim=-1)  # the rightmost real token
    rows = torch.arange(ids.shape[0], device=hidden.device)
    return head(hidden[rows, last.to(hidden.device)])[:, 0].float()


@dataclass(frozen=True)
class Kind:
    """What a kind of model directory is loaded as, and how it is called."""

    auto_class: str
    call: Callable[[Any, Any], Any]


#: The kinds of service a model directory can be, by name.
KINDS: dict[str, Kind] = {
    TEACHER: Kind("AutoModelForCausalLM", teacher_logprobs),
    REWARD: Kind("AutoModelForSequenceClassification", reward_scores),
}


@dataclass(frozen=True)
class HfService:
    """A model directory as an EOE service: the ``spec`` to register and what front ends need."""

    spec: ServiceSpec
    kind: str
    path: Path
    tokenizer: Any
    vocab_size: int
    #: The longest sequence the model takes (its config's ``max_position_embeddings``).
    max_len: int
    pad_token_id: int


def _check_dir(path: Path) -> None:
    if not path.is_dir():
        raise ServiceSpecError(f"model directory {str(path)!r} does not exist")
    if not (path / "config.json").is_file():
        raise ServiceSpecError(f"model directory {str(path)!r} has no config.json")
    if not any(path.glob("*.safetensors")):
        raise ServiceSpecError(f"model directory {str(path)!r} has no *.safetensors weights")


def _quiet() -> None:
    """No progress bars from ``transformers`` (its loading bar would go to the server's log)."""
    from transformers.utils import logging as hf_logging

    hf_logging.disable_progress_bar()


def load_model(path: str | Path, kind: str, dtype: str | None = None) -> torch.nn.Module:
    """The model in ``path`` as ``kind``, from local files only, in eval mode without grads."""
    import torch
    import transformers

    _quiet()
    auto = getattr(transformers, KINDS[kind].auto_class)
    kwargs: dict[str, Any] = {"local_files_only": True}
    if dtype is not None:
        kwargs["dtype"] = getattr(torch, dtype)
    model = auto.from_pretrained(str(path), **kwargs).eval()
    model.requires_grad_(False)
    return model


#: ``_parameters_on_meta``'s patch of ``nn.Module.register_parameter``: installed while any
#: thread builds without weights, acting only in those threads.
_meta_lock = threading.Lock()
_meta_users = 0
_meta_here = threading.local()
_register: Any = None


def _register_on_meta(module: torch.nn.Module, name: str, param: Any) -> None:
    import torch

    _register(module, name, param)
    if (
        getattr(_meta_here, "depth", 0)
        and param is not None
        and param.device.type != "meta"  # a tied one is kept as it is
    ):
        kept = module._parameters[name]
        module._parameters[name] = torch.nn.Parameter(kept.to("meta"), requires_grad=False)


@contextmanager
def _parameters_on_meta() -> Iterator[None]:
    """Modules built inside, in this thread, get their parameters on the ``meta`` device (no
    data), buffers as usual: each parameter is moved there as it is registered. (The patch is
    the process's: other threads' modules are left alone, and it goes once the last build
    that needs it ends, in whatever order builds end.)"""
    import torch

    global _meta_users, _register
    with _meta_lock:
        if _meta_users == 0:
            _register = torch.nn.Module.register_parameter
            torch.nn.Module.register_parameter = _register_on_meta  # type: ignore[method-assign]
        _meta_users += 1
    _meta_here.depth = getattr(_meta_here, "depth", 0) + 1
    try:
        yield
    finally:
        _meta_here.depth -= 1
        with _meta_lock:
            _meta_users -= 1
            if _meta_users == 0:
                torch.nn.Module.register_parameter = _register  # type: ignore[method-assign]


def load_lazy(path: str | Path, kind: str, dtype: str | None = None) -> LazyWeights | None:
    """The model in ``path`` without its weights and a reader of them from the safetensors
    files (each parameter in its file's dtype, or ``dtype``); None when the files do not name
    every parameter (``from_pretrained`` knows how to map or initialise those). Persistent
    buffers the files hold are loaded now (``_load_buffers``), as ``from_pretrained`` loads
    them."""
    import torch
    import transformers
    from safetensors import safe_open

    _quiet()
    path = Path(path)
    files = {}
    for file in sorted(path.glob("*.safetensors")):
        with safe_open(str(file), framework="pt") as f:
            files.update({key: file for key in f.keys()})  # noqa: SIM118 (not a dict)
    config = transformers.AutoConfig.from_pretrained(str(path), local_files_only=True)
    auto = getattr(transformers, KINDS[kind].auto_class)
    with _parameters_on_meta():
        model = auto.from_config(config)
    model.eval().requires_grad_(False)
    names: dict[int, list[str]] = {}
    owners: dict[int, list[tuple[torch.nn.Module, str]]] = {}
    for name, param in model.named_parameters(remove_duplicate=False):
        names.setdefault(id(param), []).append(name)
        owner, _, leaf = name.rpartition(".")
        owners.setdefault(id(param), []).append((model.get_submodule(owner), leaf))
    want = getattr(torch, dtype) if dtype is not None else None
    for key, aliases in names.items():
        found = next((n for n in aliases if n in files), None)
        if found is None:
            return None
        with safe_open(str(files[found]), framework="pt") as f:
            stored = f.get_slice(found).get_dtype()
        param_dtype = want or getattr(torch, _SAFETENSORS_DTYPES.get(stored, ""), None)
        if param_dtype is None:
            return None
        places = owners[key]
        shape = places[0][0]._parameters[places[0][1]].shape
        meta = torch.nn.Parameter(torch.empty(shape, dtype=param_dtype, device="meta"), False)
        for owner, leaf in places:  # tied names keep one parameter
            owner._parameters[leaf] = meta
    if not _load_buffers(model, files, want):
        return None

    def read(aliases: tuple[str, ...]) -> torch.Tensor:
        name = next(n for n in aliases if n in files)
        with safe_open(str(files[name]), framework="pt") as f:
            tensor = f.get_tensor(name)
        return tensor if want is None else tensor.to(want)

    return LazyWeights(model, read)


def _load_buffers(model: torch.nn.Module, files: dict[str, Path], want: Any) -> bool:
    """Put each persistent buffer the safetensors ``files`` hold into ``model`` (in the file's
    dtype, or ``want`` for a floating one); those the files lack keep their built value, as
    with ``from_pretrained``. Only parameters were read: a checkpoint's trained buffer (a
    scale, running statistics) kept the value the model is built with, so the service
    answered differently from the model ``from_pretrained`` gives. False (load it with
    ``from_pretrained``) when a stored buffer's shape is not the model's."""
    from safetensors import safe_open

    aliases: dict[int, list[tuple[str, torch.nn.Module, str]]] = {}
    shapes: dict[int, tuple[int, ...]] = {}
    for name, buffer in model.named_buffers(remove_duplicate=False):
        owner_name, _, leaf = name.rpartition(".")
        owner = model.get_submodule(owner_name) if owner_name else model
        if buffer is not None and leaf not in owner._non_persistent_buffers_set:
            aliases.setdefault(id(buffer), []).append((name, owner, leaf))
            shapes[id(buffer)] = tuple(buffer.shape)
    for key, places in aliases.items():
        found = next((name for name, _, _ in places if name in files), None)
        if found is None:
            continue
        with safe_open(str(files[found]), framework="pt") as f:
            stored = f.get_tensor(found)
        if tuple(stored.shape) != shapes[key]:
            return False
        if want is not None and stored.is_floating_point():
            stored = stored.to(want)
        for _, owner, leaf in places:  # tied names keep one buffer
            owner._buffers[leaf] = stored
    return True


#: The dtypes a model directory may be loaded in (``hf_service(dtype=...)``): floating ones.
DTYPES = ("float32", "bfloat16", "float16", "float64")

#: safetensors' dtype names -> torch's.
_SAFETENSORS_DTYPES = {
    "F64": "float64",
    "F32": "float32",
    "F16": "float16",
    "BF16": "bfloat16",
}


def _load(path: Path, kind: str, dtype: str | None) -> Any:
    """The factory of a directory service: lazily from the safetensors, else ``from_pretrained``."""
    return load_lazy(path, kind, dtype) or load_model(path, kind, dtype)


def hf_service(
    name: str,
    path: str | Path,
    kind: str,
    *,
    shards: int = 1,
    dops: tuple[int, ...] | None = None,
    dtype: str | None = None,
    workspace_bytes: int = 0,
) -> HfService:
    """The model directory ``path`` (config.json, safetensors weights, tokenizer) as a
    ``kind`` service ("teacher" or "reward") named ``name``.

    ``shards`` > 1 splits it by layers over a cell of that many GPUs (``dops`` is then that
    cell size); otherwise ``dops`` (default (1, 2)) are data-parallel replicas. ``dtype``
    ("bfloat16", ...) overrides the checkpoint's. The tokenizer and config are read now; the
    weights when the service is registered. ``ServiceSpecError`` names what is missing.
    """
    from transformers import AutoConfig, AutoTokenizer

    if kind not in KINDS:
        raise ServiceSpecError(f"kind must be one of {sorted(KINDS)}, got {kind!r}")
    if dtype is not None and dtype not in DTYPES:
        # 'int8' registered (the weights cast to it) and every call failed in torch;
        # 'bf16' or 'cuda' failed at register as the factory's AttributeError or TypeError.
        raise ServiceSpecError(f"dtype must be one of {DTYPES} or None, got {dtype!r}")
    path = Path(path)
    _check_dir(path)
    _quiet()
    try:
        config = AutoConfig.from_pretrained(str(path), local_files_only=True)
        tokenizer = AutoTokenizer.from_pretrained(str(path), local_files_only=True)
    except (OSError, ValueError) as exc:
        raise ServiceSpecError(f"model directory {str(path)!r}: {exc}") from exc
    pad = config.pad_token_id if config.pad_token_id is not None else tokenizer.pad_token_id
    if kind == REWARD and (pad is None or getattr(config, "num_labels", 1) != 1):
        raise ServiceSpecError(
            f"reward model {str(path)!r} needs num_labels=1 and a pad_token_id (config or "
            "tokenizer) to find each sequence's last token"
        )
    spec = ServiceSpec(
        name=name,
        factory=lambda: _load(path, kind, dtype),
        call=KINDS[kind].call,
        dops=dops if dops is not None else ((shards,) if shards > 1 else (1, 2)),
        workspace_bytes=workspace_bytes,
        shards=shards,
        description=f"{kind} from {path}",
    )
    service = HfService(
        spec=spec,
        kind=kind,
        path=path,
        tokenizer=tokenizer,
        vocab_size=int(config.vocab_size),
        max_len=int(getattr(config, "max_position_embeddings", 1 << 30)),
        pad_token_id=int(pad if pad is not None else 0),
    )
    object.__setattr__(spec, "frontend", service)  # the spec tells front ends how to speak to it
    return service


def service_from_arg(text: str) -> HfService:
    """``NAME=KIND[/SHARDS]:PATH`` (``tangram serve --model``) as a service, split in SHARDS
    layer shards when given; ``ValueError`` naming the expected form."""
    name, sep, rest = text.partition("=")
    kind, colon, path = rest.partition(":")
    kind, slash, shards = kind.partition("/")
    form = f"expected NAME=KIND[/SHARDS]:PATH, KIND one of {sorted(KINDS)}, SHARDS 2, 4 or 8"
    if not sep or not name or not kind or not colon or not path:
        raise ValueError(f"--model {text!r}: {form}")
    if slash and not (shards.isascii() and shards.isdigit()):  # ("²" is a digit to isdigit)
        raise ValueError(f"--model {text!r}: {form}")
    return hf_service(name, path, kind, shards=int(shards) if slash else 1)
