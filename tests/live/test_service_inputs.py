"""Careless and hostile inputs to the HTTP API (issue 16): each is refused with a 4xx and the
service's error document naming what is wrong, and nothing runs.

- defect 5 (HTTP side): reserved or malformed ``env`` keys (``aoe.environment`` owns the rule);
- defect 7 (HTTP side): commands over ``MAX_COMMAND_BYTES``;
- defect 6: bodies and headers that used to be answered with a 500;
- defect 9: values that were silently rewritten (``max_units: 0`` became 1 ...);
- defect 4 (outputs): ``max_output_bytes`` above the server's cap;

and, with Docker, an image that does not exist (a 400, not a 500; no container left).
"""

from __future__ import annotations

import contextlib
import json
from collections.abc import Iterator
from typing import Any

import httpx
import pytest
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st

from tangram.exec.aoe.environment import MAX_COMMAND_BYTES
from tangram.exec.runtime.errors import BadRequest
from tangram.exec.runtime.records import MAX_TIMEOUT_S, MIN_MEMORY_GB
from tangram.exec.service import Client, ServeOptions, ServiceThread
from tangram.exec.service.calls import segment
from tangram.exec.service.sandbox_fusion import RunCodeSettings, parse_run_code
from tangram.exec.service.schema import parse_action, parse_trajectory
from tests.live.test_service_ids import FakeAoe, fake_cpu_runtime

CAP = 4096
TOKEN = "s3cret"


@pytest.fixture(scope="module")
def aoe() -> FakeAoe:
    return FakeAoe()


@pytest.fixture(scope="module")
def svc(aoe: FakeAoe) -> Iterator[ServiceThread]:
    opts = ServeOptions(port=0, max_output_bytes=CAP)
    with ServiceThread(lambda: fake_cpu_runtime(aoe), opts) as service:
        with Client(service.url) as c:
            c.open_trajectory("t", memory_gb=0.25)
        yield service


def refused(r: httpx.Response, *needles: str) -> dict[str, Any]:
    """The error of a 400 whose message holds every needle."""
    assert r.status_code == 400, (r.status_code, r.text[:300])
    error = r.json()["error"]
    assert error["code"] == "bad_request", error
    for needle in needles:
        assert needle in error["message"], (needle, error["message"])
    return error


# -- defects 5 and 7: the action's environment and command -----------------------------------

BAD_ENV = [
    ({"TANGRAM_ACTION_ID": "x"}, "'TANGRAM_ACTION_ID'", "reserved"),
    ({"TANGRAM_CORES": "64"}, "'TANGRAM_CORES'", "reserved"),
    ({"TANGRAM_CPUSET": "0-63"}, "'TANGRAM_CPUSET'", "reserved"),
    ({"OMP_NUM_THREADS": "64"}, "'OMP_NUM_THREADS'", "reserved"),
    ({"A;touch pwned;B": "1"}, "'A;touch pwned;B'", "shell variable name"),
    ({"1A": "1"}, "'1A'", "shell variable name"),
    ({"": "1"}, "''", "shell variable name"),
    ({"OK": 5}, "'OK'", "string"),
    ({"OK": "a\x00b"}, "'OK'", "NUL"),
]


@pytest.mark.parametrize(("env", "key", "why"), BAD_ENV, ids=lambda v: repr(v)[:30])
def test_reserved_or_malformed_env_keys_are_refused_naming_the_key(
    svc: ServiceThread, aoe: FakeAoe, env: dict[str, Any], key: str, why: str
) -> None:
    before = len(aoe.runs)
    body = {"trajectory": "t", "command": "true", "env": env, "wait": True}
    refused(httpx.post(f"{svc.url}/v1/actions", json=body), key, why)
    assert len(aoe.runs) == before, "a refused action ran"
    ok = httpx.post(f"{svc.url}/v1/actions", json={**body, "env": {"A_1": "x; y"}})
    assert ok.status_code == 200 and ok.json()["outcome"]["status"] == "result", ok.text
    assert aoe.runs[-1][2]["env"] == {"A_1": "x; y"}


