"""Tenants (``--client NAME=TOKEN``): each client's ids live in a namespace of its own, so two
clients may use the same ids, neither sees nor touches the other's actions, and only the
operator's token reads the trace. API work only (no containers); the trajectories' side runs
against Docker in ``test_hostile_clients.py``."""

from __future__ import annotations

import asyncio
import threading
import time
from typing import Any

import httpx
import pytest

from tangram.core.resources import ApiEndpointSpec, ClusterSpec, CpuNodeSpec
from tangram.exec.runtime import ApiExecutor, CpuExecutor, Runtime, RuntimeConfig
from tangram.exec.runtime.api import echo
from tangram.exec.runtime.records import MAX_ID_CHARS
from tangram.exec.service import (
    Client,
    OverloadedError,
    ServeOptions,
    ServiceError,
    ServiceThread,
)
from tangram.exec.service.tenants import Tenant, Tokens, parse_client
from tangram.exec.service_cli import clients_of
from tests.live.test_service_ids import FakeAoe

CLUSTER = ClusterSpec(
    name="api-only",
    apis=(ApiEndpointSpec("echo", concurrency=8), ApiEndpointSpec("gate", concurrency=16)),
)
OPERATOR, ALICE, BOB = "op-token", "alice-token", "bob-token"


@pytest.fixture(scope="module")
def svc() -> Any:
    def make() -> Runtime:
        return Runtime(CLUSTER, RuntimeConfig(max_pending=64), api=ApiExecutor({"echo": echo}))

    opts = ServeOptions(port=0, token=OPERATOR, clients={"alice": ALICE, "bob": BOB})
    with ServiceThread(make, opts) as thread:
        yield thread


def test_two_tenants_use_the_same_id_and_each_gets_its_own_action(svc: ServiceThread) -> None:
    with Client(svc.url, token=ALICE) as alice, Client(svc.url, token=BOB) as bob:
        a = alice.run(endpoint="echo", payload="from alice", id="same")
        b = bob.run(endpoint="echo", payload="from bob", id="same")
        assert (a.action_id, a.value) == ("same", "from alice")
        assert (b.action_id, b.value) == ("same", "from bob")
        # Read again, each sees its own (not the other's, not a conflict).
        assert alice.result("same", wait_s=5).value == "from alice"
        assert bob.result("same", wait_s=5).value == "from bob"


def test_a_tenant_cannot_see_or_cancel_another_tenants_action(svc: ServiceThread) -> None:
    with Client(svc.url, token=ALICE) as alice:
        alice.run(endpoint="echo", payload=1, id="alices-only")
    for method in ("GET", "DELETE"):
        r = httpx.request(
            method,
            f"{svc.url}/v1/actions/alices-only",
            headers={"Authorization": f"Bearer {BOB}"},
        )
        assert r.status_code == 404, r.text
        error = r.json()["error"]
        # As an id never used: named as bob named it, no other tenant's name in sight.
        assert error["code"] == "unknown_action" and "'alices-only'" in error["message"]
        assert "alice:" not in error["message"] and "bob:" not in error["message"]


def test_an_action_without_an_id_gets_one_in_its_tenants_namespace(svc: ServiceThread) -> None:
    with Client(svc.url, token=BOB) as bob:
        out = bob.run(endpoint="echo", payload="anon")
        assert ":" not in out.action_id
        assert bob.result(out.action_id, wait_s=5).value == "anon"
    r = httpx.get(
        f"{svc.url}/v1/actions/{out.action_id}", headers={"Authorization": f"Bearer {ALICE}"}
    )
    assert r.status_code == 404


