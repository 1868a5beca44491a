"""Read pcap and pcapng captures into parsed packet rows, header fields gathered in bulk.

``parse_capture`` turns the bytes of one capture file into a table of
``traffic.core.records.PARSED_SCHEMA``: one ``packet`` row per IP packet and one ``reject`` row
per frame that cannot be accounted, so nothing is dropped silently. A capture never yields
clock ticks. It never raises on bad input: a truncated or corrupt file gives its good
packets plus ONE reject that names the byte offset and the reason; a file that is not a
capture at all is one reject.

How it is fast: one Python loop walks the record (pcap) or block (pcapng) headers to find
where each frame starts, because each header says where the next one is; everything else
(link-layer headers, IP headers, ports, orientation, text forms of addresses) is read with
numpy gathers over all frames at once, and addresses are turned into text once per distinct
address, not once per packet.

Formats: classic libpcap in both byte orders, microsecond (``a1b2c3d4``) and nanosecond
(``a1b23c4d``) variants, with the FCS length carried in the link-type field; pcapng with
several sections (each with its own byte order), several interfaces (each with its own
link type, ``if_tsresol`` as a power of 10 or of 2, ``if_tsoffset`` and ``if_fcslen``),
enhanced packet blocks and the obsolete packet block. Simple packet blocks carry no
timestamp, so each is rejected (accounting needs the time of every packet). Other block
types (name resolution, statistics, secrets, custom) are skipped: they carry no packets.

Link types: Ethernet (1) with any stack of 802.1Q (0x8100), 802.1ad QinQ (0x88a8) and old
QinQ (0x9100, 0x9200) tags, MPLS label stacks (0x8847, 0x8848: the payload is IP when its
first nibble is 4 or 6), PPPoE sessions (0x8864) carrying IPv4/IPv6, and Arista's
timestamp header (0xd28b, the versions tcpdump and Wireshark decode); Linux cooked
capture v1 (113) and v2 (276); raw IP (101, and 12/14, libpcap's DLT_RAW aliases; 228
IPv4 only; 229 IPv6 only); BSD null/loopback (0, a 4-byte address family in the writer's
host byte order) and OpenBSD loop (108, big-endian): family 2 is IPv4; 10, 24, 28 and 30
are IPv6 (Linux, NetBSD/OpenBSD, FreeBSD, macOS). Any other link type is rejected per
frame ("unsupported link type N").

What is counted, and the decisions on odd packets:

* ``bytes`` is the length of the IP packet as sent, from the IP header (IPv4 total length;
  IPv6 payload length + 40), not the captured length: a capture cut by its snapshot length
  still counts the whole packet.
* IPv6 jumbogram (payload length 0 and a Jumbo Payload option in the hop-by-hop header):
  the jumbo length + 40.
* IPv4 total length 0 (TSO/GSO/BIG TCP packets captured on the sending host before the NIC
  splits them), and IPv6 payload length 0 without a Jumbo Payload option (Linux BIG TCP
  no longer inserts the option) unless the next header is 59 (no next header, a genuine
  40-byte packet): the header does not know the length, so the length is taken from the
  packet record's *original* (wire) length minus the link-layer header and any FCS, never
  less than the IP header itself. Such an IPv4 packet may exceed 65,535 bytes (BIG TCP):
  it is counted as it is, up to ``records.MAX_BYTES_V4_GSO`` (524,280, Linux's GSO_MAX_SIZE);
  a longer one is rejected (what the packets suite accepts is all a capture can produce). A
  non-zero length field is trusted even when the frame is shorter or longer (Ethernet
  padding, truncation).
* Non-IP frames (ARP, AoE, TIPC, LLDP, 802.3/LLC, MPLS carrying Ethernet, an Arista
  header of an unknown version, …) are not IP traffic: each is rejected with a reason
  such as "not an IP packet (ethertype 0x88a2)".
* Tunnels (IP-in-IP, 6in4, GRE, VXLAN, ...) count the outer IP header only: that is what
  crossed the link. ESP and other protocols without ports have null ports.
* Ports for TCP (6), UDP (17) and SCTP (132) only; ICMP, ICMPv6 and anything else keep
  their protocol number with null ports. IPv6 extension headers (hop-by-hop 0, routing 43,
  fragment 44, destination options 60, AH 51) are walked to find the upper protocol.
  Non-first fragments (IPv4 fragment offset > 0, IPv6 fragment header offset > 0) carry no
  transport header: null ports, still counted with their own IP length. If the capture
  is cut inside the extension headers the protocol and ports are null; if it is cut
  inside the transport header the ports are null. A frame whose IP addresses were not
  captured is rejected (it cannot be attributed).
* Orientation from ``local_networks``: the local side is ``local_ip``; ``direction`` is
  ``out`` when the local side sent the packet, else ``in``. Both sides local: ``internal``
  with ``local_ip`` = the sender. Neither side local: a reject "neither address is in
  local_networks (src → dst)", or with ``keep_transit`` a packet with direction
  null (unknown: ``transit`` is no stored direction, DESIGN §6) and ``local_ip`` = the
  sender. With an empty ``local_networks`` every packet is neither-local (the caller warns
  about that).
* An IPv4-mapped IPv6 address (``::ffff:a.b.c.d``) is the IPv4 host it maps, as for text
  inputs (``records.canonical_ip``): it is stored as IPv4, matched against IPv4 networks
  and bounded by the IPv4 packet size (65,535). An IPv6 packet between a mapped and a plain
  IPv6 address is rejected (the two ends would be of different families).
* ``ts`` is UTC with microsecond precision: nanosecond (and finer) timestamps are rounded
  down. A timestamp outside 1970-01-01 .. 9999-12-31 is rejected.
* Reject rows carry ``kind``, ``source``, ``input_file``, ``reason`` and ``record``: the
  frame number (as Wireshark counts it), the byte offset of the frame in the file and a
  hex excerpt of its first 64 bytes; every other column is null.
* Rows come one per frame, in file order; a problem with the file itself (truncated,
  corrupt, not a capture) adds one last row whose ``record`` starts "byte offset N:".
  A pcap record longer than max(snapshot length, 262144) bytes is taken for corruption,
  as libpcap does; in pcapng, a block whose lengths disagree is.

Flow telemetry (DESIGN §7a): ``udp_datagrams`` walks the same frames of a collector file (or of
any capture of export traffic) and gives the UDP payloads with their receive time, exporter address
and ports, for ``traffic.io.flows``; ``ip_headers`` reads sFlow's sampled packet headers by the
rules above. Frames that are not UDP are skipped and counted there, not rejected.

docs/captures.md explains these choices for operators, with the real captures they were
checked on.
"""

from __future__ import annotations

import ipaddress
import logging
import struct
from dataclasses import dataclass

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from traffic.core.records import (
    MAX_BYTES_V4,
    MAX_BYTES_V4_GSO,
    PACKET,
    PARSED_SCHEMA,
    REJECT,
)
from traffic.io.bytes import EXCERPT_BYTES, gather, hex_excerpt, hex_excerpts
from traffic.io.orientation import DIRECTION_TEXTS, IN, LocalNetworks, direction_codes, local_keys, neither_local_reason
from traffic.io.orientation import local_networks as local_networks_of

log = logging.getLogger(__name__)

__all__ = ["Datagrams", "IpHeaders", "ip_headers", "is_capture", "parse_capture", "udp_datagrams"]

# --- formats ------------------------------------------------------------------------------

#: First four bytes of a capture, as stored, and what they mean: (format, byte order, ns).
_MAGICS = {
    b"\xd4\xc3\xb2\xa1": ("pcap", "<", False),
    b"\xa1\xb2\xc3\xd4": ("pcap", ">", False),
    b"\x4d\x3c\xb2\xa1": ("pcap", "<", True),
    b"\xa1\xb2\x3c\x4d": ("pcap", ">", True),
    b"\x0a\x0d\x0d\x0a": ("pcapng", "", False),
}

_PCAPNG_SHB = 0x0A0D0D0A
_PCAPNG_IDB = 1
_PCAPNG_PB = 2  # obsolete packet block: an EPB with a 16-bit interface id
_PCAPNG_SPB = 3
_PCAPNG_EPB = 6
#: Blocks read one at a time (EPBs are checked in bulk), with their smallest valid length.
_CHECKED_BLOCKS = {_PCAPNG_SHB: 28, _PCAPNG_IDB: 20, _PCAPNG_SPB: 16, _PCAPNG_PB: 32}

