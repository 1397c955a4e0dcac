"""Host backup of a service: all of its weights in one flat host buffer, restored with one copy.

At registration the module built by the factory is flattened: every distinct parameter and
buffer is copied into one uint8 host buffer (page-locked when CUDA is present) at an aligned
offset, and the module itself is turned into a weightless template on the ``meta`` device.
A restore allocates one device buffer of the same size, starts a single non-blocking
host-to-device copy of the whole buffer, and, while that copy runs, clones the template and
points its parameters and buffers at views of the device buffer. One large copy is what
reaches the link's bandwidth; many small per-tensor copies would not.
Eviction drops the replica (module and buffer); nothing else holds the device buffer.
"""

from __future__ import annotations

import bisect
import copy
import threading
import weakref
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING

from tangram.exec.eoe import sharding
from tangram.exec.eoe.devices import Device, round_up
from tangram.exec.eoe.errors import ServiceSpecError, told
from tangram.exec.eoe.execution import FAILURES

if TYPE_CHECKING:
    import torch

#: Offset alignment of each tensor in the flat buffer (bytes); a multiple of every dtype size.
ALIGN = 256
#: Weightless module skeletons kept per service for reuse by the next restore.
MAX_SPARES = 8


@dataclass(frozen=True)
class TensorSlot:
    """Where one distinct tensor of the module lives in the flat buffer, and every name it has
    (tied weights have several)."""

    names: tuple[str, ...]
    is_parameter: bool
    offset: int
    nbytes: int
    dtype: torch.dtype
    shape: tuple[int, ...]


@dataclass(frozen=True)
class LazyWeights:
    """What a factory may return instead of a module: the model built without its weights
    (parameters on the ``meta`` device, buffers real) and ``read(names)``, which returns one
    parameter's data (``names``: all of its names); the backup reads each one straight into
    its place, so the weights are never held twice on the host."""

    module: torch.nn.Module
    read: Callable[[tuple[str, ...]], torch.Tensor]


def _read_into(
    view: torch.Tensor, read: Callable[[tuple[str, ...]], torch.Tensor], names: tuple[str, ...]
) -> None:
    """Read the weights of the tensor ``names`` into its place ``view`` in the backup;
    ``ServiceSpecError`` naming the tensor when ``read`` (the factory's own code, run late)
    raises or gives no tensor of its shape. A read that raised (a weights file gone or cut
    short) or returned no tensor went out of register as that bare exception, where a
    factory's failure is a ServiceSpecError."""
    import torch

    try:
        data = read(names)
    except FAILURES as exc:
        raise ServiceSpecError(
            f"tensor {names[0]!r}: reading its weights raised {type(exc).__name__}: {told(exc)}"
        ) from exc
    if not isinstance(data, torch.Tensor):
        raise ServiceSpecError(
            f"tensor {names[0]!r}: reading its weights gave {type(data).__name__}, not a tensor"
        )
    if tuple(data.shape) != tuple(view.shape):
        raise ServiceSpecError(
            f"tensor {names[0]!r}: the weights have shape {tuple(data.shape)}, the model "
            f"{tuple(view.shape)}"
        )
    view.copy_(data)