def test_the_operator_sees_every_tenants_action_and_alone_reads_the_trace(
    svc: ServiceThread,
) -> None:
    with Client(svc.url, token=ALICE) as alice:
        alice.run(endpoint="echo", payload="seen", id="for-the-operator")
    with Client(svc.url, token=OPERATOR) as op:
        assert op.result("alice:for-the-operator", wait_s=5).value == "seen"
    r = httpx.get(f"{svc.url}/v1/trace", headers={"Authorization": f"Bearer {OPERATOR}"})
    assert r.status_code == 200 and "alice:for-the-operator" in r.text
    for token in (ALICE, BOB):
        for method, path in (
            ("GET", "/v1/trace"),
            ("POST", "/v1/trace"),
            ("POST", "/v1/submissions"),
        ):
            r = httpx.request(
                method, f"{svc.url}{path}", headers={"Authorization": f"Bearer {token}"}
            )
            assert r.status_code == 403 and r.json()["error"]["code"] == "forbidden", r.text


def test_unknown_tokens_are_refused_and_status_is_open_to_every_client(
    svc: ServiceThread,
) -> None:
    r = httpx.get(f"{svc.url}/v1/status", headers={"Authorization": "Bearer carol-token"})
    assert r.status_code == 401
    for token in (OPERATOR, ALICE, BOB):
        with Client(svc.url, token=token) as c:
            assert "queued" in c.status()


def test_a_tenants_ids_leave_room_for_its_prefix(svc: ServiceThread) -> None:
    longest = MAX_ID_CHARS - len("alice:")
    with Client(svc.url, token=ALICE) as alice:
        assert alice.run(endpoint="echo", payload=0, id="x" * longest).ok
        with pytest.raises(ServiceError) as err:
            alice.submit(endpoint="echo", payload=0, id="x" * (longest + 1))
    assert err.value.status == 400 and f"at most {longest} characters" in err.value.message


def test_names_and_tokens_are_checked_before_the_service_starts() -> None:
    assert parse_client("alice=s3cret") == ("alice", "s3cret")
    assert parse_client("a.b-c_1=x=y") == ("a.b-c_1", "x=y")
    for bad in ("alice", "alice=", "al:ice=t", "=t", "x" * 33 + "=t"):
        with pytest.raises(ValueError):
            parse_client(bad)
    with pytest.raises(ValueError, match="same token"):
        Tokens("t", {"alice": "t"})
    with pytest.raises(ValueError, match="same token"):
        clients_of(["alice=t", "bob=t"], None)
    with pytest.raises(ValueError, match="twice"):
        clients_of(["alice=t", "alice=u"], None)
    assert clients_of(["alice=t", "bob=u"], "op") == {"alice": "t", "bob": "u"}
    assert Tokens("op", {"alice": "t"}).match("t") == (True, Tenant("alice"))
    assert Tokens("op", {"alice": "t"}).match("op") == (True, None)
    assert Tokens("op", {"alice": "t"}).match("nope")[0] is False


def test_a_tenant_reads_its_own_ids_back_in_error_messages() -> None:
    tenant = Tenant("alice")
    assert tenant.clean("trajectory 'alice:t1' is not open") == "trajectory 't1' is not open"
    assert tenant.outer("alice:t1") == "t1" and tenant.outer("bob:t1") == "bob:t1"
    assert tenant.owns("alice:t1") and not tenant.owns("alicex:t1")


