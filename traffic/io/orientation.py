"""Which side of a packet or flow is local: the ``local_networks`` rule every reader orients by.

A record's local side is ``local_ip``; ``direction`` is ``out`` when the local side sent it, ``in``
when it received it, ``internal`` when both sides are local (the sender is then ``local_ip``).
Neither side local is transit: a reject "neither address is in local_networks (src → dst)", or,
with ``keep_transit``, a record of unknown direction with the sender as ``local_ip``. An address is
local when it lies in one of the networks, compared as an integer under the network's mask, per
address family. The capture reader asks about address keys in bulk (``local_keys``), the telemetry
reader about canonical address texts (``local_texts``); both build the same reject text.
"""

from __future__ import annotations

import functools
import ipaddress
import socket
from dataclasses import dataclass

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from traffic.core.records import DIRECTIONS

__all__ = ["DIRECTION_TEXTS", "IN", "INTERNAL", "LocalNetworks", "OUT", "UNKNOWN", "direction_codes",
           "local_keys", "local_networks", "local_texts", "neither_local_reason"]

#: Direction codes, positions in ``DIRECTION_TEXTS``: unknown (kept transit) is a null direction.
IN, OUT, INTERNAL = (DIRECTIONS.index(name) for name in ("in", "out", "internal"))
UNKNOWN = len(DIRECTIONS)
DIRECTION_TEXTS = pa.array([*DIRECTIONS, None], pa.string())

_LOW64 = (1 << 64) - 1


@dataclass(frozen=True)
class LocalNetworks:
    """The ``local_networks`` setting as integers: (network address, netmask) per address family."""

    v4: tuple[tuple[int, int], ...] = ()
    v6: tuple[tuple[int, int], ...] = ()


def local_networks(texts: list[str] | tuple[str, ...]) -> LocalNetworks:
    """CIDR strings → ``LocalNetworks``; a bad entry is a ValueError naming it, one string a TypeError."""
    if isinstance(texts, str):
        raise TypeError("local_networks must be a list of CIDR strings, not one string")
    texts = tuple(texts)
    if all(isinstance(text, str) for text in texts):
        return _parsed(texts)
    return _parsed.__wrapped__(texts)  # an unhashable entry: read as text (and rejected) uncached


@functools.lru_cache(maxsize=64)
def _parsed(texts: tuple) -> LocalNetworks:
    v4, v6 = [], []
    for text in texts:
        try:
            net = ipaddress.ip_network(str(text).strip(), strict=False)
        except ValueError as exc:
            raise ValueError(f"local_networks: {text!r} is not a CIDR network ({exc})") from None
        (v4 if net.version == 4 else v6).append((int(net.network_address), int(net.netmask)))
    return LocalNetworks(tuple(v4), tuple(v6))


def local_keys(keys: np.ndarray, networks: LocalNetworks) -> np.ndarray:
    """Whether each address key is local: (n, 17) uint8 rows of a family byte (4 or 6) and 16 address
    bytes (IPv4 in the last four); a key of another family is never local."""
    local = np.zeros(len(keys), bool)
    is_v4 = keys[:, 0] == 4
    is_v6 = keys[:, 0] == 6
    if networks.v4:
        value = np.ascontiguousarray(keys[:, 13:]).view(">u4").reshape(-1).astype(np.uint64)
        for address, mask in networks.v4:
            local |= is_v4 & ((value & np.uint64(mask)) == np.uint64(address))
    if networks.v6:
        halves = np.ascontiguousarray(keys[:, 1:]).view(">u8").reshape(-1, 2).astype(np.uint64)
        high, low = halves[:, 0], halves[:, 1]
        for address, mask in networks.v6:
            local |= is_v6 & (
                ((high & np.uint64(mask >> 64)) == np.uint64(address >> 64))
                & ((low & np.uint64(mask & _LOW64)) == np.uint64(address & _LOW64))
            )
    return local


def local_texts(addresses: pa.Array | pa.ChunkedArray, networks: LocalNetworks) -> np.ndarray:
    """Whether each address (canonical text; null is never local) is local, each distinct one looked up once."""
    encoded = pc.dictionary_encode(addresses)
    if isinstance(encoded, pa.ChunkedArray):
        encoded = encoded.combine_chunks()
    # one flag per distinct address, then False for a null (the decoders give none; it is never local)
    flags = np.zeros(len(encoded.dictionary) + 1, dtype=bool)
    for i, text in enumerate(encoded.dictionary.to_pylist()):
        if text:
            v6 = ":" in text
            value = int.from_bytes(socket.inet_pton(socket.AF_INET6 if v6 else socket.AF_INET, text), "big")
            flags[i] = any((value & mask) == address for address, mask in (networks.v6 if v6 else networks.v4))
    return flags[pc.fill_null(encoded.indices, len(encoded.dictionary)).to_numpy(zero_copy_only=False)]


def direction_codes(src_local: np.ndarray, dst_local: np.ndarray) -> np.ndarray:
    """Each record's direction code (``IN``, ``OUT``, ``INTERNAL``, ``UNKNOWN``) from which sides are local."""
    return np.select(
        [src_local & dst_local, src_local, dst_local], [INTERNAL, OUT, IN], UNKNOWN
    ).astype(np.int8)


def neither_local_reason(src: pa.Array, dst: pa.Array) -> pa.Array:
    """The reject reason of records with neither address local: "neither address is in local_networks (src → dst)"."""
    return pc.binary_join_element_wise("neither address is in local_networks (", src, " → ", dst, ")", "")
