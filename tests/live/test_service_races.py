"""Counterexamples found by probing the service with odd inputs and races: each test once
failed. The CPU executor runs on a stand-in for AOE (no Docker)."""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import httpx
import pytest

from tangram.core.resources import ApiEndpointSpec, ClusterSpec, CpuNodeSpec
from tangram.exec.aoe.errors import AoeError
from tangram.exec.aoe.errors import UnknownTrajectory as AoeUnknownTrajectory
from tangram.exec.runtime import ApiExecutor, Conflict, CpuExecutor, Runtime, RuntimeConfig
from tangram.exec.runtime.errors import UnknownTrajectory
from tangram.exec.service import ServeOptions, ServiceThread
from tests.live.test_service_ids import FakeAoe, fake_cpu_runtime

NODE = CpuNodeSpec("local", cores=2, numa_domains=1, memory_gb=64.0)
CLUSTER = ClusterSpec(
    name="races",
    cpu_nodes=(NODE,),
    apis=(ApiEndpointSpec("echo", concurrency=1), ApiEndpointSpec("gated", concurrency=1)),
)


@pytest.fixture
def gate() -> Iterator[threading.Event]:
    event = threading.Event()
    yield event
    event.set()


@pytest.fixture
def svc(gate: threading.Event) -> Iterator[ServiceThread]:
    async def echo(payload: Any) -> Any:
        return payload

    async def gated(payload: Any) -> Any:
        while not gate.is_set():
            await asyncio.sleep(0.01)
        return payload

    def make() -> Runtime:
        return Runtime(
            CLUSTER,
            RuntimeConfig(max_pending=64, default_timeout_s=60.0),
            cpu=CpuExecutor(FakeAoe(), NODE),
            api=ApiExecutor({"echo": echo, "gated": gated}),
        )

    with ServiceThread(make, ServeOptions(port=0)) as service:
        try:
            yield service
        finally:
            gate.set()  # (the service's close waits for its running calls)


def test_a_deadline_at_the_start_of_an_api_call_still_gives_it_an_outcome(
    svc: ServiceThread,
) -> None:
    """``timeout_s`` 1e-6: the deadline fired after the core started the call and before its
    task ran its first step; cancelling that task skipped the code that ends the action, so it
    stayed ``running`` with no outcome for ever and held the endpoint's only slot."""
    body = {"id": "tiny", "endpoint": "echo", "payload": 1, "timeout_s": 1e-6, "wait": 5}
    r = httpx.post(f"{svc.url}/v1/actions", json=body, timeout=30)
    assert r.status_code == 200, r.text
    assert r.json()["outcome"]["status"] == "timeout", r.text
    # The endpoint's one slot is free again: the next call runs.
    r = httpx.post(f"{svc.url}/v1/actions", json={"endpoint": "echo", "payload": 2, "wait": 5})
    assert r.status_code == 200 and r.json()["outcome"]["result"] == 2, r.text


def test_a_trajectory_id_cannot_take_the_label_of_an_action_without_one(
    svc: ServiceThread, gate: threading.Event
) -> None:
    """An API or GPU action without a trajectory is labelled ``~<its id>`` in the core. A
    trajectory opened as ``~x`` shared that label, and closing it rejected the queued action
    ``x`` (another client's work): now such an id is refused, and ``x`` runs."""
    base = svc.url
    first = {"id": "first", "endpoint": "gated", "payload": 1}
    assert httpx.post(f"{base}/v1/actions", json=first).status_code == 202
    x = {"id": "x", "endpoint": "gated", "payload": 2}
    assert httpx.post(f"{base}/v1/actions", json=x).status_code == 202
    r = httpx.post(f"{base}/v1/trajectories", json={"id": "~x", "memory_gb": 0.25})
    if r.status_code == 201:
        httpx.delete(f"{base}/v1/trajectories/~x")
    assert r.status_code == 400, r.text
    error = r.json()["error"]
    assert error["code"] == "bad_request" and "'~'" in error["message"], error
    assert "id" in error["message"], error
    gate.set()
    r = httpx.get(f"{base}/v1/actions/x", params={"wait": 5})
    assert r.status_code == 200 and r.json()["outcome"]["status"] == "result", r.text


