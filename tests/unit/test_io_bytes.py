"""traffic.io.bytes: fields gathered at many positions, and the hex excerpts rejects quote."""

from __future__ import annotations

import numpy as np
import pyarrow as pa

from traffic.io.bytes import EXCERPT_BYTES, gather, hex_excerpt, hex_excerpts

BUF = np.arange(10, dtype=np.uint8)


def test_gather_reads_width_bytes_at_each_position():
    got = gather(BUF, np.array([0, 3, 6]), 4)
    assert got.tolist() == [[0, 1, 2, 3], [3, 4, 5, 6], [6, 7, 8, 9]]
    assert got.flags.c_contiguous and got.dtype == np.uint8


def test_gather_reads_zeros_past_the_end_at_any_distance():
    got = gather(BUF, np.array([8, 10, 25]), 4)
    assert got.tolist() == [[8, 9, 0, 0], [0, 0, 0, 0], [0, 0, 0, 0]]


def test_gather_clamps_negative_positions_to_the_start():
    # numpy's own indexing would read -2 from the end of the buffer: [8, 9, ...]
    assert gather(BUF, np.array([-2]), 3).tolist() == [[0, 1, 2]]


def test_gather_from_a_buffer_shorter_than_the_width():
    assert gather(np.array([7, 8], np.uint8), np.array([0, 1]), 4).tolist() == [[7, 8, 0, 0], [8, 0, 0, 0]]
    assert gather(np.zeros(0, np.uint8), np.array([0]), 2).tolist() == [[0, 0]]


def test_gathered_rows_are_a_copy_the_caller_may_change():
    got = gather(BUF, np.array([0, 9]), 2)
    got[:] = 255
    assert BUF.tolist() == list(range(10))


def test_hex_excerpt_shows_the_available_bytes():
    assert hex_excerpt(b"\x00\xab\xff\x10", 1, 2) == "abff"
    assert hex_excerpt(b"\x00\xab", 1, 50) == "ab"  # never past the data
    assert hex_excerpt(b"\x01", 5, 3) == ""


def test_hex_excerpt_cuts_at_64_bytes_with_an_ellipsis():
    data = bytes(range(100))
    assert EXCERPT_BYTES == 64
    assert hex_excerpt(data, 0, 64) == data[:64].hex()
    assert hex_excerpt(data, 0, 65) == data[:64].hex() + "…"
    assert hex_excerpt(data, 10, 90) == data[10:74].hex() + "…"


def test_hex_excerpts_gives_shown_bytes_per_position():
    data = bytes(range(200))
    buf = np.frombuffer(data, np.uint8)
    pos = np.array([0, 100, 190])
    shown = np.array([64, 3, 10])
    got = hex_excerpts(buf, pos, shown)
    assert got.type == pa.string()
    assert got.to_pylist() == [data[:64].hex(), data[100:103].hex(), data[190:200].hex()]


def test_hex_excerpts_all_full_and_with_every_nibble():
    data = bytes(range(256))
    buf = np.frombuffer(data, np.uint8)
    pos = np.arange(0, 256, 64)
    got = hex_excerpts(buf, pos, np.full(len(pos), 64))
    assert got.to_pylist() == [data[p : p + 64].hex() for p in pos]


def test_hex_excerpts_of_nothing():
    got = hex_excerpts(BUF, np.array([3]), np.array([0]))
    assert got.to_pylist() == [""]
    assert hex_excerpts(BUF, np.zeros(0, np.int64), np.zeros(0, np.int64)).to_pylist() == []
