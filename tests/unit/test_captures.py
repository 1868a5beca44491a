"""The capture reader: every link type, IP oddity, orientation rule and broken file, whole results."""

from __future__ import annotations

import random
from datetime import datetime, timedelta, timezone

import pyarrow as pa
import pytest

from tests.support import capture_factory as cf
from traffic.io.capture import is_capture, parse_capture
from traffic.core.records import PARSED_SCHEMA

SOURCE = "edge"
FILE = "inbox/edge/sample.pcap"
LOCAL = ["10.0.0.0/8", "2001:db8::/32"]
T0_NS = 1_700_000_000 * 1_000_000_000  # 2023-11-14T22:13:20Z
T0_US = T0_NS // 1000


def parse(data: bytes, local=LOCAL, keep_transit: bool = False) -> list[dict]:
    table = parse_capture(
        data, source=SOURCE, input_file=FILE, local_networks=local, keep_transit=keep_transit
    )
    assert table.schema == PARSED_SCHEMA
    return table.to_pylist()


def at(us: int) -> datetime:
    return datetime(1970, 1, 1, tzinfo=timezone.utc) + timedelta(microseconds=us)


def packet(us, local_ip, remote_ip, local_port, remote_port, protocol, size, direction) -> dict:
    return {
        "kind": "packet",
        "ts": at(us),
        "source": SOURCE,
        "local_ip": local_ip,
        "remote_ip": remote_ip,
        "local_port": local_port,
        "remote_port": remote_port,
        "protocol": protocol,
        "bytes": size,
        "direction": direction,
        "reason": None,
        "record": None,
        "input_file": FILE,
        "packets": None,  # a packet header: weight 1, unsampled (null = 1)
        "sampling_rate": None,
    }


def reject(reason: str, record: str) -> dict:
    row = {field.name: None for field in PARSED_SCHEMA}
    row.update(kind="reject", source=SOURCE, input_file=FILE, reason=reason, record=record)
    return row


def frame_record(number: int, offset: int, frame: bytes) -> str:
    """What a rejected frame's ``record`` says: where it is and its first 64 bytes in hex."""
    return f"frame {number} at byte offset {offset}: {frame[:64].hex()}{'…' if len(frame) > 64 else ''}"


def pcap_offsets(packets: list[cf.Packet], snaplen: int = 65535) -> list[int]:
    """Byte offset of each frame's data in a file written by ``cf.pcap``."""
    offsets, at_byte = [], 24
    for p in packets:
        offsets.append(at_byte + 16)
        at_byte += 16 + min(len(p.frame), snaplen)
    return offsets


# A small conversation used by many tests: out, in, internal, out over IPv6.
OUT_TCP = cf.ipv4("10.0.0.1", "93.184.216.34", 6, cf.tcp(40000, 443, b"x" * 100))
IN_TCP = cf.ipv4("93.184.216.34", "10.0.0.1", 6, cf.tcp(443, 40000, b"y" * 1000))
INTERNAL_UDP = cf.ipv4("10.0.0.2", "10.0.0.1", 17, cf.udp(5353, 53, b"q" * 30))
OUT_V6 = cf.ipv6("2001:db8::1", "2606:4700::1111", 17, cf.udp(50000, 53, b"z" * 20))
CONVERSATION = [OUT_TCP, IN_TCP, INTERNAL_UDP, OUT_V6]
EXPECTED = [
    packet(T0_US + 0, "10.0.0.1", "93.184.216.34", 40000, 443, 6, 140, "out"),
    packet(T0_US + 1000, "10.0.0.1", "93.184.216.34", 40000, 443, 6, 1040, "in"),
    packet(T0_US + 2000, "10.0.0.2", "10.0.0.1", 5353, 53, 17, 58, "internal"),
    packet(T0_US + 3000, "2001:db8::1", "2606:4700::1111", 50000, 53, 17, 68, "out"),
]


def stamped(frames: list[bytes], step_ns: int = 1_000_000) -> list[cf.Packet]:
    return [cf.Packet(frame, T0_NS + i * step_ns) for i, frame in enumerate(frames)]


def ethernet_frames(packets: list[bytes]) -> list[bytes]:
    return [cf.ethernet(p, cf.ethertype_of(p)) for p in packets]


# --- sniffing -----------------------------------------------------------------------------


@pytest.mark.parametrize(
    "head",
    [
        bytes.fromhex("d4c3b2a1"),
        bytes.fromhex("a1b2c3d4"),
        bytes.fromhex("4d3cb2a1"),
        bytes.fromhex("a1b23c4d"),
        bytes.fromhex("0a0d0d0a"),
    ],
)
def test_is_capture_knows_every_magic(head):
    assert is_capture(head + bytes(20))


@pytest.mark.parametrize("head", [b"", b"\xd4\xc3", b"new,OP_INSERT,1", b'{"ts": 1}', bytes(24)])
def test_is_capture_refuses_other_files(head):
    assert not is_capture(head)


# --- classic pcap -------------------------------------------------------------------------


@pytest.mark.parametrize("big_endian", [False, True])
@pytest.mark.parametrize("nanos", [False, True])
def test_pcap_in_both_byte_orders_and_resolutions(nanos, big_endian):
    data = cf.pcap(stamped(ethernet_frames(CONVERSATION)), nanos=nanos, big_endian=big_endian)
    assert parse(data) == EXPECTED


def test_nanosecond_timestamps_round_down_to_the_microsecond():
    packets = [cf.Packet(cf.ethernet(OUT_TCP), T0_NS + 123_456_789), cf.Packet(cf.ethernet(OUT_TCP), T0_NS + 999)]
    rows = parse(cf.pcap(packets, nanos=True))
    assert [r["ts"] for r in rows] == [at(T0_US + 123_456), at(T0_US)]


