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
  NetFlow v5 and IPFIX count records, NetFlow v9 and sFlow datagrams (``traffic.io.sequence_losses``).
  A stream is (exporter, format, domain). Reordering is not loss: a gap waits for the next
  ``REORDER_WINDOW`` (64) datagrams of its stream, or a minute (``REORDER_WAIT_US``, receive time; a
  batch decides the gaps a minute older than its newest datagram or the watermark, and ingest, with
  the watermark after the batch, also those of the hours that watermark closes: ``close_gaps_by``),
  a late datagram fills it, and only what is still missing then counts, in the pane of the datagram
  that revealed the gap; a duplicate costs nothing; a restart (the number going back past the
  window, a jump of 2**31 or more, the uptime going back) starts a new sequence and loses nothing
  (``judge_sequence``).
* ``state``: templates, sampling facts, data waiting for its template and each stream's last
  sequence, to keep for the next batch (``TelemetryState.to_json``).
* ``skipped``: what is not traffic (counter samples, options data, …), counted by kind.

Sampling: the per-source ``sampling_rates`` setting overrides what the exporter says; a record
whose exporter says nothing and whose source has no setting counts as unsampled (rate 1).
Data whose template has not arrived waits in the state; data received more than ``template_wait``
before the later of the newest datagram of the batch and the watermark before the batch is rejected
("its template never arrived"; ``expire_waiting_by``): a source that sends nothing newer cannot keep
its waiting data for ever.

Bounds (§7a), record by record, before a flow is split: a flow lasting longer than
``max_flow_duration`` (default 8 days: one record is at most 2,305 pane shares), bytes or packets
whose value × sampling rate would pass 2**63 − 1, a rate above 2**31 − 1, and bytes or packets
(× rate) more than a ``max_flow_bps`` link (default 1.6 Tb/s, the fastest Ethernet) carries in the
longer of the record's duration and 5 minutes are each one reject with the reason; the other records
of the datagram count. So one record puts at most 6 × 10**13 bytes (< 2**46) into one pane, and a
64-bit sum can only wrap over ~150,000 full-rate records of a pane (``_out_of_bounds``).
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from traffic.core.periods import PANE_US, apportion_to_panes
from traffic.core.records import PACKET, PARSED_SCHEMA, REJECT, TICK
from traffic.io.capture import Datagrams, udp_datagrams
from traffic.io.flows import FlowState, Waiting, decode, decode_waiting, expire_waiting
from traffic.io.orientation import (
    DIRECTION_TEXTS, IN, direction_codes, local_networks, local_texts, neither_local_reason,
)
from traffic.io.sequence_losses import Stream, _count_losses, close_gaps_by

__all__ = ["TelemetryRules", "TelemetryState", "Telemetry", "LOST_SCHEMA", "read_telemetry", "expire_waiting_by"]

_TS = pa.timestamp("us", tz="UTC")
_PORT_PROTOCOLS = (6, 17, 132)
LOST_SCHEMA = pa.schema([("source", pa.string()), ("pane_start", _TS), ("lost", pa.int64())])


@dataclass(frozen=True)
class TelemetryRules:
    """What a telemetry task needs from the settings (pickled to the executors)."""

    local_networks: tuple[str, ...] = ()
    keep_transit: bool = False
    sampling_rate: int | None = None  # the source's ``sampling_rates`` setting
    template_wait_us: int = 3_600_000_000
    max_flow_duration_us: int = 8 * 86_400_000_000  # the ``max_flow_duration`` setting
    max_flow_bps: int = 1_600_000_000_000  # the ``max_flow_bps`` setting (``MAX_FLOW_BPS``)
    # The watermark before the batch (µs; None: none yet): waiting data older than it less
    # ``template_wait`` expires even when its own source sends nothing newer (``expire_waiting_by``).
    watermark_us: int | None = None