#: Estimates the trace format cannot carry (times past 1e9 s, integers past int64), each with
#: the field a refusal must name.
UNTRACEABLE = [
    ({"command": "echo", "trajectory": "t", "t1_s": 2e9}, "t1_s"),
    ({"endpoint": "echo", "payload": 1, "t1_s": 1e10}, "t1_s"),
    ({"command": "echo", "trajectory": "t", "max_units": 2**63}, "max_units"),
    (
        {
            "command": "echo",
            "trajectory": "t",
            "max_units": 2,
            "curve": {"kind": "amdahl", "t1": 1e300, "serial_fraction": 0.5},
        },
        "t1",
    ),
]


@pytest.mark.parametrize(("body", "field"), UNTRACEABLE, ids=lambda v: str(v)[:40])
def test_an_accepted_action_is_in_the_trace_or_refused_naming_the_field(
    svc: ServiceThread, body: dict[str, Any], field: str
) -> None:
    """These were accepted and run, then left out of the trace ("could not be recorded"): the
    run's record lost them. Now they are refused before anything runs."""
    base = svc.url
    assert httpx.post(f"{base}/v1/trajectories", json={"id": "t"}).status_code == 201
    r = httpx.post(f"{base}/v1/actions", json={**body, "id": "big", "wait": 5}, timeout=30)
    if r.status_code < 300:
        assert '"big"' in httpx.get(f"{base}/v1/trace").text, "accepted, ran, not traced"
    assert r.status_code == 400, r.text
    assert field in r.json()["error"]["message"], r.text


class _NoImage(FakeAoe):
    """A stand-in AOE that cannot make a container of the image ``missing:1``."""

    def open_trajectory(self, traj: str, memory_gb: float, *, image: str | None = None) -> Any:
        if image == "missing:1":
            raise RuntimeError(f"no image {image}")
        return super().open_trajectory(traj, memory_gb, image=image)


@pytest.mark.parametrize(
    "refused_open",
    [{"id": "t9", "memory_gb": 10.0}, {"id": "t9", "memory_gb": 0.25, "image": "missing:1"}],
    ids=["no-room", "no-container"],
)
def test_a_refused_open_leaves_the_actions_labelled_with_its_id_alone(
    gate: threading.Event, refused_open: dict[str, Any]
) -> None:
    """An API call labelled with trajectory ``t9`` (a label: GPU and API work need no open
    trajectory) waits for the endpoint. An open of ``t9`` that is refused (no memory free now:
    a 503; its container cannot be made) ended that call as ``rejected``, 'trajectory t9
    closed while the action was queued', though ``t9`` never opened: a refused request must
    change nothing."""

    async def gated(payload: Any) -> Any:
        while not gate.is_set():
            await asyncio.sleep(0.01)
        return payload

    def make() -> Runtime:
        return Runtime(
            CLUSTER,
            RuntimeConfig(max_pending=64, default_timeout_s=60.0),
            cpu=CpuExecutor(_NoImage(), NODE),
            api=ApiExecutor({"gated": gated}),
        )

    with ServiceThread(make, ServeOptions(port=0)) as svc:
        try:
            base = svc.url
            big = {"id": "big", "memory_gb": 60.0}
            assert httpx.post(f"{base}/v1/trajectories", json=big).status_code == 201
            first = {"id": "first", "endpoint": "gated", "payload": 1}
            assert httpx.post(f"{base}/v1/actions", json=first).status_code == 202
            y = {"id": "y", "endpoint": "gated", "payload": 2, "trajectory": "t9"}
            assert httpx.post(f"{base}/v1/actions", json=y).status_code == 202
            r = httpx.post(f"{base}/v1/trajectories", json=refused_open, timeout=30)
            assert r.status_code >= 400, r.text
            assert httpx.get(f"{base}/v1/actions/y").json()["state"] == "queued"
            gate.set()
            r = httpx.get(f"{base}/v1/actions/y", params={"wait": 5})
            assert r.status_code == 200, r.text
            assert r.json()["outcome"]["status"] == "result", r.text
        finally:
            gate.set()


