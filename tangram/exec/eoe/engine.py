"""The engine backend: a service whose weights an inference engine moves itself, with its own
sleep and wake-up (vLLM's sleep mode level 1 offloads the weights to host memory and drops the
KV cache), instead of Tangram's host backup and copies; behind the same ``EoeManager``
interface (register, call, evict, residency, LRU, pins, budgets).

An engine lives on one GPU, its home: its service runs on that GPU only (``dops == (1,)``),
a restore is ``wake_up()`` and an eviction ``sleep()``. Its memory is allocated by the engine,
not through Tangram's devices, so the service must declare ``memory_bytes`` (weights plus the
engine's cache) and the manager claims that on its GPU's budget.

- ``Engine``: what an engine must do (``wake_up``, ``sleep``, be callable, say its weight bytes).
- ``ModuleEngine``: a torch module that sleeps by moving its weights to (pinned) host memory and
  wakes by moving them back, as vLLM's level 1 does; it runs anywhere, so the interface is
  tested on CPU here.
- ``VllmEngine``: vLLM's ``LLM`` with ``enable_sleep_mode``; needs CUDA and vLLM, and its tests
  are marked so (``experiments/gpu_eoe_check.sh`` runs them where a GPU is lent).
- ``EngineBackup``: what the manager holds for an engine service in place of a ``HostBackup``.
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from typing import TYPE_CHECKING, Any, Protocol, runtime_checkable

from tangram.exec.eoe.errors import RestoreError, ServiceSpecError
from tangram.exec.eoe.registry import ServiceSpec

if TYPE_CHECKING:
    import torch

    from tangram.exec.eoe.devices import Device


@runtime_checkable
class Engine(Protocol):
    """An inference engine that keeps its weights in host memory while it sleeps."""

    #: Bytes of the weights it moves on sleep and wake-up.
    weight_bytes: int

    def wake_up(self) -> None:
        """Weights back on the engine's GPU (blocks until they are there)."""

    def sleep(self) -> None:
        """Weights to host memory, the GPU memory freed (blocks until it is). It must be safe
        on an engine asleep or partly woken: it is called after a ``wake_up`` that raised
        (or was interrupted), which may have allocated part or all of the weights."""

    def __call__(self, inputs: Any) -> Any:
        """One call on awake weights."""


class _NoBuffer:
    """The stand-in for a replica's device buffer: the engine's memory is not Tangram's."""

    def numel(self) -> int:
        return 0


class EngineBackup:
    """An engine service's weights as the manager handles them: restore wakes the engine,
    recycling an evicted replica puts it to sleep (duck-typed as ``HostBackup``)."""

    shards = 1
    pinned = False

    def __init__(self, engine: Any, home: int) -> None:
        if not isinstance(engine, Engine):
            raise ServiceSpecError(
                f"the engine factory returned {type(engine).__name__}, which lacks "
                "wake_up/sleep/__call__/weight_bytes"
            )
        weight_bytes = engine.weight_bytes
        if isinstance(weight_bytes, bool) or not isinstance(weight_bytes, int) or weight_bytes < 0:
            # -1e9 was booked as the service's host bytes, and the host budget then let a
            # later service far over it through; NaN was a bare ValueError, '5' taken as 5.
            raise ServiceSpecError(
                f"the engine's weight_bytes must be a byte count (an int >= 0), "
                f"got {weight_bytes!r}"[:300]
            )
        self.engine = engine
        self.home = home
        self.tensor_bytes = self.nbytes = weight_bytes
        self.shard_bytes = (self.nbytes,)
        #: The engine is awake: set in the statement that wakes it, cleared in the one that
        #: puts it to sleep. An engine woken for a restore that then failed is put back to
        #: sleep by the manager (``EoeManager._sleep_if_unused``).
        self.awake = False
        #: Held by the call running on the engine: calls of one engine run one at a time
        #: (``EoeManager._engine_turn``).
        self.turn = threading.Lock()

    def restore(
        self, device: Device, *, sync: bool = True, shard: int | None = None
    ) -> tuple[Any, _NoBuffer]:
        """Wake the engine (on its home GPU only)."""
        if device.index != self.home:
            raise RestoreError(f"the engine lives on GPU {self.home}, not GPU {device.index}")
        # Marked awake in the statement that wakes it: on the next line, an interrupt in
        # between left an engine awake that nothing put back to sleep, its memory allocated
        # outside every claim.
        try:
            _, self.awake = self.engine.wake_up(), True
        except BaseException:
            # A wake-up that raised (or was interrupted) may have allocated part or all of
            # the weights: marked awake, so the failed restore's clean-up puts it back to
            # sleep (EoeManager._sleep_if_unused; a sleep on a partly woken or asleep engine
            # is safe, see Engine.sleep). Left unmarked, that memory stayed allocated outside
            # every claim until the engine's next eviction.
            self.awake = True
            raise
        return self.engine, _NoBuffer()

    def recycle(self, module: Any) -> None:
        """The replica was evicted (or its restore failed): the engine sleeps."""
        if self.awake:
            _, self.awake = self.engine.sleep(), False  # (one statement, as in restore)


