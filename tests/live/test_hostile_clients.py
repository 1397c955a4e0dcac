"""Hostile and careless clients against a live service on loopback.

Every input of issue 16 and random ones from hypothesis, sent raw (not through the
well-behaved clients). After each, the ``Guard`` checks what no client may break:

- the service still answers (``/healthz``), and never answered a 5xx;
- the sentinel trajectory's container is the one it had, and the file it wrote is still there;
- no container leaks: the session's containers are exactly the open trajectories';
- each accepted action has exactly one outcome, the same every time it is read.

Bounded in count (hypothesis examples) and time (every request has a time-out).
"""

from __future__ import annotations

import json
import socket
import time
from collections.abc import Iterator
from typing import Any
from urllib.parse import urlsplit

import httpx
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from tests.live.conftest import CallLog, faulty_endpoints, live_cluster

pytestmark = pytest.mark.docker

TOKEN = "hostile-suite-token"
AUTH = {"Authorization": f"Bearer {TOKEN}"}
#: Two tenants (``--client``): ids of their own, neither may touch the other's work.
ALICE, BOB = "alice-hostile-token", "bob-hostile-token"
#: Statuses an accepted submission answers with (done, or accepted and not done yet).
ACCEPTED = (200, 201, 202)
STATUSES = {"result", "error", "timeout", "unknown"}


def _seg(value: str) -> str:
    """A path segment, encoded as the clients encode it (``.`` and ``..`` included); an
    empty id as the empty segment a raw client sends (the clients refuse it before sending)."""
    from tangram.exec.service.calls import segment

    return segment(value) if value else ""


class Guard:
    """The sentinel, the invariants, and a raw HTTP client that refuses to see a 5xx."""

    def __init__(self, thread: Any) -> None:
        self.thread = thread
        self.url = thread.url
        self.http = httpx.Client(base_url=self.url, headers=AUTH, timeout=60.0)
        self.accepted: dict[str, dict[str, Any] | None] = {}
        self.checks = 0
        r = self.http.post("/v1/trajectories", json={"id": "sentinel", "memory_gb": 0.25})
        assert r.status_code == 201, r.text
        self.container = r.json()["container"]
        r = self.http.post(
            "/v1/actions",
            json={"trajectory": "sentinel", "command": "echo keep > keep.txt", "wait": True},
        )
        assert r.status_code == 200 and r.json()["outcome"]["status"] == "result", r.text

    def playground(self) -> None:
        """A trajectory for random commands (opened again if a random input closed it)."""
        r = self.http.get("/v1/trajectories/playground")
        if r.status_code != 200:
            r = self.http.post("/v1/trajectories", json={"id": "playground", "memory_gb": 0.25})
            assert r.status_code == 201, r.text

    def session(self) -> str:
        return self.thread.call(lambda: self.thread.runtime.cpu.aoe.session)

    def send(self, method: str, path: str, what: str, **kw: Any) -> httpx.Response:
        """One raw request; a 5xx fails the test naming the input."""
        r = self.http.request(method, path, **kw)
        assert r.status_code < 500, f"{what}: HTTP {r.status_code} {r.text[:300]}"
        if method == "POST" and path == "/v1/actions" and r.status_code in ACCEPTED:
            doc = r.json()
            self.accepted.setdefault(doc["id"], None)
        return r

    def check(self, what: str) -> None:
        """The invariants, after one hostile input."""
        self.checks += 1
        alive = httpx.get(self.url + "/healthz", timeout=10.0)
        assert alive.status_code == 200, f"after {what}: /healthz {alive.status_code}"
        info = self.http.get("/v1/trajectories/sentinel")
        assert info.status_code == 200, f"after {what}: the sentinel is gone: {info.text}"
        assert info.json()["container"] == self.container, f"after {what}: sentinel replaced"
        if self.checks % 10 == 1:
            self._sentinel_file_is_there(what)
        self._no_container_leaks(what)
        self._one_outcome_each(what)

    def _sentinel_file_is_there(self, what: str) -> None:
        r = self.http.post(
            "/v1/actions", json={"trajectory": "sentinel", "command": "cat keep.txt", "wait": True}
        )
        assert r.status_code == 200, f"after {what}: {r.text}"
        assert r.json()["outcome"]["result"]["stdout"] == "keep\n", f"after {what}: {r.text}"

    def _no_container_leaks(self, what: str) -> None:
        from tangram.exec.aoe.containers import LABEL_SESSION

        client = self.thread.call(lambda: self.thread.runtime.cpu.aoe.client)
        session = self.session()
        deadline = time.monotonic() + 20.0
        while True:  # a close removes its container just after it answers: allow it a moment
            found = client.containers.list(
                all=True, filters={"label": f"{LABEL_SESSION}={session}"}
            )
            ids = {c.id for c in found}
            trajs = self.http.get("/v1/trajectories").json()
            items = trajs["trajectories"] if isinstance(trajs, dict) else trajs
            open_ids = {t["container"] for t in items if t.get("container")}
            if ids == open_ids or time.monotonic() > deadline:
                break
            time.sleep(0.2)
        assert ids == open_ids, (
            f"after {what}: containers {ids - open_ids} belong to no open trajectory"
        )

    def _one_outcome_each(self, what: str) -> None:
        for action_id, seen in list(self.accepted.items()):
            r = self.http.get(f"/v1/actions/{_seg(action_id)}", params={"wait": "30"})
            assert r.status_code == 200, f"after {what}: {action_id!r} has no outcome: {r.text}"
            outcome = r.json()["outcome"]
            assert outcome["status"] in STATUSES, outcome
            if seen is None:
                self.accepted[action_id] = outcome
            else:
                assert outcome == seen, f"after {what}: {action_id!r}'s outcome changed"

    def close(self) -> None:
        self.http.close()


