"""``/run_code`` blames the program for the program (issue 16, defect 8), as SandboxFusion does.

A program that prints past the output cap or kills its own container is ``Failed`` with its
``run_result`` (never ``SandboxError``, which SandboxFusion's client retries, running the
program again); a request that cannot run as written is refused with a 400 whose body is
SandboxFusion's answer and Tangram's error document; ``max_units`` gives the run an elastic
curve, so it can get more than one core.
"""

from __future__ import annotations

from typing import Any

import httpx
import pytest

from tangram.exec.service import Client, ServiceError

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
    with Client(service.url) as c:
        assert not c.trajectories(), "the run's container was left open"


def test_a_program_that_kills_its_container_is_the_programs_failure(service: Any) -> None:
    r = run_code(service, code="kill -9 -1; sleep 5", language="bash", run_timeout=20)
    doc = failed(r, "Error")
    assert doc["message"], doc
    with Client(service.url) as c:
        assert not c.trajectories(), "the run's container was left open"
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
    with Client(service.url) as c:
        assert not c.trajectories(), "a refused request opened a container"


def test_max_units_gives_the_run_more_than_one_core(service: Any) -> None:
    code = "import os\nprint(os.environ['TANGRAM_CORES'])"
    one = run_code(service, code=code).json()
    assert one["status"] == "Success" and one["run_result"]["stdout"] == "1\n", one
    two = run_code(service, code=code, max_units=2).json()
    assert two["status"] == "Success" and two["run_result"]["stdout"] == "2\n", two