#: libpcap refuses records larger than this unless the snapshot length is larger.
_MAX_RECORD = 262_144

#: Largest timestamp Spark and Delta can hold: 9999-12-31T23:59:59.999999Z, in µs.
_MAX_TS_US = 253_402_300_799_999_999

# --- link types ---------------------------------------------------------------------------

_LT_NULL, _LT_ETHERNET, _LT_LOOP = 0, 1, 108
_LT_SLL, _LT_SLL2 = 113, 276
_LT_RAW = (101, 12, 14)
_LT_IPV4, _LT_IPV6 = 228, 229

_ET_IPV4, _ET_IPV6 = 0x0800, 0x86DD
_ET_VLAN = (0x8100, 0x88A8, 0x9100, 0x9200)
_ET_MPLS = (0x8847, 0x8848)
_ET_PPPOE = 0x8864
_ET_ARISTA = 0xD28B
_ET_CHAIN = (*_ET_VLAN, *_ET_MPLS, _ET_PPPOE, _ET_ARISTA)
#: Arista timestamp header versions with a 64-bit / 48-bit timestamp (TAI and UTC).
_ARISTA_64 = (0x0010, 0x0110)
_ARISTA_48 = (0x0020, 0x0120)
_MAX_LINK_HEADERS = 16

_AF_INET6 = (10, 24, 28, 30)

_PORT_PROTOCOLS = (6, 17, 132)
_V6_EXTENSIONS = (0, 43, 44, 51, 60)
_MAX_V6_EXTENSIONS = 16

# --- reject reasons -----------------------------------------------------------------------
# Frames are judged in bulk, so a rejected frame carries a reason code and one integer;
# the text is made only for the (few) rejected frames.

_OK = 0
_R_SPB = 1
_R_NO_INTERFACE = 2
_R_TS_RANGE = 3
_R_LINKTYPE = 4
_R_LINK_SHORT = 5
_R_ETHERTYPE = 6
_R_8023 = 7
_R_FAMILY = 8
_R_MPLS = 9
_R_PPP = 10
_R_ARISTA = 11
_R_STACK = 12
_R_NIBBLE = 13
_R_VERSION = 14
_R_IP_SHORT = 15
_R_IHL = 16
_R_TOTAL_LENGTH = 17
_R_NEITHER = 18  # its text is built from the addresses, in _frames_to_table
_R_MAPPED_MIXED = 19
_R_MAPPED_LENGTH = 20
_R_GSO_LENGTH = 21

_REASONS = {
    _R_SPB: lambda v: (
        "simple packet block has no timestamp: accounting needs the time of each packet"
    ),
    _R_NO_INTERFACE: lambda v: (
        f"packet refers to interface {v}, which no interface description block of its "
        "section describes"
    ),
    _R_TS_RANGE: lambda v: "timestamp outside 1970-01-01 .. 9999-12-31",
    _R_LINKTYPE: lambda v: f"unsupported link type {v}",
    _R_LINK_SHORT: lambda v: f"frame cut off inside its link-layer headers ({v} bytes captured)",
    _R_ETHERTYPE: lambda v: f"not an IP packet (ethertype 0x{v:04x})",
    _R_8023: lambda v: f"not an IP packet (IEEE 802.3 frame with length field {v}, LLC)",
    _R_FAMILY: lambda v: f"not an IP packet (loopback address family {v})",
    _R_MPLS: lambda v: f"not an IP packet (MPLS payload starting with 0x{v:02x})",
    _R_PPP: lambda v: f"not an IP packet (PPPoE session, PPP protocol 0x{v:04x})",
    _R_ARISTA: lambda v: (
        f"unknown Arista vendor header (subtype 0x{v >> 16:04x}, version 0x{v & 0xFFFF:04x}): "
        "cannot find the packet inside"
    ),
    _R_STACK: lambda v: f"more than {_MAX_LINK_HEADERS} stacked link-layer headers (VLAN/MPLS)",
    _R_NIBBLE: lambda v: f"not an IP packet (version nibble {v} in a raw IP frame)",
    _R_VERSION: lambda v: f"IPv{v >> 4} frame whose IP header says version {v & 15}",
    _R_IP_SHORT: lambda v: f"IP header cut off by the capture ({v} bytes captured): addresses unknown",
    _R_IHL: lambda v: f"bad IPv4 header length ({v} bytes)",
    _R_TOTAL_LENGTH: lambda v: f"IPv4 total length {v >> 8} is shorter than its header ({v & 0xFF} bytes)",
    _R_MAPPED_MIXED: lambda v: (
        "IPv6 packet between an IPv4-mapped address and a plain IPv6 one: stored as IPv4 and IPv6, "
        "the two ends would be of different families"
    ),
    _R_MAPPED_LENGTH: lambda v: (
        f"IPv6 packet of {v} bytes between IPv4-mapped addresses is more than an IPv4 packet can carry "
        f"({MAX_BYTES_V4})"
    ),
    _R_GSO_LENGTH: lambda v: (
        f"IPv4 packet of {v} bytes (from the record's wire length) is more than a GSO/BIG TCP "
        f"super-packet can carry ({MAX_BYTES_V4_GSO})"
    ),
}


def is_capture(head: bytes) -> bool:
    """Whether a file starting with ``head`` is a pcap (either byte order, µs or ns) or pcapng file."""
    return bytes(head[:4]) in _MAGICS


def parse_capture(
    data: bytes,
    *,
    source: str,
    input_file: str,
    local_networks: list[str],
    keep_transit: bool = False,
    own: tuple[int, int] | None = None,
) -> pa.Table:
    """Parse one capture file into ``PARSED_SCHEMA`` rows (packets and rejects, never ticks).

    ``own`` splits one capture between tasks: each reads the whole file's record headers (they
    chain, so none can start in the middle) but decodes only the frames whose first byte lies in
    ``[start, end)``; the task whose range reaches the end of the file also reports a problem with
    the file itself. Ranges that tile the file give every frame and every reject exactly once.

    Raises ``ValueError`` only for a bad ``local_networks`` entry (configuration, not
    input); bad capture bytes become rejects.
    """
    networks = local_networks_of(local_networks)
    start, end = own if own is not None else (0, len(data))
    try:
        frames, file_reject = _read_frames(data)
        numbers = None  # each frame's index in the file (rejects name frames by their number)
        if own is not None:
            numbers = np.flatnonzero((frames.pos >= start) & (frames.pos < end))
            frames = frames.take(numbers)
        table = _frames_to_table(data, frames, networks, keep_transit, source, input_file, numbers)
    except Exception as exc:  # a reader bug must not stop the batch; the reject says so
        log.exception("could not read capture %s", input_file)
        table = PARSED_SCHEMA.empty_table()
        file_reject = (
            f"could not read capture ({type(exc).__name__}: {exc})",
            f"byte offset 0: {hex_excerpt(data, 0, len(data))}",
        )
    if file_reject is not None and end >= len(data):
        reason, record = file_reject
        table = pa.concat_tables([table, _reject_table(reason, record, source, input_file)])
    return table


# --- UDP datagrams of flow export (DESIGN §7a) -----------------------------------------------


@dataclass(frozen=True)
class Datagrams:
    """UDP payloads from exporters, in file order: numpy columns over one shared buffer.

    Payload ``i`` is ``buffer[offset[i] : offset[i] + length[i]]`` (usually the capture file itself:
    nothing is copied). ``number`` is the frame's number in its file (as Wireshark counts them);
    ``skipped`` counts the frames that are not UDP datagrams, by reason.
    """

    buffer: bytes
    offset: np.ndarray  # int64
    length: np.ndarray  # int64
    receive_ts: np.ndarray  # int64, µs since the epoch
    exporter: list[str]  # the sender's address, canonical text
    src_port: np.ndarray  # int64
    dst_port: np.ndarray  # int64
    number: np.ndarray  # int64, 1-based
    skipped: dict[str, int]

    def __len__(self) -> int:
        return len(self.offset)

    def payload(self, i: int) -> bytes:
        """The bytes of datagram ``i``."""
        start = int(self.offset[i])
        return bytes(self.buffer[start : start + int(self.length[i])])

    @staticmethod
    def from_payloads(items: list[tuple[int, str, int, int, bytes]]) -> Datagrams:
        """Datagrams from (receive µs, exporter address, source port, destination port, payload) tuples."""
        offsets, at = [], 0
        for item in items:
            offsets.append(at)
            at += len(item[4])
        column = lambda k: np.array([item[k] for item in items], np.int64)  # noqa: E731
        return Datagrams(
            buffer=b"".join(item[4] for item in items),
            offset=np.array(offsets, np.int64),
            length=np.array([len(item[4]) for item in items], np.int64),
            receive_ts=column(0),
            exporter=[_exporter_text(item[1]) for item in items],
            src_port=column(2),
            dst_port=column(3),
            number=np.arange(1, len(items) + 1, dtype=np.int64),
            skipped={},
        )


