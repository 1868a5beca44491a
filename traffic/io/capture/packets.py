"""Captures → parsed packet rows: ``parse_capture`` decodes, orients and judges every frame of a file."""

from __future__ import annotations

import logging

import numpy as np
import pyarrow as pa

from traffic.core.records import PACKET, PARSED_SCHEMA, REJECT
from traffic.io.bytes import hex_excerpt
from traffic.io.capture.frames import _Frames, _OK, _R_NEITHER
from traffic.io.capture.framing import _MAGICS, _read_frames
from traffic.io.capture.headers import _addresses, _decode, _store_mapped_as_ipv4
from traffic.io.capture.reasons import _coded_reasons, _frame_excerpts, _reject_table
from traffic.io.orientation import (
    DIRECTION_TEXTS, IN, LocalNetworks, direction_codes, local_keys, neither_local_reason,
)
from traffic.io.orientation import local_networks as local_networks_of

log = logging.getLogger(__name__)


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
    index, texts, distinct = _addresses(d.addresses)
    local = local_keys(distinct, networks)
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
