"""``/run_code`` blames the program for the program (issue 16, defect 8), as SandboxFusion does.

A program that prints past the output cap or kills its own container is ``Failed`` with its
``run_result`` (never ``SandboxError``, which SandboxFusion's client retries, running the
program again); a request that cannot run as written is refused with a 400 whose body is
SandboxFusion's answer and Tangram's error document; ``max_units`` gives the run an elastic
curve, so it can get more than one core.
"""

from __future__ import annotations

import base64
import time
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import httpx
import pytest

from tangram.exec.service import Client, ServiceError, sandbox_fusion

pytestmark = pytest.mark.docker

#: The cap of the ``service`` fixture (ServeOptions' default), per stream.
CAP = 1 << 20


def run_code(service: Any, **body: Any) -> httpx.Response:
    return httpx.post(f"{service.url}/run_code", json=body, timeout=120)


def failed(r: httpx.Response, run_status: str) -> dict[str, Any]:
    assert r.status_code == 200, r.text[:300]
    doc = r.json()
    assert doc["status"] == "Failed", doc
    assert doc["run_result"] is not None and doc["run_result"]["status"] == run_status, doc
    return doc


def test_output_over_the_cap_is_the_programs_failure(service: Any) -> None:
    r = run_code(service, code="import sys\nsys.stdout.write('x' * 5_000_000)\n")
    doc = failed(r, "Error")
    assert "output too large" in doc["message"], doc["message"]
    assert 0 < len(doc["run_result"]["stdout"]) <= CAP
    assert not service.runtime.trajectories(), "the run's container was left open"


def test_a_program_that_kills_its_container_is_the_programs_failure(service: Any) -> None:
    r = run_code(service, code="kill -9 -1; sleep 5", language="bash", run_timeout=20)
    doc = failed(r, "Error")
    assert doc["message"], doc
    assert not service.runtime.trajectories(), "the run's container was left open"
    with Client(service.url) as c:
        assert c.run_code("print(6 * 7)")["run_result"]["stdout"] == "42\n"  # still serves


@pytest.mark.parametrize(
    ("body", "field"),
    [
        ({"code": "print(1)", "memory_limit_MB": 10**7}, "memory_limit_MB"),
        ({"code": "IDENTIFICATION DIVISION.", "language": "cobol"}, "language"),
        ({"code": "print(1)", "run_timeout": -1}, "run_timeout"),
        ({"code": 5}, "code"),
    ],
    ids=lambda v: str(v)[:40],
)
def test_a_request_that_cannot_run_answers_in_both_shapes(
    service: Any, body: dict[str, Any], field: str
) -> None:
    r = run_code(service, **body)
    assert r.status_code == 400, r.text[:300]
    doc = r.json()
    assert doc["status"] == "SandboxError" and field in doc["message"], doc  # SandboxFusion's
    assert doc["run_result"] is None and doc["compile_result"] is None and doc["files"] == {}
    assert doc["error"]["code"] == "bad_request" and field in doc["error"]["message"]  # Tangram's
    with Client(service.url) as c, pytest.raises(ServiceError) as info:
        c.run_code(**body)
    assert info.value.status == 400 and info.value.code == "bad_request"
    assert not service.runtime.trajectories(), "a refused request opened a container"


def test_max_units_gives_the_run_more_than_one_core(service: Any) -> None:
    code = "import os\nprint(os.environ['TANGRAM_CORES'])"
    one = run_code(service, code=code).json()
    assert one["status"] == "Success" and one["run_result"]["stdout"] == "1\n", one
    two = run_code(service, code=code, max_units=2).json()
    assert two["status"] == "Success" and two["run_result"]["stdout"] == "2\n", two


# -- stop 26's hunt: what a program, a request and another client can and cannot do -----------


def test_a_program_that_exits_124_itself_finished(service: Any) -> None:
    """124 is ``timeout``'s code when the limit fires, and also any program's to use: only a
    run that lasted the limit was stopped by it."""
    for body in (
        {"code": "import sys; sys.exit(124)", "run_timeout": 10},
        {"code": "int main(){return 124;}", "language": "c", "run_timeout": 10},
    ):
        doc = failed(run_code(service, **body), "Finished")
        assert doc["run_result"]["return_code"] == 124, doc


def test_file_names_that_look_like_options_are_written_and_read_back(service: Any) -> None:
    files = {"-n/x.txt": b64(b"in"), "--help": b64(b"help?")}
    code = "open('-d', 'w').write('X'); open('--out', 'w').write(open('-n/x.txt').read() * 2)"
    r = run_code(service, code=code, files=files, fetch_files=["-d", "--out", "--help"])
    doc = r.json()
    assert doc["status"] == "Success", doc
    assert doc["files"] == {"-d": b64(b"X"), "--out": b64(b"inin"), "--help": b64(b"help?")}


@pytest.mark.parametrize(
    ("files", "needle"),
    [
        ({".": "aGk="}, "working directory"),
        ({"a/..": "aGk="}, "working directory"),
        ({"a": "aGk=", "a/b": "aGk="}, "also a directory"),
        ({"x": "aGk=", "./x": "aGk="}, "same file"),
    ],
    ids=["dot", "dot-dot-back", "file-and-dir", "two-names"],
)
def test_files_that_cannot_all_be_written_are_refused(
    service: Any, files: dict[str, str], needle: str
) -> None:
    r = run_code(service, code="print(1)", files=files)
    assert r.status_code == 400 and needle in r.json()["message"], r.text[:300]
    assert r.json()["status"] == "SandboxError"


def test_dot_dot_inside_a_name_is_a_plain_name(service: Any) -> None:
    code = "open('..out', 'w').write(open('..data').read())"
    doc = run_code(service, code=code, files={"..data": b64(b"ok")}, fetch_files=["..out"]).json()
    assert doc["status"] == "Success" and doc["files"] == {"..out": b64(b"ok")}, doc


