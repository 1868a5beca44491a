"""Numpy over many records at once: big-endian fields, record positions, addresses as text.

Bytes at many positions are gathered by ``traffic.io.bytes.gather``, the one copy the capture reader uses too.
"""

from __future__ import annotations

import ipaddress

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from traffic.io.bytes import gather
from traffic.io.flows.records import P_MIXED


def uptime_before(uptime: np.ndarray, stamp: np.ndarray) -> np.ndarray:
    """How many ms before the header's sysUptime a stamp is, as a signed 32-bit difference."""
    return ((uptime - stamp + (1 << 31)) & 0xFFFFFFFF) - (1 << 31)


def record_starts(first: np.ndarray, count: np.ndarray, length: int) -> np.ndarray:
    """Start of every record of sets starting at ``first`` with ``count`` records of ``length`` bytes."""
    total = int(count.sum())
    before = np.repeat(np.cumsum(count) - count, count)
    return np.repeat(first, count) + (np.arange(total, dtype=np.int64) - before) * length


def uint(buf: np.ndarray, pos: np.ndarray, length: int) -> np.ndarray:
    """The big-endian unsigned integer of ``length`` (1..16) bytes at each position, as uint64."""
    length = min(length, 8)
    raw = gather(buf, pos, length)
    if length in (1, 2, 4, 8):
        return raw.view(f">u{length}").reshape(-1).astype(np.uint64)
    value = np.zeros(len(pos), np.uint64)
    for k in range(length):
        value = (value << np.uint64(8)) | raw[:, k].astype(np.uint64)
    return value


def concatenate(arrays: list[np.ndarray]) -> np.ndarray:
    """The arrays end to end (the one array itself when there is one)."""
    return arrays[0] if len(arrays) == 1 else np.concatenate(arrays)


def be_u32(octets: np.ndarray) -> np.ndarray:
    """(n, 4) bytes as big-endian uint32 values."""
    return np.ascontiguousarray(octets).view(">u4").reshape(-1).astype(np.uint32)


def _mapped(address: np.ndarray) -> np.ndarray:
    return ~address[:, :10].any(axis=1) & (address[:, 10] == 0xFF) & (address[:, 11] == 0xFF)


def field_at(records: np.ndarray, offset: int, length: int) -> np.ndarray:
    """The big-endian unsigned field at ``offset`` of each (contiguous) record, as uint64."""
    n, width = records.shape
    if length in (1, 2, 4, 8):
        view = np.ndarray((n,), f">u{length}", records, offset, (width,)) if n else np.zeros(0, np.uint64)
        return view.astype(np.uint64)
    value = np.zeros(n, np.uint64)
    for k in range(min(length, 8)):
        value = (value << np.uint64(8)) | records[:, offset + k].astype(np.uint64)
    return value


def v4_mapped(addresses: dict, problem: np.ndarray) -> None:
    """Records between IPv4-mapped IPv6 addresses (``::ffff:a.b.c.d``) become IPv4 records, in place.

    One mapped end and one plain IPv6 end would be stored as IPv4 and IPv6: the record is a reject.
    """
    v6 = addresses["family"] == 6
    src, dst = v6 & _mapped(addresses["src6"]), v6 & _mapped(addresses["dst6"])
    both = src & dst
    addresses["family"][both] = 4
    addresses["src4"][both] = be_u32(addresses["src6"][both, 12:])
    addresses["dst4"][both] = be_u32(addresses["dst6"][both, 12:])
    problem[(problem == 0) & (src != dst)] = P_MIXED


_OCTETS = pa.array([str(k) for k in range(256)], pa.string())


def address_texts(column: dict) -> tuple[np.ndarray, np.ndarray, pa.Array]:
    """(index of each source, of each destination, text of each distinct address): each address is made text once."""
    n = len(column["family"])
    v4 = column["family"] == 4
    index = np.zeros(2 * n, np.int64)
    values = np.concatenate([column["src4"], column["dst4"]])
    rows = np.flatnonzero(np.concatenate([v4, v4]))
    texts = []
    if len(rows):
        encoded = pa.array(values[rows]).dictionary_encode()
        index[rows] = encoded.indices.to_numpy(zero_copy_only=False)
        distinct = encoded.dictionary.to_numpy(zero_copy_only=False)
        texts.append(pc.binary_join_element_wise(
            *(_OCTETS.take(pa.array((distinct >> np.uint32(shift)) & np.uint32(255))) for shift in (24, 16, 8, 0)),
            "."))
    rows = np.flatnonzero(np.concatenate([~v4, ~v4]))
    if len(rows):
        keys = np.ascontiguousarray(np.concatenate([column["src6"], column["dst6"]])[rows])
        encoded = pa.FixedSizeBinaryArray.from_buffers(pa.binary(16), len(rows), [None, pa.py_buffer(keys)]
                                                       ).dictionary_encode()
        index[rows] = encoded.indices.to_numpy(zero_copy_only=False) + (len(texts[0]) if texts else 0)
        texts.append(pa.array([str(ipaddress.IPv6Address(b)) for b in encoded.dictionary.to_pylist()], pa.string()))
    texts = pa.concat_arrays(texts) if texts else pa.array([], pa.string())
    return index[:n], index[n:], texts
