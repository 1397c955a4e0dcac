"""Service specs, the registry, data-parallel split/merge, host backups and the example services."""

from __future__ import annotations

import pytest
import torch
from torch import nn

from tangram.exec.eoe.backup import HostBackup
from tangram.exec.eoe.devices import CpuDevice
from tangram.exec.eoe.errors import DuplicateServiceError, ServiceSpecError, UnknownServiceError
from tangram.exec.eoe.registry import (
    ServiceRegistry,
    ServiceSpec,
    batch_problem,
    merge_batch,
    split_batch,
)
from tangram.exec.eoe.services import (
    SIZES,
    TransformerSize,
    build_model,
    example_tokens,
    reward_model_spec,
    score,
    teacher_spec,
    token_logprobs,
)


def _spec(name: str = "svc", **kw) -> ServiceSpec:
    return ServiceSpec(name=name, factory=lambda: nn.Linear(2, 2), call=lambda m, x: m(x), **kw)


# --- ServiceSpec and ServiceRegistry ----------------------------------------------------------


def test_spec_sorts_dops_and_keeps_defaults() -> None:
    spec = _spec(dops=(4, 1, 2))
    assert spec.dops == (1, 2, 4)
    assert spec.workspace_bytes == 0 and spec.memory_bytes is None


@pytest.mark.parametrize(
    ("kwargs", "words"),
    [
        ({"dops": (3,)}, "dops"),
        ({"dops": ()}, "dops"),
        ({"dops": (1, 1)}, "dops"),
        ({"dops": (16,)}, "dops"),
        ({"memory_bytes": -1}, "memory_bytes"),
        ({"workspace_bytes": -5}, "workspace_bytes"),
        ({"workspace_bytes": 1.5}, "workspace_bytes"),
    ],
)
def test_spec_rejects_bad_fields(kwargs: dict, words: str) -> None:
    with pytest.raises(ServiceSpecError, match=words):
        _spec(**kwargs)


@pytest.mark.parametrize("name", ["", " x", "a b", "-lead", None])
def test_spec_rejects_bad_names(name: object) -> None:
    with pytest.raises(ServiceSpecError, match="name"):
        _spec(name)  # type: ignore[arg-type]


def test_spec_rejects_non_callables() -> None:
    with pytest.raises(ServiceSpecError, match="factory"):
        ServiceSpec("x", factory=1, call=lambda m, x: x)  # type: ignore[arg-type]
    with pytest.raises(ServiceSpecError, match="call"):
        ServiceSpec("x", factory=lambda: nn.Linear(1, 1), call="no")  # type: ignore[arg-type]


def test_registry_add_get_remove_and_errors() -> None:
    reg = ServiceRegistry()
    reg.add(_spec("a"))
    reg.add(_spec("b"))
    assert reg.names() == ("a", "b") and len(reg) == 2 and "a" in reg
    with pytest.raises(DuplicateServiceError, match="'a' is already registered"):
        reg.add(_spec("a"))
    with pytest.raises(UnknownServiceError, match=r"unknown service 'zz' \(registered: a, b\)"):
        reg.get("zz")
    assert reg.remove("a").name == "a"
    assert reg.names() == ("b",)
    with pytest.raises(UnknownServiceError):
        reg.remove("a")


# --- split and merge --------------------------------------------------------------------------


def test_split_tensor_even_and_uneven_then_merge_back() -> None:
    x = torch.arange(10).reshape(5, 2)
    parts = split_batch(x, 2)
    assert [p.shape[0] for p in parts] == [3, 2]
    assert torch.equal(merge_batch(parts), x)
    assert len(split_batch(x, 8)) == 5  # no empty pieces
    assert split_batch(x, 1)[0] is x


def test_split_structures() -> None:
    a, b = torch.arange(6), torch.arange(6) * 10
    parts = split_batch((a, {"k": b}), 3)
    assert len(parts) == 3
    assert torch.equal(parts[1][0], a[2:4]) and torch.equal(parts[1][1]["k"], b[2:4])
    samples = [torch.zeros(i + 1) for i in range(5)]  # a list is a sequence of samples
    pieces = split_batch(samples, 2)
    assert [len(p) for p in pieces] == [3, 2]
    assert merge_batch(pieces) == samples or all(
        torch.equal(x, y) for x, y in zip(merge_batch(pieces), samples, strict=True)
    )
    merged = merge_batch([(a[:3], {"k": b[:3]}), (a[3:], {"k": b[3:]})])
    assert torch.equal(merged[0], a) and torch.equal(merged[1]["k"], b)