@dataclass(frozen=True)
class TelemetryState:
    """One source's telemetry state between batches."""

    flows: FlowState = field(default_factory=FlowState)
    waiting: Waiting = field(default_factory=Waiting)
    # (exporter, format, domain) → its ``Stream`` (next number, open gaps, ...: ``judge_sequence``)
    streams: dict = field(default_factory=dict)

    def to_json(self) -> dict:
        return {"flows": self.flows.to_json(), "waiting": self.waiting.to_json(),
                "streams": [[e, f, d, stream.to_json()] for (e, f, d), stream in sorted(self.streams.items())]}

    @staticmethod
    def from_json(data: dict | None) -> TelemetryState:
        if not data:
            return TelemetryState()
        return TelemetryState(FlowState.from_json(data.get("flows", {})), Waiting.from_json(data.get("waiting", [])),
                              {(item[0], item[1], int(item[2])): Stream.from_json(item[3] if len(item) == 4 else item[3:])
                               for item in data.get("streams", [])})


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
    # (Streams are copied: the state passed in is never changed, a replay may hand in a read-only one.)
    flows_state, waiting, streams = state.flows, state.waiting, {k: v.copy() for k, v in state.streams.items()}
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
    if waiting.sets:
        expired, waiting = expire_waiting_by(waiting, newest_us=newest, watermark_us=rules.watermark_us,
                                             template_wait_us=rules.template_wait_us, source=source,
                                             input_file=files[-1][1] if files else "")
        tables.append(expired)
    close_gaps_by(streams, max((t for t in (newest, rules.watermark_us) if t is not None), default=None), lost)
    parsed = pa.concat_tables([t.cast(PARSED_SCHEMA) for t in tables]) if tables else PARSED_SCHEMA.empty_table()
    lost_table = pa.table({"source": [source] * len(lost), "pane_start": pa.array(sorted(lost), pa.int64()).cast(_TS),
                           "lost": pa.array([lost[p] for p in sorted(lost)], pa.int64())}, schema=LOST_SCHEMA)
    return Telemetry(parsed, lost_table, TelemetryState(flows_state, waiting, streams), skipped)


def expire_waiting_by(waiting: Waiting, *, newest_us: int | None, watermark_us: int | None, template_wait_us: int,
                      source: str, input_file: str = "") -> tuple[pa.Table, Waiting]:
    """Data waiting for its template expires ``template_wait`` after the later of the newest datagram
    of the batch and the watermark (DESIGN §7a): by the watermark too, so data of a source that
    sends nothing newer does not wait for ever. Returns the expired sets as rejects ("its template
    never arrived") and the sets that still wait; with neither time known, nothing expires."""
    now = max((t for t in (newest_us, watermark_us) if t is not None), default=None)
    if now is None or not waiting.sets:
        return PARSED_SCHEMA.empty_table(), waiting
    return expire_waiting(waiting, before_us=now - template_wait_us, source=source, input_file=input_file)


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
    networks = local_networks(rules.local_networks)
    src_local, dst_local = local_texts(src, networks), local_texts(dst, networks)
    neither = ~src_local & ~dst_local
    rejects = PARSED_SCHEMA.empty_table()
    if neither.any() and not rules.keep_transit:
        rejects = _neither_local(flows.filter(pa.array(neither)), source, input_file)
        kept = pa.array(~neither)
        flows, src_local, dst_local = flows.filter(kept), src_local[~neither], dst_local[~neither]
        src, dst = flows.column("src_ip"), flows.column("dst_ip")
    said = flows.column("sampling_rate").to_numpy(zero_copy_only=False)
    rate = np.full(flows.num_rows, rules.sampling_rate, np.int64) if rules.sampling_rate else \
        np.where(said > 0, said, 1).astype(np.int64)
    start = pc.cast(flows.column("start_ts"), pa.int64()).to_numpy(zero_copy_only=False)
    end = pc.cast(flows.column("end_ts"), pa.int64()).to_numpy(zero_copy_only=False)
    size = pc.fill_null(flows.column("bytes"), 0).to_numpy(zero_copy_only=False).astype(np.int64)
    count = pc.fill_null(flows.column("packets"), 0).to_numpy(zero_copy_only=False).astype(np.int64)
    reason = _out_of_bounds(start, end, size, count, rate, rules.max_flow_duration_us, rules.max_flow_bps)
    if reason is not None:
        bad = np.asarray(pc.is_valid(reason).to_numpy(zero_copy_only=False), bool)
        rejects = pa.concat_tables([rejects, _flow_rejects(flows.filter(pa.array(bad)), reason.filter(pa.array(bad)),
                                                           rate[bad], source, input_file)])
        flows, src_local, dst_local = flows.filter(pa.array(~bad)), src_local[~bad], dst_local[~bad]
        src, dst = flows.column("src_ip"), flows.column("dst_ip")
        rate, start, end, size, count = rate[~bad], start[~bad], end[~bad], size[~bad], count[~bad]
        if flows.num_rows == 0:
            return rejects
    n = flows.num_rows
    flow, ts, (share_bytes, share_packets) = apportion_to_panes(start, end, [size * rate, count * rate])
    # in, out, internal, or unknown (kept transit: the sender is "local")
    code = direction_codes(src_local, dst_local)
    spread = len(flow) != n  # some flow has several shares: its columns repeat once per share
    take = pa.array(flow) if spread else None
    code = code[flow] if spread else code
    inbound = pa.array(code == IN)  # the local side received it: the remote side is the source
    protocol = flows.column("protocol")
    sport, dport = flows.column("src_port"), flows.column("dst_port")
    if spread:
        src, dst, sport, dport, protocol = (c.take(take) for c in (src, dst, sport, dport, protocol))
    m = len(flow)
    received = code == IN
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
        "direction": DIRECTION_TEXTS.take(pa.array(code)),
        "reason": pa.nulls(m, pa.string()),
        "record": pa.nulls(m, pa.string()),
        "input_file": pa.repeat(pa.scalar(input_file), m),
        "packets": pa.array(share_packets, pa.int64()),
        "sampling_rate": pa.array(rate[flow], pa.int64()).cast(pa.int32()),
    }, schema=PARSED_SCHEMA)
    return pa.concat_tables([rejects, rows])


