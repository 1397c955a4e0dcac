"""Files saved in UTF-16 or UTF-32 (a PowerShell redirect writes UTF-16 with a byte-order
mark) are refused naming the encoding and how to convert them: the error said "not valid
UTF-8 (byte 1 of the line)", no hint of what the file is."""

from __future__ import annotations

import gzip

import pytest

from tangram.trace import TraceError, load_trace
from tangram.trace.gpu_calibration import CalibrationError, load_gpu_calibration

HEADER = '{"tangram_trace": 1}\n'


@pytest.mark.parametrize(
    ("encoding", "named"),
    [("utf-16", "UTF-16"), ("utf-16-be", "UTF-16"), ("utf-32", "UTF-32")],
)
@pytest.mark.parametrize("suffix", [".jsonl", ".jsonl.gz"])
def test_a_trace_in_another_encoding_is_named(tmp_path, encoding, named, suffix) -> None:
    data = ("\ufeff" + HEADER).encode(encoding)
    if encoding == "utf-16":  # (Python's utf-16 writes its own mark: the native order)
        data = HEADER.encode(encoding)
    path = tmp_path / f"t{suffix}"
    path.write_bytes(gzip.compress(data) if suffix.endswith(".gz") else data)
    with pytest.raises(TraceError) as info:
        load_trace(path)
    message = str(info.value)
    assert f"line 1: {named} text (the file opens with a {named} byte-order mark" in message
    assert f"iconv -f {named} -t UTF-8" in message


def test_a_gpu_calibration_in_utf16_is_named(tmp_path) -> None:
    path = tmp_path / "rm.json"
    path.write_bytes('{"service": "rm"}\n'.encode("utf-16"))
    with pytest.raises(CalibrationError, match=r"rm\.json: UTF-16 text \(the file opens"):
        load_gpu_calibration(path)
