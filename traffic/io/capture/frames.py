"""What every part of the capture reader shares: the frames found in a file and the reason codes set on them.

Frames are judged in bulk, so a rejected frame carries a reason code and one integer (``_reject``);
the text is made only for the (few) rejected frames (``reasons``). This module imports nothing of the
package, so the parts that read files, link layers and IP headers stand side by side on it.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np


#: Reason codes (their texts: ``reasons._REASONS``); ``_OK``: not rejected.
_OK = 0
_R_SPB = 1
_R_NO_INTERFACE = 2
_R_TS_RANGE = 3
_R_LINKTYPE = 4
_R_LINK_SHORT = 5
_R_ETHERTYPE = 6
_R_8023 = 7
_R_FAMILY = 8
_R_MPLS = 9
_R_PPP = 10
_R_ARISTA = 11
_R_STACK = 12
#: Link-layer headers (VLAN tags, MPLS labels, ...) followed before a frame is rejected (``_R_STACK``).
_MAX_LINK_HEADERS = 16
_R_NIBBLE = 13
_R_VERSION = 14
_R_IP_SHORT = 15
_R_IHL = 16
_R_TOTAL_LENGTH = 17
_R_NEITHER = 18  # its text is built from the addresses, in packets._frames_to_table
_R_MAPPED_MIXED = 19
_R_MAPPED_LENGTH = 20
_R_GSO_LENGTH = 21

#: Frames of a telemetry capture that are simply not export traffic: skipped and counted.
_NOT_IP = (_R_ETHERTYPE, _R_8023, _R_FAMILY, _R_MPLS, _R_PPP)
_R_FRAGMENT = 40
_R_UDP_CUT = 41
_R_UDP_LENGTH = 42
_R_DATAGRAM_CUT = 43


@dataclass
class _Frames:
    """One entry per packet-carrying record, in file order (numpy columns)."""

    pos: np.ndarray  # byte offset of the frame's first captured byte
    cap: np.ndarray  # captured length
    orig: np.ndarray  # original (wire) length
    ts: np.ndarray  # µs since the epoch
    linktype: np.ndarray
    fcs: np.ndarray  # FCS bytes at the end of the wire frame
    code: np.ndarray  # reject reason code, _OK if none yet
    value: np.ndarray  # the reason's argument

    @staticmethod
    def empty() -> _Frames:
        z = np.zeros(0, np.int64)
        return _Frames(z, z, z, z, z, z, z.astype(np.int16), z)

    def take(self, order: np.ndarray) -> _Frames:
        return _Frames(*(getattr(self, f)[order] for f in self.__dataclass_fields__))

    @staticmethod
    def concat(parts: list[_Frames]) -> _Frames:
        if not parts:
            return _Frames.empty()
        return _Frames(
            *(np.concatenate([getattr(p, f) for p in parts]) for f in _Frames.__dataclass_fields__)
        )


def _reject(code: np.ndarray, value: np.ndarray, where: np.ndarray, reason: int, arg) -> None:
    """Mark frames (a boolean mask) as rejected unless they already are."""
    where = where & (code == _OK)
    code[where] = reason
    value[where] = arg[where] if isinstance(arg, np.ndarray) else arg
