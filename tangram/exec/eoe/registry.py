"""The service registry: what a GPU service is (``ServiceSpec``) and the named set of them.

A service is a factory that builds a torch module, a call function that runs one request on
a built module (score a batch, return per-token log-probs, ...), the DoPs it supports and its
memory need. For a call at DoP k the executor runs k data-parallel replicas, one per GPU of the
cell: ``split`` cuts the inputs into k parts along the batch dimension and ``merge`` joins the
k results (defaults: ``split_batch`` and ``merge_batch``, for tensors and tuples/lists/mappings
of tensors batched on dim 0).

No torch import happens at module import time, so ``tangram --help`` works without torch.
"""

from __future__ import annotations

import contextlib
import copy
import dataclasses
import functools
import numbers
import re
import threading
import types
from collections import defaultdict
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from tangram.core.cells import CELL_SIZES
from tangram.exec.eoe.errors import (
    DuplicateServiceError,
    ServiceSpecError,
    UnknownServiceError,
    shown,
    told,
)

if TYPE_CHECKING:
    import torch

#: Who moves a service's weights (see ``ServiceSpec.backend``).
BACKENDS = ("copies", "engine")
_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.:/@+-]*$")


@dataclass(frozen=True)
class ServiceSpec:
    """A GPU service: how to build it, how to call it, what it needs.

    ``factory()`` builds the module on the host (random init with a fixed seed, or loading a
    checkpoint); it is called once, at registration. All of the module's state must live in its
    parameters and buffers (what ``Module.to`` moves), because only those are backed up.
    ``call(module, inputs)`` runs one request on a replica whose weights are on the call's
    device; ``inputs`` arrive already moved to that device (the replica's own copies), and
    tensors in the result are copied back to the host by the executor.
    """

    name: str
    factory: Callable[[], torch.nn.Module]
    call: Callable[[torch.nn.Module, Any], Any]
    #: DoPs (cell sizes) the service may run at; a call at DoP k runs k replicas.
    dops: tuple[int, ...] = (1,)
    #: Declared bytes of resident state per GPU; None means "measured from the module".
    #: If given it must be at least the measured size (it may be larger, e.g. for caches).
    memory_bytes: int | None = None
    #: Extra bytes per GPU reserved while a call runs (activations, temporary buffers).
    workspace_bytes: int = 0
    #: Cut inputs into k parts for k replicas; default ``split_batch``.
    split: Callable[[Any, int], list[Any]] | None = None
    #: Join the parts' results in order; default ``merge_batch``.
    merge: Callable[[list[Any]], Any] | None = None
    description: str = ""
    #: 1: data-parallel replicas (each GPU of a cell holds the whole model). k > 1: the model
    #: is split by layers into k shards (``sharding``), one per GPU of a k-GPU cell, so each
    #: holds about size/k; ``dops`` is then (k,).
    shards: int = 1
    #: What front ends need to speak to the service in text (for a model directory, its
    #: ``hf.HfService``: kind, tokenizer, limits); None for services called with tensors only.
    frontend: Any = field(default=None, compare=False, repr=False)
    #: Who moves the weights: "copies" (Tangram's host backup, restored by copies) or "engine"
    #: (``factory()`` builds an ``engine.Engine`` that sleeps and wakes itself, on GPU ``home``).
    backend: str = "copies"
    #: The one GPU an engine service runs on (its engine lives there); None for copies.
    home: int | None = None

    def __post_init__(self) -> None:
        if not isinstance(self.name, str) or not _NAME.match(self.name):
            raise ServiceSpecError(
                f"service name {shown(self.name)} is invalid: use letters, digits and _.:/@+-, "
                "starting with a letter or digit"
            )
        if not callable(self.factory):
            raise ServiceSpecError(f"service {self.name!r}: factory must be callable")
        if not callable(self.call):
            raise ServiceSpecError(f"service {self.name!r}: call must be callable")
        for field_name in ("split", "merge"):  # (else every call at DoP > 1 failed on it)
            value = getattr(self, field_name)
            if value is not None and not callable(value):
                raise ServiceSpecError(
                    f"service {self.name!r}: {field_name} must be callable or None, got {shown(value)}"[
                        :300
                    ]
                )
        if not isinstance(self.dops, tuple | list | set | frozenset | range):
            # dops=2 was a bare TypeError ('int' object is not iterable); {1: 1} was (1,).
            raise ServiceSpecError(
                f"service {self.name!r}: dops must be a tuple of DoPs (cell sizes from "
                f"{CELL_SIZES}), got {shown(self.dops)}"
            )
        object.__setattr__(self, "dops", tuple(self.dops))
        if self.backend not in BACKENDS:
            raise ServiceSpecError(
                f"service {self.name!r}: backend must be one of {BACKENDS}, got {shown(self.backend)}"
            )
        if (self.backend == "engine") != (self.home is not None):
            raise ServiceSpecError(
                f"service {self.name!r}: an engine service names its GPU (home), a service "
                "restored by copies does not"
            )
        if self.home is not None:
            self._check_home()
        if self.backend == "engine" and (
            tuple(self.dops) != (1,) or self.shards != 1 or self.memory_bytes is None
        ):
            raise ServiceSpecError(
                f"service {self.name!r}: an engine service runs at DoP 1 on its home GPU, "
                "unsharded, and declares memory_bytes (its engine allocates that memory)"
            )
        if not _whole(self.shards) or self.shards not in CELL_SIZES:
            raise ServiceSpecError(
                f"service {self.name!r}: shards must be one of {CELL_SIZES}, got {shown(self.shards)}"
            )
        if self.shards > 1 and tuple(self.dops) == (1,):
            object.__setattr__(self, "dops", (self.shards,))  # the default: its one cell size
        dops = tuple(self.dops)
        if self.shards > 1 and dops != (self.shards,):
            raise ServiceSpecError(
                f"service {self.name!r}: a service split into {self.shards} shards runs on "
                f"cells of {self.shards} GPUs only: dops must be ({self.shards},), got {shown(dops)}"
            )
        if (
            not dops
            or any(not _whole(d) or d not in CELL_SIZES for d in dops)
            or len(set(dops)) != len(dops)
        ):
            raise ServiceSpecError(
                f"service {self.name!r}: dops must be distinct whole numbers from "
                f"{CELL_SIZES}, got {shown(self.dops)}"
            )
        object.__setattr__(self, "dops", tuple(sorted(dops)))
        if self.memory_bytes is not None and (
            not _whole(self.memory_bytes) or self.memory_bytes < 0
        ):
            raise ServiceSpecError(
                f"service {self.name!r}: memory_bytes must be a non-negative int or None, "
                f"got {shown(self.memory_bytes)}"
            )
        if not _whole(self.workspace_bytes) or self.workspace_bytes < 0:
            raise ServiceSpecError(
                f"service {self.name!r}: workspace_bytes must be a non-negative int, "
                f"got {shown(self.workspace_bytes)}"
            )

    def _check_home(self) -> None:
        """``home`` is a GPU index: a whole number >= 0 (numpy's too), kept as an int. -1 ran
        on the last GPU's books by Python's negative indexing, True on GPU 1, '0' failed
        registration with a bare TypeError."""
        home = self.home
        if isinstance(home, bool) or not isinstance(home, numbers.Integral) or home < 0:
            raise ServiceSpecError(
                f"service {self.name!r}: home must be a GPU index (an int >= 0), got {shown(home)}"
            )
        object.__setattr__(self, "home", int(home))

    def split_inputs(self, inputs: Any, parts: int) -> list[Any]:
        return (self.split or split_batch)(inputs, parts)

    def merge_outputs(self, outputs: list[Any]) -> Any:
        return (self.merge or merge_batch)(outputs)


