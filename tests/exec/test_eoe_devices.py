"""Devices: the CPU device's live-byte accounting and budget, NVML discovery, configuration."""

from __future__ import annotations

import gc
import types

import pytest
import torch

from tangram.exec.eoe.config import DEFAULT_CPU_DEVICE_MEMORY, EoeConfig
from tangram.exec.eoe.devices import CpuDevice, nvml_gpus, open_devices, round_up
from tangram.exec.eoe.errors import DeviceOutOfMemoryError


def test_cpu_device_counts_live_buffers_until_the_last_view_dies() -> None:
    dev = CpuDevice(0, 10_000)
    a = dev.alloc(1000)
    assert a.numel() == 1024 and dev.allocated_bytes() == 1024
    view = a[100:200].view(torch.int32)
    param = torch.nn.Parameter(a[:8].view(torch.float32), requires_grad=False)
    del a
    assert dev.allocated_bytes() == 1024  # views keep the storage alive
    del view
    assert dev.allocated_bytes() == 1024
    del param
    assert dev.allocated_bytes() == 0
    assert dev.peak_allocated_bytes() == 1024


def test_cpu_device_refuses_allocations_over_budget() -> None:
    dev = CpuDevice(3, 4096)
    keep = dev.alloc(3000)
    with pytest.raises(
        DeviceOutOfMemoryError, match=r"device 3 .*budget of 4096 bytes .*3072 allocated"
    ):
        dev.alloc(1025)
    assert dev.allocated_bytes() == 3072  # the refused allocation left no trace
    small = dev.alloc(1024)
    assert dev.allocated_bytes() == 4096
    del keep, small
    gc.collect()
    assert dev.allocated_bytes() == 0


def test_round_up() -> None:
    assert round_up(1) == 512 and round_up(512) == 512 and round_up(513) == 1024


class _FakeNvml(types.SimpleNamespace):
    pass


def _fake_nvml(count: int = 2, fail_init: bool = False) -> _FakeNvml:
    calls: list[str] = []

    def init() -> None:
        calls.append("init")
        if fail_init:
            raise RuntimeError("NVML Shared Library Not Found")

    def mem(handle: int) -> types.SimpleNamespace:
        return types.SimpleNamespace(
            total=80 << 30, used=(handle + 1) << 30, free=(79 - handle) << 30
        )

    return _FakeNvml(
        calls=calls,
        nvmlInit=init,
        nvmlShutdown=lambda: calls.append("shutdown"),
        nvmlDeviceGetCount=lambda: count,
        nvmlDeviceGetHandleByIndex=lambda i: i,
        nvmlDeviceGetMemoryInfo=mem,
        nvmlDeviceGetName=lambda h: b"NVIDIA H100",
        nvmlDeviceGetUUID=lambda h: f"GPU-0000-{h}",
    )


def test_nvml_discovery_reads_names_uuids_and_memory() -> None:
    fake = _fake_nvml(2)
    gpus = nvml_gpus(fake)
    assert [g.index for g in gpus] == [0, 1]
    assert gpus[1].name == "NVIDIA H100" and gpus[1].uuid == "GPU-0000-1"
    assert gpus[0].total_bytes == 80 << 30 and gpus[1].used_bytes == 2 << 30
    assert fake.calls == ["init", "shutdown"]


def test_nvml_absent_means_no_gpu() -> None:
    assert nvml_gpus(_fake_nvml(fail_init=True)) == ()


def test_nvml_on_this_machine_does_not_raise() -> None:
    gpus = nvml_gpus()
    assert isinstance(gpus, tuple)
    if not torch.cuda.is_available():
        assert gpus == ()


def test_open_cpu_devices_with_defaults_and_budget() -> None:
    devs = open_devices(EoeConfig(backend="cpu"))
    assert len(devs) == 2 and all(d.budget_bytes == DEFAULT_CPU_DEVICE_MEMORY for d in devs)
    devs = open_devices(EoeConfig(backend="cpu", devices=4, device_memory_bytes=1234))
    assert [d.index for d in devs] == [0, 1, 2, 3] and devs[3].budget_bytes == 1234
    assert devs[0].figures().backend == "cpu"


@pytest.mark.skipif(torch.cuda.is_available(), reason="checks the no-GPU error")
def test_cuda_backend_without_gpu_is_a_clear_error() -> None:
    with pytest.raises(RuntimeError, match="no CUDA GPU"):
        open_devices(EoeConfig(backend="cuda"))


