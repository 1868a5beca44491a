"""Flow telemetry files → rows to account (DESIGN §7a): weights, sampling, shares, ticks and losses.

``read_telemetry`` takes the collector files (or captures of export traffic) of ONE source in the
order they were written, and that source's telemetry state from earlier batches, and gives:

* ``parsed``: ``PARSED_SCHEMA`` rows, like any reader's. A flow record becomes one ``packet`` row
  per 5-minute pane it overlaps (``core.periods.apportion_to_panes``: exact integer shares), whose
  ``bytes`` and ``packets`` are the record's multiplied by its sampling rate and whose ``ts`` lies
  inside the pane, so lateness is judged per share. An sFlow sample is one row of weight 1 × rate
  at its datagram's receive time. Local/remote and ``direction`` come from ``local_networks`` as
  for captures; a flow between two outside addresses is a reject unless ``keep_transit``. Each
  datagram's export time (sFlow: its receive time) is a ``tick`` of the source's clock, one per
  pane (the newest). Whatever cannot be decoded is a ``reject`` with its reason.
* ``lost``: per (source, 5-minute pane), the sequence units missing before a datagram of that pane:
  NetFlow v5 and IPFIX count records, NetFlow v9 and sFlow datagrams. A stream is (exporter,
  format, domain); a jump of 2**31 or more is taken for a restart, not a loss.
* ``state``: templates, sampling facts, data waiting for its template and each stream's last
  sequence, to keep for the next batch (``TelemetryState.to_json``).
* ``skipped``: what is not traffic (counter samples, options data, …), counted by kind.

Sampling: the per-source ``sampling_rates`` setting overrides what the exporter says; a record
whose exporter says nothing and whose source has no setting counts as unsampled (rate 1).
Data whose template has not arrived waits in the state; data received more than ``template_wait``
before the newest datagram of the batch is rejected ("its template never arrived").
"""

from __future__ import annotations

import functools
import ipaddress
import socket
from dataclasses import dataclass, field, replace

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from traffic.core.periods import apportion_to_panes
from traffic.core.records import PACKET, PARSED_SCHEMA, REJECT, TICK
from traffic.io.captures import Datagrams, udp_datagrams
from traffic.io.flows import FlowState, Waiting, decode, decode_waiting, expire_waiting

__all__ = ["TelemetryRules", "TelemetryState", "Telemetry", "LOST_SCHEMA", "read_telemetry"]

_TS = pa.timestamp("us", tz="UTC")
_PANE_US = 300_000_000
_SEQUENCE_SPACE = 1 << 32
_PORT_PROTOCOLS = (6, 17, 132)
_DIRECTIONS = pa.array(["in", "out", "internal", None], pa.string())
LOST_SCHEMA = pa.schema([("source", pa.string()), ("pane_start", _TS), ("lost", pa.int64())])


@dataclass(frozen=True)
class TelemetryRules:
    """What a telemetry task needs from the settings (pickled to the executors)."""

    local_networks: tuple[str, ...] = ()
    keep_transit: bool = False
    sampling_rate: int | None = None  # the source's ``sampling_rates`` setting
    template_wait_us: int = 3_600_000_000


@dataclass(frozen=True)
class TelemetryState:
    """One source's telemetry state between batches."""

    flows: FlowState = field(default_factory=FlowState)
    waiting: Waiting = field(default_factory=Waiting)
    # (exporter, format, domain) → (last sequence number, units it advanced by; None: unknown)
    streams: dict = field(default_factory=dict)

    def to_json(self) -> dict:
        return {"flows": self.flows.to_json(), "waiting": self.waiting.to_json(),
                "streams": [[e, f, d, seq, units] for (e, f, d), (seq, units) in sorted(self.streams.items())]}

    @staticmethod
    def from_json(data: dict | None) -> TelemetryState:
        if not data:
            return TelemetryState()
        return TelemetryState(FlowState.from_json(data.get("flows", {})), Waiting.from_json(data.get("waiting", [])),
                              {(e, f, int(d)): (int(seq), None if units is None else int(units))
                               for e, f, d, seq, units in data.get("streams", [])})