@pytest.fixture(scope="module")
def guard(docker_client: Any) -> Iterator[Guard]:
    from tangram.exec.aoe import AoeConfig
    from tangram.exec.runtime import RuntimeConfig, build_runtime, default_services
    from tangram.exec.service import ServeOptions, ServiceThread
    from tangram.exec.service.limits import ConnectionLimits

    def make() -> Any:
        return build_runtime(
            live_cluster(),
            RuntimeConfig(max_pending=512, default_timeout_s=30.0),
            gpu_backend="cpu",
            services=default_services(),
            endpoints=faulty_endpoints(CallLog()),
            aoe_config=AoeConfig(kill_grace_s=2.0),
            docker_client=docker_client,
        )

    # (A 10-s body time-out, not the default 60: the slow-clients test waits for it to cut
    # them off; bodies here are small and local, so no honest client is near it.)
    opts = ServeOptions(
        port=0,
        token=TOKEN,
        clients={"alice": ALICE, "bob": BOB},
        limits=ConnectionLimits(body_timeout_s=10.0),
    )
    thread = ServiceThread(make, opts).start()
    g = Guard(thread)
    try:
        yield g
    finally:
        g.close()
        thread.stop()


def test_tenants_open_the_same_trajectory_id_and_cannot_touch_each_others(guard: Guard) -> None:
    """Alice and Bob each open "work" and write a file there; each reads its own back, Bob's
    close of "work" closes his, and Alice's container and file outlive it."""
    tenants = {
        name: httpx.Client(
            base_url=guard.url, headers={"Authorization": f"Bearer {token}"}, timeout=60.0
        )
        for name, token in (("alice", ALICE), ("bob", BOB))
    }
    try:
        containers = {}
        for name, http in tenants.items():
            r = http.post("/v1/trajectories", json={"id": "work", "memory_gb": 0.25})
            assert r.status_code == 201 and r.json()["id"] == "work", r.text
            containers[name] = r.json()["container"]
            r = http.post(
                "/v1/actions",
                json={"trajectory": "work", "command": f"echo {name} > who.txt", "wait": True},
            )
            assert r.status_code == 200 and r.json()["outcome"]["trajectory"] == "work", r.text
        assert containers["alice"] != containers["bob"]
        listed = tenants["alice"].get("/v1/trajectories").json()["trajectories"]
        assert [t["id"] for t in listed] == ["work"] and listed[0]["container"] == containers[
            "alice"
        ]
        # Bob names the sentinel (the operator's) and finds nothing to close.
        assert tenants["bob"].delete("/v1/trajectories/sentinel").status_code == 404
        r = tenants["bob"].delete("/v1/trajectories/work")
        assert r.status_code == 200 and r.json()["container"] == containers["bob"], r.text
        r = tenants["alice"].post(
            "/v1/actions", json={"trajectory": "work", "command": "cat who.txt", "wait": True}
        )
        assert r.status_code == 200 and r.json()["outcome"]["result"]["stdout"] == "alice\n"
        # The operator sees Alice's under its namespaced id, and closes it.
        assert guard.http.get("/v1/trajectories/alice:work").status_code == 200
        assert tenants["alice"].delete("/v1/trajectories/work").status_code == 200
    finally:
        for http in tenants.values():
            http.close()
    guard.check("two tenants' trajectories of one id")