def test_a_tenants_flood_is_bounded_and_leaves_the_others_their_places() -> None:
    """``tenant_max_pending`` 3: Alice's ten calls that wait on a gate get 3 places and 7 429s
    naming her bound; Bob's 3 are still accepted; once the gate opens, Alice has her places
    back. (The runtime's shared bound, 64, is never reached.)"""
    gate = threading.Event()

    def make() -> Runtime:
        return Runtime(
            CLUSTER,
            RuntimeConfig(max_pending=64),
            api=ApiExecutor({"echo": echo, "gate": _gated(gate)}),
        )

    opts = ServeOptions(
        port=0, token=OPERATOR, clients={"alice": ALICE, "bob": BOB}, tenant_max_pending=3
    )
    with ServiceThread(make, opts) as thread, Client(thread.url, token=ALICE, retries=0) as alice:
        accepted, refused = [], []
        for i in range(10):
            try:
                accepted.append(alice.submit(endpoint="gate", payload=i, id=f"f{i}"))
            except OverloadedError as exc:
                refused.append(exc)
        assert accepted == ["f0", "f1", "f2"] and len(refused) == 7
        assert refused[0].status == 429 and refused[0].retryable
        assert "tenant 'alice'" in refused[0].message and "3" in refused[0].message
        # A resubmission of an accepted id is no new place: still answered.
        assert alice.submit(endpoint="gate", payload=0, id="f0") == "f0"
        with Client(thread.url, token=BOB, retries=0) as bob:
            assert [bob.submit(endpoint="gate", payload=i, id=f"b{i}") for i in range(3)] == [
                "b0",
                "b1",
                "b2",
            ]
            gate.set()
            assert all(bob.result(f"b{i}", wait_s=30).ok for i in range(3))
        assert all(alice.result(f"f{i}", wait_s=30).ok for i in range(3))
        assert alice.run(endpoint="echo", payload="again", id="after").value == "again"
        assert thread.runtime is not None
        assert thread.runtime.counters["refused_tenant"] == 7


def test_a_tenant_bound_must_be_a_positive_integer() -> None:
    from tangram.exec.service.app import ServiceApp

    def make() -> Runtime:
        return Runtime(CLUSTER, RuntimeConfig(), api=ApiExecutor({"echo": echo}))

    for bad in (0, -1, 1.5, True):
        with pytest.raises(ValueError, match="tenant_max_pending"):
            ServiceApp(make(), clients={"alice": ALICE}, tenant_max_pending=bad)  # type: ignore[arg-type]


# --- the bound's count under races, journal resubmissions and work no id names (stop 29's
# review of the tenants, each of which failed before its mend) -------------------------------

NODE = CpuNodeSpec("local", cores=2, numa_domains=1, memory_gb=64.0)


def _gated(gate: threading.Event) -> Any:
    """A "gate" endpoint: each call ends once ``gate`` is set (at most 20 s)."""

    async def gated(payload: Any) -> Any:
        for _ in range(2000):  # (at most 20 s: a failed test still ends)
            if gate.is_set():
                break
            await asyncio.sleep(0.01)
        return payload

    return gated


def _with_containers(
    gate: threading.Event, *, aoe: Any = None, gate_slots: int = 16, max_pending: int = 64
) -> Any:
    """A runtime maker: a stand-in AOE on ``NODE`` (``aoe``, else a ``FakeAoe``) and a "gate"
    endpoint of ``gate_slots`` whose calls end once ``gate`` is set."""
    cluster = ClusterSpec(
        name="t", cpu_nodes=(NODE,), apis=(ApiEndpointSpec("gate", concurrency=gate_slots),)
    )

    def make() -> Runtime:
        return Runtime(
            cluster,
            RuntimeConfig(max_pending=max_pending),
            cpu=CpuExecutor(aoe or FakeAoe(), NODE),
            api=ApiExecutor({"gate": _gated(gate)}),
        )

    return make


class _SlowOpen(FakeAoe):
    """A stand-in AOE whose container creation waits until ``opening`` is set (at most 20 s)."""

    def __init__(self) -> None:
        super().__init__()
        self.opening = threading.Event()

    def open_trajectory(self, traj: str, memory_gb: float, *, image: str | None = None) -> Any:
        self.opening.wait(20)
        return super().open_trajectory(traj, memory_gb, image=image)


