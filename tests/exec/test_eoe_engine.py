"""The engine backend: services whose engine sleeps and wakes itself, behind EoeManager.

``ModuleEngine`` (weights to host memory on sleep, back on wake-up, as vLLM's level 1) runs
here; ``VllmEngine`` needs CUDA and vLLM and is run by experiments/gpu_eoe_check.sh.
"""

from __future__ import annotations

import importlib.util
import time
from pathlib import Path
from typing import Any

import pytest
import torch

from tangram.exec.eoe import EoeConfig, EoeManager, ServiceSpec, ServiceSpecError
from tangram.exec.eoe.devices import CpuDevice
from tangram.exec.eoe.engine import ModuleEngine, engine_spec
from tangram.exec.eoe.errors import InvalidCellError, RestoreError, ServiceTooLargeError
from tangram.exec.eoe.hf import load_model, teacher_logprobs
from tangram.exec.eoe.hf_tiny import HfShape, save_model_dir
from tangram.exec.eoe.testing import BACKEND, UNIT
from tests.exec.eoe_setup import eoe_manager

SHAPE = HfShape(layers=2)
MIB = 1 << 20


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return save_model_dir(tmp_path_factory.mktemp("engine") / "teacher", "teacher", SHAPE)


def device_name(gpu: int) -> str:
    return f"cuda:{gpu}" if BACKEND == "cuda" else "cpu"


def teacher_engine(path: Path, gpu: int = 0) -> Any:
    return lambda: ModuleEngine(load_model(path, "teacher"), device_name(gpu), teacher_logprobs)


def manager(devices: int = 1, mib: int = 8) -> EoeManager:
    """``devices`` devices with room for ``mib`` MiB of claims each (``eoe_manager``)."""
    return eoe_manager(devices, mib)


def asleep(engine: ModuleEngine) -> bool:
    return all(p.numel() == 0 for p in engine.module.parameters())


def ids() -> torch.Tensor:
    return torch.randint(4, SHAPE.vocab, (3, 12), generator=torch.Generator().manual_seed(0))


def test_an_engine_wakes_for_a_call_sleeps_when_evicted_and_gives_identical_outputs(
    model_dir: Path,
) -> None:
    with manager() as m:
        info = m.register(engine_spec("t", teacher_engine(model_dir), home=0, memory_bytes=2 * MIB))
        engine = m._service("t").backup.engine
        assert asleep(engine) and info.home == 0 and info.resident_bytes == 2 * MIB
        first = m.call("t", ids())
        assert first.ok and first.restored_gpus == (0,) and not first.hit
        assert not asleep(engine) and m.residency() == {"t": (0,)}
        hit = m.call("t", ids())
        assert hit.hit
        m.evict("t")
        assert asleep(engine) and m.residency() == {}
        again = m.call("t", ids())
        assert again.ok and again.restored_gpus == (0,)
    with torch.inference_mode():
        expected = teacher_logprobs(load_model(model_dir, "teacher"), ids())["token_logprobs"]
    for out in (first, hit, again):
        assert torch.equal(out.value["token_logprobs"], expected)
    assert asleep(engine)  # closing the manager put it to sleep


def test_memory_pressure_puts_the_least_recently_used_engine_to_sleep(model_dir: Path) -> None:
    with manager(mib=3) as m:  # room for one engine's 2 MiB claim per GPU
        m.register(engine_spec("a", teacher_engine(model_dir), home=0, memory_bytes=2 * MIB))
        m.register(engine_spec("b", teacher_engine(model_dir), home=0, memory_bytes=2 * MIB))
        a, b = (m._service(n).backup.engine for n in "ab")
        assert m.call("a", ids()).ok and not asleep(a)
        out = m.call("b", ids())
        assert out.ok and out.evicted == (("a", 0),)
        assert asleep(a) and not asleep(b) and m.residency() == {"b": (0,)}


def test_an_engine_runs_on_its_home_gpu_only(model_dir: Path) -> None:
    with manager(devices=2) as m:
        m.register(engine_spec("t", teacher_engine(model_dir, 1), home=1, memory_bytes=2 * MIB))
        assert m.call("t", ids()).gpus == (1,)
        wrong = m.call("t", ids(), gpus=(0,))
        assert isinstance(wrong.error, InvalidCellError) and "GPU 1 only" in wrong.message