@pytest.mark.parametrize(
    ("language", "path"), [("python", "main.py/data.txt"), ("bash", "main.sh/a/b")]
)
def test_run_code_refuses_files_that_would_make_the_source_file_a_directory(
    svc: ServiceThread, language: str, path: str
) -> None:
    """``/run_code`` writes the code to the language's source file (``main.py``) after the
    request's ``files``: a file under ``main.py/`` made it a directory, the code could not be
    written, and the answer was a ``SandboxError`` ("writing the files failed"), which
    SandboxFusion's clients retry, for a request that can never run. It is the client's
    error: a 400 naming the field and the source file, before anything runs."""
    body = {"code": "print(1)", "language": language, "files": {path: "aGk="}}
    r = httpx.post(f"{svc.url}/run_code", json=body, timeout=30)
    assert r.status_code == 400, r.text
    doc = r.json()
    assert doc["status"] == "SandboxError" and doc["error"]["code"] == "bad_request", doc
    assert "'files'" in doc["error"]["message"] and path.split("/")[0] in doc["message"], doc


def test_an_answer_that_says_done_carries_the_outcome() -> None:
    """A call whose time-out ends as the client's ``wait`` does (both 50 ms here; both 300 s
    by default): the wait timed out as the outcome came, and the answer was a 202 saying
    ``done`` with no outcome (every time in 60 tries)."""
    with ServiceThread(fake_cpu_runtime, ServeOptions(port=0)) as svc, httpx.Client() as h:
        for _ in range(10):
            body = {"endpoint": "slow", "payload": {"s": 10}, "timeout_s": 0.05, "wait": 0.05}
            doc = h.post(f"{svc.url}/v1/actions", json=body, timeout=30).json()
            assert (doc["state"] == "done") == (doc["outcome"] is not None), doc
            if doc["outcome"] is None:
                doc = h.get(f"{svc.url}/v1/actions/{doc['id']}", params={"wait": 5}).json()
            assert doc["outcome"]["status"] == "timeout", doc


def _refused_naming(url: str, raw: bytes, field: str) -> dict:
    """POST ``raw`` as JSON to ``url``: a 400 ``bad_request`` whose message names ``field``;
    the error document."""
    headers = {"Content-Type": "application/json"}
    r = httpx.post(url, content=raw, headers=headers, timeout=30)
    assert r.status_code == 400, r.text[:300]
    error = r.json()["error"]
    assert error["code"] == "bad_request" and field in error["message"], error
    return error


#: Bodies holding a lone surrogate ('\ud800': valid JSON, no Unicode character, cannot be
#: written as UTF-8) where text is run or written, and the field a refusal must name.
NOT_TEXT = [
    ("/v1/actions", b'{"command": "echo \\ud800", "trajectory": "t"}', "command"),
    ("/v1/actions", b'{"command": ["echo", "\\ud800"], "trajectory": "t"}', "command"),
    ("/v1/actions", b'{"command": "echo", "env": {"A": "\\udfff"}, "trajectory": "t"}', "'A'"),
    ("/run_code", b'{"code": "print(1) # \\ud800"}', "code"),
    ("/run_code", b'{"code": "print(1)", "stdin": "\\ud800"}', "stdin"),
    ("/run_code", b'{"code": "print(1)", "files": {"\\ud800.txt": "aGk="}}', "files"),
    ("/run_code", b'{"code": "print(1)", "fetch_files": ["\\ud800.txt"]}', "fetch_files"),
]


