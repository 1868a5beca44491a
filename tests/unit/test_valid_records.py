"""One definition of a valid packet row: what a reader accepts is what the suites accept, or it is rejected."""

from __future__ import annotations

import json

import pytest

from tests.support import capture_factory as cf
from traffic.quality import suite_documents as quality
from traffic.core import records
from traffic.io.capture import parse_capture
from traffic.io.readers import CSV_HEADER, JSON_LINES, ROUTER_FEED, parse_bytes

TS = 1_793_527_200_000_000  # 2026-11-01T10:00Z
MARKER = '"><svg onload=alert(1)>'
ZONE = "has a zone id (the part after %): an address is accounted without one"


def _rows(text: str, fmt: str) -> list[dict]:
    return parse_bytes(text.encode(), fmt, source="s", input_file="f").to_pylist()


def _json(**fields) -> str:
    return json.dumps({"ts": TS, "local_ip": "10.0.0.1", "remote_ip": "192.0.2.1", "bytes": 64, **fields})


def _judged(rows: list[dict]) -> list[tuple]:
    return [(r["kind"], r["local_ip"], r["remote_ip"], r["bytes"], r["direction"], r["reason"]) for r in rows]


# -- directions ------------------------------------------------------------------------------------

@pytest.mark.parametrize("fmt,text", [
    (JSON_LINES, _json(direction="transit")),
    (CSV_HEADER, f"ts,local_ip,remote_ip,bytes,direction\n{TS},10.0.0.1,192.0.2.1,64,transit\n"),
])
def test_transit_is_rejected_at_read_time_with_its_reason(fmt, text):
    """Accepted, one such record failed its whole hour (the packets suite allows in/out/internal/unknown)."""
    assert _judged(_rows(text, fmt)) == [
        ("reject", None, None, None, None, "direction 'transit' is not in/out/internal (or empty: unknown)")]


def test_the_stored_directions_and_unknown_are_accepted():
    lines = [_json(direction=d) for d in records.DIRECTIONS] + [_json(), _json(direction=None), _json(direction="")]
    assert [(r["kind"], r["direction"]) for r in _rows("\n".join(lines), JSON_LINES)] == \
        [("packet", d) for d in records.DIRECTIONS] + [("packet", None)] * 3


# -- addresses ---------------------------------------------------------------------------------------

@pytest.mark.parametrize("address", ["fe80::1%eth0", "fe80::1%" + MARKER, "fe80::1%'x'", "fe80::1%25"])
def test_an_address_with_a_zone_id_is_rejected_in_every_text_format(address):
    """Python's ``ipaddress`` takes any text after ``%``; stored, it failed "local_ip is canonical"."""
    feed = _rows(f"new,OP_INSERT,{TS},{address},fe80::2,1,2,64\n", ROUTER_FEED)
    lines = _rows(_json(local_ip="fe80::2", remote_ip=address), JSON_LINES)
    assert _judged(feed) == [("reject", None, None, None, None, f"local_ip '{address}' {ZONE}")]
    assert _judged(lines) == [("reject", None, None, None, None, f"remote_ip '{address}' {ZONE}")]


def test_an_ipv4_mapped_address_is_stored_as_ipv4_and_held_to_the_ipv4_bound():
    """Stored as IPv6 it escaped the 65,535-byte bound and matched no IPv4 account."""
    lines = [_json(local_ip="::ffff:10.0.0.5", bytes=1500),
             _json(local_ip="::ffff:10.0.0.5", bytes=70_000),
             _json(local_ip="::ffff:10.0.0.5", remote_ip="2001:db8::1"),
             _json(local_ip="::FFFF:0A00:0005", remote_ip="::ffff:192.0.2.1")]
    assert _judged(_rows("\n".join(lines), JSON_LINES)) == [
        ("packet", "10.0.0.5", "192.0.2.1", 1500, None, None),
        ("reject", None, None, None, None, "byte count 70000 is more than an IPv4 packet can carry (65535)"),
        ("reject", None, None, None, None, "local_ip and remote_ip are of different families (IPv4 and IPv6)"),
        ("packet", "10.0.0.5", "192.0.2.1", 64, None, None),
    ]
    feed = _rows(f"new,OP_INSERT,{TS},::ffff:10.0.0.5,192.0.2.1,1,2,70000\n"
                 f"new,OP_INSERT,{TS},::ffff:10.0.0.5,192.0.2.1,1,2,65535\n", ROUTER_FEED)
    assert _judged(feed) == [
        ("reject", None, None, None, None, "byte count 70000 is more than an IPv4 packet can carry (65535)"),
        ("packet", "10.0.0.5", "192.0.2.1", 65535, None, None),
    ]