def test_an_engine_whose_home_gpu_the_node_lacks_is_refused_at_register() -> None:
    """home=5 on 2 GPUs was registered (its engine built, its weights booked on the host),
    and every call of it then failed with InvalidCellError: refused at register, naming the
    home GPU and the executor's GPUs, before its engine is built."""
    built: list[int] = []

    def factory() -> Any:
        built.append(1)
        raise AssertionError("the engine was built")

    with manager(devices=2) as m:
        with pytest.raises(InvalidCellError, match=r"GPU 5 only.*has 2 GPUs"):
            m.register(engine_spec("far", factory, home=5, memory_bytes=2 * MIB))
        assert not built and m.services() == () and m._host_bytes == 0


def test_an_engine_too_large_for_its_home_gpu_is_refused_before_it_is_built() -> None:
    """An engine service runs on its home GPU only: its size is checked against that GPU's
    budget, from its declared memory_bytes, before its factory runs. It was checked against
    the largest GPU's budget after the engine was built, so an engine that fit another GPU
    but not its home was registered and every call of it failed."""
    built: list[int] = []

    def make() -> Any:
        built.append(1)
        return ModuleEngine(torch.nn.Linear(4, 4), "cpu", lambda mod, x: mod(x))

    devices = [CpuDevice(0, 64 * MIB), CpuDevice(1, 4 * MIB)]
    with EoeManager(EoeConfig(backend="cpu"), devices=devices) as m:
        with pytest.raises(ServiceTooLargeError, match=r"home GPU 1 has a budget of 4194304"):
            m.register(engine_spec("t", make, home=1, memory_bytes=8 * MIB))
        assert built == [] and m.services() == ()
        m.register(engine_spec("t0", make, home=0, memory_bytes=8 * MIB))  # fits GPU 0
        assert built == [1]


def test_engine_specs_are_checked(model_dir: Path) -> None:
    make = teacher_engine(model_dir)
    with pytest.raises(ServiceSpecError, match="declares memory_bytes"):
        ServiceSpec("x", make, lambda e, i: e(i), backend="engine", home=0)
    with pytest.raises(ServiceSpecError, match="DoP 1"):
        ServiceSpec(
            "x", make, lambda e, i: e(i), dops=(1, 2), memory_bytes=1, backend="engine", home=0
        )
    with pytest.raises(ServiceSpecError, match="names its GPU"):
        ServiceSpec("x", make, lambda e, i: e(i), memory_bytes=1, backend="engine")
    with pytest.raises(ServiceSpecError, match="backend must be one of"):
        ServiceSpec("x", make, lambda e, i: e(i), backend="vllm")
    not_an_engine = engine_spec("m", lambda: torch.nn.Linear(2, 2), home=0, memory_bytes=MIB)
    with manager() as m, pytest.raises(ServiceSpecError, match="lacks wake_up"):
        m.register(not_an_engine)


class AllocatorDevice(CpuDevice):
    """A CPU device whose allocator figure also counts what engines allocate on it
    themselves, as ``torch.cuda.memory_allocated`` counts an engine's tensors on a GPU."""

    def __init__(self, index: int, budget_bytes: int) -> None:
        super().__init__(index, budget_bytes)
        self.engines = 0

    def allocated_bytes(self) -> int:
        return super().allocated_bytes() + self.engines


class CountedEngine:
    """An engine of ``weight_bytes`` that allocates them on ``device`` while awake. Its sleep
    on an engine asleep does nothing, as the ``Engine`` protocol asks (vLLM's executor
    ignores a sleep while it sleeps; ``ModuleEngine``'s empties tensors already empty)."""

    def __init__(self, device: AllocatorDevice, weight_bytes: int) -> None:
        self.device, self.weight_bytes = device, weight_bytes
        self.held = 0

    def wake_up(self) -> None:
        self.held, self.device.engines = self.weight_bytes, self.device.engines + self.weight_bytes

    def sleep(self) -> None:
        self.held, self.device.engines = 0, self.device.engines - self.held

    def __call__(self, inputs: Any) -> Any:
        return inputs


