"""v9/IPFIX data sets: queued per template, then read in bulk, one gather per field over all their records.

Times, counts per direction (forward, and the reverse of RFC 5103 and NSEL records), addresses,
ports and sampling rates become the decoder's record columns; what cannot be accounted gets a
problem code (``records.PROBLEMS``).
"""

from __future__ import annotations

import numpy as np

from traffic.io.bytes import gather
from traffic.io.flows.columns import field_at, record_starts, uint, uptime_before, v4_mapped
from traffic.io.flows.fields import (
    BACKWARD, CONN_ID, CREATE, EVENTS, FORWARD, NAT_EVENT, OBSERVED, SAMPLER_IDS, TEARDOWN, UPDATE, VARIABLE,
    Template, record_fields,
)
from traffic.io.flows.records import (
    FORMAT_CODE, INT64_MAX, IPFIX, MAX_TS_US, NETFLOW9, P_COUNT_RANGE, P_NO_ADDRESS, P_NO_COUNT, P_TEMPLATE,
    P_TIME_RANGE,
)
from traffic.io.flows.sampling import rate_by_precedence, rate_said, samplers_rate

_NTP_TO_UNIX = 2_208_988_800


class DataSets:
    """The decoder's data set part (mixed into ``decoder._Decoder``: its per-datagram columns, ``reject``,
    ``key``, ``options_data``, the templates and rates it knows, the ``data_sets`` queue and ``parts``)."""

    def data_set(self, context: int, tid: int, start: int, end: int) -> None:
        """Read (options) or queue (flows) one data set, or keep it for when its template is known."""
        template = self.templates.get((*self.key(context), tid))
        if template is None:
            self.pending.append((context, tid, start, end))
            return
        layout = template.layout
        if layout.record_length:
            records = None
            count = (end - start) // layout.record_length
        else:
            records = self._walk(context, template, start, end)
            count = len(records)
        if self.units[context] is not None and self.format[context] == FORMAT_CODE[IPFIX]:
            self.units[context] += count
        if template.options:
            self.options_data(context, template, start, end, records)
            return
        key = self.key(context)
        self.data_sets.setdefault(id(template), (template, []))[1].append(
            (start, end, context, self.sampling.get(key, 0), self.system_init.get(key, -1), self.samplers.get(key),
             records))

    def _walk(self, context: int, template: Template, start: int, end: int) -> list[int]:
        """Start of each record of a set whose template has variable-length fields (rejecting an overrun)."""
        layout = template.layout
        starts, at, data = [], start, self.data
        while end - at >= layout.min_length and end - at > 0:
            record = at
            for _, length, _ in template.fields:
                if length == VARIABLE:
                    if at >= end:
                        at = end + 1
                        break
                    length = data[at]
                    at += 1
                    if length == 255:
                        length = int.from_bytes(data[at : at + 2], "big") if at + 2 <= end else VARIABLE
                        at += 2
                at += length
            if at > end:
                self.reject(context, record, f"a record of template with {len(template.fields)} fields runs past "
                                             "the end of its data set")
                break
            starts.append(record)
        return starts

    def read_sets(self, template: Template, sets: list) -> None:
        """All queued data sets of one template, in one gather per field."""
        layout = template.layout
        start, end, context, rate, system_init = (np.array(c, np.int64) for c in list(zip(*sets))[:5])
        if layout.record_length:
            count = (end - start) // layout.record_length
            pos = record_starts(start, count, layout.record_length)
            at = None  # fields are strided views of the gathered records; IPv6 addresses are gathered apart
        else:
            records, found, counts = [], [], []
            for *_, starts in sets:
                records += starts
                counts.append(len(starts))
                found += [record_fields(self.data, template, r) for r in starts]
            count, pos = np.array(counts, np.int64), np.array(records, np.int64)
            at = {ie: np.array([f[ie] for f in found], np.int64) for ie in layout.lengths}
        n = len(pos)
        if n == 0:
            return
        context, rate, system_init = (np.repeat(c, count) for c in (context, rate, system_init))
        problem = np.zeros(n, np.int8)
        if layout.problem:
            problem[:] = P_TEMPLATE
            self.told.append((pos, layout.problem))
        if layout.problem:
            value = {}
        elif layout.record_length:  # one gather of whole records, then each field is a strided view
            records = gather(self.buf, pos, layout.record_length)
            value = {ie: field_at(records, offset, layout.lengths[ie]) for ie, offset in layout.offsets.items()}
        else:
            value = {ie: uint(self.buf, at[ie], layout.lengths[ie]) for ie in at}
        export = self.column("export")[context]
        uptime = self.column("uptime")[context]
        netflow9 = self.column("format")[context] == FORMAT_CODE[NETFLOW9]

        has_v4, has_v6 = 8 in value and 12 in value, 27 in value and 28 in value
        addresses = dict(family=np.full(n, 4, np.int8), src4=np.zeros(n, np.uint32), dst4=np.zeros(n, np.uint32))
        if has_v4:
            addresses.update(src4=value[8].astype(np.uint32), dst4=value[12].astype(np.uint32))
        if has_v6:  # beside IPv4 fields, for the records whose IPv4 pair is 0.0.0.0
            v6 = (value[8] == 0) & (value[12] == 0) if has_v4 else np.ones(n, bool)
            addresses["family"][v6] = 6
            addresses.update(src6=np.zeros((n, 16), np.uint8), dst6=np.zeros((n, 16), np.uint8))
            where = at if at is not None else {ie: pos + layout.offsets[ie] for ie in (27, 28)}
            addresses["src6"][v6] = gather(self.buf, where[27][v6], 16)
            addresses["dst6"][v6] = gather(self.buf, where[28][v6], 16)
            v4_mapped(addresses, problem)
        if not (has_v4 or has_v6):
            problem[problem == 0] = P_NO_ADDRESS

        directions = [_counts_of(value, ies) for ies in (FORWARD, BACKWARD)]
        event = next((value[ie].astype(np.int64) for ie in EVENTS if ie in value), None)
        if directions == [None, None]:
            if event is not None and not layout.problem:  # an NSEL create or deny: no traffic in it
                self.skipped["firewall event without counters (NSEL create or deny)"] += n
                return
            if NAT_EVENT in value and not layout.problem:  # NAT event logging: a session made or ended, no traffic
                self.skipped["NAT event without counters"] += n
                return
            problem[problem == 0] = P_NO_COUNT
            directions[0] = (np.zeros(n, np.int64), np.zeros(n, np.int64), np.ones(n, bool), np.zeros(n, bool))
        for counted in directions:
            if counted is not None:
                problem[(problem == 0) & counted[3]] = P_COUNT_RANGE
        nsel = dict(event=np.full(n, -1, np.int64) if event is None else event,
                    conn=value[CONN_ID].view(np.int64) if CONN_ID in value else np.full(n, -1, np.int64),
                    tracked=np.zeros(n, bool) if event is None or CONN_ID not in value
                    else np.isin(event, (CREATE, TEARDOWN, UPDATE)),
                    directional=np.full(n, directions[1] is not None or event is not None))

        if 160 in value:
            said = np.minimum(value[160], np.uint64(INT64_MAX)).astype(np.int64)
            system_init = np.where(said > 0, said, system_init)
        start_ts, start_bad = _flow_time(value, "start", export, uptime, system_init, netflow9)
        end_ts, end_bad = _flow_time(value, "end", export, uptime, system_init, netflow9)
        if end_ts is None and OBSERVED in value:  # NSEL: no end, but when the event was observed
            end_bad = value[OBSERVED] > np.uint64(MAX_TS_US // 1000)
            end_ts = np.where(end_bad, 0, value[OBSERVED]).astype(np.int64) * 1000
        if start_ts is None and end_ts is None:
            start_ts = end_ts = export
            start_bad = end_bad = np.zeros(n, bool)
        elif start_ts is None:
            start_ts, start_bad = end_ts, end_bad
        elif end_ts is None:
            end_ts, end_bad = start_ts, start_bad
        problem[(problem == 0) & (start_bad | end_bad)] = P_TIME_RANGE

        said, rate_problem = rate_said(value, n, layout.lengths)
        problem[(problem == 0) & (rate_problem > 0)] = rate_problem[(problem == 0) & (rate_problem > 0)]
        sampler = next((ie for ie in SAMPLER_IDS if ie in value), None)
        samplers = [s[5] for s in sets]
        if sampler is not None and any(samplers):
            by_sampler = samplers_rate(value[sampler], np.repeat(np.arange(len(sets)), count), samplers)
        else:
            by_sampler = np.zeros(n, np.int64)
        rate = rate_by_precedence(said, by_sampler, rate)
        part = dict(
            order=pos, context=context, start=start_ts, end=end_ts, **addresses,
            protocol=value[4].astype(np.int64) if 4 in value else np.full(n, -1, np.int64),
            src_port=value[7].astype(np.int64) if 7 in value else np.full(n, -1, np.int64),
            dst_port=value[11].astype(np.int64) if 11 in value else np.full(n, -1, np.int64),
            rate=rate, problem=problem, **nsel,
        )
        for reverse, counted in enumerate(directions):  # each direction its own row, the reverse one turned round
            if counted is not None:
                row = dict(part, bytes=counted[0], packets=counted[1], has_packets=counted[2],
                           reverse=np.full(n, bool(reverse)))
                self.parts.append(_turned(row) if reverse else row)


def _counts_of(value: dict, ies: tuple) -> tuple | None:
    """(bytes, packets, has a packet counter, above 2**63 - 1) of one direction; None without a byte counter.

    A record that says its bytes and no packet count counts its bytes with 0 packets (§7a).
    """
    octets, packets = (next((value[i] for i in choices if i in value), None) for choices in ies)
    if octets is None:
        return None
    n = len(octets)
    big = octets > np.uint64(INT64_MAX)
    if packets is not None:
        big |= packets > np.uint64(INT64_MAX)
        packets = np.minimum(packets, np.uint64(INT64_MAX)).astype(np.int64)
    return (np.minimum(octets, np.uint64(INT64_MAX)).astype(np.int64),
            np.zeros(n, np.int64) if packets is None else packets, np.full(n, packets is not None), big)


def _turned(row: dict) -> dict:
    """The row seen from the other end: sources and destinations swapped."""
    turned = dict(row)
    for a, b in (("src4", "dst4"), ("src6", "dst6"), ("src_port", "dst_port")):
        if a in row:
            turned[a], turned[b] = row[b], row[a]
    return turned


_TIME_FIELDS = {"start": (156, 154, 152, 150, 22, 158), "end": (157, 155, 153, 151, 21, 159)}


def _flow_time(value: dict, which: str, export, uptime, system_init, netflow9):
    """(µs, out of range) for one end of the flows, from the most precise field the template has; None if none."""
    ns, us, ms, s, up, delta = _TIME_FIELDS[which]
    if ns in value or us in value:
        v = value[ns] if ns in value else value[us]
        seconds = (v >> np.uint64(32)).astype(np.int64) - _NTP_TO_UNIX
        fraction = ((v & np.uint64(0xFFFFFFFF)) * np.uint64(1_000_000)) >> np.uint64(32)
        bad = (seconds < 0) | (seconds > MAX_TS_US // 1_000_000)
        return np.where(bad, 0, seconds) * 1_000_000 + fraction.astype(np.int64), bad
    if ms in value:
        bad = value[ms] > np.uint64(MAX_TS_US // 1000)
        return np.where(bad, 0, value[ms]).astype(np.int64) * 1000, bad
    if s in value:
        return value[s].astype(np.int64) * 1_000_000, np.zeros(len(export), bool)
    if up in value:
        stamp = value[up].astype(np.int64)
        relative = export - uptime_before(uptime, stamp) * 1000
        absolute = (system_init + stamp) * 1000
        return np.where(netflow9, relative, np.where(system_init >= 0, absolute, export)), system_init > MAX_TS_US // 1000
    if delta in value:
        return export - value[delta].astype(np.int64), np.zeros(len(export), bool)
    return None, None
