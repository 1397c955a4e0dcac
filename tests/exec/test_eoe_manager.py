"""The EOE manager: restore/evict correctness, LRU, residency, pinning and the error cases.

Runs on budgeted CPU devices here; with TANGRAM_EOE_BACKEND=cuda the same tests run on GPUs
(those needing more GPUs than the machine has are skipped).
"""

from __future__ import annotations

import math
import re
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any, NamedTuple

import pytest
import torch
from torch import nn
from transformers import BatchEncoding

from tangram.exec.eoe.config import EoeConfig
from tangram.exec.eoe.devices import CpuDevice
from tangram.exec.eoe.errors import (
    CallArgumentError,
    CallFailedError,
    DeviceOutOfMemoryError,
    DopNotSupportedError,
    DuplicateServiceError,
    HostMemoryError,
    InputSplitError,
    InvalidCellError,
    ManagerClosedError,
    QueueTimeoutError,
    RestoreError,
    RestoreOutOfMemoryError,
    ServiceInUseError,
    ServiceSpecError,
    ServiceTooLargeError,
    UnknownServiceError,
)
from tangram.exec.eoe.manager import EoeManager
from tangram.exec.eoe.registry import ServiceSpec
from tangram.exec.eoe.services import example_tokens, reward_model_spec, teacher_spec
from tangram.exec.eoe.testing import (
    BACKEND,
    MIB,
    UNIT,
    Blob,
    blob_reference,
    blob_spec,
    checked_call,
    same_bytes,
)
from tests.exec.eoe_setup import eoe_config
from tests.interrupts import interrupted_at, interruptible_lines


@pytest.fixture
def managers():
    made: list[EoeManager] = []

    def make(cfg: EoeConfig, **kw: object) -> EoeManager:
        made.append(EoeManager(cfg, **kw))
        return made[-1]

    yield make
    for m in made:
        m.close()


config = eoe_config
reference = blob_reference
X = torch.arange(6, dtype=torch.float32)


# --- correctness of restore and eviction ------------------------------------------------------


def test_outputs_identical_before_and_after_evict_restore(managers) -> None:
    m = managers(config(devices=1, units=8 * MIB / UNIT))
    m.register(reward_model_spec("reward", "tiny"))
    m.register(teacher_spec("teacher", "tiny"))
    tokens = example_tokens(4, 24)
    first = {s: m.call(s, tokens).unwrap() for s in ("reward", "teacher")}
    for _ in range(2):
        for s in ("reward", "teacher"):
            assert m.evict(s).gpus == (0,)
            assert m.residency().get(s) is None
            again = m.call(s, tokens)
            assert again.ok and not again.hit and again.restored_gpus == (0,)
            assert torch.equal(again.value, first[s]), s
    assert m.stats().unverified_evictions == 0


def test_outputs_identical_after_lru_eviction_and_at_dop_2(managers) -> None:
    m = managers(config(devices=2, units=2.02))
    for i in range(4):
        m.register(blob_spec(f"b{i}", units=1, seed=i))
    first = {f"b{i}": m.call(f"b{i}", X, dop=2).unwrap() for i in range(4)}  # evicts b0, b1
    assert m.stats().evictions >= 4
    for i in range(4):
        out = m.call(f"b{i}", X, dop=2)
        assert out.ok and torch.equal(out.value, first[f"b{i}"])
        assert torch.allclose(out.value, reference(1, i, X))
        one = m.call(f"b{i}", X, dop=1).unwrap()
        assert torch.allclose(one, out.value)


def test_eviction_really_frees_device_memory(managers) -> None:
    m = managers(config(devices=1, units=4))
    info = m.register(blob_spec("a", units=2))
    dev = m.devices[0]
    base = dev.allocated_bytes()
    m.call("a", X).unwrap()
    assert same_bytes(dev.allocated_bytes() - base, info.replica_bytes)
    evicted = m.evict("a")
    assert evicted.bytes_freed == info.replica_bytes and evicted.evict_s >= 0
    assert dev.allocated_bytes() == base
    assert m.stats().unverified_evictions == 0


def test_a_leaked_reference_is_caught_by_the_allocator_figure(managers) -> None:
    leak: list[torch.Tensor] = []

    def leaky(module: nn.Module, x: torch.Tensor) -> torch.Tensor:
        leak.append(module.w)  # keeps the replica's buffer alive after eviction
        return module(x)

    m = managers(config(devices=1, units=3))
    m.register(blob_spec("leaky", units=1, call=leaky))
    m.register(blob_spec("big", units=2.5))
    m.call("leaky", X).unwrap()
    m.evict("leaky")
    assert m.stats().unverified_evictions == 1
    # The leaked bytes count as used outside the executor: "big" cannot fit, and says why.
    out = m.call("big", X)
    assert isinstance(out.error, RestoreOutOfMemoryError)
    assert "used outside the executor" in str(out.error)
    leak.clear()
    assert m.call("big", X).ok


# --- LRU and residency ------------------------------------------------------------------------


def test_lru_evicts_the_least_recently_used(managers) -> None:
    m = managers(config(devices=1, units=3.02))
    for name in "abcd":
        m.register(blob_spec(name))
    for name in "abc":
        m.call(name, X).unwrap()
    assert m.lru_order(0) == ("a", "b", "c")
    m.call("a", X).unwrap()  # a becomes most recent
    assert m.lru_order(0) == ("b", "c", "a")
    out = m.call("d", X)
    assert out.evicted == (("b", 0),)
    assert set(m.residency()) == {"a", "c", "d"}
    assert m.lru_order(0) == ("c", "a", "d")


def test_residency_callbacks_in_order_and_resident_cell_preferred(managers) -> None:
    events: list[tuple[str, tuple[int, ...], bool]] = []
    m = managers(
        config(devices=2, units=1.02),
        on_residency_change=lambda s, g, r: events.append((s, g, r)),
    )
    m.register(blob_spec("a", seed=1))
    m.register(blob_spec("b", seed=2))
    assert m.call("a", X, gpus=(1,)).gpus == (1,)
    again = m.call("a", X)  # no cell given: the resident one is chosen
    assert again.gpus == (1,) and again.hit
    assert m.call("b", X).gpus == (0,)  # the free GPU, no eviction needed
    wide = m.call("a", X, dop=2)  # restores on GPU 0 only, evicting b there
    assert wide.gpus == (0, 1) and wide.restored_gpus == (0,) and wide.evicted == (("b", 0),)
    assert m.residency() == {"a": (0, 1)}
    assert events == [
        ("a", (1,), True),
        ("b", (0,), True),
        ("b", (0,), False),
        ("a", (0,), True),
    ]
    m.evict("a")
    assert events[-1] == ("a", (0, 1), False) and m.residency() == {}


def test_a_failing_callback_does_not_break_calls(managers) -> None:
    def boom(*_: object) -> None:
        raise RuntimeError("callback bug")

    m = managers(config(), on_residency_change=boom)
    m.register(blob_spec("a"))
    assert m.call("a", X).ok


def test_a_callback_that_exits_is_logged_and_the_call_still_ends_with_its_outcome(
    managers,
) -> None:
    """A sys.exit() in on_residency_change (the scheduler's code, as a service's call is its
    own) went through the delivery in call's finally: the call that ran ended with no
    outcome (SystemExit out of call(), which 'never raises'; in the live runtime's thread
    pool it reached the event loop) and was never counted, and evict() raised it too once
    it had evicted. It is logged and skipped like a callback's other errors."""
    seen: list[tuple[str, tuple[int, ...], bool]] = []

    def exits(service: str, gpus: tuple[int, ...], resident: bool) -> None:
        seen.append((service, gpus, resident))
        raise SystemExit(3)

    m = managers(config(), on_residency_change=exits)
    m.register(blob_spec("a"))
    out = m.call("a", X)
    assert out.ok and seen == [("a", (0,), True)]
    assert m.evict("a").gpus == (0,) and seen[-1] == ("a", (0,), False)
    assert m.stats().calls == 1 and m.call("a", X).ok


def test_a_residency_change_interrupted_in_its_callback_is_delivered_by_the_next(
    managers,
) -> None:
    """The feed took a change out of its queue before calling the callback: a
    KeyboardInterrupt there lost it for good (the scheduler never heard that 'a' became
    resident, its view of the residency stayed wrong). It stays queued until its callback
    returns and the next delivery (here the eviction's) hands it over first."""
    events: list[tuple[str, tuple[int, ...], bool]] = []
    interrupts = [KeyboardInterrupt()]

    def cb(service: str, gpus: tuple[int, ...], resident: bool) -> None:
        if interrupts:
            raise interrupts.pop()
        events.append((service, gpus, resident))

    m = managers(config(), on_residency_change=cb)
    m.register(blob_spec("a"))
    with pytest.raises(KeyboardInterrupt):
        m.call("a", X)
    assert events == []
    m.evict("a")
    assert events == [("a", (0,), True), ("a", (0,), False)]


def test_the_feed_keeps_a_change_until_its_callback_returns_and_nested_deliveries_skip_it() -> None:
    """An interrupted change is delivered again, before the later ones; a callback calling
    back into the manager delivers the changes after its own (in order, once each), never
    its own again."""
    from tangram.exec.eoe.residency import ResidencyFeed

    seen: list[tuple[str, tuple[int, ...], bool]] = []
    interrupts = [KeyboardInterrupt()]

    def cb(service: str, gpus: tuple[int, ...], resident: bool) -> None:
        if service == "a" and interrupts:
            raise interrupts.pop()
        seen.append((service, gpus, resident))
        if service == "a":
            feed.push("c", [1], True)
            feed.deliver()  # re-entrant, as through evict() in the callback
            seen.append(("a-done", (), True))

    feed = ResidencyFeed(cb)
    feed.push("a", [0], True)
    feed.push("b", [0], False)
    with pytest.raises(KeyboardInterrupt):
        feed.deliver()
    assert seen == []
    feed.deliver()
    assert seen == [
        ("a", (0,), True),
        ("b", (0,), False),
        ("c", (1,), True),
        ("a-done", (), True),
    ]
    feed.deliver()
    assert len(seen) == 4


def test_an_interrupt_anywhere_delivering_a_change_loses_no_change() -> None:
    """ResidencyFeed.deliver counted a change in flight, then marked it claimed (what its
    finally undoes) on the next line: an interrupt in between (a KeyboardInterrupt) kept it
    counted in flight for good, and no later delivery sent it or any change after it (the
    scheduler's view of what is resident stayed stale). An interrupt at any line of deliver
    (but its finally's, which Python cannot cover) now leaves every change delivered by
    the next delivery, in order."""
    import inspect

    from tangram.exec.eoe.residency import ResidencyFeed

    function = ResidencyFeed.deliver
    source, first = inspect.getsourcelines(function)
    start = max(first + i for i, t in enumerate(source) if t.strip() == "finally:")
    code = function.__code__
    lines = [ln for ln in interruptible_lines(code) if ln < start]
    assert lines
    changes = [("a", (0,), True), ("b", (1,), True), ("a", (0,), False)]
    for line in lines:
        seen: list[tuple[str, tuple[int, ...], bool]] = []
        feed = ResidencyFeed(lambda s, g, r, seen=seen: seen.append((s, g, r)))
        for change in changes:
            feed.push(*change)
        with interrupted_at(code, line):
            feed.deliver()
        feed.deliver()
        # at least once each, in order (one whose callback returned as the interrupt came
        # may be sent again)
        once = [c for i, c in enumerate(seen) if i == 0 or seen[i - 1] != c]
        assert once == changes, (line, seen)


@pytest.mark.parametrize("where", ["book", "push"])
def test_an_interrupt_anywhere_booking_an_eviction_keeps_the_residency_feed_true(
    managers, where: str
) -> None:
    """Ledger.book took an evictee out of the books and queued its change through
    ResidencyFeed.push in one statement, but push is a function of its own: an interrupt (a
    KeyboardInterrupt) landing on its first lines lost the change, and on_residency_change
    was never told the evictee left its GPU (the scheduler's view kept it resident there for
    good). The ledger now queues through the queue's own append, which runs no line of
    Python; an interrupt at any line of book (or of push, were it used) leaves the
    callback's view equal to residency()."""
    from tangram.exec.eoe.ledger import Ledger
    from tangram.exec.eoe.residency import ResidencyFeed

    code = (Ledger.book if where == "book" else ResidencyFeed.push).__code__
    lines = interruptible_lines(code)
    assert lines
    for line in lines:
        events: list[tuple[str, tuple[int, ...], bool]] = []
        m = managers(
            config(devices=2, units=1.5),  # room for one service per GPU
            on_residency_change=lambda s, g, r, events=events: events.append((s, g, r)),
        )
        m.register(blob_spec("a"))
        m.register(blob_spec("b", seed=1))
        assert m.call("a", X, dop=2).ok
        with interrupted_at(code, line):
            m.call("b", X, dop=2)
        m.call("b", X, dop=2, timeout_s=10)  # (delivers whatever is still queued)
        view: dict[str, set[int]] = {}
        for service, gpus, resident in events:
            held = view.setdefault(service, set())
            held.update(gpus) if resident else held.difference_update(gpus)
        seen = {s: tuple(sorted(g)) for s, g in view.items() if g}
        assert seen == m.residency() == {"b": (0, 1)}, (line, events)
        m.close()