def test_a_conflicting_resend_racing_the_first_does_not_free_its_place() -> None:
    """Two sends of id "x" with different payloads wait on one opening trajectory: one is
    accepted, the other is a 409. The 409 gave back the place "x" holds, so with a bound of 2
    Alice then had "x", "y" and "z" pending; now "z" is refused."""
    gate = threading.Event()

    aoe = _SlowOpen()
    make = _with_containers(gate, aoe=aoe)
    opts = ServeOptions(port=0, token=OPERATOR, clients={"alice": ALICE}, tenant_max_pending=2)
    statuses: dict[str, int] = {}
    with ServiceThread(make, opts) as thread:
        try:

            def open_t0() -> None:
                with Client(thread.url, token=ALICE, retries=0) as c:
                    c.open_trajectory("t0", memory_gb=0.25)

            def send(tag: str, payload: int) -> None:
                r = httpx.post(
                    f"{thread.url}/v1/actions",
                    json={"endpoint": "gate", "payload": payload, "id": "x", "trajectory": "t0"},
                    headers={"Authorization": f"Bearer {ALICE}"},
                    timeout=30,
                )
                statuses[tag] = r.status_code

            opener = threading.Thread(target=open_t0)
            opener.start()
            for _ in range(500):
                if thread.runtime is not None and "alice:t0" in thread.runtime.trajs.by_id:
                    break
                time.sleep(0.02)
            senders = [threading.Thread(target=send, args=(t, p)) for t, p in (("a", 1), ("b", 2))]
            for t in senders:
                t.start()
            time.sleep(0.5)  # both wait for the trajectory to open
            aoe.opening.set()
            for t in (opener, *senders):
                t.join(30)
            assert sorted(statuses.values()) == [202, 409], statuses
            with Client(thread.url, token=ALICE, retries=0) as alice:
                assert alice.submit(endpoint="gate", payload=3, id="y") == "y"
                with pytest.raises(OverloadedError, match="tenant 'alice'"):
                    alice.submit(endpoint="gate", payload=4, id="z")
        finally:
            gate.set()


def test_a_resend_only_the_journal_remembers_takes_no_place(tmp_path: Any) -> None:
    """An id whose outcome left memory (``keep_outcomes`` 1) is answered from the journal:
    a resubmission, not a new action, so a tenant at its bound still gets its answer."""
    gate = threading.Event()

    def make() -> Runtime:
        return Runtime(
            CLUSTER,
            RuntimeConfig(max_pending=64, keep_outcomes=1, journal_path=tmp_path / "j.db"),
            api=ApiExecutor({"echo": echo, "gate": _gated(gate)}),
        )

    opts = ServeOptions(port=0, token=OPERATOR, clients={"alice": ALICE}, tenant_max_pending=1)
    with ServiceThread(make, opts) as thread, Client(thread.url, token=ALICE, retries=0) as alice:
        try:
            assert alice.run(endpoint="echo", payload="a", id="old").ok
            assert alice.run(endpoint="echo", payload="b", id="newer").ok  # pushes "old" out
            assert thread.runtime is not None and "alice:old" not in thread.runtime.host.table
            alice.submit(endpoint="gate", payload=0, id="busy")  # Alice's one place
            assert alice.submit(endpoint="echo", payload="a", id="old") == "old"
        finally:
            gate.set()


def test_an_action_ended_by_its_trajectorys_close_names_it_as_the_tenant_does() -> None:
    gate = threading.Event()
    make = _with_containers(gate, gate_slots=1)
    opts = ServeOptions(port=0, token=OPERATOR, clients={"alice": ALICE})
    with ServiceThread(make, opts) as thread, Client(thread.url, token=ALICE, retries=0) as alice:
        try:
            alice.open_trajectory("t0", memory_gb=0.25)
            alice.submit(endpoint="gate", payload=0, id="holder")  # the endpoint's one slot
            alice.submit(endpoint="gate", payload=1, id="queued", trajectory="t0")
            alice.close_trajectory("t0")
            r = httpx.get(
                f"{thread.url}/v1/actions/queued", headers={"Authorization": f"Bearer {ALICE}"}
            )
            error = r.json()["outcome"]["error"]
            assert error["message"] == "trajectory 't0' was closed while the action was queued"
            assert "alice:" not in r.text
        finally:
            gate.set()