def _whole(value: object) -> bool:
    """True for an int that is no bool: True passed as 1 (and 2.0 as 2 where only 'in
    CELL_SIZES' was asked), giving a service of DoPs (True,) or a workspace of True bytes."""
    return isinstance(value, int) and not isinstance(value, bool)


class ServiceRegistry:
    """A thread-safe map of service name to ``ServiceSpec``; names are unique."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._specs: dict[str, ServiceSpec] = {}

    def add(self, spec: ServiceSpec) -> None:
        if not isinstance(spec, ServiceSpec):
            raise ServiceSpecError(f"expected a ServiceSpec, got {type(spec).__name__}")
        with self._lock:
            if spec.name in self._specs:
                raise DuplicateServiceError(f"service {spec.name!r} is already registered")
            self._specs[spec.name] = spec

    def remove(self, name: str) -> ServiceSpec:
        with self._lock:
            try:
                return self._specs.pop(name)
            except KeyError:
                raise UnknownServiceError(self._unknown(name)) from None

    def get(self, name: str) -> ServiceSpec:
        with self._lock:
            try:
                return self._specs[name]
            except KeyError:
                raise UnknownServiceError(self._unknown(name)) from None

    def _unknown(self, name: str) -> str:
        known = ", ".join(sorted(self._specs)) or "none"
        return f"unknown service {shown(name)} (registered: {known})"

    def names(self) -> tuple[str, ...]:
        with self._lock:
            return tuple(sorted(self._specs))

    def __contains__(self, name: object) -> bool:
        with self._lock:
            return name in self._specs

    def __iter__(self) -> Iterator[ServiceSpec]:
        with self._lock:
            return iter(list(self._specs.values()))

    def __len__(self) -> int:
        with self._lock:
            return len(self._specs)


# --- data-parallel split and merge -------------------------------------------------------------


def _batch_len(inputs: Any, path: set[int] | None = None) -> int | None:
    """The batch size along dim 0, or None for a value without one (a string, a number,
    None, a 0-dimensional tensor): such a member of a structure goes to every piece whole.
    ``TypeError`` when a structure's batched members disagree; ``UnmappableValueError`` for
    a tuple or mapping that contains itself (``path``: the ids of those being walked), which
    was walked until Python's recursion limit."""
    import torch

    if isinstance(inputs, torch.Tensor):
        return int(inputs.shape[0]) if inputs.dim() > 0 else None
    if isinstance(inputs, list):
        return len(inputs)
    if isinstance(inputs, tuple):
        members = list(inputs)
    elif isinstance(inputs, Mapping):
        members = list(inputs.values())
    else:
        return None
    path = set() if path is None else path
    with on_path(inputs, path):
        # (map, as before: a generator here was one more frame per level of nesting)
        lens = {n for n in map(functools.partial(_batch_len, path=path), members) if n is not None}
    if len(lens) > 1:
        raise TypeError(f"the parts of the inputs have different batch sizes {sorted(lens)}")
    return lens.pop() if lens else None