@pytest.mark.parametrize("device", ["cuda:0", 0])
def test_devices_that_are_no_devices_are_refused_naming_them(device: object) -> None:
    """devices=['cuda:0'] was read for each device's index: a str's index method, refused
    as 'devices must be indexed 0..n-1 in order, got indices [<built-in method index of
    str object ...>]'; devices=[0] was a bare AttributeError. Each is refused naming it."""
    with pytest.raises(ValueError, match=f"devices must be Device objects.*got {device!r}"):
        EoeManager(EoeConfig(backend="cpu"), devices=[device])  # type: ignore[list-item]


def test_a_residency_callback_that_is_not_callable_is_refused_naming_it() -> None:
    """on_residency_change='log' was taken: every residency change then raised TypeError in
    the delivery, logged as the callback's own failure, and none was ever delivered. It is
    refused as the manager is made, naming the parameter."""
    with pytest.raises(ValueError, match="on_residency_change must be a callable or None"):
        EoeManager(config(), on_residency_change="log")  # type: ignore[arg-type]


def test_a_callback_may_call_back_into_the_manager(managers) -> None:
    seen: list[dict] = []
    holder: list[EoeManager] = []

    def cb(service: str, gpus: tuple[int, ...], resident: bool) -> None:
        seen.append(holder[0].residency())
        if service == "a" and resident:
            holder[0].evict("b")  # re-entrant: no lock is held while callbacks run

    m = managers(config(devices=1, units=4), on_residency_change=cb)
    holder.append(m)
    m.register(blob_spec("a"))
    m.register(blob_spec("b"))
    m.call("b", X).unwrap()
    m.call("a", X).unwrap()
    assert m.residency() == {"a": (0,)}
    assert seen[0] == {"b": (0,)} and seen[1] == {"a": (0,), "b": (0,)}


# --- in-use replicas are never evicted --------------------------------------------------------


@pytest.mark.parametrize(
    "timeout_s",
    [float("nan"), "1", True, -1.0, -1, float("-inf"), pytest.param(-(10**400), id="-10**400")],
)
def test_a_time_out_that_is_no_number_of_seconds_is_refused_naming_it(
    managers, timeout_s: object
) -> None:
    """timeout_s=NaN passed every deadline check ('left <= 0' is false) and the call waited
    for the busy service's memory for ever; '1' came back as 'unexpected TypeError in the
    executor' (our bug, by its words); a negative one was taken for a deadline passed
    already, a QueueTimeoutError as if the call had waited its time (-10**400: an
    OverflowError, 'unexpected' again)."""
    started, release = threading.Event(), threading.Event()
    m = managers(config(devices=1, units=1.02))
    m.register(blob_spec("busy", call=_blocking_call(started, release)))
    m.register(blob_spec("other", seed=3))
    t = threading.Thread(target=lambda: m.call("busy", X))
    t.start()
    assert started.wait(10)
    outs: list = []
    waiter = threading.Thread(target=lambda: outs.append(m.call("other", X, timeout_s=timeout_s)))
    try:
        waiter.start()
        waiter.join(3)
        assert outs, "the call waited on with its time-out"
        assert isinstance(outs[0].error, CallArgumentError), outs[0]
        assert "timeout_s" in outs[0].message and outs[0].queue_s < 1
    finally:
        release.set()
        t.join(10)
        waiter.join(10)


@pytest.mark.parametrize(
    "timeout_s", [0, 0.0, 5, float("inf"), pytest.param(10**400, id="10**400")]
)
def test_a_time_out_of_0_or_more_seconds_is_taken(managers, timeout_s: object) -> None:
    """0 (no wait: a free cell still runs the call), inf and an int past any float (no
    bound: it was an OverflowError, 'unexpected' in the executor) are time-outs."""
    m = managers(config(devices=1))
    m.register(blob_spec("a"))
    out = m.call("a", X, timeout_s=timeout_s)
    assert out.ok, out.message


def _blocking_call(started: threading.Event, release: threading.Event) -> Callable:
    def call(module: nn.Module, x: torch.Tensor) -> torch.Tensor:
        started.set()
        assert release.wait(10), "the test never released the call"
        assert module.w.device.type != "meta", "the replica was evicted while in use"
        return module(x)

    return call


def test_service_in_use_is_never_evicted(managers) -> None:
    started, release = threading.Event(), threading.Event()
    m = managers(config(devices=1, units=2.02, calls_per_gpu=3))
    m.register(blob_spec("busy", call=_blocking_call(started, release)))
    m.register(blob_spec("b"))
    m.register(blob_spec("c"))
    results: list = []
    worker = threading.Thread(target=lambda: results.append(m.call("busy", X)))
    worker.start()
    assert started.wait(10)
    with pytest.raises(ServiceInUseError, match="'busy' is in use on GPUs \\[0\\]"):
        m.evict("busy")
    assert m.call("b", X).ok  # fits beside busy
    out = m.call("c", X)  # must evict: b is idle, busy is pinned (and was used less recently)
    assert out.ok and out.evicted == (("b", 0),)
    assert "busy" in m.residency()
    release.set()
    worker.join(10)
    assert results[0].ok and torch.allclose(results[0].value, reference(1, 0, X))


def test_a_call_waits_for_room_held_by_a_running_call(managers) -> None:
    started, release = threading.Event(), threading.Event()
    m = managers(config(devices=1, units=1.02, calls_per_gpu=2))
    m.register(blob_spec("busy", call=_blocking_call(started, release)))
    m.register(blob_spec("next", seed=4))
    results: dict[str, object] = {}
    t1 = threading.Thread(target=lambda: results.__setitem__("busy", m.call("busy", X)))
    t1.start()
    assert started.wait(10)
    calling = threading.Event()

    def call_next() -> None:
        calling.set()
        results["next"] = m.call("next", X)

    t2 = threading.Thread(target=call_next)
    t2.start()
    assert calling.wait(10)  # (a thread may take a while to start on a busy machine)
    time.sleep(0.4)
    assert "next" not in results and m.residency() == {"busy": (0,)}
    release.set()
    t1.join(10)
    t2.join(10)
    nxt = results["next"]
    assert nxt.ok and nxt.evicted == (("busy", 0),) and nxt.queue_s >= 0.3
    assert torch.allclose(nxt.value, reference(1, 4, X))


def test_calls_on_a_busy_cell_queue(managers) -> None:
    started, release = threading.Event(), threading.Event()
    m = managers(config(devices=1, units=4))
    m.register(blob_spec("busy", call=_blocking_call(started, release)))
    m.register(blob_spec("other"))
    t = threading.Thread(target=lambda: m.call("busy", X))
    t.start()
    assert started.wait(10)
    threading.Timer(0.3, release.set).start()
    out = m.call("other", X, gpus=(0,))  # one call per GPU: waits for the cell
    t.join(10)
    assert out.ok and out.queue_s >= 0.2


def test_queue_timeout_for_gpus_and_for_memory(managers) -> None:
    started, release = threading.Event(), threading.Event()
    m = managers(config(devices=1, units=1.02, calls_per_gpu=2))
    m.register(blob_spec("busy", call=_blocking_call(started, release)))
    m.register(blob_spec("other", seed=3))
    t = threading.Thread(target=lambda: m.call("busy", X))
    second = threading.Thread(target=lambda: m.call("busy", X))
    t.start()
    assert started.wait(10)
    try:
        # Memory: "other" needs busy's bytes, which stay pinned.
        out = m.call("other", X, timeout_s=0.3)
        assert isinstance(out.error, QueueTimeoutError) and "for memory" in out.message
        assert 0.25 <= out.queue_s < 2 and out.exec_s == 0
        # GPUs: with calls_per_gpu=2 one more call fits beside busy, a third waits.
        second.start()
        deadline = time.monotonic() + 10  # until the second call holds the GPU's other slot
        while m.stats().devices[0].running_calls < 2:
            assert time.monotonic() < deadline, "the second call never started"
            time.sleep(0.01)
        out = m.call("other", X, gpus=(0,), timeout_s=0.2)
        assert isinstance(out.error, QueueTimeoutError) and "free GPUs" in out.message
    finally:
        release.set()
        t.join(10)
        if second.is_alive():
            second.join(10)
    assert m.call("other", X, timeout_s=5).ok  # nothing left held: proceeds at once
    assert m.stats().devices[0].claimed_bytes == UNIT


def test_a_call_timed_out_waiting_for_its_gpus_reports_that_wait(managers) -> None:
    """The time a call waited for a busy cell before its time-out is its queue_s (it was
    added only once the wait ended with a cell: a timed-out call reported 0)."""
    started, release = threading.Event(), threading.Event()
    m = managers(config(devices=1, units=4))
    m.register(blob_spec("busy", call=_blocking_call(started, release)))
    m.register(blob_spec("other"))
    t = threading.Thread(target=lambda: m.call("busy", X))
    t.start()
    try:
        assert started.wait(10)
        out = m.call("other", X, gpus=(0,), timeout_s=0.3)
    finally:
        release.set()
        t.join(10)
    assert isinstance(out.error, QueueTimeoutError) and "free GPUs" in out.message
    assert 0.25 <= out.queue_s <= out.total_s


def test_workspace_is_claimed_only_while_a_call_runs(managers) -> None:
    started, release = threading.Event(), threading.Event()
    m = managers(config(devices=1, units=4))
    info = m.register(blob_spec("w", call=_blocking_call(started, release), workspace_bytes=UNIT))
    assert info.need_bytes == info.resident_bytes + UNIT
    t = threading.Thread(target=lambda: m.call("w", X))
    t.start()
    assert started.wait(10)
    assert m.stats().devices[0].claimed_bytes == info.resident_bytes + UNIT
    release.set()
    t.join(10)
    assert m.stats().devices[0].claimed_bytes == info.resident_bytes


def test_declared_memory_is_what_residency_claims(managers) -> None:
    m = managers(config(devices=1, units=3.02))
    info = m.register(blob_spec("fat", units=1, memory_bytes=2 * UNIT))
    m.register(blob_spec("thin", units=1))
    assert info.resident_bytes == 2 * UNIT and info.replica_bytes == UNIT
    m.call("fat", X).unwrap()
    m.call("thin", X).unwrap()
    assert m.stats().devices[0].claimed_bytes == 3 * UNIT
    m.register(blob_spec("third"))
    assert m.call("third", X).evicted == (("fat", 0),)


# --- errors -----------------------------------------------------------------------------------


def test_unknown_service_is_an_error_outcome(managers) -> None:
    m = managers(config())
    m.register(blob_spec("a"))
    out = m.call("nope", X)
    assert out.status == "error" and not out.ok and out.value is None
    assert isinstance(out.error, UnknownServiceError)
    assert "unknown service 'nope' (registered: a)" in out.message
    with pytest.raises(UnknownServiceError):
        out.unwrap()
    with pytest.raises(UnknownServiceError):
        m.evict("nope")
    assert m.call("a", X).ok


