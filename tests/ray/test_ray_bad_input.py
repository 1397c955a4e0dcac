"""The scheduler actor's Ray-native API (its handle's methods, as drivers call them) answers a
malformed argument with a ``bad_request`` reply naming what is wrong, and never lets one bad
document of a ``run_many`` hide the outcomes of the others it accepted."""

from __future__ import annotations

import asyncio
import json
from typing import Any

import pytest

#: Seconds any one actor call here may take (each is answered at once or by a 1-s action).
CALL_S = 60.0


def _get(ref: Any) -> Any:
    import ray

    return ray.get(ref, timeout=CALL_S)


@pytest.mark.parametrize("body", ["junk", None, 5, ["command", "true"]])
def test_a_non_object_body_is_a_bad_request_naming_it(ray_cluster: Any, body: Any) -> None:
    h = ray_cluster.handle
    methods = ("submit", "run") if body is None else ("submit", "run", "open_trajectory")
    for method in methods:  # (no body opens a trajectory: its fields are optional)
        reply = _get(getattr(h, method).remote(body))
        assert reply["error"]["code"] == "bad_request", (method, reply)
        assert "JSON object" in reply["error"]["message"]


def test_a_body_that_is_no_document_in_run_many_is_refused_and_the_others_run(
    ray_cluster: Any,
) -> None:
    h = ray_cluster.handle
    good = {"id": "bad-input-good", "endpoint": "echo", "payload": {"n": 1}}
    replies = _get(h.run_many.remote([good, "junk"]))
    assert replies[0]["value"]["status"] == "result", replies
    assert replies[0]["value"]["result"] == {"n": 1}
    assert replies[1]["error"]["code"] == "bad_request"
    assert json.dumps(replies)  # (plain documents)


@pytest.mark.parametrize("wait_s", ["soon", float("nan"), -1.0, [1]])
def test_a_bad_wait_is_a_bad_request_naming_it(
    ray_cluster: Any, wait_s: Any, tmp_path_factory: pytest.TempPathFactory
) -> None:
    # An action still running (a wait is read only then): 10 s on the "counted" endpoint,
    # one action for every case (the same id and content: submitted once).
    h = ray_cluster.handle
    log = tmp_path_factory.getbasetemp() / "bad-input-wait.log"
    payload = {"file": str(log), "key": "w", "s": 10.0}
    _get(h.submit.remote({"id": "bad-input-wait", "endpoint": "counted", "payload": payload}))
    reply = _get(h.result.remote("bad-input-wait", wait_s))
    assert reply["error"]["code"] == "bad_request", reply
    assert "wait_s" in reply["error"]["message"]


@pytest.mark.parametrize("action_id", [5, None, ["a"]])
def test_a_bad_action_id_is_refused(ray_cluster: Any, action_id: Any) -> None:
    h = ray_cluster.handle
    for method in ("result", "cancel"):
        reply = _get(getattr(h, method).remote(action_id))
        assert "error" in reply, (method, reply)
        assert reply["error"]["code"] in {"bad_request", "unknown_action"}, reply


def test_a_body_with_a_field_name_not_a_string_is_a_bad_request(ray_cluster: Any) -> None:
    # (JSON's names are strings; a Ray caller's dict may have any key: sorting the unknown
    # ones to name the first raised TypeError when they mixed ints and strings)
    h = ray_cluster.handle
    for method, body in (
        ("submit", {1: "a", "x": 2, "command": "true"}),
        ("run", {1: "a", "x": 2, "command": "true"}),
        ("open_trajectory", {1: "a", "x": 2}),
    ):
        reply = _get(getattr(h, method).remote(body))
        assert reply["error"]["code"] == "bad_request", (method, reply)
        assert "1" in reply["error"]["message"], reply