def test_header_only_capture_is_empty():
    assert parse(cf.pcap([])) == []
    assert parse(cf.pcapng(cf.Section([cf.Interface()]))) == []


# --- link types ---------------------------------------------------------------------------

LINK_TYPES = {
    "ethernet": (1, lambda p: cf.ethernet(p, cf.ethertype_of(p))),
    "802.1Q": (1, lambda p: cf.ethernet(p, cf.ethertype_of(p), vlans=[(0x8100, 100)])),
    "802.1ad QinQ": (1, lambda p: cf.ethernet(p, cf.ethertype_of(p), vlans=[(0x88A8, 10), (0x8100, 100)])),
    "old QinQ 0x9100": (1, lambda p: cf.ethernet(p, cf.ethertype_of(p), vlans=[(0x9100, 10), (0x8100, 100)])),
    "three tags": (1, lambda p: cf.ethernet(p, cf.ethertype_of(p), vlans=[(0x88A8, 1), (0x8100, 2), (0x8100, 3)])),
    "MPLS": (1, lambda p: cf.ethernet(cf.mpls(p, [100, 200]), 0x8847)),
    "VLAN+MPLS": (1, lambda p: cf.ethernet(cf.mpls(p), 0x8847, vlans=[(0x8100, 5)])),
    "PPPoE": (1, lambda p: cf.ethernet(cf.pppoe(p, 0x0021 if p[0] >> 4 == 4 else 0x0057), 0x8864)),
    "Arista 64-bit": (1, lambda p: cf.ethernet(cf.arista(cf.ethertype_of(p), p, 0x0010), 0xD28B)),
    "Arista 48-bit": (1, lambda p: cf.ethernet(cf.arista(cf.ethertype_of(p), p, 0x0120), 0xD28B)),
    "Linux cooked v1": (113, lambda p: cf.linux_sll(p, cf.ethertype_of(p))),
    "Linux cooked v2": (276, lambda p: cf.linux_sll2(p, cf.ethertype_of(p))),
    "raw 101": (101, lambda p: p),
    "raw 12": (12, lambda p: p),
    "raw 14": (14, lambda p: p),
    "null little-endian": (0, lambda p: cf.null_loopback(p, 2 if p[0] >> 4 == 4 else 30, "<")),
    "null big-endian": (0, lambda p: cf.null_loopback(p, 2 if p[0] >> 4 == 4 else 24, ">")),
    "loop 108": (108, lambda p: cf.openbsd_loop(p, 2 if p[0] >> 4 == 4 else 28)),
}


@pytest.mark.parametrize("name", LINK_TYPES)
def test_every_link_type_yields_the_same_packets(name):
    linktype, frame = LINK_TYPES[name]
    data = cf.pcap(stamped([frame(p) for p in CONVERSATION]), linktype)
    assert parse(data) == EXPECTED


def test_ipv4_only_and_ipv6_only_link_types():
    v4 = [OUT_TCP, IN_TCP, INTERNAL_UDP]
    assert parse(cf.pcap(stamped(v4), 228)) == EXPECTED[:3]
    assert parse(cf.pcap([cf.Packet(OUT_V6, T0_NS + 3_000_000)], 229)) == EXPECTED[3:]
    # the link type promises one version; a packet of the other is refused, not guessed
    assert parse(cf.pcap([cf.Packet(OUT_V6, T0_NS)], 228)) == [
        reject("IPv4 frame whose IP header says version 6", frame_record(1, 40, OUT_V6))
    ]


@pytest.mark.parametrize("family", [10, 24, 28, 30])
def test_every_ipv6_loopback_family(family):
    data = cf.pcap([cf.Packet(cf.null_loopback(OUT_V6, family), T0_NS + 3_000_000)], 0)
    assert parse(data) == EXPECTED[3:]


def test_loopback_family_that_is_not_ip_is_rejected():
    frame = cf.null_loopback(b"\x00" * 30, 7)
    assert parse(cf.pcap([cf.Packet(frame, T0_NS)], 0)) == [
        reject("not an IP packet (loopback address family 7)", frame_record(1, 40, frame))
    ]


def test_unsupported_link_type_is_rejected_per_frame():
    frames = [b"\x00" * 40, b"\x01" * 80]
    packets = stamped(frames)
    offsets = pcap_offsets(packets)
    assert parse(cf.pcap(packets, 127)) == [
        reject("unsupported link type 127", frame_record(1, offsets[0], frames[0])),
        reject("unsupported link type 127", frame_record(2, offsets[1], frames[1])),
    ]


# --- non-IP frames are rejected, never dropped -------------------------------------------