def test_model_larger_than_any_cell(managers) -> None:
    m = managers(config(devices=2, units=2))
    with pytest.raises(
        ServiceTooLargeError, match=r"'huge' needs \d+ bytes per GPU .*largest GPU budget"
    ):
        m.register(blob_spec("huge", units=m.devices[0].budget_bytes // UNIT + 1))
    with pytest.raises(ServiceTooLargeError, match="workspace"):
        m.register(blob_spec("ws", units=1, workspace_bytes=m.devices[0].budget_bytes))
    assert "huge" not in m.services()
    m.register(blob_spec("ok"))
    assert m.call("ok", X, dop=2).ok


def test_model_larger_than_the_chosen_cell(managers) -> None:
    if BACKEND != "cpu":
        pytest.skip("uses CPU devices of different budgets")
    m = managers(EoeConfig(backend="cpu"), devices=[CpuDevice(0, 4 * UNIT), CpuDevice(1, UNIT)])
    m.register(blob_spec("two", units=2))
    out = m.call("two", X, gpus=(1,))
    assert isinstance(out.error, ServiceTooLargeError) and "GPUs [1]" in out.message
    assert m.call("two", X).gpus == (0,)  # the manager picks the GPU that can hold it
    assert isinstance(m.call("two", X, dop=2).error, ServiceTooLargeError)


def test_call_function_that_raises(managers) -> None:
    def bad(module: nn.Module, x: torch.Tensor) -> torch.Tensor:
        weights = module.w  # a local that references the replica's buffer  # noqa: F841
        raise ValueError("bad input shape")

    m = managers(config(devices=1, units=4))
    m.register(blob_spec("bad", call=bad))
    m.register(blob_spec("good"))
    out = m.call("bad", X)
    assert isinstance(out.error, CallFailedError)
    assert "service 'bad' raised ValueError on GPU 0: bad input shape" in out.message
    assert isinstance(out.error.__cause__, ValueError)
    assert "bad input shape" in out.detail and "Traceback" in out.detail
    assert m.call("good", X).ok
    # The failed call's frames do not keep the replica alive: eviction frees it for real.
    base = m.devices[0].allocated_bytes()
    freed = m.evict("bad").bytes_freed
    assert m.devices[0].allocated_bytes() == base - freed and freed > 0
    assert m.stats().unverified_evictions == 0
    assert m.stats().errors_by_type == {"CallFailedError": 1}


def test_a_call_that_raises_reports_the_time_it_ran(managers) -> None:
    """A call whose function raised ran: its exec_s is that time (it was set only once the
    call returned, so a failed call said exec_s 0, and so did its action's outcome)."""

    def slow_then_bad(module: nn.Module, x: torch.Tensor) -> torch.Tensor:
        time.sleep(0.1)
        raise ValueError("bad input shape")

    m = managers(config(devices=1, units=4))
    m.register(blob_spec("bad", call=slow_then_bad))
    out = m.call("bad", X)
    assert isinstance(out.error, CallFailedError)
    assert 0.1 <= out.exec_s <= out.total_s


BAD_TOKENS = {
    "an id past the vocabulary": (torch.full((2, 8), 512), "vocabulary [0, 512)"),
    "a negative id": (torch.full((2, 8), -1), "vocabulary [0, 512)"),
    "float ids": (torch.ones((2, 8)), "integer token ids"),
    "bool ids": (torch.ones((2, 8), dtype=torch.bool), "integer token ids"),
    "one dimension": (torch.ones(8, dtype=torch.long), "2-D"),
    "three dimensions": (torch.ones((1, 2, 8), dtype=torch.long), "2-D"),
    "a list": ([[1, 2, 3]], "2-D"),
    "no tokens": (torch.ones((2, 0), dtype=torch.long), "at least"),
}


@pytest.mark.parametrize("bad", sorted(BAD_TOKENS))
def test_the_example_services_refuse_ill_formed_tokens_naming_the_problem(
    managers, bad: str
) -> None:
    """The example services (``tangram serve`` registers them) looked any ids up: one past
    the vocabulary was 'index out of range in self' here, and on a CUDA device an
    out-of-range embedding lookup is a device-side assert, after which every call of the
    process fails; other shapes failed with whatever torch said ('tuple index out of range',
    'The size of tensor a (16) must match ...'). The model-directory services check theirs
    (b09c03c); these now do too, and the next call gets the same result as before."""
    tokens, says = BAD_TOKENS[bad]
    m = managers(config(devices=1, units=8 * MIB / UNIT))
    m.register(reward_model_spec("reward", "tiny"))
    m.register(teacher_spec("teacher", "tiny"))
    good = example_tokens(batch=2, seq_len=8)
    before = {s: m.call(s, good).value for s in ("reward", "teacher")}
    for service in ("reward", "teacher"):
        out = m.call(service, tokens)
        assert isinstance(out.error, CallFailedError), out
        assert "raised ValueError" in out.message and says in out.message, out.message
        assert torch.equal(m.call(service, good).value, before[service])


def test_out_of_memory_during_restore_from_memory_used_elsewhere(managers) -> None:
    m = managers(config(devices=1, units=4))
    m.register(blob_spec("a", units=2))
    m.register(blob_spec("b", units=1))
    hog = m.devices[0].alloc(int(2.5 * UNIT))  # someone else's tensor on the device
    out = m.call("a", X)
    assert isinstance(out.error, RestoreOutOfMemoryError)
    assert (
        f"needs {2 * UNIT} bytes on GPU 0" in out.message
        and "used outside the executor" in out.message
    )
    assert m.residency() == {} and m.stats().devices[0].claimed_bytes == 0
    assert m.call("b", X).ok  # still serving what fits
    del hog
    assert m.call("a", X).ok


def test_out_of_memory_raised_by_the_allocator(managers, monkeypatch) -> None:
    m = managers(config(devices=2, units=4))
    m.register(blob_spec("a"))
    dev = m.devices[1]
    real = dev.alloc

    def failing(nbytes: int) -> torch.Tensor:
        raise DeviceOutOfMemoryError(f"device 1: CUDA out of memory allocating {nbytes} bytes")

    monkeypatch.setattr(dev, "alloc", failing)
    out = m.call("a", X, dop=2)
    assert isinstance(out.error, RestoreOutOfMemoryError)
    assert "out of memory restoring" in out.message and "GPU 1" in out.message
    # All or nothing: the replica restored on GPU 0 for this call was dropped too.
    assert m.residency() == {}
    assert [d.claimed_bytes for d in m.stats().devices] == [0, 0]
    assert m.devices[0].allocated_bytes() == 0 or BACKEND == "cuda"
    monkeypatch.setattr(dev, "alloc", real)
    again = m.call("a", X, dop=2)
    assert again.ok and again.restored_gpus == (0, 1)


def test_a_restore_whose_copies_fail_leaves_no_bytes_booked(managers, monkeypatch) -> None:
    """Waiting for the copies raised (a CUDA error surfaces at the synchronize): the call
    ends with RestoreError and the books let go of what the restore had allocated. The
    allocation stayed counted as the manager's own (live) for good, hiding as much foreign
    memory from every later plan on that GPU."""
    import tangram.exec.eoe.manager as manager_module

    def broken(fences: object) -> None:
        raise RuntimeError("CUDA error: an illegal memory access was encountered")

    m = managers(config(devices=1, units=4))
    m.register(blob_spec("a"))
    monkeypatch.setattr(manager_module, "wait_for_copies", broken)
    out = m.call("a", X)
    assert isinstance(out.error, RestoreError) and "illegal memory access" in out.message, out
    assert m._ledger.live == [0] and m.stats().devices[0].claimed_bytes == 0
    assert m.residency() == {}
    monkeypatch.undo()
    assert m.call("a", X).ok and m._ledger.live == [UNIT] or BACKEND == "cuda"


def test_dop_and_cell_errors(managers) -> None:
    m = managers(config(devices=2, units=4))
    m.register(blob_spec("one", dops=(1,)))
    m.register(blob_spec("any", dops=(1, 2, 4)))
    assert isinstance(m.call("one", X, dop=2).error, DopNotSupportedError)
    out = m.call("any", X, dop=4)
    assert isinstance(out.error, DopNotSupportedError) and "has 2" in out.message
    assert isinstance(m.call("any", X, gpus=(0, 1), dop=1).error, InvalidCellError)
    assert isinstance(m.call("any", X, gpus=(3,)).error, InvalidCellError)
    assert m.call("any", X, gpus=(0, 1)).dop == 2  # dop taken from the cell
    split = m.call("any", (torch.zeros(3), torch.zeros(4)), dop=2)
    assert isinstance(split.error, InputSplitError) and "batch sizes" in split.message


@pytest.mark.parametrize(
    ("kw", "error", "words"),
    [
        ({"dop": 2.0}, DopNotSupportedError, "not 2.0"),
        ({"dop": True}, DopNotSupportedError, "not True"),
        ({"dop": "1"}, DopNotSupportedError, "not '1'"),
        ({"gpus": 0}, InvalidCellError, "tuple of GPU indices"),
        ({"gpus": (0.9,)}, InvalidCellError, "tuple of GPU indices"),
        ({"gpus": (True,)}, InvalidCellError, "tuple of GPU indices"),
        ({"gpus": ("1",)}, InvalidCellError, "tuple of GPU indices"),
        ({"dop": [1]}, DopNotSupportedError, "not [1]"),
    ],
)
def test_a_dop_or_cell_of_the_wrong_type_is_refused_naming_it(
    managers, kw: dict, error: type, words: str
) -> None:
    """dop=2.0 and gpus=0 came back as 'unexpected TypeError in the executor' (our bug, by
    its words), dop=True ran at DoP 1 with the outcome's dop True, gpus=(0.9,) ran on GPU 0
    (int() truncated it) and gpus=('1',) on GPU 1. The refused call's outcome kept the raw
    dop ('1', 2.0, a list) where CallOutcome.dop is an int: 0 when there is none."""
    m = managers(config(devices=2, units=4))
    m.register(blob_spec("any", dops=(1, 2)))
    out = m.call("any", X, **kw)
    assert isinstance(out.error, error), out
    assert words in out.message, out.message
    assert type(out.dop) is int and out.dop == 0, out.dop
    assert m.stats().errors_by_type.get("ExecutorError") is None


def test_registration_errors(managers) -> None:
    m = managers(config(devices=1, units=4, host_memory_bytes=2 * UNIT + 1024))
    m.register(blob_spec("a"))
    with pytest.raises(DuplicateServiceError):
        m.register(blob_spec("a"))
    with pytest.raises(ServiceSpecError, match="declares memory_bytes=10 but"):
        m.register(blob_spec("small-claim", memory_bytes=10))

    def broken() -> nn.Module:
        raise OSError("checkpoint missing")

    with pytest.raises(ServiceSpecError, match="factory raised OSError: checkpoint missing"):
        m.register(ServiceSpec("broken", factory=broken, call=lambda mod, x: x))
    with pytest.raises(ServiceSpecError, match="not a torch.nn.Module"):
        m.register(ServiceSpec("nomod", factory=lambda: 3, call=lambda mod, x: x))
    m.register(blob_spec("b"))
    with pytest.raises(HostMemoryError, match="over the host budget"):
        m.register(blob_spec("c"))
    assert m.services() == ("a", "b")


def test_an_over_budget_model_is_refused_before_its_weights_are_read(managers) -> None:
    """The host budget is checked from the backup's size before the backup is allocated and
    its weights read: an over-budget model was read whole into host memory, then refused.
    The refusal leaves the budget as it was."""
    from tangram.exec.eoe.backup import LazyWeights

    reads: list[tuple[str, ...]] = []
    side = math.isqrt(UNIT) + 1

    def lazy() -> LazyWeights:
        with torch.device("meta"):
            module = nn.Linear(side, side)  # about 4 UNITs of weights

        def read(names: tuple[str, ...]) -> torch.Tensor:
            reads.append(names)
            return torch.zeros(dict(module.named_parameters())[names[0]].shape)

        return LazyWeights(module, read)

    m = managers(config(devices=1, units=8, host_memory_bytes=2 * UNIT + 1024))
    spec = ServiceSpec("big", factory=lazy, call=lambda mod, x: mod(x))
    with pytest.raises(HostMemoryError, match="'big'.*over the host budget"):
        m.register(spec)
    assert reads == [] and m.services() == ()
    m.register(blob_spec("a"))  # nothing of 'big' is left counted
    assert m.services() == ("a",)


def _lazy_linear(read: Callable[[tuple[str, ...]], Any]) -> Callable[[], Any]:
    from tangram.exec.eoe.backup import LazyWeights

    def factory() -> LazyWeights:
        with torch.device("meta"):
            module = nn.Linear(4, 4)
        return LazyWeights(module, read)

    return factory


def _gone(names: tuple[str, ...]) -> torch.Tensor:
    raise OSError(f"the file holding {names[0]} is gone")


@pytest.mark.parametrize(
    ("read", "words"),
    [
        (_gone, "tensor 'weight': reading its weights raised OSError: the file holding"),
        (lambda names: [1, 2], "tensor 'weight': reading its weights gave list, not a tensor"),
    ],
    ids=["raises", "no-tensor"],
)
def test_a_lazy_weights_read_that_fails_is_a_spec_error_naming_the_tensor(
    managers, read: Callable[[tuple[str, ...]], Any], words: str
) -> None:
    """A factory's LazyWeights read runs at register, as the backup is filled: one that
    raised (a weights file gone or cut short) or gave no tensor went out of register as
    that bare exception (OSError, "AttributeError: 'list' object has no attribute
    'shape'"), where a factory's failure is a ServiceSpecError. It is one, naming the
    tensor; nothing stays booked."""
    m = managers(config(devices=1, units=4))
    with pytest.raises(ServiceSpecError, match=re.escape(words)):
        m.register(ServiceSpec("lazy", factory=_lazy_linear(read), call=lambda mod, x: mod(x)))
    assert m.services() == () and m._host_bytes == 0
    good = _lazy_linear(lambda names: torch.ones(4, 4) if names[0] == "weight" else torch.ones(4))
    m.register(ServiceSpec("lazy", factory=good, call=_id))
    assert m.services() == ("lazy",)


def _id(module: nn.Module, x: Any) -> Any:
    return x


class _Locked(nn.Linear):
    """A module holding a lock (as one guarding a cache may), which deepcopy cannot copy."""

    def __init__(self) -> None:
        super().__init__(4, 4)
        self.lock = threading.Lock()


def test_a_module_that_cannot_be_copied_is_refused_at_register(managers) -> None:
    """Each replica is a deep copy of the module's weightless template: a module holding a
    lock was registered, and every call of it then failed as a RestoreError ('cannot pickle
    '_thread.lock' object'), for good. It is refused at register, saying so; nothing of it
    stays booked."""
    m = managers(config(devices=1, units=4))
    with pytest.raises(ServiceSpecError, match="the module cannot be copied.*_thread.lock"):
        m.register(ServiceSpec("locked", factory=_Locked, call=lambda mod, x: mod(x)))
    assert m.services() == () and m._host_bytes == 0


def test_unregister(managers) -> None:
    m = managers(config())
    m.register(blob_spec("a"))
    m.call("a", X).unwrap()
    m.unregister("a")
    assert m.services() == () and m.residency() == {}
    assert isinstance(m.call("a", X).error, UnknownServiceError)
    m.register(blob_spec("a", seed=7))  # the name is free again
    assert torch.allclose(m.call("a", X).unwrap(), reference(1, 7, X))


def test_a_call_waiting_while_its_service_is_unregistered_restores_nothing(
    managers, monkeypatch
) -> None:
    """A call that waited for its GPUs while its service was unregistered (and another spec
    registered under the name) ends with UnknownServiceError: it restored the old weights,
    left them resident, and the new service's calls then ran on them."""
    import tangram.exec.eoe.manager as manager_module

    started, release, waiting = threading.Event(), threading.Event(), threading.Event()
    choose = manager_module.choose_cell

    def choose_and_tell(*args: object, **kw: object):
        choice = choose(*args, **kw)
        if choice is None and threading.current_thread().name == "waiter":
            waiting.set()  # (under the manager's condition: it waits before anyone else runs)
        return choice

    monkeypatch.setattr(manager_module, "choose_cell", choose_and_tell)
    m = managers(config(devices=1, units=4))
    m.register(blob_spec("busy", call=_blocking_call(started, release)))
    m.register(blob_spec("a", seed=0))
    results: list = []
    t = threading.Thread(target=lambda: m.call("busy", X))
    waiter = threading.Thread(target=lambda: results.append(m.call("a", X)), name="waiter")
    t.start()
    try:
        assert started.wait(10)
        waiter.start()
        assert waiting.wait(10)
        m.unregister("a")
        m.register(blob_spec("a", seed=7))
    finally:
        release.set()
        t.join(10)
        waiter.join(10)
    assert isinstance(results[0].error, UnknownServiceError), results[0]
    assert torch.allclose(m.call("a", X).unwrap(), reference(1, 7, X))


def test_closed_manager(managers) -> None:
    m = managers(config())
    m.register(blob_spec("a"))
    m.call("a", X).unwrap()
    m.close()
    assert isinstance(m.call("a", X).error, ManagerClosedError)
    assert m.residency() == {} and m.devices[0].allocated_bytes() == 0 or BACKEND == "cuda"


def test_a_call_running_at_close_frees_its_replicas_when_it_ends(managers) -> None:
    """close evicts the idle replicas; one a call was using then is evicted when that call
    ends: it stayed resident, its device memory held for as long as the process lived."""
    started, release = threading.Event(), threading.Event()
    m = managers(config(devices=1, units=4))
    m.register(blob_spec("busy", call=_blocking_call(started, release)))
    m.register(blob_spec("idle"))
    assert m.call("idle", X).ok
    results: list = []
    t = threading.Thread(target=lambda: results.append(m.call("busy", X)))
    t.start()
    try:
        assert started.wait(10)
        m.close()
        assert m.residency() == {"busy": (0,)}  # in use: it stays while the call runs
    finally:
        release.set()
        t.join(10)
    assert results[0].ok  # a call that has started running is never interrupted
    assert m.residency() == {} and m.stats().devices[0].claimed_bytes == 0
    assert m.devices[0].allocated_bytes() == 0 or BACKEND == "cuda"


def test_stats_count_hits_misses_and_errors(managers) -> None:
    m = managers(config(devices=1, units=4))
    m.register(blob_spec("a"))
    m.call("a", X)
    m.call("a", X)
    m.call("zz", X)
    s = m.stats()
    assert (s.calls, s.ok, s.errors, s.hits, s.misses) == (3, 2, 1, 1, 1)
    assert s.restores == 1 and s.bytes_restored == UNIT
    assert s.devices[0].resident == ("a",) and s.devices[0].claimed_bytes == UNIT
    assert s.as_dict()["devices"][0]["budget_bytes"] == m.devices[0].budget_bytes


def test_the_replica_threads_of_a_call_running_past_close_do_not_outlive_it() -> None:
    """A call at DoP 2 that was running when the manager closed runs its second part on a
    thread of its own, not on a new pool: the pool made after close was never shut down (and
    one shut down between a call's look-up and its submit failed the call)."""
    from types import SimpleNamespace

    from tangram.exec.eoe.bookkeeping import Replica, Service
    from tangram.exec.eoe.execution import ReplicaRunner

    devices = [CpuDevice(0, UNIT), CpuDevice(1, UNIT)]
    runner = ReplicaRunner(devices, 2)
    spec = ServiceSpec("double", factory=nn.Identity, call=lambda module, x: x * 2)
    service = Service(spec, None, SimpleNamespace(shards=1))  # type: ignore[arg-type]
    replicas = [Replica("double", g, 0) for g in (0, 1)]
    assert torch.equal(runner.run(service, replicas, X), X * 2)
    assert runner._pool is not None
    runner.close()
    before = threading.active_count()
    assert torch.equal(runner.run(service, replicas, X), X * 2)
    assert runner._pool is None and threading.active_count() == before


class GatedDevice(CpuDevice):
    """A CPU device whose allocations wait for ``gate`` while ``hold`` is set: a restore that
    takes as long as the test wants (it holds the GPU's device lock meanwhile)."""

    def __init__(self, index: int, budget_bytes: int) -> None:
        super().__init__(index, budget_bytes)
        self.hold, self.held, self.gate = threading.Event(), threading.Event(), threading.Event()

    def alloc(self, nbytes: int) -> torch.Tensor:
        if self.hold.is_set():
            self.held.set()
            assert self.gate.wait(10), "the test never opened the gate"
        return super().alloc(nbytes)


def test_a_call_waiting_for_another_calls_restore_on_its_gpu_keeps_its_time_out() -> None:
    """With calls_per_gpu > 1, a call whose restore must wait for another call's restore on
    the same GPU (the GPU's device lock) waited without its timeout_s and without counting
    the wait anywhere: it came back ok after the whole restore with queue_s 0."""
    device = GatedDevice(0, 4 * UNIT)
    with EoeManager(EoeConfig(calls_per_gpu=2), devices=[device]) as m:
        m.register(blob_spec("slow"))
        m.register(blob_spec("quick", seed=1))
        device.hold.set()
        slow: list = []
        t = threading.Thread(target=lambda: slow.append(m.call("slow", X)))
        opener = threading.Timer(3, device.gate.set)  # (before the fix: the wait's only end)
        t.start()
        try:
            assert device.held.wait(10), "the slow restore never started"
            device.hold.clear()
            opener.start()
            out = m.call("quick", X, timeout_s=0.3)
        finally:
            opener.cancel()
            device.gate.set()
            t.join(10)
        assert slow[0].ok
        assert isinstance(out.error, QueueTimeoutError), out
        assert "for memory" in out.message and 0.25 <= out.queue_s <= out.total_s
        assert m.stats().devices[0].claimed_bytes == UNIT  # only 'slow' is resident
        assert m.residency() == {"slow": (0,)}
        assert m.call("quick", X, timeout_s=0).ok  # nothing to wait for: it restores and runs


@pytest.mark.parametrize("name", [["a"], {"a": 1}, None, 0])
def test_a_service_named_by_no_string_is_refused_naming_it(managers, name: object) -> None:
    """A call naming its service by a list (or a dict) came back as 'unexpected TypeError in
    the executor: unhashable type' (our bug, by its words) and evict/info raised that
    TypeError bare; None and 0 were 'unknown service' beside the registered names. The
    outcome kept the object itself as its service (a str field: a list or dict there made
    the frozen outcome unhashable); it is now the object's repr."""
    m = managers(config())
    m.register(blob_spec("a"))
    out = m.call(name, X)  # type: ignore[arg-type]
    assert isinstance(out.error, UnknownServiceError), out
    assert "a service is named by a string" in out.message and repr(name) in out.message
    assert out.service == repr(name)
    for refused in (m.evict, m.info, m.spec, m.unregister):
        with pytest.raises(UnknownServiceError, match="named by a string"):
            refused(name)  # type: ignore[arg-type]
    assert m.call("a", X).ok


@pytest.mark.parametrize("spec", ["a", None, {"name": "a"}])
def test_registering_what_is_no_service_spec_is_refused_naming_it(managers, spec: object) -> None:
    """register('a') (or None, or a dict) was "AttributeError: 'str' object has no attribute
    'name'", from the duplicate check that reads the name before the registry's own check."""
    m = managers(config())
    with pytest.raises(
        ServiceSpecError, match=f"expected a ServiceSpec, got {type(spec).__name__}"
    ):
        m.register(spec)  # type: ignore[arg-type]
    assert m.services() == () and m.register(blob_spec("a")).name == "a"


def test_an_unregister_overtaken_by_another_leaves_the_name_as_the_other_made_it(
    managers, monkeypatch
) -> None:
    """Two unregisters of one service: the one that evicted first but forgot it last popped
    whatever was registered under the name by then, a new service registered meanwhile
    (forgotten, its host bytes uncounted), or found nothing (a bare KeyError)."""
    m = managers(config())
    m.register(blob_spec("a"))
    evicted, go = threading.Event(), threading.Event()
    real_evict = m.evict

    def evict_and_pause(service: str, gpus: object = None) -> object:
        out = real_evict(service, gpus)  # type: ignore[arg-type]
        if threading.current_thread().name == "first":
            evicted.set()
            assert go.wait(10), "the test never let the first unregister go on"
        return out

    monkeypatch.setattr(m, "evict", evict_and_pause)
    errors: list[BaseException] = []

    def unregister() -> None:
        try:
            m.unregister("a")
        except BaseException as exc:  # noqa: BLE001 - what it raised is the point
            errors.append(exc)

    first = threading.Thread(target=unregister, name="first")
    first.start()
    try:
        assert evicted.wait(10)
        m.unregister("a")  # overtakes it
        m.register(blob_spec("a", seed=7))  # the name is free again
    finally:
        go.set()
        first.join(10)
    assert len(errors) == 1 and isinstance(errors[0], UnknownServiceError), errors
    assert m.services() == ("a",)
    assert torch.allclose(m.call("a", X).unwrap(), reference(1, 7, X))


def test_a_result_that_views_the_replicas_weights_does_not_hold_them_after_eviction(
    managers,
) -> None:
    """A call returning a view of its replica's weights (a slice of a parameter) handed the
    caller the device buffer itself on a CPU device (.to('cpu') of a CPU tensor is the same
    tensor; a GPU's result is a copy): the evicted replica's bytes stayed allocated for as
    long as the caller kept the result, an unverified eviction, and the next service that
    needed them failed as out of memory."""
    m = managers(config(devices=1, units=1.02))
    m.register(blob_spec("viewer", call=lambda module, x: module.w[:4]))
    m.register(blob_spec("next", seed=1))
    kept = m.call("viewer", X).unwrap()
    assert torch.equal(kept, Blob(1, 0).w[:4])
    out = m.call("next", X)
    assert out.ok and out.evicted == (("viewer", 0),), out.message
    assert m.stats().unverified_evictions == 0
    assert same_bytes(m.devices[0].allocated_bytes(), UNIT)
    assert torch.equal(kept, Blob(1, 0).w[:4])  # the caller's result is intact


def _cyclic_list() -> list:
    looped: list = [X]
    looped.append(looped)
    return looped


def _cyclic_dict() -> dict:
    looped: dict = {"x": X}
    looped["self"] = {"again": looped}
    return looped


@pytest.mark.parametrize("make", [_cyclic_list, _cyclic_dict], ids=["list", "dict"])
def test_inputs_or_a_result_that_contain_themselves_are_refused_naming_it(managers, make) -> None:
    """A list (or dict) holding itself in a call's inputs or in its result made the walk
    that moves their tensors recurse without end: a RecursionError wrapped in
    CallFailedError as if the service had raised it ('service raised RecursionError'). The
    inputs are refused (CallArgumentError, the service never ran) and the result is a
    CallFailedError saying it contains itself; the same list reached twice is no cycle."""
    ran: list[object] = []

    def call(module: nn.Module, x: object) -> object:
        ran.append(x)
        return make() if isinstance(x, torch.Tensor) else x[0] * 2

    m = managers(config())
    m.register(blob_spec("a", call=call, dops=(1,)))
    out = m.call("a", make())
    assert isinstance(out.error, CallArgumentError), out
    assert "contains itself" in str(out.error) and ran == []
    out = m.call("a", X)
    assert isinstance(out.error, CallFailedError), out
    assert "contains itself" in str(out.error) and "RecursionError" not in str(out.error)
    shared = [X]
    twice = m.call("a", [shared, shared]).unwrap()  # (shared * 2: [X, X])
    assert len(twice) == 2 and all(torch.equal(t, X) for t in twice)
    deep: list = [X]
    for _ in range(5000):
        deep = [deep]
    out = m.call("a", deep)
    assert isinstance(out.error, CallArgumentError) and "nested too deeply" in str(out.error)


def test_inputs_holding_themselves_split_across_replicas_are_refused_naming_it(managers) -> None:
    """At DoP 2 the default split walked a dict holding itself without end: an
    InputSplitError saying only 'RecursionError: maximum recursion depth exceeded'. It says
    the inputs hold a value that contains itself."""
    m = managers(config(devices=2))
    m.register(blob_spec("a"))
    out = m.call("a", _cyclic_dict(), dop=2)
    assert isinstance(out.error, InputSplitError), out
    assert "contains itself" in str(out.error)


def _recursing_merge(results: list) -> object:
    return _recursing_merge(results)  # (a merge walking a result that holds itself)


class _TwoLayers(nn.Module):
    """A model of two layers, which a service of shards=2 splits one layer per GPU."""

    def __init__(self) -> None:
        super().__init__()
        self.layers = nn.ModuleList([nn.Linear(6, 6), nn.Linear(6, 6)])

    def forward(self, x: Any) -> torch.Tensor:
        return self.layers[1](self.layers[0](x))


def _looped_layer_input(module: nn.Module, x: torch.Tensor) -> torch.Tensor:
    return module(_cyclic_list())  # (a call handing its model a list holding itself)


def test_a_merge_or_a_shard_hook_recursing_without_end_is_refused_naming_the_cause(
    managers,
) -> None:
    """A service's own merge recursing without end (walking a result that holds itself) failed
    the call as 'merging ... failed: RecursionError: maximum recursion depth exceeded', and a
    sharded model's layer hook walked inputs holding themselves the same way ('service raised
    RecursionError'): neither named the cause. The merge's failure says the results hold a
    value that contains itself (as the split's does), the hook's names the list."""
    m = managers(config(devices=2))
    m.register(blob_spec("a", merge=_recursing_merge))
    out = m.call("a", X.reshape(2, 3), dop=2)
    assert isinstance(out.error, CallFailedError), out
    assert "contains itself" in str(out.error) and "RecursionError" not in str(out.error)
    m.register(ServiceSpec("s", factory=_TwoLayers, call=_looped_layer_input, dops=(2,), shards=2))
    out = m.call("s", X)
    assert isinstance(out.error, CallFailedError), out
    assert "holds a list that contains itself" in str(out.error), out


def _exits(module: nn.Module, x: torch.Tensor) -> torch.Tensor:
    raise SystemExit(3)  # (a library that calls sys.exit on what it dislikes)


@pytest.mark.parametrize("dop", [1, 2])
def test_a_call_function_that_exits_is_one_failed_outcome(managers, dop: int) -> None:
    """A service's call function raising SystemExit (sys.exit() in it) got no outcome: the
    exception left manager.call itself, and in the live runtime's thread pool it reached the
    event loop, which stops on SystemExit: every other caller's work with it."""
    m = managers(config(devices=2))
    m.register(blob_spec("exits", call=_exits))
    m.register(blob_spec("fine", seed=1))
    out = m.call("exits", X, dop=dop)
    assert isinstance(out.error, CallFailedError), out
    assert "SystemExit" in out.message and out.gpus == tuple(range(dop))
    assert m.stats().errors == 1 and [d.running_calls for d in m.stats().devices] == [0, 0]
    assert m.evict("exits").gpus == tuple(range(dop))  # nothing of the call still pins it
    assert torch.allclose(m.call("fine", X).unwrap(), reference(1, 1, X))


def test_a_register_that_ends_after_close_is_refused(monkeypatch) -> None:
    """A register under way when the manager closed (its factory still running) added the
    service to the closed manager: register returned as if it could be called, and its host
    backup was held (and counted) for as long as the manager lived."""
    import tangram.exec.eoe.manager as manager_module

    building, go = threading.Event(), threading.Event()
    build = manager_module.build_service

    def slow_build(*args: object, **kw: object) -> object:
        building.set()
        assert go.wait(10), "the test never let the build go on"
        return build(*args, **kw)

    monkeypatch.setattr(manager_module, "build_service", slow_build)
    m = EoeManager(config())
    done: list[BaseException | object] = []

    def register() -> None:
        try:
            done.append(m.register(blob_spec("late")))
        except BaseException as exc:  # noqa: BLE001 - what it raised is the point
            done.append(exc)

    t = threading.Thread(target=register)
    t.start()
    try:
        assert building.wait(10)
        m.close()
    finally:
        go.set()
        t.join(10)
    assert isinstance(done[0], ManagerClosedError), done
    assert m.services() == () and m._host_bytes == 0


@pytest.mark.parametrize("dtype", [torch.uint8, torch.int8, torch.int16, torch.int32])
def test_the_example_services_take_token_ids_of_any_integer_dtype(managers, dtype) -> None:
    """check_tokens let ids of any integer dtype through, and those of uint8, int8 or int16
    failed in the model with torch's words ('Expected tensor for argument #1 'indices' to
    have one of the following scalar types: Long, Int'). They now give the int64 result."""
    m = managers(config(devices=1, units=8 * MIB / UNIT))
    m.register(reward_model_spec("reward", "tiny"))
    m.register(teacher_spec("teacher", "tiny"))
    tokens = example_tokens(batch=2, seq_len=8) % 100
    for service in ("reward", "teacher"):
        want = m.call(service, tokens).unwrap()
        out = m.call(service, tokens.to(dtype))
        assert out.ok, out.message
        assert torch.equal(out.value, want), service


@pytest.mark.parametrize("indices", [(1,), (0, 0), (1, 0)])
def test_devices_not_indexed_by_their_places_are_refused_naming_them(indices) -> None:
    """The manager books each GPU by its place in ``devices`` but stats() (and an engine's
    home) read each device's own index: devices [1] made stats() an IndexError, and [0, 0]
    reported GPU 0's claims and calls for both, the second's books never shown."""
    with pytest.raises(ValueError, match=r"devices must be indexed 0\.\.n-1 in order, got"):
        EoeManager(EoeConfig(backend="cpu"), devices=[CpuDevice(i, UNIT) for i in indices])


def test_a_split_that_returns_no_list_is_an_input_split_error(managers) -> None:
    """A spec's split that returned a generator (or None) was taken as a list outside the
    split's check: 'unexpected TypeError in the executor: object of type 'generator' has no
    len()', an ExecutorError (our bug, by its words), not the spec's."""

    def halves(x: torch.Tensor, parts: int):  # noqa: ANN202 - a generator, the point
        yield from x.chunk(parts)

    m = managers(config(devices=2))
    m.register(blob_spec("gen", split=halves))
    m.register(blob_spec("none", split=lambda x, parts: None))
    gen = m.call("gen", X, dop=2)
    assert gen.ok and torch.allclose(gen.value, reference(1, 0, X)), gen.message
    out = m.call("none", X, dop=2)
    assert isinstance(out.error, InputSplitError), out
    assert "split returned NoneType, not a list of parts" in out.message


async def _coroutine_call(module: nn.Module, x: torch.Tensor) -> torch.Tensor:
    return module(x)


@pytest.mark.parametrize(
    ("call", "kind"),
    [
        (lambda mod, x: (mod(x) * i for i in range(2)), "generator"),
        (lambda mod, x: map(mod, [x, x]), "map"),
        (_coroutine_call, "coroutine"),
    ],
    ids=["generator", "map", "coroutine"],
)
@pytest.mark.parametrize("dop", [1, 2])
def test_a_call_returning_work_not_done_yet_is_a_call_failed_error(
    managers, call: Callable[..., Any], kind: str, dop: int
) -> None:
    """A call function returning a generator (or another iterator, or a coroutine: an
    async def) ended 'ok' with it as its value: the caller ran it after the call had ended,
    outside its GPU slot and pins, on a replica maybe evicted meanwhile ('Tensor on device
    meta is not on the expected device'), or never ran it at all (a coroutine); at DoP 2 it
    failed to merge. It is a CallFailedError naming what was returned; a list is a value."""
    m = managers(config(devices=2))
    m.register(blob_spec("lazy", call=call))
    out = m.call("lazy", X, dop=dop)
    assert isinstance(out.error, CallFailedError), out
    assert f"returned a {kind}, which would run after its call ended" in out.message
    m.register(blob_spec("eager", call=lambda mod, x: [mod(x), mod(x)], dops=(1,)))
    assert m.call("eager", X).ok


def test_a_split_returning_an_endless_iterator_is_an_input_split_error(managers) -> None:
    """A spec's split that returned an iterator was read to its end before its parts were
    counted: an endless one (itertools.repeat, a generator that never stops) was read
    until the host ran out of memory, and the call never ended. It is read one part past
    the replicas, and refused saying it gave more parts than replicas."""
    read: list[int] = []

    def endless(x: torch.Tensor, parts: int) -> Iterator[torch.Tensor]:
        for i in range(100_000):  # (bounded here, so that the test ends even before)
            read.append(i)
            yield x

    m = managers(config(devices=2))
    m.register(blob_spec("endless", split=endless))
    out = m.call("endless", X, dop=2)
    assert isinstance(out.error, InputSplitError), out
    assert "split returned more than 2 parts for 2 replicas" in out.message
    assert len(read) == 3


@pytest.mark.parametrize("dop", [1, 2])
def test_a_call_that_changes_its_inputs_in_place_leaves_the_callers_alone(
    managers, dop: int
) -> None:
    """On a CPU device a replica's inputs were the caller's tensors themselves (.to('cpu')
    of a CPU tensor is the same tensor; a GPU's are copies): a service whose call changed
    them in place (x.mul_(0)) changed the caller's, and the next service called with the
    same tensors (a fan-out of one batch) computed on what the first left."""

    def zeroes_its_inputs(module: nn.Module, x: torch.Tensor) -> torch.Tensor:
        x.mul_(0)
        return module(x)

    m = managers(config(devices=2))
    m.register(blob_spec("mutates", call=zeroes_its_inputs))
    m.register(blob_spec("other", seed=1))
    inputs = X.clone()
    assert m.call("mutates", inputs, dop=dop).ok
    assert torch.equal(inputs, X)
    assert torch.allclose(m.call("other", inputs, dop=dop).unwrap(), reference(1, 1, X))


@pytest.mark.parametrize("dop", [1, 2])
def test_a_result_is_a_normal_tensor_at_every_dop(managers, dop: int) -> None:
    """A call's result tensors were made in inference mode at DoP 1 (at DoP 2 the merge
    made them normal tensors outside it): the caller could not change them in place
    ('Inplace update to inference tensor outside InferenceMode is not allowed') nor use them
    in a loss ('Inference tensors cannot be saved for backward'), e.g. a teacher's
    log-probs in a distillation loss, only when the call ran on one GPU."""
    m = managers(config(devices=2))
    m.register(blob_spec("a"))
    value = m.call("a", X, dop=dop).unwrap()
    assert not value.is_inference()
    weights = torch.ones(len(X), requires_grad=True)
    (weights * value).sum().backward()  # saved for backward
    assert torch.equal(weights.grad, value)
    value.sub_(value)  # changed in place
    assert not value.any()


@pytest.mark.parametrize("gpu", [2, -1, "0", 0.0, True])
def test_the_lru_order_of_a_gpu_the_node_lacks_is_refused_naming_it(managers, gpu) -> None:
    """lru_order(2) on two GPUs, or lru_order('0'), said () as if that GPU were empty (no
    replica's index equals it); -1 and 0.0 did the same, and True read GPU 1's order."""
    m = managers(config(devices=2))
    m.register(blob_spec("a"))
    assert m.call("a", X, gpus=(1,)).ok
    with pytest.raises(ValueError, match=r"GPU .* this executor has 2"):
        m.lru_order(gpu)
    assert m.lru_order(1) == ("a",)


class Scaled(NamedTuple):
    """A call's inputs (and result) as a named tuple: a batch and a setting."""

    x: torch.Tensor
    scale: float


class Scores(NamedTuple):
    """A named result."""

    values: torch.Tensor


def _scaled_call(module: nn.Module, inputs: Scaled) -> Scores:
    return Scores(module(inputs.x) * inputs.scale)


@pytest.mark.parametrize("dop", [1, 2])
def test_named_tuples_keep_their_type_on_the_way_in_and_out(managers, dop: int) -> None:
    """Inputs and results are moved (and split, and merged) member by member: a named tuple
    came out of it a plain tuple, so a call reading its inputs by name failed ('tuple'
    object has no attribute 'x'), and a named result reached the caller without its names."""
    m = managers(config(devices=2))
    m.register(blob_spec("named", call=_scaled_call))
    out = m.call("named", Scaled(X, 2.0), dop=dop)
    assert out.ok, out.message
    assert isinstance(out.value, Scores)
    assert torch.allclose(out.value.values, reference(1, 0, X) * 2)


class OutOfMemoryOnceDevice(GatedDevice):
    """A gated device whose held allocation then fails for lack of memory (as a real CUDA
    out-of-memory error would, memory taken meanwhile by another process)."""

    def alloc(self, nbytes: int) -> torch.Tensor:
        if self.hold.is_set():
            super().alloc(0)  # (waits for the gate)
            self.hold.clear()
            raise DeviceOutOfMemoryError("device 0: taken meanwhile")
        return super().alloc(nbytes)


def test_a_call_that_waited_for_a_restore_that_ran_out_of_memory_is_out_of_memory_too() -> None:
    """Two calls of one service: the one that restores it fails with RestoreOutOfMemoryError
    (which the runtime retries: the call did not run), while the one that pinned the
    restore under way and waited for it got a plain RestoreError (not retried) for the same
    lack of memory: the outcome depended on which of the two calls did the restore."""
    device = OutOfMemoryOnceDevice(0, 4 * UNIT)
    with EoeManager(EoeConfig(calls_per_gpu=2), devices=[device]) as m:
        m.register(blob_spec("a"))
        device.hold.set()
        outs: dict[str, object] = {}
        first = threading.Thread(target=lambda: outs.__setitem__("first", m.call("a", X)))
        second = threading.Thread(target=lambda: outs.__setitem__("second", m.call("a", X)))
        first.start()
        try:
            assert device.held.wait(10), "the restore never started"
            second.start()
            deadline = time.monotonic() + 10  # until the second call pins the restore
            while m._ledger.replicas[("a", 0)].pins < 2:
                assert time.monotonic() < deadline, "the second call never pinned the restore"
                time.sleep(0.01)
        finally:
            device.gate.set()
            first.join(10)
            second.join(10)
        for which in ("first", "second"):
            assert isinstance(outs[which].error, RestoreOutOfMemoryError), outs[which]
        assert m.stats().devices[0].claimed_bytes == 0 and m.residency() == {}
        assert m.call("a", X).ok  # memory back: the same call succeeds


def _encoded_call(module: nn.Module, inputs: Any) -> Any:
    """A call on tokenizer-style inputs: it reads them by key and by attribute, checks their
    tensors are on its replica's device and not the caller's, and answers with a model output."""
    from transformers.modeling_outputs import SequenceClassifierOutput

    if not isinstance(inputs, BatchEncoding):
        raise TypeError(f"inputs came as {type(inputs).__name__}")
    ids = inputs["input_ids"]
    if ids.device != module.w.device:
        raise RuntimeError(f"input_ids on {ids.device}, weights on {module.w.device}")
    ids.add_(100)  # the replica's own copy: the caller's tensor must not change
    return SequenceClassifierOutput(logits=module(ids - 100))


@pytest.mark.parametrize("dop", [1, 2])
def test_mapping_inputs_and_dict_subclass_results_are_moved_split_and_keep_their_type(
    managers, dop: int
) -> None:
    """A tokenizer's BatchEncoding is a Mapping, not a dict: it went to the call as it was
    (the caller's tensors, on the host: a device mismatch on CUDA, the caller's inputs
    changed in place on CPU) and was never split, so each of k replicas ran the whole batch
    and the merged result had k times its rows. A ModelOutput result (a dict subclass) came
    back a plain dict."""
    from transformers.modeling_outputs import SequenceClassifierOutput

    m = managers(config(devices=2))
    m.register(blob_spec("encoded", call=_encoded_call))
    ids = torch.arange(6, dtype=torch.float32).reshape(3, 2)
    batch = BatchEncoding({"input_ids": ids.clone(), "label": "a setting"})
    out = m.call("encoded", batch, dop=dop)
    assert out.ok, out.message
    assert isinstance(out.value, SequenceClassifierOutput)
    assert torch.allclose(out.value.logits, reference(1, 0, ids))
    assert torch.equal(batch["input_ids"], ids)  # the caller's inputs are untouched


class FailingRestoreDevice(CpuDevice):
    """A CPU device whose allocations fail after a while (a restore that fails midway)."""

    def alloc(self, nbytes: int) -> torch.Tensor:
        time.sleep(0.02)  # (so the failed attempt surely takes time to count)
        raise DeviceOutOfMemoryError(f"device {self.index}: taken meanwhile")


def test_a_failed_restores_time_is_not_counted_as_restore_time() -> None:
    """stats().restore_s counted a failed restore's time next to 0 bytes restored, so the
    restore rate a trace calibration derives (bytes_restored / restore_s) came out too slow.
    It is counted in failed_restore_s, apart."""
    device = FailingRestoreDevice(0, 4 * UNIT)
    with EoeManager(EoeConfig(), devices=[device]) as m:
        m.register(blob_spec("a"))
        out = m.call("a", X)
        assert isinstance(out.error, RestoreOutOfMemoryError), out
        assert out.restore_s > 0  # the call's own outcome still shows the attempt
        stats = m.stats()
        assert stats.restores == 0 and stats.bytes_restored == 0
        assert stats.restore_s == 0.0
        assert stats.failed_restore_s >= out.restore_s


@pytest.mark.parametrize("kw", [{"dops": (4,)}, {"dops": (4, 8)}, {"shards": 4, "dops": (1,)}])
def test_a_service_no_dop_of_the_node_can_run_is_refused_at_register(managers, kw) -> None:
    """dops=(4,) (or shards=4) on 2 devices registered, built and backed up, and then every
    call of it failed with DopNotSupportedError: refused at register, naming the DoPs and the
    devices, before its factory runs."""
    m = managers(config(devices=2))
    built: list[int] = []

    def factory() -> nn.Module:
        built.append(1)
        return Blob(0.5, 0)

    spec = ServiceSpec("wide", factory=factory, call=checked_call(), **kw)
    with pytest.raises(DopNotSupportedError, match=r"DoPs \(4,.*2 GPUs"):
        m.register(spec)
    assert not built and m.services() == () and m._host_bytes == 0
    m.register(blob_spec("narrow", dops=(1, 2, 4)))  # a DoP the node has: registered
    assert m.call("narrow", X, dop=2).ok


def test_an_interrupt_while_a_restore_waits_for_its_copies_leaves_the_books_as_they_were(
    managers, monkeypatch
) -> None:
    """A KeyboardInterrupt (no Exception) while the restore waited for its copies went past
    the books: the placeholder was dropped, but the bytes it had allocated stayed counted as
    the manager's own (live) for good, hiding as much foreign memory from every later plan
    on that GPU. The interrupt still propagates."""
    import tangram.exec.eoe.manager as manager_module

    def interrupted(fences: object) -> None:
        raise KeyboardInterrupt

    m = managers(config(devices=2, units=4))
    m.register(blob_spec("a"))
    monkeypatch.setattr(manager_module, "wait_for_copies", interrupted)
    with pytest.raises(KeyboardInterrupt):
        m.call("a", X, dop=2)
    assert m._ledger.live == [0, 0] and m._ledger.replicas == {}
    assert [d.claimed_bytes for d in m.stats().devices] == [0, 0] and m.residency() == {}
    monkeypatch.undo()
    assert m.call("a", X, dop=2).ok
    assert m._ledger.live == [UNIT, UNIT] or BACKEND == "cuda"


def test_an_interrupt_while_evicting_leaves_no_bytes_booked(managers, monkeypatch) -> None:
    """A KeyboardInterrupt while an evicted replica's weights were dropped went past the
    books: the replica had left the residency, but its bytes stayed claimed (and live) on
    its GPU for good, as did those of the replicas the same eviction had still to free.
    Every one is now booked as freed, and the interrupt propagates."""
    import tangram.exec.eoe.manager as manager_module

    real = manager_module.drop_weights
    calls: list[int] = []

    def interrupted_once(replica: object, device: object, backup: object) -> tuple[int, int]:
        calls.append(1)
        if len(calls) == 1:
            raise KeyboardInterrupt
        return real(replica, device, backup)

    m = managers(config(devices=2, units=4))
    m.register(blob_spec("a"))
    assert m.call("a", X, dop=2).ok
    monkeypatch.setattr(manager_module, "drop_weights", interrupted_once)
    with pytest.raises(KeyboardInterrupt):
        m.evict("a")
    assert len(calls) == 2  # the second replica was freed too
    assert [d.claimed_bytes for d in m.stats().devices] == [0, 0]
    assert m._ledger.live == [0, 0] and m.residency() == {}
    monkeypatch.undo()
    assert m.call("a", X, dop=2).ok


def test_an_interrupted_eviction_delivers_its_residency_change(managers, monkeypatch) -> None:
    """An explicit eviction interrupted while it dropped a replica took the replicas out of
    the residency but skipped the delivery: on_residency_change heard of it only at the
    next manager call (never, if none came), and the scheduler kept counting the service
    resident there. The change is delivered before the interrupt propagates."""
    import tangram.exec.eoe.manager as manager_module

    def interrupted(replica: object, device: object, backup: object) -> tuple[int, int]:
        raise KeyboardInterrupt

    events: list[tuple[str, tuple[int, ...], bool]] = []
    m = managers(
        config(devices=2, units=4), on_residency_change=lambda s, g, r: events.append((s, g, r))
    )
    m.register(blob_spec("a"))
    assert m.call("a", X, dop=2).ok
    assert events == [("a", (0, 1), True)]
    monkeypatch.setattr(manager_module, "drop_weights", interrupted)
    with pytest.raises(KeyboardInterrupt):
        m.evict("a")
    assert m.residency() == {}
    assert events == [("a", (0, 1), True), ("a", (0, 1), False)]


def test_an_interrupt_anywhere_starting_the_copies_leaves_the_books_at_their_start(
    managers,
) -> None:
    """_start_copies booked a copy's bytes live, then listed it for the undo: an interrupt
    between the two (a KeyboardInterrupt) left the bytes booked live on that GPU for good,
    hiding as much foreign memory from every later plan there. The bytes are booked once
    the restore is done, with the replica; an interrupt at any line of _start_copies now
    leaves the books as they were."""

    import tangram.exec.eoe.manager as manager_module

    code = manager_module.EoeManager._start_copies.__code__
    lines = interruptible_lines(code)
    m = managers(config(devices=2, units=4))
    m.register(blob_spec("a"))
    assert lines
    for line in lines:
        with interrupted_at(code, line):
            m.call("a", X, dop=2)
        m.evict("a")
        assert m._ledger.live == [0, 0], line
        assert [d.claimed_bytes for d in m.stats().devices] == [0, 0], line
        assert m._ledger.replicas == {} and m.residency() == {}, line
    assert m.call("a", X, dop=2).ok
    assert m._ledger.live == [UNIT, UNIT] or BACKEND == "cuda"


@pytest.mark.parametrize("method", ["_run", "_admit"])
def test_an_interrupt_anywhere_admitting_a_call_gives_its_slots_back(managers, method: str) -> None:
    """_run admitted the call (took a call slot on each GPU of its cell) before the try
    whose finally gives them back: an interrupt once the slots were taken (in _admit's
    own finally, or before the try began) kept them taken for good, and with
    calls_per_gpu=1 those GPUs never ran a call again (every later call there waited
    until its timeout). An interrupt at any line of _admit, or of _run but the two that
    release (a finally's own lines cannot be covered in Python), now leaves no slot
    taken."""
    import inspect

    import tangram.exec.eoe.manager as manager_module

    function = getattr(manager_module.EoeManager, method)
    source, first = inspect.getsourcelines(function)
    releases = [first + i for i, text in enumerate(source) if "_ledger.release(state)" in text]
    skip = set(range(min(releases) - 2, max(releases) + 1)) if releases else set()
    code = function.__code__
    lines = [ln for ln in interruptible_lines(code) if ln not in skip]
    m = managers(config(devices=2, units=4))
    m.register(blob_spec("a"))
    assert lines
    for line in lines:
        with interrupted_at(code, line):
            m.call("a", X, dop=2)
        assert m._ledger.busy == [0, 0], line
        assert all(rep.pins == 0 for rep in m._ledger.replicas.values()), line
        assert m.call("a", X, dop=2, timeout_s=30).ok, line


@pytest.mark.parametrize("method", ["_make_room", "_carry_out", "_free_all", "_free"])
def test_an_interrupt_anywhere_carrying_out_a_plan_frees_its_evictees(
    managers, method: str
) -> None:
    """A plan's evictees leave the books when it is booked and are freed later: an interrupt
    in between (at the call of _carry_out, or before its try)
    never freed them, so their bytes stayed claimed on their GPUs for good and every later
    call there waited for memory nothing would free. Those left are freed on the way out."""

    import tangram.exec.eoe.manager as manager_module

    code = getattr(manager_module.EoeManager, method).__code__
    for line in interruptible_lines(code):
        m = managers(config(devices=2, units=1.5))  # room for one service per GPU
        m.register(blob_spec("a"))
        m.register(blob_spec("b", seed=1))
        assert m.call("a", X, dop=2).ok
        with interrupted_at(code, line):
            m.call("b", X, dop=2)
        led = m._ledger
        for g in range(2):
            held = sum(r.claim for r in led.replicas.values() if r.gpu == g)
            assert led.claimed[g] == held, (line, g)
            live = sum(r.nbytes for r in led.replicas.values() if r.gpu == g)
            assert led.live[g] == live or BACKEND == "cuda", (line, g)
        assert all(r.ready and not r.pins for r in led.replicas.values()), line
        assert m.call("b", X, dop=2, timeout_s=10).ok, line
        m.close()


def test_an_interrupt_anywhere_in_an_eviction_frees_what_it_took_out(managers) -> None:
    """evict() took the replicas out of the books, then freed them: an interrupt in between
    (at the line that sums their bytes, or the one calling _free_all) never freed them, so
    their bytes stayed claimed on their GPUs for good. Those taken out are now freed on
    the way out."""

    import tangram.exec.eoe.manager as manager_module

    code = manager_module.EoeManager.evict.__code__
    for line in interruptible_lines(code):
        m = managers(config(devices=2, units=4))
        m.register(blob_spec("a"))
        assert m.call("a", X, dop=2).ok
        with interrupted_at(code, line):
            m.evict("a")
        led = m._ledger
        for g in range(2):
            held = sum(r.claim for r in led.replicas.values() if r.gpu == g)
            assert led.claimed[g] == held, (line, g)
            live = sum(r.nbytes for r in led.replicas.values() if r.gpu == g)
            assert led.live[g] == live or BACKEND == "cuda", (line, g)
        m.close()


def test_an_interrupt_anywhere_taking_replicas_out_frees_them_and_reports_them_gone(
    managers,
) -> None:
    """Ledger.take_out popped the evicted replicas out of the books and only then returned
    them to evict() (and queued the residency change): an interrupt in between (a
    KeyboardInterrupt once they were popped) left them in no one's hands, never freed: their
    bytes claimed and their memory allocated on those GPUs for good, and the residency
    callback never told they were gone. An interrupt at any line of take_out (but its
    finally's, which Python cannot cover) now frees them and reports them gone."""
    import inspect

    from tangram.exec.eoe.ledger import Ledger

    source, first = inspect.getsourcelines(Ledger.take_out)
    finallies = [first + i for i, t in enumerate(source) if t.strip() == "finally:"]
    start = min(finallies, default=first + len(source))
    code = Ledger.take_out.__code__
    lines = [ln for ln in interruptible_lines(code) if ln < start]
    assert lines
    for line in lines:
        events: list[tuple[str, tuple[int, ...], bool]] = []
        m = managers(
            config(devices=2, units=4),
            on_residency_change=lambda s, g, r, events=events: events.append((s, g, r)),
        )
        m.register(blob_spec("a"))
        assert m.call("a", X, dop=2).ok
        with interrupted_at(code, line):
            m.evict("a")
        led = m._ledger
        kept = {r.gpu for r in led.replicas.values()}  # (an interrupt before any was taken)
        assert m.residency() == ({"a": (0, 1)} if kept else {}), line
        claim = m.info("a").resident_bytes
        assert led.claimed == [claim if g in kept else 0 for g in range(2)], line
        if BACKEND == "cpu":
            live = [m.info("a").replica_bytes if g in kept else 0 for g in range(2)]
            assert led.live == live, line
            assert [d.allocated_bytes() for d in m.devices] == live, line
        gone = [] if kept else [("a", (0, 1), False)]
        assert events == [("a", (0, 1), True), *gone], line
        m.close()


@pytest.mark.parametrize("method", ["recycle", "_attach"])
def test_an_interrupt_anywhere_recycling_an_evicted_module_frees_its_memory(
    managers, method: str
) -> None:
    """HostBackup.recycle pointed the evicted module's tensors back at the meta device one by
    one: an interrupt before or midway (a KeyboardInterrupt) left the rest on the device, and
    the interrupt's traceback, held in a reference cycle, kept the module and so the
    replica's whole device buffer allocated until the garbage collector ran (never, with it
    off): GPU memory the books said was free. An interrupt at any line of recycle (but its
    handler's) or of the _attach it calls now leaves nothing allocated, and the eviction is
    not counted unverified (an interrupted drop was taken to free 0 bytes, logged as a
    leak)."""
    import gc
    import inspect

    from tangram.exec.eoe.backup import HostBackup

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
    for line in lines:
        m = managers(config(devices=2, units=4))
        m.register(blob_spec("a"))
        assert m.call("a", X, dop=2).ok
        base = [d.allocated_bytes() for d in m.devices] if BACKEND == "cpu" else None
        gc.disable()  # (what is freed must be freed without it)
        try:
            with interrupted_at(code, line):
                m.evict("a")
            left = [d.allocated_bytes() for d in m.devices]
        finally:
            gc.enable()
        assert m.residency() == {} and m._ledger.claimed == [0, 0], line
        if base is not None:
            assert left == [0, 0], line
            # (the memory did go: the eviction is no unverified one, logged as a leak)
            assert m.stats().unverified_evictions == 0, line
        assert m.call("a", X, dop=2).ok, line
        m.close()


def _top_call(module: nn.Module, x: torch.Tensor) -> Any:
    return module(x).reshape(-1, 2).topk(1)


@pytest.mark.parametrize("dop", [1, 2])
def test_a_torch_return_type_result_keeps_its_fields(managers, dop: int) -> None:
    """torch's structured results (``x.topk(k)``: a tuple with .values and .indices, no named
    tuple) came back plain tuples from the move to the host, so a caller reading
    ``out.value.values`` failed."""
    m = managers(config(devices=2))
    m.register(blob_spec("top", call=_top_call))
    out = m.call("top", X.reshape(3, 2), dop=dop)
    assert out.ok, out.message
    want = reference(1, 0, X.reshape(3, 2)).topk(1)
    assert type(out.value) is type(want)
    assert torch.equal(out.value.values, want.values)
    assert torch.equal(out.value.indices, want.indices)


@dataclass(frozen=True)
class Request:
    """A call's inputs as a dataclass: a batch and a setting."""

    x: torch.Tensor
    scale: float = 1.0


@dataclass
class Reply:
    """A call's result as a dataclass."""

    head: torch.Tensor


def _dataclass_call(module: nn.Module, inputs: Request) -> Reply:
    inputs.x.add_(100)  # the replica's own copy: the caller's tensor must not change
    return Reply(module.w[:4] * inputs.scale)  # (a view of the weights for scale 1)


def test_dataclass_inputs_and_results_are_moved_as_copies(managers) -> None:
    """A dataclass's tensors were not moved at all: the call got the caller's tensors (a
    device mismatch on CUDA; on CPU a call changing its inputs changed the caller's), and a
    result holding a view of the replica's weights kept the evicted replica's bytes
    allocated for as long as the caller held it (an unverified eviction)."""
    m = managers(config(devices=1, units=1.02))
    m.register(blob_spec("dc", call=_dataclass_call))
    m.register(blob_spec("next", seed=1))
    x = X.clone()
    kept = m.call("dc", Request(x)).unwrap()
    assert isinstance(kept, Reply) and torch.equal(kept.head, Blob(1, 0).w[:4])
    assert torch.equal(x, X)
    out = m.call("next", X)
    assert out.ok and out.evicted == (("dc", 0),), out.message
    assert m.stats().unverified_evictions == 0
    assert same_bytes(m.devices[0].allocated_bytes(), UNIT)


def test_a_service_no_cell_of_its_dops_can_hold_is_refused_at_register() -> None:
    """On GPUs of different budgets, a service of dops=(2,) that fits the larger GPU only was
    registered (the check asked the largest budget alone), and every call of it then failed
    with ServiceTooLargeError: each GPU of a 2-GPU cell holds a whole replica. Refused at
    register, naming its DoPs; one that may run at DoP 1 on the larger GPU is registered."""
    devices = [CpuDevice(0, 4 * UNIT), CpuDevice(1, UNIT // 2)]
    with EoeManager(EoeConfig(), devices=devices) as m:
        with pytest.raises(ServiceTooLargeError, match=r"DoPs \(2,\)"):
            m.register(blob_spec("pair", dops=(2,)))
        assert m.services() == () and m._host_bytes == 0
        m.register(blob_spec("either", dops=(1, 2)))
        assert m.call("either", X).gpus == (0,)


def test_a_factory_that_exits_is_refused_as_a_spec_error_not_the_process() -> None:
    """A sys.exit() in a service's factory (its own code, as its call is) went through
    register as SystemExit: the live runtime's start-up ended without a word about the
    service. It is ServiceSpecError naming it, as a factory's other failures are."""

    def factory() -> nn.Module:
        raise SystemExit(2)

    with EoeManager(EoeConfig(), devices=[CpuDevice(0, 4 * UNIT)]) as m:
        with pytest.raises(ServiceSpecError, match="factory raised SystemExit"):
            m.register(ServiceSpec("exits", factory=factory, call=checked_call()))
        assert m.services() == () and m._host_bytes == 0


def _cache_call(module: nn.Module, x: torch.Tensor) -> Any:
    from transformers import DynamicCache

    cache = DynamicCache()
    view = module.w[:4].view(1, 1, 1, 4)
    cache.update(view, view * 2, 0)
    # On a GPU the cache's tensors are device memory of their own; a CPU device counts only
    # the replica's buffer, so here the cache holds a view of the weights instead.
    cache.layers[0].keys = view
    return {"cache": cache, "x": x}


def test_a_dynamic_cache_in_a_result_is_copied_to_the_host(managers) -> None:
    """A result holding an object of another kind than tensor, mapping, sequence or
    dataclass (a transformers DynamicCache, its tensors in its layers' attributes) was
    handed back as it was: its tensors stayed the replica's device memory (a view of the
    weights here) for as long as the caller held it, an unverified eviction. Such an object
    comes back a shallow copy with its tensors copied to the host."""
    from transformers import DynamicCache

    m = managers(config(devices=1, units=1.02))
    m.register(blob_spec("cached", call=_cache_call))
    m.register(blob_spec("next", seed=1))
    kept = m.call("cached", X).unwrap()
    cache = kept["cache"]
    assert isinstance(cache, DynamicCache)
    keys = cache.layers[0].keys
    assert torch.equal(keys.flatten(), Blob(1, 0).w[:4])
    out = m.call("next", X)
    assert out.ok and out.evicted == (("cached", 0),), out.message
    assert m.stats().unverified_evictions == 0
    assert same_bytes(m.devices[0].allocated_bytes(), UNIT)
    assert torch.equal(cache.layers[0].values.flatten(), 2 * Blob(1, 0).w[:4])


class _Node:
    """An object holding a tensor and (through a list) itself."""

    def __init__(self, t: torch.Tensor) -> None:
        self.t = t
        self.around = [self]
        self.label = "node"


def test_objects_holding_tensors_are_copied_once_cycles_and_all() -> None:
    """map_tensors copies an object holding tensors in its attributes (a cycle back to it
    points at the copy), and leaves an object without tensors as it is."""
    from tangram.exec.eoe.registry import map_tensors

    node = _Node(torch.ones(2))
    plain = _Node.__new__(_Node)
    plain.label = "no tensors"
    out = map_tensors({"n": node, "p": plain}, lambda t: t * 3)
    new = out["n"]
    assert new is not node and torch.equal(new.t, torch.full((2,), 3.0))
    assert new.around[0] is new and new.label == "node"
    assert torch.equal(node.t, torch.ones(2))  # the original is untouched
    assert out["p"] is plain


def test_an_interrupt_anywhere_taking_a_cells_device_locks_leaves_none_taken(managers) -> None:
    """_lock_cell acquired a device lock and only then, on the next lines, handed its release
    to the call's exit stack: an interrupt in between (at the loop's test, or at the line
    registering the release) kept that GPU's device lock for good, and every later call
    needing memory there (or an eviction there) waited on it for ever. An interrupt at any
    line of _lock_cell now leaves every device lock free."""

    import tangram.exec.eoe.manager as manager_module

    code = manager_module.EoeManager._lock_cell.__code__
    lines = interruptible_lines(code)
    assert lines
    for line in lines:
        m = managers(config(devices=2, units=4))
        m.register(blob_spec("a"))
        with interrupted_at(code, line):
            m.call("a", X, dop=2)
        held = [g for g, lock in enumerate(m._device_locks) if lock.locked()]
        for g in held:  # (so that closing the manager does not wait on them for ever)
            m._device_locks[g].release()
        assert held == [], line
        assert m.call("a", X, dop=2, timeout_s=10).ok, line
        assert m.evict("a").gpus == (0, 1), line
        m.close()


class _EchoEngine:
    """An engine doing nothing but echo its inputs."""

    weight_bytes = 1024

    def wake_up(self) -> None:
        pass

    def sleep(self) -> None:
        pass

    def __call__(self, inputs: Any) -> Any:
        return inputs


def test_an_interrupt_anywhere_taking_an_engines_turn_gives_it_back(managers) -> None:
    """_engine_turn took the engine's turn and only then entered the try whose finally gives
    it back: an interrupt in between (at the loop's test, or at the line counting the wait
    in its finally) kept the turn for good, and every later call of that engine waited for
    it until its timeout (for ever without one). An interrupt at any line of _engine_turn
    now leaves the turn free (but the two that give it back: a finally's own lines cannot
    be covered in Python)."""
    import inspect

    import tangram.exec.eoe.manager as manager_module
    from tangram.exec.eoe.engine import engine_spec

    function = manager_module.EoeManager._engine_turn.__wrapped__
    source, first = inspect.getsourcelines(function)
    releases = [first + i for i, text in enumerate(source) if "turn.release()" in text]
    skip = {ln for r in releases for ln in (r - 1, r)}
    code = function.__code__
    lines = [ln for ln in interruptible_lines(code) if ln not in skip]
    m = managers(config(devices=1, units=4))
    m.register(engine_spec("e", _EchoEngine, home=0, memory_bytes=UNIT))
    turn = m._service("e").backup.turn
    assert lines
    for line in lines:
        with interrupted_at(code, line):
            m.call("e", X)
        held = turn.locked()
        if held:
            turn.release()
        assert not held, line
        assert m.call("e", X, timeout_s=10).ok, line


class _Unshowable:
    """A value whose repr raises."""

    def __repr__(self) -> str:
        raise RuntimeError("no repr")


@pytest.mark.parametrize(
    ("kw", "error", "named"),
    [
        ({"service": _Unshowable()}, UnknownServiceError, "string"),
        ({"service": 10**5000}, UnknownServiceError, "string"),
        ({"dop": _Unshowable()}, DopNotSupportedError, "DoPs"),
        ({"dop": 10**5000}, DopNotSupportedError, "DoPs"),
        ({"gpus": _Unshowable()}, InvalidCellError, "gpus"),
        ({"gpus": [_Unshowable()]}, InvalidCellError, "gpus"),
        ({"gpus": (10**5000,)}, InvalidCellError, "GPU"),
        ({"timeout_s": -(10**5000)}, CallArgumentError, "timeout_s"),
        ({"timeout_s": _Unshowable()}, CallArgumentError, "timeout_s"),
    ],
    ids=[
        "service-unshowable",
        "service-huge-int",
        "dop-unshowable",
        "dop-huge-int",
        "gpus-unshowable",
        "gpus-holding-unshowable",
        "gpus-huge-int",
        "timeout-huge-negative-int",
        "timeout-unshowable",
    ],
)
def test_a_call_argument_that_cannot_be_shown_is_refused_naming_it(
    managers, kw: dict, error: type, named: str
) -> None:
    """An argument quoted in its refusal with !r whose repr raised (its __repr__, or an int
    past str's 4,300 digits) made the refusal's own message raise: a service so named made
    call() raise (past 'never raises'), any other argument came back as 'unexpected
    RuntimeError in the executor' (our bug, by its words). Each is refused with its own
    error, naming the argument."""
    m = managers(config(devices=2))
    m.register(blob_spec("a"))
    service = kw.pop("service", "a")
    out = m.call(service, X, **kw)
    assert isinstance(out.error, error), out.message
    assert named in out.message and "repr raised" in out.message, out.message
    assert isinstance(out.service, str) and len(out.service) <= 300
    assert m.call("a", X).ok


def test_an_interrupt_anywhere_running_a_calls_parts_waits_for_every_part(managers) -> None:
    """ReplicaRunner.run started the other replicas' parts on its pool and waited for them
    after running the first: an interrupt in between (or while it waited for one of them)
    left the parts still running when the call ended and gave back its pins and slots, so
    another call could run on those GPUs at once (past calls_per_gpu) and an eviction could
    drop a replica a part still computed on. An interrupt at any line of run now ends the
    call only once every part it started has ended."""

    from tangram.exec.eoe.execution import ReplicaRunner

    ended: list[float] = []

    def call(module: nn.Module, x: torch.Tensor) -> torch.Tensor:
        if threading.current_thread().name.startswith("eoe-replica"):  # a part on the pool
            time.sleep(0.1)
        out = module(x)
        ended.append(time.perf_counter())
        return out

    code = ReplicaRunner.run.__code__
    lines = interruptible_lines(code)
    m = managers(config(devices=2, units=4))
    m.register(blob_spec("a", call=call))
    late: list[int] = []
    assert lines
    for line in lines:
        ended.clear()
        with interrupted_at(code, line):
            m.call("a", X, dop=2)
        returned = time.perf_counter()
        time.sleep(0.3)  # (a part still running ends meanwhile)
        if any(t > returned for t in ended):
            late.append(line)
        assert m._ledger.busy == [0, 0], line
    assert late == [], late
    assert m.call("a", X, dop=2).ok


class _Unsayable(Exception):
    """A service's exception whose str raises."""

    def __str__(self) -> str:
        raise RuntimeError("no str")


def _raise_unsayable(*args: object) -> Any:
    raise _Unsayable


class _UnsayableEngine(_EchoEngine):
    """An engine whose wake-up raises an exception whose str raises."""

    def wake_up(self) -> None:
        raise _Unsayable


def test_a_services_exception_whose_message_cannot_be_read_fails_its_call_as_its_own(
    managers,
) -> None:
    """A service's exception quoted with {exc} whose str raised made the wrapping error's own
    message raise: its call, split, merge or engine wake-up failing came back as
    'unexpected RuntimeError in the executor' (our bug, by its words), and its factory
    failing went through register as that RuntimeError, no ServiceSpecError. Each is the
    service's own error, naming the exception's type."""
    from tangram.exec.eoe.engine import engine_spec

    m = managers(config(devices=2, units=4))
    m.register(blob_spec("call", call=_raise_unsayable))
    m.register(blob_spec("split", split=_raise_unsayable))
    m.register(blob_spec("merge", merge=_raise_unsayable))
    m.register(engine_spec("engine", _UnsayableEngine, home=0, memory_bytes=UNIT))
    for service, dop, error in [
        ("call", 1, CallFailedError),
        ("call", 2, CallFailedError),
        ("split", 2, InputSplitError),
        ("merge", 2, CallFailedError),
        ("engine", 1, RestoreError),
    ]:
        out = m.call(service, X, dop=dop)
        assert isinstance(out.error, error), (service, dop, out.message)
        assert "_Unsayable" in out.message and "could not be read" in out.message, out.message
    with pytest.raises(ServiceSpecError, match="factory raised _Unsayable"):
        m.register(ServiceSpec("factory", factory=_raise_unsayable, call=checked_call()))
    assert "engine" not in m.residency() and m.services() == ("call", "engine", "merge", "split")


def _code_of(function: Any, name: str | None = None) -> Any:
    """The code object of ``function``, or of the function ``name`` nested in it."""
    import types

    code = function.__code__
    if name is None:
        return code
    return next(c for c in code.co_consts if isinstance(c, types.CodeType) and c.co_name == name)


@pytest.mark.parametrize(
    ("method", "nested"), [("register", None), ("register", "admit"), ("unregister", None)]
)
def test_an_interrupt_anywhere_registering_or_unregistering_keeps_the_books_whole(
    managers, method: str, nested: str | None
) -> None:
    """register reserved the backup's host bytes and then recorded the reservation on the
    next line, and added the spec to the registry before its service: an interrupt between
    either pair kept the bytes reserved for good (a later register refused over the host
    budget) or left the name in the registry without its service (registering it again a
    DuplicateServiceError, calling it an UnknownServiceError, for good). unregister, which
    forgot the service, its spec and its bytes on three lines, left the same halves. An
    interrupt at any line of them now leaves the service registered or not, wholly (but
    the two lines of unregister's finally: a finally's own lines cannot be covered)."""
    import inspect

    import tangram.exec.eoe.manager as manager_module

    function = getattr(manager_module.EoeManager, method)
    source, first = inspect.getsourcelines(function)
    removes = [first + i for i, text in enumerate(source) if "_registry.remove(service)" in text]
    skip = {ln for r in removes for ln in (r - 1, r)}
    code = _code_of(function, nested)
    lines = [ln for ln in interruptible_lines(code) if ln not in skip]
    assert lines
    for line in lines:
        m = managers(config(devices=1, units=4, host_memory_bytes=2 * UNIT))
        if method == "unregister":
            m.register(blob_spec("a"))
        with interrupted_at(code, line):
            if method == "unregister":
                m.unregister("a")
            else:
                m.register(blob_spec("a"))
        assert set(m._services) == set(m.services()), line
        assert m._host_bytes == sum(s.backup.nbytes for s in m._services.values()), line
        if "a" in m.services():
            assert m.call("a", X).ok, line
            m.unregister("a")
        m.register(blob_spec("a"))
        m.register(blob_spec("b", seed=1))  # (the host budget holds two)
        m.close()


def test_an_interrupt_anywhere_in_the_registrys_remove_leaves_the_name_free(managers) -> None:
    """unregister forgot the service, then (in its finally) removed the name from the
    registry: an interrupt (a KeyboardInterrupt) landing inside the registry's remove left
    the name registered without a service, listed by services(), a DuplicateServiceError to
    register again and an UnknownServiceError to call, for good. Such a leftover name is
    dropped at the next register of it, and services() lists only names with a service."""
    from tangram.exec.eoe.registry import ServiceRegistry

    code = ServiceRegistry.remove.__code__
    lines = interruptible_lines(code)
    assert lines
    for line in lines:
        m = managers(config(devices=1, units=4))
        m.register(blob_spec("a"))
        with interrupted_at(code, line):
            m.unregister("a")
        assert "a" not in m._services and m.services() == (), line
        assert isinstance(m.call("a", X).error, UnknownServiceError), line
        m.register(blob_spec("a"))
        assert m.services() == ("a",) and m.call("a", X).ok, line
        m.close()


@pytest.mark.parametrize("method", ["take_slots", "pin"])
def test_an_interrupt_anywhere_taking_slots_or_pins_leaves_none_taken(
    managers, method: str
) -> None:
    """Ledger.take_slots counted a call slot on each GPU and then recorded the cell on a
    later line, and Ledger.pin counted a pin and then listed the replica: an interrupt in
    between left a slot no release gave back (with calls_per_gpu=1 that GPU ran no call
    again) or a pin none took off (the replica never evicted again). Each is now counted
    and recorded on one line."""

    from tangram.exec.eoe.ledger import Ledger

    code = getattr(Ledger, method).__code__
    lines = interruptible_lines(code)
    assert lines
    for line in lines:
        m = managers(config(devices=2, units=1.5))
        m.register(blob_spec("a"))
        m.register(blob_spec("b", seed=1))
        assert m.call("a", X, dop=2).ok  # (pin_only: a's pins come from Ledger.pin alone)
        with interrupted_at(code, line):
            m.call("a", X, dop=2)
        assert m._ledger.busy == [0, 0], line
        assert all(rep.pins == 0 for rep in m._ledger.replicas.values()), line
        out = m.call("b", X, dop=2, timeout_s=5)  # evicts a: no pin may hold it
        assert out.ok and sorted(out.evicted) == [("a", 0), ("a", 1)], (line, out.message)
        m.close()


def test_an_interrupt_anywhere_releasing_a_call_gives_back_all_it_held(managers) -> None:
    """Ledger.release gave back a call's pins, workspace bytes and call slots in turn and
    struck them off together at the end: an interrupt part-way (it runs in _run's finally,
    whose own lines an interrupt cannot be kept from) kept the rest for good: a pin (the
    replica never evicted again), workspace bytes claimed for no call, a call slot (with
    calls_per_gpu=1 that GPU ran no call again). Each is now struck off as it is given
    back, and _run releases again what an interrupt left."""

    from tangram.exec.eoe.ledger import Ledger

    code = Ledger.release.__code__
    lines = interruptible_lines(code)
    assert lines
    for line in lines:
        m = managers(config(devices=2, units=1.5))
        m.register(blob_spec("a", workspace_bytes=64))
        m.register(blob_spec("b", seed=1))
        with interrupted_at(code, line):
            m.call("a", X, dop=2)
        led = m._ledger
        assert led.busy == [0, 0] and led.workspaces == [0, 0], line
        assert all(rep.pins == 0 for rep in led.replicas.values()), line
        for g in range(2):
            assert led.claimed[g] == sum(r.claim for r in led.replicas.values() if r.gpu == g)
        out = m.call("b", X, dop=2, timeout_s=5)  # evicts a: no pin may hold it
        assert out.ok and sorted(out.evicted) == [("a", 0), ("a", 1)], (line, out.message)
        m.close()


def test_an_interrupt_anywhere_unbooking_an_evicted_replica_leaves_the_books_right(
    managers,
) -> None:
    """Ledger.freed marked an evicted replica unbooked and took its bytes off on the next
    lines: an interrupt in between kept its bytes claimed and live on its GPU for good (no
    second try books a replica marked unbooked), and every later call needing them there
    waited for memory nothing would free. They now go in one statement."""

    from tangram.exec.eoe.ledger import Ledger

    code = Ledger.freed.__code__
    lines = interruptible_lines(code)
    assert lines
    for line in lines:
        m = managers(config(devices=2, units=1.5))  # room for one service per GPU
        m.register(blob_spec("a"))
        m.register(blob_spec("b", seed=1))
        assert m.call("a", X, dop=2).ok
        with interrupted_at(code, line):
            m.call("b", X, dop=2)
        led = m._ledger
        for g in range(2):
            held = sum(r.claim for r in led.replicas.values() if r.gpu == g)
            assert led.claimed[g] == held, (line, g)
            live = sum(r.nbytes for r in led.replicas.values() if r.gpu == g)
            assert led.live[g] == live or BACKEND == "cuda", (line, g)
        assert m.call("b", X, dop=2, timeout_s=10).ok, line
        m.close()


@pytest.mark.parametrize("method", ["book", "pin"])
def test_an_interrupt_anywhere_booking_a_plan_leaves_the_books_right(managers, method: str) -> None:
    """Ledger.book took a plan's evictees out of the books, booked its placeholders, pinned
    and claimed the workspaces, and only then returned the lists _make_room undoes from: an
    interrupt part-way (in book, or in the pin it calls) left evictees out of the books and
    of every list, their bytes claimed on their GPUs for good, and placeholders claiming
    bytes no one restored or gave back; later calls there waited for memory nothing would
    free. Each is listed in the caller's lists in the statement that books it, and undone
    from there."""

    from tangram.exec.eoe.ledger import Ledger

    code = getattr(Ledger, method).__code__
    lines = interruptible_lines(code)
    assert lines
    for line in lines:
        m = managers(config(devices=2, units=1.6))  # room for one service per GPU
        m.register(blob_spec("a"))
        m.register(blob_spec("b", seed=1, workspace_bytes=64))
        assert m.call("a", X, dop=2).ok
        with interrupted_at(code, line):
            m.call("b", X, dop=2)
        led = m._ledger
        for g in range(2):
            held = sum(r.claim for r in led.replicas.values() if r.gpu == g)
            assert led.claimed[g] == held and led.workspaces[g] == 0, (line, g)
            live = sum(r.nbytes for r in led.replicas.values() if r.gpu == g)
            assert led.live[g] == live or BACKEND == "cuda", (line, g)
        assert all(r.ready and not r.pins for r in led.replicas.values()), line
        assert m.call("b", X, dop=2, timeout_s=10).ok, line
        m.close()


def test_an_interrupt_anywhere_finishing_a_restore_leaves_the_books_right(managers) -> None:
    """Ledger.restores_done booked a restored replica's bytes live and gave it its buffer on
    the next line: an interrupt in between kept the bytes booked live for good (the undo
    dropped the placeholder and its claim, not the live bytes), hiding as much foreign
    memory from every later plan on that GPU; one after the replica was made ready left
    its bytes live once the undo dropped it. Booked in one statement, and a ready
    placeholder dropped with its live bytes (and its residency reported gone)."""

    from tangram.exec.eoe.ledger import Ledger

    code = Ledger.restores_done.__code__
    lines = interruptible_lines(code)
    assert lines
    for line in lines:
        events: list[tuple[str, tuple[int, ...], bool]] = []
        m = managers(
            config(devices=2, units=4), on_residency_change=lambda *e, seen=events: seen.append(e)
        )
        m.register(blob_spec("a"))
        with interrupted_at(code, line):
            m.call("a", X, dop=2)
        led = m._ledger
        for g in range(2):
            held = sum(r.claim for r in led.replicas.values() if r.gpu == g)
            assert led.claimed[g] == held, (line, g)
            live = sum(r.nbytes for r in led.replicas.values() if r.gpu == g)
            assert led.live[g] == live or BACKEND == "cuda", (line, g)
        assert all(r.ready and not r.pins for r in led.replicas.values()), line
        out = m.call("a", X, dop=2, timeout_s=10)
        assert out.ok, (line, out.message)
        resident: set[int] = set()
        for _, gpus, on in events:
            resident = resident | set(gpus) if on else resident - set(gpus)
        assert resident == {0, 1} and m.residency() == {"a": (0, 1)}, (line, events)
        m.close()