@dataclass
class Telemetry:
    """What ``read_telemetry`` gives (see the module docstring)."""

    parsed: pa.Table
    lost: pa.Table
    state: TelemetryState
    skipped: dict[str, int]


def read_telemetry(files: list[tuple[bytes, str, int]], state: TelemetryState, *, source: str,
                   rules: TelemetryRules) -> Telemetry:
    """Decode ``files`` of one source, and account them.

    ``files`` are (content, name, start) in the order they were written; only the datagrams whose
    record starts at ``start`` or later count (a file that grew after an earlier batch counted it).
    """
    flows_state, waiting, streams = state.flows, state.waiting, dict(state.streams)
    tables: list[pa.Table] = []
    lost: dict[int, int] = {}
    skipped: dict[str, int] = {}
    newest = None
    for data, name, start in files:
        datagrams, rejects = udp_datagrams(data, input_file=name, source=source)
        if start:  # (the collector never grows a finished file; a reject of the earlier part is named again)
            datagrams = _from(datagrams, start)
        tables.append(rejects)
        _add(skipped, datagrams.skipped)
        decoded = decode(datagrams, flows_state, source=source, input_file=name)
        flows_state = decoded.state
        waiting = Waiting(waiting.sets + decoded.waiting.sets)
        _add(skipped, decoded.skipped)
        tables += [decoded.rejects, _rows(decoded.flows, source, name, rules),
                   _ticks(decoded.sequences, source, name)]
        _count_losses(decoded.sequences, streams, lost)
        if len(datagrams):
            newest = max(newest or 0, int(datagrams.receive_ts.max()))
    if waiting.sets:
        # Templates that arrived in this batch unlock data that waited for them (per file it came from).
        still: list = []
        for name in dict.fromkeys(s.input_file for s in waiting.sets):
            group = Waiting(tuple(s for s in waiting.sets if s.input_file == name))
            decoded, remaining = decode_waiting(group, flows_state, source=source, input_file=name)
            flows_state = decoded.state
            _add(skipped, decoded.skipped)
            tables += [decoded.rejects, _rows(decoded.flows, source, name, rules)]
            still += remaining.sets
        waiting = Waiting(tuple(still))
        if newest is not None and waiting.sets:
            expired, waiting = expire_waiting(waiting, before_us=newest - rules.template_wait_us,
                                              source=source, input_file=files[-1][1] if files else "")
            tables.append(expired)
    parsed = pa.concat_tables([t.cast(PARSED_SCHEMA) for t in tables]) if tables else PARSED_SCHEMA.empty_table()
    lost_table = pa.table({"source": [source] * len(lost), "pane_start": pa.array(sorted(lost), pa.int64()).cast(_TS),
                           "lost": pa.array([lost[p] for p in sorted(lost)], pa.int64())}, schema=LOST_SCHEMA)
    return Telemetry(parsed, lost_table, TelemetryState(flows_state, waiting, streams), skipped)


def _from(datagrams: Datagrams, start: int) -> Datagrams:
    """The datagrams whose bytes lie at ``start`` or later in their file."""
    keep = datagrams.offset >= start
    return replace(datagrams, offset=datagrams.offset[keep], length=datagrams.length[keep],
                   receive_ts=datagrams.receive_ts[keep], src_port=datagrams.src_port[keep],
                   dst_port=datagrams.dst_port[keep], number=datagrams.number[keep],
                   exporter=[e for e, k in zip(datagrams.exporter, keep) if k])


def _add(total: dict[str, int], more: dict[str, int]) -> None:
    for key, value in more.items():
        total[key] = total.get(key, 0) + value


# --- flows → rows ----------------------------------------------------------------------------


