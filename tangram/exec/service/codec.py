"""JSON <-> Python values for GPU calls: nested number lists become tensors, tensors lists.

GPU services take tensors (token ids for the example reward model and teacher). Over HTTP a
client sends nested lists of numbers: ``decode_inputs`` turns a list (or each list value of
an object) into a tensor — integers give int64 token ids, any float gives float32 — and
leaves other values alone. ``to_json`` turns results back: tensors and numpy arrays become
lists, tuples lists, and anything else not JSON its ``repr``.
"""

from __future__ import annotations

import json
import math
from collections.abc import Mapping
from typing import Any

from tangram.exec.runtime.errors import BadRequest
from tangram.exec.runtime.plain import to_json

__all__ = ["NonFiniteNumber", "decode_inputs", "dumps", "non_finite_path", "to_json"]


class NonFiniteNumber(ValueError):
    """An answer held a NaN or an infinity, which JSON lacks (a bug: results pass through
    ``to_json``, which writes them as the strings ``"nan"``, ``"inf"``, ``"-inf"``)."""


def dumps(doc: Any) -> str:
    """``doc`` as strict JSON. Python's ``json.dumps`` writes a NaN or an infinity as
    ``NaN``/``Infinity``, which JSON lacks: a strict client (Go, Rust, JavaScript's
    ``JSON.parse``) refused the whole answer and Python's read a NaN. Such a number is
    ``NonFiniteNumber`` naming where it is (the service answers it as a 500;
    ``body.json_response`` writes every answer with it)."""
    try:
        return json.dumps(doc, allow_nan=False)
    except ValueError:
        where = non_finite_path(doc)
        if where is None:
            raise
        raise NonFiniteNumber(
            f"the answer holds {where[1]!r} at {where[0]}, a number JSON cannot carry"
        ) from None


#: A result with more numbers or items than this is encoded off the event loop
#: (``is_large``): a GPU call's 256 x 4096 floats took the loop 2.5 s per answer.
LARGE_ITEMS = 16_384


def is_large(value: Any, most: int = LARGE_ITEMS) -> bool:
    """Whether ``value`` holds more than ``most`` numbers or items: a tensor or an array by
    its size, lists, tuples and mappings by their lengths, walked no further than ``most``
    items (a list's scalars are counted by its length, never visited one by one)."""
    stack, count = [value], 0
    while stack and count <= most:
        item = stack.pop()
        if item is None or isinstance(item, str | int | float):
            continue  # (counted with its container)
        if isinstance(item, Mapping):
            count += len(item)
            stack.extend(item.values())
        elif isinstance(item, list | tuple | set | frozenset):
            count += len(item)
            if not set(map(type, item)) <= _SCALARS:
                stack.extend(item)
        elif callable(getattr(item, "tolist", None)):  # a tensor, an array
            size = getattr(item, "numel", None) or getattr(item, "size", 1)
            try:
                count += int(size() if callable(size) else size)
            except (TypeError, ValueError):
                count += 1
        else:
            count += 1
    return count > most


#: The types whose values ``is_large`` counts with their container.
_SCALARS = frozenset({int, float, str, bool, type(None)})


def non_finite_path(doc: Any) -> tuple[str, float] | None:
    """The path (``outcome.timings.exec_s``, ``scores[2]``; ``$`` for ``doc`` itself) and
    value of the first NaN or infinity in ``doc``, or None. A loop (nesting a few thousand
    deep raised ``RecursionError`` in a recursion), visiting each container once (a cycle,
    which ``json.dumps`` refuses too, ends the walk)."""
    stack: list[tuple[str, Any]] = [("", doc)]
    seen: set[int] = set()
    while stack:
        path, value = stack.pop()
        if isinstance(value, float) and not math.isfinite(value):
            return path or "$", value
        if not isinstance(value, Mapping | list | tuple) or id(value) in seen:
            continue
        seen.add(id(value))
        if isinstance(value, Mapping):
            items = [(f"{path}.{k}" if path else str(k), v) for k, v in value.items()]
        else:
            items = [(f"{path}[{i}]", v) for i, v in enumerate(value)]
        stack.extend(reversed(items))  # (the first in the document's order first)
    return None


#: The most numbers one GPU call's inputs may hold (1,048,576: e.g. 256 sequences of 4,096
#: tokens). A call's working memory grows with its inputs, and on a CPU-backed device it is
#: the service's own: 3,000 x 256 token ids (a 2.8 MB body) took a 2 GiB service down.
MAX_INPUT_NUMBERS = 1 << 20


def decode_inputs(value: Any) -> Any:
    """``value`` with each list (or list value of an object) as a tensor; ``BadRequest``
    naming ``inputs`` past ``MAX_INPUT_NUMBERS`` numbers (counted before any is converted)."""
    lists = [value] if isinstance(value, list) else []
    if isinstance(value, Mapping):
        lists = [v for v in value.values() if isinstance(v, list)]
    count = _numbers(lists, MAX_INPUT_NUMBERS)
    if count > MAX_INPUT_NUMBERS:
        raise BadRequest(
            f"field 'inputs': more than {MAX_INPUT_NUMBERS:,} numbers in one call; send "
            "the batch in smaller calls"
        )
    if isinstance(value, list):
        return _tensor(value)
    if isinstance(value, Mapping):
        return {k: _tensor(v) if isinstance(v, list) else v for k, v in value.items()}
    return value


def _numbers(lists: list[Any], most: int) -> int:
    """How many leaves the nested lists hold, counting no further than ``most`` + 1."""
    count, stack = 0, list(lists)
    while stack and count <= most:
        item = stack.pop()
        if isinstance(item, list):
            if item and not isinstance(item[0], list):
                count += len(item)  # a row of numbers (a ragged or mixed row is refused later)
                stack.extend(x for x in item if isinstance(x, list))
            else:
                stack.extend(item)
        else:
            count += 1
    return count


def _tensor(value: list[Any]) -> Any:
    import torch

    floats = _has_float(value)
    try:
        return torch.tensor(value, dtype=torch.float32 if floats else torch.long)
    except (TypeError, ValueError, RuntimeError, OverflowError) as exc:  # (10**400 among floats)
        raise BadRequest(
            f"field 'inputs': a list must be a rectangular array of numbers ({exc})"
        ) from None


def _has_float(value: Any) -> bool:
    """Whether a float is among the nested lists' leaves (a loop: recursing, lists nested a
    few hundred deep raised ``RecursionError``, a 500 instead of a bad request). Each list's
    item types are gathered at C speed (``set(map(type, ...))``): one Python step per number
    took 0.5 s for a million token ids."""
    stack = [value]
    while stack:
        item = stack.pop()
        if not isinstance(item, list):
            if isinstance(item, float):
                return True
            continue
        kinds = set(map(type, item))
        if any(issubclass(k, float) for k in kinds):
            return True
        if any(issubclass(k, list) for k in kinds):
            stack.extend(x for x in item if isinstance(x, list))
    return False
