"""The collector's file format: received UDP datagrams as a classic pcap any tool can open.

``traffic collect`` decodes nothing (DESIGN §7a): it stores each datagram with its receive time
and its exporter's address and port, so a file replays like any input and opens in Wireshark,
tshark or tcpdump. The format is the plainest one those tools read:

* classic pcap, little-endian, microsecond timestamps (magic ``d4 c3 b2 a1`` as stored), snapshot
  length 262,144, link type 101 (``LINKTYPE_RAW``: each record starts with an IP header);
* each record's timestamp is the receive time; its bytes are an IPv4 (20-byte header, protocol
  17) or IPv6 (40-byte header, next header 17) header from the exporter's address to the address
  the collector listened on, a UDP header from the exporter's port to the listening port, and the
  datagram as received. Lengths and the IPv4 header checksum are filled in; the UDP checksum is
  computed too (required for IPv6, harmless for IPv4), so dissectors raise no warnings.

Only what the collector itself writes is produced here; reading (of these files and of captures
of export traffic made by other tools) is ``traffic.io.capture.udp_datagrams``.
"""

from __future__ import annotations

import functools
import ipaddress
import struct

__all__ = ["LINKTYPE_RAW", "PCAP_HEADER", "datagram_record", "MAX_DATAGRAM"]

LINKTYPE_RAW = 101
_SNAPLEN = 262_144
#: The global header of every collector file.
PCAP_HEADER = struct.pack("<IHHiIII", 0xA1B2C3D4, 2, 4, 0, 0, _SNAPLEN, LINKTYPE_RAW)
#: Largest UDP payload an IPv4 datagram can carry (65,535 − 20 − 8); IPv6 is bounded the same way
#: here because a larger one cannot arrive without jumbograms, which UDP sockets never deliver.
MAX_DATAGRAM = 65_507

_UDP = 17


def _checksum(data: bytes) -> int:
    """The Internet checksum (RFC 1071) of ``data``.

    The one's-complement sum of 16-bit words is the data read as one big number modulo 0xFFFF
    (2**16 ≡ 1), except that a non-zero sum ≡ 0 folds to 0xFFFF; one big-number division is far
    quicker in Python than a sum over the words.
    """
    if len(data) % 2:
        data += b"\0"
    number = int.from_bytes(data, "big")
    total = number % 0xFFFF or (0xFFFF if number else 0)
    return ~total & 0xFFFF


@functools.lru_cache(maxsize=4096)
def _packed(address: str) -> tuple[int, bytes]:
    """(version, 4- or 16-byte form) of an address text; an IPv4-mapped IPv6 address as the IPv4 it maps.

    Cached: a collector writes the same few exporter and listening addresses millions of times.
    """
    parsed = ipaddress.ip_address(address)
    if parsed.version == 6 and parsed.ipv4_mapped is not None:
        parsed = parsed.ipv4_mapped
    return parsed.version, parsed.packed


def datagram_record(ts_us: int, src: str, sport: int, dst: str, dport: int, payload: bytes) -> bytes:
    """One pcap record (header and bytes) holding ``payload`` as a UDP datagram ``src → dst``.

    ``src`` and ``dst`` must be of the same family (the collector listens on the family of the
    address it binds; an IPv4-mapped exporter address is written as the IPv4 address it maps).
    """
    if len(payload) > MAX_DATAGRAM:
        raise ValueError(f"datagram of {len(payload)} bytes is larger than UDP carries ({MAX_DATAGRAM})")
    (version, source), (target_version, target) = _packed(src), _packed(dst)
    if version != target_version:
        raise ValueError(f"exporter {src} and listening address {dst} are of different families")
    udp_length = 8 + len(payload)
    if version == 4:
        pseudo = source + target + struct.pack("!BBH", 0, _UDP, udp_length)
    else:
        pseudo = source + target + struct.pack("!IxxxB", udp_length, _UDP)
    udp_checksum = _checksum(pseudo + struct.pack("!HHHH", sport, dport, udp_length, 0) + payload) or 0xFFFF
    udp = struct.pack("!HHHH", sport, dport, udp_length, udp_checksum)
    if version == 4:
        header = struct.pack("!BBHHHBBH4s4s", 0x45, 0, 20 + udp_length, 0, 0x4000, 64, _UDP, 0,
                             source, target)
        header = header[:10] + struct.pack("!H", _checksum(header)) + header[12:]
    else:
        header = struct.pack("!IHBB16s16s", 6 << 28, udp_length, _UDP, 64, source, target)
    frame = header + udp + payload
    seconds, micros = divmod(ts_us, 1_000_000)
    return struct.pack("<IIII", seconds, micros, len(frame), len(frame)) + frame