def _rows(flows: pa.Table, source: str, input_file: str, rules: TelemetryRules) -> pa.Table:
    """Sampled, apportioned and oriented rows of decoded flows; a flow between two outside addresses is
    one reject (or, with ``keep_transit``, kept with an unknown direction and the sender as local)."""
    if flows.num_rows == 0:
        return PARSED_SCHEMA.empty_table()
    src, dst = flows.column("src_ip"), flows.column("dst_ip")
    src_local, dst_local = _is_local(src, rules.local_networks), _is_local(dst, rules.local_networks)
    neither = ~src_local & ~dst_local
    rejects = PARSED_SCHEMA.empty_table()
    if neither.any() and not rules.keep_transit:
        rejects = _neither_local(flows.filter(pa.array(neither)), source, input_file)
        kept = pa.array(~neither)
        flows, src_local, dst_local = flows.filter(kept), src_local[~neither], dst_local[~neither]
        src, dst = flows.column("src_ip"), flows.column("dst_ip")
    n = flows.num_rows
    said = flows.column("sampling_rate").to_numpy(zero_copy_only=False)
    rate = np.full(n, rules.sampling_rate, np.int64) if rules.sampling_rate else np.where(said > 0, said, 1)
    start = pc.cast(flows.column("start_ts"), pa.int64()).to_numpy(zero_copy_only=False)
    end = pc.cast(flows.column("end_ts"), pa.int64()).to_numpy(zero_copy_only=False)
    flow, ts, (share_bytes, share_packets) = apportion_to_panes(
        start, end, [flows.column("bytes").to_numpy(zero_copy_only=False) * rate,
                     flows.column("packets").to_numpy(zero_copy_only=False) * rate])
    # Codes into _DIRECTIONS: in, out, internal, or unknown (kept transit: the sender is "local").
    code = np.where(src_local & dst_local, 2, np.where(src_local, 1, np.where(dst_local, 0, 3))).astype(np.int8)
    spread = len(flow) != n  # some flow has several shares: its columns repeat once per share
    take = pa.array(flow) if spread else None
    code = code[flow] if spread else code
    inbound = pa.array(code == 0)  # the local side received it: the remote side is the source
    protocol = flows.column("protocol")
    sport, dport = flows.column("src_port"), flows.column("dst_port")
    if spread:
        src, dst, sport, dport, protocol = (c.take(take) for c in (src, dst, sport, dport, protocol))
    m = len(flow)
    received = code == 0
    if not received.any():  # every flow sent by the local side (or internal): no column to swap
        local_ip, remote_ip, local_port, remote_port = src, dst, sport, dport
    elif received.all():
        local_ip, remote_ip, local_port, remote_port = dst, src, dport, sport
    else:
        local_ip, remote_ip = pc.if_else(inbound, dst, src), pc.if_else(inbound, src, dst)
        local_port, remote_port = pc.if_else(inbound, dport, sport), pc.if_else(inbound, sport, dport)
    rows = pa.table({
        "kind": pa.repeat(pa.scalar(PACKET), m),
        "ts": pa.array(ts, pa.int64()).cast(_TS),
        "source": pa.repeat(pa.scalar(source), m),
        "local_ip": local_ip,
        "remote_ip": remote_ip,
        "local_port": local_port,
        "remote_port": remote_port,
        "protocol": protocol,
        "bytes": pa.array(share_bytes, pa.int64()),
        "direction": _DIRECTIONS.take(pa.array(code)),
        "reason": pa.nulls(m, pa.string()),
        "record": pa.nulls(m, pa.string()),
        "input_file": pa.repeat(pa.scalar(input_file), m),
        "packets": pa.array(share_packets, pa.int64()),
        "sampling_rate": pa.array(rate[flow], pa.int64()).cast(pa.int32()),
    }, schema=PARSED_SCHEMA)
    return pa.concat_tables([rejects, rows])


def _neither_local(flows: pa.Table, source: str, input_file: str) -> pa.Table:
    """One reject per flow with neither address in ``local_networks``."""
    src, dst = flows.column("src_ip"), flows.column("dst_ip")
    k = flows.num_rows
    columns = {f.name: pa.nulls(k, f.type) for f in PARSED_SCHEMA}
    stamp = pc.strftime(flows.column("start_ts"), format="%Y-%m-%dT%H:%M:%SZ")
    columns.update({
        "kind": pa.repeat(pa.scalar(REJECT), k), "source": pa.repeat(pa.scalar(source), k),
        "input_file": pa.repeat(pa.scalar(input_file), k),
        "reason": pc.binary_join_element_wise("neither address is in local_networks (", src, " → ", dst, ")", ""),
        "record": pc.binary_join_element_wise(flows.column("format"), " flow from ", stamp, " ", src, " → ", dst,
                                              ", ", flows.column("bytes").cast(pa.string()), " bytes × ",
                                              flows.column("sampling_rate").cast(pa.string()), "", ""),
    })
    return pa.table(columns, schema=PARSED_SCHEMA)