def test_non_ip_frames_are_rejected_with_what_they_are():
    frames = [
        cf.ethernet(cf.ARP, 0x0806),
        cf.ethernet(cf.ARP, 0x0806, vlans=[(0x88A8, 10), (0x8100, 20)]),
        cf.ethernet(b"\x10\x00" + bytes(40), 0x88A2),  # ATA over Ethernet
        cf.ethernet(bytes(40), 0x88CA),  # TIPC
        cf.ethernet(b"\xaa\xaa\x03" + bytes(40), 46),  # 802.3 with a length field
        cf.ethernet(cf.mpls(cf.ethernet(OUT_TCP)), 0x8847),  # Ethernet pseudowire
        cf.ethernet(cf.pppoe(b"\xc0\x21" + bytes(10), 0xC021), 0x8864),  # PPP LCP
        cf.ethernet(cf.arista(0x0800, OUT_TCP, 0x0011), 0xD28B),
        cf.linux_sll(cf.ARP, 0x0806),
        cf.ethernet(OUT_TCP),
    ]
    packets = stamped(frames)
    offsets = pcap_offsets(packets)
    reasons = [
        "not an IP packet (ethertype 0x0806)",
        "not an IP packet (ethertype 0x0806)",
        "not an IP packet (ethertype 0x88a2)",
        "not an IP packet (ethertype 0x88ca)",
        "not an IP packet (IEEE 802.3 frame with length field 46, LLC)",
        "not an IP packet (MPLS payload starting with 0x02)",
        "not an IP packet (PPPoE session, PPP protocol 0xc021)",
        "unknown Arista vendor header (subtype 0x0001, version 0x0011): cannot find the packet inside",
    ]
    expected = [reject(r, frame_record(i + 1, offsets[i], frames[i])) for i, r in enumerate(reasons)]
    rows = parse(cf.pcap(packets[:8]))
    assert rows == expected
    # a cooked capture carries its own protocol field
    sll = parse(cf.pcap(packets[8:9], 113))
    assert sll == [reject("not an IP packet (ethertype 0x0806)", frame_record(1, 40, frames[8]))]


def test_raw_ip_frame_with_a_bad_version_nibble_is_rejected():
    frame = b"\x50" + bytes(39)
    assert parse(cf.pcap([cf.Packet(frame, T0_NS)], 101)) == [
        reject("not an IP packet (version nibble 5 in a raw IP frame)", frame_record(1, 40, frame))
    ]


def test_ethertype_and_header_version_must_agree():
    frame = cf.ethernet(OUT_V6, 0x0800)
    assert parse(cf.pcap([cf.Packet(frame, T0_NS)])) == [
        reject("IPv4 frame whose IP header says version 6", frame_record(1, 40, frame))
    ]


# --- protocols, ports, IPv6 extension headers, fragments ----------------------------------


def test_protocols_without_ports_keep_their_number():
    frames = ethernet_frames(
        [
            cf.ipv4("10.0.0.1", "8.8.8.8", 1, cf.icmp()),
            cf.ipv6("2001:db8::1", "2001:4860::8888", 58, cf.icmp()),
            cf.ipv4("10.0.0.1", "8.8.8.8", 47, bytes(24)),  # GRE: outer header only
            cf.ipv6("2001:db8::1", "2001:4860::8888", 50, bytes(40)),  # ESP
            cf.ipv4("10.0.0.1", "192.0.2.9", 132, cf.sctp(3868, 3868, bytes(16))),
            cf.ipv4("10.0.0.1", "192.0.2.9", 4, cf.ipv4("172.16.0.1", "172.16.0.2", 6, cf.tcp(1, 2))),
        ]
    )
    assert parse(cf.pcap(stamped(frames))) == [
        packet(T0_US, "10.0.0.1", "8.8.8.8", None, None, 1, 32, "out"),
        packet(T0_US + 1000, "2001:db8::1", "2001:4860::8888", None, None, 58, 52, "out"),
        packet(T0_US + 2000, "10.0.0.1", "8.8.8.8", None, None, 47, 44, "out"),
        packet(T0_US + 3000, "2001:db8::1", "2001:4860::8888", None, None, 50, 80, "out"),
        packet(T0_US + 4000, "10.0.0.1", "192.0.2.9", 3868, 3868, 132, 48, "out"),
        packet(T0_US + 5000, "10.0.0.1", "192.0.2.9", None, None, 4, 60, "out"),
    ]


def test_ipv6_extension_headers_are_walked_to_the_ports():
    remote = "2a00:1450::200e"
    packets = [
        cf.ipv6("2001:db8::1", remote, 6, cf.tcp(1234, 443), extensions=[cf.hop_by_hop(), cf.routing(2), cf.destination_options(bytes(10))]),
        cf.ipv6("2001:db8::1", remote, 17, cf.udp(500, 4500, bytes(12)), extensions=[cf.authentication()]),
        cf.ipv6("2001:db8::1", remote, 17, cf.udp(53, 53, bytes(100)), extensions=[cf.fragment(0, more=True)]),
        cf.ipv6("2001:db8::1", remote, 17, bytes(64), extensions=[cf.fragment(1232)]),
        cf.ipv6("2001:db8::1", remote, 59, b"", extensions=[cf.destination_options()]),
    ]
    assert parse(cf.pcap(stamped(ethernet_frames(packets)))) == [
        packet(T0_US, "2001:db8::1", remote, 1234, 443, 6, 40 + 8 + 40 + 16 + 20, "out"),
        packet(T0_US + 1000, "2001:db8::1", remote, 500, 4500, 17, 40 + 24 + 20, "out"),
        packet(T0_US + 2000, "2001:db8::1", remote, 53, 53, 17, 40 + 8 + 108, "out"),
        # a later fragment has no transport header: no ports, its own length
        packet(T0_US + 3000, "2001:db8::1", remote, None, None, 17, 40 + 8 + 64, "out"),
        packet(T0_US + 4000, "2001:db8::1", remote, None, None, 59, 48, "out"),
    ]


def test_ipv4_fragments_count_their_own_length_and_only_the_first_has_ports():
    first = cf.ipv4("93.184.216.34", "10.0.0.7", 17, cf.udp(53, 5000, bytes(1472))[:1480], more_fragments=True)
    second = cf.ipv4("93.184.216.34", "10.0.0.7", 17, bytes(500), fragment_offset=1480)
    assert parse(cf.pcap(stamped(ethernet_frames([first, second])))) == [
        packet(T0_US, "10.0.0.7", "93.184.216.34", 5000, 53, 17, 1500, "in"),
        packet(T0_US + 1000, "10.0.0.7", "93.184.216.34", None, None, 17, 520, "in"),
    ]


