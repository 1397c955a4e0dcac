"""A request body is parsed off the event loop when it is large (``body.THREAD_BYTES``): a
64 MiB body kept the parser, and so every other client's requests, for about a second."""

from __future__ import annotations

import asyncio
import json
import threading

import pytest

from tangram.exec.runtime.errors import BadRequest
from tangram.exec.service import body


class _Request:
    def __init__(self, data: bytes) -> None:
        self.data = data

    async def read(self) -> bytes:
        return self.data


def parsed_on(data: bytes, monkeypatch: pytest.MonkeyPatch) -> tuple[object, bool]:
    """The body's value, and whether it was parsed on the event loop's thread."""
    threads: list[int] = []
    real = body.parse_json

    def spy(data: bytes, *, optional: bool = False) -> object:
        threads.append(threading.get_ident())
        return real(data, optional=optional)

    monkeypatch.setattr(body, "parse_json", spy)

    async def main() -> tuple[object, bool]:
        value = await body.read_json(_Request(data), timeout_s=5.0)  # type: ignore[arg-type]
        return value, threads == [threading.get_ident()]

    return asyncio.run(main())


def test_a_small_body_is_parsed_on_the_loop(monkeypatch):
    assert parsed_on(b'{"a": 1}', monkeypatch) == ({"a": 1}, True)


def test_a_large_body_is_parsed_in_a_worker_thread(monkeypatch):
    big = {"inputs": [[1] * 1000] * (body.THREAD_BYTES // 2000 + 1)}
    data = json.dumps(big).encode()
    assert len(data) > body.THREAD_BYTES
    assert parsed_on(data, monkeypatch) == (big, False)


def test_a_large_bad_body_is_still_a_400_naming_the_problem(monkeypatch):
    data = b'{"a": "' + b"x" * body.THREAD_BYTES + b'\xff"}'
    with pytest.raises(BadRequest, match="not valid UTF-8"):
        parsed_on(data, monkeypatch)
