"""Every packet row any reader produces is one the contract accepts, whatever it read.

Hypothesis draws records for each text format and IP packets for captures from values near the
contract's edges: zone ids with any text after ``%``, IPv4-mapped IPv6 in every spelling, other
directions, byte counts around each family's bound. A reader may reject any of them; a row it
keeps as a packet must never fail its hour.

The judge is the contract itself, its values written here (DESIGN §6 and §7, the labels of
``expectations/packets.json`` and ``hourly.json``), not ``traffic.core.records``: the readers and
the suites take their bounds from that module, so a wrong bound there would pass all three.
"""

from __future__ import annotations

import csv
import io
import ipaddress
import json

from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st

from tests.support import capture_factory as cf
from traffic.io.capture import parse_capture
from traffic.io.readers import CSV_HEADER, JSON_LINES, ROUTER_FEED, parse_bytes

FUZZ = settings(max_examples=200, deadline=None, suppress_health_check=[HealthCheck.too_slow])
TS = 1_793_527_200_000_000

# -- the contract's values ------------------------------------------------------------------------
#: "local_port / remote_port in 0–65,535", "protocol in 0–255" (critical).
TOP = {"local_port": 65_535, "remote_port": 65_535, "protocol": 255}
#: "bytes per packet ≤ 4,294,967,335 (largest IPv6 jumbogram)": 2**32 − 1 payload bytes + the 40-byte header.
IPV6_MAX_BYTES = 4_294_967_335
#: "IPv4 bytes per packet ≤ 524,280 (largest GSO/BIG TCP super-packet)": 8 × 65,535, a capture's bound.
IPV4_MAX_BYTES_CAPTURE = 524_280
#: "text inputs reject IPv4 > 65,535": the IPv4 total length is 16 bits.
IPV4_MAX_BYTES_TEXT = 65_535
#: "direction in (in, out, internal) or unknown".
DIRECTIONS = {"in", "out", "internal", None}


def _canonical_problem(text) -> str | None:
    """DESIGN §6: "IPv4 dotted quad; IPv6 compressed, lower case" — no zone id, and an IPv4-mapped
    IPv6 address is the IPv4 host it maps (stored as IPv4)."""
    try:
        address = ipaddress.ip_address(text)
    except ValueError:
        return "is not an address"
    if address.version == 6 and (address.scope_id is not None or address.ipv4_mapped is not None):
        return "is not an address as stored (a zone id, or IPv4-mapped)"
    if str(address) != text or text != text.lower():
        return f"is not in canonical form ({address})"
    return None


def contract_problem(row: dict, ipv4_max: int) -> str | None:
    """Why a reader's packet row breaks the contract, or None (each check is one critical expectation)."""
    for name in ("ts", "source", "local_ip", "remote_ip", "bytes"):
        if row[name] is None:
            return f"{name} is missing"
    for name in ("local_ip", "remote_ip"):
        problem = _canonical_problem(row[name])
        if problem:
            return f"{name} {row[name]!r} {problem}"
    v6 = ipaddress.ip_address(row["local_ip"]).version == 6
    if v6 != (ipaddress.ip_address(row["remote_ip"]).version == 6):  # one IP packet, one family
        return "local_ip and remote_ip are of different families"
    for name, top in TOP.items():
        if row[name] is not None and not 0 <= row[name] <= top:
            return f"{name} {row[name]} is not in 0-{top}"
    top = IPV6_MAX_BYTES if v6 else ipv4_max
    if not 0 <= row["bytes"] <= top * (row["packets"] or 1):
        return f"bytes {row['bytes']} is not in 0-{top} per packet"
    if row["direction"] not in DIRECTIONS:
        return f"direction {row['direction']!r} is not in, out, internal or unknown"
    return None

v4 = st.builds(ipaddress.IPv4Address, st.integers(0, 2**32 - 1))
v6 = st.builds(ipaddress.IPv6Address, st.integers(0, 2**128 - 1))
mapped = v4.map(lambda a: ipaddress.IPv6Address(b"\0" * 10 + b"\xff\xff" + a.packed))
address = st.one_of(
    v4.map(str), v6.map(str), v6.map(lambda a: a.exploded.upper()), mapped.map(str), mapped.map(lambda a: a.exploded),
    v4.map(lambda a: f"::ffff:{a}"), v4.map(lambda a: f"::FFFF:{a}"), v4.map(lambda a: f"::{a}"),
    st.tuples(v6, st.text(max_size=12)).map(lambda p: f"{p[0]}%{p[1]}"),
    st.sampled_from(["fe80::1%eth0", "fe80::1%<svg onload=alert(1)>", "fe80::1%", "010.0.0.1", "", "::1", "x"]),
)
direction = st.one_of(st.sampled_from(["in", "out", "internal", "transit", "IN", "", "unknown", " in"]),
                      st.text(max_size=8))
