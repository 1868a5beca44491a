"""Write small pcap and pcapng captures for tests, byte by byte with ``struct``.

Three layers, each a plain function returning ``bytes``: IP packets (``ipv4``, ``ipv6``
with extension headers, ``tcp``/``udp``/``icmp`` payloads), link-layer framing
(``ethernet`` with VLAN tags, Linux cooked v1/v2, loopback), and capture files (``pcap``
in either byte order with µs or ns timestamps, ``pcapng`` with several sections,
interfaces and timestamp resolutions). Timestamps are given in nanoseconds since the epoch.
"""

from __future__ import annotations

import ipaddress
import struct
from dataclasses import dataclass, field

# --- IP packets ---------------------------------------------------------------------------


def _checksum(header: bytes) -> int:
    total = sum(struct.unpack(f"!{len(header) // 2}H", header))
    while total > 0xFFFF:
        total = (total & 0xFFFF) + (total >> 16)
    return ~total & 0xFFFF


def tcp(sport: int, dport: int, payload: bytes = b"") -> bytes:
    """A 20-byte TCP header (ACK) and its payload."""
    return struct.pack("!HHIIBBHHH", sport, dport, 1, 1, 5 << 4, 0x10, 65535, 0, 0) + payload


def udp(sport: int, dport: int, payload: bytes = b"") -> bytes:
    return struct.pack("!HHHH", sport, dport, 8 + len(payload), 0) + payload


def sctp(sport: int, dport: int, payload: bytes = b"") -> bytes:
    return struct.pack("!HHII", sport, dport, 0, 0) + payload


def icmp(payload: bytes = b"ping") -> bytes:
    """An ICMP (or ICMPv6) echo request."""
    return struct.pack("!BBHHH", 8, 0, 0, 1, 1) + payload