def test_run_code_takes_one_of_its_tenants_places_while_it_runs() -> None:
    """Alice at her bound (1) is refused a /run_code (429, in both shapes) instead of filling
    the shared bound with it; Bob still gets his place."""
    gate = threading.Event()
    make = _with_containers(gate, gate_slots=8, max_pending=3)
    opts = ServeOptions(
        port=0, token=OPERATOR, clients={"alice": ALICE, "bob": BOB}, tenant_max_pending=1
    )
    with ServiceThread(make, opts) as thread:
        try:
            with Client(thread.url, token=ALICE, retries=0) as alice:
                alice.submit(endpoint="gate", payload=0, id="mine")  # at her bound now
            r = httpx.post(
                f"{thread.url}/run_code",
                json={"code": "print(1)", "language": "python"},
                headers={"Authorization": f"Bearer {ALICE}"},
                timeout=30,
            )
            assert r.status_code == 429 and "tenant 'alice'" in r.text, r.text
            assert r.json()["status"] == "SandboxError"  # SandboxFusion's shape too
            with Client(thread.url, token=BOB, retries=0) as bob:
                assert bob.submit(endpoint="gate", payload=0, id="b0") == "b0"
        finally:
            gate.set()


# --- a tenant's open trajectories are bounded (stop 30: one tenant could open containers
# until the node's memory was taken) ----------------------------------------------------------


def test_a_tenants_open_trajectories_are_bounded_and_the_others_keep_theirs() -> None:
    gate = threading.Event()
    opts = ServeOptions(
        port=0, token=OPERATOR, clients={"alice": ALICE, "bob": BOB}, tenant_max_trajectories=2
    )
    with ServiceThread(_with_containers(gate), opts) as thread:
        with (
            Client(thread.url, token=ALICE, retries=0) as alice,
            Client(thread.url, token=BOB, retries=0) as bob,
        ):
            alice.open_trajectory("t0", memory_gb=0.25)
            alice.open_trajectory("t1", memory_gb=0.25)
            with pytest.raises(OverloadedError, match="--tenant-max-trajectories") as refused:
                alice.open_trajectory("t2", memory_gb=0.25)
            assert (
                "tenant 'alice'" in refused.value.message and "alice:" not in refused.value.message
            )
            # An id already open is a conflict, as without the bound, not a refusal.
            with pytest.raises(ServiceError) as again:
                alice.open_trajectory("t1", memory_gb=0.25)
            assert again.value.status == 409
            # Bob's place is his own, and the same ids are his too.
            bob.open_trajectory("t0", memory_gb=0.25)
            bob.open_trajectory("t1", memory_gb=0.25)
            # A closed trajectory gives its place back.
            alice.close_trajectory("t0")
            alice.open_trajectory("t2", memory_gb=0.25)
            assert {t["id"] for t in alice.trajectories()} == {"t1", "t2"}
        assert thread.runtime is not None
        assert thread.runtime.counters["refused_tenant_trajectories"] == 1
    gate.set()


def test_two_opens_racing_for_a_tenants_last_place_get_one_trajectory() -> None:
    """Both wait in the container's creation; the bound counts the one under way, so the
    second is refused instead of both passing at one place left."""
    gate = threading.Event()

    aoe = _SlowOpen()
    opts = ServeOptions(port=0, token=OPERATOR, clients={"alice": ALICE}, tenant_max_trajectories=1)
    statuses: dict[str, int] = {}
    with ServiceThread(_with_containers(gate, aoe=aoe), opts) as thread:

        def open_one(traj: str) -> None:
            r = httpx.post(
                f"{thread.url}/v1/trajectories",
                json={"id": traj, "memory_gb": 0.25},
                headers={"Authorization": f"Bearer {ALICE}"},
                timeout=30,
            )
            statuses[traj] = r.status_code

        first = threading.Thread(target=open_one, args=("t0",))
        first.start()
        for _ in range(500):  # t0 is in the container's creation
            if thread.runtime is not None and "alice:t0" in thread.runtime.trajs.by_id:
                break
            time.sleep(0.02)
        open_one("t1")  # refused at once: t0 holds the one place
        aoe.opening.set()
        first.join(30)
    gate.set()
    assert statuses == {"t0": 201, "t1": 429}, statuses