size = st.one_of(st.integers(0, 2**33), st.sampled_from([65_535, 65_536, 70_000, 524_280, 524_281, 4_294_967_335,
                                                          4_294_967_336, 0]))
port = st.one_of(st.none(), st.integers(0, 70_000))
record = st.fixed_dictionaries({"local_ip": address, "remote_ip": address, "bytes": size, "direction": direction,
                                "local_port": port, "remote_port": port, "protocol": st.one_of(st.none(),
                                                                                            st.integers(0, 300))})


#: Every run, whatever Hypothesis draws: an IPv4 pair at the text formats' bound and one byte past it (an
#: off-by-one in the bound is seldom drawn at random: two IPv4 addresses and exactly 65,536 bytes).
AT_THE_BOUND = [{"local_ip": "10.0.0.1", "remote_ip": "192.0.2.1", "bytes": size, "direction": "in", "local_port": 1,
                 "remote_port": 2, "protocol": 6} for size in (65_535, 65_536)]


def _kept_rows_are_valid(table, ipv4_max: int = IPV4_MAX_BYTES_TEXT) -> list[dict]:
    packets = [r for r in table.to_pylist() if r["kind"] == "packet"]
    problems = [(r, contract_problem(r, ipv4_max)) for r in packets if contract_problem(r, ipv4_max) is not None]
    assert problems == [], problems
    return packets


def _field(value) -> str:
    return "" if value is None else str(value).replace(",", " ").replace("\n", " ").replace("\r", " ")


@FUZZ
@given(st.lists(record, min_size=1, max_size=12))
@example(AT_THE_BOUND)
def test_every_json_lines_packet_passes_the_checks(items):
    lines = [json.dumps({"ts": TS, **{k: v for k, v in item.items() if v is not None}}) for item in items]
    _kept_rows_are_valid(parse_bytes("\n".join(lines).encode("utf-8", "surrogatepass"), JSON_LINES, source="s",
                                     input_file="f"))


@FUZZ
@given(st.lists(record, min_size=1, max_size=12))
@example(AT_THE_BOUND)
def test_every_csv_with_header_packet_passes_the_checks(items):
    out = io.StringIO()
    writer = csv.writer(out)
    columns = ["local_ip", "remote_ip", "local_port", "remote_port", "protocol", "bytes", "direction"]
    writer.writerow(["ts", *columns])
    for item in items:
        writer.writerow([TS, *(_field(item[c]).replace("\x00", "") for c in columns)])
    _kept_rows_are_valid(parse_bytes(out.getvalue().encode("utf-8", "surrogatepass"), CSV_HEADER, source="s",
                                     input_file="f"))


@FUZZ
@given(st.lists(record, min_size=1, max_size=12))
@example(AT_THE_BOUND)
def test_every_router_feed_packet_passes_the_checks(items):
    lines = [",".join(["new", "OP_INSERT", str(TS), _field(i["local_ip"]), _field(i["remote_ip"]),
                       _field(i["local_port"]), _field(i["remote_port"]), _field(i["bytes"])]) for i in items]
    data = ("\n".join(lines) + "\n").encode("utf-8", "surrogatepass")
    _kept_rows_are_valid(parse_bytes(data, ROUTER_FEED, source="s", input_file="f"))


ip_packet = st.one_of(
    st.tuples(v4, v4, st.integers(0, 1)).map(
        lambda p: cf.ipv4(str(p[0]), str(p[1]), 6, cf.tcp(1, 2), total_length=0 if p[2] else None)),
    st.tuples(st.one_of(v6, mapped), st.one_of(v6, mapped), st.one_of(st.none(), st.integers(0, 65_535))).map(
        lambda p: cf.ipv6(str(p[0]), str(p[1]), 17, cf.udp(1, 2), payload_length=p[2])),
)


@FUZZ
@given(st.lists(st.tuples(ip_packet, st.one_of(st.none(), st.integers(0, 2**32 - 1))), min_size=1, max_size=8),
       st.lists(st.sampled_from(["10.0.0.0/8", "192.0.0.0/2", "::/1", "2000::/3", "::ffff:0:0/96"]), max_size=3),
       st.booleans())
def test_every_captured_packet_passes_the_checks(packets, local, keep_transit):
    """Including IPv6 packets with IPv4-mapped ends and IPv4 packets whose record claims any wire length."""
    frames = [cf.Packet(cf.ethernet(p, cf.ethertype_of(p)), 1_700_000_000_000_000_000 + i, orig_len=orig)
              for i, (p, orig) in enumerate(packets)]
    rows = _kept_rows_are_valid(parse_capture(cf.pcap(frames), source="s", input_file="f", local_networks=local,
                                              keep_transit=keep_transit), IPV4_MAX_BYTES_CAPTURE)
    assert all(r["bytes"] <= IPV4_MAX_BYTES_CAPTURE for r in rows if ":" not in r["local_ip"])
