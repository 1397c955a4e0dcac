"""Old-Mac line endings ('\\r' only) and a byte-order mark past the file's first line (from
``cat a.jsonl b.jsonl``) were refused as "not valid JSON" with no hint of what the file
holds; the error names the line and says what to convert."""

from __future__ import annotations

import gzip
import json

import pytest

from tangram.trace import TraceError, load_trace, row_to_mapping
from tests.trace.rows import row

HEADER = '{"tangram_trace": 1}'
ROW = '{"trajectory": "a", "step": 0}'
VALID = json.dumps(row_to_mapping(row(), drop_defaults=True))


@pytest.mark.parametrize("suffix", [".jsonl", ".jsonl.gz"])
def test_old_mac_line_endings_are_named(tmp_path, suffix) -> None:
    data = f"{HEADER}\r{ROW}\r".encode()
    path = tmp_path / f"t{suffix}"
    path.write_bytes(gzip.compress(data) if suffix.endswith(".gz") else data)
    with pytest.raises(TraceError) as info:
        load_trace(path)
    message = str(info.value)
    assert "line 1: not valid JSON (Extra data at column 22)" in message
    assert "carriage return ('\\r') at column 21" in message
    assert "old-Mac line endings" in message and "tr '\\r' '\\n'" in message


def test_a_byte_order_mark_past_the_first_line_is_named(tmp_path) -> None:
    bom = b"\xef\xbb\xbf"
    path = tmp_path / "joined.jsonl"
    path.write_bytes(bom + f"{HEADER}\n".encode() + bom + f"{ROW}\n".encode())
    with pytest.raises(TraceError) as info:
        load_trace(path)
    message = str(info.value)
    assert "line 2: not valid JSON" in message
    assert "UTF-8 byte-order mark (U+FEFF) at column 1 of the line" in message
    assert "cat a.jsonl b.jsonl" in message


def test_a_byte_order_mark_mid_line_is_named(tmp_path) -> None:
    path = tmp_path / "joined.jsonl"  # (the first file lacked its last newline)
    path.write_bytes(f"{HEADER}\n{ROW}".encode() + b"\xef\xbb\xbf" + f"{HEADER}\n".encode())
    with pytest.raises(TraceError, match=r"line 2: .*byte-order mark \(U\+FEFF\) at column 31"):
        load_trace(path)


def test_crlf_and_plain_errors_carry_no_hint(tmp_path) -> None:
    path = tmp_path / "t.jsonl"
    path.write_bytes(f"{HEADER}\r\n{VALID}\r\n".encode())
    assert len(load_trace(path).rows) == 1
    path.write_bytes(f"{HEADER}\r\n{{oops\r\n".encode())
    with pytest.raises(TraceError) as info:
        load_trace(path)
    assert "line 2: not valid JSON" in str(info.value)
    assert "carriage" not in str(info.value) and "byte-order" not in str(info.value)