def test_one_bad_body_in_run_many_leaves_the_others_outcomes(
    ray_cluster: Any, tmp_path_factory: pytest.TempPathFactory
) -> None:
    # A body whose handling raised (GPU inputs nested 600 deep: the inputs' decoder recursed
    # into them, before the depth bound refused them) failed the whole run_many: the client
    # raised, the other actions ran with their outcomes lost, and a caller resending the
    # batch (new ids) ran them twice. That body is now refused as a bad request before it
    # runs; its own reply is an error and the others' outcomes come back. (A run that
    # raises, whatever the cause: the next test.)
    from tangram.exec.ray import RayClient
    from tangram.exec.runtime.records import Outcome
    from tangram.exec.service import ServiceError

    log = tmp_path_factory.getbasetemp() / "bad-input-batch.log"
    deep: Any = 1.0
    for _ in range(600):
        deep = [deep]
    good = {"endpoint": "counted", "payload": {"file": str(log), "key": "batch"}}
    results = RayClient(ray_cluster.handle).run_many([good, {"service": "x", "inputs": deep}])
    assert isinstance(results[0], Outcome) and results[0].status == "result", results
    assert isinstance(results[1], ServiceError) and not results[1].retryable, results
    assert [line.split()[0] for line in log.read_text().splitlines()] == ["batch"]


def test_a_body_nested_too_deep_is_a_bad_request_naming_it(ray_cluster: Any) -> None:
    # (the HTTP API bounds a body's depth as it reads the JSON; a Ray caller's dict never
    # passed that bound: a payload nested 600 deep raised RecursionError in the actor)
    h = ray_cluster.handle
    for container in (list, tuple):
        deep: Any = 1.0
        for _ in range(600):
            deep = container([deep])
        for method in ("submit", "run"):
            reply = _get(getattr(h, method).remote({"endpoint": "echo", "payload": deep}))
            assert reply["error"]["code"] == "bad_request", (method, reply)
            assert "deeper than 64 levels" in reply["error"]["message"], reply


def test_run_many_answers_a_run_that_raises_with_an_internal_error_of_its_own() -> None:
    # No input is known to make ``run`` raise any more (bad documents are bad_request
    # replies); whatever still does ends as that document's own ``internal`` error reply,
    # never the whole call's. (The actor's class on a plain runtime: no cluster needed.)
    from tangram.core.resources import ApiEndpointSpec, ClusterSpec
    from tangram.exec.ray.config import RayConfig
    from tangram.exec.ray.scheduler import SchedulerActor
    from tangram.exec.runtime.api import ApiExecutor, echo
    from tangram.exec.runtime.runtime import Runtime

    class Flawed(SchedulerActor):
        async def run(self, body: Any) -> dict[str, Any]:
            if body.get("id") == "flawed":
                raise RuntimeError("a flaw in the actor")
            return await super().run(body)

    async def main() -> list[dict[str, Any]]:
        cluster = ClusterSpec(name="batch", apis=(ApiEndpointSpec("echo", concurrency=4),))
        async with Runtime(cluster, api=ApiExecutor({"echo": echo})) as rt:
            actor = Flawed(RayConfig())
            actor.runtime = rt
            bodies = [
                {"id": "before", "endpoint": "echo", "payload": 1},
                {"id": "flawed", "endpoint": "echo", "payload": 2},
                {"id": "after", "endpoint": "echo", "payload": 3},
            ]
            return await asyncio.wait_for(actor.run_many(bodies), CALL_S)

    replies = asyncio.run(main())
    assert [r.get("value", {}).get("result") for r in replies] == [1, None, 3], replies
    err = replies[1]["error"]
    assert err["code"] == "internal" and not err["retryable"], err
    assert "RuntimeError: a flaw in the actor" in err["message"]