@pytest.mark.parametrize(("path", "raw", "field"), NOT_TEXT, ids=lambda v: str(v)[:40])
def test_text_that_cannot_be_utf8_is_refused_naming_the_field(
    path: str, raw: bytes, field: str
) -> None:
    """A command, environment value, program, input or file name with a lone surrogate was
    accepted and then failed where it was encoded: an action's outcome 'executor_error'
    (AOE could not encode its script), a 500 for ``/run_code``'s code and stdin, a
    ``SandboxError`` for its file names. It is the client's error: a 400 naming the field."""
    with ServiceThread(fake_cpu_runtime, ServeOptions(port=0)) as svc:
        assert httpx.post(f"{svc.url}/v1/trajectories", json={"id": "t"}).status_code == 201
        error = _refused_naming(f"{svc.url}{path}?wait=5", raw, field)
        assert "surrogate" in error["message"], error


#: An integer past a 64-bit float's range (JSON allows it; the body reader takes up to 4300
#: digits) in each number field that is read as a float, and the field a refusal must name.
HUGE = "1" + "0" * 400
TOO_BIG_FOR_A_FLOAT = [
    ("/v1/trajectories", f'{{"memory_gb": {HUGE}}}', "memory_gb"),
    ("/v1/trajectories", f'{{"wait_s": {HUGE}}}', "wait_s"),
    ("/v1/actions", f'{{"endpoint": "echo", "payload": 1, "wait": {HUGE}}}', "wait"),
    ("/v1/actions", f'{{"endpoint": "echo", "payload": 1, "timeout_s": {HUGE}}}', "timeout_s"),
    ("/v1/actions", f'{{"endpoint": "echo", "payload": 1, "t1_s": {HUGE}}}', "t1_s"),
    ("/run_code", f'{{"code": "1", "run_timeout": {HUGE}}}', "run_timeout"),
    ("/run_code", f'{{"code": "1", "compile_timeout": {HUGE}}}', "compile_timeout"),
    ("/run_code", f'{{"code": "1", "memory_limit_MB": {HUGE}}}', "memory_limit_MB"),
    ("/v1/actions", f'{{"service": "rm", "inputs": [[1.5, {HUGE}]]}}', "inputs"),
]


@pytest.mark.parametrize(("path", "raw", "field"), TOO_BIG_FOR_A_FLOAT, ids=lambda v: str(v)[:40])
def test_integers_too_large_for_a_float_are_refused_naming_the_field(
    path: str, raw: str, field: str
) -> None:
    """Each was a 500 (OverflowError: int too large to convert to float) from a check that
    converts the number to a float (``math.isfinite``, ``float()``)."""
    with ServiceThread(fake_cpu_runtime, ServeOptions(port=0)) as svc:
        _refused_naming(f"{svc.url}{path}", raw.encode(), field)


@pytest.mark.parametrize(("method", "path", "allowed"), [("PUT", "/v1/actions", "POST")])
def test_a_method_not_allowed_says_which_are(method: str, path: str, allowed: str) -> None:
    """A 405 lost aiohttp's ``Allow`` header (RFC 9110 requires it) when the service rewrote
    the refusal as its error document, and its message named no method the path takes."""
    with ServiceThread(fake_cpu_runtime, ServeOptions(port=0)) as svc:
        r = httpx.request(method, f"{svc.url}{path}", timeout=30)
        assert r.status_code == 405, r.text
        assert allowed in r.headers.get("Allow", ""), r.headers
        assert allowed in r.json()["error"]["message"], r.text


@pytest.mark.parametrize(
    ("path", "raw"),
    [
        ("/v1/actions", b'{"id": "a", "endpoint": "echo", "payload": 1, "id": "b"}'),
        ("/v1/actions", b'{"endpoint": "echo", "payload": {"k": 1, "k": 2}}'),
        ("/v1/trajectories", b'{"memory_gb": 0.25, "memory_gb": 64}'),
        ("/run_code", b'{"code": "print(1)", "code": "print(2)"}'),
    ],
    ids=["action-id", "payload", "memory", "run_code"],
)
def test_a_key_sent_twice_in_one_object_is_refused_naming_it(path: str, raw: bytes) -> None:
    """JSON objects with a repeated key were read as the last value, the first silently
    dropped (the service refuses unknown fields so that nothing is ignored silently; a proxy
    reading the first value would see another request than the service ran)."""
    with ServiceThread(fake_cpu_runtime, ServeOptions(port=0)) as svc:
        headers = {"Content-Type": "application/json"}
        r = httpx.post(f"{svc.url}{path}", content=raw, headers=headers, timeout=30)
        assert r.status_code == 400, r.text
        error = r.json()["error"]
        assert error["code"] == "bad_request" and "twice" in error["message"], error