def batch_problem(inputs: Any) -> str | None:
    """Why ``inputs`` cannot be cut for data-parallel replicas (None: they can, or they go
    whole): asked at admission, so a call's outcome does not depend on the cell it gets."""
    try:
        with walking():
            _batch_len(inputs)
    except TypeError as exc:  # ("the parts of the inputs have different batch sizes [..]")
        return str(exc)
    except UnmappableValueError as exc:  # (a RecursionError left admission)
        return _about_the_inputs(str(exc))
    return None


def _about_the_inputs(problem: str) -> str:
    """``problem`` (an ``UnmappableValueError``'s "it holds ..." / "it is ...", "it" the
    value being walked) said of the inputs, for a refusal that names them: a bare "it"
    after the service's name named nothing."""
    for said, of_inputs in (("it holds ", "they hold "), ("it is ", "they are ")):
        if problem.startswith(said):
            return of_inputs + problem[len(said) :]
    return problem


@contextlib.contextmanager
def walking() -> Iterator[None]:
    """Turn a ``RecursionError`` in the block (a value nested past Python's recursion limit)
    into ``UnmappableValueError`` saying so: a bare one read as the service's own failure."""
    try:
        yield
    except RecursionError:
        raise UnmappableValueError(
            "it is nested too deeply to walk (Python's recursion limit)"
        ) from None


