"""``RuntimeConfig`` refuses a value that is not what its field asks, naming the field: a
boolean is no count or number of seconds (``max_pending=True`` was an admission bound of 1,
``close_grace_s=True`` a grace of 1 s), a string no number (it was a ``TypeError`` from a
comparison, naming nothing), a flag must be true or false."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from tangram.exec.runtime import RuntimeConfig

COUNTS = ("max_pending", "keep_outcomes", "journal_keep")
SECONDS = (
    "default_timeout_s",
    "default_memory_gb",
    "timeout_grace_s",
    "close_grace_s",
    "keep_outcomes_s",
    "journal_keep_s",
)
FLAGS = ("journal_fsync", "exclusive_cores")


@pytest.mark.parametrize("field", COUNTS + SECONDS)
@pytest.mark.parametrize("value", [True, False, "5", None, [1]], ids=repr)
def test_a_count_or_number_of_another_type_is_refused_naming_the_field(
    field: str, value: Any
) -> None:
    with pytest.raises(ValueError, match=field):
        RuntimeConfig(**{field: value})


@pytest.mark.parametrize("field", FLAGS)
@pytest.mark.parametrize("value", [1, "yes", None], ids=repr)
def test_a_flag_that_is_not_a_boolean_is_refused_naming_the_field(field: str, value: Any) -> None:
    with pytest.raises(ValueError, match=field):
        RuntimeConfig(**{field: value})


def test_good_values_are_kept() -> None:
    config = RuntimeConfig(
        max_pending=3,
        close_grace_s=0,
        timeout_grace_s=2.5,
        keep_outcomes_s=10,
        journal_fsync=True,
        exclusive_cores=False,
    )
    assert config.max_pending == 3 and config.close_grace_s == 0
    assert config.journal_fsync is True


def test_paths_given_as_strings_are_taken_as_paths(tmp_path: Path) -> None:
    """``trace_path`` and ``journal_path`` given as strings (as a caller writes them) failed
    with ``AttributeError: 'str' object has no attribute 'name'``: the trace's in ``Runtime``,
    both together already in ``RuntimeConfig`` (the check that they share no file)."""
    import asyncio

    from tangram.exec.runtime import ActionSpec, ApiExecutor, ApiWork, Runtime
    from tangram.exec.runtime.api import echo
    from tests.live.test_runtime import api_cluster

    config = RuntimeConfig(
        trace_path=str(tmp_path / "t.jsonl"), journal_path=str(tmp_path / "j.sqlite")
    )
    assert config.trace_path == tmp_path / "t.jsonl"
    assert config.journal_path == tmp_path / "j.sqlite"

    async def main() -> bool:
        async with Runtime(api_cluster(), config, api=ApiExecutor({"echo": echo})) as rt:
            return (await rt.run(ActionSpec(ApiWork("echo", 1)))).ok

    assert asyncio.run(main())
    assert (tmp_path / "t.jsonl").exists() and (tmp_path / "j.sqlite").exists()
    with pytest.raises(ValueError, match="trace_path"):
        RuntimeConfig(trace_path=5)  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="journal_path"):
        RuntimeConfig(journal_path="")