def test_a_trajectory_bound_must_be_a_positive_integer() -> None:
    from tangram.exec.service.app import ServiceApp

    def make() -> Runtime:
        return Runtime(CLUSTER, RuntimeConfig(), api=ApiExecutor({"echo": echo}))

    for bad in (0, -1, 1.5, True):
        with pytest.raises(ValueError, match="tenant_max_trajectories"):
            ServiceApp(make(), clients={"alice": ALICE}, tenant_max_trajectories=bad)  # type: ignore[arg-type]


def test_an_open_waiting_for_memory_holds_its_tenants_place() -> None:
    """Alice's t0 waits for the node's memory (the operator's trajectory takes it), not yet
    a trajectory of the runtime; her t1 is still refused at a bound of 1, and t0 opens once
    the memory is back. Counted from the runtime's trajectories alone, t1 waited too, and
    both opened: two for a bound of one."""
    gate = threading.Event()
    opts = ServeOptions(port=0, token=OPERATOR, clients={"alice": ALICE}, tenant_max_trajectories=1)
    statuses: dict[str, int] = {}
    with (
        ServiceThread(_with_containers(gate), opts) as thread,
        Client(thread.url, token=OPERATOR, retries=0) as op,
    ):
        op.open_trajectory("filler", memory_gb=NODE.memory_gb - 0.5)

        def open_one(traj: str) -> None:
            r = httpx.post(
                f"{thread.url}/v1/trajectories",
                json={"id": traj, "memory_gb": 1.0, "wait_s": 20},
                headers={"Authorization": f"Bearer {ALICE}"},
                timeout=30,
            )
            statuses[traj] = r.status_code

        first = threading.Thread(target=open_one, args=("t0",))
        first.start()
        time.sleep(0.5)  # t0 waits for memory
        assert thread.runtime is not None and "alice:t0" not in thread.runtime.trajs.by_id
        second = threading.Thread(target=open_one, args=("t1",))
        second.start()
        second.join(2)  # refused at once (else it waits for memory too)
        op.close_trajectory("filler")
        first.join(30)
        second.join(30)
        names = {t["id"] for t in op.trajectories()}
    gate.set()
    assert statuses == {"t0": 201, "t1": 429}, statuses
    assert names == {"alice:t0"}


def test_a_second_open_of_an_opening_id_keeps_the_place_after_the_first_gives_up() -> None:
    """Alice's t0 waits for memory (wait_s 1); a second open of t0 (wait_s 20) passes the
    bound as 'the runtime's to answer' and waits too. When the first gives up, the id left
    the opens under way while the second still waits: t1 then passed the bound of 1, and
    both t0 and t1 opened."""
    gate = threading.Event()
    opts = ServeOptions(port=0, token=OPERATOR, clients={"alice": ALICE}, tenant_max_trajectories=1)
    statuses: dict[str, list[int]] = {}
    with (
        ServiceThread(_with_containers(gate), opts) as thread,
        Client(thread.url, token=OPERATOR, retries=0) as op,
    ):
        op.open_trajectory("filler", memory_gb=NODE.memory_gb - 0.5)

        def open_one(traj: str, wait_s: float) -> None:
            r = httpx.post(
                f"{thread.url}/v1/trajectories",
                json={"id": traj, "memory_gb": 1.0, "wait_s": wait_s},
                headers={"Authorization": f"Bearer {ALICE}"},
                timeout=30,
            )
            statuses.setdefault(traj, []).append(r.status_code)

        first = threading.Thread(target=open_one, args=("t0", 1.0))
        first.start()
        time.sleep(0.3)
        second = threading.Thread(target=open_one, args=("t0", 20.0))
        second.start()
        first.join(10)  # gave up: no memory within 1 s
        third = threading.Thread(target=open_one, args=("t1", 20.0))
        third.start()
        third.join(1)
        op.close_trajectory("filler")
        second.join(30)
        third.join(30)
        names = {t["id"] for t in op.trajectories()}
    gate.set()
    assert len(names) <= 1, (names, statuses)


