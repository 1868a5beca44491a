"""Bytes read in bulk from a file held as a numpy array, and the hex excerpts rejects quote.

The capture and flow readers both gather fixed-width fields at many positions at once and
show the first bytes of a bad record in its reject; this is the one copy of both rules.
"""

from __future__ import annotations

import numpy as np
import pyarrow as pa

__all__ = ["EXCERPT_BYTES", "gather", "hex_excerpt", "hex_excerpts"]

#: Bytes of a record shown (as hex) in a reject's ``record``.
EXCERPT_BYTES = 64


def gather(buf: np.ndarray, pos: np.ndarray, width: int) -> np.ndarray:
    """``width`` bytes at each position, as a C-contiguous (n, width) uint8 array.

    Bytes past the end of ``buf`` read as 0 (callers mask what was not captured), at any
    distance past it; negative positions read from 0. Of the two copies this replaces, only
    the capture reader's clamped: the flow reader's let a negative position index from the
    end of the file (numpy's negative indexing) and a position past the end raise IndexError,
    so a bad length field read another record's bytes or stopped the file. The
    clamped form never reads a byte that is not at or after the asked position.
    """
    size = len(buf)
    pos = np.maximum(pos, 0)
    if size < width:
        buf = np.concatenate([buf, np.zeros(width - size, np.uint8)])
        size = width
    near_end = pos > size - width
    result = np.lib.stride_tricks.sliding_window_view(buf, width)[np.minimum(pos, size - width)]
    if near_end.any():
        tail = np.concatenate([buf[size - width :], np.zeros(width, np.uint8)])
        start = np.minimum(pos[near_end], size) - (size - width)
        result[near_end] = np.lib.stride_tricks.sliding_window_view(tail, width)[start]
    return result


def hex_excerpt(data, offset: int, available: int) -> str:
    """Hex of up to the first 64 of ``available`` bytes at ``offset``, '…' when cut.

    At most 129 characters, so it fits any stored record (``records.MAX_RECORD_CHARS``).
    """
    available = max(0, min(available, len(data) - offset))
    excerpt = bytes(data[offset : offset + min(available, EXCERPT_BYTES)]).hex()
    return excerpt + ("…" if available > EXCERPT_BYTES else "")


def hex_excerpts(buf: np.ndarray, pos: np.ndarray, shown: np.ndarray) -> pa.Array:
    """Lower-case hex of ``shown`` (0..64) bytes at each position, as one string array."""
    width = 2 * EXCERPT_BYTES
    excerpt = gather(buf, pos, EXCERPT_BYTES)
    digits = np.empty((len(pos), EXCERPT_BYTES, 2), np.uint8)
    digits[:, :, 0] = excerpt >> 4
    digits[:, :, 1] = excerpt & 0x0F
    # nibble → ASCII, eight at a time: bytes holding 10..15 get bit 7 set by adding 0x76
    words = digits.reshape(-1).view(np.uint64)
    letters = ((words + np.uint64(0x7676767676767676)) & np.uint64(0x8080808080808080)) >> np.uint64(7)
    words += np.uint64(0x3030303030303030) + letters * np.uint64(ord("a") - ord("0") - 10)
    digits = digits.reshape(len(pos), width)
    if (shown == EXCERPT_BYTES).all():  # the usual case: one stride for all
        offsets, text = np.arange(len(pos) + 1, dtype=np.int32) * width, digits
    else:
        offsets = np.concatenate([[0], np.cumsum(2 * shown)]).astype(np.int32)
        text = digits[np.arange(width) < 2 * shown[:, None]]
    return pa.StringArray.from_buffers(
        len(pos), pa.py_buffer(offsets), pa.py_buffer(np.ascontiguousarray(text))
    )