@pytest.mark.parametrize("argv", [False, True])
def test_commands_over_the_limit_are_refused_naming_it(
    svc: ServiceThread, aoe: FakeAoe, argv: bool
) -> None:
    before = len(aoe.runs)
    long = "x" * MAX_COMMAND_BYTES
    command: Any = ["echo", long] if argv else f"echo {long}"
    body = {"trajectory": "t", "command": command}
    refused(httpx.post(f"{svc.url}/v1/actions", json=body, timeout=60), str(MAX_COMMAND_BYTES))
    assert len(aoe.runs) == before


# -- defect 6: what used to be a 500 ----------------------------------------------------------

BODIES = {
    "invalid UTF-8": (b'{"endpoint": "echo", "payload": "\xff\xfe"}', "UTF-8"),
    "deeply nested": (b"[" * 100_000 + b"]" * 100_000, "deeper than"),
    "nested 65 deep": (
        b'{"endpoint": "echo", "payload": ' + b"[" * 64 + b"]" * 64 + b"}",
        "deeper",
    ),
    "a 5000-digit integer": (b'{"endpoint": "echo", "payload": ' + b"7" * 5000 + b"}", "number"),
    "NaN": (b'{"endpoint": "echo", "t1_s": NaN}', "NaN"),
    "1e999": (b'{"endpoint": "echo", "payload": 1e999}', "1e999"),
    "not JSON": (b"{endpoint: echo", "not valid JSON"),
}


@pytest.mark.parametrize("name", list(BODIES))
@pytest.mark.parametrize("path", ["/v1/actions", "/v1/trajectories", "/run_code"])
def test_bodies_that_were_500s_are_400s_with_the_error_document(
    svc: ServiceThread, name: str, path: str
) -> None:
    data, needle = BODIES[name]
    headers = {"Content-Type": "application/json; charset=no-such-charset"}
    r = httpx.post(svc.url + path, content=data, headers=headers, timeout=30)
    error = refused(r, needle)
    assert error["retryable"] is False
    if path == "/run_code":  # SandboxFusion's shape too
        assert r.json()["status"] == "SandboxError" and needle in r.json()["message"]
    assert httpx.get(f"{svc.url}/healthz").json() == {"ok": True}


@pytest.mark.parametrize(
    ("authorization", "status"),
    [
        (b"Bearer t\xf6k\xe9n", 401),  # Latin-1: not UTF-8 (was a 500)
        ("Bearer tökén".encode(), 401),
        (b"Bearer s3cre\xff", 401),
        (b"Bearer \x01", 400),  # a control character: a malformed header
    ],
    ids=repr,
)
def test_authorization_that_is_not_ascii_is_refused_with_the_error_document(
    authorization: bytes, status: int
) -> None:
    with ServiceThread(fake_cpu_runtime, ServeOptions(port=0, token=TOKEN)) as service:
        for path in ("/v1/status", "/v1/actions/x"):
            r = httpx.get(service.url + path, headers=[(b"Authorization", authorization)])
            assert r.status_code == status, (authorization, r.status_code, r.text[:200])
            assert r.json()["error"]["code"] == ("unauthorized" if status == 401 else "bad_request")
        r = httpx.get(f"{service.url}/v1/status", headers=[(b"X-Tangram-Token", authorization)])
        assert r.status_code == status and "error" in r.json()
        good = httpx.get(f"{service.url}/v1/status", headers={"Authorization": f"Bearer {TOKEN}"})
        assert good.status_code == 200


@pytest.mark.parametrize("image", ["", "UPPER", "a b", "x" * 300, ":tag", 5])
def test_malformed_images_are_refused_naming_the_field(svc: ServiceThread, image: Any) -> None:
    r = httpx.post(f"{svc.url}/v1/trajectories", json={"id": "img", "image": image})
    assert r.status_code == 400, r.text
    assert "'image'" in r.json()["error"]["message"]
    with Client(svc.url) as c:
        assert "img" not in {t["id"] for t in c.trajectories()}


