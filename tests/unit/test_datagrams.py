"""The collector's file format (``traffic.io.datagrams``): checksums and headers as the RFCs define them."""

from __future__ import annotations

import random
import struct

import pytest

from traffic.io.datagrams import MAX_DATAGRAM, PCAP_HEADER, _checksum, datagram_record


def _rfc1071(data: bytes) -> int:
    """The Internet checksum the slow, obvious way: add 16-bit words, fold the carries, complement."""
    if len(data) % 2:
        data += b"\0"
    total = sum(struct.unpack(f"!{len(data) // 2}H", data))
    while total >> 16:
        total = (total & 0xFFFF) + (total >> 16)
    return ~total & 0xFFFF


@pytest.mark.parametrize("data", [b"", b"\0", b"\0\0", b"\xff\xff", b"\xff\xff\xff\xff", b"\x01", b"\xff",
                                  bytes(range(256)), b"\xff" * 1001])
def test_checksum_matches_rfc_1071_on_edge_cases(data):
    assert _checksum(data) == _rfc1071(data)


def test_checksum_matches_rfc_1071_on_random_data():
    rng = random.Random(7)
    for _ in range(2000):
        data = rng.randbytes(rng.randrange(0, 300))
        assert _checksum(data) == _rfc1071(data)


def _verify(frame: bytes, version: int) -> None:
    """Each header's checksum verifies: the sum over it (and the UDP pseudo-header) is 0xFFFF."""
    if version == 4:
        header, rest = frame[:20], frame[20:]
        assert _rfc1071(header) == 0
        pseudo = header[12:20] + struct.pack("!BBH", 0, 17, len(rest))
    else:
        header, rest = frame[:40], frame[40:]
        pseudo = header[8:40] + struct.pack("!IxxxB", len(rest), 17)
    assert _rfc1071(pseudo + rest) == 0


@pytest.mark.parametrize("src,dst,version", [("192.0.2.1", "127.0.0.1", 4), ("2001:db8::1", "::1", 6),
                                             ("::ffff:192.0.2.9", "127.0.0.1", 4)])
def test_records_carry_valid_headers(src, dst, version):
    payload = bytes(range(101))
    record = datagram_record(1_793_527_200_123_456, src, 40000, dst, 2055, payload)
    seconds, micros, caplen, length = struct.unpack("<IIII", record[:16])
    assert (seconds, micros) == (1_793_527_200, 123_456)
    frame = record[16:]
    assert caplen == length == len(frame) == (20 if version == 4 else 40) + 8 + len(payload)
    assert frame[0] >> 4 == version and frame.endswith(payload)
    _verify(frame, version)
    assert PCAP_HEADER[:4] == b"\xd4\xc3\xb2\xa1" and struct.unpack("<I", PCAP_HEADER[20:24])[0] == 101


def test_refuses_what_udp_cannot_carry():
    with pytest.raises(ValueError, match="larger than UDP carries"):
        datagram_record(0, "192.0.2.1", 1, "127.0.0.1", 2, bytes(MAX_DATAGRAM + 1))
    with pytest.raises(ValueError, match="different families"):
        datagram_record(0, "192.0.2.1", 1, "::1", 2, b"x")
