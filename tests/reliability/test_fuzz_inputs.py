"""Bad input never crashes a reader: every record lands as a packet, a tick or a reject with a reason.

Hypothesis plus hand-made cases over router-feed CSV, CSV with a header, JSON lines and captures.
Good records mixed among bad ones are still read exactly.
"""

from __future__ import annotations

import ipaddress
import json

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from tests.support import capture_factory as cf
from traffic.io.capture import parse_capture
from traffic.io.readers import CSV_HEADER, JSON_LINES, ROUTER_FEED, parse_bytes

FUZZ = settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
GOOD = "new,OP_INSERT,1793527200000000,10.0.0.1,192.0.2.1,1000,443,1500"

field = st.one_of(
    st.text(max_size=12),
    st.integers(-2**70, 2**70).map(str),
    st.sampled_from(["", "-1", "65536", "99999999999999999999", "1e5", "0x10", "１２３", "10.0.0.256", "::1",
                     "2001:DB8::1", "fe80::1%eth0", "1.2.3", "nan", "\x00", "\ud7ff", " 5", "4294967336"]),
)
line = st.one_of(
    st.lists(field, min_size=0, max_size=10).map(",".join),
    st.lists(field, min_size=6, max_size=6).map(lambda f: "new,OP_INSERT," + ",".join(f)),
    st.tuples(field, field).map(lambda f: f"new,OP_INSERT,{f[0]},10.0.0.1,192.0.2.1,1,2,{f[1]}"),
)


def _check(table, expected_rows: int | None = None):
    rows = table.to_pylist()
    if expected_rows is not None:
        assert len(rows) == expected_rows, rows
    for row in rows:
        assert row["kind"] in ("packet", "tick", "reject")
        if row["kind"] == "reject":
            assert row["reason"] and len(row["reason"]) > 5, row
        else:
            assert row["ts"] is not None and row["reason"] is None
        if row["kind"] == "packet":
            local, remote = ipaddress.ip_address(row["local_ip"]), ipaddress.ip_address(row["remote_ip"])
            assert str(local) == row["local_ip"] and local.version == remote.version
            assert 0 <= row["bytes"] <= (65535 if local.version == 4 else 4294967335)
            for port in (row["local_port"], row["remote_port"]):
                assert port is None or 0 <= port <= 65535
    return rows


@FUZZ
@given(st.lists(line, max_size=30), st.integers(0, 30))
def test_router_feed_fuzz(lines, good_at):
    lines = [l.replace("\n", " ").replace("\r", " ") for l in lines]
    lines.insert(min(good_at, len(lines)), GOOD)
    data = ("\n".join(lines) + "\n").encode("utf-8", "surrogatepass")
    # One row per non-empty line: nothing dropped, nothing doubled.
    rows = _check(parse_bytes(data, ROUTER_FEED, source="s", input_file="f"), len([l for l in lines if l]))
    good = [r for r in rows if r["kind"] == "packet" and r["bytes"] == 1500 and r["local_ip"] == "10.0.0.1"]
    assert good, "the good record beside the bad ones was lost"


def _text_records(data: bytes) -> int:
    """How many records a text file holds, by the contract (DESIGN §7) rather than the reader's code.

    A byte-order mark at the start of the file is no part of a record. A line that is not UTF-8
    is one record (rejected whole); a UTF-8 line is one record per non-empty piece between line
    breaks (``\\n``, ``\\r\\n`` or a lone ``\\r``, as a CSV reader ends its rows).
    """
    count = 0
    for line in data.removeprefix(b"\xef\xbb\xbf").split(b"\n"):
        try:
            text = line.decode("utf-8")
        except UnicodeDecodeError:
            count += 1
            continue
        count += sum(1 for piece in text.split("\r") if piece)
    return count


def _the_good_line_once(rows, local="10.0.0.1", size=1500) -> None:
    good = [r for r in rows if r["kind"] == "packet" and r["bytes"] == size and r["local_ip"] == local]
    assert len(good) == 1, f"the good record beside the bad ones was not counted exactly once: {good}"


@FUZZ
@given(st.binary(max_size=400))
def test_router_feed_random_bytes(data):
    """Any bytes before a good line: one row per record (nothing dropped, nothing doubled), the good line once."""
    data = data + b"\n" + GOOD.encode() + b"\n"
    rows = _check(parse_bytes(data, ROUTER_FEED, source="s", input_file="f"), _text_records(data))
    _the_good_line_once(rows)


json_value = st.one_of(st.none(), st.booleans(), st.integers(-2**70, 2**70), st.floats(allow_nan=True),
                       st.text(max_size=10), st.lists(st.integers(), max_size=2))


