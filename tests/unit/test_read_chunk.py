"""Chunks of a text file: every line in exactly one chunk, starting at the first byte still to count."""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st

from traffic.ingest import read_chunk


@settings(max_examples=200, deadline=None)
@given(lines=st.lists(st.text(alphabet="abc,0123", min_size=0, max_size=12), min_size=1, max_size=30),
       split=st.integers(1, 40), counted=st.integers(0, 30))
def test_chunks_cover_each_line_exactly_once(tmp_path_factory, lines, split, counted):
    path = tmp_path_factory.mktemp("chunks") / "f.csv"
    data = "".join(line + "\n" for line in lines).encode()
    path.write_bytes(data)
    # Start where an earlier batch stopped: always at a line boundary (the end of a counted prefix).
    start = len("".join(line + "\n" for line in lines[: min(counted, len(lines))]).encode())
    pieces = []
    offset = start
    while offset < len(data):
        pieces.append(read_chunk(str(path), offset, min(len(data), offset + split), start))
        offset += split
    assert b"".join(pieces) == data[start:]