@pytest.mark.parametrize("field", ["task", "kind"])
def test_a_label_with_a_lone_surrogate_cannot_cost_everyone_the_trace(
    tmp_path: Any, field: str
) -> None:
    """A ``task`` or ``kind`` label with a lone surrogate was accepted; the operator's trace
    (``--trace run.parquet``) then could not be written: ``POST /v1/trace`` answered 500,
    and the trace of the shutdown, every client's actions in it, failed the same way. The
    label is refused (400 naming it) and the trace is saved."""
    opts = ServeOptions(port=0, trace_path=tmp_path / "run.parquet")
    with ServiceThread(fake_cpu_runtime, opts) as svc:
        raw = f'{{"endpoint": "echo", "payload": 1, "{field}": "\\ud800", "wait": 5}}'
        headers = {"Content-Type": "application/json"}
        r = httpx.post(f"{svc.url}/v1/actions", content=raw.encode(), headers=headers)
        other = {"endpoint": "echo", "payload": 2, "wait": 5}
        assert httpx.post(f"{svc.url}/v1/actions", json=other).status_code == 200
        saved = httpx.post(f"{svc.url}/v1/trace", timeout=30)
        assert saved.status_code == 200, saved.text
        assert r.status_code == 400, r.text
        error = r.json()["error"]
        assert field in error["message"] and "surrogate" in error["message"], error


class _SlowRecreate(FakeAoe):
    """A stand-in AOE whose ``recreate`` waits for ``go`` once it started (``started``), then
    does what AOE does for a trajectory closed meanwhile: raises its ``UnknownTrajectory``."""

    def __init__(self) -> None:
        super().__init__()
        self.started = threading.Event()
        self.go = threading.Event()

    def recreate(self, traj: str) -> Any:
        self.started.set()
        self.go.wait(30)
        with self.lock:
            if traj not in self.containers:
                raise AoeUnknownTrajectory(f"trajectory {traj!r} was closed")
            return self.containers[traj]


def test_a_close_racing_a_recreate_answers_the_recreate_404() -> None:
    """A recreate whose container was being replaced when a close of the same trajectory
    removed it: AOE said 'closed', and the runtime reported that as a failed recreate, a 500
    ``internal``. The client's two calls raced; the trajectory is closed: a 404, as a
    recreate of a closed trajectory is answered."""
    aoe = _SlowRecreate()

    def make() -> Runtime:
        return Runtime(
            CLUSTER,
            RuntimeConfig(max_pending=64, default_timeout_s=60.0),
            cpu=CpuExecutor(aoe, NODE),
        )

    with ServiceThread(make, ServeOptions(port=0)) as svc, ThreadPoolExecutor(1) as pool:
        base = svc.url
        assert httpx.post(f"{base}/v1/trajectories", json={"id": "t"}).status_code == 201
        try:
            recreate = pool.submit(httpx.post, f"{base}/v1/trajectories/t/recreate", timeout=30)
            assert aoe.started.wait(10)
            r = httpx.delete(f"{base}/v1/trajectories/t", timeout=30)
            assert r.status_code == 200, r.text
        finally:
            aoe.go.set()
        r = recreate.result(30)
        assert r.status_code == 404, r.text
        assert r.json()["error"]["code"] == "unknown_trajectory", r.text
        assert "closed" in r.json()["error"]["message"], r.text
        assert httpx.get(f"{base}/v1/trajectories").json()["trajectories"] == []


class _GatedOpen(FakeAoe):
    """A stand-in AOE whose ``open_trajectory`` waits for ``go``; it counts its closes."""

    def __init__(self) -> None:
        super().__init__()
        self.go = threading.Event()
        self.closes: list[str] = []

    def open_trajectory(self, traj: str, memory_gb: float, *, image: str | None = None) -> Any:
        self.go.wait(30)
        return super().open_trajectory(traj, memory_gb, image=image)

    def close_trajectory(self, traj: str) -> None:
        self.closes.append(traj)
        super().close_trajectory(traj)