def test_a_body_nested_too_deep_in_dict_or_list_subclasses_is_a_bad_request() -> None:
    # A Ray caller's documents are Python objects: an OrderedDict, a defaultdict, a namedtuple
    # or a list subclass nests like a dict or list, but the depth bound looked for the exact
    # types among a container's children and stepped over them; the actor's handling then
    # raised RecursionError (a failed Ray call, an internal error in run_many). (The actor's
    # class on a plain runtime: no cluster needed.)
    from collections import OrderedDict, defaultdict, namedtuple

    from tangram.core.resources import ApiEndpointSpec, ClusterSpec
    from tangram.exec.ray.config import RayConfig
    from tangram.exec.ray.scheduler import SchedulerActor
    from tangram.exec.runtime.api import ApiExecutor, echo
    from tangram.exec.runtime.runtime import Runtime

    class Rows(list):  # type: ignore[type-arg]
        pass

    pair = namedtuple("pair", "value")

    def deep(wrap: Any) -> Any:
        value: Any = 1.0
        for _ in range(600):
            value = wrap(value)
        return value

    wraps = {
        "OrderedDict": lambda v: OrderedDict(a=v),
        "defaultdict": lambda v: defaultdict(int, a=v),
        "namedtuple": lambda v: pair(v),
        "list subclass": lambda v: Rows([v]),
    }

    async def main() -> list[tuple[str, str, dict[str, Any]]]:
        cluster = ClusterSpec(name="deep", apis=(ApiEndpointSpec("echo", concurrency=4),))
        async with Runtime(cluster, api=ApiExecutor({"echo": echo})) as rt:
            actor = SchedulerActor(RayConfig())
            actor.runtime = rt
            got = []
            for name, wrap in wraps.items():
                body = {"endpoint": "echo", "payload": deep(wrap)}
                for method in ("submit", "run"):
                    reply = await asyncio.wait_for(getattr(actor, method)(body), CALL_S)
                    got.append((name, method, reply))
            return got

    for name, method, reply in asyncio.run(main()):
        assert reply["error"]["code"] == "bad_request", (name, method, reply)
        assert "deeper than 64 levels" in reply["error"]["message"], (name, method, reply)


def _plain_actor_call(method: str, *args: Any) -> dict[str, Any]:
    """``SchedulerActor.method(*args)`` over a plain runtime (the echo API, no cluster)."""
    from tangram.core.resources import ApiEndpointSpec, ClusterSpec
    from tangram.exec.ray.config import RayConfig
    from tangram.exec.ray.scheduler import SchedulerActor
    from tangram.exec.runtime.api import ApiExecutor, echo
    from tangram.exec.runtime.runtime import Runtime

    async def main() -> dict[str, Any]:
        cluster = ClusterSpec(name="plain", apis=(ApiEndpointSpec("echo", concurrency=4),))
        async with Runtime(cluster, api=ApiExecutor({"echo": echo})) as rt:
            actor = SchedulerActor(RayConfig())
            actor.runtime = rt
            return await asyncio.wait_for(getattr(actor, method)(*args), CALL_S)

    return asyncio.run(main())


@pytest.mark.parametrize("trajectory", [["a"], {"id": "a"}, 5, None])
@pytest.mark.parametrize("method", ["close_trajectory", "recreate_trajectory"])
def test_a_trajectory_id_that_is_no_string_is_a_bad_request_naming_it(
    method: str, trajectory: Any
) -> None:
    # A list or dict id raised TypeError (unhashable) out of the runtime's lookup: the Ray
    # caller got a bare RayTaskError instead of the reply every other bad argument gets.
    reply = _plain_actor_call(method, trajectory)
    assert reply["error"]["code"] == "bad_request", reply
    assert "trajectory" in reply["error"]["message"] and "string" in reply["error"]["message"]


@pytest.mark.parametrize("spec", [{"endpoint": "echo", "payload": 1}, None, "echo"])
def test_run_spec_of_no_action_spec_is_a_bad_request_naming_it(spec: Any) -> None:
    # run_spec read spec.trajectory first: a dict (the document run takes), None or a string
    # raised AttributeError out of the actor, a bare RayTaskError to the Ray caller.
    reply = _plain_actor_call("run_spec", spec)
    assert reply["error"]["code"] == "bad_request", reply
    assert "ActionSpec" in reply["error"]["message"], reply


@pytest.mark.parametrize("bodies", [None, 5, {"endpoint": "echo", "payload": 1}, "echo"])
def test_run_many_of_no_list_is_one_bad_request_naming_it(bodies: Any) -> None:
    # None or a number raised TypeError (not iterable) out of the actor, a bare RayTaskError;
    # a dict ran its keys and a string its characters, one 'not a JSON object' per item.
    replies = _plain_actor_call("run_many", bodies)
    assert len(replies) == 1, replies
    err = replies[0]["error"]
    assert err["code"] == "bad_request" and "list of action documents" in err["message"], err
