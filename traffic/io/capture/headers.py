"""Link-layer and IP headers of all frames at once: where each packet is, its addresses, protocol, ports and length.

Link layers: Ethernet (VLAN, QinQ, MPLS, PPPoE, Arista), Linux cooked, raw IP, loopback; a frame that
is no IP packet, or of an unsupported link type, gets its reason code. IP: IPv4 (total length,
fragments, TSO/GSO length 0) and IPv6 (extension headers, jumbograms, BIG TCP), ports of TCP, UDP and
SCTP, IPv4-mapped IPv6 addresses stored as IPv4, and the text of each distinct address.

One module of about 400 lines, not two: ``_decode`` walks the link layers and hands each frame's IP
header on in one pass; as two modules, one would import the other and every reader of captures (and
of flow telemetry, through sFlow's sampled headers) would sit a layer higher.
"""

from __future__ import annotations

import ipaddress
from dataclasses import dataclass

import numpy as np
import pyarrow as pa

from traffic.core.records import MAX_BYTES_V4, MAX_BYTES_V4_GSO
from traffic.io.bytes import gather
from traffic.io.capture.frames import (
    _Frames, _MAX_LINK_HEADERS, _OK, _R_8023, _R_ARISTA, _R_ETHERTYPE, _R_FAMILY, _R_GSO_LENGTH, _R_IHL,
    _R_IP_SHORT, _R_LINKTYPE, _R_LINK_SHORT, _R_MAPPED_LENGTH, _R_MAPPED_MIXED, _R_MPLS, _R_NIBBLE, _R_PPP,
    _R_STACK, _R_TOTAL_LENGTH, _R_VERSION, _reject,
)


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

_AF_INET6 = (10, 24, 28, 30)

_PORT_PROTOCOLS = (6, 17, 132)
_V6_EXTENSIONS = (0, 43, 44, 51, 60)
_MAX_V6_EXTENSIONS = 16


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


def _addresses(keys: np.ndarray) -> tuple[np.ndarray, pa.Array, np.ndarray]:
    """Encode (family byte + 16 address bytes) keys: per-key index, then each distinct address's text and key."""
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
    return index, pa.array(texts, pa.string()), distinct


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
