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
        self.headers: dict[str, str] = {}  # (read_json checks its Content-Encoding)

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


def test_a_large_actions_checks_run_off_the_loop_too(monkeypatch: pytest.MonkeyPatch) -> None:
    """The body of ``POST /v1/actions`` was parsed off the loop when large, but checked and
    decoded on it (``parse_action``: a GPU call's million token ids counted, scanned for a
    float and made a tensor, ~0.7 s), every other client's requests waiting meanwhile. A
    large body's ``parse_action`` runs in the worker thread now; a small one's on the loop."""
    import httpx

    from tangram.core.resources import ApiEndpointSpec, ClusterSpec
    from tangram.exec.runtime import ApiExecutor, Runtime, RuntimeConfig
    from tangram.exec.runtime.api import echo
    from tangram.exec.service import ServeOptions, ServiceThread
    from tangram.exec.service import app as service_app

    threads: list[int] = []
    real = service_app.parse_action

    def spy(doc: object, **kwargs: object) -> object:
        threads.append(threading.get_ident())
        return real(doc, **kwargs)  # type: ignore[arg-type]

    monkeypatch.setattr(service_app, "parse_action", spy)
    cluster = ClusterSpec(name="b", apis=(ApiEndpointSpec("echo", concurrency=4),))

    def make() -> Runtime:
        return Runtime(cluster, RuntimeConfig(), api=ApiExecutor({"echo": echo}))

    with ServiceThread(make, ServeOptions(port=0)) as service:
        assert service._thread is not None
        loop_thread = service._thread.ident
        for payload in ([1] * 10, [1] * body.THREAD_BYTES):
            r = httpx.post(
                service.url + "/v1/actions",
                json={"endpoint": "echo", "payload": payload, "wait": 30},
                timeout=60,
            )
            assert r.status_code == 200, r.text[:300]
    assert len(threads) == 2 and threads[0] == loop_thread and threads[1] != loop_thread, threads