@FUZZ
@given(st.lists(st.dictionaries(st.sampled_from(["ts", "local_ip", "remote_ip", "bytes", "local_port",
                                                  "remote_port", "protocol", "direction", "source", "x"]),
                                 json_value, max_size=9), max_size=15))
def test_json_lines_fuzz(objects):
    lines = [json.dumps(o) for o in objects] + ["{broken", "[1,2]", json.dumps({"ts": 1793527200000000,
                                                                                "local_ip": "10.0.0.1",
                                                                                "remote_ip": "192.0.2.1",
                                                                                "bytes": 64})]
    rows = _check(parse_bytes("\n".join(lines).encode(), JSON_LINES, source="s", input_file="f"), len(lines))
    assert any(r["kind"] == "packet" and r["bytes"] == 64 and r["local_ip"] == "10.0.0.1" for r in rows)


@FUZZ
@given(st.lists(st.lists(field, min_size=0, max_size=6), max_size=15))
def test_csv_with_header_fuzz(records):
    import csv
    import io

    out = io.StringIO()
    writer = csv.writer(out)
    writer.writerow(["ts", "local_ip", "remote_ip", "bytes"])
    for record in records:
        writer.writerow([f.replace("\x00", "") for f in record])
    writer.writerow(["2026-11-01T10:00:00Z", "10.0.0.1", "192.0.2.1", "64"])
    text = out.getvalue()
    # One row per non-blank line after the header: a quoted line break does not continue a record (DESIGN §7,
    # ``parse_csv_header``), so a field holding one costs its lines, never the lines after them.
    rows = _check(parse_bytes(text.encode("utf-8", "surrogatepass"), CSV_HEADER, source="s", input_file="f"),
                  len([line for line in text.split("\n")[1:] if line.strip()]))
    _the_good_line_once(rows, size=64)


@pytest.mark.parametrize("data,reason", [
    (b"", None),
    (b"\n\n\n", None),
    (GOOD.encode() + b"\n" + b"\xff\xfe\xfd\n", "not UTF-8"),
    (b"new,OP_INSERT,999999999999999999999,10.0.0.1,192.0.2.1,1,2,3\n", "not microseconds"),
    (b"new,OP_INSERT,1793527200000000,10.0.0.1,192.0.2.1,1,2,3,4\n", "expected 8 fields"),
    (b"new,OP_INSERT,1793527200000000,10.0.0.1,192.0.2.1,1,2\n", "expected 8 fields"),
    (b"new,OP_INSERT,1793527200000000,10.0.0.1,2001:db8::1,1,2,3\n", "different families"),
    (b"new,OP_INSERT,1793527200000000,10.0.0.1,192.0.2.1,1,2,-3\n", "negative"),
    (b"new,OP_INSERT,1793527200000000,10.0.0.1,192.0.2.1,1,2,65536\n", "more than an IPv4 packet"),
    (b"new,OP_INSERT,1793527200000000,10.0.0.1,192.0.2.1,1,70000,3\n", "not a port"),
    (b"new,OP_INSERT,1793527200000000,not-an-ip,192.0.2.1,1,2,3\n", "not an IPv4 or IPv6"),
])
def test_hand_made_router_feed_cases(data, reason):
    rows = _check(parse_bytes(data, ROUTER_FEED, source="s", input_file="f"))
    if reason is None:
        assert [r for r in rows if r["kind"] != "packet"] == []
    else:
        assert any(r["kind"] == "reject" and reason in r["reason"] for r in rows), rows