def test_a_failed_upload_is_the_sandboxs_failure_not_the_programs(
    service: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The last upload shares the compile's or run's container round trip; when it fails,
    the program never ran: SandboxError (it was ``Failed`` with the shell's message as the
    program's stderr). The failure here: a write the sandbox refuses."""
    real = sandbox_fusion._upload_commands

    def failing(files: dict[str, bytes]) -> list[str]:
        commands = real(files)
        return [*commands[:-1], commands[-1] + " && printf x > /proc/version"]

    monkeypatch.setattr(sandbox_fusion, "_upload_commands", failing)
    for language, code in (
        ("python", "print('ran')"),
        ("c", '#include <stdio.h>\nint main(){puts("ran");}'),
    ):
        doc = run_code(service, code=code, language=language).json()
        assert doc["status"] == "SandboxError", doc
        assert "writing the files failed" in doc["message"] and "/proc/version" in doc["message"]
        assert doc["run_result"] is None and doc["compile_result"] is None


def test_a_name_too_long_for_the_filesystem_is_refused(service: Any) -> None:
    for field, value in (("files", {"a" * 256: "aGk="}), ("fetch_files", ["d/" + "b" * 300])):
        r = run_code(service, code="print(1)", **{field: value})
        assert r.status_code == 400 and "too long" in r.json()["message"], r.text[:300]


def test_a_large_fetched_file_comes_back_whole(service: Any) -> None:
    size = 3 * (1 << 20) + 7  # past one action's 1 MiB output cap, not a multiple of 3
    code = (
        f"open('big.bin', 'wb').write(bytes(i % 251 for i in range({size})))\n"
        "open('empty', 'w').close(); open('one', 'w').write('1')"
    )
    fetch = ["big.bin", "empty", "one"]
    doc = run_code(service, code=code, fetch_files=fetch, run_timeout=30).json()
    assert doc["status"] == "Success", doc["message"]
    data = base64.b64decode(doc["files"]["big.bin"])
    assert data == bytes(i % 251 for i in range(size))
    assert doc["files"]["empty"] == "" and doc["files"]["one"] == b64(b"1")


def test_another_client_cannot_see_close_or_use_a_run_code_container(service: Any) -> None:
    """Client B listed A's run's trajectory and closed it: A's answer was lost (a 404
    SandboxError, which SandboxFusion's client retries: the program ran twice)."""
    with ThreadPoolExecutor(1) as pool:
        running = pool.submit(
            run_code, service, code="import time; time.sleep(3); print('ran')", run_timeout=20
        )
        deadline = time.monotonic() + 20
        while not service.runtime.trajectories() and time.monotonic() < deadline:
            time.sleep(0.05)
        [traj] = [t.id for t in service.runtime.trajectories()]
        with Client(service.url) as c:
            assert traj not in {t["id"] for t in c.trajectories()}
            assert httpx.get(f"{service.url}/v1/trajectories/{traj}").status_code == 404
            for call in (
                lambda: c.close_trajectory(traj),
                lambda: c.recreate_trajectory(traj),
                lambda: c.submit(command="echo intruder", trajectory=traj),
            ):
                with pytest.raises(ServiceError) as info:
                    call()
                assert info.value.status == 404, info.value
        doc = running.result(timeout=60).json()
    assert doc["status"] == "Success" and doc["run_result"]["stdout"] == "ran\n", doc


def test_an_oversized_body_answers_in_both_shapes(service: Any) -> None:
    body = b'{"code": "' + b"x" * (65 << 20) + b'"}'
    r = httpx.post(
        f"{service.url}/run_code",
        content=body,
        headers={"Content-Type": "application/json"},
        timeout=120,
    )
    assert r.status_code == 413
    doc = r.json()
    assert doc["status"] == "SandboxError" and doc["run_result"] is None, doc
    assert doc["error"]["code"] == "http_413", doc


def b64(data: bytes) -> str:
    return base64.b64encode(data).decode()


def test_a_file_whose_content_is_null_is_skipped_as_sandbox_fusion_does(service: Any) -> None:
    """SandboxFusion's ``files`` is ``Dict[str, Optional[str]]`` and it skips an entry whose
    content is null (``restore_files``); it was refused with a 400 here."""
    code = "import os; print(os.path.exists('skip.txt'), open('keep.txt').read())"
    r = run_code(service, code=code, files={"skip.txt": None, "keep.txt": b64(b"kept")})
    assert r.status_code == 200, r.text[:300]
    doc = r.json()
    assert doc["status"] == "Success" and doc["run_result"]["stdout"] == "False kept\n", doc


def test_fetched_files_are_keyed_by_the_paths_as_asked(
    service: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    """SandboxFusion answers ``files[filename]`` with each name as the request wrote it; the
    answer's keys were the normalised paths ('./out.txt' came back as 'out.txt'). A file
    asked under two names counts against the answer's bound under each."""
    code = "import os; os.makedirs('d', exist_ok=True); open('d/out.txt', 'w').write('hi')"
    asked = ["./d/out.txt", "d//out.txt", "d/out.txt"]
    doc = run_code(service, code=code, fetch_files=asked).json()
    assert doc["status"] == "Success", doc
    assert doc["files"] == dict.fromkeys(asked, b64(b"hi")), doc
    monkeypatch.setattr(sandbox_fusion, "MAX_FETCH_BYTES", 3)
    doc = run_code(service, code=code, fetch_files=asked[:2]).json()
    assert doc["files"] == {asked[0]: b64(b"hi")}, doc
    assert f"{asked[1]!r} (2 bytes) was not returned" in doc["message"], doc
