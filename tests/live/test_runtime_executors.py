"""The executor interface, as a specification: the registry finds an executor by the kind of
work; each adapter says what it admits, what a deadline does to its running actions and
whether they can be cancelled; the runtime carries out each deadline rule as declared.
No Docker and no torch: AOE and EOE are stand-ins, and the deadline rules run on API work."""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from types import SimpleNamespace
from typing import Any

import pytest
import torch

from tangram.core.resources import (
    ApiEndpointSpec,
    ClusterSpec,
    CpuNodeSpec,
    GpuNodeSpec,
    ResourceKind,
)
from tangram.exec.runtime import (
    ActionSpec,
    ApiExecutor,
    ApiWork,
    BadRequest,
    CpuExecutor,
    CpuWork,
    ExecutorMissing,
    GpuExecutor,
    GpuWork,
    NotCancellable,
    Runtime,
    RuntimeConfig,
    UnknownTrajectory,
)
from tangram.exec.runtime.api import echo
from tangram.exec.runtime.executor import (
    MISSING,
    Admission,
    OnDeadline,
    executor_for,
    executors_by_work,
)
from tangram.exec.runtime.result import ExecResult
from tangram.exec.runtime.trajectories import Trajectory

CPU_NODE = CpuNodeSpec("local", cores=2, numa_domains=1, memory_gb=16.0)
CLUSTER = ClusterSpec(
    name="executors",
    apis=(ApiEndpointSpec("echo", concurrency=4), ApiEndpointSpec("quiet", concurrency=1)),
)


def cpu_executor() -> CpuExecutor:
    aoe = SimpleNamespace(topology=SimpleNamespace(cores=(0, 1)), shutdown=lambda: None)
    return CpuExecutor(aoe, CPU_NODE, threads=1, lifecycle_threads=1)


def gpu_executor(gpus: int = 8, dops: tuple[int, ...] = (1, 2, 4)) -> GpuExecutor:
    eoe = SimpleNamespace(
        devices=list(range(gpus)),
        config=SimpleNamespace(calls_per_gpu=1),
        services=lambda: ("model",),
        info=lambda name: SimpleNamespace(
            dops=dops, resident_bytes=3 << 30, parallelism="replicas"
        ),
        close=lambda: None,
    )
    node = GpuNodeSpec("gpu", gpus=gpus, gpu_memory_gb=16.0, host_memory_gb=64.0)
    return GpuExecutor(eoe, node, threads=1)


def test_a_gpu_call_waits_in_eoe_no_longer_than_its_action_has_left() -> None:
    """The executor called EOE with no time-out: a call still waiting in EOE's queue (for a
    GPU or for memory another call holds) when its action's deadline passed started anyway,
    after its time-out, and held its GPUs and its slot in the core until it returned. EOE now
    drops it from its queue at the deadline (``QueueTimeoutError``: it never ran)."""
    calls: list[dict[str, Any]] = []
    executor = gpu_executor()

    def call(service: str, inputs: Any, **kw: Any) -> Any:
        calls.append(kw)
        return SimpleNamespace(
            ok=True, value=1, exec_s=0.0, queue_s=0.0, restored_gpus=(), evicted=(), hit=True
        )

    executor.eoe.call = call
    start = SimpleNamespace(gpus=(0,))
    try:
        asyncio.run(
            executor.execute(GpuWork("model", None), start, trajectory="t", time_left_s=2.5)
        )
    finally:
        executor._pool.shutdown(wait=True)
    assert calls == [{"gpus": (0,), "timeout_s": 2.5}]


@pytest.mark.parametrize("left", [0.0, -0.25])
def test_a_gpu_call_started_at_or_after_its_deadline_ends_at_once_without_calling_eoe(
    left: float,
) -> None:
    """A start that came at (or after) its action's deadline (the start and the deadline's
    timer in one event-loop iteration) called EOE anyway: with a free cell the call ran,
    holding its GPUs, though the runtime had ended the action with a time-out and discarded
    its result. It now ends at once with the time-out, as the CPU executor's does."""
    calls: list[dict[str, Any]] = []
    executor = gpu_executor()
    executor.eoe.call = lambda service, inputs, **kw: calls.append(kw)
    start = SimpleNamespace(gpus=(0,))
    try:
        result = asyncio.run(
            executor.execute(GpuWork("model", None), start, trajectory="t", time_left_s=left)
        )
        ran = executor.call_blocking("model", None, (0,), timeout_s=left)
    finally:
        executor._pool.shutdown(wait=True)
    assert calls == []
    for out in (result, ran):
        assert out.status == "timeout" and out.error.code == "timeout"
        assert out.exec_s == 0.0