@contextlib.contextmanager
def on_path(value: Any, path: set[int]) -> Iterator[None]:
    """Walk into ``value`` (a container) with ``path`` holding the ids of those being walked:
    ``UnmappableValueError`` at once if it is one of them (it contains itself), rather than
    recursing until Python's limit. One reached twice side by side is no cycle."""
    if id(value) in path:
        raise UnmappableValueError(f"it holds a {type(value).__name__} that contains itself")
    path.add(id(value))
    try:
        yield
    finally:
        path.discard(id(value))


def _split(inputs: Any, bounds: list[tuple[int, int]]) -> list[Any]:
    import torch

    if _batch_len(inputs) is None:
        return [inputs] * len(bounds)  # no batch dimension: each piece gets it whole
    if isinstance(inputs, torch.Tensor):
        return [inputs[a:b] for a, b in bounds]
    if isinstance(inputs, list):
        return [inputs[a:b] for a, b in bounds]
    if isinstance(inputs, tuple):
        columns = [_split(x, bounds) for x in inputs]
        return [like(inputs, [col[i] for col in columns]) for i in range(len(bounds))]
    columns_d = {k: _split(v, bounds) for k, v in inputs.items()}
    return [
        like_mapping(inputs, {k: v[i] for k, v in columns_d.items()}) for i in range(len(bounds))
    ]


def split_batch(inputs: Any, parts: int) -> list[Any]:
    """Cut ``inputs`` into at most ``parts`` contiguous pieces along dim 0, in order.

    A tensor is cut on dim 0; a list is a sequence of samples (cut by slicing, so samples may
    differ in length); a tuple or mapping (a dict, a tokenizer's ``BatchEncoding``) is a structure whose batched members are cut alike and
    must share one batch size, while members without a batch dimension (a string, a number,
    a 0-dimensional tensor: a mode or a setting) go to every piece whole. Inputs with no batch
    dimension at all run as one piece. Pieces are as even as possible; when the batch is
    smaller than ``parts`` fewer (non-empty) pieces are returned, so no replica runs an
    empty batch.
    """
    if parts < 1:
        raise ValueError(f"parts must be >= 1, got {parts}")
    with walking():
        n = _batch_len(inputs)
        if parts == 1 or n is None or n <= 1:
            return [inputs]
        parts = min(parts, n)
        base, extra = divmod(n, parts)
        bounds, start = [], 0
        for i in range(parts):
            size = base + (1 if i < extra else 0)
            bounds.append((start, start + size))
            start += size
        # (_split walks only what _batch_len walked, and found free of cycles)
        return _split(inputs, bounds)


def merge_batch(outputs: list[Any]) -> Any:
    """Join results of the pieces in order, the inverse of ``split_batch``: tensors are
    concatenated on dim 0, lists concatenated, tuples and mappings merged member by member
    (keeping their type where it can be rebuilt, see ``like_mapping``). One piece is returned
    as is. ``UnmappableValueError`` for results holding a tuple or mapping that contains
    itself, or nested past Python's recursion limit (each was a bare ``RecursionError``)."""
    if not outputs:
        raise ValueError("nothing to merge")
    with walking():
        return _merge(outputs, set())


