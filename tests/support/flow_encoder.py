"""Write flow telemetry datagrams for tests, byte by byte with ``struct``: NetFlow v5/v9, IPFIX, sFlow v5.

Each protocol is a few plain functions returning ``bytes``, built from the specifications (RFC 3954
for NetFlow v9, RFC 7011 for IPFIX, sflow.org's sFlow v5, Cisco's NetFlow v5 layout), not from the
decoder, so tests and tshark can check one against the other:

* ``Flow``: what a flow record means (addresses, ports, protocol, counts, start and end in µs).
* NetFlow v5: ``netflow5(flows, ...)``.
* NetFlow v9 and IPFIX: a template is a list of ``(element id, length)`` or ``(element id, length,
  enterprise number)`` specifiers; ``template_set`` / ``options_template_set`` describe templates,
  ``data_set`` holds records, ``record(template, values)`` encodes one record from a dict of
  element id → value (int, address text or bytes; length 65535 is variable-length, written with a
  1-byte length prefix, or 3 bytes (255 + 2) from 255 bytes on); ``netflow9(sets, ...)`` and
  ``ipfix(sets, ...)`` wrap sets in a message. ``flow_values`` gives the values of a ``Flow`` for
  the common element ids.
* sFlow v5: ``sflow(samples, ...)``, ``flow_sample(records, ...)`` (plain or expanded),
  ``raw_header(frame)``, ``counter_sample()``, ``extended_switch()``.
* ``collector_file(datagrams)``: a pcap as ``traffic collect`` writes it (``traffic.io.datagrams``).
"""

from __future__ import annotations

import ipaddress
import struct
from dataclasses import dataclass

from tests.support import capture_factory as cf
from traffic.io.datagrams import PCAP_HEADER, datagram_record

NTP_TO_UNIX = 2_208_988_800
VARIABLE = 65535

#: Default ports tshark dissects each protocol on.
NETFLOW_PORT, IPFIX_PORT, SFLOW_PORT = 2055, 4739, 6343


@dataclass(frozen=True)
class Flow:
    """One flow as an exporter means it; times in µs since the epoch."""

    src: str
    dst: str
    sport: int
    dport: int
    protocol: int
    bytes: int
    packets: int
    start_us: int
    end_us: int


def _address(text: str) -> bytes:
    return ipaddress.ip_address(text).packed


# --- NetFlow v5 -----------------------------------------------------------------------------