class HostBackup:
    """The host copy of one service's weights and the recipe to rebuild a replica on a device."""

    def __init__(
        self,
        module: torch.nn.Module,
        *,
        pin: bool,
        shards: int = 1,
        read: Callable[[tuple[str, ...]], torch.Tensor] | None = None,
        admit: Callable[[int], None] | None = None,
    ) -> None:
        """``read(names)``, when given, returns the data of a tensor that is on the ``meta``
        device in ``module`` (a model built without weights), read straight into the backup
        (``names``: every name it has); the module then never holds its weights twice.
        ``admit(nbytes)``, when given, is called with the backup's size once it is laid out,
        before its buffer is allocated or any weight read: it may raise to refuse it."""
        import torch

        if not isinstance(module, torch.nn.Module):
            raise ServiceSpecError(
                f"the factory returned {type(module).__name__}, not a torch.nn.Module"
            )
        slots: list[TensorSlot] = []
        sources: list[torch.Tensor] = []
        index: dict[int, int] = {}
        names: list[list[str]] = []
        kinds: list[bool] = []
        offset = 0
        entries = [(n, t, True) for n, t in module.named_parameters(remove_duplicate=False)]
        entries += [(n, t, False) for n, t in module.named_buffers(remove_duplicate=False)]
        for name, tensor, is_param in entries:
            if tensor is None:
                continue
            if tensor.device.type == "meta" and read is None:
                raise ServiceSpecError(
                    f"tensor {name!r} of the module is on the meta device (no data)"
                )
            key = id(tensor)
            if key in index:
                names[index[key]].append(name)
                continue
            index[key] = len(sources)
            sources.append(tensor)
            names.append([name])
            kinds.append(is_param)
        layers = sharding.layer_list(module) if shards > 1 else None
        units = [sharding.unit_of(n[0], layers) for n in names]
        if shards > 1:  # lay the tensors out unit by unit, so that each shard is one range
            rank = sharding.unit_order(module)
            order = sorted(range(len(sources)), key=lambda i: rank[units[i]])
            sources, names, kinds, units = (
                [xs[i] for i in order] for xs in (sources, names, kinds, units)
            )
        layout = []
        for tensor in sources:
            nbytes = tensor.numel() * tensor.element_size()
            layout.append((offset, nbytes))
            offset = round_up(offset + nbytes, ALIGN)
        self.nbytes: int = round_up(max(offset, 1))
        if admit is not None:
            admit(self.nbytes)
        self.pinned: bool = pin
        self.buffer: torch.Tensor = torch.empty(self.nbytes, dtype=torch.uint8, pin_memory=pin)
        for tensor, (off, nbytes), tensor_names, is_param in zip(
            sources, layout, names, kinds, strict=True
        ):
            view = self.buffer[off : off + nbytes].view(tensor.dtype).view(tensor.shape)
            if tensor.device.type == "meta":
                _read_into(view, read, tuple(tensor_names))  # type: ignore[arg-type]  # checked above
            else:
                view.copy_(tensor.detach())
            slots.append(
                TensorSlot(
                    tuple(tensor_names), is_param, off, nbytes, tensor.dtype, tuple(tensor.shape)
                )
            )
        self.slots: tuple[TensorSlot, ...] = tuple(slots)
        #: Bytes of the tensors themselves (without alignment padding).
        self.tensor_bytes: int = sum(s.nbytes for s in slots)
        #: Byte range of the flat buffer that each shard holds (one range: not sharded).
        self.shard_ranges: tuple[tuple[int, int], ...] = self._shard_ranges(units, shards)
        # The template keeps the module's structure and code but no data.
        self.template: torch.nn.Module = module.to("meta").eval()
        self.template.requires_grad_(False)
        if shards > 1:
            hooked = {sharding.unit_of(n, layers) for slot in slots for n in slot.names}
            sharding.install_hooks(
                self.template, sorted(hooked, key=sharding.unit_order(module).get)
            )
        self._meta = [self._meta_tensor(slot) for slot in self.slots]
        # Skeletons (deep copies of the template) cost milliseconds to make; an evicted
        # replica's skeleton is emptied and kept for the next restore.
        self._lock = threading.Lock()
        self._spares: list[torch.nn.Module] = []
        self._owners: weakref.WeakKeyDictionary[torch.nn.Module, list] = weakref.WeakKeyDictionary()
        self._first_spare()

    def _first_spare(self) -> None:
        """Make one skeleton now, the first restore's: ``ServiceSpecError`` when the module
        cannot be deep-copied (it holds a lock, an open file, a CUDA stream). Such a module
        was registered, and every restore of it (each replica is a copy) then failed as a
        RestoreError, for every call."""
        try:
            module = copy.deepcopy(self.template)
        except FAILURES as exc:
            raise ServiceSpecError(
                "the module cannot be copied, and each replica is a copy of it: "
                f"copy.deepcopy raised {type(exc).__name__}: {told(exc)}"
            ) from exc
        module, owners = self._skeleton_of(module)
        self._owners[module] = owners
        self._spares.append(module)

    def _shard_ranges(self, units: list[str], shards: int) -> tuple[tuple[int, int], ...]:
        """Cut the units (in layout order) into ``shards`` runs of about equal bytes."""
        if shards == 1:
            return ((0, self.nbytes),)
        groups: list[list[TensorSlot]] = []
        for slot, unit, prev in zip(self.slots, units, [None, *units[:-1]], strict=True):
            if unit != prev:
                groups.append([])
            groups[-1].append(slot)
        try:
            starts = sharding.cut([sum(s.nbytes for s in g) for g in groups], shards)
        except ValueError as exc:
            raise ServiceSpecError(f"cannot split the module into {shards} shards: {exc}") from exc
        bounds = [groups[i][0].offset for i in starts] + [self.nbytes]
        return tuple(zip(bounds[:-1], bounds[1:], strict=True))

    @property
    def shards(self) -> int:
        return len(self.shard_ranges)

    @property
    def shard_bytes(self) -> tuple[int, ...]:
        """Bytes of each shard's device buffer."""
        return tuple(round_up(b - a) for a, b in self.shard_ranges)

    def _meta_tensor(self, slot: TensorSlot) -> torch.Tensor:
        owner_name, _, leaf = slot.names[0].rpartition(".")
        owner = self.template.get_submodule(owner_name) if owner_name else self.template
        return owner._parameters[leaf] if slot.is_parameter else owner._buffers[leaf]

    def _skeleton(self) -> tuple[torch.nn.Module, list]:
        """A weightless module and, per slot, the (table, key) pairs that hold its tensor."""
        with self._lock:
            if self._spares:
                # Popped and returned in one statement: an interrupt on a line between the
                # two lost the spare (the next restore paid a deep copy of the template).
                return (module := self._spares.pop()), self._owners[module]
        module, owners = self._skeleton_of(copy.deepcopy(self.template))
        with self._lock:
            self._owners[module] = owners
        return module, owners

    def _attach(self, owners: list, storage: torch.Tensor | None) -> None:
        """Point every parameter and buffer at its view of ``storage`` (None: the meta tensors)."""
        import torch

        for slot, places, meta in zip(self.slots, owners, self._meta, strict=True):
            if storage is None:
                value = meta
            else:
                raw = storage[slot.offset : slot.offset + slot.nbytes]
                value = raw.view(slot.dtype).view(slot.shape)
                if slot.is_parameter:
                    value = torch.nn.Parameter(value, requires_grad=False)
            for table, leaf in places:
                table[leaf] = value

    def recycle(self, module: torch.nn.Module) -> None:
        """Take back an evicted replica's module: drop its device tensors, keep the skeleton.

        The device tensors are dropped even past an interrupt (a KeyboardInterrupt at any line
        but the handler's): its traceback holds ``module``, so tensors left attached kept their
        device buffer allocated until the garbage collector broke the traceback's cycle.
        """
        try:
            with self._lock:
                owners = self._owners.get(module)
            if owners is None:  # (not a skeleton of ours: it holds what its maker gave it)
                return
            self._attach(owners, None)
        except BaseException:
            self._detach(module)
            raise
        # Past this point the module holds no device tensor: an interrupt here only loses
        # the skeleton for reuse. (Detaching in a handler here could detach a spare that
        # another restore took and filled meanwhile.)
        with self._lock:
            if len(self._spares) < MAX_SPARES:
                self._spares.append(module)

    def _detach(self, module: torch.nn.Module) -> None:
        """Point every tensor of ``module`` (a skeleton of ours) back at its meta tensor."""
        with self._lock:
            owners = self._owners.get(module)
        if owners is not None:
            self._attach(owners, None)

    def restore(
        self, device: Device, *, sync: bool = True, shard: int | None = None
    ) -> tuple[torch.nn.Module | None, torch.Tensor]:
        """A replica on ``device``: (module, its device buffer). Raises DeviceOutOfMemoryError.

        With ``shard`` (a sharded service), only that shard's range is copied and the module is
        None: ``assemble`` builds the model from the cell's shards for a call.
        With ``sync=False`` the copy may still be in flight on the device's current stream when
        this returns (work queued later on that stream sees the weights); call
        ``device.synchronize()`` before timing it or using it from another stream.
        """
        start, end = (0, self.nbytes) if shard is None else self.shard_ranges[shard]
        storage = device.alloc(end - start)
        module = None
        try:
            with device.context():
                storage[: end - start].copy_(self.buffer[start:end], non_blocking=True)
            if shard is None:
                module, owners = self._skeleton()  # while the copy is in flight on CUDA
                self._attach(owners, storage)
            if sync:
                device.synchronize()
            return module, storage  # (in the try: an interrupt on its line is handled)
        except BaseException:
            # The skeleton goes back to the spares, detached (it was lost, its tensors still
            # on the buffer), and the buffer is freed before the error propagates.
            if module is not None:
                self.recycle(module)
            module = storage = None
            raise

    def assemble(self, storages: list[torch.Tensor]) -> torch.nn.Module:
        """The whole model over the device buffers of its shards (in shard order), for one call;
        ``recycle`` it afterwards."""
        import torch

        if len(storages) != self.shards:
            raise ValueError(f"{len(storages)} buffers for {self.shards} shards")
        module, owners = self._skeleton()
        try:
            starts = [a for a, _ in self.shard_ranges]
            for slot, places in zip(self.slots, owners, strict=True):
                i = bisect.bisect_right(starts, slot.offset) - 1
                off = slot.offset - starts[i]
                value = storages[i][off : off + slot.nbytes].view(slot.dtype).view(slot.shape)
                if slot.is_parameter:
                    value = torch.nn.Parameter(value, requires_grad=False)
                for table, leaf in places:
                    table[leaf] = value
            return module  # (in the try: an interrupt on its line is handled)
        except BaseException:
            # An interrupt (or a failure) lost the skeleton, no longer a spare and pointing
            # at the shards' buffers: it goes back to the spares, detached, as recycle does.
            self.recycle(module)
            raise

    def host_module(self) -> torch.nn.Module:
        """A module on the host whose weights are views of the backup (for references/tests)."""
        module = copy.deepcopy(self.template)
        _, owners = self._skeleton_of(module)
        self._attach(owners, self.buffer)
        return module

    def _skeleton_of(self, module: torch.nn.Module) -> tuple[torch.nn.Module, list]:
        """``module`` (a copy of the template) and where each slot's tensor goes in it."""
        owners = []
        for slot in self.slots:
            places = []
            for name in slot.names:
                owner_name, _, leaf = name.rpartition(".")
                owner = module.get_submodule(owner_name) if owner_name else module
                places.append((owner._parameters if slot.is_parameter else owner._buffers, leaf))
            owners.append(places)
        return module, owners