def _merge(outputs: list[Any], path: set[int]) -> Any:
    """``merge_batch`` of ``outputs``; ``path``: the ids of the first results being walked."""
    import torch

    if len(outputs) == 1:
        return outputs[0]
    first = outputs[0]
    # The pieces' results must be alike: merged over the first's keys (or length), what only
    # a later piece returned was dropped without a word.
    kinds = {type(o).__name__ for o in outputs}
    if len(kinds) > 1 and not all(isinstance(o, torch.Tensor) for o in outputs):
        raise TypeError(f"the replicas' results have different types {sorted(kinds)}")
    if isinstance(first, Mapping) and any(o.keys() != first.keys() for o in outputs):
        keys = sorted({repr(k) for o in outputs for k in o.keys() ^ first.keys()})
        raise TypeError(f"the replicas' results have different keys (not in all: {keys[:8]})")
    if isinstance(first, tuple) and len({len(o) for o in outputs}) > 1:
        raise TypeError(
            f"the replicas' results have different lengths {sorted({len(o) for o in outputs})}"
        )
    if isinstance(first, torch.Tensor):
        if first.dim() == 0:
            raise TypeError("cannot merge 0-dimensional results of data-parallel replicas")
        return torch.cat(outputs, dim=0)
    if isinstance(first, tuple):
        with on_path(first, path):
            members = [_merge([o[i] for o in outputs], path) for i in range(len(first))]
        return like(first, members)
    if isinstance(first, list):
        return [x for o in outputs for x in o]
    if isinstance(first, Mapping):
        with on_path(first, path):
            merged = {k: _merge([o[k] for o in outputs], path) for k in first}
        return like_mapping(first, merged)
    raise TypeError(f"cannot merge results of type {type(first).__name__}; give the spec a merge")


def like(value: tuple, members: list[Any]) -> tuple:
    """``members`` as a tuple of ``value``'s kind: a named tuple stays one (it came out of a
    move, split or merge a plain tuple, so a call reading its inputs by name failed), and so
    does torch's structured result (``x.topk(k)``, a struct sequence: its
    ``.values`` were lost on the way back to the caller)."""
    kind = type(value)
    if hasattr(kind, "_fields"):
        return kind(*members)
    if kind is not tuple and getattr(kind, "n_sequence_fields", None) == len(members):
        with contextlib.suppress(TypeError):  # (one that takes more than its members)
            return kind(members)
    return tuple(members)


def like_mapping(value: Mapping, members: dict[Any, Any]) -> Mapping:
    """``members`` as a mapping of ``value``'s kind where ``type(value)(members)`` rebuilds it
    with the same keys (a ``BatchEncoding``, a transformers ``ModelOutput``, an
    ``OrderedDict``), else as a plain dict. A mapping that is no dict was not looked into at
    all (its tensors were not moved to the device, nor split across replicas), and a dict
    subclass came back a plain dict."""
    kind = type(value)
    if kind is dict:
        return members
    if kind is defaultdict:  # (its constructor takes the default first)
        rebuilt = kind(value.default_factory)
        rebuilt.update(members)
        return rebuilt
    try:
        rebuilt = kind(members)
    except Exception:  # (no such constructor: a plain dict)
        return members
    if not isinstance(rebuilt, kind) or rebuilt.keys() != members.keys():
        return members
    return rebuilt


def map_tensors(value: Any, fn: Callable[[torch.Tensor], torch.Tensor]) -> Any:
    """Apply ``fn`` to every tensor inside nested tuples/lists/mappings/dataclasses and other
    objects holding tensors in their attributes; other values are kept. Tuples and mappings
    keep their type where it can be rebuilt (``like``, ``like_mapping``); an object of another
    kind (a transformers ``DynamicCache`` and its layers) that holds tensors comes back a
    shallow copy with them mapped (``_map_object``).

    ``UnmappableValueError`` for a list, tuple, mapping or dataclass that contains itself
    (``x.append(x)``), or a value nested too deeply to walk: each was a bare
    ``RecursionError``, reported as the service's own failure."""
    try:
        return _map(value, fn, {}, set())
    except RecursionError:
        raise UnmappableValueError(
            "it is nested too deeply to walk (Python's recursion limit)"
        ) from None


class UnmappableValueError(ValueError):
    """A value ``map_tensors`` cannot walk: a container holding itself, or one nested past
    Python's recursion limit."""