def test_ipv4_options_move_the_ports():
    frame = cf.ethernet(cf.ipv4("10.0.0.1", "8.8.8.8", 17, cf.udp(1000, 53), options=b"\x94\x04\x00\x00"))
    assert parse(cf.pcap([cf.Packet(frame, T0_NS)])) == [
        packet(T0_US, "10.0.0.1", "8.8.8.8", 1000, 53, 17, 32, "out")
    ]


# --- lengths: snaplen, jumbograms, TSO/GSO/BIG TCP ----------------------------------------


def test_snaplen_truncated_packets_count_their_ip_length():
    big = cf.ipv4("10.0.0.1", "93.184.216.34", 6, cf.tcp(40000, 443, bytes(1460)))
    big6 = cf.ipv6("2001:db8::1", "2606:4700::1111", 6, cf.tcp(40000, 443, bytes(1400)))
    data = cf.pcap(stamped(ethernet_frames([big, big6])), snaplen=68)
    assert parse(data) == [
        packet(T0_US, "10.0.0.1", "93.184.216.34", 40000, 443, 6, 1500, "out"),
        packet(T0_US + 1000, "2001:db8::1", "2606:4700::1111", 40000, 443, 6, 1460, "out"),
    ]


def test_snaplen_cut_inside_the_transport_header_leaves_ports_null():
    data = cf.pcap([cf.Packet(cf.ethernet(OUT_TCP), T0_NS)], snaplen=14 + 20 + 3)
    assert parse(data) == [packet(T0_US, "10.0.0.1", "93.184.216.34", None, None, 6, 140, "out")]


def test_snaplen_cut_inside_the_ip_header_is_rejected():
    frame = cf.ethernet(OUT_TCP)
    data = cf.pcap([cf.Packet(frame, T0_NS)], snaplen=30)
    assert parse(data) == [
        reject("IP header cut off by the capture (16 bytes captured): addresses unknown", frame_record(1, 40, frame[:30]))
    ]


def test_snaplen_cut_inside_ipv6_extension_headers_leaves_protocol_and_ports_null():
    pkt = cf.ipv6("2001:db8::1", "2606:4700::1111", 6, cf.tcp(1, 2), extensions=[cf.hop_by_hop(), cf.routing(3)])
    data = cf.pcap([cf.Packet(cf.ethernet(pkt, 0x86DD), T0_NS)], snaplen=14 + 40 + 8 + 1)
    assert parse(data) == [packet(T0_US, "2001:db8::1", "2606:4700::1111", None, None, None, len(pkt), "out")]


def test_ipv6_jumbogram_counts_the_jumbo_payload_length():
    payload = cf.tcp(1, 2, bytes(70_000))
    pkt = cf.ipv6(
        "2001:db8::1", "2606:4700::1111", 6, payload,
        extensions=[cf.hop_by_hop(cf.jumbo_option(8 + len(payload)))], payload_length=0,
    )
    frame = cf.ethernet(pkt, 0x86DD)
    data = cf.pcap([cf.Packet(frame, T0_NS)], snaplen=200)
    assert parse(data) == [packet(T0_US, "2001:db8::1", "2606:4700::1111", 1, 2, 6, 40 + 8 + 70_020, "out")]


def test_ipv4_total_length_zero_counts_the_wire_frame():
    """BIG TCP / TSO: the stack leaves the length 0; the record's original length is all we have."""
    pkt = cf.ipv4("10.25.132.13", "10.25.132.11", 6, cf.tcp(1, 2, bytes(80_012)), total_length=0)
    frame = cf.ethernet(pkt)
    plain = cf.pcap([cf.Packet(frame, T0_NS)], snaplen=128)
    with_fcs = cf.pcap([cf.Packet(frame + bytes(4), T0_NS)], snaplen=128, fcs_bytes=4)
    expected = [packet(T0_US, "10.25.132.13", "10.25.132.11", 1, 2, 6, 80_052, "internal")]
    assert parse(plain) == expected
    assert parse(with_fcs) == expected


def test_ipv4_wire_length_beyond_a_gso_super_packet_is_rejected():
    """Total length 0 takes the record's wire length; past 524,280 bytes (GSO_MAX_SIZE) no IPv4 packet
    exists, and the packets suite would fail the hour: the frame is rejected instead."""
    pkt = cf.ipv4("10.25.132.13", "192.0.2.1", 6, cf.tcp(1, 2), total_length=0)
    frames = [cf.ethernet(pkt), cf.ethernet(pkt)]
    packets = [cf.Packet(frames[0], T0_NS, orig_len=14 + 524_280), cf.Packet(frames[1], T0_NS, orig_len=14 + 524_281)]
    assert parse(cf.pcap(packets)) == [
        packet(T0_US, "10.25.132.13", "192.0.2.1", 1, 2, 6, 524_280, "out"),
        reject("IPv4 packet of 524281 bytes (from the record's wire length) is more than a GSO/BIG TCP super-packet "
               "can carry (524280)", frame_record(2, pcap_offsets(packets)[1], frames[1])),
    ]


