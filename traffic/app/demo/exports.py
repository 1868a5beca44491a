"""What the demo router exports for a delivery: IPFIX flows and sFlow samples of the sample's traffic,
as datagrams (generated here; ``traffic.app.demo.telemetry`` sends them to a collector).

IPFIX uses one template (IPv4 addresses, ports, protocol, 8-byte counters, start and end in ms),
sent in every message; sFlow flow samples carry raw Ethernet/IPv4 headers, sampled 1 in ``SFLOW_RATE``.
sFlow has no clock of its own (a sample's time is when the collector received it), so each burst
says the sample time it must be received at.
"""

from __future__ import annotations

import random
import socket
import struct
from dataclasses import dataclass
from datetime import datetime

from traffic.core.periods import PANE, micros

SFLOW_RATE = 64
_TEMPLATE_ID = 256
#: (IPFIX element id, length): source/destination IPv4, ports, protocol, octets, packets, start/end ms.
_TEMPLATE = ((8, 4), (12, 4), (7, 2), (11, 2), (4, 1), (1, 8), (2, 8), (152, 8), (153, 8))
_RECORD = struct.Struct(">4s4sHHBQQQQ")


@dataclass(frozen=True)
class Burst:
    """Datagrams the router exports at one moment of the sample: IPFIX ones, then sFlow ones, received when
    the sample's clock reads ``received_at`` (None: whenever the previous burst was)."""

    ipfix: tuple[bytes, ...]
    sflow: tuple[bytes, ...] = ()
    received_at: datetime | None = None


def ipfix_message(flows: list[tuple], export_us: int, sequence: int) -> bytes:
    """An IPFIX message (RFC 7011): the template set, then one data set of ``flows``
    ((src, dst, sport, dport, protocol, octets, packets, start µs, end µs) each)."""
    fields = b"".join(struct.pack(">HH", ie, length) for ie, length in _TEMPLATE)
    template = struct.pack(">HH", _TEMPLATE_ID, len(_TEMPLATE)) + fields
    sets = struct.pack(">HH", 2, 4 + len(template)) + template
    if flows:
        records = b"".join(_RECORD.pack(socket.inet_aton(s), socket.inet_aton(d), sp, dp, proto, octets, packets,
                                        start // 1000, end // 1000)
                           for s, d, sp, dp, proto, octets, packets, start, end in flows)
        sets += struct.pack(">HH", _TEMPLATE_ID, 4 + len(records)) + records
    return struct.pack(">HHIII", 10, 16 + len(sets), export_us // 1_000_000, sequence, 1) + sets


def sflow_datagram(frames: list[bytes], sequence: int, sample_pool: int) -> bytes:
    """An sFlow v5 datagram of one flow sample per frame (raw Ethernet header records, 1 in ``SFLOW_RATE``)."""
    samples = b""
    for i, frame in enumerate(frames):
        header = frame[:128]
        padded = header + bytes(-len(header) % 4)
        record = struct.pack(">IIII", 1, len(frame) + 4, 4, len(header)) + padded  # Ethernet, frame length + FCS
        body = struct.pack(">IIIIIIII", sequence * 16 + i, 1, SFLOW_RATE, sample_pool, 0, 1, 2, 1)
        body += struct.pack(">II", 1, 16 + len(padded)) + record
        samples += struct.pack(">II", 1, len(body)) + body
    header = struct.pack(">II4sIII", 5, 1, socket.inet_aton("127.0.0.1"), 0, sequence, 1000 + sequence)
    return header + struct.pack(">I", len(frames)) + samples


def ethernet_frame(src: str, dst: str, sport: int, dport: int, size: int) -> bytes:
    """An Ethernet/IPv4/TCP frame whose IP packet is ``size`` bytes long."""
    payload = bytes(max(size - 40, 0))
    tcp = struct.pack(">HHIIBBHHH", sport, dport, 0, 0, 5 << 4, 0x18, 65535, 0, 0) + payload
    ip = struct.pack(">BBHHHBBH4s4s", 0x45, 0, 20 + len(tcp), 0, 0x4000, 64, 6, 0,
                     socket.inet_aton(src), socket.inet_aton(dst))
    return bytes(6) + bytes.fromhex("020000000001") + b"\x08\x00" + ip + tcp



class RouterExports:
    """The demo router's traffic between ``local_hosts`` (IPv4 ones) and ``remote_hosts``, and its export
    sequence numbers, which run on from one delivery to the next."""

    def __init__(self, local_hosts: list[str], remote_hosts: list[str]):
        self.local, self.remote = [h for h in local_hosts if ":" not in h], remote_hosts
        self.ipfix_sequence = self.sflow_sequence = 0

    def delivery(self, start: datetime, end: datetime, rng: random.Random) -> list[Burst]:
        """The bursts of ``[start, end)``: one per pane, then an empty IPFIX message that brings the
        router's clock to the end of the delivery, like every other source's."""
        bursts = []
        pane = start
        while pane < end:
            flows = [self._flow(rng, pane, end) for _ in range(rng.randint(2, 6))]
            export = min(max(f[8] for f in flows) + 1_000_000, micros(end) - 1)
            ipfix = ipfix_message(flows, export, self.ipfix_sequence)
            self.ipfix_sequence += len(flows)
            frames = [ethernet_frame(*self._pair(rng), rng.randint(1024, 65535), 443,
                                     rng.choice([64, 576, 1500, 1500])) for _ in range(rng.randint(1, 4))]
            sflow = sflow_datagram(frames, self.sflow_sequence, self.sflow_sequence * 1000)
            self.sflow_sequence += 1
            # sFlow's time is its receive time: received at the middle of the pane in the sample's past.
            bursts.append(Burst((ipfix,), (sflow,), pane + PANE / 2))
            pane += PANE
        bursts.append(Burst((ipfix_message([], micros(end) - 1_000_000, self.ipfix_sequence),)))
        return bursts

    def _pair(self, rng: random.Random) -> tuple[str, str]:
        local, remote = rng.choice(self.local[:4] if rng.random() < 0.5 else self.local), rng.choice(self.remote)
        return (local, remote) if rng.random() < 0.4 else (remote, local)

    def _flow(self, rng: random.Random, pane: datetime, end: datetime) -> tuple:
        src, dst = self._pair(rng)
        start = micros(pane) + rng.randrange(300_000_000)
        stop = min(start + rng.choice([0, 5, 40, 200, 700]) * 1_000_000, micros(end) - 1_000_000)
        packets = rng.randint(1, 400)
        return (src, dst, rng.randint(1024, 65535), rng.choice([53, 80, 443]), 6, packets * rng.choice([90, 800, 1400]),
                packets, start, max(start, stop))