# --- the inputs of issue 16, one by one ----------------------------------------------------------

#: Trajectory ids whose container names collided (defect 1), opened in pairs side by side.
COLLIDING = [
    ("a!", "a?"),
    (".", ".."),
    ("тест-1", "тест-2"),
    ("軌跡一", "軌跡二"),
    ("x" * 49 + "1", "x" * 49 + "2"),
]


@pytest.mark.parametrize(("first", "second"), COLLIDING)
def test_colliding_ids_keep_their_own_containers(guard: Guard, first: str, second: str) -> None:
    what = f"opening {first!r} and {second!r}"
    opened = []
    for traj in (first, second):
        r = guard.send("POST", "/v1/trajectories", what, json={"id": traj, "memory_gb": 0.25})
        if r.status_code == 201:
            opened.append((traj, r.json()["container"]))
    if len(opened) == 2:
        assert opened[0][1] != opened[1][1], what
        for traj, container in opened:  # each still has its own, after both opened
            info = guard.send("GET", f"/v1/trajectories/{_seg(traj)}", what)
            assert info.status_code == 200 and info.json()["container"] == container, what
    guard.check(what)
    for traj, _ in opened:
        guard.send("DELETE", f"/v1/trajectories/{_seg(traj)}", what)
    guard.check(what + ", then closing them")


MALFORMED_BODIES = {
    "invalid UTF-8": b'{"endpoint": "echo", "payload": "\xff\xfe"}',
    "deeply nested JSON": b"[" * 100_000 + b"]" * 100_000,
    "not JSON": b"{endpoint: echo",
    "a JSON string": b'"hello"',
    "empty": b"",
    "huge number": b'{"endpoint": "echo", "timeout_s": 1e999}',
    "NaN": b'{"endpoint": "echo", "timeout_s": NaN}',
}


@pytest.mark.parametrize("name", list(MALFORMED_BODIES))
def test_malformed_bodies_get_a_4xx(guard: Guard, name: str) -> None:
    for path in ("/v1/actions", "/v1/trajectories", "/run_code"):
        r = guard.send(
            "POST",
            path,
            f"{name} to {path}",
            content=MALFORMED_BODIES[name],
            headers={"Content-Type": "application/json"},
        )
        if name == "empty" and path == "/v1/trajectories" and r.status_code == 201:
            # An empty open is documented: a trajectory with a fresh id and the defaults.
            guard.send("DELETE", f"/v1/trajectories/{_seg(r.json()['id'])}", "closing it")
            continue
        assert 400 <= r.status_code < 500, (name, path, r.status_code, r.text[:200])
    guard.check(name)


#: Field values that were silently rewritten (defect 9) or are otherwise invalid.
BAD_ACTIONS = [
    {"endpoint": "echo", "max_units": 0},
    {"endpoint": "echo", "t1_s": 0},
    {"endpoint": "echo", "task": ""},
    {"endpoint": "echo", "timeout_s": -1},
    {"endpoint": "echo", "max_output_bytes": 1 << 40},
    {"trajectory": "sentinel", "command": "true", "env": {"TANGRAM_ACTION_ID": "x"}},
    {"trajectory": "sentinel", "command": "true", "env": {"TANGRAM_CORES": "64"}},
    {"trajectory": "sentinel", "command": "true", "env": {"A;touch pwned;B": "1"}},
    {"trajectory": "sentinel", "command": "true", "env": {"OK": 5}},
    {"trajectory": "sentinel", "command": "x" * ((1 << 20) + 10)},
    {"trajectory": "sentinel", "command": ""},
    {"trajectory": "sentinel", "command": [], "id": "empty-argv"},
    {"service": "no-such-service", "inputs": [1]},
    {"endpoint": "no-such-endpoint"},
    {"id": "a/b", "endpoint": "echo"},
    {"id": "", "endpoint": "echo"},
    {"trajectory": "never-opened", "command": "true"},
]