@FUZZ
@given(st.binary(max_size=600), st.integers(0, 200))
def test_captures_random_bytes_and_truncations(garbage, cut):
    frames = [cf.Packet(cf.ethernet(cf.ipv4("10.0.0.1", "192.0.2.1", 6, cf.tcp(1, 2, b"x" * 20))), 10**18 + i * 1000)
              for i in range(3)]  # a microsecond apart: each frame is a row of its own
    good = cf.pcap(frames)
    record = 16 + len(frames[0].frame)
    truncated = good[: len(good) - cut]
    whole_frames = max(0, (len(truncated) - 24) // record)
    for data in (garbage, truncated, good + garbage, cf.pcapng(cf.Section([cf.Interface(1)])) + garbage):
        rows = _check(parse_capture(data, source="s", input_file="f", local_networks=["10.0.0.0/8"]))
        file_rejects = [r for r in rows if r["kind"] == "reject" and not (r["record"] or "").startswith("frame")]
        assert len(file_rejects) <= 1, file_rejects  # a corrupt capture: its good packets plus ONE reject
    rows = parse_capture(truncated, source="s", input_file="f", local_networks=["10.0.0.0/8"]).to_pylist()
    assert sum(1 for r in rows if r["kind"] == "packet") == whole_frames
    assert len(rows) == whole_frames + (1 if len(truncated) > 24 + whole_frames * record or len(truncated) < 24 else 0)
    # Garbage after a whole capture costs only itself: the three good frames are each counted once.
    alone = parse_capture(good, source="s", input_file="f", local_networks=["10.0.0.0/8"]).to_pylist()
    assert len(alone) == 3 and all(r["kind"] == "packet" for r in alone), alone
    rows = parse_capture(good + garbage, source="s", input_file="f", local_networks=["10.0.0.0/8"]).to_pylist()
    assert all(rows.count(r) == 1 for r in alone), (alone, rows)


# -- hostile inboxes (issue 20): poison content, hostile names, special files ---------------------

quote_field = st.one_of(field, st.sampled_from(['"', '""', '"a', 'a"', '"1,2"', "\ufeff", "\r"]))


@FUZZ
@given(st.lists(st.lists(quote_field, min_size=0, max_size=5), max_size=15), st.booleans())
def test_csv_with_header_conserves_every_line(records, bom):
    """Stray quotes and byte-order marks: every non-empty line is exactly one row (packet, tick or reject)."""
    lines = [",".join(r).replace("\n", " ").replace("\x00", "") for r in records]
    good = "1793527200000000,10.0.0.1,192.0.2.1,64"
    body = [*lines, good]
    text = ("\ufeff" if bom else "") + "ts,local_ip,remote_ip,bytes\n" + "\n".join(body) + "\n"
    rows = _check(parse_bytes(text.encode("utf-8", "surrogatepass"), CSV_HEADER, source="s", input_file="f"),
                  len([line for line in body if line.strip()]))
    assert any(r["kind"] == "packet" and r["bytes"] == 64 for r in rows)


@FUZZ
@given(st.lists(st.one_of(st.integers(1, 3000).map(lambda d: "[" * d), st.integers(1, 3000).map(
    lambda d: '{"a":' * d), st.just("\ufeff{}"), st.text(max_size=20)), max_size=8))
def test_json_lines_nested_or_marked_conserve_every_line(lines):
    lines = [line.replace("\n", " ").replace("\r", " ") for line in lines]
    good = json.dumps({"ts": 1793527200000000, "local_ip": "10.0.0.1", "remote_ip": "192.0.2.1", "bytes": 64})
    body = [*lines, "\ufeff" + good]
    rows = _check(parse_bytes("\n".join(body).encode("utf-8", "surrogatepass"), JSON_LINES, source="s",
                              input_file="f"), len([line for line in body if line.strip().strip("\ufeff")]))
    assert any(r["kind"] == "packet" and r["bytes"] == 64 for r in rows)


@FUZZ
@given(st.integers(0, 3), st.integers(1, 200_000))
def test_router_feed_overlong_lines_cost_only_themselves(position, length):
    lines = [GOOD] * 3
    lines.insert(position, "new,OP_INSERT," + "9" * length)
    rows = _check(parse_bytes("\n".join(lines).encode(), ROUTER_FEED, source="s", input_file="f"), 4)
    assert sum(r["kind"] == "packet" for r in rows) == 3
    assert all(len(r["reason"]) <= 512 for r in rows if r["kind"] == "reject")


name_text = st.text(st.characters(blacklist_categories=("Cs",), blacklist_characters="/\x00"), min_size=1,
                    max_size=40).filter(lambda n: n not in (".", ".."))
entry_kind = st.sampled_from(["file", "same", "fifo", "link-in", "link-out", "dangling", "dir-link"])


@FUZZ
@given(st.lists(st.tuples(name_text, name_text, entry_kind), max_size=10))
def test_inbox_plans_every_regular_file_once_and_never_opens_anything_else(tmp_path_factory, entries):
    """Hostile names and special entries: each regular file inside the inbox is planned once (counted or a
    recorded duplicate); everything else is skipped with a note, by name, without being opened."""
    import os

    from traffic.io.inbox import ACCOUNTED, DUPLICATE, SKIPPED, Cutting, plan_files, scan
    from traffic.core.records import source_problem

    root = tmp_path_factory.mktemp("hostile")
    inbox, outside = root / "inbox", root / "outside.csv"
    inbox.mkdir()
    outside.write_text(GOOD + "\n")
    regular, other = set(), set()
    for index, (folder, name, kind) in enumerate(entries):
        if folder.startswith((".", "_")) or name.startswith((".", "_")) or \
                name.lower().endswith((".tmp", ".part", ".partial", ".crdownload")):
            continue
        try:
            (inbox / folder).mkdir(exist_ok=True)
        except OSError:  # a name this filesystem refuses
            continue
        if not (inbox / folder).is_dir() or (inbox / folder).is_symlink():
            continue
        path = inbox / folder / f"{name}-{index}"
        relative = f"{folder}/{name}-{index}"
        if kind in ("file", "same"):
            path.write_text(GOOD + f",{index}\n" if kind == "file" else GOOD + "\n")
            (other if source_problem(folder) else regular).add(relative)
        elif kind == "fifo":
            os.mkfifo(path)
            other.add(relative)
        elif kind == "link-in":
            target = inbox / folder / f"target-{index}"
            target.write_text(GOOD + "\n")
            path.symlink_to(target)
            (other if source_problem(folder) else regular).update({relative, f"{folder}/target-{index}"})
        elif kind == "dir-link":
            path.symlink_to(root, target_is_directory=True)
            other.add(relative)
        else:
            path.symlink_to(outside if kind == "link-out" else root / "missing")
            other.add(relative)
    planned = plan_files(scan(inbox), [], Cutting())
    by_name = {f.name: f for f in planned}
    assert len(by_name) == len(planned)  # each entry once
    assert {n for n, f in by_name.items() if f.status in (ACCOUNTED, DUPLICATE)} == regular
    assert {n for n, f in by_name.items() if f.status == SKIPPED} == other
    assert all(f.note for f in planned if f.status == SKIPPED)


# -- an inbox on object storage (issue 38): what its reader and its listing make of any bytes and any key --------

reads = st.lists(st.tuples(st.sampled_from(["seek", "read", "tell"]), st.integers(-5, 3 << 20)), max_size=12)
segment = st.one_of(st.sampled_from(["r1", ".hidden", "_tmp", "a b", "é", "x" * 129, "f.part", "f.TMP", "%41",
                                     "+", "~", "f.csv", "q=1&v"]),
                    st.text(st.characters(min_codepoint=33, max_codepoint=0x2FF, exclude_characters="/\\\x7f"),
                            min_size=1, max_size=10))


@pytest.fixture
def object_inbox(seaweed, monkeypatch):
    seaweed.export(monkeypatch)
    return seaweed


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow,
                                                                  HealthCheck.function_scoped_fixture])