def test_split_errors_name_the_problem() -> None:
    with pytest.raises(TypeError, match="different batch sizes"):
        split_batch((torch.zeros(3), torch.zeros(4)), 2)
    assert batch_problem({"input_ids": torch.zeros(2, 3), "attention_mask": torch.zeros(3, 3)})
    assert batch_problem({"input_ids": torch.zeros(2, 3), "mode": "x"}) is None
    with pytest.raises(TypeError, match="0-dimensional"):
        merge_batch([torch.tensor(1.0), torch.tensor(2.0)])
    with pytest.raises(TypeError, match="cannot merge results of type int"):
        merge_batch([1, 2])


def test_merging_results_of_different_structures_is_refused_naming_them() -> None:
    """Replicas' results that are not alike are an error: dicts were merged over the first
    one's keys and tuples over its length, so a key or member only a later replica returned
    was dropped without a word (and one the first had and a later lacked: KeyError)."""
    t = torch.zeros(2)
    with pytest.raises(TypeError, match="different keys"):
        merge_batch([{"a": t}, {"a": t, "top": t}])
    with pytest.raises(TypeError, match="different lengths"):
        merge_batch([(t,), (t, t)])
    with pytest.raises(TypeError, match="different types"):
        merge_batch([t, [1, 2]])


# --- host backup ------------------------------------------------------------------------------