def engine_spec(
    name: str,
    factory: Callable[[], Any],
    *,
    home: int,
    memory_bytes: int,
    call: Callable[[Any, Any], Any] | None = None,
    description: str = "",
) -> ServiceSpec:
    """A service run by the engine ``factory()`` builds (asleep) on GPU ``home``; it claims
    ``memory_bytes`` there while awake. ``call(engine, inputs)`` defaults to ``engine(inputs)``."""
    return ServiceSpec(
        name=name,
        factory=factory,
        call=call or (lambda engine, inputs: engine(inputs)),
        dops=(1,),
        memory_bytes=memory_bytes,
        backend="engine",
        home=home,
        description=description or f"engine service on GPU {home}",
    )


class ModuleEngine:
    """A torch module as an engine: ``sleep`` copies its weights into one (pinned, on CUDA)
    host buffer per tensor and drops them from the device; ``wake_up`` copies them back.
    Built asleep. Its calls run ``call(module, inputs)``."""

    def __init__(
        self, module: torch.nn.Module, device: str, call: Callable[[Any, Any], Any]
    ) -> None:
        import torch

        self.module = module.eval().requires_grad_(False)
        self.device = torch.device(device)
        self.call = call
        pin = self.device.type == "cuda"
        #: (name, key of its tensor, is a parameter); tied weights share one key.
        self._names: list[tuple[str, str, bool]] = []
        self._host: dict[str, torch.Tensor] = {}
        keys: dict[int, str] = {}
        entries = [(n, t, True) for n, t in module.named_parameters(remove_duplicate=False)]
        entries += [(n, t, False) for n, t in module.named_buffers(remove_duplicate=False)]
        for name, tensor, is_param in entries:
            key = keys.setdefault(id(tensor), name)
            self._names.append((name, key, is_param))
            if key == name:
                host = tensor.detach().to("cpu")
                self._host[key] = host.pin_memory() if pin else host.clone()
        self.weight_bytes = sum(t.numel() * t.element_size() for t in self._host.values())
        self.sleep()

    def _set(self, make: Callable[[str], torch.Tensor]) -> None:
        """Point every tensor of the module at ``make(key)`` (tied names share one value)."""
        import torch

        values = {key: make(key) for key in self._host}
        for name, key, is_param in self._names:
            owner_name, _, leaf = name.rpartition(".")
            owner = self.module.get_submodule(owner_name) if owner_name else self.module
            if is_param:
                owner._parameters[leaf] = torch.nn.Parameter(values[key], requires_grad=False)
            else:
                owner._buffers[leaf] = values[key]

    def wake_up(self) -> None:
        import torch

        # copy=True: on CPU too the weights come back as new memory, as a GPU's would
        self._set(lambda name: self._host[name].to(self.device, non_blocking=True, copy=True))
        if self.device.type == "cuda":
            torch.cuda.synchronize(self.device)

    def sleep(self) -> None:
        """Every tensor emptied: safe asleep or partly woken (as ``Engine.sleep`` asks)."""
        import torch

        self._set(lambda name: torch.empty(0, dtype=self._host[name].dtype))

    def __call__(self, inputs: Any) -> Any:
        return self.call(self.module, inputs)


class VllmEngine:
    """vLLM's offline ``LLM`` with sleep mode, as an engine on one GPU: ``sleep()`` is
    ``llm.sleep(level=1)`` (weights to host memory, KV cache dropped), ``wake_up()`` is
    ``llm.wake_up()``. A call scores prompts: ``{"prompt_token_ids": [[...], ...]}`` gives each
    prompt's per-token log-probs (vLLM's ``prompt_logprobs``; ``None`` first). Needs CUDA and
    vLLM; ``llm_kwargs`` go to ``vllm.LLM`` (``gpu_memory_utilization`` sets its memory)."""

    def __init__(self, model: str, **llm_kwargs: Any) -> None:
        from pathlib import Path

        import torch
        from vllm import LLM

        self.llm = LLM(model=model, enable_sleep_mode=True, **llm_kwargs)
        before = torch.cuda.mem_get_info()[0]
        self.llm.sleep(level=1)
        #: GPU memory sleep gave back (weights and KV cache).
        self.freed_bytes = max(0, torch.cuda.mem_get_info()[0] - before)
        # The weights it moves: the checkpoint's bytes when the model is a local directory.
        files = list(Path(model).glob("*.safetensors")) if Path(model).is_dir() else []
        self.weight_bytes = sum(f.stat().st_size for f in files) or self.freed_bytes

    def wake_up(self) -> None:
        self.llm.wake_up()

    def sleep(self) -> None:
        """``llm.sleep(level=1)``: safe asleep, as ``Engine.sleep`` asks (vLLM's executor
        ignores a sleep while it sleeps). A ``wake_up`` that raised inside vLLM leaves its
        executor marked asleep, so this sleep does nothing then: what that wake-up had
        mapped stays until vLLM frees it (vLLM's own limit, not seen by Tangram)."""
        self.llm.sleep(level=1)

    def __call__(self, inputs: Any) -> Any:
        from vllm import SamplingParams

        params = SamplingParams(max_tokens=1, prompt_logprobs=0, temperature=0.0)
        prompts = [{"prompt_token_ids": list(ids)} for ids in inputs["prompt_token_ids"]]
        outs = self.llm.generate(prompts, params, use_tqdm=False)
        return [
            [None]
            + [
                entry[tok].logprob
                for entry, tok in zip(o.prompt_logprobs[1:], o.prompt_token_ids[1:], strict=True)
            ]
            for o in outs
        ]
