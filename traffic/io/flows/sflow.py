"""sFlow v5: datagrams walked sample by sample; the sampled packet headers then read in bulk.

Raw packet headers are read by the capture reader's own rules (``capture.ip_headers``: VLANs, MPLS,
IPv4-mapped addresses, ...); sampled IPv4/IPv6 records (formats 3 / 4) by the IP length they say.
"""

from __future__ import annotations

import struct

import numpy as np

from traffic.io.bytes import gather
from traffic.io.capture.udp import ip_headers
from traffic.io.flows.columns import be_u32, uint, v4_mapped
from traffic.io.flows.records import P_SFLOW_FIELDS, P_TEMPLATE, SFLOW5
from traffic.io.flows.sampling import usable_rate

#: sFlow flow records of sampled IP packets: format → least length (IPv4: 8 words; IPv6: 14).
_SFLOW_SAMPLED_IP = {3: 32, 4: 56}


def _sflow_format(enterprise: int, kind: int) -> str:
    return str(kind) if enterprise == 0 else f"{enterprise}:{kind}"


class Sflow:
    """The decoder's sFlow part (mixed into ``decoder._Decoder``: its per-datagram columns, ``reject``,
    ``header``, ``column`` and the ``sflow`` / ``sflow_ip`` queues)."""

    def sflow_datagram(self, context: int, start: int, size: int) -> None:
        """An sFlow v5 datagram: its header, then each sample (flow samples are read, others counted)."""
        data, end = self.data, start + size
        if size < 8:
            self.reject(context, start, f"sFlow datagram header cut off ({size} bytes)")
            return
        (address_type,) = struct.unpack_from(">I", data, start + 4)
        address_length = {1: 4, 2: 16}.get(address_type)
        if address_length is None:
            self.reject(context, start, f"sFlow agent address type {address_type} is not 1 (IPv4) or 2 (IPv6)")
            return
        at = start + 8 + address_length
        if end - at < 16:
            self.reject(context, start, f"sFlow datagram header cut off ({size} of {24 + address_length} bytes)")
            return
        sub_agent, sequence, uptime, samples = struct.unpack_from(">IIII", data, at)
        self.header(context, SFLOW5, sub_agent, sequence, -1, uptime)
        self.units[context] = 1
        at += 16
        for k in range(samples):
            if end - at < 8:
                self.reject(context, at, f"sFlow datagram says {samples} samples, it ends after {k}")
                return
            sample_format, length = struct.unpack_from(">II", data, at)
            body, at = at + 8, at + 8 + length
            if at > end:
                self.reject(context, body - 8, f"sFlow sample {k + 1} claims {length} bytes, only {end - body} remain")
                return
            enterprise, kind = sample_format >> 12, sample_format & 0xFFF
            if enterprise == 0 and kind in (1, 3):
                self._flow_sample(context, body, at, expanded=kind == 3)
            elif enterprise == 0 and kind in (2, 4):
                self.skipped["sflow counter sample"] += 1
            else:
                self.skipped[f"sflow sample format {_sflow_format(enterprise, kind)}"] += 1

    def _flow_sample(self, context: int, at: int, end: int, expanded: bool) -> None:
        """One (expanded) flow sample: its raw packet headers and sampled IP records are queued."""
        fixed = 44 if expanded else 32
        if end - at < fixed:
            self.reject(context, at - 8, f"sFlow flow sample cut off ({end - at} of {fixed} bytes)")
            return
        rate = struct.unpack_from(">I", self.data, at + (12 if expanded else 8))[0]
        if not usable_rate(rate) and rate:  # 0: the agent says nothing (ingest's setting, or 1)
            self.reject(context, at - 8, f"sFlow flow sample's sampling rate {rate} is above 2**31 - 1")
            return
        (records,) = struct.unpack_from(">I", self.data, at + fixed - 4)
        at += fixed
        headers, sampled = 0, []
        for k in range(records):
            if end - at < 8:
                self.reject(context, at, f"sFlow flow sample says {records} records, it ends after {k}")
                return
            record_format, length = struct.unpack_from(">II", self.data, at)
            body, at = at + 8, at + 8 + length
            if at > end:
                self.reject(context, body - 8, f"sFlow flow record claims {length} bytes, only {end - body} remain")
                return
            if record_format in _SFLOW_SAMPLED_IP:
                if length < _SFLOW_SAMPLED_IP[record_format]:
                    self.reject(context, body - 8, f"sFlow sampled IPv{4 if record_format == 3 else 6} record of "
                                                   f"{length} bytes (at least {_SFLOW_SAMPLED_IP[record_format]})")
                else:
                    sampled.append((body, record_format, context, rate))
                continue
            if record_format != 1:
                self.skipped[f"sflow flow record format {_sflow_format(record_format >> 12, record_format & 0xFFF)}"] += 1
                continue
            if length < 16:
                self.reject(context, body - 8, f"sFlow raw packet header record of {length} bytes (at least 16)")
                continue
            protocol, frame_length, stripped, captured = struct.unpack_from(">IIII", self.data, body)
            if captured > length - 16:
                self.reject(context, body - 8, f"sFlow raw packet header of {captured} bytes in a record of {length}")
                continue
            linktype = {1: 1, 11: 228, 12: 229}.get(protocol)
            if linktype is None:
                self.skipped[f"sflow raw header of protocol {protocol}"] += 1
                continue
            headers += 1
            self.sflow.append((body + 16, captured, max(frame_length - stripped, 0), linktype, context, rate))
        if headers and sampled:  # the same packet twice: the raw header says more
            self.skipped["sflow sampled IPv4/IPv6 record beside a raw packet header"] += len(sampled)
        elif sampled:
            self.sflow_ip += sampled
        elif not headers:
            self.skipped["sflow flow sample without a raw packet header"] += 1

    def read_sflow(self) -> None:
        """Every queued raw packet header, read by the capture reader's rules: the record columns."""
        header, captured, wire, linktype, context, rate = (np.array(c, np.int64) for c in zip(*self.sflow))
        seen = ip_headers(self.data, header, captured, wire, linktype)
        n = len(header)
        if seen.not_ip.any():
            self.skipped["sflow sampled frame that is not IP"] += int(seen.not_ip.sum())
        problem = np.zeros(n, np.int8)
        for k, text in enumerate(seen.problem):
            if text is not None:
                problem[k] = P_TEMPLATE
                self.told.append((header[k : k + 1], f"sampled packet header: {text}"))
        keep = np.flatnonzero(~seen.not_ip)
        receive = self.column("receive")[context]
        part = dict(order=header, context=context, start=receive, end=receive, protocol=seen.protocol,
                    src_port=seen.src_port, dst_port=seen.dst_port, bytes=seen.length,
                    packets=np.ones(n, np.int64), rate=rate, problem=problem)
        keys = seen.addresses  # the capture reader's form: family byte, then the address (IPv4 in the last four)
        part.update(family=keys[:n, 0].astype(np.int8), src4=be_u32(keys[:n, 13:]), dst4=be_u32(keys[n:, 13:]),
                    src6=keys[:n, 1:], dst6=keys[n:, 1:])
        self.parts.append({name: column[keep] for name, column in part.items()})

    def read_sflow_ip(self) -> None:
        """sFlow sampled IPv4 (format 3) and IPv6 (4) records: one packet of the IP length they say."""
        body, kind, context, rate = (np.array(c, np.int64) for c in zip(*self.sflow_ip))
        n = len(body)
        v6 = kind == 4
        width = np.where(v6, 16, 4)
        after = body + 8 + 2 * width  # the ports follow the two addresses
        problem = np.zeros(n, np.int8)
        protocol, src_port, dst_port = (uint(self.buf, p, 4).astype(np.int64) for p in (body + 4, after, after + 4))
        problem[(protocol > 255) | (src_port > 65535) | (dst_port > 65535)] = P_SFLOW_FIELDS
        receive = self.column("receive")[context]
        addresses = dict(family=np.where(v6, 6, 4).astype(np.int8),
                         src4=uint(self.buf, body + 8, 4).astype(np.uint32),
                         dst4=uint(self.buf, body + 12, 4).astype(np.uint32),
                         src6=gather(self.buf, body + 8, 16).copy(), dst6=gather(self.buf, body + 24, 16).copy())
        addresses["src6"][~v6] = 0
        addresses["dst6"][~v6] = 0
        v4_mapped(addresses, problem)
        self.parts.append(dict(order=body, context=context, start=receive, end=receive, **addresses,
                               protocol=np.where(problem == 0, protocol, -1), src_port=src_port, dst_port=dst_port,
                               bytes=uint(self.buf, body, 4).astype(np.int64), packets=np.ones(n, np.int64),
                               rate=rate, problem=problem))
