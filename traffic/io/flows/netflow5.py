"""NetFlow v5: fixed 24-byte headers and 48-byte records, read in bulk over all datagrams of a call."""

from __future__ import annotations

import struct

import numpy as np

from traffic.io.bytes import gather
from traffic.io.flows.columns import concatenate, record_starts, uptime_before
from traffic.io.flows.records import FORMAT_CODE, NETFLOW5


class NetFlow5:
    """The decoder's NetFlow v5 part (mixed into ``decoder._Decoder``: its per-datagram columns, ``reject``,
    ``header`` and ``column``)."""

    def netflow5_in_bulk(self, contexts: np.ndarray, offset: np.ndarray, length: np.ndarray) -> np.ndarray:
        """Read every valid NetFlow v5 header at once (they need no state); the other contexts, to walk one by one."""
        head = gather(self.buf, offset, 24)
        halves, words = head.view(">u2").astype(np.int64), head[:, 4:20].view(">u4").astype(np.int64)
        count = halves[:, 1]
        good = ((halves[:, 0] == 5) & (length >= 24) & (count >= 1) & (count <= 30) & (24 + 48 * count <= length)
                & (words[:, 2] < 1_000_000_000))
        rows = np.flatnonzero(good)
        if len(rows):
            export = words[rows, 1] * 1_000_000 + words[rows, 2] // 1000
            domain = head[rows, 20].astype(np.int64) << 8 | head[rows, 21]
            columns = (contexts[rows], domain, words[rows, 3], export, words[rows, 0], count[rows])
            for context, d, sequence, e, uptime, units in zip(*(c.tolist() for c in columns)):
                self.format[context], self.domain[context], self.sequence[context] = FORMAT_CODE[NETFLOW5], d, sequence
                self.export[context], self.uptime[context], self.units[context] = e, uptime, units
            self.v5.append((offset[rows] + 24, count[rows], contexts[rows], halves[rows, 11] & 0x3FFF))
        return contexts[~good]

    def netflow5_datagram(self, context: int, start: int, size: int) -> None:
        """A NetFlow v5 datagram the bulk read could not take: its header checked one rule at a time, then queued."""
        if size < 24:
            self.reject(context, start, f"NetFlow v5 header cut off ({size} of 24 bytes)")
            return
        _, count, uptime, secs, nsecs, sequence, engine_type, engine_id, sampling = struct.unpack_from(
            ">HHIIIIBBH", self.data, start)
        if not 1 <= count <= 30:
            self.reject(context, start, f"NetFlow v5 record count {count} is not in 1-30")
            return
        if 24 + 48 * count > size:
            self.reject(context, start, f"NetFlow v5 header says {count} records ({24 + 48 * count} bytes), "
                                        f"the datagram has {size} bytes")
            return
        if nsecs >= 1_000_000_000:
            self.reject(context, start, f"NetFlow v5 header's nanoseconds {nsecs} are not below one second")
            return
        self.header(context, NETFLOW5, engine_type << 8 | engine_id, sequence, secs * 1_000_000 + nsecs // 1000,
                    uptime)
        self.units[context] = count
        self.v5.append(tuple(np.array([v], np.int64) for v in (start + 24, count, context, sampling & 0x3FFF)))

    def read_netflow5(self) -> None:
        """Every queued NetFlow v5 record, in one gather: the record columns."""
        first, count, context, sampling = (concatenate(list(c)) for c in zip(*self.v5))
        pos = record_starts(first, count, 48)
        context = np.repeat(context, count)
        rows = gather(self.buf, pos, 48)
        words = rows.view(">u4")  # (n, 12)
        halves = rows.view(">u2")
        export = self.column("export")[context]
        uptime = self.column("uptime")[context]
        n = len(pos)
        self.parts.append(dict(
            order=pos, context=context,
            start=export - uptime_before(uptime, words[:, 6].astype(np.int64)) * 1000,
            end=export - uptime_before(uptime, words[:, 7].astype(np.int64)) * 1000,
            family=np.full(n, 4, np.int8), src4=words[:, 0].astype(np.uint32), dst4=words[:, 1].astype(np.uint32),
            protocol=rows[:, 38].astype(np.int64),
            src_port=halves[:, 16].astype(np.int64), dst_port=halves[:, 17].astype(np.int64),
            bytes=words[:, 5].astype(np.int64), packets=words[:, 4].astype(np.int64), rate=np.repeat(sampling, count),
            problem=np.zeros(n, np.int8),
        ))