# -- defect 9: silent rewrites ----------------------------------------------------------------

ACTION_REWRITES = [
    ({"max_units": 0}, "max_units"),
    ({"t1_s": 0}, "t1_s"),
    ({"task": ""}, "task"),
    ({"kind": ""}, "kind"),
    ({"id": ""}, "id"),
    ({"timeout_s": 0}, "timeout_s"),
    ({"wait": -5}, "wait"),
    ({"max_output_bytes": 0}, "max_output_bytes"),
]


@pytest.mark.parametrize(("fields", "name"), ACTION_REWRITES, ids=lambda v: str(v))
def test_values_that_were_rewritten_are_refused_naming_the_field(
    svc: ServiceThread, aoe: FakeAoe, fields: dict[str, Any], name: str
) -> None:
    before = len(aoe.runs)
    body = {"trajectory": "t", "command": "true", **fields}
    refused(httpx.post(f"{svc.url}/v1/actions", json=body), name)
    assert len(aoe.runs) == before


@pytest.mark.parametrize("timeout_s", [MAX_TIMEOUT_S * 1.0001, 1e10, 1e300])
def test_a_timeout_past_the_limit_is_refused_naming_it(
    svc: ServiceThread, aoe: FakeAoe, timeout_s: float
) -> None:
    """A time-out past the platform's timers was accepted, then failed as a container failure
    without running (OverflowError at 1e10 s)."""
    before = len(aoe.runs)
    body = {"trajectory": "t", "command": "true", "timeout_s": timeout_s}
    r = httpx.post(f"{svc.url}/v1/actions", json=body)
    refused(r, "timeout_s")
    assert f"{MAX_TIMEOUT_S:g}" in r.json()["error"]["message"]
    assert len(aoe.runs) == before


TRAJECTORY_REWRITES = [
    ({"id": "w", "wait_s": -5}, "wait_s"),
    ({"id": "m", "memory_gb": 1e-9}, "memory_gb"),
    ({"id": "m", "memory_gb": MIN_MEMORY_GB / 2}, "memory_gb"),
    ({"id": ""}, "id"),
]


@pytest.mark.parametrize(("body", "name"), TRAJECTORY_REWRITES, ids=lambda v: str(v))
def test_trajectory_values_that_were_rewritten_are_refused(
    svc: ServiceThread, body: dict[str, Any], name: str
) -> None:
    refused(httpx.post(f"{svc.url}/v1/trajectories", json=body), name)
    with Client(svc.url) as c:
        assert {t["id"] for t in c.trajectories()} == {"t"}, "a refused open opened something"


def test_the_smallest_container_is_accepted(svc: ServiceThread) -> None:
    with Client(svc.url) as c:
        info = c.open_trajectory("small", memory_gb=MIN_MEMORY_GB)
        assert info["memory_gb"] == MIN_MEMORY_GB
        c.close_trajectory("small")


@pytest.mark.parametrize(
    ("fields", "name"),
    [
        ({"files": ""}, "files"),
        ({"fetch_files": ""}, "fetch_files"),
        ({"max_units": 0}, "max_units"),
    ],
    ids=str,
)
def test_run_code_values_that_were_rewritten_are_refused(
    svc: ServiceThread, fields: dict[str, Any], name: str
) -> None:
    r = httpx.post(f"{svc.url}/run_code", json={"code": "print(1)", **fields})
    refused(r, name)
    assert r.json()["status"] == "SandboxError"


# -- defect 4: the server's cap on outputs ----------------------------------------------------