#: Largest weighted count a record may carry: its value × rate must fit a signed 64-bit sum's column.
MAX_WEIGHTED = (1 << 63) - 1
#: Largest sampling rate (§7a; raw rows keep it as a 32-bit integer).
MAX_RATE = (1 << 31) - 1
#: The ``max_flow_bps`` default: 1.6 Tb/s, the fastest Ethernet standard (1.6TbE, IEEE 802.3dj).
MAX_FLOW_BPS = 1_600_000_000_000
#: Bits on the wire of the smallest Ethernet frame: 64 bytes, 8 of preamble, 12 of inter-frame gap.
MIN_FRAME_BITS = 84 * 8
_MIN_SPAN_US = PANE_US  # a record is allowed at least one pane's worth of the link
_US_PER_S = 1_000_000


def _out_of_bounds(start: np.ndarray, end: np.ndarray, size: np.ndarray, count: np.ndarray, rate: np.ndarray,
                   max_duration_us: int, max_bps: int = MAX_FLOW_BPS) -> pa.Array | None:
    """Why each flow is out of §7a's bounds (null: within them), or None when all are within.

    A flow longer than ``max_duration_us`` would be split into one share per 5-minute pane it
    spans (a record ending in 2106 into 8.3 M shares): it is rejected before it is split, so the
    work per record is at most ``max_flow_duration`` / 5 minutes shares. Bytes or packets whose
    value × sampling rate passes 2**63 − 1 would wrap (2**62 × 4 is 0 in 64 bits): the record is
    rejected, never counted wrapped. (Counters are unsigned on the wire, non-negative here.) A rate
    above 2**31 − 1 (what ``sampling_rate`` holds) is rejected too.

    Physical bound (``_faster_than_any_link``): a record's weighted bytes may not exceed what
    ``max_bps`` (default 1.6 Tb/s: 2 × 10**11 bytes a second) carries in the longer of its duration
    and one 5-minute pane, nor its weighted packets that link's rate of minimum frames (84 bytes on
    the wire: 2,380,952,380 a second). Passing 63 bits record by record is not enough: mutated real
    datagrams claimed 1,500 bytes in 9.1 × 10**18 packets, each record fitting, and their sums across
    tasks and batches (the ``batches`` row, earlier batches' open rows) wrapped, so the batch never
    committed and every retry failed the same way. With this bound, and shares in proportion to time
    (``apportion_to_panes``), one record puts at most 6 × 10**13 bytes (< 2**46) and 7.1 × 10**11
    packets (< 2**40) into one pane; a record of ``max_flow_duration`` (8 days) at most 1.4 × 10**17
    bytes (2**57) and 1.6 × 10**15 packets; a pair's month at the link's full rate is 5.4 × 10**17
    bytes (2**59). So a 64-bit sum wraps only when records add up to more than the link could carry:
    153,722 full-rate records in one pair's pane (2**63 / 6 × 10**13), or 67 full-rate 8-day records
    in one batch (bytes; 5,604 for packets). A real exporter cannot; a hostile or broken one that does
    stops the sum with one line (``SumOverflow``), never a wrapped total. (With ``max_flow_duration``
    near its largest, 100 years, the 63-bit check above is the binding one.)
    """
    too_long = (end - start) > max_duration_us
    limit = MAX_WEIGHTED // np.maximum(rate, 1)
    bytes_over, packets_over = size > limit, count > limit
    rate_over = rate > MAX_RATE
    fast = _faster_than_any_link(start, end, size, count, rate, max_bps)
    if not (too_long.any() or bytes_over.any() or packets_over.any() or rate_over.any() or fast):
        return None
    long_text = pa.array([f"the flow lasts {_hours(d)}, longer than max_flow_duration ({_hours(max_duration_us)})"
                          if t else None for d, t in zip((end - start).tolist(), too_long.tolist())], pa.string())
    over_text = pa.array([f"sampling rate {r} is above 2**31 − 1" if o else
                          f"{'bytes' if b else 'packets'} × sampling rate {r} would overflow 63 bits" if (b or p)
                          else fast.get(i) for i, (b, p, o, r) in enumerate(zip(
                              bytes_over.tolist(), packets_over.tolist(), rate_over.tolist(), rate.tolist()))],
                         pa.string())
    nothing = pa.nulls(len(start), pa.string())
    return pc.if_else(pa.array(too_long), long_text, pc.if_else(pc.is_valid(over_text), over_text, nothing))