@pytest.mark.parametrize("body", BAD_ACTIONS, ids=lambda b: json.dumps(b)[:60])
def test_invalid_actions_are_refused_naming_what_is_wrong(guard: Guard, body: dict) -> None:
    r = guard.send("POST", "/v1/actions", "invalid action", json=body)
    assert 400 <= r.status_code < 500, (body, r.status_code, r.text[:200])
    doc = r.json()
    assert doc.get("error", {}).get("message"), doc
    guard.check(f"invalid action {json.dumps(body)[:80]}")
    # A shell-metacharacter key must not have run anything in the sentinel's container.
    r = guard.send(
        "POST",
        "/v1/actions",
        "probe",
        json={"trajectory": "sentinel", "command": "test ! -e pwned", "wait": True},
    )
    assert r.json()["outcome"]["result"]["exit_code"] == 0, "an env key ran a command"


BAD_OPENS = [
    {"id": "bad-image", "image": "no-such-image:never"},
    {"id": "bad-image-2", "image": ""},
    {"id": "tiny", "memory_gb": 1e-9},
    {"id": "huge", "memory_gb": 1e9},
    {"id": "neg-wait", "wait_s": -5},
    {"id": "sentinel"},  # already open: a conflict, never a second container
    {"id": "x" * 10_000},
]


@pytest.mark.parametrize("body", BAD_OPENS, ids=lambda b: json.dumps(b)[:40])
def test_invalid_opens_are_refused(guard: Guard, body: dict) -> None:
    r = guard.send("POST", "/v1/trajectories", "invalid open", json=body)
    assert 400 <= r.status_code < 500, (body, r.status_code, r.text[:200])
    guard.check(f"invalid open {json.dumps(body)[:60]}")


@pytest.mark.parametrize("authorization", ["Bearer tökén", "Bearer \x01", "Basic x", ""])
def test_bad_authorization_is_a_401(guard: Guard, authorization: str) -> None:
    raw = authorization.encode("utf-8")
    r = httpx.post(
        guard.url + "/v1/actions",
        json={"endpoint": "echo"},
        headers=[(b"Authorization", raw)] if raw else [],
        timeout=10.0,
    )
    assert r.status_code in (400, 401), (authorization, r.status_code, r.text[:200])
    guard.check(f"Authorization {authorization!r}")


@pytest.mark.parametrize("action_id", ["q?x=1", "h#frag", "p%2Fq", "..", "sp ace", "ü"])
def test_ids_with_url_characters_round_trip(guard: Guard, action_id: str) -> None:
    r = guard.send("POST", "/v1/actions", "odd id", json={"id": action_id, "endpoint": "echo"})
    if r.status_code in ACCEPTED:  # inside the id alphabet: it answers under its own id
        assert r.json()["id"] == action_id
        got = guard.send("GET", f"/v1/actions/{_seg(action_id)}", "poll", params={"wait": "10"})
        assert got.status_code == 200 and got.json()["id"] == action_id, got.text
    else:
        assert r.status_code == 400, r.text
    guard.check(f"action id {action_id!r}")


def test_run_code_never_blames_the_sandbox_for_the_program(guard: Guard) -> None:
    programs = {  # the program's own doing: Failed, never SandboxError (its client would retry)
        "output over the limit": {"code": "print('x' * 5_000_000)", "language": "python"},
        "the program kills its container": {"code": "kill -9 -1; sleep 5", "language": "bash"},
        "a syntax error": {"code": "def (:", "language": "python"},
    }
    for what, body in programs.items():
        r = guard.send("POST", "/run_code", what, json=body)
        doc = r.json()
        assert r.status_code == 200 and doc["status"] == "Failed", (what, doc)
        guard.check(f"/run_code: {what}")
    # A request that can never run answers a 4xx in SandboxFusion's shape.
    body = {"code": "print(1)", "language": "python", "memory_limit_MB": 10**7}
    r = guard.send("POST", "/run_code", "memory above the node", json=body)
    assert 400 <= r.status_code < 500 and "status" in r.json(), r.text[:200]
    guard.check("/run_code: memory above the node")


