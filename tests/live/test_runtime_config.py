"""``RuntimeConfig`` refuses a value that is not what its field asks, naming the field: a
boolean is no count or number of seconds (``max_pending=True`` was an admission bound of 1,
``close_grace_s=True`` a grace of 1 s), a string no number (it was a ``TypeError`` from a
comparison, naming nothing), a flag must be true or false."""

from __future__ import annotations

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
