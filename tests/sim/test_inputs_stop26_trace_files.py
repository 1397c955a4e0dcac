"""Trace files that cannot be read fail with one TraceError naming the file (and the line
where it is known), never an EOFError, a BadGzipFile or an unlocated decode error."""

import gzip

import pytest

from tangram.trace import load_trace
from tangram.trace.errors import TraceError

HEADER = b'{"tangram_trace":1}\n'
ROW = (
    b'{"action_id":"a0","trajectory":"t0","step":0,"position":0,"task":"coding","kind":"env",'
    b'"gen_before_s":0.1,"resource":"cpu","t1_s":1.0,"max_units":4}\n'
)
#: Lines the reader skips: a body long enough to cut or corrupt mid-stream.
BLANK = b"\n" * 5000


def test_a_truncated_gzip_trace_names_the_file(tmp_path):
    path = tmp_path / "cut.jsonl.gz"
    path.write_bytes(gzip.compress(HEADER + BLANK)[:-12])
    with pytest.raises(TraceError, match=rf"{path}: cannot read the gzip file"):
        load_trace(path)


def test_a_file_that_is_not_gzip_names_the_file(tmp_path):
    path = tmp_path / "plain.jsonl.gz"
    path.write_bytes(HEADER)
    with pytest.raises(TraceError, match=rf"{path}: cannot read the gzip file: Not a gzipped"):
        load_trace(path)


def test_corrupt_gzip_data_names_the_file(tmp_path):
    data = bytearray(gzip.compress(HEADER + BLANK))
    data[20:30] = b"\xff" * 10
    path = tmp_path / "bad.jsonl.gz"
    path.write_bytes(bytes(data))
    with pytest.raises(TraceError, match=rf"{path}: cannot read the gzip file"):
        load_trace(path)


def test_a_directory_named_like_a_trace_names_it(tmp_path):
    path = tmp_path / "dir.jsonl"
    path.mkdir()
    with pytest.raises(TraceError, match=rf"{path}: cannot read the file: Is a directory"):
        load_trace(path)


def test_invalid_utf8_names_the_file_and_the_line(tmp_path):
    path = tmp_path / "bytes.jsonl"
    path.write_bytes(HEADER + b'{"action_id":"\xff"}\n')
    with pytest.raises(TraceError, match=rf"{path}, line 2: not valid UTF-8"):
        load_trace(path)


def test_windows_line_endings_still_read(tmp_path):
    # A guard, not a bug: lines are now split as bytes, and CRLF must keep working.
    path = tmp_path / "crlf.jsonl"
    path.write_bytes((HEADER + ROW).replace(b"\n", b"\r\n"))
    assert len(load_trace(path)) == 1