def _faster_than_any_link(start: np.ndarray, end: np.ndarray, size: np.ndarray, count: np.ndarray, rate: np.ndarray,
                          max_bps: int) -> dict[int, str]:
    """The records (index → reason) whose weighted bytes or packets are more than a ``max_bps`` link
    carries in max(duration, one pane): bytes × 8 > bps × span, packets × 84 × 8 > bps × span.

    Exact, in Python integers (the products pass 64 bits), for the few records a float estimate
    puts near or past the bound; every other record is far below it (a real exporter's are).
    """
    span = np.maximum(end - start, _MIN_SPAN_US).astype(np.float64)
    capacity = max_bps * span  # bits (× 10**6: span is in µs)
    weight = np.maximum(rate, 1).astype(np.float64)
    near = (size * weight * 8 * _US_PER_S > capacity * 0.999) | \
        (count * weight * MIN_FRAME_BITS * _US_PER_S > capacity * 0.999)
    reasons = {}
    for i in np.flatnonzero(near).tolist():
        w, duration = max(int(rate[i]), 1), int(end[i]) - int(start[i])
        bits = max_bps * max(duration, _MIN_SPAN_US)
        weighted_bytes, weighted_packets = int(size[i]) * w, int(count[i]) * w
        carried = f"more than max_flow_bps ({_link(max_bps)}) carries in {_seconds(max(duration, _MIN_SPAN_US))}"
        if weighted_bytes * 8 * _US_PER_S > bits:
            reasons[i] = f"{weighted_bytes:,} bytes in {_seconds(duration)} is {carried}"
        elif weighted_packets * MIN_FRAME_BITS * _US_PER_S > bits:
            reasons[i] = f"{weighted_packets:,} packets in {_seconds(duration)} is {carried} (at 84 bytes a packet)"
    return reasons