def test_output_limits_above_the_servers_cap_are_refused_naming_it(
    svc: ServiceThread, aoe: FakeAoe
) -> None:
    body = {"trajectory": "t", "command": "true", "wait": True}
    for limit in (CAP + 1, 1 << 40):
        error = refused(
            httpx.post(f"{svc.url}/v1/actions", json={**body, "max_output_bytes": limit}),
            "max_output_bytes",
            str(CAP),
        )
        assert "cap" in error["message"]
    r = httpx.post(f"{svc.url}/v1/actions", json={**body, "max_output_bytes": CAP})
    assert r.status_code == 200 and aoe.runs[-1][2]["max_output_bytes"] == CAP
    r = httpx.post(f"{svc.url}/v1/actions", json={**body, "max_output_bytes": 10})
    assert r.status_code == 200 and aoe.runs[-1][2]["max_output_bytes"] == 10
    r = httpx.post(f"{svc.url}/v1/actions", json=body)  # none given: the cap
    assert r.status_code == 200 and aoe.runs[-1][2]["max_output_bytes"] == CAP
    with pytest.raises(ValueError, match="max_output_bytes"):
        ServeOptions(max_output_bytes=0)


# -- random bodies: refused or accepted, never a 500 -----------------------------------------------

SCALARS = (
    st.none()
    | st.booleans()
    | st.integers(-(10**6), 10**6)
    | st.floats(allow_nan=False, allow_infinity=False)
    | st.text(max_size=8)
)
JSON = st.recursive(
    SCALARS,
    lambda inner: (
        st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=6), inner, max_size=3)
    ),
    max_leaves=10,
)
FIELDS = st.sampled_from(
    ["id", "trajectory", "command", "endpoint", "payload", "service", "inputs", "max_units",
     "t1_s", "serial_fraction", "curve", "timeout_s", "task", "kind", "env", "wait",
     "max_output_bytes", "resource", "memory_gb", "image", "wait_s", "code", "language",
     "stdin", "files", "fetch_files", "run_timeout", "memory_limit_MB", "max_units"]
)  # fmt: skip
CURVES = st.fixed_dictionaries(
    {"kind": st.sampled_from(["inelastic", "amdahl", "tabulated", "fitted", "other"])},
    optional={"t1_s": JSON, "serial_fraction": JSON, "points": JSON, "units": JSON},
)
RANDOM_BODIES = st.dictionaries(FIELDS, JSON | CURVES, max_size=6)
PARSERS = {
    "action": lambda body: parse_action(body, max_output_bytes=CAP),
    "trajectory": parse_trajectory,
    "run_code": lambda body: parse_run_code(body, RunCodeSettings(), 16.0),
}


@settings(max_examples=1500, deadline=None, derandomize=True)
@given(body=RANDOM_BODIES)
@example(body={"resource": []})  # was a TypeError: a 500
@example(body={"resource": {}, "command": "x"})
def test_the_parsers_accept_or_refuse_any_body_and_never_raise_otherwise(body: Any) -> None:
    for parse in PARSERS.values():
        with contextlib.suppress(BadRequest):
            parse(body)


@settings(
    max_examples=150,
    deadline=None,
    derandomize=True,
    suppress_health_check=[HealthCheck.function_scoped_fixture],
)
@given(body=RANDOM_BODIES, path=st.sampled_from(["/v1/actions", "/v1/trajectories", "/run_code"]))
def test_random_bodies_over_http_are_never_a_5xx(svc: ServiceThread, body: Any, path: str) -> None:
    if isinstance(body, dict) and body.get("wait") not in (None, False):
        body["wait"] = False  # never block on a random action
    r = httpx.post(svc.url + path, json=body, timeout=30)
    assert r.status_code < 500, (body, r.status_code, r.text[:300])
    if r.status_code >= 400:
        assert r.json()["error"]["message"], r.text[:300]
    if path == "/v1/trajectories" and r.status_code == 201:
        httpx.delete(f"{svc.url}/v1/trajectories/{segment(r.json()['id'])}", timeout=30)


# -- with Docker: an image the engine does not have ---------------------------------------------