def test_an_awake_engines_memory_is_counted_once_not_also_as_foreign() -> None:
    """An engine's memory is claimed (its memory_bytes) and the allocator shows it too: it
    counted as foreign memory beside its claim, so a second engine that fits beside it put
    the first to sleep (on a GPU, each wake-up copies its weights again)."""
    device = AllocatorDevice(0, 4 * MIB)
    with EoeManager(devices=[device]) as m:
        for name in "ab":
            m.register(
                engine_spec(
                    name, lambda: CountedEngine(device, 2 * MIB), home=0, memory_bytes=2 * MIB
                )
            )
        assert m.call("a", 1).ok
        out = m.call("b", 2)
        assert out.ok and out.evicted == (), out
        assert m.residency() == {"a": (0,), "b": (0,)}
        m.evict("a")
        assert device.engines == 2 * MIB and m.stats().devices[0].claimed_bytes == 2 * MIB
        assert m.call("a", 3).evicted == ()  # awake again beside b
    assert device.engines == 0


class FailingSleepEngine(CountedEngine):
    """Its ``sleep`` frees its memory, then raises (an engine's error on the way down)."""

    def sleep(self) -> None:
        super().sleep()
        raise RuntimeError("engine error while going to sleep")


def test_an_eviction_whose_drop_raises_still_gives_back_its_claim() -> None:
    """An evicted replica whose weights' drop raised (the engine's sleep) leaves the books:
    its claim stayed booked for ever, the call that evicted it failed, and every later call
    that needed those bytes waited for memory nothing would free."""
    device = AllocatorDevice(0, 4 * MIB)
    with EoeManager(devices=[device]) as m:
        m.register(
            engine_spec(
                "a", lambda: FailingSleepEngine(device, 3 * MIB), home=0, memory_bytes=3 * MIB
            )
        )
        m.register(
            engine_spec("b", lambda: CountedEngine(device, 3 * MIB), home=0, memory_bytes=3 * MIB)
        )
        assert m.call("a", 1).ok
        out = m.call("b", 2, timeout_s=2)
        assert out.ok and out.evicted == (("a", 0),), out
        assert m.residency() == {"b": (0,)}
        assert m.stats().devices[0].claimed_bytes == 3 * MIB
        m.evict("b")
        assert m.call("a", 3, timeout_s=2).ok
        m.evict("a")  # the drop raises: the claim goes all the same
        assert m.stats().devices[0].claimed_bytes == 0 and m.residency() == {}


def test_a_running_calls_workspace_is_counted_once_not_also_as_foreign() -> None:
    """A running call's activations are what its workspace claim reserves; the allocator
    (CUDA's) shows them too, and they counted as foreign beside the claim: another call on
    the GPU (calls_per_gpu > 1) that fits waited for the first to end."""
    import threading

    from tangram.exec.eoe.testing import blob_spec

    device = AllocatorDevice(0, 4 * UNIT)
    started, release = threading.Event(), threading.Event()

    def working(module: Any, x: torch.Tensor) -> torch.Tensor:
        device.engines += UNIT  # its activations, within its workspace
        started.set()
        release.wait(10)
        device.engines -= UNIT
        return module(x)

    x = torch.ones(2)
    with EoeManager(EoeConfig(calls_per_gpu=2), devices=[device]) as m:
        m.register(blob_spec("a", call=working, workspace_bytes=UNIT))
        m.register(blob_spec("b", units=2))
        t = threading.Thread(target=lambda: m.call("a", x))
        t.start()
        try:
            assert started.wait(10)
            out = m.call("b", x, timeout_s=1)  # 1 + 1 claimed by a: 2 left for b
            assert out.ok, out.message
        finally:
            release.set()
            t.join(10)


NO_VLLM = importlib.util.find_spec("vllm") is None or not torch.cuda.is_available()


@pytest.mark.skipif(
    NO_VLLM, reason="CUDA-only: needs a GPU and vLLM (experiments/gpu_eoe_check.sh)"
)
def test_cuda_vllm_engine_sleeps_and_wakes_behind_the_manager(model_dir: Path) -> None:
    from tangram.exec.eoe.engine import VllmEngine

    def make() -> VllmEngine:
        return VllmEngine(str(model_dir), dtype="float32", gpu_memory_utilization=0.2)

    total = torch.cuda.get_device_properties(0).total_memory
    config = EoeConfig(backend="cuda", devices=1, device_memory_bytes=int(0.5 * total))
    prompt = {"prompt_token_ids": ids().tolist()}
    with EoeManager(config) as m:
        m.register(engine_spec("v", make, home=0, memory_bytes=int(0.2 * total)))
        engine = m._service("v").backup.engine
        first = m.call("v", prompt)
        assert first.ok, first.message
        free_awake = torch.cuda.mem_get_info()[0]
        m.evict("v")
        assert torch.cuda.mem_get_info()[0] > free_awake  # sleep gave memory back
        t0 = time.perf_counter()
        again = m.call("v", prompt)
        wake_s = time.perf_counter() - t0
        assert again.ok and again.restored_gpus == (0,) and again.value == first.value
    with torch.inference_mode():
        ref = teacher_logprobs(load_model(model_dir, "teacher"), ids())["token_logprobs"]
    got = torch.tensor([row[1:] for row in first.value])
    assert torch.allclose(got, ref, atol=1e-3)
    print(
        f"vLLM wake-up: {engine.weight_bytes} weight bytes, restore {again.restore_s:.4f} s, call {wake_s:.4f} s"
    )


