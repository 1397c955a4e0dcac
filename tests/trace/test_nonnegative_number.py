"""The one rule for a seconds-or-size field of an outside record: a finite real >= 0, not a bool."""

from __future__ import annotations

import math
from fractions import Fraction

import pytest
from hypothesis import given
from hypothesis import strategies as st

from tangram.trace import is_nonnegative_number


@given(st.floats(allow_nan=True, allow_infinity=True) | st.integers())
def test_a_number_is_accepted_exactly_when_finite_and_not_negative(value: float) -> None:
    assert is_nonnegative_number(value) == (math.isfinite(value) and value >= 0)


@pytest.mark.parametrize("value", [True, False, "1", None, [1], {"s": 1}, complex(1, 0)])
def test_what_is_not_a_real_number_is_refused(value: object) -> None:
    assert not is_nonnegative_number(value)


def test_other_reals_count_as_numbers() -> None:
    assert is_nonnegative_number(Fraction(1, 3)) and not is_nonnegative_number(Fraction(-1, 3))


def test_an_integer_past_floats_range_is_refused_not_raised() -> None:
    assert not is_nonnegative_number(10**400) and not is_nonnegative_number(-(10**400))