def _exporter_text(text: str) -> str:
    address = ipaddress.ip_address(text)
    if address.version == 6 and address.ipv4_mapped is not None:
        address = address.ipv4_mapped
    return str(address)


#: Frames of a telemetry capture that are simply not export traffic: skipped and counted.
_NOT_IP = (_R_ETHERTYPE, _R_8023, _R_FAMILY, _R_MPLS, _R_PPP)
_R_FRAGMENT = 40
_R_UDP_CUT = 41
_R_UDP_LENGTH = 42
_R_DATAGRAM_CUT = 43
_REASONS.update({
    _R_FRAGMENT: lambda v: "fragmented datagram: reassembly not supported",
    _R_UDP_CUT: lambda v: "UDP header cut off by the capture",
    _R_UDP_LENGTH: lambda v: f"bad UDP length {v} (less than its 8-byte header)",
    _R_DATAGRAM_CUT: lambda v: (
        f"datagram cut off by the capture ({v & 0xFFFFFFFF} of {v >> 32} bytes captured)"
    ),
})


def udp_datagrams(data: bytes, *, input_file: str, source: str) -> tuple[Datagrams, pa.Table]:
    """The UDP datagrams of a capture (a collector file or any capture of export traffic), and its rejects.

    Frames are walked as ``parse_capture`` walks them (every link type, VLANs, pcapng, ...). A frame
    that is no IP packet (ARP, LLDP, ...) or an IP packet that is not UDP is not export traffic: it
    is skipped and counted in ``Datagrams.skipped`` (a capture made with another tool on an
    exporter's link carries such frames as a matter of course). A UDP datagram the capture cannot
    give whole is a reject (``PARSED_SCHEMA``, as ``parse_capture`` words them): an IP fragment (a
    later one, or a first one with more to come: reassembly is not supported), a UDP header or
    payload cut by the snapshot length, a UDP length below 8; so is a frame whose headers are
    broken, and a problem with the file itself (one last row). The datagram is what the UDP
    length says (Ethernet padding after it is not part of it). Never raises on bad input.
    """
    skipped: dict[str, int] = {}
    try:
        frames, file_reject = _read_frames(data)
        buf = np.frombuffer(data, np.uint8)
        n = len(frames.pos)
        d = _decode(buf, frames) if n else None
        code, value = frames.code, frames.value
        if n:
            _store_mapped_as_ipv4(d, code, value)
        not_ip = np.isin(code, _NOT_IP)
        if not_ip.any():
            skipped["not an IP packet"] = int(not_ip.sum())
        code[not_ip] = -1
        ok = code == _OK
        other = ok & (d.protocol != 17) if n else ok
        if other.any():
            skipped["IP packet that is not UDP"] = int(other.sum())
        code[other] = -1
        udp = code == _OK
        if n:
            _reject(code, value, udp & d.fragmented, _R_FRAGMENT, 0)
            end = frames.pos + frames.cap
            at = d.transport
            _reject(code, value, udp & ((at < 0) | (at + 8 > end)), _R_UDP_CUT, 0)
            udp_length = _be16(buf, at + 4)
            _reject(code, value, udp & (udp_length < 8), _R_UDP_LENGTH, udp_length)
            cut = udp & (at + udp_length > end)
            _reject(code, value, cut, _R_DATAGRAM_CUT, ((udp_length - 8) << 32) | np.maximum(end - at - 8, 0))
        rows = np.flatnonzero(code == _OK)
        if n:
            index, texts, _ = _addresses(d.addresses[:n][rows], LocalNetworks())
            texts = texts.to_pylist()
            datagrams = Datagrams(
                buffer=data,
                offset=d.transport[rows] + 8,
                length=udp_length[rows] - 8,
                receive_ts=frames.ts[rows],
                exporter=[texts[k] for k in index.tolist()],
                src_port=d.src_port[rows],
                dst_port=d.dst_port[rows],
                number=rows + 1,
                skipped=skipped,
            )
        else:
            datagrams = Datagrams.from_payloads([])
            datagrams.skipped.update(skipped)
        rejected = np.flatnonzero(code > _OK)
        rejects = _rejects_table(
            _coded_reasons(code[rejected], value[rejected]),
            _frame_excerpts(buf, rejected, frames.pos[rejected], frames.cap[rejected]),
            source, input_file,
        )
    except Exception as exc:  # a reader bug must not stop the batch; the reject says so
        log.exception("could not read capture %s", input_file)
        datagrams = Datagrams.from_payloads([])
        rejects = PARSED_SCHEMA.empty_table()
        file_reject = (
            f"could not read capture ({type(exc).__name__}: {exc})",
            f"byte offset 0: {hex_excerpt(data, 0, len(data))}",
        )
    if file_reject is not None:
        reason, record = file_reject
        rejects = pa.concat_tables([rejects, _reject_table(reason, record, source, input_file)])
    return datagrams, rejects


def _rejects_table(reasons: pa.Array, records: pa.Array, source: str, input_file: str) -> pa.Table:
    """Reject rows with the given reasons and records; every other column null."""
    n = len(reasons)
    columns = {field.name: pa.nulls(n, field.type) for field in PARSED_SCHEMA}
    columns.update(
        kind=pa.repeat(pa.scalar(REJECT, pa.string()), n),
        source=pa.repeat(pa.scalar(source, pa.string()), n),
        input_file=pa.repeat(pa.scalar(input_file, pa.string()), n),
        reason=reasons.cast(pa.string()),
        record=records.cast(pa.string()),
    )
    return pa.Table.from_arrays([columns[field.name] for field in PARSED_SCHEMA], schema=PARSED_SCHEMA)


@dataclass(frozen=True)
class IpHeaders:
    """What sampled packet headers say (sFlow), one entry per header; see ``ip_headers``."""

    problem: list  # None, or why the header cannot be accounted
    not_ip: np.ndarray  # bool: a frame that is no IP packet (not a problem, just not traffic)
    addresses: np.ndarray  # (2n, 17) uint8 keys: family byte, then the address (IPv4 in the last 4)
    protocol: np.ndarray  # -1 = unknown
    src_port: np.ndarray  # -1 = none
    dst_port: np.ndarray
    length: np.ndarray  # the IP packet's length, from its header


def ip_headers(buffer: bytes, pos: np.ndarray, captured: np.ndarray, wire: np.ndarray,
               linktype: np.ndarray) -> IpHeaders:
    """Read the packet headers at ``pos`` (``captured`` bytes of frames ``wire`` bytes long) as captures are read.

    The same link-layer and IP rules as ``parse_capture`` (VLANs, MPLS, IPv4-mapped addresses, ...):
    sFlow's sampled headers are the start of frames, like a capture's with a short snapshot length.
    """
    n = len(pos)
    frames = _Frames(
        pos=pos.astype(np.int64), cap=captured.astype(np.int64), orig=wire.astype(np.int64),
        ts=np.zeros(n, np.int64), linktype=linktype.astype(np.int64), fcs=np.zeros(n, np.int64),
        code=np.zeros(n, np.int16), value=np.zeros(n, np.int64),
    )
    buf = np.frombuffer(buffer, np.uint8)
    d = _decode(buf, frames)
    code = frames.code
    _store_mapped_as_ipv4(d, code, frames.value)
    not_ip = np.isin(code, _NOT_IP)
    problem = [None] * n
    bad = np.flatnonzero((code != _OK) & ~not_ip)
    for k, text in zip(bad.tolist(), _coded_reasons(code[bad], frames.value[bad]).to_pylist()):
        problem[k] = text
    return IpHeaders(problem, not_ip, d.addresses, d.protocol, d.src_port, d.dst_port, d.length)


