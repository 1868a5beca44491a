"""Pieces of a file: every line in exactly one piece, starting at the first byte still to count."""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st

from traffic.io.files import read_piece
from traffic.io.inbox import Cutting, InboxFile, survey


@settings(max_examples=200, deadline=None)
@given(lines=st.lists(st.text(alphabet="abc,0123", min_size=0, max_size=12), min_size=1, max_size=30),
       split=st.integers(1, 40), counted=st.integers(0, 30), tail=st.text(alphabet="abc,0123", max_size=5))
def test_pieces_cover_each_line_exactly_once(tmp_path_factory, lines, split, counted, tail):
    path = tmp_path_factory.mktemp("chunks") / "f.csv"
    data = "".join(line + "\n" for line in lines).encode()
    path.write_bytes(data + tail.encode())  # an unterminated last line waits (the file is fresh)
    # Start where an earlier batch stopped: always at a line boundary (the end of a counted prefix).
    start = len("".join(line + "\n" for line in lines[: min(counted, len(lines))]).encode())
    f = InboxFile("r1/f.csv", str(path), "r1", len(data) + len(tail), 0, start=start)
    import traffic.io.inbox as inbox

    real = inbox.piece_bytes
    inbox.piece_bytes = lambda size, split_bytes, parallelism: split  # pieces of `split` bytes before alignment
    try:
        surveyed, _ = survey(f, Cutting(partial_line_grace=3600))
    finally:
        inbox.piece_bytes = real
    assert surveyed.size == len(data)
    pieces = [read_piece(str(path), a, b, digest) for a, b, digest in surveyed.pieces]
    assert b"".join(pieces) == data[start:]
    assert all(piece.endswith(b"\n") for piece in pieces if piece)


MiB = 1024 * 1024


@settings(max_examples=300, deadline=None)
@given(size=st.integers(0, 400 * MiB), split=st.integers(MiB, 128 * MiB), parallelism=st.integers(1, 8))
def test_parse_tasks_are_equal_pieces_no_bigger_than_split_bytes(size, split, parallelism):
    from traffic.io.inbox import MIN_SPLIT_BYTES, piece_bytes

    piece = piece_bytes(size, split, parallelism)
    tasks = -(-size // piece) if size else 0
    assert piece <= max(split, 1)
    assert tasks >= -(-size // split)  # never fewer tasks than split_bytes asks for
    if size >= parallelism * MIN_SPLIT_BYTES:
        assert tasks >= parallelism  # a file worth spreading keeps every core busy
    if tasks > 1:
        assert piece >= min(MIN_SPLIT_BYTES, split) or tasks == -(-size // split)
        assert size - (tasks - 1) * piece > 0  # no empty task at the end


def test_a_file_just_over_split_bytes_is_not_one_task_and_a_sliver():
    from traffic.io.inbox import piece_bytes

    size = 69 * 1000 * 1000  # the 1 M-packet bench feed against the 64 MiB default
    piece = piece_bytes(size, 64 * MiB, 4)
    assert -(-size // piece) == 4 and piece == -(-size // 4)
    assert piece_bytes(3 * MiB, 64 * MiB, 4) == 3 * MiB  # small files stay whole
    # The 10 M bench feed: 11 pieces of 64 MiB would leave one core idle for the last round; 12 do not.
    big = 690 * 1000 * 1000
    assert -(-big // piece_bytes(big, 64 * MiB, 4)) == 12


def test_a_capture_and_an_appended_capture_tail_are_split_into_one_range_per_core(tmp_path):
    from traffic.io.inbox import MIN_SPLIT_BYTES

    header = bytes.fromhex("d4c3b2a1") + bytes(20)
    files = {"big.pcap": header + bytes(3 * MIN_SPLIT_BYTES), "small.pcap": header + bytes(1000), "empty.pcap": b""}
    ranges = {}
    how = Cutting(split_bytes=64 * MiB, parallelism=3, slots=3)
    for name, data in files.items():
        (tmp_path / name).write_bytes(data)
        surveyed, _ = survey(InboxFile(name, str(tmp_path / name), "tap", len(data), 0), how)
        assert surveyed.format == "capture"
        ranges[name] = [(a, b) for a, b, _ in surveyed.pieces]
    grown, _ = survey(InboxFile("grown.pcap", str(tmp_path / "big.pcap"), "tap", len(files["big.pcap"]), 0,
                                start=100), how)
    size = len(files["big.pcap"])
    assert ranges["big.pcap"] == [(0, size // 3), (size // 3, 2 * size // 3), (2 * size // 3, size)]
    assert ranges["small.pcap"] == [(0, 1024)] and ranges["empty.pcap"] == [(0, 0)]
    tail = size - 100
    assert [(a, b) for a, b, _ in grown.pieces] == [(100 + tail * i // 3, 100 + tail * (i + 1) // 3) for i in range(3)]


def test_task_slots_follow_the_local_master_and_fall_back_to_shuffle_partitions():
    import os

    from traffic.runtime.spark import task_slots
    from traffic.core.settings import load_settings

    def slots(master: str) -> int:
        return task_slots(load_settings(environ={}, overrides={"spark_master": master, "shuffle_partitions": 6}))

    assert (slots("auto"), slots("local[2]"), slots("local[3,2]"), slots("local[*]")) == (2, 2, 3, os.cpu_count())
    assert slots("sc://127.0.0.1:15002") == slots("spark://cluster:7077") == 6
