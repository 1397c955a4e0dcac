"""``RunCodeSettings`` refuses, naming it, a setting no ``/run_code`` request could be served
with (it was taken as given: a default time limit above the maximum refused every request
that left ``run_timeout`` out, with a 400 blaming that field; a boolean was a number)."""

from __future__ import annotations

from typing import Any

import pytest

from tangram.exec.runtime.errors import BadRequest
from tangram.exec.service.sandbox_fusion import RunCodeSettings, parse_run_code


@pytest.mark.parametrize(
    ("field", "value"),
    [
        ("default_run_timeout_s", 1000.0),
        ("default_compile_timeout_s", 601),
        ("max_run_timeout_s", 0),
        ("memory_gb", True),
        ("memory_gb", 0.001),
        ("compiled_memory_gb", "1"),
        ("queue_allowance_s", -1.0),
        ("queue_allowance_s", float("inf")),
        ("serial_fraction", 2.0),
        ("serial_fraction", True),
        ("image", ""),
    ],
    ids=repr,
)
def test_a_setting_no_request_could_use_is_refused_naming_it(field: str, value: Any) -> None:
    with pytest.raises(ValueError, match=field):
        RunCodeSettings(**{field: value})


def test_the_defaults_serve_a_request_that_gives_no_limits() -> None:
    settings = RunCodeSettings(default_run_timeout_s=30, max_run_timeout_s=60)
    assert parse_run_code({"code": "print(1)"}, settings).run_timeout_s == 30.0
    with pytest.raises(BadRequest, match="run_timeout"):
        parse_run_code({"code": "print(1)", "run_timeout": 61}, settings)