@pytest.mark.parametrize("text,stored", [
    ("10.0.0.1", "10.0.0.1"), ("2001:DB8:0:0::1", "2001:db8::1"), ("::ffff:10.0.0.5", "10.0.0.5"),
    ("::ffff:a00:5", "10.0.0.5"), ("::", "::"), ("::1.2.3.4", "::102:304"), ("1:0:0:1:0:0:0:1", "1:0:0:1::1"),
])
def test_canonical_ip_gives_the_stored_form(text, stored):
    assert records.canonical_ip(text) == stored


@pytest.mark.parametrize("text,why", [
    ("fe80::1%eth0", ZONE), ("fe80::1%", "is not an IPv4 or IPv6 address"),
    ("010.0.0.1", "is not an IPv4 or IPv6 address"), ("1.2.3", "is not an IPv4 or IPv6 address"),
    ("", "is not an IPv4 or IPv6 address"), ("10.0.0.1/32", "is not an IPv4 or IPv6 address"),
])
def test_canonical_ip_says_why_a_text_is_no_address(text, why):
    with pytest.raises(ValueError) as refused:
        records.canonical_ip(text)
    assert str(refused.value) == why


GOOD_ROW = {"ts": TS, "source": "s", "local_ip": "10.0.0.1", "remote_ip": "192.0.2.1", "local_port": 1,
            "remote_port": 2, "protocol": 6, "bytes": 64, "direction": "out"}


@pytest.mark.parametrize("change,problem", [
    ({}, None),
    ({"direction": None, "local_port": None, "remote_port": None, "protocol": None}, None),
    ({"local_ip": "2001:db8::1", "remote_ip": "::1", "bytes": records.MAX_BYTES_V6}, None),
    ({"bytes": records.MAX_BYTES_V4_GSO}, None),
    ({"direction": "transit"}, "direction 'transit' is not one of in, out, internal or unknown (null)"),
    ({"local_ip": "::ffff:a00:1"}, "local_ip '::ffff:a00:1' is not in canonical form ('10.0.0.1')"),
    ({"remote_ip": "fe80::1%x"}, f"remote_ip 'fe80::1%x' {ZONE}"),
    ({"remote_ip": "2001:db8::1"}, "local_ip and remote_ip are of different families"),
    ({"bytes": records.MAX_BYTES_V4_GSO + 1}, "bytes 524281 is not in 0-524280"),
    ({"bytes": -1}, "bytes -1 is not in 0-524280"),
    ({"remote_port": 65536}, "remote_port 65536 is not in 0-65535"),
    ({"protocol": 256}, "protocol 256 is not in 0-255"),
    ({"source": None}, "source is missing"),
])
def test_packet_problem_names_the_first_broken_rule(change, problem):
    assert records.packet_problem({**GOOD_ROW, **change}) == problem


# -- captures ------------------------------------------------------------------------------------------