@functools.lru_cache(maxsize=64)
def _networks(local_networks: tuple[str, ...]) -> dict[int, list[tuple[int, int]]]:
    """Per address family, the (first, last) address of each local network, as integers."""
    ranges: dict[int, list[tuple[int, int]]] = {socket.AF_INET: [], socket.AF_INET6: []}
    for text in local_networks:
        net = ipaddress.ip_network(text, strict=False)
        family = socket.AF_INET if net.version == 4 else socket.AF_INET6
        ranges[family].append((int(net.network_address), int(net.broadcast_address)))
    return ranges


def _is_local(addresses: pa.Array, local_networks: tuple[str, ...]) -> np.ndarray:
    """Whether each address lies in ``local_networks``: each distinct address (canonical text, from the
    decoder) is looked up once, as an integer against each network's range."""
    encoded = pc.dictionary_encode(addresses)
    if isinstance(encoded, pa.ChunkedArray):
        encoded = encoded.combine_chunks()
    ranges = _networks(tuple(local_networks))
    flags = np.zeros(len(encoded.dictionary), dtype=bool)
    for i, text in enumerate(encoded.dictionary.to_pylist()):
        if text:
            family = socket.AF_INET6 if ":" in text else socket.AF_INET
            value = int.from_bytes(socket.inet_pton(family, text), "big")
            flags[i] = any(lo <= value <= hi for lo, hi in ranges[family])
    return flags[pc.fill_null(encoded.indices, 0).to_numpy(zero_copy_only=False)] if len(flags) else \
        np.zeros(len(addresses), dtype=bool)


# --- ticks and losses ---------------------------------------------------------------------------


def _ticks(sequences: pa.Table, source: str, input_file: str) -> pa.Table:
    """One tick per pane: the newest export time of the pane's datagrams (sFlow: their receive time)."""
    if sequences.num_rows == 0:
        return PARSED_SCHEMA.empty_table()
    when = pc.cast(pc.coalesce(sequences.column("export_ts"), sequences.column("receive_ts")), pa.int64())
    when = when.to_numpy(zero_copy_only=False)
    panes, index = np.unique(when // _PANE_US, return_inverse=True)
    newest = np.full(len(panes), np.iinfo(np.int64).min)
    np.maximum.at(newest, index, when)
    k = len(panes)
    columns = {f.name: pa.nulls(k, f.type) for f in PARSED_SCHEMA}
    columns.update({"kind": pa.repeat(pa.scalar(TICK), k), "ts": pa.array(newest, pa.int64()).cast(_TS),
                    "source": pa.repeat(pa.scalar(source), k), "input_file": pa.repeat(pa.scalar(input_file), k)})
    return pa.table(columns, schema=PARSED_SCHEMA)


def _count_losses(sequences: pa.Table, streams: dict, lost: dict[int, int]) -> None:
    """Add the sequence units missing before each datagram to its pane; move each stream's last sequence."""
    if sequences.num_rows == 0:
        return
    rows = zip(sequences.column("exporter").to_pylist(), sequences.column("format").to_pylist(),
               sequences.column("domain").to_pylist(), sequences.column("sequence").to_pylist(),
               sequences.column("units").to_pylist(),
               pc.cast(sequences.column("receive_ts"), pa.int64()).to_pylist())
    for exporter, fmt, domain, sequence, units, received in rows:
        key = (exporter, fmt, domain)
        if sequence is None:
            continue
        before = streams.get(key)
        if before is not None and before[1] is not None:
            gap = (sequence - before[0] - before[1]) % _SEQUENCE_SPACE
            if 0 < gap < _SEQUENCE_SPACE // 2:
                pane = received // _PANE_US * _PANE_US
                lost[pane] = lost.get(pane, 0) + gap
        streams[key] = (sequence, units)
