"""JSON <-> Python values for GPU calls: nested number lists become tensors, tensors lists.

GPU services take tensors (token ids for the example reward model and teacher). Over HTTP a
client sends nested lists of numbers: ``decode_inputs`` turns a list (or each list value of
an object) into a tensor — integers give int64 token ids, any float gives float32 — and
leaves other values alone. ``to_json`` turns results back: tensors and numpy arrays become
lists, tuples lists, and anything else not JSON its ``repr``.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from tangram.exec.runtime.errors import BadRequest
from tangram.exec.runtime.plain import to_json

__all__ = ["decode_inputs", "to_json"]


def decode_inputs(value: Any) -> Any:
    if isinstance(value, list):
        return _tensor(value)
    if isinstance(value, Mapping):
        return {k: _tensor(v) if isinstance(v, list) else v for k, v in value.items()}
    return value


def _tensor(value: list[Any]) -> Any:
    import torch

    floats = _has_float(value)
    try:
        return torch.tensor(value, dtype=torch.float32 if floats else torch.long)
    except (TypeError, ValueError, RuntimeError) as exc:
        raise BadRequest(
            f"field 'inputs': a list must be a rectangular array of numbers ({exc})"
        ) from None


def _has_float(value: Any) -> bool:
    if isinstance(value, list):
        return any(_has_float(v) for v in value)
    return isinstance(value, float)