def test_two_closes_of_an_opening_trajectory_close_it_once() -> None:
    """Two closes sent while the container was still being made both waited for it, then
    both closed it: two 200s, AOE asked twice to remove the one container (the second failed,
    logged) and ``trajectories_closed`` counted 2. The second close is the 404 a close of a
    closed trajectory gets."""
    aoe = _GatedOpen()

    async def main() -> tuple[list[Any], int]:
        async with Runtime(CLUSTER, RuntimeConfig(), cpu=CpuExecutor(aoe, NODE)) as rt:
            opening = asyncio.create_task(rt.open_trajectory("t"))
            while "t" not in rt.trajs.by_id:  # (bounded by the open's own progress)
                await asyncio.sleep(0)
            closes = [asyncio.create_task(rt.close_trajectory("t")) for _ in range(2)]
            await asyncio.sleep(0)
            aoe.go.set()
            await opening
            done = await asyncio.gather(*closes, return_exceptions=True)
            return done, rt.counters["trajectories_closed"]

    try:
        done, counted_closes = asyncio.run(main())
    finally:
        aoe.go.set()
    assert [type(d).__name__ for d in done] == ["TrajectoryInfo", "UnknownTrajectory"], done
    assert aoe.closes == ["t"] and counted_closes == 1


class _GatedClose(FakeAoe):
    """A stand-in AOE whose ``close_trajectory`` waits for ``go`` once it started (a slow
    ``docker rm``), and which refuses a container for an id that still has one, as AOE does."""

    def __init__(self) -> None:
        super().__init__()
        self.started = threading.Event()
        self.go = threading.Event()

    def open_trajectory(self, traj: str, memory_gb: float, *, image: str | None = None) -> Any:
        with self.lock:
            if traj in self.containers:
                raise AoeError(f"trajectory {traj!r} already has a container")
        return super().open_trajectory(traj, memory_gb, image=image)

    def close_trajectory(self, traj: str) -> None:
        self.started.set()
        self.go.wait(30)
        super().close_trajectory(traj)


def test_an_open_of_an_id_whose_container_is_being_removed_is_a_conflict() -> None:
    """The close forgot the trajectory before its container was removed: an open of the same
    id meanwhile passed the runtime's checks and reached AOE, which still had the container,
    and the client got a 500 'could not create the container'. While its container is being
    removed the trajectory is closing: the open is a 409 saying so."""
    aoe = _GatedClose()

    async def main() -> None:
        async with Runtime(CLUSTER, RuntimeConfig(), cpu=CpuExecutor(aoe, NODE)) as rt:
            await rt.open_trajectory("t")
            closing = asyncio.create_task(rt.close_trajectory("t"))
            loop = asyncio.get_running_loop()
            assert await loop.run_in_executor(None, aoe.started.wait, 10)
            with pytest.raises(Conflict, match="closing"):
                await rt.open_trajectory("t")
            aoe.go.set()
            await closing
            assert (await rt.open_trajectory("t")).id == "t", "once closed, it opens again"

    try:
        asyncio.run(main())
    finally:
        aoe.go.set()


class _GatedOpenOnce(_GatedClose):
    """A stand-in AOE whose first ``open_trajectory`` says it started, then waits for
    ``open_go`` (a slow container start), and which says when it closed a container."""

    def __init__(self) -> None:
        super().__init__()
        self.open_started = threading.Event()
        self.closed = threading.Event()
        self.go.set()  # (closes do not wait here)
        self.open_go = threading.Event()

    def open_trajectory(self, traj: str, memory_gb: float, *, image: str | None = None) -> Any:
        if not self.open_started.is_set():
            self.open_started.set()
            self.open_go.wait(30)
        return super().open_trajectory(traj, memory_gb, image=image)

    def close_trajectory(self, traj: str) -> None:
        super().close_trajectory(traj)
        self.closed.set()


