"""A result as plain JSON values: what the HTTP answers and the journal store of a GPU or API
call's value (tensors and numpy arrays as lists, tuples and sets as lists, non-finite floats
and anything else not JSON as its ``repr``)."""

from __future__ import annotations

import math
from collections.abc import Mapping
from typing import Any


def to_json(value: Any) -> Any:
    """``value`` as plain JSON values. One nested too deep to walk (a RecursionError, which its
    ``repr`` would raise too) becomes a string saying so: the outcome keeps the rest, and a
    client's answer is the same before and after a restart (the journal stores this)."""
    try:
        return _plain(value)
    except RecursionError:
        return f"<a {type(value).__name__} nested too deep to encode as JSON>"


def _plain(value: Any) -> Any:
    if value is None or isinstance(value, bool | int | str):
        return value
    if isinstance(value, float):
        return value if math.isfinite(value) else repr(value)
    if hasattr(value, "tolist") and callable(value.tolist):  # torch tensors, numpy arrays
        return _plain(value.tolist())
    if isinstance(value, Mapping):
        return {str(k): _plain(v) for k, v in value.items()}
    if isinstance(value, list | tuple | set | frozenset):
        return [_plain(v) for v in value]
    return repr(value)
