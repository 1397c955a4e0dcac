"""A ``/run_code`` request whose toolchain image cannot be checked or built: the engine's
error (``docker.errors.APIError``), the build script's time-out or a script that cannot be
run went through ``ImageBuilds`` as they were, so the request was a plain 500 without
SandboxFusion's shape (its client read no ``status``). Each is now a ``SandboxError``
(nothing ran: a retry is safe), and no container is opened."""

from __future__ import annotations

import asyncio
import subprocess
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import docker.errors
import pytest

from tangram.exec.service import languages, sandbox_fusion
from tangram.exec.service.languages import ImageBuilds
from tangram.exec.service.sandbox_fusion import RunCodeSettings, parse_run_code


class Images:
    def __init__(self, error: Exception | None) -> None:
        self.error = error

    def get(self, name: str) -> Any:
        if self.error is not None:
            raise self.error
        raise docker.errors.ImageNotFound(name)


class Runtime:
    """A runtime whose engine answers as ``Images``; counts what would have run."""

    def __init__(self, error: Exception | None) -> None:
        self.cpu = SimpleNamespace(
            aoe=SimpleNamespace(client=SimpleNamespace(images=Images(error)))
        )
        self.opened: list[str] = []

    async def open_trajectory(self, traj: str, **kw: Any) -> None:
        self.opened.append(traj)

    async def close_trajectory(self, traj: str) -> None:
        return None

    async def run(self, spec: Any) -> Any:
        raise AssertionError("nothing may run")


def answer(runtime: Runtime) -> dict[str, Any]:
    settings = RunCodeSettings()
    req = parse_run_code({"code": "int main(){}", "language": "cpp"}, settings)
    return asyncio.run(sandbox_fusion.run_code(runtime, req, settings, max_output_bytes=1 << 20))


@pytest.fixture
def builds(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> ImageBuilds:
    script = tmp_path / "build.sh"
    script.write_text("#!/bin/sh\nexit 0\n")
    fresh = ImageBuilds(script)
    monkeypatch.setattr(sandbox_fusion, "IMAGE_BUILDS", fresh)
    return fresh


def test_an_engine_error_checking_the_image_is_a_sandbox_error(builds: ImageBuilds) -> None:
    runtime = Runtime(docker.errors.APIError("500 Server Error: engine down"))
    doc = answer(runtime)
    assert doc["status"] == "SandboxError" and "APIError" in doc["message"], doc
    assert runtime.opened == []


@pytest.mark.parametrize(
    "failure",
    [subprocess.TimeoutExpired(["build.sh"], 1800), PermissionError(13, "Permission denied")],
    ids=["time-out", "not runnable"],
)
def test_a_build_that_fails_to_run_is_a_sandbox_error(
    builds: ImageBuilds, monkeypatch: pytest.MonkeyPatch, failure: Exception
) -> None:
    def run(*args: Any, **kw: Any) -> Any:
        raise failure

    monkeypatch.setattr(languages.subprocess, "run", run)
    runtime = Runtime(None)
    doc = answer(runtime)
    assert doc["status"] == "SandboxError" and "nothing ran" in doc["message"], doc
    assert runtime.opened == []


def test_requests_waiting_for_a_build_hold_no_thread_of_the_default_executor(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Each request waiting for the toolchain image's build (up to 30 minutes) held a thread
    of the loop's default executor, blocked on the build's lock: a few such requests filled
    it, stalling everything else the service runs there (a large body's parsing, the
    trace's writing, the executors' shutdown) until the build ended. They now wait in the
    builds' own one-thread queue."""
    import threading
    from concurrent.futures import ThreadPoolExecutor

    building = threading.Event()
    release = threading.Event()
    builds = ImageBuilds()

    def build(client: Any, image: str) -> None:
        building.set()
        release.wait(60)  # (bounded: the test sets it)

    monkeypatch.setattr(builds, "_build", build)

    async def main() -> bool:
        loop = asyncio.get_running_loop()
        loop.set_default_executor(ThreadPoolExecutor(2))
        waiting = [asyncio.ensure_future(builds.ensure(None, "img")) for _ in range(4)]
        for _ in range(3000):  # bounded: the build starts at once
            if building.is_set():
                break
            await asyncio.sleep(0.01)
        try:
            # Another user of the default executor runs while the build goes on.
            done = await asyncio.wait_for(loop.run_in_executor(None, lambda: True), 10)
        except TimeoutError:
            done = False
        release.set()
        await asyncio.gather(*waiting)
        return done

    assert asyncio.run(main()), "the default executor was full of requests waiting for a build"