def test_the_engine_benchmark_reports_restore_against_a_plain_copy(capsys: Any) -> None:
    import json

    from tangram.exec.eoe import bench_engine

    assert bench_engine.main(["--model", "hf-tiny", "--reps", "1", "--backend", "cpu"]) == 0
    doc = json.loads(capsys.readouterr().out)
    (row,) = doc["engines"]
    assert row["engine"] == "module" and row["weight_bytes"] > 500_000
    assert row["restore_s"] > 0 and row["copy_s"] > 0 and row["restore_pct_of_copy"] > 0
    assert doc["skipped"] == {"vllm": "needs CUDA and vLLM"}


@pytest.mark.parametrize(
    ("argv", "named"),
    [
        (["--reps", "0"], "--reps"),
        (["--engines", "modul"], "--engines 'modul'"),
        (["--engines", ","], "--engines ','"),
        (["--model", "hf-huge"], "--model 'hf-huge'"),
    ],
)
def test_the_engine_benchmark_refuses_bad_arguments_naming_them(
    argv: list[str], named: str, capsys: Any
) -> None:
    """--reps 0 ran the whole benchmark and then failed as statistics' 'no median for empty
    data'; an engine name other than 'module' was run as vLLM (an ImportError on CPU); an
    unknown --model was a bare KeyError. Each is refused up front naming the flag (exit 2)."""
    from tangram.exec.eoe import bench_engine

    with pytest.raises(SystemExit) as exit_:
        bench_engine.main([*argv, "--backend", "cpu"])
    assert exit_.value.code == 2
    assert named in capsys.readouterr().err


@pytest.mark.parametrize("home", [-1, True, "0", 0.0])
def test_an_engine_home_that_is_no_gpu_index_is_refused_naming_it(home: object) -> None:
    """home=-1 ran on the last GPU's books by Python's negative indexing (each call failed
    with 'the engine lives on GPU -1, not GPU 1'), home=True ran on GPU 1 with the outcome's
    gpus (True,), and home='0' was a bare TypeError ('<=' not supported) from register."""
    make = lambda: ModuleEngine(torch.nn.Linear(4, 4), "cpu", lambda mod, x: mod(x))  # noqa: E731
    with pytest.raises(ServiceSpecError, match=f"home must be a GPU index.*got {home!r}"):
        engine_spec("e", make, home=home, memory_bytes=MIB)  # type: ignore[arg-type]


def test_an_engines_wake_up_and_sleep_count_the_weight_bytes_they_move(model_dir: Path) -> None:
    """An engine's restores and evictions counted 0 bytes (its replica has no device buffer
    of the manager's) while their seconds counted in full: stats' bytes_restored /
    restore_s, the restore rate the trace calibration derives, fell with every wake-up, and
    evict() said bytes_freed 0 for an engine it had put to sleep."""
    with manager() as m:
        info = m.register(engine_spec("t", teacher_engine(model_dir), home=0, memory_bytes=2 * MIB))
        assert info.weight_bytes > 0
        assert m.call("t", ids()).ok
        stats = m.stats()
        assert stats.restores == 1 and stats.bytes_restored == info.weight_bytes
        assert m.evict("t").bytes_freed == info.weight_bytes
        stats = m.stats()
        assert stats.evictions == 1 and stats.bytes_evicted == info.weight_bytes
        assert stats.unverified_evictions == 0 and stats.devices[0].claimed_bytes == 0


class _Reporting:
    """An engine that reports ``weight_bytes`` as it is told to, and does nothing else."""

    def __init__(self, weight_bytes: object) -> None:
        self.weight_bytes = weight_bytes

    def wake_up(self) -> None:
        pass

    def sleep(self) -> None:
        pass

    def __call__(self, inputs: Any) -> Any:
        return inputs