def test_ipv6_payload_length_zero_without_jumbo_option():
    big_tcp = cf.ipv6("2001:db8::1", "2606:4700::1111", 6, cf.tcp(1, 2, bytes(100_000)), payload_length=0)
    empty = cf.ipv6("2001:db8::1", "2606:4700::1111", 59, b"")
    frames = [cf.ethernet(big_tcp, 0x86DD), cf.ethernet(empty + bytes(6), 0x86DD)]  # 6 bytes of padding
    assert parse(cf.pcap(stamped(frames), snaplen=256)) == [
        packet(T0_US, "2001:db8::1", "2606:4700::1111", 1, 2, 6, 100_060, "out"),
        packet(T0_US + 1000, "2001:db8::1", "2606:4700::1111", None, None, 59, 40, "out"),
    ]


def test_bad_ipv4_header_lengths_are_rejected():
    short_ihl = bytearray(OUT_TCP)
    short_ihl[0] = 0x44
    short_total = bytearray(OUT_TCP)
    short_total[2:4] = (12).to_bytes(2, "big")
    frames = [cf.ethernet(bytes(short_ihl)), cf.ethernet(bytes(short_total))]
    packets = stamped(frames)
    offsets = pcap_offsets(packets)
    assert parse(cf.pcap(packets)) == [
        reject("bad IPv4 header length (16 bytes)", frame_record(1, offsets[0], frames[0])),
        reject("IPv4 total length 12 is shorter than its header (20 bytes)", frame_record(2, offsets[1], frames[1])),
    ]


# --- orientation --------------------------------------------------------------------------


def test_orientation_out_in_internal_and_neither():
    frames = ethernet_frames([OUT_TCP, IN_TCP, INTERNAL_UDP, cf.ipv4("8.8.8.8", "1.1.1.1", 17, cf.udp(53, 53))])
    packets = stamped(frames)
    rows = parse(cf.pcap(packets))
    assert rows == EXPECTED[:3] + [
        reject("neither address is in local_networks (8.8.8.8 → 1.1.1.1)", frame_record(4, pcap_offsets(packets)[3], frames[3]))
    ]


def test_keep_transit_keeps_neither_local_packets_with_the_sender_as_local():
    """Kept with direction unknown (null): ``transit`` is no stored direction, so the hour still passes."""
    frames = ethernet_frames([cf.ipv4("8.8.8.8", "1.1.1.1", 17, cf.udp(53, 5353)), OUT_TCP])
    assert parse(cf.pcap(stamped(frames)), keep_transit=True) == [
        packet(T0_US, "8.8.8.8", "1.1.1.1", 53, 5353, 17, 28, None),
        packet(T0_US + 1000, "10.0.0.1", "93.184.216.34", 40000, 443, 6, 140, "out"),
    ]


def test_empty_local_networks_makes_every_packet_neither_local():
    frames = ethernet_frames([OUT_TCP, OUT_V6])
    packets = stamped(frames)
    offsets = pcap_offsets(packets)
    assert parse(cf.pcap(packets), local=[]) == [
        reject("neither address is in local_networks (10.0.0.1 → 93.184.216.34)", frame_record(1, offsets[0], frames[0])),
        reject("neither address is in local_networks (2001:db8::1 → 2606:4700::1111)", frame_record(2, offsets[1], frames[1])),
    ]
    assert [r["direction"] for r in parse(cf.pcap(packets), local=[], keep_transit=True)] == [None, None]


def test_ipv6_addresses_are_canonical_text_and_networks_match_per_family():
    pkt = cf.ipv6("2001:0DB8:0000:0000:0000:0000:0000:0001", "2606:4700:0:0:0:0:0:1111", 17, cf.udp(1, 2))
    rows = parse(cf.pcap([cf.Packet(cf.ethernet(pkt, 0x86DD), T0_NS)]), local=["2001:db8::/32", "10.0.0.0/8"])
    assert rows == [packet(T0_US, "2001:db8::1", "2606:4700::1111", 1, 2, 17, 48, "out")]


def test_ipv4_mapped_addresses_are_stored_matched_and_bounded_as_ipv4():
    """``::ffff:a.b.c.d`` is the IPv4 host it maps (as for text inputs): an IPv4 row, local by an IPv4
    network, under the IPv4 size bound; next to a plain IPv6 address it is rejected (mixed families)."""
    both = cf.ipv6("::ffff:192.0.2.7", "::ffff:10.0.0.9", 17, cf.udp(1, 2))
    mixed = cf.ipv6("2001:db8::1", "::ffff:10.0.0.9", 17, cf.udp(1, 2))
    big = cf.ipv6("::ffff:10.0.0.9", "::ffff:192.0.2.7", 6, cf.tcp(1, 2), payload_length=65_535)
    frames = ethernet_frames([both, mixed, big])
    packets = stamped(frames)
    offsets = pcap_offsets(packets)
    assert parse(cf.pcap(packets), local=["2001:db8::/32", "10.0.0.0/8"]) == [
        packet(T0_US, "10.0.0.9", "192.0.2.7", 2, 1, 17, 48, "in"),
        reject("IPv6 packet between an IPv4-mapped address and a plain IPv6 one: stored as IPv4 and IPv6, the two "
               "ends would be of different families", frame_record(2, offsets[1], frames[1])),
        reject("IPv6 packet of 65575 bytes between IPv4-mapped addresses is more than an IPv4 packet can carry "
               "(65535)", frame_record(3, offsets[2], frames[2])),
    ]


def test_host_routes_and_overlapping_networks():
    frames = ethernet_frames([OUT_TCP, INTERNAL_UDP])
    rows = parse(cf.pcap(stamped(frames)), local=["10.0.0.1/32", "10.0.0.0/31"])
    assert rows == [
        EXPECTED[0],
        packet(T0_US + 1000, "10.0.0.1", "10.0.0.2", 53, 5353, 17, 58, "in"),
    ]