def test_slow_clients_are_cut_off_and_do_not_starve_others(guard: Guard) -> None:
    host, port = urlsplit(guard.url).hostname, urlsplit(guard.url).port
    socks = []
    try:
        for _ in range(50):  # bounded: headers and one body byte, then nothing
            s = socket.create_connection((host, port), timeout=5.0)
            s.sendall(
                b"POST /v1/actions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
                b"Authorization: Bearer " + TOKEN.encode() + b"\r\nContent-Length: 100\r\n\r\n{"
            )
            socks.append(s)
        guard.check("50 slow clients")  # others are served meanwhile
        deadline = time.monotonic() + 60.0
        open_left = socks[:]
        while open_left and time.monotonic() < deadline:
            for s in open_left[:]:
                s.settimeout(0.05)
                try:
                    if s.recv(1024) == b"":
                        open_left.remove(s)
                except TimeoutError:
                    pass
                except OSError:
                    open_left.remove(s)
            time.sleep(0.5)
        assert not open_left, f"{len(open_left)} slow connections still open after 60 s"
    finally:
        for s in socks:
            s.close()


# --- random inputs ------------------------------------------------------------------------------

JSON = st.recursive(
    st.none()
    | st.booleans()
    | st.integers()
    | st.floats(allow_nan=False, allow_infinity=False)
    | st.text(max_size=20),
    lambda inner: (
        st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=8), inner, max_size=4)
    ),
    max_leaves=12,
)
FIELDS = st.sampled_from(
    ["id", "trajectory", "command", "endpoint", "payload", "service", "inputs", "max_units",
     "t1_s", "serial_fraction", "curve", "timeout_s", "task", "kind", "env", "wait",
     "max_output_bytes", "memory_gb", "image", "wait_s", "code", "language", "stdin"]
)  # fmt: skip
BODIES = st.dictionaries(FIELDS, JSON, max_size=6) | JSON
IDS = st.text(min_size=0, max_size=40)


@settings(
    max_examples=40,
    deadline=None,
    suppress_health_check=list(HealthCheck),
    derandomize=True,
)
@given(body=BODIES, path=st.sampled_from(["/v1/actions", "/v1/trajectories", "/run_code"]))
def test_random_bodies_never_break_the_service(guard: Guard, body: Any, path: str) -> None:
    if path == "/v1/actions" and isinstance(body, dict) and body.get("trajectory"):
        # Random commands run in a trajectory of their own: a careless client may break its
        # own container, never the sentinel's.
        guard.playground()
        body["trajectory"] = "playground"
    if isinstance(body, dict) and body.get("wait") not in (None, False):
        body["wait"] = False  # never block the suite on a random action
    r = guard.send("POST", path, f"random body to {path}", json=body)
    if path == "/v1/trajectories" and r.status_code == 201:
        guard.send("DELETE", f"/v1/trajectories/{_seg(r.json()['id'])}", "closing it")
    guard.check(f"random body {json.dumps(body)[:100]} to {path}")


@settings(max_examples=30, deadline=None, suppress_health_check=list(HealthCheck), derandomize=True)
@given(
    raw_id=IDS,
    method=st.sampled_from(["GET", "DELETE"]),
    kind=st.sampled_from(["actions", "trajectories"]),
)
def test_random_ids_in_paths_never_break_the_service(
    guard: Guard, raw_id: str, method: str, kind: str
) -> None:
    if raw_id in ("sentinel", "playground"):
        return  # closing them is allowed, but not what this test is about
    r = guard.send(method, f"/v1/{kind}/{_seg(raw_id)}", f"{method} {kind} {raw_id!r}")
    assert r.status_code < 500
    guard.check(f"{method} /v1/{kind}/{raw_id!r}")