def test_an_api_call_started_with_no_time_left_ends_at_once_without_calling_it() -> None:
    """The API executor called the endpoint with no time left: its task's first step runs
    before the deadline's timer in the same event-loop iteration, so a plain callable ran
    on a worker thread (a request sent after the action's time-out) that the timer's cancel
    could not stop. It now ends at once with the time-out, as the CPU executor's does."""
    calls: list[Any] = []
    executor = ApiExecutor({"quiet": calls.append})
    try:
        result = asyncio.run(
            executor.execute(ApiWork("quiet", 1), None, trajectory="t", time_left_s=0.0)
        )
    finally:
        executor.shutdown()
    assert calls == []
    assert result.status == "timeout" and result.error.code == "timeout"


def failed_call(executor: GpuExecutor, error: Exception) -> Any:
    """The executor's result for an EOE call that ended with ``error`` (it never ran)."""

    def call(service: str, inputs: Any, **kw: Any) -> Any:
        message = f"{type(error).__name__}: {error}"
        return SimpleNamespace(
            ok=False, error=error, message=message, exec_s=0.0, queue_s=0.5,
            restored_gpus=(), evicted=(), hit=False,
        )  # fmt: skip

    executor.eoe.call = call
    try:
        return executor.call_blocking("model", None, (0,), timeout_s=0.5)
    finally:
        executor._pool.shutdown(wait=True)


def test_a_gpu_call_whose_wait_in_eoe_ran_out_ends_with_a_time_out() -> None:
    """EOE's queue time-out is the action's own (its wait is bounded by what the action has
    left): it ended as an error ``queue_timeout`` when it came before the runtime's deadline
    timer, and as ``timeout`` when the timer came first. It is a ``timeout`` either way."""
    from tangram.exec.eoe.errors import QueueTimeoutError

    result = failed_call(gpu_executor(), QueueTimeoutError("waited longer than its timeout"))
    assert result.status == "timeout" and result.error.code == "timeout"
    assert not result.error.retryable and "before the call started" in result.error.message
    assert result.wait_s == 0.5


def test_a_gpu_call_whose_restore_ran_out_of_memory_is_retryable() -> None:
    """A restore that ran out of device memory ends the call before it ran (memory held
    outside EOE, or a real CUDA OOM): a retryable error, as the other outcomes of actions
    that did not run are; it was not retryable."""
    from tangram.exec.eoe.errors import CallFailedError, RestoreOutOfMemoryError

    oom = failed_call(gpu_executor(), RestoreOutOfMemoryError("out of memory on GPU 0"))
    assert oom.status == "error" and oom.error.code == "restore_out_of_memory"
    assert oom.error.retryable
    raised = failed_call(gpu_executor(), CallFailedError("the model raised"))
    assert raised.error.code == "call_failed" and not raised.error.retryable


# ------------------------------------------------------------------ the registry


@pytest.mark.parametrize(
    ("adapter", "work", "rule", "cancellable"),
    [
        (CpuExecutor, CpuWork, OnDeadline.AWAIT_KILL, False),
        (GpuExecutor, GpuWork, OnDeadline.END_NOW, False),
        (ApiExecutor, ApiWork, OnDeadline.CANCEL, True),
    ],
)
def test_each_adapter_declares_its_work_its_deadline_rule_and_whether_it_cancels(
    adapter: type, work: type, rule: OnDeadline, cancellable: bool
) -> None:
    assert adapter.work is work
    assert adapter.on_deadline is rule
    assert adapter.cancellable is cancellable
    assert adapter.deadline_note.startswith("; ")
    for method in ("admit", "execute", "shutdown"):
        assert callable(getattr(adapter, method))
    assert asyncio.iscoroutinefunction(adapter.execute)


def test_the_registry_finds_each_executor_by_its_kind_of_work() -> None:
    cpu, gpu, api = cpu_executor(), gpu_executor(), ApiExecutor()
    try:
        registry = executors_by_work(cpu, gpu, api)
        assert registry == {CpuWork: cpu, GpuWork: gpu, ApiWork: api}
        assert executor_for(registry, CpuWork("true")) is cpu
        assert executor_for(registry, GpuWork("model", [1])) is gpu
        assert executor_for(registry, ApiWork("echo")) is api
    finally:
        cpu.shutdown()
        gpu.shutdown()