# --- reading the container ----------------------------------------------------------------


@dataclass
class _Frames:
    """One entry per packet-carrying record, in file order (numpy columns)."""

    pos: np.ndarray  # byte offset of the frame's first captured byte
    cap: np.ndarray  # captured length
    orig: np.ndarray  # original (wire) length
    ts: np.ndarray  # µs since the epoch
    linktype: np.ndarray
    fcs: np.ndarray  # FCS bytes at the end of the wire frame
    code: np.ndarray  # reject reason code, _OK if none yet
    value: np.ndarray  # the reason's argument

    @staticmethod
    def empty() -> _Frames:
        z = np.zeros(0, np.int64)
        return _Frames(z, z, z, z, z, z, z.astype(np.int16), z)

    def take(self, order: np.ndarray) -> _Frames:
        return _Frames(*(getattr(self, f)[order] for f in self.__dataclass_fields__))

    @staticmethod
    def concat(parts: list[_Frames]) -> _Frames:
        if not parts:
            return _Frames.empty()
        return _Frames(
            *(np.concatenate([getattr(p, f) for p in parts]) for f in _Frames.__dataclass_fields__)
        )


def _read_frames(data: bytes) -> tuple[_Frames, tuple[str, str] | None]:
    """Find every frame of the capture; a problem with the file itself is one (reason, record)."""
    kind = _MAGICS.get(bytes(data[:4]))
    if kind is None:
        what = f"magic 0x{bytes(data[:4]).hex()}" if len(data) >= 4 else f"only {len(data)} bytes"
        return _Frames.empty(), (
            f"not a pcap or pcapng file ({what})",
            f"byte offset 0: {hex_excerpt(data, 0, len(data))}",
        )
    fmt, order, nanos = kind
    if fmt == "pcap":
        return _read_pcap(data, order, nanos)
    return _read_pcapng(data)


def _file_problem(data: bytes, offset: int, reason: str) -> tuple[str, str]:
    """The one (reason, record) for a file that stops being readable at ``offset``."""
    return (
        f"{reason}; the packets before it are kept, the rest of the file is not read",
        f"byte offset {offset}: {hex_excerpt(data, offset, len(data) - offset)}",
    )