def _link(bps: int) -> str:
    for unit, scale in (("Tb/s", 10**12), ("Gb/s", 10**9), ("Mb/s", 10**6), ("kb/s", 10**3)):
        if bps >= scale:
            text = f"{bps / scale:g} {unit}"
            break
    else:
        text = f"{bps} b/s"
    return f"{text}, the fastest link" if bps == MAX_FLOW_BPS else text


def _seconds(us: int) -> str:
    return f"{us // _US_PER_S:,} s" if us % _US_PER_S == 0 else f"{us / _US_PER_S:,.6f} s".rstrip("0")


def _hours(us: int) -> str:
    return f"{us / 3_600_000_000:,.1f} hours"


def _flow_rejects(flows: pa.Table, reason: pa.Array, rate: np.ndarray, source: str, input_file: str) -> pa.Table:
    """One reject per flow with its ``reason`` (§7a bounds), its record quoted like ``_neither_local``'s."""
    src, dst = flows.column("src_ip"), flows.column("dst_ip")
    k = flows.num_rows
    columns = {f.name: pa.nulls(k, f.type) for f in PARSED_SCHEMA}
    start = pc.strftime(flows.column("start_ts"), format="%Y-%m-%dT%H:%M:%SZ")
    end = pc.strftime(flows.column("end_ts"), format="%Y-%m-%dT%H:%M:%SZ")
    columns.update({
        "kind": pa.repeat(pa.scalar(REJECT), k), "source": pa.repeat(pa.scalar(source), k),
        "input_file": pa.repeat(pa.scalar(input_file), k), "reason": reason,
        "record": pc.binary_join_element_wise(flows.column("format"), " flow from ", start, " to ", end, " ", src,
                                              " → ", dst, ", ", flows.column("bytes").cast(pa.string()), " bytes, ",
                                              flows.column("packets").cast(pa.string()), " packets × ",
                                              pa.array(rate, pa.int64()).cast(pa.string()), "", ""),
    })
    return pa.table(columns, schema=PARSED_SCHEMA)


def _neither_local(flows: pa.Table, source: str, input_file: str) -> pa.Table:
    """One reject per flow with neither address in ``local_networks``."""
    src, dst = flows.column("src_ip"), flows.column("dst_ip")
    k = flows.num_rows
    columns = {f.name: pa.nulls(k, f.type) for f in PARSED_SCHEMA}
    stamp = pc.strftime(flows.column("start_ts"), format="%Y-%m-%dT%H:%M:%SZ")
    columns.update({
        "kind": pa.repeat(pa.scalar(REJECT), k), "source": pa.repeat(pa.scalar(source), k),
        "input_file": pa.repeat(pa.scalar(input_file), k),
        "reason": neither_local_reason(src, dst),
        "record": pc.binary_join_element_wise(flows.column("format"), " flow from ", stamp, " ", src, " → ", dst,
                                              ", ", flows.column("bytes").cast(pa.string()), " bytes × ",
                                              flows.column("sampling_rate").cast(pa.string()), "", ""),
    })
    return pa.table(columns, schema=PARSED_SCHEMA)


# --- ticks and losses ---------------------------------------------------------------------------


def _ticks(sequences: pa.Table, source: str, input_file: str) -> pa.Table:
    """One tick per pane: the newest export time of the pane's datagrams (sFlow: their receive time)."""
    if sequences.num_rows == 0:
        return PARSED_SCHEMA.empty_table()
    when = pc.cast(pc.coalesce(sequences.column("export_ts"), sequences.column("receive_ts")), pa.int64())
    when = when.to_numpy(zero_copy_only=False)
    panes, index = np.unique(when // PANE_US, return_inverse=True)
    newest = np.full(len(panes), np.iinfo(np.int64).min)
    np.maximum.at(newest, index, when)
    k = len(panes)
    columns = {f.name: pa.nulls(k, f.type) for f in PARSED_SCHEMA}
    columns.update({"kind": pa.repeat(pa.scalar(TICK), k), "ts": pa.array(newest, pa.int64()).cast(_TS),
                    "source": pa.repeat(pa.scalar(source), k), "input_file": pa.repeat(pa.scalar(input_file), k)})
    return pa.table(columns, schema=PARSED_SCHEMA)
