"""The layer split of a sharded service: which tensors form a unit, how units are cut into k
contiguous shards of about equal bytes, and the hooks that move activations between shards.

A sharded service runs on a cell of k GPUs as one model whose layers are spread over them, as
``device_map`` does in Hugging Face Accelerate: the decoder layers (the children of the
module's largest ``nn.ModuleList``) are units, and so is every other module that holds tensors
directly (embeddings, final norm, heads). A unit is never split; shard i holds a contiguous run
of units, so each GPU holds about size/k bytes. Each unit gets a forward pre-hook that moves its
inputs to the device of its own weights, so activations follow the layers from GPU to GPU
(a no-op when all shards share one device, as CPU-backed devices do).

Pure but for ``install_hooks`` (which only registers hooks on a module); no torch import at
module import time.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING, Any

from tangram.exec.eoe.registry import like, like_mapping, on_path, walking

if TYPE_CHECKING:
    import torch


def layer_list(module: torch.nn.Module) -> str | None:
    """The name of the module's largest ``nn.ModuleList`` (its layers), or None."""
    import torch

    best: tuple[int, str] | None = None
    for name, sub in module.named_modules():
        if isinstance(sub, torch.nn.ModuleList) and len(sub) >= 2:  # noqa: SIM102
            if best is None or len(sub) > best[0]:
                best = (len(sub), name)
    return None if best is None else best[1]


def unit_of(tensor_name: str, layers: str | None) -> str:
    """The unit holding the tensor ``tensor_name``: its layer (``layers.i``) when it is inside
    the layer list, else the module that owns it directly ("" for the root)."""
    owner = tensor_name.rpartition(".")[0]
    if layers is not None:
        prefix = f"{layers}." if layers else ""
        if owner.startswith(prefix) and owner != layers:
            return prefix + owner[len(prefix) :].split(".")[0]
    return owner


def unit_order(module: torch.nn.Module) -> dict[str, int]:
    """Every module name's rank in the module's registration order (the units' order)."""
    return {name: i for i, (name, _) in enumerate(module.named_modules())}


def cut(sizes: Sequence[int], parts: int) -> tuple[int, ...]:
    """Where to cut ``sizes`` (bytes of each unit, in order) into ``parts`` non-empty contiguous
    runs with the smallest largest run: the index of each run's first unit (the first is 0).

    ``ValueError`` if there are fewer units than parts.
    """
    n = len(sizes)
    if parts < 1:
        raise ValueError(f"parts must be >= 1, got {parts}")
    if n < parts:
        raise ValueError(f"{n} units cannot be cut into {parts} non-empty shards")
    prefix = [0]
    for s in sizes:
        prefix.append(prefix[-1] + s)
    inf = float("inf")
    # best[p][i]: the smallest largest run cutting units[:i] into p runs; back[p][i]: last cut.
    best = [[inf] * (n + 1) for _ in range(parts + 1)]
    back = [[0] * (n + 1) for _ in range(parts + 1)]
    best[0][0] = 0
    for p in range(1, parts + 1):
        for i in range(p, n - (parts - p) + 1):
            for j in range(p - 1, i):
                value = max(best[p - 1][j], prefix[i] - prefix[j])
                if value < best[p][i]:
                    best[p][i], back[p][i] = value, j
    starts = []
    i = n
    for p in range(parts, 0, -1):
        i = back[p][i]
        starts.append(i)
    return tuple(reversed(starts))


def _device_of(module: torch.nn.Module) -> Any:
    for tensor in module.parameters():
        return tensor.device
    for tensor in module.buffers():
        return tensor.device
    return None


def _move_to(value: Any, device: Any, path: set[int]) -> Any:
    """``value`` with its tensors on ``device``; ``path``: the ids of the containers being
    walked (``UnmappableValueError`` for one that contains itself)."""
    import torch

    if isinstance(value, torch.Tensor):
        return value if value.device == device else value.to(device, non_blocking=True)
    if not isinstance(value, tuple | list | Mapping):
        return value
    with on_path(value, path):
        if isinstance(value, tuple):
            return like(value, [_move_to(v, device, path) for v in value])
        if isinstance(value, list):
            return [_move_to(v, device, path) for v in value]
        return like_mapping(value, {k: _move_to(v, device, path) for k, v in value.items()})


def _to_own_device(module: torch.nn.Module, args: tuple, kwargs: dict) -> tuple[tuple, dict]:
    """Forward pre-hook: the unit's inputs on the device of its weights. Inputs holding a
    list, tuple or mapping that contains itself, or nested past Python's recursion limit, are
    refused naming that (``UnmappableValueError``): they were walked until a bare
    ``RecursionError``."""
    device = _device_of(module)
    if device is None or device.type == "meta":
        return args, kwargs
    with walking():
        return _move_to(args, device, set()), _move_to(kwargs, device, set())


def install_hooks(module: torch.nn.Module, units: Sequence[str]) -> None:
    """Give each unit of ``module`` the pre-hook that moves its inputs to its weights' device."""
    for name in dict.fromkeys(units):
        module.get_submodule(name).register_forward_pre_hook(_to_own_device, with_kwargs=True)
