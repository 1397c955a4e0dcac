"""GPU call inputs over HTTP are bounded before they are converted (stop 26's hunt): one
client's oversized batch took a CPU-backed service down for every client."""

from __future__ import annotations

import pytest
import torch

from tangram.exec.runtime.errors import BadRequest
from tangram.exec.service.codec import MAX_INPUT_NUMBERS, decode_inputs


def test_inputs_past_the_bound_are_refused_naming_the_field() -> None:
    rows = MAX_INPUT_NUMBERS // 256 + 1
    for inputs in ([[0] * 256] * rows, {"input_ids": [[0] * 256] * rows, "mode": "x"}):
        with pytest.raises(BadRequest, match="'inputs'.*1,048,576"):
            decode_inputs(inputs)


def test_inputs_at_the_bound_are_tensors_and_other_members_stay() -> None:
    ids = [[1] * 256] * (MAX_INPUT_NUMBERS // 256)
    got = decode_inputs({"input_ids": ids, "mode": "x"})
    assert got["input_ids"].shape == (MAX_INPUT_NUMBERS // 256, 256) and got["mode"] == "x"
    assert got["input_ids"].dtype == torch.long


@pytest.mark.parametrize("leaf", [1, 1.0])
def test_inputs_nested_too_deep_are_refused_naming_the_field(leaf: float) -> None:
    # (the float check recursed into them: a RecursionError, an HTTP 500 and a failed Ray
    # call instead of a bad request)
    deep: object = leaf
    for _ in range(3000):
        deep = [deep]
    for inputs in (deep, {"input_ids": deep}):
        with pytest.raises(BadRequest, match="'inputs'"):
            decode_inputs(inputs)