def ipv4(
    src: str,
    dst: str,
    protocol: int,
    payload: bytes,
    *,
    total_length: int | None = None,
    fragment_offset: int = 0,
    more_fragments: bool = False,
    options: bytes = b"",
) -> bytes:
    """An IPv4 packet; ``total_length`` overrides the length field (e.g. 0 for BIG TCP)."""
    header_length = 20 + len(options)
    assert header_length % 4 == 0
    length = header_length + len(payload) if total_length is None else total_length
    flags = (0x2000 if more_fragments else 0) | (fragment_offset // 8)
    header = struct.pack(
        "!BBHHHBBH4s4s",
        0x40 | header_length // 4,
        0,
        length,
        0x1234,
        flags,
        64,
        protocol,
        0,
        ipaddress.IPv4Address(src).packed,
        ipaddress.IPv4Address(dst).packed,
    ) + options
    header = header[:10] + struct.pack("!H", _checksum(header)) + header[12:]
    return header + payload


def ipv6(
    src: str,
    dst: str,
    protocol: int,
    payload: bytes,
    *,
    extensions: list[tuple[int, bytes]] = (),
    payload_length: int | None = None,
) -> bytes:
    """An IPv6 packet; ``extensions`` are (header type, header bytes built by the helpers below).

    Each extension's first byte (its next header) is filled in here, so the chain is right.
    """
    chain = [kind for kind, _ in extensions] + [protocol]
    body = b"".join(bytes([chain[i + 1]]) + raw[1:] for i, (_, raw) in enumerate(extensions))
    body += payload
    length = len(body) if payload_length is None else payload_length
    return (
        struct.pack("!IHBB", 6 << 28, length, chain[0], 64)
        + ipaddress.IPv6Address(src).packed
        + ipaddress.IPv6Address(dst).packed
        + body
    )


def _options_header(options: bytes) -> bytes:
    """A hop-by-hop or destination options header, padded to 8 bytes with PadN."""
    size = 2 + len(options)
    pad = (-size) % 8
    if pad == 1:
        options += b"\x00"
    elif pad:
        options += bytes([1, pad - 2]) + bytes(pad - 2)
    return bytes([0, (2 + len(options)) // 8 - 1]) + options


def hop_by_hop(options: bytes = b"") -> tuple[int, bytes]:
    return 0, _options_header(options)


def jumbo_option(length: int) -> bytes:
    """RFC 2675 Jumbo Payload option (type 0xC2), to put in a hop-by-hop header."""
    return struct.pack("!BBI", 0xC2, 4, length)


def destination_options(options: bytes = b"") -> tuple[int, bytes]:
    return 60, _options_header(options)


def routing(addresses: int = 1) -> tuple[int, bytes]:
    """A type-0-shaped routing header carrying ``addresses`` addresses (8 + 16n bytes)."""
    return 43, bytes([0, 2 * addresses, 0, 0]) + bytes(4 + 16 * addresses)


def fragment(offset: int = 0, more: bool = False, ident: int = 7) -> tuple[int, bytes]:
    return 44, struct.pack("!BBHI", 0, 0, (offset // 8) << 3 | int(more), ident)


def authentication(icv_words: int = 3) -> tuple[int, bytes]:
    """An AH header (12 bytes + the ICV); its length field counts 4-byte words minus 2."""
    return 51, bytes([0, icv_words + 1, 0, 0]) + struct.pack("!II", 0x100, 1) + bytes(4 * icv_words)


# --- link layers --------------------------------------------------------------------------

MAC_A = bytes.fromhex("020000000001")
MAC_B = bytes.fromhex("020000000002")


def ethernet(payload: bytes, ethertype: int = 0x0800, *, vlans: list[tuple[int, int]] = ()) -> bytes:
    """Ethernet II; ``vlans`` are (TPID, VLAN id) from the outside in (0x88a8 then 0x8100 = QinQ)."""
    tags = b"".join(struct.pack("!HH", tpid, vid) for tpid, vid in vlans)
    return MAC_B + MAC_A + tags + struct.pack("!H", ethertype) + payload


def ethertype_of(packet: bytes) -> int:
    return 0x0800 if packet[0] >> 4 == 4 else 0x86DD


def linux_sll(payload: bytes, protocol: int) -> bytes:
    """Linux cooked capture v1 header (16 bytes): sent by us, Ethernet address."""
    return struct.pack("!HHH8sH", 4, 1, 6, MAC_A + b"\0\0", protocol) + payload


def linux_sll2(payload: bytes, protocol: int) -> bytes:
    """Linux cooked capture v2 header (20 bytes)."""
    return struct.pack("!HHIHBB8s", protocol, 0, 3, 1, 4, 6, MAC_A + b"\0\0") + payload


def null_loopback(payload: bytes, family: int, order: str = "<") -> bytes:
    """BSD loopback (link type 0): the family in the writer's host byte order."""
    return struct.pack(order + "I", family) + payload


def openbsd_loop(payload: bytes, family: int) -> bytes:
    """OpenBSD loop (link type 108): the family big-endian."""
    return struct.pack("!I", family) + payload


def mpls(payload: bytes, labels: list[int] = (16,)) -> bytes:
    entries = [(label << 12) | (64 if i < len(labels) - 1 else 0x100 | 64) for i, label in enumerate(labels)]
    return b"".join(struct.pack("!I", e) for e in entries) + payload


def pppoe(payload: bytes, ppp_protocol: int = 0x0021) -> bytes:
    return struct.pack("!BBHHH", 0x11, 0, 1, len(payload) + 2, ppp_protocol) + payload


def arista(payload_ethertype: int, payload: bytes, version: int = 0x0010) -> bytes:
    """Arista timestamp header (after ethertype 0xd28b): subtype 1, version, timestamp, ethertype."""
    stamp = bytes(8) if version in (0x0010, 0x0110) else bytes(6)
    return struct.pack("!HH", 1, version) + stamp + struct.pack("!H", payload_ethertype) + payload


ARP = bytes.fromhex("0001080006040001") + MAC_A + bytes([10, 0, 0, 1]) + bytes(6) + bytes([10, 0, 0, 2])


# --- capture files ------------------------------------------------------------------------


@dataclass
class Packet:
    """One frame to write: its bytes, time, and optionally a different wire length."""

    frame: bytes
    ts_ns: int
    orig_len: int | None = None


def pcap(
    packets: list[Packet],
    linktype: int = 1,
    *,
    nanos: bool = False,
    big_endian: bool = False,
    snaplen: int = 65535,
    fcs_bytes: int | None = None,
) -> bytes:
    """A classic libpcap file. Frames longer than ``snaplen`` are cut (orig_len keeps the length)."""
    order = ">" if big_endian else "<"
    field_value = linktype
    if fcs_bytes is not None:
        field_value |= 0x04000000 | ((fcs_bytes // 2) << 28)
    out = [struct.pack(order + "IHHiIII", 0xA1B23C4D if nanos else 0xA1B2C3D4, 2, 4, 0, 0, snaplen, field_value)]
    for p in packets:
        seconds, rest = divmod(p.ts_ns, 1_000_000_000)
        fraction = rest if nanos else rest // 1000
        data = p.frame[:snaplen]
        orig = len(p.frame) if p.orig_len is None else p.orig_len
        out.append(struct.pack(order + "IIII", seconds, fraction, len(data), orig) + data)
    return b"".join(out)


@dataclass
class Interface:
    """An interface description block; ``tsresol`` is the raw if_tsresol byte (None = default µs)."""

    linktype: int = 1
    tsresol: int | None = None
    tsoffset: int | None = None
    snaplen: int = 0
    fcs_bytes: int | None = None

    def ticks(self, ts_ns: int) -> int:
        """A time in this interface's units (rounded down)."""
        code = 6 if self.tsresol is None else self.tsresol
        ts_ns -= (self.tsoffset or 0) * 1_000_000_000
        if code & 0x80:
            return (ts_ns << (code & 0x7F)) // 1_000_000_000
        exponent = code
        return ts_ns * 10**exponent // 1_000_000_000


@dataclass
class Enhanced:
    """An enhanced packet block (``obsolete=True``: the old packet block, type 2)."""

    interface: int
    packet: Packet
    obsolete: bool = False
    cut: int | None = None  # captured length, when shorter than the frame


@dataclass
class Simple:
    """A simple packet block: no interface id, no timestamp."""

    frame: bytes


@dataclass
class Other:
    """Any other block, e.g. name resolution (4) or interface statistics (5)."""

    block_type: int
    body: bytes = bytes(8)


@dataclass
class Section:
    interfaces: list[Interface]
    blocks: list = field(default_factory=list)
    big_endian: bool = False


def _pad4(data: bytes) -> bytes:
    return data + bytes(-len(data) % 4)


def _block(order: str, block_type: int, body: bytes) -> bytes:
    body = _pad4(body)
    length = 12 + len(body)
    return struct.pack(order + "II", block_type, length) + body + struct.pack(order + "I", length)


def _option(order: str, code: int, value: bytes) -> bytes:
    return struct.pack(order + "HH", code, len(value)) + _pad4(value)


def pcapng(*sections: Section) -> bytes:
    """A pcapng file: each section with its byte order, interfaces and blocks in order."""
    out = []
    for section in sections:
        order = ">" if section.big_endian else "<"
        shb = struct.pack(order + "IHHq", 0x1A2B3C4D, 1, 0, -1) + _option(order, 0, b"")
        out.append(_block(order, 0x0A0D0D0A, shb))
        for iface in section.interfaces:
            options = b""
            if iface.tsresol is not None:
                options += _option(order, 9, bytes([iface.tsresol]))
            if iface.tsoffset is not None:
                options += _option(order, 14, struct.pack(order + "q", iface.tsoffset))
            if iface.fcs_bytes is not None:
                options += _option(order, 13, bytes([iface.fcs_bytes]))
            if options:
                options += _option(order, 0, b"")
            out.append(_block(order, 1, struct.pack(order + "HHI", iface.linktype, 0, iface.snaplen) + options))
        for block in section.blocks:
            if isinstance(block, Enhanced):
                iface = section.interfaces[block.interface] if block.interface < len(section.interfaces) else Interface()
                ticks = iface.ticks(block.packet.ts_ns)
                data = block.packet.frame[: block.cut] if block.cut is not None else block.packet.frame
                orig = len(block.packet.frame) if block.packet.orig_len is None else block.packet.orig_len
                if block.obsolete:
                    head = struct.pack(order + "HHIIII", block.interface, 0, ticks >> 32, ticks & 0xFFFFFFFF, len(data), orig)
                    out.append(_block(order, 2, head + _pad4(data)))
                else:
                    head = struct.pack(order + "IIIII", block.interface, ticks >> 32, ticks & 0xFFFFFFFF, len(data), orig)
                    out.append(_block(order, 6, head + _pad4(data)))
            elif isinstance(block, Simple):
                out.append(_block(order, 3, struct.pack(order + "I", len(block.frame)) + _pad4(block.frame)))
            elif isinstance(block, Other):
                out.append(_block(order, block.block_type, block.body))
            else:
                raise TypeError(f"unknown block {block!r}")
    return b"".join(out)


def garbage(size: int = 200) -> bytes:
    """Bytes that are no capture (a text file, as a misplaced CSV would be)."""
    return (b"new,OP_INSERT,1700000000000000,10.0.0.1,8.8.8.8,1234,53,100\n" * (size // 60 + 1))[:size]