@pytest.mark.docker
def test_a_missing_image_is_a_400_and_leaves_no_container(service: Any) -> None:
    from tangram.exec.aoe.containers import LABEL_SESSION

    r = httpx.post(
        f"{service.url}/v1/trajectories",
        json={"id": "no-image", "image": "no-such-image:never", "memory_gb": 0.25},
        timeout=60,
    )
    error = refused(r, "'image'", "no-such-image:never")
    assert error["retryable"] is False
    with Client(service.url) as c:
        assert "no-image" not in {t["id"] for t in c.trajectories()}
    aoe = service.runtime.cpu.aoe
    left = service.call(
        lambda: aoe.client.containers.list(
            all=True, filters={"label": f"{LABEL_SESSION}={aoe.session}"}
        )
    )
    assert not left, "a container was left behind"
    assert json.loads(httpx.get(f"{service.url}/healthz").text) == {"ok": True}


@pytest.mark.parametrize(
    "body",
    [
        {"command": "x", "t1_s": 40, "curve": {"kind": "amdahl", "t1": 2, "serial_fraction": 0.1}},
        {"endpoint": "echo", "t1_s": 40, "curve": {"kind": "inelastic", "t1": 2}},
    ],
    ids=["cpu", "api"],
)
def test_a_t1_s_that_its_curve_contradicts_is_refused_naming_both(body: dict[str, Any]) -> None:
    """A ``t1_s`` sent with a curve whose ``t1`` differs was dropped without a word (the
    curve's is the action's, in the scheduler and the trace), against the rule that a sent
    field is never replaced. The same value in both is accepted."""
    with pytest.raises(BadRequest, match=r"'t1_s' \(40\) differs from its curve's t1 \(2"):
        parse_action({**body, "trajectory": "t"}, max_output_bytes=1 << 20)
    spec, _ = parse_action({**body, "t1_s": 2, "trajectory": "t"}, max_output_bytes=1 << 20)
    assert spec.elasticity().t1 == 2


def test_a_java_jar_whose_name_holds_the_class_path_separator_is_refused() -> None:
    """Each ``.jar`` of a Java request joins the class path, whose entries ':' separates:
    'lib:v1.jar' was split into 'lib' and 'v1.jar', so the jar was silently not on it and
    the program failed to compile ("package ... does not exist")."""
    body = {"code": "class Main {}", "language": "java", "files": {"lib:v1.jar": ""}}
    with pytest.raises(BadRequest, match="class path") as info:
        parse_run_code(body, RunCodeSettings(), 16.0)
    assert "'files'" in str(info.value)
    for ok in ({**body, "language": "python"}, {**body, "files": {"lib:v1.txt": ""}}):
        assert "lib:v1" in next(iter(parse_run_code(ok, RunCodeSettings(), 16.0).files))


#: Every field of an action, null where unset: as a client writes its schema whole.
ALL_NULL: dict[str, Any] = dict.fromkeys(
    ["id", "trajectory", "resource", "max_units", "t1_s", "serial_fraction", "curve"]
    + ["timeout_s", "task", "kind", "malleable", "wait", "command", "env", "max_output_bytes"]
    + ["service", "inputs", "endpoint", "payload"]
)


def test_another_resources_fields_sent_as_null_are_absent(svc: ServiceThread) -> None:
    """A null is an absent field (docs/live.md), but another resource's work field sent as
    null ('"service": null' beside a command) was refused: 'say what to run' (two kinds of
    work seemed named) or 'unknown field', so a client writing every field of its schema,
    null when unset, had its every action refused."""
    body = {**ALL_NULL, "command": "echo nulls", "trajectory": "t", "wait": True}
    r = httpx.post(f"{svc.url}/v1/actions", json=body, timeout=30)
    assert r.status_code == 200, r.text
    assert r.json()["outcome"]["status"] == "result", r.text
    spec, _ = parse_action({**ALL_NULL, "endpoint": "echo", "payload": 1}, max_output_bytes=CAP)
    assert (spec.resource, spec.work.payload) == ("api", 1)
    spec, _ = parse_action({**ALL_NULL, "service": "m", "inputs": [1]}, max_output_bytes=CAP)
    assert spec.resource == "gpu"
    with pytest.raises(BadRequest, match="unknown field 'bogus' for an api action"):
        parse_action({"endpoint": "echo", "bogus": None}, max_output_bytes=CAP)  # (a typo)