@pytest.mark.parametrize(
    ("kwargs", "words"),
    [
        ({"backend": "tpu"}, "backend"),
        ({"devices": 0}, "devices"),
        ({"device_memory_bytes": 0}, "device_memory_bytes"),
        ({"memory_fraction": 1.5}, "memory_fraction"),
        ({"calls_per_gpu": 0}, "calls_per_gpu"),
        ({"host_memory_bytes": -1}, "host_memory_bytes"),
    ],
)
def test_config_rejects_bad_values(kwargs: dict, words: str) -> None:
    with pytest.raises(ValueError, match=words):
        EoeConfig(**kwargs)


@pytest.mark.parametrize(
    ("kwargs", "words"),
    [
        ({"devices": True}, "devices must be a positive int or None, got True"),
        ({"calls_per_gpu": True}, "calls_per_gpu must be a positive int, got True"),
        ({"device_memory_bytes": True}, "device_memory_bytes must be a positive int"),
        ({"host_memory_bytes": True}, "host_memory_bytes must be a positive int"),
        ({"memory_fraction": True}, r"memory_fraction must be a number in \(0, 1\], got True"),
        ({"memory_fraction": "0.5"}, r"memory_fraction must be a number in \(0, 1\], got '0.5'"),
        ({"pin_host_memory": "no"}, "pin_host_memory must be True, False or None, got 'no'"),
    ],
)
def test_config_numbers_of_the_wrong_type_are_refused_naming_them(kwargs: dict, words: str) -> None:
    """True passed the isinstance(int) checks (devices=True opened one device, a budget of
    True bytes), memory_fraction='0.5' was a bare TypeError ('<' not supported) and
    pin_host_memory='no' was taken, every register then a bare TypeError from torch
    ("empty(): argument 'pin_memory' must be bool, not str")."""
    with pytest.raises(ValueError, match=words):
        EoeConfig(**kwargs)


@pytest.mark.parametrize("devices", [1025, 10**9])
def test_config_devices_past_the_bound_are_refused_naming_the_field(devices: int) -> None:
    """devices=10**9 was taken, and on the CPU backend open_devices tried to create 10**9
    devices (minutes of work, then the memory gone); it is refused naming the field."""
    with pytest.raises(ValueError, match=rf"^devices must be at most 1024, got {devices}"):
        EoeConfig(backend="cpu", devices=devices)
    assert EoeConfig(backend="cpu", devices=1024).devices == 1024


class _Unshowable:
    """A value whose repr raises."""

    def __repr__(self) -> str:
        raise RuntimeError("no repr")


@pytest.mark.parametrize(
    "field",
    [
        "backend",
        "devices",
        "device_memory_bytes",
        "memory_fraction",
        "calls_per_gpu",
        "host_memory_bytes",
        "pin_host_memory",
    ],
)
@pytest.mark.parametrize("value", [_Unshowable(), -(10**5000)], ids=["unshowable", "huge-int"])
def test_a_config_value_that_cannot_be_shown_is_refused_naming_it(
    field: str, value: object
) -> None:
    """A bad value quoted in its refusal with !r whose repr raised (its __repr__, or an int
    past str's 4,300 digits) made the refusal's own message raise: a RuntimeError, or a
    ValueError saying 'Exceeds the limit', naming no field. Each is refused naming it."""
    with pytest.raises(ValueError, match=rf"^{field} must be .*whose repr raised"):
        EoeConfig(**{field: value})


def test_an_interrupt_anywhere_allocating_on_a_cpu_device_keeps_its_count_right() -> None:
    """CpuDevice.alloc counted the bytes, then made the buffer and gave its finalizer the
    bytes on later lines: an interrupt in between (a KeyboardInterrupt as it recorded the
    peak, or as it attached the finalizer) kept them counted for good, so the device held
    less free memory for every later restore (seen as memory used outside the executor).
    An interrupt at any line of alloc now leaves the count at what is really allocated."""
    from tests.interrupts import interrupted_at, interruptible_lines

    code = CpuDevice.alloc.__code__
    lines = interruptible_lines(code)
    assert lines
    for line in lines:
        dev = CpuDevice(0, 1 << 20)
        got: list[torch.Tensor] = []
        with interrupted_at(code, line):
            got.append(dev.alloc(1000))
        assert dev.allocated_bytes() == (1024 if got else 0), line
        got.clear()
        gc.collect()
        assert dev.allocated_bytes() == 0, line
        assert dev.alloc(1 << 20).numel() == 1 << 20, line  # the whole budget is there


