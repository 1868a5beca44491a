"""Capture file framing: where each frame of a pcap or pcapng file starts, its lengths, time and link type.

One Python loop walks the record (pcap) or block (pcapng) headers, because each header says where the
next one is; enhanced packet blocks and pcap record headers are then read in bulk. A problem with the
file itself is one (reason, record), and the frames before it are kept.
"""

from __future__ import annotations

import struct
from dataclasses import dataclass

import numpy as np

from traffic.io.bytes import gather, hex_excerpt
from traffic.io.capture.frames import _Frames, _R_NO_INTERFACE, _R_SPB, _R_TS_RANGE


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

# --- reading the container ----------------------------------------------------------------


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
