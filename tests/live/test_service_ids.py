"""Ids in URLs (issue 16, defect 3): every id of the documented alphabet round-trips through
every endpoint (open, submit, poll, cancel, close) by both clients, and the service refuses
an id outside the alphabet with a 400 naming the field, in the body as in the path.

The CPU executor runs on a stand-in for AOE (no Docker): what is tested is the way from the
clients through HTTP to the runtime's tables and back.
"""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any
from urllib.parse import quote

import httpx
import pytest
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st

from tangram.core.resources import ApiEndpointSpec, ClusterSpec, CpuNodeSpec
from tangram.exec.aoe.records import ActionOutcome, ContainerHandle
from tangram.exec.runtime import ApiExecutor, CpuExecutor, Runtime, RuntimeConfig
from tangram.exec.runtime.api import echo
from tangram.exec.runtime.errors import BadRequest, UnknownTrajectory
from tangram.exec.runtime.records import MAX_ID_CHARS, ActionSpec, ApiWork, check_id
from tangram.exec.service import AsyncClient, Client, ServeOptions, ServiceError, ServiceThread
from tangram.exec.service.calls import segment
from tests.live.conftest import CallLog, faulty_endpoints

NODE = CpuNodeSpec("local", cores=2, numa_domains=1, memory_gb=64.0)
CLUSTER = ClusterSpec(
    name="ids",
    cpu_nodes=(NODE,),
    apis=(ApiEndpointSpec("echo", concurrency=64), ApiEndpointSpec("slow", concurrency=64)),
)


@dataclass
class Topology:
    cores: tuple[int, ...] = (0, 1)


@dataclass
class FakeAoe:
    """AOE's calls the CPU executor makes, without containers: each action echoes its
    trajectory and command."""

    topology: Topology = field(default_factory=Topology)
    containers: dict[str, ContainerHandle] = field(default_factory=dict)
    lock: threading.Lock = field(default_factory=threading.Lock)
    #: Every action run: (trajectory, command, the keyword arguments).
    runs: list[tuple[str, Any, dict[str, Any]]] = field(default_factory=list)

    def open_trajectory(self, traj: str, memory_gb: float, *, image: str | None = None) -> Any:
        with self.lock:
            n = len(self.containers)
            handle = ContainerHandle(traj, f"c{n:04d}", f"fake-{n}", image or "fake", memory_gb)
            self.containers[traj] = handle
        return handle

    def close_trajectory(self, traj: str) -> None:
        with self.lock:
            del self.containers[traj]

    def recreate(self, traj: str) -> Any:
        return self.containers[traj]

    def handle(self, traj: str) -> Any:
        return self.containers[traj]

    def run_action(self, traj: str, command: Any, cores: tuple[int, ...], **kw: Any) -> Any:
        self.runs.append((traj, command, kw))
        out = f"{traj}|{command}".encode()
        return ActionOutcome(traj, kw["action_id"], "ok", 0, out, b"", None, cores, len(cores))

    def shutdown(self) -> None:
        self.containers.clear()


def fake_cpu_runtime(aoe: FakeAoe | None = None) -> Runtime:
    """A runtime whose CPU executor runs on ``aoe`` (a fresh ``FakeAoe`` by default)."""
    return Runtime(
        CLUSTER,
        RuntimeConfig(max_pending=256, default_timeout_s=60.0),
        cpu=CpuExecutor(aoe or FakeAoe(), NODE),
        api=ApiExecutor({"echo": echo, **faulty_endpoints(CallLog())}),
    )


@pytest.fixture(scope="module")
def svc() -> Iterator[ServiceThread]:
    with ServiceThread(fake_cpu_runtime, ServeOptions(port=0)) as service:
        yield service