@pytest.mark.parametrize("weight_bytes", [-(10**9), float("nan"), "5", True, 2.5])
def test_an_engine_whose_weight_bytes_are_no_byte_count_is_refused_naming_them(
    weight_bytes: object,
) -> None:
    """An engine saying weight_bytes=-1e9 was registered with host bytes of -1e9: the host
    budget then let through a later service far over it. NaN was a bare ValueError from
    int(), '5', True and 2.5 were taken as 5, 1 and 2 bytes."""
    config = EoeConfig(backend="cpu", devices=1, device_memory_bytes=MIB, host_memory_bytes=MIB)
    with EoeManager(config) as m:
        spec = engine_spec("e", lambda: _Reporting(weight_bytes), home=0, memory_bytes=MIB // 2)
        with pytest.raises(ServiceSpecError, match=r"weight_bytes must be a byte count.*got"):
            m.register(spec)
        assert m.services() == () and m._host_bytes == 0


class HalfWakingEngine(CountedEngine):
    """An engine whose wake-up allocates its weights, then raises (a copy or a step after the
    copies failing), while ``fail`` is set."""

    fail = True

    def wake_up(self) -> None:
        super().wake_up()
        if self.fail:
            raise RuntimeError("engine error partway through waking up")


def test_an_engine_whose_wake_up_raises_partway_is_put_back_to_sleep() -> None:
    """A wake-up that raised after allocating left the engine marked asleep: the failed
    restore's clean-up (which puts an engine marked awake back to sleep) skipped it, and its
    memory stayed allocated on its GPU outside every claim (foreign to every later plan
    there) until its next eviction. It is now put back to sleep; the call fails with
    RestoreError, the books as they were, and the next call (the engine healthy) runs."""
    device = AllocatorDevice(0, 4 * MIB)
    engine = HalfWakingEngine(device, MIB)
    with EoeManager(devices=[device]) as m:
        m.register(engine_spec("a", lambda: engine, home=0, memory_bytes=MIB))
        out = m.call("a", 1)
        assert isinstance(out.error, RestoreError) and "partway" in out.message, out
        assert device.engines == 0, "the half-woken engine's memory stayed allocated"
        assert m.stats().devices[0].claimed_bytes == 0 and m.residency() == {}
        assert not m._service("a").backup.awake
        engine.fail = False
        assert m.call("a", 2, timeout_s=5).ok and device.engines == MIB
        m.evict("a")
        assert device.engines == 0 and m.stats().devices[0].claimed_bytes == 0


class ExitingEngine(CountedEngine):
    """An engine whose wake-up or sleep calls sys.exit() (an engine's own code giving up)."""

    def __init__(self, device: AllocatorDevice, weight_bytes: int, when: str) -> None:
        super().__init__(device, weight_bytes)
        self.when = when

    def wake_up(self) -> None:
        if self.when == "wake_up":
            raise SystemExit(3)
        super().wake_up()

    def sleep(self) -> None:
        super().sleep()
        if self.when == "sleep":
            raise SystemExit(3)


def test_an_engine_that_exits_in_wake_up_or_sleep_fails_its_call_not_the_process() -> None:
    """A sys.exit() in an engine's wake_up (or sleep) is the service's own code failing, as
    in its call: it left manager.call without an outcome and, in the live runtime's thread
    pool, reached the event loop, which stops on it. The call fails with RestoreError (an
    eviction's sleep is booked as freed), the books as they were."""
    device = AllocatorDevice(0, 4 * MIB)
    with EoeManager(devices=[device]) as m:
        for name in ("wake_up", "sleep"):
            make = lambda name=name: ExitingEngine(device, 3 * MIB, name)  # noqa: E731
            m.register(engine_spec(name, make, home=0, memory_bytes=3 * MIB))
        out = m.call("wake_up", 1)
        assert isinstance(out.error, RestoreError) and "SystemExit" in out.message, out
        assert m.stats().devices[0].claimed_bytes == 0 and m.residency() == {}
        assert m.call("sleep", 2).ok
        m.evict("sleep")  # its sleep exits: booked as freed all the same, no SystemExit
        assert m.stats().devices[0].claimed_bytes == 0 and m.residency() == {}


class _OneAtATimeEngine:
    """A stand-in for vLLM's LLM, which is not thread-safe: records a call entering while
    another is inside. The first call stays inside until a second enters (or a bounded
    wait passes), so two calls that may overlap do."""

    weight_bytes = 1024

    def __init__(self) -> None:
        import threading

        self._lock = threading.Lock()
        self.inside = 0
        self.overlaps = 0
        self.calls = 0
        self.second = threading.Event()

    def wake_up(self) -> None:
        pass

    def sleep(self) -> None:
        pass

    def __call__(self, inputs: Any) -> Any:
        with self._lock:
            self.inside += 1
            self.calls += 1
            first = self.calls == 1
            if self.inside > 1:
                self.overlaps += 1
        if first:
            self.second.wait(1.0)  # (bounded: with calls serialised no second enters)
        else:
            self.second.set()
        with self._lock:
            self.inside -= 1
        return inputs


def test_calls_of_one_engine_never_run_at_once_with_calls_per_gpu_above_1() -> None:
    """With calls_per_gpu > 1 two calls of one engine service both pinned its one replica
    and ran on the engine at once, though vLLM's LLM is not thread-safe (its scheduler and
    KV cache are one request stream). Calls of one engine now run one at a time; the wait
    counts as queueing."""
    import threading

    engine = _OneAtATimeEngine()
    with eoe_manager(1, 8, calls_per_gpu=2) as m:
        m.register(engine_spec("e", lambda: engine, home=0, memory_bytes=MIB))
        outs: list[Any] = []
        threads = [
            threading.Thread(target=lambda i=i: outs.append(m.call("e", torch.tensor([i]))))
            for i in range(2)
        ]
        for t in threads:
            t.start()
        for t in threads:
            t.join(30)
        assert len(outs) == 2 and all(o.ok for o in outs), outs
        assert engine.calls == 2 and engine.overlaps == 0


def _engine_code(where: str) -> Any:
    from tangram.exec.eoe import copying
    from tangram.exec.eoe.engine import EngineBackup, _NoBuffer

    functions = {
        "numel": _NoBuffer.numel,  # (read as the restore is booked done)
        "restore": EngineBackup.restore,
        "recycle": EngineBackup.recycle,
        "start_restore": copying.start_restore,
        "_start_copies": EoeManager._start_copies,
    }
    return functions[where].__code__


@pytest.mark.parametrize("where", ["restore", "start_restore", "_start_copies", "numel", "recycle"])
def test_an_interrupt_anywhere_waking_or_putting_an_engine_to_sleep_leaves_none_awake_unbooked(
    where: str,
) -> None:
    """EngineBackup.restore woke the engine and marked it awake on the next line, and the
    manager listed the woken engine as restored a few lines later still: an interrupt in
    between (a KeyboardInterrupt) failed the restore with the engine awake, its memory
    allocated on its GPU outside every claim (foreign to every later plan there) until its
    next restore, and with the mark unset, its next eviction never put it to sleep. An
    interrupted sleep (eviction) left it awake the same way. An interrupt at any line of
    these now leaves the engine awake exactly when its replica is booked."""
    from tests.interrupts import interrupted_at, interruptible_lines

    code = _engine_code(where)
    lines = interruptible_lines(code)
    assert lines
    for line in lines:
        device = AllocatorDevice(0, 4 * MIB)
        with EoeManager(devices=[device]) as m:
            m.register(
                engine_spec("a", lambda d=device: CountedEngine(d, MIB), home=0, memory_bytes=MIB)
            )
            if where == "recycle":
                assert m.call("a", 1).ok
            with interrupted_at(code, line):
                m.call("a", 1) if where != "recycle" else m.evict("a")
            booked = ("a", 0) in m._ledger.replicas
            assert device.engines == (MIB if booked else 0), (line, booked)
            assert m.call("a", 2, timeout_s=5).ok, line
            m.evict("a")
            assert device.engines == 0, line


def test_the_engine_benchmark_refuses_reps_past_the_calibration_s_limit(
    monkeypatch: pytest.MonkeyPatch, capsys: Any
) -> None:
    """--reps took any positive int (10**9 misses ran for days without a word), while
    `tangram calibrate gpu` and `tangram bench eoe` stop it at 1,000: refused here too,
    naming the flag, before anything is measured."""
    from tangram.exec.eoe import bench_engine

    measured: list[str] = []
    monkeypatch.setattr(bench_engine, "measure", lambda kind, *a: measured.append(kind) or {})
    with pytest.raises(SystemExit) as exit_:
        bench_engine.main(["--model", "hf-tiny", "--reps", "1001", "--backend", "cpu"])
    assert exit_.value.code == 2 and measured == []
    assert "--reps" in capsys.readouterr().err