def test_a_large_result_is_encoded_off_the_loop(monkeypatch: pytest.MonkeyPatch) -> None:
    """An outcome's answer was made on the loop whatever its size: a GPU call's 256 x 4096
    floats took 2.5 s per answer (to lists, then to text), every other client's requests
    waiting. A large result's answer is made in a worker thread; a small one's on the loop.
    The answer is the same either way."""
    import httpx

    from tangram.core.resources import ApiEndpointSpec, ClusterSpec
    from tangram.exec.runtime import ApiExecutor, Runtime, RuntimeConfig
    from tangram.exec.service import ServeOptions, ServiceThread
    from tangram.exec.service import app as service_app
    from tangram.exec.service.codec import LARGE_ITEMS

    threads: list[int] = []
    real = service_app._state_doc

    def spy(*args: object) -> object:
        threads.append(threading.get_ident())
        return real(*args)  # type: ignore[arg-type]

    monkeypatch.setattr(service_app, "_state_doc", spy)
    cluster = ClusterSpec(name="r", apis=(ApiEndpointSpec("rows", concurrency=4),))

    async def rows(n: int) -> object:
        return [[0.5] * 64 for _ in range(n)]

    def make() -> Runtime:
        return Runtime(cluster, RuntimeConfig(), api=ApiExecutor({"rows": rows}))

    with ServiceThread(make, ServeOptions(port=0)) as service:
        assert service._thread is not None
        loop_thread = service._thread.ident
        for n in (2, LARGE_ITEMS // 64 + 1):
            r = httpx.post(
                service.url + "/v1/actions",
                json={"endpoint": "rows", "payload": n, "wait": 30},
                timeout=60,
            )
            assert r.status_code == 200, r.text[:300]
            assert r.json()["outcome"]["result"] == [[0.5] * 64] * n
            assert r.headers["Content-Type"].startswith("application/json"), r.headers
    assert len(threads) == 2 and threads[0] == loop_thread and threads[1] != loop_thread, threads


def test_a_large_run_code_requests_checks_run_off_the_loop(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """``/run_code`` checked its body on the loop (``parse_run_code``: its files' base64,
    up to 64 MiB, decoded there, ~0.2 s), every other client's requests waiting. A large
    body's checks run in the worker thread now; a small one's on the loop."""
    import base64

    import httpx

    from tangram.core.resources import ApiEndpointSpec, ClusterSpec
    from tangram.exec.runtime import ApiExecutor, Runtime, RuntimeConfig
    from tangram.exec.runtime.api import echo
    from tangram.exec.service import ServeOptions, ServiceThread
    from tangram.exec.service import app as service_app

    threads: list[int] = []
    real = service_app.parse_run_code

    def spy(*args: object) -> object:
        threads.append(threading.get_ident())
        return real(*args)  # type: ignore[arg-type]

    monkeypatch.setattr(service_app, "parse_run_code", spy)
    cluster = ClusterSpec(name="b", apis=(ApiEndpointSpec("echo", concurrency=4),))

    def make() -> Runtime:
        return Runtime(cluster, RuntimeConfig(), api=ApiExecutor({"echo": echo}))

    with ServiceThread(make, ServeOptions(port=0)) as service:
        assert service._thread is not None
        loop_thread = service._thread.ident
        for size in (10, body.THREAD_BYTES):
            files = {"data.bin": base64.b64encode(b"x" * size).decode()}
            httpx.post(service.url + "/run_code", json={"code": "1", "files": files}, timeout=60)
    assert len(threads) == 2 and threads[0] == loop_thread and threads[1] != loop_thread, threads


def test_run_codes_large_files_are_encoded_off_the_loop(monkeypatch: pytest.MonkeyPatch) -> None:
    """``/run_code`` encoded its files for upload (base64, up to 64 MiB of it) and its
    answer's fetched files (up to 43 MB of base64 text) on the loop, ~0.1-0.15 s each, every
    other client's requests waiting. Both run in a worker thread when large."""
    import base64

    import httpx

    from tangram.core.resources import ApiEndpointSpec, ClusterSpec
    from tangram.exec.runtime import ApiExecutor, Runtime, RuntimeConfig
    from tangram.exec.runtime.api import echo
    from tangram.exec.service import ServeOptions, ServiceThread, sandbox_fusion
    from tangram.exec.service import app as service_app

    uploads: list[int] = []
    encodes: list[int] = []
    real_upload, real_dumps = sandbox_fusion._upload_commands, service_app.dumps

    def upload_spy(files: dict[str, bytes]) -> object:
        uploads.append(threading.get_ident())
        return real_upload(files)

    def dumps_spy(doc: object) -> str:
        encodes.append(threading.get_ident())
        return real_dumps(doc)

    monkeypatch.setattr(sandbox_fusion, "_upload_commands", upload_spy)
    monkeypatch.setattr(service_app, "dumps", dumps_spy)
    cluster = ClusterSpec(name="b", apis=(ApiEndpointSpec("echo", concurrency=4),))

    def make() -> Runtime:
        return Runtime(cluster, RuntimeConfig(), api=ApiExecutor({"echo": echo}))

    with ServiceThread(make, ServeOptions(port=0)) as service:
        assert service._thread is not None
        loop_thread = service._thread.ident
        files = {"data.bin": base64.b64encode(b"x" * body.THREAD_BYTES).decode()}
        httpx.post(service.url + "/run_code", json={"code": "1", "files": files}, timeout=60)

        async def fetched(*args: object, **kwargs: object) -> dict[str, object]:
            return {"status": "Success", "message": "", "files": files}

        monkeypatch.setattr(service_app, "run_code", fetched)
        r = httpx.post(service.url + "/run_code", json={"code": "1"}, timeout=60)
        assert r.status_code == 200 and r.json()["files"] == files
    assert uploads and all(t != loop_thread for t in uploads), (uploads, loop_thread)
    assert encodes and all(t != loop_thread for t in encodes), (encodes, loop_thread)