#: Characters of URLs and shells that an id may hold, drawn often.
URL_CHARS = "?#%&=+;:@!$'()*,[]{}<>|\\^`\"~. -_"
ID_CHARS = st.characters(
    blacklist_categories=("Cc", "Cf", "Cs", "Co", "Cn", "Zl", "Zp", "Zs"),
    blacklist_characters="/",
) | st.sampled_from(URL_CHARS)
#: The id alphabet of docs/live.md: 1..128 printable characters, no '/', no outer spaces.
IDS = st.text(ID_CHARS, min_size=1, max_size=MAX_ID_CHARS).filter(lambda s: s.strip() == s)
#: (trajectory, action, call): a trajectory id does not start with '~' (the runtime's labels).
TRIPLES = st.lists(IDS, min_size=3, max_size=3, unique=True).filter(
    lambda ids: not ids[0].startswith("~")
)


def test_every_drawn_id_is_in_the_alphabet() -> None:
    @given(IDS)
    @settings(max_examples=300, deadline=None)
    def check(value: str) -> None:
        assert check_id("id", value) == value

    check()


def test_a_path_segment_keeps_every_character_of_the_id() -> None:
    for value in ("q?x=1", "h#f", "p%2Fq", "..", ".", "a b", "ü", "{x}", "a%zz", "+"):
        encoded = segment(value)
        assert "/" not in encoded and "?" not in encoded and "#" not in encoded
        assert encoded.strip(".") == encoded or "." not in value, encoded
        request = httpx.Request("GET", "http://h/v1/actions/" + encoded)
        assert request.url.raw_path == b"/v1/actions/" + encoded.encode(), value


def round_trip_sync(url: str, traj: str, action: str, call: str) -> None:
    with Client(url, retries=0) as c:
        opened = c.open_trajectory(traj, memory_gb=0.25)
        assert opened["id"] == traj
        assert traj in {t["id"] for t in c.trajectories()}
        assert c.recreate_trajectory(traj)["id"] == traj
        aid = c.submit(command="echo hi", trajectory=traj, id=action)
        assert aid == action
        out = c.result(action, wait_s=30)
        assert out is not None and out.action_id == action and out.trajectory == traj
        assert out.value.stdout == f"{traj}|echo hi"
        assert c.state(action) == "done"
        assert c.cancel(action).action_id == action  # done: the outcome, unchanged
        assert c.submit(endpoint="slow", payload={"s": 30}, trajectory=traj, id=call) == call
        assert c.state(call) in ("queued", "running")
        cancelled = c.cancel(call)
        assert cancelled.action_id == call and cancelled.error.code == "cancelled"
        assert c.result(call).action_id == call
        closed = c.close_trajectory(traj)
        assert closed["id"] == traj and closed["closed"] is True
        assert traj not in {t["id"] for t in c.trajectories()}


async def round_trip_async(url: str, traj: str, action: str, call: str) -> None:
    async with AsyncClient(url, retries=0) as c:
        assert (await c.open_trajectory(traj, memory_gb=0.25))["id"] == traj
        assert (await c.recreate_trajectory(traj))["id"] == traj
        assert await c.submit(command="echo hi", trajectory=traj, id=action) == action
        out = await c.result(action, wait_s=30)
        assert out is not None and out.action_id == action and out.trajectory == traj
        assert await c.state(action) == "done"
        assert (await c.cancel(action)).action_id == action
        assert await c.submit(endpoint="slow", payload={"s": 30}, id=call) == call
        cancelled = await c.cancel(call)
        assert cancelled.action_id == call and cancelled.error.code == "cancelled"
        closed = await c.close_trajectory(traj)
        assert closed["id"] == traj and closed["closed"] is True


@settings(
    max_examples=25,
    deadline=None,
    derandomize=True,
    suppress_health_check=[HealthCheck.too_slow],
)
@given(ids=TRIPLES)
@example(ids=["q?x=1", "h#frag", "p%2Fq"])
@example(ids=["..", ".", "%41"])
@example(ids=["{id}", "a b", "ü-軌跡"])
def test_valid_ids_round_trip_through_every_endpoint_by_both_clients(ids: list[str]) -> None:
    traj, action, call = ids
    with ServiceThread(fake_cpu_runtime, ServeOptions(port=0)) as service:  # fresh tables
        round_trip_sync(service.url, traj, action, call)
        asyncio.run(round_trip_async(service.url, traj, f"{action[:100]}~a", f"{call[:100]}~a"))
        assert service.runtime is not None and not service.runtime.trajectories()