def _read_pcap(data: bytes, order: str, nanos: bool) -> tuple[_Frames, tuple[str, str] | None]:
    """Frames of a classic libpcap file, up to the first truncated or corrupt record."""
    size = len(data)
    if size < 24:
        return _Frames.empty(), _file_problem(
            data, 0, f"pcap file header cut off ({size} of 24 bytes)"
        )
    snaplen, linktype_field = struct.unpack_from(order + "II", data, 16)
    linktype = linktype_field & 0x03FFFFFF
    fcs = ((linktype_field >> 28) & 0xF) * 2 if linktype_field & 0x04000000 else 0

    buf = np.frombuffer(data, np.uint8)
    rec, offset = record_offsets(data, buf, order)
    header = gather(buf, rec, 16).view(order + "u4").reshape(-1, 4).astype(np.int64)
    sec, frac, cap, orig = header.T
    problem = None
    bound = max(snaplen, _MAX_RECORD)
    bad = np.flatnonzero(cap > bound)
    if len(bad):
        k = int(bad[0])
        problem = _file_problem(
            data,
            int(rec[k]),
            f"corrupt capture: the packet record at byte offset {int(rec[k])} claims "
            f"{int(cap[k])} captured bytes (more than the snapshot length {bound})",
        )
    elif len(rec) and rec[-1] + 16 + cap[-1] > size:
        k = len(rec) - 1
        problem = _file_problem(
            data,
            int(rec[k]),
            f"capture truncated: the packet record at byte offset {int(rec[k])} needs "
            f"{16 + int(cap[k])} bytes, only {size - int(rec[k])} remain",
        )
    else:
        k = len(rec)
        if offset < size:
            problem = _file_problem(
                data,
                offset,
                f"capture truncated: record header at byte offset {offset} cut off "
                f"({size - offset} of 16 bytes)",
            )
    sec, frac, cap, orig, rec = sec[:k], frac[:k], cap[:k], orig[:k], rec[:k]
    ts = sec * 1_000_000 + (frac // 1000 if nanos else frac)
    n = len(rec)
    frames = _Frames(
        pos=rec + 16,
        cap=cap,
        orig=orig,
        ts=ts,
        linktype=np.full(n, linktype, np.int64),
        fcs=np.full(n, fcs, np.int64),
        code=np.zeros(n, np.int16),
        value=np.zeros(n, np.int64),
    )
    return frames, problem


#: Records tried at once by ``record_offsets`` (grows while guesses hold, up to the last figure).
_GUESS_FIRST, _GUESS_MOST = 64, 1 << 16
#: Records walked one by one after a guess that held for fewer than 8 (lengths that vary).
_WALK_AFTER_MISS = 256


def record_offsets(data: bytes, buf: np.ndarray, order: str) -> tuple[np.ndarray, int]:
    """Byte offsets of the pcap record headers from byte 24, and the offset after the last whole one.

    Each header's captured length says where the next one starts, so the walk is sequential. A
    capture cut to a fixed snapshot length (headers only, the usual capture for accounting) has runs
    of records of one length: the walk guesses that the next ``k`` records have the current one's
    length and checks all ``k`` guesses at once with numpy; the records up to the first wrong guess
    are exactly right (each guess is checked at an offset all earlier guesses put it at). Where
    lengths vary, it walks record by record, as a plain loop would.
    """
    unpack_len = struct.Struct(order + "I").unpack_from
    dtype = np.dtype(order + "u4")
    parts: list[np.ndarray] = []
    offsets: list[int] = []
    append = offsets.append
    offset, last_header, guess = 24, len(data) - 16, _GUESS_FIRST
    while offset <= last_header:
        step = 16 + unpack_len(data, offset + 8)[0]
        k = min(guess, (last_header - offset) // step + 1)
        if k < 8:
            append(offset)
            offset += step
            continue
        at = offset + step * np.arange(k, dtype=np.int64)
        same = gather(buf, at + 8, 4).view(dtype).ravel() == step - 16
        held = k if same.all() else int(np.argmin(same))
        if offsets:
            parts.append(np.array(offsets, dtype=np.int64))
            offsets.clear()
        parts.append(at[:held])
        offset += step * held
        if held == k:
            guess = min(guess * 2, _GUESS_MOST)
            continue
        guess = _GUESS_FIRST
        if held < 8:
            for _ in range(_WALK_AFTER_MISS):
                if offset > last_header:
                    break
                append(offset)
                offset += 16 + unpack_len(data, offset + 8)[0]
    parts.append(np.array(offsets, dtype=np.int64))
    return np.concatenate(parts), offset


@dataclass
class _Interface:
    linktype: int
    tsresol: int = 6  # if_tsresol byte: 10**-v, or 2**-(v & 0x7f) when the top bit is set
    tsoffset: int = 0  # seconds
    fcs: int = 0


@dataclass
class _Section:
    order: str
    interfaces: list[_Interface]
    epb: list[int]
    pb: list[int]
    spb: list[int]


def _read_pcapng(data: bytes) -> tuple[_Frames, tuple[str, str] | None]:
    """Frames of a pcapng file (all sections), up to the first truncated or corrupt block."""
    size = len(data)
    sections: list[_Section] = []
    problem = None
    cut = size  # frames in blocks at or after this offset are dropped (a corrupt block)
    offset = 0
    section: _Section | None = None
    unpack_block = struct.Struct("<II").unpack_from
    while offset < size:
        if size - offset < 12:
            problem = _file_problem(
                data, offset, f"capture truncated: block header at byte offset {offset} cut off "
                f"({size - offset} of 12 bytes)"
            )
            break
        block_type, length = unpack_block(data, offset)
        if block_type == _PCAPNG_SHB:
            bom = bytes(data[offset + 8 : offset + 12])
            order = {b"\x4d\x3c\x2b\x1a": "<", b"\x1a\x2b\x3c\x4d": ">"}.get(bom)
            if order is None:
                problem = _file_problem(
                    data, offset, f"corrupt capture: section header block at byte offset {offset} "
                    f"has no valid byte-order magic (0x{bom.hex()})"
                )
                break
            unpack_block = struct.Struct(order + "II").unpack_from
            block_type, length = unpack_block(data, offset)
            section = _Section(order, [], [], [], [])
            sections.append(section)
        elif section is None:
            problem = _file_problem(
                data, offset, "corrupt capture: pcapng file does not start with a section header block"
            )
            break
        if length < 12 or length % 4:
            problem = _file_problem(
                data, offset, f"corrupt capture: block at byte offset {offset} has an invalid "
                f"length {length}"
            )
            break
        if offset + length > size:
            problem = _file_problem(
                data, offset, f"capture truncated: block at byte offset {offset} needs {length} "
                f"bytes, only {size - offset} remain"
            )
            break
        if block_type == _PCAPNG_EPB:
            section.epb.append(offset)
        elif block_type in _CHECKED_BLOCKS:
            (trailer,) = struct.unpack_from(section.order + "I", data, offset + length - 4)
            if trailer != length or length < _CHECKED_BLOCKS[block_type]:
                problem = _file_problem(
                    data, offset, f"corrupt capture: block at byte offset {offset} (type {block_type}) "
                    f"has inconsistent lengths ({length} and {trailer})"
                )
                break
            if block_type == _PCAPNG_IDB:
                section.interfaces.append(_read_idb(data, offset, length, section.order))
            elif block_type == _PCAPNG_SPB:
                section.spb.append(offset)
            elif block_type == _PCAPNG_PB:
                section.pb.append(offset)
        offset += length

    buf = np.frombuffer(data, np.uint8)
    parts: list[_Frames] = []
    for section in sections:
        for offsets, block_type in ((section.epb, _PCAPNG_EPB), (section.pb, _PCAPNG_PB)):
            if offsets:
                frames, bad_at, why = _packet_blocks(buf, np.array(offsets, np.int64), block_type, section)
                if bad_at is not None and bad_at < cut:
                    cut, problem = bad_at, _file_problem(data, bad_at, why)
                parts.append(frames)
        if section.spb:
            parts.append(_simple_packet_blocks(buf, np.array(section.spb, np.int64), section.order))
    frames = _Frames.concat(parts)
    frames = frames.take(np.argsort(frames.pos, kind="stable"))
    if cut < size:
        frames = frames.take(np.flatnonzero(frames.pos < cut))
    return frames, problem


def _read_idb(data: bytes, offset: int, length: int, order: str) -> _Interface:
    """An interface description block: link type and the options that change how we read."""
    (linktype,) = struct.unpack_from(order + "H", data, offset + 8)
    interface = _Interface(linktype)
    option, end = offset + 16, offset + length - 4
    while option + 4 <= end:
        code, size = struct.unpack_from(order + "HH", data, option)
        value = bytes(data[option + 4 : option + 4 + size])
        if code == 0 or option + 4 + size > end:
            break
        if code == 9 and size >= 1:
            interface.tsresol = value[0]
        elif code == 14 and size == 8:
            (interface.tsoffset,) = struct.unpack(order + "q", value)
        elif code == 13 and size >= 1:
            interface.fcs = value[0]
        option += 4 + ((size + 3) & ~3)
    return interface


def _packet_blocks(
    buf: np.ndarray, blocks: np.ndarray, block_type: int, section: _Section
) -> tuple[_Frames, int | None, str]:
    """Enhanced (or obsolete) packet blocks of one section, read in bulk."""
    order = section.order
    length_and_fields = gather(buf, blocks + 4, 24).view(order + "u4").reshape(-1, 6).astype(np.int64)
    length, interface, ts_high, ts_low, cap, orig = length_and_fields.T
    if block_type == _PCAPNG_PB:
        interface = interface & 0xFFFF if order == "<" else interface >> 16
    trailer = gather(buf, blocks + length - 4, 4).view(order + "u4").reshape(-1).astype(np.int64)
    bad = np.flatnonzero((length < 32) | (trailer != length) | (cap > length - 32))
    bad_at, why = None, ""
    if len(bad):
        k = int(bad[0])
        bad_at = int(blocks[k])
        why = (
            f"corrupt capture: packet block at byte offset {bad_at} is inconsistent (block "
            f"length {int(length[k])}, trailing length {int(trailer[k])}, captured length "
            f"{int(cap[k])})"
        )
    n = len(blocks)
    code = np.zeros(n, np.int16)
    value = np.zeros(n, np.int64)
    linktype = np.full(n, -1, np.int64)
    fcs = np.zeros(n, np.int64)
    ts = np.zeros(n, np.int64)
    raw_ts = (ts_high.astype(np.uint64) << np.uint64(32)) | ts_low.astype(np.uint64)
    unknown = interface >= len(section.interfaces)
    code[unknown] = _R_NO_INTERFACE
    value[unknown] = interface[unknown]
    for number, described in enumerate(section.interfaces):
        mine = np.flatnonzero(interface == number)
        if not len(mine):
            continue
        linktype[mine] = described.linktype
        fcs[mine] = described.fcs
        us, ok = _to_microseconds(raw_ts[mine], described.tsresol, described.tsoffset)
        ts[mine] = us
        code[mine[~ok]] = _R_TS_RANGE
    frames = _Frames(blocks + 28, cap, orig, ts, linktype, fcs, code, value)
    return frames, bad_at, why


def _simple_packet_blocks(buf: np.ndarray, blocks: np.ndarray, order: str) -> _Frames:
    """Simple packet blocks: no interface id and no timestamp, so each one is a reject."""
    length, orig = gather(buf, blocks + 4, 8).view(order + "u4").reshape(-1, 2).astype(np.int64).T
    n = len(blocks)
    return _Frames(
        pos=blocks + 12,
        cap=np.minimum(orig, length - 16),
        orig=orig,
        ts=np.zeros(n, np.int64),
        linktype=np.full(n, -1, np.int64),
        fcs=np.zeros(n, np.int64),
        code=np.full(n, _R_SPB, np.int16),
        value=np.zeros(n, np.int64),
    )


def _to_microseconds(raw: np.ndarray, tsresol: int, tsoffset: int) -> tuple[np.ndarray, np.ndarray]:
    """pcapng timestamp units → µs since the epoch, rounded down; and which are in range."""
    exponent = tsresol & 0x7F
    if tsresol & 0x80:  # a power of two
        if exponent <= 44:  # (2**44 - 1) * 10**6 still fits in 64 bits
            mask = np.uint64((1 << exponent) - 1)
            shift = np.uint64(exponent)
            whole = raw >> shift
            part = ((raw & mask) * np.uint64(1_000_000)) >> shift
            ok = whole <= np.uint64(_MAX_TS_US // 1_000_000)
            us = np.where(ok, whole, 0).astype(np.int64) * 1_000_000 + part.astype(np.int64)
        else:  # finer than 2**-44 s: rare enough for Python integers
            exact = [(int(t) * 1_000_000) >> exponent for t in raw]
            ok = np.array([t <= _MAX_TS_US for t in exact], bool)
            us = np.array([t if t <= _MAX_TS_US else 0 for t in exact], np.int64)
    elif exponent >= 6:
        divisor = 10 ** (exponent - 6)
        us = (raw // np.uint64(divisor)).astype(np.int64) if divisor < 2**64 else np.zeros(len(raw), np.int64)
        ok = us <= _MAX_TS_US if divisor < 2**64 else np.ones(len(raw), bool)
        us = np.where(ok, us, 0)
    else:
        factor = 10 ** (6 - exponent)
        ok = raw <= np.uint64(_MAX_TS_US // factor)
        us = np.where(ok, raw, 0).astype(np.int64) * factor
    if abs(tsoffset) > _MAX_TS_US // 1_000_000:  # no time plus this offset is in range
        return np.zeros(len(raw), np.int64), np.zeros(len(raw), bool)
    us = us + tsoffset * 1_000_000
    ok = ok & (us >= 0) & (us <= _MAX_TS_US)
    return us, ok


# --- decoding frames ----------------------------------------------------------------------


def _u8(buf: np.ndarray, pos: np.ndarray) -> np.ndarray:
    """The byte at each position (clamped into the file: callers mask what was not captured)."""
    if not len(buf):
        return np.zeros(len(pos), np.int64)
    return buf[np.clip(pos, 0, len(buf) - 1)].astype(np.int64)


def _be16(buf: np.ndarray, pos: np.ndarray) -> np.ndarray:
    return (_u8(buf, pos) << 8) | _u8(buf, pos + 1)


def _be32(buf: np.ndarray, pos: np.ndarray) -> np.ndarray:
    return gather(buf, pos, 4).view(">u4").reshape(-1).astype(np.int64)


def _le32(buf: np.ndarray, pos: np.ndarray) -> np.ndarray:
    return gather(buf, pos, 4).view("<u4").reshape(-1).astype(np.int64)


@dataclass
class _Decoded:
    """What the IP headers say, one entry per frame (valid where ``code == _OK``)."""

    family: np.ndarray  # 4 or 6
    #: (2n, 17) uint8: family, then the address (IPv4 in the last four bytes); sources in
    #: the first n rows, destinations in the next n
    addresses: np.ndarray
    protocol: np.ndarray  # -1 = unknown
    src_port: np.ndarray  # -1 = none
    dst_port: np.ndarray
    length: np.ndarray
    transport: np.ndarray  # offset of the transport header in the file, -1 = unknown or not captured
    fragmented: np.ndarray  # a fragment of a larger IP packet (first or later)


def _reject(code: np.ndarray, value: np.ndarray, where: np.ndarray, reason: int, arg) -> None:
    """Mark frames (a boolean mask) as rejected unless they already are."""
    where = where & (code == _OK)
    code[where] = reason
    value[where] = arg[where] if isinstance(arg, np.ndarray) else arg


def _decode(buf: np.ndarray, f: _Frames) -> _Decoded:
    """Walk link-layer and IP headers of all frames at once; rejects go into ``f.code``."""
    n = len(f.pos)
    code, value = f.code, f.value
    end = f.pos + f.cap  # one past the last captured byte
    l3 = np.zeros(n, np.int64)
    want = np.zeros(n, np.int64)  # IP version the link layer announced, 0 = read it

    # Link layers that announce the network protocol with an ethertype.
    ether = f.linktype == _LT_ETHERNET
    sll = f.linktype == _LT_SLL
    sll2 = f.linktype == _LT_SLL2
    typed = (ether | sll | sll2) & (code == _OK)
    header = np.select([ether, sll, sll2], [14, 16, 20], 0)
    _reject(code, value, typed & (f.cap < header), _R_LINK_SHORT, f.cap)
    typed &= code == _OK
    ethertype = np.where(typed, _be16(buf, f.pos + np.select([ether, sll], [12, 14], 0)), -1)
    here = f.pos + header  # position just after the current ethertype
    for _ in range(_MAX_LINK_HEADERS):
        chained = np.flatnonzero(typed & (code == _OK) & np.isin(ethertype, _ET_CHAIN))
        if not len(chained):
            break
        _follow_link_header(buf, chained, ethertype, here, end, f.cap, code, value)
    else:
        stuck = typed & (code == _OK) & np.isin(ethertype, _ET_CHAIN)
        _reject(code, value, stuck, _R_STACK, 0)
    typed &= code == _OK
    want[typed & (ethertype == _ET_IPV4)] = 4
    want[typed & (ethertype == _ET_IPV6)] = 6
    other = typed & (want == 0)
    _reject(code, value, other & ether & (ethertype < 0x0600), _R_8023, ethertype)
    _reject(code, value, other, _R_ETHERTYPE, ethertype)
    l3[typed] = here[typed]

    # Loopback: an address family instead of an ethertype.
    looped = np.isin(f.linktype, (_LT_NULL, _LT_LOOP)) & (code == _OK)
    _reject(code, value, looped & (f.cap < 4), _R_LINK_SHORT, f.cap)
    looped &= code == _OK
    rows = np.flatnonzero(looped)
    if len(rows):
        big_endian = _be32(buf, f.pos[rows])
        # LOOP is big-endian; NULL is in the writing host's byte order, which a family
        # too large for 16 bits betrays
        family = np.where(
            (f.linktype[rows] == _LT_LOOP) | (big_endian <= 0xFFFF), big_endian, _le32(buf, f.pos[rows])
        )
        want[rows[family == 2]] = 4
        want[rows[np.isin(family, _AF_INET6)]] = 6
        not_ip = rows[want[rows] == 0]
        code[not_ip] = _R_FAMILY
        value[not_ip] = family[want[rows] == 0]
        l3[rows] = f.pos[rows] + 4

    # Raw IP.
    raw = np.isin(f.linktype, (*_LT_RAW, _LT_IPV4, _LT_IPV6)) & (code == _OK)
    want[raw & (f.linktype == _LT_IPV4)] = 4
    want[raw & (f.linktype == _LT_IPV6)] = 6
    l3[raw] = f.pos[raw]

    known = typed | looped | raw
    _reject(code, value, ~known, _R_LINKTYPE, f.linktype)

    # The IP header.
    live = code == _OK
    _reject(code, value, live & (l3 >= end), _R_IP_SHORT, np.zeros(n, np.int64))
    version = _u8(buf, l3) >> 4
    _reject(code, value, (want == 0) & ~np.isin(version, (4, 6)), _R_NIBBLE, version)
    _reject(code, value, (want != 0) & (version != want), _R_VERSION, want * 16 + version)
    family = np.where(code == _OK, version, 0)
    link_length = l3 - f.pos
    wire_ip = f.orig - link_length - f.fcs  # what the frame carried after the link header

    d = _Decoded(
        family=family,
        addresses=np.zeros((2 * n, 17), np.uint8),
        protocol=np.full(n, -1, np.int64),
        src_port=np.full(n, -1, np.int64),
        dst_port=np.full(n, -1, np.int64),
        length=np.zeros(n, np.int64),
        transport=np.full(n, -1, np.int64),
        fragmented=np.zeros(n, bool),
    )
    v4 = np.flatnonzero(family == 4)
    if len(v4):
        _decode_ipv4(buf, v4, l3[v4], end[v4], wire_ip[v4], d, code, value)
    v6 = np.flatnonzero(family == 6)
    if len(v6):
        _decode_ipv6(buf, v6, l3[v6], end[v6], wire_ip[v6], d, code, value)
    return d


def _follow_link_header(buf, rows, ethertype, here, end, cap, code, value) -> None:
    """Step over one VLAN tag, MPLS label, PPPoE header or Arista header for ``rows``."""
    e, at, stop = ethertype[rows], here[rows], end[rows]
    short = np.zeros(len(rows), bool)
    bad = np.zeros(len(rows), np.int16)
    arg = np.zeros(len(rows), np.int64)

    vlan = np.isin(e, _ET_VLAN)
    short |= vlan & (at + 4 > stop)
    e = np.where(vlan, _be16(buf, at + 2), e)
    next_at = np.where(vlan, at + 4, at)

    mpls = np.isin(e, _ET_MPLS) & ~vlan
    bottom = (_u8(buf, at + 2) & 1) == 1
    short |= mpls & (at + 4 > stop)
    short |= mpls & bottom & (at + 5 > stop)
    first = _u8(buf, at + 4)
    nibble = first >> 4
    payload = np.where(nibble == 4, _ET_IPV4, np.where(nibble == 6, _ET_IPV6, -1))
    done = mpls & bottom
    bad = np.where(done & (payload < 0), _R_MPLS, bad)
    arg = np.where(done & (payload < 0), first, arg)
    e = np.where(done, payload, e)
    next_at = np.where(mpls, at + 4, next_at)

    pppoe = (e == _ET_PPPOE) & ~vlan & ~mpls
    short |= pppoe & (at + 8 > stop)
    ppp = _be16(buf, at + 6)
    mapped = np.where(ppp == 0x0021, _ET_IPV4, np.where(ppp == 0x0057, _ET_IPV6, -1))
    bad = np.where(pppoe & (mapped < 0), _R_PPP, bad)
    arg = np.where(pppoe & (mapped < 0), ppp, arg)
    e = np.where(pppoe, mapped, e)
    next_at = np.where(pppoe, at + 8, next_at)

    arista = (e == _ET_ARISTA) & ~vlan & ~mpls & ~pppoe
    subtype, version = _be16(buf, at), _be16(buf, at + 2)
    stamp = np.where(
        subtype == 1,
        np.where(np.isin(version, _ARISTA_64), 8, np.where(np.isin(version, _ARISTA_48), 6, 0)),
        0,
    )
    short |= arista & (at + 4 > stop)
    unknown = arista & (stamp == 0)
    bad = np.where(unknown, _R_ARISTA, bad)
    arg = np.where(unknown, (subtype << 16) | version, arg)
    short |= arista & ~unknown & (at + 6 + stamp > stop)
    e = np.where(arista, _be16(buf, at + 4 + stamp), e)
    next_at = np.where(arista, at + 6 + stamp, next_at)

    ethertype[rows] = e
    here[rows] = next_at
    code[rows[short]] = _R_LINK_SHORT
    value[rows[short]] = cap[rows[short]]
    failed = ~short & (bad != 0)
    code[rows[failed]] = bad[failed]
    value[rows[failed]] = arg[failed]


def _decode_ipv4(buf, rows, l3, end, wire_ip, d: _Decoded, code, value) -> None:
    """IPv4 headers of ``rows``: addresses, protocol, ports, length."""
    captured = end - l3
    short = captured < 20
    code[rows[short]] = _R_IP_SHORT
    value[rows[short]] = captured[short]
    fixed = gather(buf, l3, 20)
    header = (fixed[:, 0] & 0x0F).astype(np.int64) * 4
    bad_ihl = ~short & (header < 20)
    code[rows[bad_ihl]] = _R_IHL
    value[rows[bad_ihl]] = header[bad_ihl]
    total = (fixed[:, 2].astype(np.int64) << 8) | fixed[:, 3]
    too_short = ~short & ~bad_ihl & (total != 0) & (total < header)
    code[rows[too_short]] = _R_TOTAL_LENGTH
    value[rows[too_short]] = (total[too_short] << 8) | header[too_short]
    # total length 0: TSO/GSO/BIG TCP; the wire frame is the only measure left
    d.length[rows] = np.where(total == 0, np.maximum(wire_ip, header), total)
    fragment_offset = ((fixed[:, 6].astype(np.int64) & 0x1F) << 8) | fixed[:, 7]
    protocol = fixed[:, 9].astype(np.int64)
    d.protocol[rows] = protocol
    n = len(d.family)
    d.addresses[rows, 0] = 4
    d.addresses[rows, 13:] = fixed[:, 12:16]
    d.addresses[n + rows, 0] = 4
    d.addresses[n + rows, 13:] = fixed[:, 16:20]
    ported = np.isin(protocol, _PORT_PROTOCOLS) & (fragment_offset == 0) & (header + 4 <= captured)
    _set_ports(buf, rows, l3 + header, ported, d)
    d.transport[rows] = np.where(~short & ~bad_ihl & (fragment_offset == 0), l3 + header, -1)
    d.fragmented[rows] = (fragment_offset > 0) | ((fixed[:, 6] & 0x20) != 0)


def _decode_ipv6(buf, rows, l3, end, wire_ip, d: _Decoded, code, value) -> None:
    """IPv6 headers of ``rows``, extension headers walked to the upper protocol."""
    captured = end - l3
    short = captured < 40
    code[rows[short]] = _R_IP_SHORT
    value[rows[short]] = captured[short]
    fixed = gather(buf, l3, 40)
    payload = (fixed[:, 4].astype(np.int64) << 8) | fixed[:, 5]
    first = fixed[:, 6].astype(np.int64)
    n = len(d.family)
    d.addresses[rows, 0] = 6
    d.addresses[rows, 1:] = fixed[:, 8:24]
    d.addresses[n + rows, 0] = 6
    d.addresses[n + rows, 1:] = fixed[:, 24:40]

    length = payload + 40
    unknown = np.flatnonzero(~short & (payload == 0) & (first != 59))
    for k in unknown:  # jumbograms and BIG TCP: rare, one at a time
        jumbo = _jumbo_payload(buf, int(l3[k]), int(end[k])) if first[k] == 0 else None
        length[k] = jumbo + 40 if jumbo is not None else max(int(wire_ip[k]), 40)
    d.length[rows] = length

    # Walk the extension headers of all packets in step.
    protocol = first.copy()
    at = l3 + 40
    walking = ~short
    known = ~short
    later_fragment = np.zeros(len(rows), bool)
    fragmented = np.zeros(len(rows), bool)
    for _ in range(_MAX_V6_EXTENSIONS):
        step = np.flatnonzero(walking & np.isin(protocol, _V6_EXTENSIONS))
        if not len(step):
            break
        here, kind = at[step], protocol[step]
        cut = here + np.where(kind == 44, 4, 2) > end[step]
        known[step[cut]] = False
        walking[step[cut]] = False
        size = _u8(buf, here + 1)
        size = np.where(kind == 44, 8, np.where(kind == 51, (size + 2) * 4, (size + 1) * 8))
        # a non-first fragment's transport header is in another packet: stop there
        later = ~cut & (kind == 44) & ((_be16(buf, here + 2) >> 3) > 0)
        later_fragment[step[later]] = True
        more = (_u8(buf, here + 3) & 1) == 1
        fragmented[step[~cut & (kind == 44) & (later | more)]] = True
        walking[step[later]] = False
        moved = step[~cut]
        protocol[moved] = _u8(buf, here)[~cut]
        at[moved] = (here + size)[~cut]
    else:
        known &= ~(walking & np.isin(protocol, _V6_EXTENSIONS))
    protocol = np.where(known, protocol, -1)
    d.protocol[rows] = protocol
    ported = known & ~later_fragment & np.isin(protocol, _PORT_PROTOCOLS) & (at + 4 <= end)
    _set_ports(buf, rows, at, ported, d)
    d.transport[rows] = np.where(known & ~later_fragment, at, -1)
    d.fragmented[rows] = fragmented


def _jumbo_payload(buf: np.ndarray, l3: int, end: int) -> int | None:
    """The Jumbo Payload option (RFC 2675) of a hop-by-hop header at ``l3 + 40``, if any."""
    start = l3 + 40
    if start + 2 > end:
        return None
    stop = min(start + (int(buf[start + 1]) + 1) * 8, end)
    at = start + 2
    while at < stop:
        kind = int(buf[at])
        if kind == 0:  # Pad1
            at += 1
            continue
        if at + 2 > stop:
            return None
        size = int(buf[at + 1])
        if kind == 0xC2 and size == 4 and at + 6 <= stop:
            return int.from_bytes(bytes(buf[at + 2 : at + 6]), "big")
        at += 2 + size
    return None


def _set_ports(buf, rows, at, ported, d: _Decoded) -> None:
    """Source and destination ports from the transport header at ``at``, where ``ported``."""
    picked = rows[ported]
    ports = gather(buf, at[ported], 4).astype(np.int64)
    d.src_port[picked] = (ports[:, 0] << 8) | ports[:, 1]
    d.dst_port[picked] = (ports[:, 2] << 8) | ports[:, 3]


# --- orientation and the output table -----------------------------------------------------


def _addresses(keys: np.ndarray, networks: LocalNetworks) -> tuple[np.ndarray, pa.Array, np.ndarray]:
    """Encode (family byte + 16 address bytes) keys: per-key index, text and locality per distinct address."""
    encoded = pa.FixedSizeBinaryArray.from_buffers(
        pa.binary(17), len(keys), [None, pa.py_buffer(keys)]
    ).dictionary_encode()
    index = encoded.indices.to_numpy(zero_copy_only=False).astype(np.int64)
    dictionary = encoded.dictionary
    distinct = np.frombuffer(
        dictionary.buffers()[1], np.uint8, count=len(dictionary) * 17, offset=dictionary.offset * 17
    ).reshape(-1, 17)
    texts = []
    for row in distinct.tolist():
        if row[0] == 4:
            texts.append("%d.%d.%d.%d" % tuple(row[13:]))
        elif row[0] == 6:
            texts.append(str(ipaddress.IPv6Address(bytes(row[1:]))))
        else:  # a frame that is no IP packet: never looked at
            texts.append("")
    local = local_keys(distinct, networks)
    return index, pa.array(texts, pa.string()), local


def _store_mapped_as_ipv4(d: _Decoded, code: np.ndarray, value: np.ndarray) -> None:
    """Turn IPv4-mapped IPv6 address keys into IPv4 keys (in place), then bound each packet as the suites do.

    A row then stores the address form ``records.canonical_ip`` gives, and its family decides its
    byte bound: what a capture yields is what the packets suite accepts.
    """
    n = len(code)
    keys = d.addresses
    # Bytes 11-12 = ff ff first: rare, so the full prefix test runs on a few keys, not on all (3x faster).
    rows = np.flatnonzero((keys[:, 11] == 0xFF) & (keys[:, 12] == 0xFF) & (keys[:, 0] == 6))
    rows = rows[~keys[rows, 1:11].any(axis=1)]
    keys[rows, 0] = 4
    keys[rows, 11:13] = 0
    mapped = np.zeros(2 * n, bool)
    mapped[rows] = True
    src, dst = mapped[:n], mapped[n:]
    _reject(code, value, src != dst, _R_MAPPED_MIXED, 0)
    _reject(code, value, src & dst & (d.length > MAX_BYTES_V4), _R_MAPPED_LENGTH, d.length)
    _reject(code, value, (d.family == 4) & (d.length > MAX_BYTES_V4_GSO), _R_GSO_LENGTH, d.length)


def _frames_to_table(
    data, frames: _Frames, networks: LocalNetworks, keep_transit: bool, source: str, input_file: str,
    numbers: np.ndarray | None = None,
) -> pa.Table:
    """Decode, orient and judge every frame: one ``PARSED_SCHEMA`` row per frame, in order.

    ``numbers``: each frame's index in the file, when ``frames`` are only some of them.
    """
    n = len(frames.pos)
    if n == 0:
        return PARSED_SCHEMA.empty_table()
    buf = np.frombuffer(data, np.uint8)
    d = _decode(buf, frames)
    code = frames.code
    _store_mapped_as_ipv4(d, code, frames.value)

    ip = np.flatnonzero(code == _OK)
    k = len(ip)
    index, texts, local = _addresses(d.addresses, networks)
    src, dst = index[:n][ip], index[n:][ip]
    src_local, dst_local = local[src], local[dst]
    neither = ~src_local & ~dst_local
    if not keep_transit:
        code[ip[neither]] = _R_NEITHER
    direction = direction_codes(src_local, dst_local)
    inbound = direction == IN

    ok = code == _OK
    null = ~ok

    def column(values_at_ip: np.ndarray, dtype) -> np.ndarray:
        """Spread values of the IP frames over all frames (the others are masked later)."""
        full = np.zeros(n, dtype)
        full[ip] = values_at_ip
        return full

    local_ip = texts.take(pa.array(column(np.where(inbound, dst, src), np.int64), mask=null))
    remote_ip = texts.take(pa.array(column(np.where(inbound, src, dst), np.int64), mask=null))
    src_port, dst_port = d.src_port[ip], d.dst_port[ip]
    local_port = column(np.where(inbound, dst_port, src_port), np.int64)
    remote_port = column(np.where(inbound, src_port, dst_port), np.int64)
    protocol = d.protocol

    rejected = np.flatnonzero(null)
    coded = code[rejected] != _R_NEITHER
    reasons = _coded_reasons(code[rejected], frames.value[rejected])
    if not coded.all():
        at_ip = np.zeros(n, np.int64)
        at_ip[ip] = np.arange(k)
        transit = at_ip[rejected[~coded]]
        neither = neither_local_reason(texts.take(pa.array(src[transit])), texts.take(pa.array(dst[transit])))
        order = np.concatenate([np.flatnonzero(coded), np.flatnonzero(~coded)])
        reasons = pa.concat_arrays([reasons.filter(pa.array(coded)), neither]).take(
            pa.array(np.argsort(order, kind="stable"))
        )
    records = _frame_excerpts(buf, rejected if numbers is None else numbers[rejected], frames.pos[rejected],
                              frames.cap[rejected])
    reason = _spread(reasons, rejected, n)
    record = _spread(records, rejected, n)

    columns = {
        "kind": pa.array([PACKET, REJECT], pa.string()).take(pa.array(null.astype(np.int8))),
        "ts": pa.array(frames.ts, pa.timestamp("us", tz="UTC"), mask=null),
        "source": pa.repeat(pa.scalar(source, pa.string()), n),
        "local_ip": local_ip,
        "remote_ip": remote_ip,
        "local_port": pa.array(local_port.astype(np.int32), mask=null | (local_port < 0)),
        "remote_port": pa.array(remote_port.astype(np.int32), mask=null | (remote_port < 0)),
        "protocol": pa.array(protocol.astype(np.int32), mask=null | (protocol < 0)),
        "bytes": pa.array(d.length, pa.int64(), mask=null),
        "direction": DIRECTION_TEXTS.take(pa.array(column(direction, np.int8), mask=null)),
        "reason": reason,
        "record": record,
        "input_file": pa.repeat(pa.scalar(input_file, pa.string()), n),
    }
    return pa.Table.from_arrays(  # a packet header is 1 packet, unsampled: its weight columns stay null
        [columns[field.name] if field.name in columns else pa.nulls(n, field.type) for field in PARSED_SCHEMA], schema=PARSED_SCHEMA
    )


def _coded_reasons(code: np.ndarray, value: np.ndarray) -> pa.Array:
    """Reason texts for rejected frames, each distinct (reason, value) formatted once."""
    key = (code.astype(np.int64) << 48) | (value & ((1 << 48) - 1))
    distinct, index = np.unique(key, return_inverse=True)
    texts = [
        _REASONS[c](v) if c in _REASONS else None
        for c, v in zip((distinct >> 48).tolist(), (distinct & ((1 << 48) - 1)).tolist())
    ]
    return pa.array(texts, pa.string()).take(pa.array(index.reshape(-1)))


def _frame_excerpts(buf: np.ndarray, rows: np.ndarray, pos: np.ndarray, cap: np.ndarray) -> pa.Array:
    """"frame N at byte offset P: <hex of the first 64 captured bytes>[…]" for each row, in bulk."""
    shown = np.clip(np.minimum(cap, len(buf) - pos), 0, EXCERPT_BYTES)
    # in slices, so the temporary arrays stay small
    hex_text = pa.concat_arrays(
        [
            hex_excerpts(buf, pos[i : i + _HEX_SLICE], shown[i : i + _HEX_SLICE])
            for i in range(0, max(len(rows), 1), _HEX_SLICE)
        ]
    )
    return pc.binary_join_element_wise(
        "frame ",
        pa.array(rows + 1).cast(pa.string()),
        " at byte offset ",
        pa.array(pos).cast(pa.string()),
        ": ",
        hex_text,
        pc.if_else(pa.array(cap > EXCERPT_BYTES), "…", ""),
        "",
    )


_HEX_SLICE = 65_536


def _spread(values: pa.Array, rows: np.ndarray, n: int) -> pa.Array:
    """Strings of ``rows`` (in order) as a column of ``n`` rows, null elsewhere, text not copied."""
    values = values.cast(pa.string())
    if values.null_count:
        which = np.zeros(n, np.int64)
        which[rows] = np.arange(len(rows))
        present = np.zeros(n, bool)
        present[rows] = True
        return values.take(pa.array(which, mask=~present))
    offsets = np.frombuffer(values.buffers()[1], np.int32, count=len(values) + 1, offset=values.offset * 4)
    lengths = np.zeros(n, np.int64)
    lengths[rows] = np.diff(offsets)
    spread = np.concatenate([[0], np.cumsum(lengths)]) + offsets[0]
    present = np.zeros(n, bool)
    present[rows] = True
    validity = np.packbits(present, bitorder="little")
    return pa.StringArray.from_buffers(
        n, pa.py_buffer(spread.astype(np.int32)), values.buffers()[2], pa.py_buffer(validity), n - len(rows)
    )


def _reject_table(reason: str, record: str, source: str, input_file: str) -> pa.Table:
    """One reject row about the file itself."""
    row = {field.name: [None] for field in PARSED_SCHEMA}
    row.update(kind=[REJECT], source=[source], input_file=[input_file], reason=[reason], record=[record])
    return pa.Table.from_pydict(row, schema=PARSED_SCHEMA)
