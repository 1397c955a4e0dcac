"""The verl tool against verl's real ``BaseTool`` (the ``verl`` package, loaded from the example
tool config by verl's own loader): a trajectory writes a file in one call and reads it in the
next, a background process outlives its call, ``calc_reward`` runs in the same container, and
``release`` removes the container."""

from __future__ import annotations

import asyncio
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import docker.errors
import pytest
from verl.tools.base_tool import BaseTool
from verl.tools.tool_registry import initialize_tools_from_config

from tangram.exec.service import Client
from tests.live.cpu_service import cpu_only_service

pytestmark = pytest.mark.docker

CONFIG = Path(__file__).resolve().parents[2] / "tangram/exec/integrations/verl_tool_config.yaml"


@pytest.fixture(scope="module")
def service(docker_client: Any) -> Iterator[Any]:
    """Without a warm pool, so release visibly removes the container."""
    yield from cpu_only_service(docker_client, max_pending=64)


@pytest.fixture
def tool(service: Any, tmp_path: Path) -> BaseTool:
    """The example config's tool, pointed at the test service, with a reward command."""
    text = CONFIG.read_text().replace("http://127.0.0.1:8765", service.url)
    text = text.replace(
        '# reward_command: "python3 -m pytest -q tests"',
        'reward_command: "grep -q hello notes.txt"',
    )
    path = tmp_path / "tools.yaml"
    path.write_text(text)
    [loaded] = initialize_tools_from_config(str(path))
    return loaded


def test_the_tool_is_a_verl_base_tool_with_its_schema(tool: BaseTool) -> None:
    assert isinstance(tool, BaseTool)
    assert tool.name == "code_interpreter"
    assert tool.get_openai_tool_schema().function.parameters.required == ["code"]


def test_a_trajectory_keeps_its_files_and_processes_across_calls(
    tool: BaseTool, service: Any, docker_client: Any
) -> None:
    async def lifecycle() -> tuple[list[str], float, float, str]:
        traj, _ = await tool.create()
        try:
            with Client(service.url) as c:
                [info] = [t for t in c.trajectories() if t["id"] == traj]
            container = info["container"]
            texts = []
            for params in (
                {"code": "open('notes.txt', 'w').write('hello from call 1')"},
                {"code": "sleep 300 & echo $! > bg.pid; echo started", "language": "bash"},
                {"code": "print(open('notes.txt').read())"},
                {"code": "kill -0 $(cat bg.pid) && echo still-running", "language": "bash"},
                {"code": "import os; print(os.environ['TANGRAM_CORES'])"},
            ):
                response, _, metrics = await tool.execute(traj, params)
                assert metrics["status"] == "result" and metrics["exit_code"] == 0, metrics
                texts.append(response.text)
            good = await tool.calc_reward(traj)
            await tool.execute(traj, {"code": "rm notes.txt", "language": "bash"})
            bad = await tool.calc_reward(traj)
        finally:
            await tool.release(traj)
        return texts, good, bad, container

    texts, good, bad, container = asyncio.run(lifecycle())
    assert texts[2].strip() == "hello from call 1"
    assert texts[3].strip() == "still-running"
    assert 1 <= int(texts[4]) <= 2  # cores granted for that call (max_units 2)
    assert (good, bad) == (1.0, 0.0)
    with pytest.raises(docker.errors.NotFound):
        docker_client.containers.get(container)
    with Client(service.url) as c:
        assert not c.trajectories(), "release left the trajectory open"


def test_a_bad_call_is_answered_not_raised(tool: BaseTool) -> None:
    async def calls() -> list[str]:
        traj, _ = await tool.create()
        try:
            out = [
                (await tool.execute(traj, p))[0].text
                for p in ({}, {"code": "x", "language": "cobol"})
            ]
        finally:
            await tool.release(traj)
        return out

    missing, language = asyncio.run(calls())
    assert "'code'" in missing and "cobol" in language


def test_a_tool_works_from_one_event_loop_to_the_next() -> None:
    """The tool made its HTTP client once, on the event loop of its first call, and kept it:
    used from a later loop (an ``asyncio.run`` per rollout step, a worker's new loop) every
    call failed with ``RuntimeError: Event loop is closed``. Each loop gets a client of its
    own; the last loop's is closed when a new one is made, if its loop still runs."""
    from tangram.exec.integrations.verl_tool import TangramSandboxTool
    from tangram.exec.service import ServeOptions, ServiceThread
    from tests.live.test_service_ids import fake_cpu_runtime

    with ServiceThread(fake_cpu_runtime, ServeOptions(port=0)) as svc:
        tool = TangramSandboxTool({"tangram_url": svc.url, "image": "fake"})
        traj, _ = asyncio.run(tool.create("t-loops"))
        response, _, metrics = asyncio.run(tool.execute(traj, {"code": "print(1)"}))
        asyncio.run(tool.release(traj))
    assert metrics["status"] == "result" and metrics["exit_code"] == 0, (metrics, response)


def test_release_of_a_trajectory_already_gone_is_done_not_raised() -> None:
    """``release`` of a trajectory the service no longer has (its container closed by a
    restart of the service, or by the operator) raised the 404 out of verl's agent loop,
    failing the rollout over a container that was gone already: there is nothing left to
    release. (Other errors are logged, not raised: ``test_verl_tool_release``.)"""
    from tangram.exec.integrations.verl_tool import TangramSandboxTool
    from tangram.exec.service import ServeOptions, ServiceThread
    from tests.live.test_service_ids import fake_cpu_runtime

    with ServiceThread(fake_cpu_runtime, ServeOptions(port=0)) as svc:
        tool = TangramSandboxTool({"tangram_url": svc.url, "image": "fake"})

        async def lifecycle() -> None:
            traj, _ = await tool.create("t-gone")
            with Client(svc.url) as c:
                c.close_trajectory(traj)  # (as a restart would: the container is gone)
            await tool.release(traj)
            assert traj not in tool._calls

        asyncio.run(lifecycle())


@pytest.mark.parametrize(
    ("field", "value"),
    [
        ("max_output_chars", -1),
        ("max_output_chars", 0),
        ("max_units", 0),
        ("max_units", True),
        ("timeout_s", "30"),
        ("memory_gb", 0),
        ("t1_s", float("nan")),
        ("serial_fraction", 1.5),
        ("default_language", "cobol"),
        ("tangram_url", "localhost:8765"),
        ("image", ""),
        ("reward_command", ""),
        ("token", 5),
    ],
    ids=repr,
)
def test_a_tool_config_that_could_not_serve_a_call_is_refused_at_load(
    field: str, value: Any
) -> None:
    """The tool's yaml was taken as given: a negative ``max_output_chars`` cut the last
    characters of every answer without a word (``text[:-1]``), and a bad ``max_units`` or
    ``timeout_s`` failed every call mid-rollout, after its container was opened. The tool
    now refuses such a config when verl loads it, naming the setting."""
    from tangram.exec.integrations.verl_tool import TangramSandboxTool

    with pytest.raises(ValueError, match=field):
        TangramSandboxTool({"tangram_url": "http://127.0.0.1:8765", field: value})