def test_bad_local_network_is_a_configuration_error():
    with pytest.raises(ValueError, match="not-a-network"):
        parse_capture(b"", source=SOURCE, input_file=FILE, local_networks=["not-a-network"])


def test_many_packets_share_few_addresses():
    frames = ethernet_frames([OUT_TCP, IN_TCP] * 500)
    rows = parse(cf.pcap(stamped(frames, step_ns=1000)))
    assert len(rows) == 1000
    assert {(r["local_ip"], r["remote_ip"], r["direction"]) for r in rows} == {
        ("10.0.0.1", "93.184.216.34", "out"),
        ("10.0.0.1", "93.184.216.34", "in"),
    }
    assert sum(r["bytes"] for r in rows) == 500 * (140 + 1040)


# --- pcapng -------------------------------------------------------------------------------


def without_records(rows: list[dict]) -> tuple[list[dict], list[str | None]]:
    """Rows minus their ``record`` (pcapng offsets are tedious to predict), and the records."""
    return [{k: v for k, v in r.items() if k != "record"} for r in rows], [r["record"] for r in rows]


def test_pcapng_interfaces_resolutions_sections_and_block_types():
    ethernet = cf.Interface(linktype=1)  # no if_tsresol: microseconds
    raw_ns = cf.Interface(linktype=101, tsresol=9)
    cooked_pow2 = cf.Interface(linktype=113, tsresol=0x80 | 20, tsoffset=1_000)
    t = [T0_NS + i * 1_000_000_000 + 123_456_789 for i in range(8)]
    first = cf.Section(
        [ethernet, raw_ns, cooked_pow2],
        [
            cf.Other(4),  # name resolution: skipped
            cf.Enhanced(0, cf.Packet(cf.ethernet(OUT_TCP), t[0])),
            cf.Enhanced(1, cf.Packet(IN_TCP, t[1])),
            cf.Enhanced(2, cf.Packet(cf.linux_sll(OUT_V6, 0x86DD), t[2])),
            cf.Simple(cf.ethernet(OUT_TCP)),
            cf.Enhanced(0, cf.Packet(cf.ethernet(INTERNAL_UDP), t[3]), obsolete=True),
            cf.Enhanced(7, cf.Packet(cf.ethernet(OUT_TCP), t[4])),
            cf.Other(5),  # interface statistics: skipped
        ],
    )
    # a second section, big-endian, numbers its interfaces afresh; milliseconds
    second = cf.Section(
        [cf.Interface(linktype=229, tsresol=3)], [cf.Enhanced(0, cf.Packet(OUT_V6, t[5]))], big_endian=True
    )
    rows, records = without_records(parse(cf.pcapng(first, second)))
    ticks = cooked_pow2.ticks(t[2])
    pow2_us = (ticks * 1_000_000 >> 20) + 1_000 * 1_000_000
    expected = [
        packet(T0_US + 123_456, "10.0.0.1", "93.184.216.34", 40000, 443, 6, 140, "out"),
        packet(T0_US + 1_123_456, "10.0.0.1", "93.184.216.34", 40000, 443, 6, 1040, "in"),
        packet(pow2_us, "2001:db8::1", "2606:4700::1111", 50000, 53, 17, 68, "out"),
        reject("simple packet block has no timestamp: accounting needs the time of each packet", ""),
        packet(T0_US + 3_123_456, "10.0.0.2", "10.0.0.1", 5353, 53, 17, 58, "internal"),
        reject("packet refers to interface 7, which no interface description block of its section describes", ""),
        packet(T0_US + 5_123_000, "2001:db8::1", "2606:4700::1111", 50000, 53, 17, 68, "out"),
    ]
    assert rows == without_records(expected)[0]
    assert T0_US + 2_123_456 - 1 <= pow2_us <= T0_US + 2_123_456
    assert records[3].startswith("frame 4 at byte offset ")
    assert records[3].endswith(": " + cf.ethernet(OUT_TCP)[:64].hex() + "…")
    assert records[5].startswith("frame 6 at byte offset ")
    assert [r for i, r in enumerate(records) if i not in (3, 5)] == [None] * 5


def test_pcapng_timestamp_out_of_range_is_rejected():
    seconds = cf.Interface(linktype=1, tsresol=0)
    section = cf.Section([seconds], [cf.Enhanced(0, cf.Packet(cf.ethernet(OUT_TCP), 300_000 * 365 * 86400 * 10**9))])
    rows, _ = without_records(parse(cf.pcapng(section)))
    assert rows == without_records([reject("timestamp outside 1970-01-01 .. 9999-12-31", "")])[0]


# 64-bit timestamps in fine units cannot reach 2023: those use a time near 1970
@pytest.mark.parametrize(
    ("tsresol", "ts_ns"),
    [
        (0, T0_NS + 987_654_321),
        (3, T0_NS + 987_654_321),
        (6, T0_NS + 987_654_321),
        (9, T0_NS + 987_654_321),
        (12, 1_234_987_654_321),
        (19, 1_587_654_321),
        (0x80 | 10, T0_NS + 987_654_321),
        (0x80 | 30, T0_NS + 987_654_321),
        (0x80 | 50, 1_587_654_321),
    ],
)
def test_pcapng_every_timestamp_resolution_rounds_down(tsresol, ts_ns):
    iface = cf.Interface(linktype=101, tsresol=tsresol)
    rows = parse(cf.pcapng(cf.Section([iface], [cf.Enhanced(0, cf.Packet(OUT_TCP, ts_ns))])))
    ticks = iface.ticks(ts_ns)
    if tsresol & 0x80:
        expected = ticks * 10**6 >> (tsresol & 0x7F)
    else:
        expected = ticks * 10**6 // 10**tsresol
    assert rows == [packet(expected, "10.0.0.1", "93.184.216.34", 40000, 443, 6, 140, "out")]
    assert ts_ns // 1000 - 1_000_000 < expected <= ts_ns // 1000


