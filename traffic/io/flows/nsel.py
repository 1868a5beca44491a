"""Cisco ASA NSEL: each byte counted once, across a connection's updates and its teardown.

The memory of what updates reported (``FlowState.nsel``) is bounded here (``nsel_bounded``) and read
back from stored state (``nsel_entries``); ``NselCounting`` is the decoder's part that applies it.
"""

from __future__ import annotations

import numpy as np

from traffic.io.flows.fields import TEARDOWN
from traffic.io.flows.records import FORMATS, INT64_MAX

#: NSEL connections remembered at most, and for how long after their last update (an ASA sends
#: one per active flow at least every refresh interval, at most an hour): oldest dropped first.
NSEL_MAX_CONNECTIONS = 100_000
NSEL_MAX_AGE_US = 24 * 3600 * 1_000_000


def nsel_bounded(nsel: dict) -> dict:
    """The remembered NSEL connections: none older than ``NSEL_MAX_AGE_US`` before the newest, at most
    ``NSEL_MAX_CONNECTIONS`` (the most recently updated), oldest first."""
    if not nsel:
        return {}
    newest = max(v[4] for v in nsel.values())
    kept = sorted(((k, v) for k, v in nsel.items() if v[4] >= newest - NSEL_MAX_AGE_US), key=lambda kv: kv[1][4])
    return dict(kept[-NSEL_MAX_CONNECTIONS:])


def nsel_entries(items: list) -> dict:
    """NSEL state read back, keeping only entries later code can use (five integers in 0 .. 2**63 - 1)."""
    nsel = {}
    for item in items:
        try:
            key = (str(item["exporter"]), str(item["format"]), int(item["domain"]), int(item["conn"]))
            value = [int(v) for v in item["reported"]]
        except (KeyError, TypeError, ValueError):
            continue
        if len(value) == 5 and all(0 <= v <= INT64_MAX for v in value):
            nsel[key] = value
    return nsel_bounded(nsel)


class NselCounting:
    """The decoder's NSEL step (mixed into ``decoder._Decoder``, whose ``nsel``, ``exporter`` and ``domain``
    it reads and updates)."""

    def nsel_once(self, column: dict) -> None:
        """Count each NSEL byte once: an update counts what it says, a teardown only what no update reported.

        ``self.nsel`` remembers, per (exporter, format, domain, connection id), the bytes and packets
        updates reported in each direction and the time of the last (its end: the observation time);
        a teardown subtracts them (not below 0) and forgets the connection. What an update or teardown
        counts happened since the previous update: its start moves up to that time. In place, in
        datagram order.
        """
        rows = np.flatnonzero(column["tracked"])
        formats = self.column("format")
        start, end = column["start"], column["end"]
        last_order, since = -1, None
        for k, order, context, event, conn, reverse, octets, packets in zip(
                rows.tolist(), *(column[c][rows].tolist() for c in ("order", "context", "event", "conn", "reverse",
                                                                     "bytes", "packets"))):
            key = (self.exporter[context], FORMATS[formats[context]], self.domain[context], conn)
            entry = self.nsel.get(key)
            if order != last_order:  # a record's first direction: the time both of its directions start from
                last_order, since = order, None if entry is None else entry[4]
            if since is not None and start[k] < since <= end[k]:
                start[k] = since
            d = 2 * reverse
            if event == TEARDOWN:
                if entry is None:
                    continue
                column["bytes"][k] = max(0, octets - entry[d])
                column["packets"][k] = max(0, packets - entry[d + 1])
                entry[d] = entry[d + 1] = 0
                if not any(entry[:4]):
                    del self.nsel[key]
            else:
                entry = self.nsel.pop(key, None) or [0, 0, 0, 0, 0]  # popped: re-inserted as the newest
                entry[d] = min(entry[d] + octets, INT64_MAX)
                entry[d + 1] = min(entry[d + 1] + packets, INT64_MAX)
                entry[4] = max(entry[4], int(end[k]))
                self.nsel[key] = entry