def test_a_missing_executor_says_why_its_work_cannot_run() -> None:
    registry = executors_by_work(None, None, ApiExecutor())
    assert list(registry) == [ApiWork]
    for work in (CpuWork("true"), GpuWork("model", [1])):
        with pytest.raises(ExecutorMissing) as info:
            executor_for(registry, work)
        assert info.value.message == MISSING[type(work)]
    assert set(MISSING) == {CpuWork, GpuWork, ApiWork}


def test_two_executors_for_one_kind_of_work_are_refused() -> None:
    with pytest.raises(ValueError, match="two executors for ApiWork"):
        executors_by_work(ApiExecutor(), ApiExecutor())


# ------------------------------------------------------------------ admission


def test_cpu_work_is_admitted_on_its_open_trajectory_s_node() -> None:
    cpu = cpu_executor()
    try:
        traj = Trajectory("t", "local", 0.5, None, 0.0, False)
        spec = ActionSpec(CpuWork("true"), trajectory="t", max_units=2)
        got = cpu.admit(spec, traj, CLUSTER)
        assert got == Admission(ResourceKind.CPU, 2, memory_gb=0.5, node="local")
        with pytest.raises(BadRequest, match="needs a trajectory"):
            cpu.admit(ActionSpec(CpuWork("true")), None, CLUSTER)
        with pytest.raises(UnknownTrajectory, match="'t' is not open"):
            cpu.admit(spec, None, CLUSTER)
    finally:
        cpu.shutdown()


@pytest.mark.parametrize("cores", [(-1,), (0, -2), (2,), (True,)])
def test_a_core_not_on_the_node_is_refused_naming_it_never_mapped_to_another(
    cores: tuple[int, ...],
) -> None:
    """The executor maps the core's numbering onto host cores by index: core -1 became the
    node's last core (a silent wrong grant, on another action's core) and core 2 of a 2-core
    node an ``IndexError`` that said nothing of cores."""
    asked: list[tuple[int, ...]] = []

    def run_action(traj: str, command: str, host_cores: tuple[int, ...], **kw: Any) -> None:
        asked.append(host_cores)
        raise AssertionError("AOE was asked to run it")

    cpu = cpu_executor()
    cpu.aoe.run_action = run_action
    try:
        got = cpu.run_blocking("t", "true", cores, timeout_s=1.0)
        assert got.status == "error" and not asked, (got, asked)
        assert got.error is not None and f"cores {cores}" in got.error.message
        resized = cpu.resize_blocking("a", cores)
        assert resized.status == "failed" and f"cores {cores}" in (resized.error or "")
    finally:
        cpu.shutdown()


@pytest.mark.parametrize(
    ("gpus", "dops", "asked", "granted"),
    [
        (8, (1, 2, 4), 8, 4),  # capped at the largest DoP without a gap from 1
        (8, (1, 2, 4), 3, 2),  # the largest aligned cell within max_units
        (8, (1, 2, 8), 8, 2),  # DoP 4 missing: 8 is unreachable
        (2, (1, 2, 4, 8), 8, 2),  # the node has 2 GPUs
        (8, (1,), 1, 1),
    ],
)
def test_gpu_work_is_admitted_on_aligned_cells_its_service_runs_on(
    gpus: int, dops: tuple[int, ...], asked: int, granted: int
) -> None:
    gpu = gpu_executor(gpus, dops)
    try:
        got = gpu.admit(ActionSpec(GpuWork("model", [1]), max_units=asked), None, CLUSTER)
        # the core is told the service runs as whole replicas (EOE's ServiceInfo.parallelism)
        assert got == Admission(ResourceKind.GPU, granted, size_gb=3.0, replicas=True)
    finally:
        gpu.shutdown()