def test_a_cancelled_open_leaves_no_container_and_the_id_opens_again() -> None:
    """An open cancelled while AOE made the container (a caller's ``wait_for`` ran out) forgot
    the id at once, but AOE's thread went on and made the container: it stayed until the
    service stopped, and the next open of the id was refused by AOE ('already has a
    container'), a 500 to the client. Now the id stays closing until the container AOE made
    is removed, then opens again."""
    aoe = _GatedOpenOnce()

    async def main() -> None:
        async with Runtime(CLUSTER, RuntimeConfig(), cpu=CpuExecutor(aoe, NODE)) as rt:
            loop = asyncio.get_running_loop()
            opening = asyncio.create_task(rt.open_trajectory("t"))
            assert await loop.run_in_executor(None, aoe.open_started.wait, 10)
            opening.cancel()
            with pytest.raises(asyncio.CancelledError):
                await opening
            with pytest.raises(Conflict, match="closing"):  # its container is still coming
                await rt.open_trajectory("t")
            aoe.open_go.set()
            assert await loop.run_in_executor(None, aoe.closed.wait, 10), "container left"
            for _ in range(1000):  # (the close's last step, on this loop)
                if "t" not in rt.trajs.by_id:
                    break
                await asyncio.sleep(0)
            assert (await rt.open_trajectory("t")).id == "t", "once removed, it opens again"
            assert list(aoe.containers) == ["t"]

    try:
        asyncio.run(main())
    finally:
        aoe.open_go.set()


class _GatedAction(FakeAoe):
    """A stand-in AOE whose actions say they started, then wait for ``go``; it counts its
    closes."""

    def __init__(self) -> None:
        super().__init__()
        self.running = threading.Event()
        self.go = threading.Event()
        self.closed = threading.Event()
        self.closes: list[str] = []

    def run_action(self, traj: str, command: Any, cores: tuple[int, ...], **kw: Any) -> Any:
        self.running.set()
        self.go.wait(30)
        return super().run_action(traj, command, cores, **kw)

    def close_trajectory(self, traj: str) -> None:
        self.closes.append(traj)
        super().close_trajectory(traj)
        self.closed.set()


async def _cancel_a_close_under_way(rt: Runtime, aoe: _GatedAction) -> str:
    """Open trajectory "t", start an action (held running by ``aoe``), begin its close and
    cancel the close once it waits for that action; the action's id."""
    from tangram.exec.runtime import ActionSpec, CpuWork

    loop = asyncio.get_running_loop()
    await rt.open_trajectory("t")
    action = await rt.submit(ActionSpec(CpuWork("work"), trajectory="t"))
    assert await loop.run_in_executor(None, aoe.running.wait, 10)
    closing = asyncio.create_task(rt.close_trajectory("t"))
    for _ in range(1000):  # (until the close waits for the running action)
        if rt.trajs.closing("t"):
            break
        await asyncio.sleep(0)
    assert rt.trajs.closing("t")
    closing.cancel()
    with pytest.raises(asyncio.CancelledError):
        await closing
    return action


def test_a_cancelled_close_still_closes_the_trajectory() -> None:
    """A close cancelled while it waited for the trajectory's running action (a caller's
    ``wait_for`` ran out) left it closing for ever: its container was never removed, its
    memory never returned to the node, and every open of the id was a 409 'closing'. A
    close once begun now completes."""
    aoe = _GatedAction()

    async def main() -> None:
        async with Runtime(CLUSTER, RuntimeConfig(), cpu=CpuExecutor(aoe, NODE)) as rt:
            loop = asyncio.get_running_loop()
            action = await _cancel_a_close_under_way(rt, aoe)
            aoe.go.set()
            assert (await rt.result(action)).status == "result"
            assert await loop.run_in_executor(None, aoe.closed.wait, 10), "never closed"
            for _ in range(1000):  # (the close's last step, on this loop)
                if "t" not in rt.trajs.by_id:
                    break
                await asyncio.sleep(0)
            assert aoe.closes == ["t"] and "t" not in rt.trajs.by_id
            assert (await rt.open_trajectory("t")).id == "t", "once closed, it opens again"

    try:
        asyncio.run(main())
    finally:
        aoe.go.set()