class _Odd(nn.Module):
    """Tied weights, a persistent and a non-persistent buffer, a 0-dim parameter, mixed dtypes
    and a non-contiguous parameter."""

    def __init__(self) -> None:
        super().__init__()
        torch.manual_seed(3)
        self.emb = nn.Embedding(7, 4)
        self.out = nn.Linear(4, 7, bias=False)
        self.out.weight = self.emb.weight
        self.scale = nn.Parameter(torch.tensor(1.5))
        self.lowp = nn.Parameter(torch.randn(3, 5).to(torch.bfloat16))
        self.t = nn.Parameter(torch.randn(5, 3).t())  # non-contiguous
        self.register_buffer("steps", torch.arange(4))
        self.register_buffer("mask", torch.tensor([True, False, True]), persistent=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = self.emb(x) * self.scale
        extra = (
            self.lowp.float().sum() + self.t.sum() + self.steps.sum() + self.mask.sum()
        ).float()
        return self.out(h) + extra


def test_backup_round_trip_preserves_everything() -> None:
    model = _Odd().eval()
    x = torch.tensor([[1, 2, 3]])
    expected = model(x)
    originals = {n: t.detach().clone() for n, t in model.state_dict(keep_vars=True).items()}
    backup = HostBackup(model, pin=False)
    # Tied weight stored once, under both names.
    tied = [s for s in backup.slots if len(s.names) > 1]
    assert len(tied) == 1 and set(tied[0].names) == {"emb.weight", "out.weight"}
    assert backup.nbytes % 512 == 0 and backup.nbytes >= backup.tensor_bytes
    assert all(s.offset % 256 == 0 for s in backup.slots)
    # The factory's module became a weightless template.
    assert all(p.device.type == "meta" for p in model.parameters())

    device = CpuDevice(0, 1 << 20)
    replica, storage = backup.restore(device)
    # Close, not bit-equal: the non-contiguous parameter comes back contiguous, which changes
    # the order of its sum. The tensors themselves are bit-equal (below).
    assert torch.allclose(replica(x), expected, atol=1e-5)
    assert replica.out.weight is replica.emb.weight
    assert replica.lowp.dtype == torch.bfloat16 and replica.scale.shape == ()
    assert torch.equal(replica.mask, torch.tensor([True, False, True]))
    for name, value in replica.state_dict().items():
        assert torch.equal(value, originals[name]), name
    # Every tensor of the replica lives in the one device buffer.
    base = storage.untyped_storage().data_ptr()
    for t in list(replica.parameters()) + list(replica.buffers()):
        assert t.untyped_storage().data_ptr() == base
    assert not any(p.requires_grad for p in replica.parameters())


def test_backup_recycled_skeleton_gives_same_outputs_and_frees_buffer() -> None:
    model = build_model("TeacherLM", "tiny", seed=5)
    tokens = example_tokens(2, 12)
    expected = token_logprobs(model, tokens)
    backup = HostBackup(model, pin=False)
    device = CpuDevice(0, 8 << 20)
    replica, storage = backup.restore(device)
    assert torch.equal(token_logprobs(replica, tokens), expected)
    assert device.allocated_bytes() == backup.nbytes
    backup.recycle(replica)
    del storage
    assert device.allocated_bytes() == 0  # the recycled skeleton holds no device tensor
    again, _ = backup.restore(device)
    assert again is replica  # the skeleton was reused
    assert torch.equal(token_logprobs(again, tokens), expected)


def test_backup_rejects_non_modules() -> None:
    with pytest.raises(ServiceSpecError, match="not a torch.nn.Module"):
        HostBackup(object(), pin=False)  # type: ignore[arg-type]


# --- example services -------------------------------------------------------------------------


def test_example_services_are_deterministic_and_shaped() -> None:
    tokens = example_tokens(3, 16, seed=1)
    r1, r2 = build_model("RewardModel", "tiny", seed=0), build_model("RewardModel", "tiny", seed=0)
    other = build_model("RewardModel", "tiny", seed=9)
    assert score(r1, tokens).shape == (3,)
    assert torch.equal(score(r1, tokens), score(r2, tokens))
    assert not torch.equal(score(r1, tokens), score(other, tokens))
    teacher = build_model("TeacherLM", "tiny", seed=1)
    logp = token_logprobs(teacher, tokens)
    assert logp.shape == (3, 15) and bool((logp <= 0).all())
    # Building with a seed leaves the caller's RNG alone.
    torch.manual_seed(123)
    a = torch.rand(1)
    torch.manual_seed(123)
    build_model("RewardModel", "tiny", seed=0)
    assert torch.equal(torch.rand(1), a)


def test_example_specs_and_sizes() -> None:
    spec = reward_model_spec("r", "tiny", workspace_bytes=None, batch_hint=4, seq_hint=64)
    assert spec.workspace_bytes > 0 and spec.dops == (1, 2, 4, 8)
    assert teacher_spec("t").call is token_logprobs
    tiny = SIZES["tiny"]
    n = sum(p.numel() for p in build_model("RewardModel", tiny).parameters())
    assert abs(n - tiny.approx_params) / n < 0.05
    with pytest.raises(ValueError, match="multiple of heads"):
        TransformerSize(d_model=10, heads=3)
    with pytest.raises(ValueError, match="unknown model size 'huge'"):
        reward_model_spec(size="huge")
    bf16 = build_model("TeacherLM", TransformerSize(dtype="bfloat16"))
    assert bf16.lm_head.weight.dtype == torch.bfloat16


def test_members_without_a_batch_dimension_go_to_every_piece_whole() -> None:
    """A mode string or a scalar setting beside the batch was refused at DoP 2 and accepted
    at DoP 1: the same call's outcome depended on the cell it was granted."""
    ids = torch.arange(6).reshape(3, 2)
    parts = split_batch({"input_ids": ids, "mode": "x", "scale": torch.tensor(2.0)}, 2)
    assert [p["mode"] for p in parts] == ["x", "x"]
    assert all(torch.equal(p["scale"], torch.tensor(2.0)) for p in parts)
    assert torch.equal(torch.cat([p["input_ids"] for p in parts]), ids)
    assert split_batch("text", 2) == ["text"]  # nothing to cut: one piece
    assert len(split_batch(torch.tensor(1.0), 2)) == 1


@pytest.mark.parametrize(
    ("kwargs", "words"),
    [
        ({"dops": (2.0,)}, r"dops must be distinct whole numbers .*got \(2\.0,\)"),
        ({"dops": (True,)}, r"dops must be distinct whole numbers .*got \(True,\)"),
        ({"dops": (1, 2.0)}, r"dops must be distinct whole numbers .*got \(1, 2\.0\)"),
        ({"shards": True}, "shards must be one of .*got True"),
        ({"workspace_bytes": True}, "workspace_bytes must be a non-negative int, got True"),
        ({"memory_bytes": True}, "memory_bytes must be a non-negative int or None, got True"),
    ],
)
def test_spec_numbers_that_are_bools_or_floats_are_refused_naming_them(
    kwargs: dict, words: str
) -> None:
    """dops=(2.0,) registered a service of DoPs (2.0,) (its info and catalog said so; a
    call at the default DoP was refused as 'supports DoPs (2.0,), not 1'), dops=(True,)
    one of DoP True, and workspace_bytes=True a workspace of True bytes: bools and floats
    pass 'in CELL_SIZES' and isinstance(int) checks."""
    with pytest.raises(ServiceSpecError, match=words):
        _spec(**kwargs)


@pytest.mark.parametrize("dops", [2, None, 2.0, {1: 1}, "12"])
def test_spec_dops_that_are_no_sequence_of_dops_are_refused_naming_them(dops: object) -> None:
    """dops=2 (or None, or 2.0) was a bare TypeError ('int' object is not iterable) from the
    spec, and dops={1: 1} was taken as (1,)."""
    with pytest.raises(ServiceSpecError, match=r"dops must be a tuple of DoPs.*got"):
        _spec(dops=dops)


@pytest.mark.parametrize("field", ["split", "merge"])
def test_a_split_or_merge_that_is_no_function_is_refused_naming_it(field: str) -> None:
    """split=5 (or merge='cat') made a spec, registered, and ran at DoP 1; every call at
    DoP > 1 then failed ('int' object is not callable, as InputSplitError or CallFailedError)."""
    with pytest.raises(ServiceSpecError, match=rf"{field} must be callable or None, got 5"):
        _spec(dops=(1, 2), **{field: 5})


def test_a_defaultdict_keeps_its_type_and_default_through_moves_splits_and_merges() -> None:
    """A defaultdict (its constructor takes the default first) came back a plain dict, so a
    caller reading a key it lacks got a KeyError instead of the default."""
    from collections import defaultdict

    from tangram.exec.eoe.registry import map_tensors

    value = defaultdict(list, {"x": torch.arange(4)})
    moved = map_tensors(value, lambda t: t + 1)
    pieces = split_batch(value, 2)
    merged = merge_batch(pieces)
    for got in (moved, *pieces, merged):
        assert type(got) is defaultdict and got.default_factory is list
    assert torch.equal(merged["x"], value["x"]) and merged["absent"] == []


class _Holder:
    """An object (as a cache is) holding tensors in its attributes."""

    def __init__(self) -> None:
        self.tensors: list = [torch.arange(2)]


def test_map_tensors_refuses_a_container_holding_itself_and_keeps_object_cycles() -> None:
    """A list holding itself was walked without end (a RecursionError); it is refused
    naming it. A cycle back through an object (its list holding the object) ends at the
    object's one copy, as before; the same list reached twice side by side is no cycle."""
    from tangram.exec.eoe.registry import UnmappableValueError, map_tensors

    looped: list = [torch.arange(2)]
    looped.append(looped)
    with pytest.raises(UnmappableValueError, match="holds a list that contains itself"):
        map_tensors(looped, lambda t: t + 1)
    holder = _Holder()
    holder.tensors.append(holder)
    moved = map_tensors([holder], lambda t: t + 1)
    assert moved[0] is not holder and moved[0].tensors[1] is moved[0]
    assert torch.equal(moved[0].tensors[0], torch.arange(2) + 1)
    shared = [torch.arange(2)]
    both = map_tensors((shared, shared), lambda t: t + 1)
    assert all(torch.equal(b[0], torch.arange(2) + 1) for b in both)


class _Unshowable:
    """A value whose repr raises."""

    def __repr__(self) -> str:
        raise RuntimeError("no repr")


_HUGE = -(10**5000)  # an int past str's 4,300 digits: its repr raises ValueError


@pytest.mark.parametrize(
    ("kwargs", "words"),
    [
        ({"name": _Unshowable()}, "service name"),
        ({"name": _HUGE}, "service name"),
        ({"dops": _Unshowable()}, "dops must be a tuple"),
        ({"dops": (_Unshowable(),)}, "dops must be distinct whole numbers"),
        ({"dops": (_HUGE,)}, "dops must be distinct whole numbers"),
        ({"memory_bytes": _HUGE}, "memory_bytes must be"),
        ({"workspace_bytes": _HUGE}, "workspace_bytes must be"),
        ({"shards": _HUGE}, "shards must be"),
        ({"backend": _Unshowable()}, "backend must be"),
        ({"backend": "engine", "home": _HUGE, "memory_bytes": 1}, "home must be"),
    ],
    ids=[
        "name-unshowable",
        "name-huge-int",
        "dops-unshowable",
        "dops-holding-unshowable",
        "dops-huge-int",
        "memory_bytes-huge-int",
        "workspace_bytes-huge-int",
        "shards-huge-int",
        "backend-unshowable",
        "home-huge-int",
    ],
)
def test_a_spec_field_that_cannot_be_shown_is_refused_naming_it(kwargs: dict, words: str) -> None:
    """A bad field quoted in its refusal with !r whose repr raised (its __repr__, or an int
    past str's 4,300 digits) made the refusal's own message raise: the spec failed with
    that RuntimeError or ValueError ('Exceeds the limit'), naming no field, and no
    ServiceSpecError. Each is refused naming the field."""
    with pytest.raises(ServiceSpecError, match=words):
        _spec(**kwargs)


def _deep(depth: int = 5000) -> tuple:
    nested: tuple = (torch.arange(4),)
    for _ in range(depth):
        nested = (nested,)
    return nested


def test_split_and_merge_refuse_a_structure_holding_itself_or_nested_too_deep() -> None:
    """The default split (and the admission check, batch_problem) walked a mapping holding
    itself, and merge a result holding one, until Python's recursion limit: a bare
    RecursionError, reported as the service's own failure (and out of batch_problem, which
    answers only a TypeError, as an error of the admission itself). A container holding
    itself is refused naming it, at once; one nested past the limit is refused saying so;
    the same member reached twice side by side is no cycle."""
    from tangram.exec.eoe.registry import UnmappableValueError

    looped: dict = {"x": torch.arange(4)}
    looped["again"] = (looped,)
    with pytest.raises(UnmappableValueError, match="holds a dict that contains itself"):
        split_batch(looped, 2)
    assert batch_problem(looped) == "they hold a dict that contains itself"
    with pytest.raises(UnmappableValueError, match="holds a dict that contains itself"):
        merge_batch([looped, looped])
    for call in (lambda: split_batch(_deep(), 2), lambda: merge_batch([_deep(), _deep()])):
        with pytest.raises(UnmappableValueError, match="nested too deeply"):
            call()
    assert "nested too deeply" in (batch_problem(_deep()) or "")
    shared = {"x": torch.arange(4)}
    pieces = split_batch((shared, shared), 2)
    assert [tuple(p[0]["x"].tolist()) for p in pieces] == [(0, 1), (2, 3)]
    assert torch.equal(merge_batch(pieces)[1]["x"], torch.arange(4))


def test_the_shard_hook_refuses_inputs_holding_themselves_naming_it() -> None:
    """The forward pre-hook of a sharded service's layers, which moves a layer's inputs to its
    weights' device, walked a list holding itself until Python's recursion limit: 'service
    raised RecursionError', naming no cause. It is refused naming the cause."""
    from tangram.exec.eoe.registry import UnmappableValueError
    from tangram.exec.eoe.sharding import _to_own_device

    layer = nn.Linear(2, 2)
    looped: list = [torch.ones(2)]
    looped.append(looped)
    with pytest.raises(UnmappableValueError, match="holds a list that contains itself"):
        _to_own_device(layer, (looped,), {})
    with pytest.raises(UnmappableValueError, match="nested too deeply"):
        _to_own_device(layer, (), {"x": _deep()})
    shared = [torch.ones(2)]
    args, kwargs = _to_own_device(layer, (shared, shared), {"y": shared})
    assert torch.equal(args[1][0], torch.ones(2)) and torch.equal(kwargs["y"][0], torch.ones(2))


def _meta_only(module: nn.Module) -> bool:
    return all(t.device.type == "meta" for t in [*module.parameters(), *module.buffers()])


@pytest.mark.parametrize("method", ["assemble", "restore", "_skeleton"])
def test_an_interrupt_anywhere_assembling_or_restoring_keeps_the_spare_skeleton(
    method: str,
) -> None:
    """HostBackup.assemble (a sharded call's model, over its shards' buffers) and restore
    took a spare skeleton and filled it: an interrupt (a KeyboardInterrupt) before it was
    returned lost the skeleton, no longer a spare (the next restore paid a deep copy of the
    template), its tensors still pointing at device buffers. An interrupt at any line of
    these (but a handler's) now leaves the spare among the spares, holding no device tensor,
    as recycle does."""
    import inspect

    from tests.interrupts import interrupted_at, interruptible_lines

    function = getattr(HostBackup, method)
    source, first = inspect.getsourcelines(function)
    handlers = {
        ln
        for i, t in enumerate(source)
        if t.strip() == "except BaseException:"
        for ln in range(first + i, first + i + 3)
    }
    code = function.__code__
    lines = [ln for ln in interruptible_lines(code) if ln not in handlers]
    assert lines
    model = build_model("TeacherLM", "tiny", seed=5)
    backup = HostBackup(model, pin=False, shards=2 if method == "assemble" else 1)
    device = CpuDevice(0, 64 << 20)
    storages = (
        [backup.restore(device, shard=i)[1] for i in range(2)] if method == "assemble" else []
    )
    for line in lines:
        spares = list(backup._spares)
        assert len(spares) == 1
        got: list[nn.Module] = []
        with interrupted_at(code, line):
            if method == "assemble":
                got.append(backup.assemble(storages))
            elif method == "restore":
                got.append(backup.restore(device)[0])
            else:
                got.append(backup._skeleton()[0])
        for module in got:  # (not interrupted: the caller gives it back)
            backup.recycle(module)
        assert backup._spares == spares, line
        assert _meta_only(spares[0]), line