def test_a_layer_sharded_service_is_admitted_on_its_k_gpus_when_it_needs_them_all() -> None:
    def executor(resident_gb: float) -> GpuExecutor:
        info = SimpleNamespace(
            dops=(2,), resident_bytes=int(resident_gb * (1 << 30)), shards=2, parallelism="layers"
        )
        eoe = SimpleNamespace(
            devices=list(range(4)),
            config=SimpleNamespace(calls_per_gpu=1),
            services=lambda: ("model",),
            info=lambda name: info,
            close=lambda: None,
        )
        return GpuExecutor(eoe, GpuNodeSpec("gpu", gpus=4, gpu_memory_gb=16.0, host_memory_gb=64.0))

    big, small = executor(12.0), executor(6.0)  # 24 GB needs 2 GPUs of 16; 12 GB fits one
    try:
        got = big.admit(ActionSpec(GpuWork("model", [1]), max_units=1), None, CLUSTER)
        assert got == Admission(ResourceKind.GPU, 2, size_gb=24.0, replicas=False)
        with pytest.raises(BadRequest, match="split in 2 shards.*a cell of 1 GPUs"):
            small.admit(ActionSpec(GpuWork("model", [1])), None, CLUSTER)
    finally:
        big.shutdown()
        small.shutdown()


def test_an_engine_service_is_refused_on_a_node_of_several_gpus() -> None:
    """An engine service runs on its home GPU only, which the core does not know: on a node
    of several GPUs it was admitted, and failed with InvalidCellError whenever the core
    granted another GPU (on 2 GPUs, about one call in two). Refused at admission, saying so;
    on a 1-GPU node its home is the node's GPU."""

    def executor(gpus: int) -> GpuExecutor:
        info = SimpleNamespace(
            dops=(1,), resident_bytes=1 << 30, shards=1, parallelism="replicas", home=0
        )
        eoe = SimpleNamespace(
            devices=list(range(gpus)),
            config=SimpleNamespace(calls_per_gpu=1),
            services=lambda: ("vllm",),
            info=lambda name: info,
            close=lambda: None,
        )
        node = GpuNodeSpec("gpu", gpus=gpus, gpu_memory_gb=16.0, host_memory_gb=64.0)
        return GpuExecutor(eoe, node)

    two, one = executor(2), executor(1)
    try:
        with pytest.raises(BadRequest, match="engine on GPU 0"):
            two.admit(ActionSpec(GpuWork("vllm", [1])), None, CLUSTER)
        assert one.admit(ActionSpec(GpuWork("vllm", [1])), None, CLUSTER).max_units == 1
    finally:
        two.shutdown()
        one.shutdown()


def test_gpu_work_is_refused_for_an_unknown_service_or_one_without_dop_1() -> None:
    gpu = gpu_executor(dops=(2, 4))
    try:
        with pytest.raises(BadRequest, match="must support DoP 1"):
            gpu.admit(ActionSpec(GpuWork("model", [1])), None, CLUSTER)
        with pytest.raises(BadRequest, match="unknown GPU service 'other'"):
            gpu.admit(ActionSpec(GpuWork("other", [1])), None, CLUSTER)
    finally:
        gpu.shutdown()


def test_api_work_is_admitted_on_a_declared_and_registered_endpoint_one_slot() -> None:
    api = ApiExecutor({"echo": echo})
    assert api.admit(ActionSpec(ApiWork("echo")), None, CLUSTER) == Admission(ResourceKind.API, 1)
    with pytest.raises(BadRequest, match="unknown API endpoint 'nope'"):
        api.admit(ActionSpec(ApiWork("nope")), None, CLUSTER)
    with pytest.raises(ExecutorMissing, match="no callable registered"):
        api.admit(ActionSpec(ApiWork("quiet")), None, CLUSTER)


# ------------------------------------------------------------------ deadline rules, carried out


class RunsOn(ApiExecutor):
    """A call that cannot be interrupted: a deadline ends the action, the call runs on."""

    on_deadline = OnDeadline.END_NOW
    deadline_note = "; it runs on"
    cancellable = False

    def __init__(self) -> None:
        super().__init__({"echo": echo})
        self.returned = asyncio.Event()

    async def execute(self, work: Any, start: Any, *, trajectory: str, time_left_s: float) -> Any:
        await asyncio.sleep(work.payload["s"])
        self.returned.set()
        return ExecResult("result", "late", exec_s=work.payload["s"])


class KillsItself(ApiExecutor):
    """An executor that kills its action at the deadline itself, as AOE does (or, with
    ``report=False``, never says so)."""

    on_deadline = OnDeadline.AWAIT_KILL
    deadline_note = "; no kill was reported"
    cancellable = False

    def __init__(self, report: bool) -> None:
        super().__init__({"echo": echo})
        self.report = report

    async def execute(self, work: Any, start: Any, *, trajectory: str, time_left_s: float) -> Any:
        if not self.report:
            await asyncio.sleep(3600)
        await asyncio.sleep(time_left_s)
        return ExecResult("timeout", exec_s=time_left_s, error=None)