#: Ids outside the alphabet, and what the refusal says.
INVALID = [
    ("", "non-empty"),
    ("x" * (MAX_ID_CHARS + 1), f"at most {MAX_ID_CHARS}"),
    ("a/b", "'/'"),
    (" lead", "surrounding"),
    ("tab\there", "printable"),
    ("nul\x00", "printable"),
    ("zero\u200bwidth", "printable"),
]


@pytest.mark.parametrize(("value", "needle"), INVALID, ids=repr)
def test_ids_outside_the_alphabet_are_refused_naming_the_field(
    svc: ServiceThread, value: str, needle: str
) -> None:
    with pytest.raises(BadRequest, match="id"):
        check_id("id", value)
    base = svc.url
    r = httpx.post(f"{base}/v1/actions", json={"endpoint": "echo", "id": value})
    assert r.status_code == 400 and needle in r.json()["error"]["message"], r.text
    assert "'id'" in r.json()["error"]["message"] or "id " in r.json()["error"]["message"]
    r = httpx.post(f"{base}/v1/trajectories", json={"id": value})
    assert r.status_code == 400 and "trajectory" in r.json()["error"]["message"], r.text
    if not value:
        return  # an empty segment is another path (the list), not an id
    seg = quote(value, safe="")
    for method, path, name in (
        ("GET", f"/v1/actions/{seg}", "id"),
        ("DELETE", f"/v1/actions/{seg}", "id"),
        ("GET", f"/v1/trajectories/{seg}", "trajectory"),
        ("DELETE", f"/v1/trajectories/{seg}", "trajectory"),
        ("POST", f"/v1/trajectories/{seg}/recreate", "trajectory"),
    ):
        r = httpx.request(method, base + path)
        assert r.status_code == 400, (method, path, r.status_code, r.text)
        doc = r.json()["error"]
        assert doc["code"] == "bad_request" and name in doc["message"], (path, doc)


@pytest.mark.parametrize("suffix", ["?x=1", "#frag", "%3Fx", "/..", "/../q"])
def test_an_id_never_reaches_another_trajectory(svc: ServiceThread, suffix: str) -> None:
    with Client(svc.url, retries=0) as c:
        c.open_trajectory("q", memory_gb=0.25)
        try:
            with pytest.raises(ServiceError) as info:
                c.close_trajectory("q" + suffix)
            assert info.value.status in (400, 404), info.value
            assert "q" in {t["id"] for t in c.trajectories()}, f"closing q{suffix} closed q"
        finally:
            c.close_trajectory("q")


def test_an_action_labelled_with_a_closing_trajectory_is_refused_at_submission() -> None:
    """Closing waits for the trajectory's running actions. An API (or GPU) action labelled
    with it meanwhile was accepted, then ended as ``rejected`` when the core forgot the
    trajectory (or ran, had a unit been free); it is now refused, naming the trajectory."""

    async def main() -> None:
        rt = fake_cpu_runtime()
        await rt.start()
        try:
            await rt.open_trajectory("t", memory_gb=0.25)
            running = await rt.submit(ActionSpec(ApiWork("slow", {"s": 0.5}), trajectory="t"))
            closing = asyncio.create_task(rt.close_trajectory("t"))
            await asyncio.sleep(0.05)
            assert rt.trajs.closing("t")
            with pytest.raises(UnknownTrajectory, match="closing"):
                await rt.submit(ActionSpec(ApiWork("echo", 1), trajectory="t"))
            await closing
            assert (await rt.result(running)).ok  # type: ignore[union-attr]
            label = await rt.run(ActionSpec(ApiWork("echo", 2), trajectory="t"))
            assert label.ok  # once closed, the name is a free label again
        finally:
            await rt.close()

    asyncio.run(main())