@given(data=st.binary(max_size=3 << 20) | st.just(b""), operations=reads)
def test_an_object_reads_as_its_bytes_whatever_the_seeks(object_inbox, data, operations):
    """Any sequence of seeks and reads through an object's handle gives what the same on its bytes in memory gives."""
    import io
    import uuid

    from tests.support.harness import put_object
    from traffic.io.files import open_regular, size_and_mtime

    url = object_inbox.url(f"fuzz-reads/{uuid.uuid4().hex}")
    put_object(url, data)
    expected = io.BytesIO(data)
    with open_regular(url) as handle:
        assert size_and_mtime(handle)[0] == len(data)
        for operation, number in operations:
            if operation == "seek":
                number = abs(number)
                assert handle.seek(number) == expected.seek(number)
            elif operation == "read":
                number = max(number, -1)  # -1: to the end
                assert handle.read(number) == expected.read(number)
            else:
                assert handle.tell() == expected.tell()


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow,
                                                                  HealthCheck.function_scoped_fixture])
@given(keys=st.lists(st.lists(segment, min_size=1, max_size=3).map("/".join), min_size=1, max_size=8, unique=True))
def test_any_object_key_is_taken_skipped_with_a_reason_or_left_by_the_naming_rules(object_inbox, keys):
    """The listing never fails on a key: each object is taken (under its own key and size), recorded as skipped
    with a reason, or left because a name in it is hidden or still being sent, as a folder's scan would."""
    import uuid

    from tests.support.harness import put_object
    from traffic.core.records import source_problem
    from traffic.io import inbox as inbox_mod

    inbox = object_inbox.url(f"fuzz-keys/{uuid.uuid4().hex}")
    stored = {}
    for number, key in enumerate(keys):
        put_object(f"{inbox}/{key}", b"x" * number)
        stored[key] = number
    found = {f.name: f for f in inbox_mod.scan(inbox)}
    assert set(found) <= set(stored)
    for key, size in stored.items():
        names = key.split("/")
        left = any(n.startswith((".", "_")) for n in names) or names[-1].lower().endswith(
            (".tmp", ".part", ".partial", ".crdownload"))
        if left:
            assert key not in found, key
        elif key in found and found[key].status == inbox_mod.SKIPPED:
            assert found[key].note.startswith("inbox folder") and source_problem(names[0]), key
        else:
            assert found[key].size == size and found[key].path == f"{inbox}/{key}", key
            assert found[key].source == (names[0] if len(names) > 1 else "default")