def with_executor(
    api: ApiExecutor, body: Callable[[Runtime], Awaitable[Any]], **config: Any
) -> Any:
    async def main() -> Any:
        rt = Runtime(CLUSTER, RuntimeConfig(close_grace_s=0.2, **config), api=api)
        async with rt:
            return await body(rt)

    return asyncio.run(main())


def test_end_now_ends_the_action_at_its_deadline_and_holds_the_slot_until_the_call_returns() -> (
    None
):
    api = RunsOn()

    async def body(rt: Runtime) -> None:
        out = await rt.run(ActionSpec(ApiWork("echo", {"s": 0.3}), timeout_s=0.1))
        assert out.status == "timeout" and out.error.message.endswith("; it runs on")
        assert out.start_s is not None and 0.09 <= out.timings.act_s < 0.3
        assert rt.scheduler.state.api["echo"].in_flight == 1, "the call still holds its slot"
        await api.returned.wait()
        await asyncio.sleep(0.01)
        assert rt.scheduler.state.api["echo"].in_flight == 0
        assert (await rt.result(out.action_id)) is out, "still its one outcome"
        assert rt.counters["completed"] == 1

    with_executor(api, body)


def test_await_kill_takes_the_executor_s_report_when_it_comes() -> None:
    async def body(rt: Runtime) -> None:
        out = await rt.run(ActionSpec(ApiWork("echo"), timeout_s=0.1))
        assert out.status == "timeout" and out.error is None, "the executor's own outcome"

    with_executor(KillsItself(report=True), body, timeout_grace_s=5.0)


def test_await_kill_ends_the_action_after_the_grace_when_no_kill_is_reported() -> None:
    async def body(rt: Runtime) -> None:
        out = await rt.run(ActionSpec(ApiWork("echo"), timeout_s=0.1))
        assert out.status == "timeout" and out.error.message.endswith("; no kill was reported")
        assert 0.25 <= out.timings.act_s < 1.0, "deadline 0.1 s + grace 0.2 s"

    with_executor(KillsItself(report=False), body, timeout_grace_s=0.2)


def test_a_running_action_of_a_non_cancellable_executor_is_not_cancelled() -> None:
    async def body(rt: Runtime) -> None:
        aid = await rt.submit(ActionSpec(ApiWork("echo", {"s": 0.2})))
        await asyncio.sleep(0.05)
        assert rt.state(aid) == "running"
        with pytest.raises(NotCancellable, match="API executor, which cannot interrupt it"):
            await rt.cancel(aid)
        out = await rt.result(aid)
        assert out is not None and out.ok and out.value == "late"

    with_executor(RunsOn(), body)


@pytest.fixture
def stopped_managers(monkeypatch: pytest.MonkeyPatch) -> list[str]:
    """Fake AOE and EOE managers for ``build_runtime``: the AOE one stands in for Docker (on
    two cores), the EOE one is real on CPU-backed devices; each records its stop ("aoe",
    "eoe") in the list returned."""
    import tangram.exec.aoe as aoe_package
    import tangram.exec.eoe as eoe_package
    from tangram.exec.eoe.manager import EoeManager

    stopped: list[str] = []

    class Aoe:
        def __init__(self, config: Any, client: Any = None) -> None:
            self.topology = SimpleNamespace(cores=(0, 1))

        def shutdown(self) -> None:
            stopped.append("aoe")

    class Eoe(EoeManager):
        def close(self) -> None:
            stopped.append("eoe")
            super().close()

    monkeypatch.setattr(aoe_package, "AoeManager", Aoe)
    monkeypatch.setattr(eoe_package, "EoeManager", Eoe)
    return stopped


def test_build_runtime_stops_the_executors_it_made_when_a_gpu_service_fails(
    monkeypatch: pytest.MonkeyPatch, stopped_managers: list[str]
) -> None:
    """A GPU service that fails to register ends build_runtime with its error, and the AOE
    manager and the EOE manager made before it are shut down: they were left running (AOE's
    Docker client and watchdog, EOE's devices) with nothing holding them."""
    from tangram.exec.eoe import ServiceSpec, ServiceSpecError
    from tangram.exec.runtime import builder

    monkeypatch.setattr(builder, "CpuExecutor", lambda aoe, node: SimpleNamespace(aoe=aoe))

    def broken() -> Any:
        raise OSError("checkpoint missing")

    cluster = ClusterSpec(
        name="one",
        cpu_nodes=(CpuNodeSpec("c", cores=1, numa_domains=1, memory_gb=4.0),),
        gpu_nodes=(GpuNodeSpec("g", gpus=1, gpu_memory_gb=1.0, host_memory_gb=4.0),),
    )
    bad = ServiceSpec("bad", factory=broken, call=lambda module, x: x)
    with pytest.raises(ServiceSpecError, match="checkpoint missing"):
        builder.build_runtime(cluster, gpu_backend="cpu", services=[bad])
    assert sorted(stopped_managers) == ["aoe", "eoe"]