def test_every_row_a_capture_keeps_with_keep_transit_is_one_the_checks_accept():
    """Neither-local packets kept with ``keep_transit`` have direction unknown, no longer ``transit``."""
    packets = [cf.ipv4("8.8.8.8", "1.1.1.1", 17, cf.udp(53, 5353)),
               cf.ipv6("2606:4700::1111", "2001:4860::8888", 17, cf.udp(53, 5353)),
               cf.ipv6("::ffff:192.0.2.7", "::ffff:10.0.0.9", 6, cf.tcp(443, 40000)),
               cf.ipv4("10.0.0.1", "93.184.216.34", 6, cf.tcp(40000, 443))]
    frames = [cf.Packet(cf.ethernet(p, cf.ethertype_of(p)), 1_700_000_000_000_000_000 + i)
              for i, p in enumerate(packets)]
    rows = parse_capture(cf.pcap(frames), source="s", input_file="f", local_networks=["10.0.0.0/8"],
                         keep_transit=True).to_pylist()
    assert [(r["kind"], r["local_ip"], r["direction"]) for r in rows] == [
        ("packet", "8.8.8.8", None), ("packet", "2606:4700::1111", None), ("packet", "10.0.0.9", "in"),
        ("packet", "10.0.0.1", "out")]
    assert [records.packet_problem(r) for r in rows] == [None] * 4


# -- the suites use the same definition --------------------------------------------------------------------

def test_the_suites_name_the_records_definitions_instead_of_copying_them():
    """No suite holds its own copy of a reader rule (a copy is how ``transit`` drifted): it names the
    ``traffic.core.records`` constant, and loading the suite gives the readers' values."""
    named = {}
    for path in sorted(quality.SUITE_DIR.glob("*.json")):
        for item in json.loads(path.read_text())["expectations"]:
            kwargs = item["kwargs"]
            column = kwargs.get("column")
            if column == "direction" or (column in ("local_ip", "remote_ip") and "regex" in kwargs):
                value = kwargs.get("value_set", kwargs.get("regex"))
                assert isinstance(value, dict) and set(value) == {"$records"}, (path.name, item)
                named.setdefault(value["$records"], set()).add(path.stem)
    assert named == {"DIRECTIONS": {"packets", "late_packets", "panes"},
                     "CANONICAL_IP_REGEX": {"late_packets", "hourly", "daily", "monthly"}}
    packets = {(e["type"], e["kwargs"]["column"], e["meta"]["critical"]): e["kwargs"]
               for e in quality.suite_document("packets")["expectations"]}
    assert packets[("expect_column_values_to_be_in_set", "direction", True)]["value_set"] == list(records.DIRECTIONS)
    hourly = quality.suite_document("hourly")["expectations"]
    assert {e["kwargs"]["regex"] for e in hourly if "regex" in e["kwargs"]} == {records.CANONICAL_IP_REGEX}


def test_a_suite_naming_an_unknown_constant_fails_to_load():
    with pytest.raises(KeyError, match="NO_SUCH_RULE"):
        quality._resolve_records({"kwargs": {"value_set": {"$records": "NO_SUCH_RULE"}}}, "test")


# -- Data Docs values ---------------------------------------------------------------------------------------

def test_markup_free_leaves_no_markup_in_any_value_gx_renders():
    result = {"partial_unexpected_list": ["fe80::1%" + MARKER, "a&b", "x\\3c"],
              "partial_unexpected_counts": [{"value": MARKER, "count": 2}],
              "partial_unexpected_index_list": [{"hour": 3, "local_ip": ("<i>", None, 7)}],
              "observed_value": "it's\n", "unexpected_count": 2}
    assert quality.markup_free(result) == {
        "partial_unexpected_list": ["fe80::1%\\x22\\x3e\\x3csvg onload=alert(1)\\x3e", "a\\x26b", "x\\x5c3c"],
        "partial_unexpected_counts": [{"value": "\\x22\\x3e\\x3csvg onload=alert(1)\\x3e", "count": 2}],
        "partial_unexpected_index_list": [{"hour": 3, "local_ip": ("\\x3ci\\x3e", None, 7)}],
        "observed_value": "it\\x27s\\x0a", "unexpected_count": 2}
    assert quality.markup_free("2001:db8::1 ünï 10.0.0.1") == "2001:db8::1 ünï 10.0.0.1"
