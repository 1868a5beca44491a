"""UDP datagrams of flow export (DESIGN §7a), and sFlow's sampled packet headers read by the capture rules."""

from __future__ import annotations

import ipaddress
import logging
from dataclasses import dataclass

import numpy as np
import pyarrow as pa

from traffic.core.records import PARSED_SCHEMA
from traffic.io.bytes import hex_excerpt
from traffic.io.capture.frames import (
    _Frames, _NOT_IP, _OK, _R_DATAGRAM_CUT, _R_FRAGMENT, _R_UDP_CUT, _R_UDP_LENGTH, _reject,
)
from traffic.io.capture.framing import _read_frames
from traffic.io.capture.headers import _addresses, _be16, _decode, _store_mapped_as_ipv4
from traffic.io.capture.reasons import _coded_reasons, _frame_excerpts, _reject_table, _rejects_table

log = logging.getLogger(__name__)


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
            index, texts, _ = _addresses(d.addresses[:n][rows])
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