def test_build_runtime_stops_the_executors_it_made_when_the_runtime_refuses_the_cluster(
    stopped_managers: list[str],
) -> None:
    """A cluster the runtime refuses (here two GPU nodes: a live runtime drives one) ended
    build_runtime with the runtime's error after both managers were made, and neither was
    shut down: the AOE manager's Docker client and watchdog, the EOE manager's devices and
    the executors' threads were left running with nothing holding them."""
    from tangram.exec.runtime import builder

    gpu = GpuNodeSpec("g", gpus=1, gpu_memory_gb=1.0, host_memory_gb=4.0)
    cluster = ClusterSpec(
        name="two-gpu-nodes",
        cpu_nodes=(CpuNodeSpec("c", cores=1, numa_domains=1, memory_gb=4.0),),
        gpu_nodes=(gpu, GpuNodeSpec("g2", gpus=1, gpu_memory_gb=1.0, host_memory_gb=4.0)),
    )
    with pytest.raises(ValueError, match="drives one GPU node"):
        builder.build_runtime(cluster, gpu_backend="cpu", services=[])
    assert sorted(stopped_managers) == ["aoe", "eoe"]


def test_an_action_started_with_no_time_left_ends_as_never_started_without_its_executor() -> None:
    """An action whose start came at (or after) its deadline (the start and the deadline's
    timer in one event-loop iteration) ended "the time-out passed at its start" with a start
    time and units, as a time-out of a started action: ``/run_code`` answered
    ``TimeLimitExceeded`` (not retried by SandboxFusion's client) for a command that never
    ran. It now ends without calling its executor, as a time-out that never started."""
    calls: list[Any] = []

    class Counting(ApiExecutor):
        async def execute(self, *args: Any, **kw: Any) -> Any:
            calls.append(kw["time_left_s"])
            return await super().execute(*args, **kw)

    async def body(rt: Runtime) -> None:
        def late() -> None:  # the start comes after the action's deadline (clock moved on)
            rt.host._t0 -= 100.0

        rt.host.before_start = late
        out = await rt.run(ActionSpec(ApiWork("echo", 1), timeout_s=5.0))
        assert out.status == "timeout" and "never started" in out.error.message, out
        assert out.start_s is None and out.units is None, out
        assert out.timings.exec_s == 0.0
        assert calls == []
        assert rt.scheduler.state.api["echo"].in_flight == 0, "its slot was given back"

    with_executor(Counting({"echo": echo}), body)


@pytest.mark.parametrize(
    ("inputs", "problem"),
    [
        ({"input_ids": torch.zeros(2, 3), "attention_mask": torch.zeros(3, 3)}, "[2, 3]"),
        ("looped", "contains itself"),
    ],
)
def test_inputs_that_cannot_be_cut_are_refused_saying_plainly_what_is_wrong(
    inputs: Any, problem: str
) -> None:
    """The refusal read "inputs of 'model': it holds a dict that contains itself; a call that
    ... is cut along its batch, which needs one batch size": a looped dict was told to have
    one batch size, and "it" named nothing. Now it names the inputs, what is wrong with them,
    why it matters (the call may be cut along its batch) and the way out (max_units 1)."""
    if inputs == "looped":
        inputs = {"input_ids": torch.zeros(2, 3)}
        inputs["self"] = inputs
    gpu = gpu_executor(4, (1, 2))
    try:
        with pytest.raises(BadRequest) as refused:
            gpu.admit(ActionSpec(GpuWork("model", inputs), max_units=2), None, CLUSTER)
        message = str(refused.value)
        assert message.startswith("the inputs of GPU service 'model' cannot be cut along")
        assert problem in message and "max_units 1" in message
        assert "contains itself;" not in message and "it holds" not in message
        if problem == "contains itself":
            assert "one batch size" not in message  # a loop is no batch-size mismatch
    finally:
        gpu.shutdown()
