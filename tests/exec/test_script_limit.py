"""A command and its env's exports are one script, started as its shell's arguments past
100,000 bytes: together they stay under the kernel's ARG_MAX, refused before anything runs
(a 1 MiB command with 16 x 64 KiB of env failed with exit 126 "Argument list too long")."""

from __future__ import annotations

import pytest

from tangram.exec.aoe.environment import MAX_COMMAND_BYTES, MAX_SCRIPT_BYTES, script_problem
from tangram.exec.runtime.errors import BadRequest
from tangram.exec.runtime.records import ActionSpec, CpuWork

BIG_ENV = {f"V{i}": "x" * (64 << 10) for i in range(16)}


def test_the_largest_command_alone_fits() -> None:
    assert script_problem("a" * MAX_COMMAND_BYTES, {}) is None


def test_a_command_and_env_past_the_limit_are_refused_naming_it() -> None:
    why = script_problem("a" * MAX_COMMAND_BYTES, BIG_ENV)
    assert why is not None and str(MAX_SCRIPT_BYTES) in why


def test_a_list_command_counts_as_quoted() -> None:
    # Each ' is quoted as five bytes: 400,000 of them make a 2,000,010-byte script.
    assert script_problem(["test", "-n", "'" * 400_000], {}) is not None


def test_the_service_refuses_it_with_a_400() -> None:
    with pytest.raises(BadRequest, match="limit is"):
        ActionSpec(CpuWork("a" * MAX_COMMAND_BYTES, env=BIG_ENV), trajectory="t")