def test_a_tenants_refusals_are_counted_in_the_metrics() -> None:
    """The refusals of a tenant's bounds (429 ``overloaded``, as the runtime's own bound's)
    were missing from ``tangram_actions_refused_total``, which counted only the runtime's
    bound: a tenant refused all day showed none. Each bound is a reason of its own."""
    gate = threading.Event()
    opts = ServeOptions(
        port=0,
        token=OPERATOR,
        clients={"alice": ALICE},
        tenant_max_pending=1,
        tenant_max_trajectories=1,
    )
    try:
        with (
            ServiceThread(_with_containers(gate), opts) as thread,
            Client(thread.url, token=ALICE, retries=0) as alice,
        ):
            alice.open_trajectory("t0", memory_gb=0.25)
            with pytest.raises(OverloadedError):
                alice.open_trajectory("t1", memory_gb=0.25)
            alice.submit(endpoint="gate", payload=0, id="g0")
            with pytest.raises(OverloadedError):
                alice.submit(endpoint="gate", payload=1, id="g1")
            with Client(thread.url, token=OPERATOR) as op:
                text = op.metrics()
    finally:
        gate.set()
    assert 'tangram_actions_refused_total{reason="tenant"} 1.0' in text, text
    assert 'tangram_actions_refused_total{reason="tenant_trajectories"} 1.0' in text, text


@pytest.mark.parametrize(
    ("path", "answer"),
    [
        ("/run_code", b"429"),
        ("/v1/completions", b"429"),
        # A submission names its id in its body (a resend of an accepted one takes no new
        # place and is answered): it is told to continue, its body decides.
        ("/v1/actions", b"100 Continue"),
    ],
)
def test_a_tenant_at_its_pending_bound_asking_100_continue_is_refused_before_its_body(
    path: str, answer: bytes
) -> None:
    """A client sending ``Expect: 100-continue`` waits before its body so that a refusal
    comes first: a tenant at ``--tenant-max-pending`` was told to continue, uploaded its
    body (up to 64 MiB), and only then read its 429, on the routes where every request
    takes a place (``/run_code``, the OpenAI-style calls)."""
    import json
    import socket

    gate = threading.Event()

    def make() -> Runtime:
        return Runtime(
            CLUSTER, RuntimeConfig(max_pending=64), api=ApiExecutor({"gate": _gated(gate)})
        )

    opts = ServeOptions(port=0, token=OPERATOR, clients={"alice": ALICE}, tenant_max_pending=1)
    request = (
        f"POST {path} HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
        f"Authorization: Bearer {ALICE}\r\nExpect: 100-continue\r\n"
        "Content-Length: 1000000\r\n\r\n"
    ).encode()
    with ServiceThread(make, opts) as thread, Client(thread.url, token=ALICE, retries=0) as alice:
        try:
            assert alice.submit(endpoint="gate", payload=0, id="held") == "held"
            host, port = thread.url.removeprefix("http://").rsplit(":", 1)
            with socket.create_connection((host, int(port)), timeout=10.0) as s:
                s.sendall(request)  # (the body is never sent: the client waits for the 100)
                got = s.recv(65536)
        finally:
            gate.set()
        assert got.startswith(b"HTTP/1.1 " + answer), got[:300]
        if answer == b"429":
            doc = json.loads(got.split(b"\r\n\r\n", 1)[1])
            assert "--tenant-max-pending" in doc["error"]["message"], doc
            if path == "/run_code":  # (SandboxFusion's shape)
                assert doc["status"] == "SandboxError" and doc["run_result"] is None, doc
            else:  # (OpenAI's)
                assert doc["error"]["type"] == "rate_limit_error", doc
        assert alice.result("held", wait_s=30).ok