# --- broken files -------------------------------------------------------------------------


def test_truncated_pcap_keeps_the_good_packets_and_says_where_it_stops():
    packets = stamped(ethernet_frames(CONVERSATION))
    data = cf.pcap(packets)
    last = pcap_offsets(packets)[3] - 16
    rows = parse(data[: last + 30])
    assert rows[:3] == EXPECTED[:3]
    assert rows[3:] == [
        reject(
            f"capture truncated: the packet record at byte offset {last} needs {16 + 14 + len(OUT_V6)} bytes, "
            "only 30 remain; the packets before it are kept, the rest of the file is not read",
            f"byte offset {last}: {data[last:last + 30].hex()}",
        )
    ]


def test_pcap_cut_inside_a_record_header():
    packets = stamped(ethernet_frames(CONVERSATION[:2]))
    data = cf.pcap(packets)
    rows = parse(data + data[24:30])
    assert rows[:2] == EXPECTED[:2]
    assert rows[2:] == [
        reject(
            f"capture truncated: record header at byte offset {len(data)} cut off (6 of 16 bytes); "
            "the packets before it are kept, the rest of the file is not read",
            f"byte offset {len(data)}: {data[24:30].hex()}",
        )
    ]


def test_pcap_file_header_cut_off():
    data = cf.pcap([])[:10]
    assert parse(data) == [
        reject(
            "pcap file header cut off (10 of 24 bytes); the packets before it are kept, the rest of the file is not read",
            f"byte offset 0: {data.hex()}",
        )
    ]


def test_corrupt_record_length_stops_the_file_with_one_reject():
    packets = stamped(ethernet_frames(CONVERSATION))
    data = bytearray(cf.pcap(packets))
    third = pcap_offsets(packets)[2] - 16
    data[third + 8 : third + 12] = (5_000_000).to_bytes(4, "little")
    rows = parse(bytes(data))
    assert rows[:2] == EXPECTED[:2]
    assert len(rows) == 3
    assert rows[2]["reason"] == (
        f"corrupt capture: the packet record at byte offset {third} claims 5000000 captured bytes "
        "(more than the snapshot length 262144); the packets before it are kept, the rest of the file is not read"
    )
    assert rows[2]["record"] == f"byte offset {third}: {bytes(data[third:third + 64]).hex()}…"


def test_truncated_pcapng_keeps_the_good_packets():
    section = cf.Section([cf.Interface()], [cf.Enhanced(0, p) for p in stamped(ethernet_frames(CONVERSATION))])
    data = cf.pcapng(section)
    rows = parse(data[:-20])
    assert rows[:3] == EXPECTED[:3]
    assert len(rows) == 4 and rows[3]["kind"] == "reject"
    assert rows[3]["reason"].startswith("capture truncated: block at byte offset ")
    assert "bytes, only" in rows[3]["reason"]


def test_pcapng_block_with_a_wrong_trailing_length():
    section = cf.Section([cf.Interface()], [cf.Enhanced(0, p) for p in stamped(ethernet_frames(CONVERSATION))])
    data = bytearray(cf.pcapng(section))
    last_block_end = len(data)
    data[last_block_end - 4 : last_block_end] = (999).to_bytes(4, "little")
    rows = parse(bytes(data))
    assert rows[:3] == EXPECTED[:3]
    assert len(rows) == 4
    assert rows[3]["reason"].startswith("corrupt capture: packet block at byte offset ")
    assert "trailing length 999" in rows[3]["reason"]


def test_pcapng_with_a_bad_byte_order_magic():
    data = bytearray(cf.pcapng(cf.Section([cf.Interface()])))
    data[8:12] = b"ABCD"
    rows = parse(bytes(data))
    assert rows == [
        reject(
            "corrupt capture: section header block at byte offset 0 has no valid byte-order magic (0x41424344); "
            "the packets before it are kept, the rest of the file is not read",
            f"byte offset 0: {bytes(data[:64]).hex()}",
        )
    ]


@pytest.mark.parametrize(
    ("data", "magic"),
    [
        (cf.garbage(200), "magic 0x6e65772c"),
        (b"", "only 0 bytes"),
        (b"PK\x03", "only 3 bytes"),
    ],
)
def test_a_file_that_is_not_a_capture_is_one_reject(data, magic):
    suffix = "…" if len(data) > 64 else ""
    assert parse(data) == [
        reject(f"not a pcap or pcapng file ({magic})", f"byte offset 0: {data[:64].hex()}{suffix}")
    ]


