"""The Ray-native clients against a stand-in scheduler actor handle (no Ray cluster): what a
caller is told, and what is sent again, when the actor cannot be reached for a moment."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest

from tangram.exec.ray import client as ray_client
from tangram.exec.service.retry import ServiceError


def unavailable() -> BaseException:
    import ray

    return ray.exceptions.ActorUnavailableError("its node is unreachable for now", None)


class Handle:
    """A scheduler actor handle whose first ``failures`` calls of each method raise ``error``
    (as Ray does when the actor cannot be reached), then answer the submitted id."""

    def __init__(self, error: Any, failures: int = 1) -> None:
        self.sent: list[tuple[str, Any]] = []
        self.error, self.failures = error, failures

    def __getattr__(self, method: str) -> Any:
        async def answer(*args: Any) -> Any:
            self.sent.append((method, args))
            if len(self.sent) <= self.failures:
                raise self.error()
            if method == "run_many":
                return [{"value": None, "error": _refused()} for _ in args[0]]
            return {"value": args[0]["id"]} if method == "submit" else {"value": []}

        return type("M", (), {"remote": staticmethod(answer)})


def _refused() -> dict[str, Any]:
    return {"code": "bad_request", "message": "x", "retryable": False, "retry_after_s": None}


@pytest.fixture(autouse=True)
def no_pause(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(ray_client, "UNAVAILABLE_PAUSE_S", 0.0, raising=False)


def test_an_action_sent_while_the_actor_is_unreachable_is_sent_again_with_its_id() -> None:
    # Ray's ActorUnavailableError says the call 'may or may not have been executed': the
    # actor may still run it. The client called it scheduler_lost ('actions it had accepted
    # have no outcome; resend them (new ids)'): a caller who did ran the action twice. An
    # idempotent call (the same id) is sent again; the actor answers it once.
    h = Handle(unavailable)
    got = asyncio.run(ray_client.AsyncRayClient(h).submit(id="a1", endpoint="echo", payload=1))
    assert got == "a1"
    assert [m for m, _ in h.sent] == ["submit", "submit"]
    assert h.sent[0][1] == h.sent[1][1]  # the same document, the same id


def test_a_call_not_safe_to_resend_while_unreachable_says_its_effect_is_unknown() -> None:
    h = Handle(unavailable)
    with pytest.raises(ServiceError) as err:
        asyncio.run(ray_client.AsyncRayClient(h).open_trajectory(memory_gb=1.0))  # (no id)
    assert err.value.code == ray_client.SCHEDULER_UNREACHABLE
    assert "may" in err.value.message and "new ids" not in err.value.message
    assert len(h.sent) == 1


def test_a_batch_sent_while_the_actor_is_unreachable_is_sent_again_with_its_ids() -> None:
    h = Handle(unavailable)
    out = asyncio.run(
        ray_client.AsyncRayClient(h).run_many([{"id": "b1", "endpoint": "echo", "payload": 1}])
    )
    assert [m for m, _ in h.sent] == ["run_many", "run_many"]
    assert h.sent[0][1] == h.sent[1][1]
    assert isinstance(out[0], ServiceError) and out[0].code == "bad_request"


def test_a_dead_actor_is_still_scheduler_lost_at_once() -> None:
    import ray

    h = Handle(lambda: ray.exceptions.ActorDiedError(), failures=5)
    with pytest.raises(ServiceError) as err:
        asyncio.run(ray_client.AsyncRayClient(h).submit(id="d1", endpoint="echo", payload=1))
    assert err.value.code == ray_client.SCHEDULER_LOST and len(h.sent) == 1


def test_the_waiting_client_sends_again_too(monkeypatch: pytest.MonkeyPatch) -> None:
    import ray

    monkeypatch.setattr(ray, "get", lambda ref: asyncio.run(ref))
    h = Handle(unavailable)
    assert ray_client.RayClient(h).submit(id="s1", endpoint="echo", payload=1) == "s1"
    assert len(h.sent) == 2 and h.sent[0][1] == h.sent[1][1]
    h = Handle(unavailable, failures=10)
    with pytest.raises(ServiceError) as err:
        ray_client.RayClient(h, retries=2).submit(id="s2", endpoint="echo", payload=1)
    assert err.value.code == ray_client.SCHEDULER_UNREACHABLE and len(h.sent) == 3


@pytest.mark.parametrize("retries", [-1, 1.5, "3", True])
def test_a_retry_count_that_is_no_count_is_refused_naming_it(retries: Any) -> None:
    # -1 sent nothing and raised AssertionError('unreachable') at the first call; 1.5 and '3'
    # raised TypeError inside range() there, far from the mistake.
    for cls in (ray_client.AsyncRayClient, ray_client.RayClient):
        with pytest.raises(ValueError, match=r"retries must be an integer >= 0"):
            cls(Handle(unavailable), retries=retries)


def test_an_open_with_an_id_is_not_resent_when_its_effect_is_unknown() -> None:
    # A resent open of an id the first call did open is a 409 'already open': the caller
    # was told its open failed although it succeeded. (Retryable errors, which mean 'not
    # done', are still retried.)
    h = Handle(unavailable)
    with pytest.raises(ServiceError) as err:
        asyncio.run(ray_client.AsyncRayClient(h).open_trajectory("t-1", memory_gb=1.0))
    assert err.value.code == ray_client.SCHEDULER_UNREACHABLE and len(h.sent) == 1