class _GatedActionAndRemoval(_GatedAction):
    """``_GatedAction`` whose container removals wait for ``removal``."""

    def __init__(self) -> None:
        super().__init__()
        self.removal = threading.Event()

    def close_trajectory(self, traj: str) -> None:
        self.removal.wait(30)
        super().close_trajectory(traj)


def test_a_runtime_closes_only_once_a_close_under_way_is_done() -> None:
    """A close cancelled by its caller goes on as a task of its own; the runtime's shutdown
    did not wait for it, so it closed the trajectory on a host and executor already shut
    (its exception never retrieved) or never removed the container. Shutdown now waits for
    it (within the grace)."""
    aoe = _GatedActionAndRemoval()

    async def main() -> None:
        async with Runtime(CLUSTER, RuntimeConfig(), cpu=CpuExecutor(aoe, NODE)) as rt:
            loop = asyncio.get_running_loop()
            # The container's removal ends a moment into the shutdown (within its grace).
            rt_close = rt.close

            async def close(grace_s: float | None = None) -> None:
                loop.call_later(0.2, aoe.removal.set)
                await rt_close(grace_s)

            rt.close = close  # type: ignore[method-assign]
            await _cancel_a_close_under_way(rt, aoe)
            aoe.go.set()
        assert aoe.closes == ["t"], "the close under way was cut by the shutdown"
        assert not rt.trajs._closing_tasks

    try:
        asyncio.run(main())
    finally:
        aoe.go.set()
        aoe.removal.set()


def test_a_service_that_cannot_listen_leaves_its_runtime_closed(tmp_path: Any) -> None:
    """The runtime started before the site: when the address was taken, the start failed
    and the runtime stayed started, its journal locked by this very process, so a second
    start on another port was refused 'journal ... is in use by pid <this one>'."""
    import socket

    journal = tmp_path / "j.sqlite"

    def make() -> Runtime:
        return Runtime(CLUSTER, RuntimeConfig(journal_path=journal), api=ApiExecutor({}))

    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        failed = ServiceThread(make, ServeOptions(port=port))
        with pytest.raises(RuntimeError, match="address already in use"):
            failed.start()
    assert failed.runtime is not None and failed.runtime.journal is not None
    assert not failed.runtime.journal.is_open, "closed: its lock is free"
    with ServiceThread(make, ServeOptions(port=0)) as svc:
        assert httpx.get(f"{svc.url}/healthz").json() == {"ok": True}


def test_a_read_of_a_trajectory_whose_open_was_cancelled_is_not_found() -> None:
    """``opened_trajectory`` (``GET /v1/trajectories/{id}``) says an open that was cancelled
    is not found, whether the read came while the container was made or after the cancel:
    read after it (the id closing until the container AOE still makes is removed), it
    answered the trajectory, no container, as if open: a client whose retried open got 409
    (the id closing) was told it opened a trajectory whose container was being removed."""
    aoe = _GatedOpenOnce()

    async def main() -> None:
        async with Runtime(CLUSTER, RuntimeConfig(), cpu=CpuExecutor(aoe, NODE)) as rt:
            loop = asyncio.get_running_loop()
            opening = asyncio.create_task(rt.open_trajectory("t"))
            assert await loop.run_in_executor(None, aoe.open_started.wait, 10)
            during = asyncio.create_task(rt.opened_trajectory("t"))
            await asyncio.sleep(0)
            opening.cancel()
            with pytest.raises(asyncio.CancelledError):
                await opening
            with pytest.raises(UnknownTrajectory, match="cancelled"):
                await during
            with pytest.raises(UnknownTrajectory, match="cancelled"):
                await rt.opened_trajectory("t")
            aoe.open_go.set()
            assert await loop.run_in_executor(None, aoe.closed.wait, 10), "container left"

    try:
        asyncio.run(main())
    finally:
        aoe.open_go.set()