def _map(
    value: Any,
    fn: Callable[[torch.Tensor], torch.Tensor],
    memo: dict[int, Any],
    path: set[int],
) -> Any:
    import torch

    if isinstance(value, torch.Tensor):
        return fn(value)
    container = isinstance(value, tuple | list | Mapping) or (
        dataclasses.is_dataclass(value) and not isinstance(value, type)
    )
    if not container:
        return _map_object(value, fn, memo)
    if id(value) in path:  # (one reached twice side by side is no cycle: only on the path)
        raise UnmappableValueError(f"it holds a {type(value).__name__} that contains itself")
    path.add(id(value))
    try:
        if isinstance(value, tuple):
            return like(value, [_map(v, fn, memo, path) for v in value])
        if isinstance(value, list):
            return [_map(v, fn, memo, path) for v in value]
        if isinstance(value, Mapping):
            return like_mapping(value, {k: _map(v, fn, memo, path) for k, v in value.items()})
        fields = {
            f.name: _map(getattr(value, f.name), fn, memo, path) for f in dataclasses.fields(value)
        }
        return with_fields(value, fields)
    finally:
        path.discard(id(value))


def _map_object(
    value: Any, fn: Callable[[torch.Tensor], torch.Tensor], memo: dict[int, Any]
) -> Any:
    """``value``, an object of no kind above, with the tensors in its attributes mapped: a
    shallow copy when its ``__dict__`` holds tensors (at any depth), else ``value`` itself.
    Such an object (an HF ``DynamicCache``) was handed back as it was: a result's tensors
    stayed the replica's device memory for as long as the caller held it. ``TypeError`` for
    one holding tensors that cannot be copied (``copy.copy`` fails, or gives the object
    itself). Tensors in ``__slots__`` or C-level state are not reached (see docs/eoe.md)."""
    if id(value) in memo:  # (a cycle back to it, or one object reached twice: one copy)
        return memo[id(value)]
    state = getattr(value, "__dict__", None)
    if not isinstance(state, dict) or isinstance(value, type | types.ModuleType):
        return value
    if not _holds_tensors(state, set()):
        return value
    try:
        new = copy.copy(value)
    except Exception as exc:
        raise TypeError(
            f"a {type(value).__name__} holding tensors cannot be copied: {told(exc)}"[:300]
        ) from exc
    if new is value or getattr(new, "__dict__", None) is state:
        raise TypeError(f"a {type(value).__name__} holding tensors cannot be copied")
    memo[id(value)] = new
    for name, member in list(state.items()):
        # A fresh path: a cycle back through this object ends at its memo (one copy).
        new.__dict__[name] = _map(member, fn, memo, set())
    return new


def _holds_tensors(value: Any, seen: set[int]) -> bool:
    """Whether a tensor is reachable in ``value`` the way ``_map`` walks it."""
    import torch

    if isinstance(value, torch.Tensor):
        return True
    if isinstance(value, str | bytes | numbers.Number | type | types.ModuleType) or value is None:
        return False
    if id(value) in seen:
        return False
    seen.add(id(value))
    if isinstance(value, tuple | list):
        return any(_holds_tensors(v, seen) for v in value)
    if isinstance(value, Mapping):
        return any(_holds_tensors(v, seen) for v in value.values())
    if dataclasses.is_dataclass(value):
        return any(_holds_tensors(getattr(value, f.name), seen) for f in dataclasses.fields(value))
    state = getattr(value, "__dict__", None)
    return isinstance(state, dict) and any(_holds_tensors(v, seen) for v in state.values())


def with_fields(value: Any, fields: dict[str, Any]) -> Any:
    """A shallow copy of the dataclass instance ``value`` with ``fields`` set (frozen ones
    too, without running its ``__post_init__`` again). A dataclass's tensors were not moved:
    a call got the caller's tensors (a device mismatch on CUDA), and a result kept the
    replica's device memory for as long as the caller held it."""
    new = copy.copy(value)
    for name, member in fields.items():
        object.__setattr__(new, name, member)
    return new