def test_an_interrupt_as_a_cpu_device_buffer_is_freed_keeps_its_count_right() -> None:
    """A CpuDevice buffer's finalizer was a Python method (take the lock, subtract): an
    interrupt landing on its lines (a KeyboardInterrupt as the last view of a replica's
    buffer went) was printed and dropped by the finalizer's caller, and the bytes stayed
    counted for good: the device's free memory shrank by a replica for every later
    restore. The finalizer now runs no line of the device's code, so no interrupt can land
    in it: an interrupt at the first line of device code run while the buffer is freed
    leaves the count right."""
    import sys
    import warnings

    import tangram.exec.eoe.devices as devices_module

    dev = CpuDevice(0, 1 << 20)
    got = [dev.alloc(1000)]
    fired: list[str] = []

    def local(frame: types.FrameType, event: str, arg: object) -> object:
        if event == "line" and not fired:
            fired.append(frame.f_code.co_name)
            raise KeyboardInterrupt
        return local

    def trace(frame: types.FrameType, event: str, arg: object) -> object:
        return local if frame.f_code.co_filename == devices_module.__file__ else None

    with warnings.catch_warnings():  # (pytest reports what a finalizer's caller drops)
        warnings.simplefilter("ignore")
        sys.settrace(trace)
        try:
            got.clear()  # the buffer's last reference: its finalizer runs here
        except KeyboardInterrupt:
            pass
        finally:
            sys.settrace(None)
        assert dev.allocated_bytes() == 0, fired
    assert dev.alloc(1 << 20).numel() == 1 << 20  # the whole budget is there


def _fake_cuda(monkeypatch: pytest.MonkeyPatch, total: int) -> None:
    """torch reporting one CUDA GPU of ``total`` bytes (NVML seeing none), on a CPU host."""
    from tangram.exec.eoe import devices

    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 1)
    monkeypatch.setattr(torch.cuda, "mem_get_info", lambda i=None: (total // 2, total))
    monkeypatch.setattr(torch.cuda, "get_device_name", lambda i=None: "Fake GPU")
    monkeypatch.setattr(devices, "nvml_gpus", lambda: ())


def test_a_cuda_budget_above_the_gpus_memory_is_refused_naming_both(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """With backend cuda, device_memory_bytes larger than the GPU's memory was taken without
    a word: every plan then counted on memory the GPU lacks, and calls failed with CUDA's
    out-of-memory error instead of waiting for an eviction. Refused now, naming the field,
    its value, the GPU and its memory as reported; a budget within it is kept as given."""
    total = 16 << 30
    _fake_cuda(monkeypatch, total)
    with pytest.raises(ValueError) as refused:
        open_devices(EoeConfig(backend="cuda", device_memory_bytes=total + 1))
    message = str(refused.value)
    assert "device_memory_bytes" in message and str(total + 1) in message, message
    assert str(total) in message and "GPU 0" in message and "Fake GPU" in message, message
    (device,) = open_devices(EoeConfig(backend="cuda", device_memory_bytes=total))
    assert device.budget_bytes == total
    (device,) = open_devices(EoeConfig(backend="cuda", memory_fraction=0.5))
    assert device.budget_bytes == total // 2


@pytest.mark.skipif(torch.cuda.is_available(), reason="checks a host that cannot pin memory")
def test_pinning_asked_for_on_a_host_that_cannot_pin_is_refused_naming_the_setting() -> None:
    """pin_host_memory=True on a host without CUDA was accepted, and every register then
    failed with torch's bare 'pin_memory=True requires a CUDA or other accelerator backend',
    naming no setting of ours. Refused when the manager is made, naming pin_host_memory."""
    from tangram.exec.eoe import EoeManager

    config = EoeConfig(backend="cpu", devices=1, pin_host_memory=True)
    with pytest.raises(ValueError, match="pin_host_memory=True.*cannot page-lock"):
        EoeManager(config)
    EoeManager(EoeConfig(backend="cpu", devices=1, pin_host_memory=False)).close()