def test_random_corruption_never_raises_and_accounts_for_every_frame():
    """Flip, cut and splice bytes of valid captures: the reader must always answer in rows."""
    rng = random.Random(20240601)
    frames = ethernet_frames(CONVERSATION) + [
        cf.ethernet(cf.ipv6("2001:db8::1", "2606:4700::1", 6, cf.tcp(1, 2), extensions=[cf.hop_by_hop(), cf.fragment(0)]), 0x86DD),
        cf.ethernet(OUT_TCP, vlans=[(0x8100, 3)]),
        cf.ethernet(cf.mpls(OUT_TCP), 0x8847),
    ]
    packets = stamped(frames)
    originals = [
        cf.pcap(packets),
        cf.pcap(packets, nanos=True, big_endian=True),
        cf.pcapng(cf.Section([cf.Interface(), cf.Interface(101, tsresol=9)], [cf.Enhanced(0, p) for p in packets])),
    ]
    for _ in range(300):
        data = bytearray(rng.choice(originals))
        for _ in range(rng.randint(1, 6)):
            action = rng.random()
            at_byte = rng.randrange(len(data))
            if action < 0.6:
                data[at_byte] = rng.randrange(256)
            elif action < 0.8:
                del data[at_byte:]
                if not data:
                    break
            else:
                data[at_byte:at_byte] = bytes(rng.randrange(256) for _ in range(rng.randint(1, 8)))
        table = parse_capture(bytes(data), source=SOURCE, input_file=FILE, local_networks=LOCAL)
        assert table.schema == PARSED_SCHEMA
        rows = table.to_pylist()
        assert all(r["kind"] in ("packet", "reject") for r in rows)
        assert not any((r["reason"] or "").startswith("could not read capture") for r in rows), rows
        assert all(r["reason"] and r["record"] for r in rows if r["kind"] == "reject")
        assert all(r["ts"] and r["local_ip"] and r["bytes"] is not None for r in rows if r["kind"] == "packet")


def test_bytes_like_inputs_are_accepted():
    data = cf.pcap(stamped(ethernet_frames(CONVERSATION)))
    assert parse(bytearray(data)) == EXPECTED
    assert parse(memoryview(data)) == EXPECTED


def _plain_walk(data: bytes, order: str) -> tuple[list[int], int]:
    import struct

    offsets, offset = [], 24
    while offset <= len(data) - 16:
        offsets.append(offset)
        offset += 16 + struct.unpack_from(order + "I", data, offset + 8)[0]
    return offsets, offset


@pytest.mark.parametrize("order", ["<", ">"])
@pytest.mark.parametrize("shape", ["one length", "runs", "every length differs", "cut and corrupt"])
def test_the_record_walk_finds_exactly_the_records_a_plain_walk_finds(order, shape):
    """The walk guesses runs of equal lengths and checks them at once; it must agree with a record-by-record
    walk on any file: one snapshot length, runs of lengths, lengths that always differ, a cut last record
    and a corrupt length that jumps past the end."""
    import struct

    import numpy as np

    from traffic.io.capture.framing import record_offsets

    rng = random.Random(f"{order}{shape}")
    if shape == "one length":
        lengths = [54] * 70_000
    elif shape == "runs":
        lengths = [length for _ in range(300) for length in [rng.choice([54, 60, 66, 1514])] * rng.randint(1, 900)]
    else:
        lengths = [rng.randint(0, 300) for _ in range(20_000)]
    body = bytearray(b"\0" * 24)
    for length in lengths:
        body += struct.pack(order + "IIII", 1, 2, length, length) + bytes(length)
    if shape == "cut and corrupt":
        body += struct.pack(order + "IIII", 1, 2, 40, 40) + bytes(10)  # cut off
        corrupt = bytearray(body)
        corrupt[24 + 16 * 100 + sum(lengths[:100]) + 8:][:4] = struct.pack(order + "I", 4_000_000_000)
        for data in (bytes(body), bytes(corrupt)):
            offsets, end = record_offsets(data, np.frombuffer(data, np.uint8), order)
            assert (offsets.tolist(), end) == _plain_walk(data, order)
        return
    data = bytes(body)
    offsets, end = record_offsets(data, np.frombuffer(data, np.uint8), order)
    assert (offsets.tolist(), end) == _plain_walk(data, order)
    assert len(offsets) == len(lengths)


def _mixed_frames(count: int) -> list[bytes]:
    """Packets of every direction, a non-IP frame and a neither-local one, repeated."""
    cycle = ethernet_frames(CONVERSATION) + [
        cf.ethernet(b"\x00" * 46, ethertype=0x0806),
        cf.ethernet(cf.ipv4("198.51.100.1", "203.0.113.9", 17, cf.udp(1, 2, b"n" * 9))),
    ]
    return [cycle[i % len(cycle)] for i in range(count)]


@pytest.mark.parametrize("container", ["pcap", "pcapng", "pcap cut short", "not a capture"])
def test_ranges_that_tile_a_capture_give_every_row_exactly_once(container):
    """A capture split between tasks (``own``): the ranges' rows, in range order, are the whole file's rows,
    whatever the cut points (inside records, on their first byte, at the ends); the file's own problem
    (a cut last record, not a capture at all) is reported once, by the range that reaches the end."""
    frames = stamped(_mixed_frames(300))
    if container == "pcapng":
        data = cf.pcapng(cf.Section([cf.Interface()], [cf.Enhanced(0, p) for p in frames]))
    elif container == "not a capture":
        data = cf.garbage(5000)
    else:
        data = cf.pcap(frames, snaplen=60)
        data = data[:-7] if container == "pcap cut short" else data

    def rows(own=None):
        return parse_capture(data, source=SOURCE, input_file=FILE, local_networks=LOCAL, own=own)

    whole = rows()
    assert whole.num_rows > (0 if container == "not a capture" else 300 - 1)
    rng = random.Random(container)
    offsets = pcap_offsets(frames, 60)
    for cuts in ([], [offsets[10]], [offsets[10] + 1, offsets[200] - 1], sorted(rng.sample(range(1, len(data)), 7))):
        bounds = [0, *[c for c in cuts if c < len(data)], len(data)]
        parts = [rows((lo, hi)) for lo, hi in zip(bounds, bounds[1:])]
        assert pa.concat_tables(parts).equals(whole), cuts
