"""Reject texts, made once per distinct (reason, value), and the reject rows of a capture.

A reject's ``record`` names the frame, its byte offset and a hex excerpt of its first 64 captured bytes.
"""

from __future__ import annotations

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from traffic.core.records import MAX_BYTES_V4, MAX_BYTES_V4_GSO, PARSED_SCHEMA, REJECT
from traffic.io.bytes import EXCERPT_BYTES, hex_excerpts
from traffic.io.capture.frames import (
    _MAX_LINK_HEADERS, _R_8023, _R_ARISTA, _R_DATAGRAM_CUT, _R_ETHERTYPE, _R_FAMILY, _R_FRAGMENT,
    _R_GSO_LENGTH, _R_IHL, _R_IP_SHORT, _R_LINKTYPE, _R_LINK_SHORT, _R_MAPPED_LENGTH, _R_MAPPED_MIXED,
    _R_MPLS, _R_NIBBLE, _R_NO_INTERFACE, _R_PPP, _R_SPB, _R_STACK, _R_TOTAL_LENGTH, _R_TS_RANGE, _R_UDP_CUT,
    _R_UDP_LENGTH, _R_VERSION,
)


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
    _R_FRAGMENT: lambda v: "fragmented datagram: reassembly not supported",
    _R_UDP_CUT: lambda v: "UDP header cut off by the capture",
    _R_UDP_LENGTH: lambda v: f"bad UDP length {v} (less than its 8-byte header)",
    _R_DATAGRAM_CUT: lambda v: (
        f"datagram cut off by the capture ({v & 0xFFFFFFFF} of {v >> 32} bytes captured)"
    ),
}


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


def _reject_table(reason: str, record: str, source: str, input_file: str) -> pa.Table:
    """One reject row about the file itself."""
    row = {field.name: [None] for field in PARSED_SCHEMA}
    row.update(kind=[REJECT], source=[source], input_file=[input_file], reason=[reason], record=[record])
    return pa.Table.from_pydict(row, schema=PARSED_SCHEMA)