def netflow5(flows: list[Flow], *, export_us: int, uptime_ms: int, sequence: int = 0, engine_type: int = 0,
             engine_id: int = 0, sampling_interval: int = 0, sampling_mode: int = 0) -> bytes:
    """A NetFlow v5 datagram: 24-byte header, then one 48-byte record per flow (IPv4 only).

    FIRST/LAST are the flow's start and end as sysUptime ms: ``uptime_ms`` is the header's uptime at
    ``export_us``. The sampling field is the 2-bit mode and the 14-bit interval.
    """
    seconds, micros = divmod(export_us, 1_000_000)
    header = struct.pack(">HHIIIIBBH", 5, len(flows), uptime_ms & 0xFFFFFFFF, seconds, micros * 1000, sequence,
                         engine_type, engine_id, (sampling_mode << 14) | sampling_interval)
    records = b""
    for f in flows:
        first = (uptime_ms - (export_us - f.start_us) // 1000) & 0xFFFFFFFF
        last = (uptime_ms - (export_us - f.end_us) // 1000) & 0xFFFFFFFF
        records += struct.pack(">4s4s4sHHIIIIHHBBBBHHBBH", _address(f.src), _address(f.dst), bytes(4), 1, 2,
                               f.packets, f.bytes, first, last, f.sport, f.dport, 0, 0x18, f.protocol, 0,
                               0, 0, 24, 24, 0)
    return header + records


# --- NetFlow v9 and IPFIX -------------------------------------------------------------------


def _specifier(spec: tuple, ipfix: bool) -> bytes:
    ie, length, *pen = spec
    if pen and pen[0]:
        assert ipfix, "enterprise numbers are IPFIX only"
        return struct.pack(">HHI", ie | 0x8000, length, pen[0])
    return struct.pack(">HH", ie, length)


def raw_set(set_id: int, body: bytes, pad_to: int = 4) -> bytes:
    """A set (flowset) of any id around ``body``, zero-padded to ``pad_to`` bytes."""
    body += bytes((-(4 + len(body))) % pad_to)
    return struct.pack(">HH", set_id, 4 + len(body)) + body


def template_set(templates: dict[int, list[tuple]], *, ipfix: bool = True) -> bytes:
    """A template set (IPFIX set id 2, v9 flowset id 0) of {template id: specifiers}; [] is a withdrawal."""
    body = b"".join(struct.pack(">HH", tid, len(fields)) + b"".join(_specifier(f, ipfix) for f in fields)
                    for tid, fields in templates.items())
    return raw_set(2 if ipfix else 0, body, 1 if ipfix else 4)


def options_template_set(tid: int, scope: list[tuple], fields: list[tuple], *, ipfix: bool = True) -> bytes:
    """An options template set (IPFIX set id 3: counts; v9 flowset id 1: byte lengths, padded)."""
    specifiers = b"".join(_specifier(f, ipfix) for f in [*scope, *fields])
    if ipfix:
        return raw_set(3, struct.pack(">HHH", tid, len(scope) + len(fields), len(scope)) + specifiers, 1)
    return raw_set(1, struct.pack(">HHH", tid, 4 * len(scope), 4 * len(fields)) + specifiers)


def record(template: list[tuple], values: dict) -> bytes:
    """One data record: each field's value from ``values`` (missing: zeros), big-endian, at its length."""
    out = b""
    for spec in template:
        ie, length, *pen = spec
        value = values.get((ie, pen[0]) if pen and pen[0] else ie, 0)
        if isinstance(value, str):
            value = _address(value)
        if length == VARIABLE:
            value = value if isinstance(value, bytes) else b""
            out += (bytes([len(value)]) if len(value) < 255 else b"\xff" + struct.pack(">H", len(value))) + value
        elif isinstance(value, bytes):
            out += value[:length].ljust(length, b"\0")
        else:
            out += value.to_bytes(length, "big")
    return out


def data_set(tid: int, records: list[bytes], *, pad_to: int = 4) -> bytes:
    """A data set of already encoded records, zero-padded to ``pad_to`` bytes."""
    return raw_set(tid, b"".join(records), pad_to)


def ntp(us: int) -> int:
    """A time in µs since 1970 as a 64-bit NTP timestamp (dateTimeMicroseconds/Nanoseconds)."""
    seconds, micros = divmod(us, 1_000_000)
    return ((seconds + NTP_TO_UNIX) << 32) | ((micros << 32) + 999_999) // 1_000_000


def flow_values(f: Flow, *, export_us: int | None = None, uptime_ms: int | None = None,
                system_init_ms: int | None = None) -> dict:
    """Element id → value for a flow: addresses (8/12 or 27/28), ports, protocol, counts and every time field.

    Uptime fields (21/22) are relative to ``uptime_ms`` at ``export_us`` (v9) or to ``system_init_ms``
    (IPFIX); delta fields (158/159) to ``export_us``.
    """
    v6 = ":" in f.src
    values = {27 if v6 else 8: f.src, 28 if v6 else 12: f.dst, 7: f.sport, 11: f.dport, 4: f.protocol,
              1: f.bytes, 2: f.packets, 85: f.bytes, 86: f.packets,
              150: f.start_us // 1_000_000, 151: f.end_us // 1_000_000, 152: f.start_us // 1000,
              153: f.end_us // 1000, 154: ntp(f.start_us), 155: ntp(f.end_us), 156: ntp(f.start_us),
              157: ntp(f.end_us)}
    if uptime_ms is not None and export_us is not None:
        values[22] = (uptime_ms - (export_us - f.start_us) // 1000) & 0xFFFFFFFF
        values[21] = (uptime_ms - (export_us - f.end_us) // 1000) & 0xFFFFFFFF
    if system_init_ms is not None:
        values[22] = f.start_us // 1000 - system_init_ms
        values[21] = f.end_us // 1000 - system_init_ms
        values[160] = system_init_ms
    if export_us is not None:
        values[158] = export_us - f.start_us
        values[159] = export_us - f.end_us
    return values


def netflow9(sets: list[bytes], *, export_s: int, uptime_ms: int, sequence: int = 0, source_id: int = 0,
             count: int | None = None) -> bytes:
    """A NetFlow v9 export packet (20-byte header); ``count`` defaults to the number of sets."""
    return struct.pack(">HHIIII", 9, len(sets) if count is None else count, uptime_ms & 0xFFFFFFFF, export_s,
                       sequence, source_id) + b"".join(sets)


def ipfix(sets: list[bytes], *, export_s: int, sequence: int = 0, domain: int = 0) -> bytes:
    """An IPFIX message (16-byte header, its length filled in)."""
    body = b"".join(sets)
    return struct.pack(">HHIII", 10, 16 + len(body), export_s, sequence, domain) + body


# --- sFlow v5 -------------------------------------------------------------------------------


def sflow(samples: list[bytes], *, agent: str = "192.0.2.10", sub_agent: int = 0, sequence: int = 0,
          uptime_ms: int = 0) -> bytes:
    """An sFlow v5 datagram: header with the agent address (IPv4 or IPv6), then the samples."""
    address = ipaddress.ip_address(agent)
    header = struct.pack(">II", 5, 1 if address.version == 4 else 2) + address.packed
    return header + struct.pack(">IIII", sub_agent, sequence, uptime_ms, len(samples)) + b"".join(samples)


def _pad4(data: bytes) -> bytes:
    return data + bytes((-len(data)) % 4)


def raw_header(frame: bytes, *, protocol: int = 1, frame_length: int | None = None, stripped: int = 4,
               captured: int = 128) -> bytes:
    """A raw packet header flow record (format 1): the first ``captured`` bytes of ``frame``.

    ``frame_length`` is the frame's length on the wire including the ``stripped`` FCS bytes.
    """
    header = frame[:captured]
    length = len(frame) + stripped if frame_length is None else frame_length
    body = struct.pack(">IIII", protocol, length, stripped, len(header)) + _pad4(header)
    return struct.pack(">II", 1, len(body)) + body


def extended_switch(vlan: int = 10) -> bytes:
    """An extended switch data flow record (format 1001), which the decoder skips."""
    body = struct.pack(">IIII", vlan, 0, vlan, 0)
    return struct.pack(">II", 1001, len(body)) + body


def flow_sample(records: list[bytes], *, sampling_rate: int, sample_pool: int = 0, drops: int = 0,
                sequence: int = 1, source_id: int = 3, expanded: bool = False) -> bytes:
    """A flow sample (format 1) or expanded flow sample (format 3) holding ``records``."""
    if expanded:
        body = struct.pack(">IIIIIIIIIII", sequence, 0, source_id, sampling_rate, sample_pool, drops,
                           0, 3, 0, 4, len(records))
    else:
        body = struct.pack(">IIIIIIII", sequence, source_id, sampling_rate, sample_pool, drops, 3, 4, len(records))
    body += b"".join(records)
    return struct.pack(">II", 3 if expanded else 1, len(body)) + body


def counter_sample(*, expanded: bool = False) -> bytes:
    """A counter sample (format 2, or 4 expanded) with one generic interface counters record."""
    counters = struct.pack(">IIQIIQIIIIIIQIIIIII", 3, 6, 10**9, 1, 3, *[0] * 14)
    records = struct.pack(">II", 1, len(counters)) + counters
    head = struct.pack(">III", 1, 0, 3) if expanded else struct.pack(">II", 1, 3)
    body = head + struct.pack(">I", 1) + records
    return struct.pack(">II", 4 if expanded else 2, len(body)) + body


def sampled_frame(f: Flow, *, vlans: list[tuple[int, int]] = (), payload: int | None = None) -> bytes:
    """An Ethernet frame of the flow's first packet: ``f.bytes`` long at the IP layer (or ``payload``)."""
    v6 = ":" in f.src
    transport = {6: cf.tcp, 17: cf.udp}.get(f.protocol)
    header = 40 if v6 else 20
    overhead = {6: 20, 17: 8}.get(f.protocol, 0)
    size = (f.bytes if payload is None else payload) - header - overhead
    body = transport(f.sport, f.dport, bytes(max(size, 0))) if transport else bytes(max(size + overhead, 0))
    packet = cf.ipv6(f.src, f.dst, f.protocol, body) if v6 else cf.ipv4(f.src, f.dst, f.protocol, body)
    return cf.ethernet(packet, 0x86DD if v6 else 0x0800, vlans=vlans)


# --- collector files ------------------------------------------------------------------------


def collector_file(datagrams: list[tuple[int, str, int, bytes]], *, listen: str | None = None,
                   port: int | None = None) -> bytes:
    """A collector file (``traffic.io.datagrams``) of (receive µs, exporter address, exporter port, payload).

    The listening port defaults to the protocol's usual port (2055, 4739 or 6343, by the payload's
    version), so tshark dissects each datagram.
    """
    out = [PCAP_HEADER]
    for ts_us, exporter, sport, payload in datagrams:
        address = ipaddress.ip_address(exporter)
        v6 = address.version == 6 and address.ipv4_mapped is None
        target = listen or ("2001:db8::ff" if v6 else "192.0.2.255")
        out.append(datagram_record(ts_us, exporter, sport, target, port or default_port(payload), payload))
    return b"".join(out)


def default_port(payload: bytes) -> int:
    version = int.from_bytes(payload[:2], "big")
    return {5: NETFLOW_PORT, 9: NETFLOW_PORT, 10: IPFIX_PORT}.get(version, SFLOW_PORT)
