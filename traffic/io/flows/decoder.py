"""The decoder that dispatches: one ``decode`` call walks datagram headers in order, queues record sets,
then reads them in bulk (``netflow5``, ``sflow``, ``templates``, ``data_sets``, ``nsel`` each do their
protocol's part of ``_Decoder``) and builds the tables ``Decoded`` holds.
"""

from __future__ import annotations

import logging
from collections import Counter

import numpy as np
import pyarrow as pa

from traffic.core.records import MAX_BYTES_V4_GSO, MAX_BYTES_V6, MAX_REASON_CHARS, PARSED_SCHEMA, REJECT, clip_record
from traffic.io.bytes import hex_excerpt
from traffic.io.capture.udp import Datagrams
from traffic.io.flows.columns import address_texts, concatenate
from traffic.io.flows.data_sets import DataSets
from traffic.io.flows.fields import Template
from traffic.io.flows.netflow5 import NetFlow5
from traffic.io.flows.nsel import NselCounting, nsel_bounded
from traffic.io.flows.records import (
    FLOW_SCHEMA, FORMAT_CODE, FORMATS, MAX_TS_US, P_BACKWARDS, P_NO_PACKETS, P_PER_PACKET, P_SIBLING,
    P_TEMPLATE, P_TIME_RANGE, PROBLEMS, SEQUENCE_SCHEMA, TS,
)
from traffic.io.flows.sflow import Sflow
from traffic.io.flows.state import Decoded, FlowState, Waiting, WaitingSet
from traffic.io.flows.templates import Templates

log = logging.getLogger(__name__)

_PORT_PROTOCOLS = (6, 17, 132)


def decode(datagrams: Datagrams, state: FlowState, *, source: str, input_file: str) -> Decoded:
    """Decode every datagram, in order, with the templates of ``state`` and those that arrive."""
    decoder = _Decoder(state, source, input_file, datagrams.buffer)
    n = len(datagrams)
    decoder.contexts(datagrams.receive_ts.tolist(), list(datagrams.exporter), datagrams.number.tolist(),
                     datagrams.offset.tolist(), (datagrams.offset + datagrams.length).tolist())
    others = decoder.netflow5_in_bulk(np.arange(n), datagrams.offset, datagrams.length)
    for context in others.tolist():  # context i is datagram i
        start, end = decoder.base[context], decoder.end[context]
        try:
            decoder.datagram(context, start, end - start)
        except Exception as exc:  # a decoder bug must not stop the batch; the reject says so
            log.exception("could not decode datagram %d of %s", decoder.number[context], input_file)
            decoder.reject(context, start, f"could not decode datagram ({type(exc).__name__}: {exc})")
            decoder.units[context] = None
    return decoder.finish()


def decode_waiting(waiting: Waiting, state: FlowState, *, source: str, input_file: str
                   ) -> tuple[Decoded, Waiting]:
    """Decode the waiting sets whose templates ``state`` now has; the rest still wait (also ``.waiting``)."""
    buffer = b"".join(s.body for s in waiting.sets)
    decoder = _Decoder(state, source, input_file, buffer)
    sets = waiting.sets
    ends = np.cumsum([len(s.body) for s in sets], dtype=np.int64).tolist()
    starts = [end - len(s.body) for s, end in zip(sets, ends)]
    decoder.contexts([s.receive_ts for s in sets], [s.exporter for s in sets], [s.number for s in sets],
                     [start - 4 - s.offset for s, start in zip(sets, starts)], ends)
    for context, s in enumerate(sets):
        decoder.format[context], decoder.domain[context] = FORMAT_CODE[s.format], s.domain
        decoder.export[context], decoder.uptime[context] = s.export_ts, s.uptime_ms
        decoder.data_set(context, s.template_id, starts[context], ends[context])
    decoded = decoder.finish(sequences=False)
    return decoded, decoded.waiting


def expire_waiting(waiting: Waiting, *, before_us: int, source: str, input_file: str
                   ) -> tuple[pa.Table, Waiting]:
    """Reject the waiting sets received before ``before_us`` (their template never came); keep the rest."""
    old = [s for s in waiting.sets if s.receive_ts < before_us]
    rows = [
        _reject_row(
            f"{s.format} data set for template {s.template_id} (domain {s.domain}): its template never arrived",
            f"datagram {s.number} at µs {s.receive_ts} from {s.exporter}, byte {s.offset}: "
            + hex_excerpt(s.body, 0, len(s.body)),
            source, s.input_file or input_file,
        )
        for s in old
    ]
    kept = Waiting(tuple(s for s in waiting.sets if s.receive_ts >= before_us))
    return _rows_table(rows), kept


class _Decoder(NetFlow5, Sflow, Templates, DataSets, NselCounting):
    """One decode call: walks headers in order, queues record sets, then reads them in bulk."""

    def __init__(self, state: FlowState, source: str, input_file: str, buffer: bytes):
        self.templates = dict(state.templates)
        self.sampling = dict(state.sampling)
        self.system_init = dict(state.system_init)
        #: per (exporter, format, domain): {sampler or selector id: rate}, replaced (never changed) when it changes
        self.samplers: dict[tuple, dict[int, int]] = {}
        for (exporter, fmt, domain, sampler), rate in state.samplers.items():
            self.samplers.setdefault((exporter, fmt, domain), {})[sampler] = rate
        self.nsel = {key: list(value) for key, value in state.nsel.items()}
        self.source, self.input_file = source, input_file
        self.data = buffer
        self.buf = np.frombuffer(buffer, np.uint8)
        self.skipped: Counter = Counter()
        self.rejects: list[dict] = []
        # per context (a datagram, or a waiting set): columns
        self.receive: list[int] = []
        self.exporter: list[str] = []
        self.format: list[int] = []
        self.domain: list[int] = []
        self.export: list[int] = []  # µs, -1 none
        self.uptime: list[int] = []  # ms, -1 none
        self.number: list[int] = []
        self.base: list[int] = []  # where the datagram starts in the buffer (for a waiting set: would start)
        self.end: list[int] = []  # where its bytes in the buffer end
        self.sequence: list[int | None] = []
        self.units: list[int | None] = []
        # queued work
        #: template → [(start, end, context, rate, system init, record starts or None)]
        self.data_sets: dict[int, tuple[Template, list]] = {}  # by the template's identity: hashing one is slow
        self.interned: dict[Template, Template] = {t: t for t in self.templates.values()}
        self.pending: list[tuple[int, int, int, int]] = []  # (context, template id, start, end)
        #: NetFlow v5 datagrams, as arrays: (first record, count, context, sampling interval)
        self.v5: list[tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]] = []
        self.sflow: list[tuple[int, int, int, int, int, int]] = []  # (header, captured, wire, linktype, context, rate)
        self.sflow_ip: list[tuple[int, int, int, int]] = []  # sampled IPv4/IPv6 records: (body, format, context, rate)
        self.parts: list[dict] = []  # decoded record columns, one dict per bulk read
        self.told: list[tuple[np.ndarray, str]] = []  # (record positions, why they cannot be read)
        self.columns: dict[str, np.ndarray] = {}

    # -- contexts and rejects --

    def contexts(self, receive_ts: list, exporter: list, number: list, base: list, end: list) -> None:
        """One context per datagram (or waiting set); what its header says is filled in as it is read."""
        n = len(receive_ts)
        self.receive, self.exporter, self.number, self.base, self.end = receive_ts, exporter, number, base, end
        self.format, self.domain, self.export, self.uptime = [-1] * n, [0] * n, [-1] * n, [-1] * n
        self.sequence, self.units = [None] * n, [None] * n

    def reject(self, context: int, at: int, reason: str) -> None:
        """A reject about the datagram of ``context``, or about what starts at byte ``at`` of the buffer."""
        base = self.base[context]
        where = f", byte {at - base}" if at != base else ""
        excerpt = hex_excerpt(self.data, at, self.end[context] - at)
        self.rejects.append(_reject_row(
            reason,
            f"datagram {self.number[context]} at µs {self.receive[context]} from {self.exporter[context]}{where}: "
            + excerpt,
            self.source, self.input_file,
        ))

    def column(self, name: str) -> np.ndarray:
        """A context column as an array (once the datagrams are walked and it no longer changes)."""
        if name not in self.columns:
            self.columns[name] = np.array(getattr(self, name), np.int64)
        return self.columns[name]

    def key(self, context: int) -> tuple[str, str, int]:
        """(exporter, format, domain) of a context: what templates and rates are kept per."""
        return self.exporter[context], FORMATS[self.format[context]], self.domain[context]

    # -- datagrams --

    def datagram(self, context: int, start: int, size: int) -> None:
        """One datagram, told by its version field, to its protocol's part."""
        if size < 4:
            self.reject(context, start, f"datagram of {size} bytes is too short to say its protocol")
            return
        version = int.from_bytes(self.data[start : start + 2], "big")
        if version == 5:
            self.netflow5_datagram(context, start, size)
        elif version == 9:
            self.netflow9_datagram(context, start, size)
        elif version == 10:
            self.ipfix_datagram(context, start, size)
        elif version == 0 and int.from_bytes(self.data[start : start + 4], "big") == 5:
            self.sflow_datagram(context, start, size)
        else:
            first = int.from_bytes(self.data[start : start + 4], "big")
            self.reject(context, start, f"not sFlow v5, NetFlow v5/v9 or IPFIX (version field 0x{first:08x})")

    def header(self, context: int, fmt: str, domain: int, sequence: int, export_ts: int, uptime_ms: int = -1):
        """What a datagram header says, into its context's columns."""
        self.format[context] = FORMAT_CODE[fmt]
        self.domain[context] = domain
        self.sequence[context] = sequence
        self.export[context] = export_ts
        self.uptime[context] = uptime_ms

    # -- the end: deferred sets, bulk reads, tables --

    def finish(self, sequences: bool = True) -> Decoded:
        """Decode the sets still waiting with the templates of the whole call, read the queued records in
        bulk, and build the tables."""
        pending, self.pending = self.pending, []
        for context, tid, start, end in pending:  # with the templates of the whole call
            self.data_set(context, tid, start, end)
        waiting = []
        for context, tid, start, end in self.pending:
            self.units_unknown(context)
            waiting.append(WaitingSet(
                receive_ts=self.receive[context], exporter=self.exporter[context],
                format=FORMATS[self.format[context]], domain=self.domain[context], template_id=tid,
                body=bytes(self.data[start:end]), export_ts=self.export[context], uptime_ms=self.uptime[context],
                number=self.number[context], offset=start - 4 - self.base[context], input_file=self.input_file,
            ))
        if self.v5:
            self.read_netflow5()
        for template, sets in self.data_sets.values():
            self.read_sets(template, sets)
        if self.sflow:
            self.read_sflow()
        if self.sflow_ip:
            self.read_sflow_ip()
        flows = self._flow_table()
        return Decoded(
            flows=flows,
            sequences=self._sequence_table() if sequences else SEQUENCE_SCHEMA.empty_table(),
            rejects=_rows_table(self.rejects),
            skipped=dict(self.skipped),
            waiting=Waiting(tuple(waiting)),
            state=FlowState(self.templates, self.sampling, self.system_init, nsel=nsel_bounded(self.nsel),
                            samplers={(*key, sampler): rate for key, samplers in self.samplers.items()
                                      for sampler, rate in samplers.items()}),
        )

    def _flow_table(self) -> pa.Table:
        if not self.parts:
            return FLOW_SCHEMA.empty_table()
        names = dict.fromkeys([*(name for p in self.parts for name in p), *_DEFAULTS])
        column = {name: concatenate([p[name] if name in p else _default(name, len(p["order"])) for p in self.parts])
                  for name in names}
        context, problem = column["context"], column["problem"]
        order = column["order"]
        problem[(problem == 0) & (column["end"] < column["start"])] = P_BACKWARDS
        out_of_range = (column["start"] < 0) | (column["end"] > MAX_TS_US) | (column["start"] > MAX_TS_US)
        problem[(problem == 0) & out_of_range] = P_TIME_RANGE
        _per_packet_bounds(column)
        if problem.any():
            self._reject_records(np.flatnonzero(problem), column)
            keep = np.flatnonzero(problem == 0)
            column = {name: values[keep] for name, values in column.items()}
        order = column["order"]
        if len(order) > 1 and not (order[1:] >= order[:-1]).all():  # sets read template by template
            back = np.argsort(order, kind="stable")  # back to datagram order
            column = {name: values[back] for name, values in column.items()}
        if column["tracked"].any():
            self.nsel_once(column)
        empty = column["directional"] & (column["bytes"] == 0) & (column["packets"] == 0)
        if empty.any():
            self.skipped["flow direction without traffic (biflow or NSEL record)"] += int(empty.sum())
            column = {name: values[~empty] for name, values in column.items()}
        context = column["context"]
        src, dst, texts = address_texts(column)
        protocol = column["protocol"]
        ported = np.isin(protocol, _PORT_PROTOCOLS)
        exporters = sorted(set(self.exporter))
        where = {name: i for i, name in enumerate(exporters)}
        exporter_index = np.array([where[name] for name in self.exporter], np.int64)
        columns = {
            "receive_ts": pa.array(self.column("receive")[context], TS),
            "exporter": pa.array(exporters, pa.string()).take(pa.array(exporter_index[context])),
            "format": pa.array(FORMATS, pa.string()).take(pa.array(self.column("format")[context])),
            "domain": pa.array(self.column("domain")[context], pa.int64()),
            "start_ts": pa.array(column["start"], TS),
            "end_ts": pa.array(column["end"], TS),
            "src_ip": texts.take(pa.array(src)),
            "dst_ip": texts.take(pa.array(dst)),
            "src_port": pa.array(column["src_port"].astype(np.int32), mask=~ported | (column["src_port"] < 0)),
            "dst_port": pa.array(column["dst_port"].astype(np.int32), mask=~ported | (column["dst_port"] < 0)),
            "protocol": pa.array(protocol.astype(np.int32), mask=protocol < 0),
            "bytes": pa.array(column["bytes"], pa.int64()),
            "packets": pa.array(column["packets"], pa.int64()),
            "sampling_rate": pa.array(column["rate"], pa.int64()),
        }
        return pa.Table.from_arrays([columns[f.name] for f in FLOW_SCHEMA], schema=FLOW_SCHEMA)

    def _reject_records(self, rows: np.ndarray, column: dict) -> None:
        """One reject per record that cannot be accounted (the rare path: Python per record)."""
        told = {p: text for positions, text in self.told for p in positions.tolist()}
        said = set()  # a record of two directions (two rows) is one reject
        for k in rows.tolist():
            code, at, context = int(column["problem"][k]), int(column["order"][k]), int(column["context"][k])
            if code == P_SIBLING or at in said:
                continue
            said.add(at)
            if code == P_TEMPLATE:
                reason = told.get(at, "record cannot be read")
            elif code == P_BACKWARDS:
                reason = (f"flow ends before it starts ({_iso(int(column['end'][k]))} < "
                          f"{_iso(int(column['start'][k]))})")
            elif code in (P_NO_PACKETS, P_PER_PACKET):
                packets, octets = int(column["packets"][k]), int(column["bytes"][k])
                reason = PROBLEMS[code].format(bytes=octets, packets=packets,
                                               limit=MAX_BYTES_V4_GSO if column["family"][k] == 4 else MAX_BYTES_V6)
            else:
                reason = PROBLEMS[code]
            self.reject(context, at, reason)

    def _sequence_table(self) -> pa.Table:
        rows = [i for i, s in enumerate(self.sequence) if s is not None]
        take = lambda values: [values[i] for i in rows]  # noqa: E731
        export, uptime = take(self.export), take(self.uptime)
        return pa.Table.from_arrays([
            pa.array(take(self.receive), TS),
            pa.array(take(self.exporter), pa.string()),
            pa.array([FORMATS[f] for f in take(self.format)], pa.string()),
            pa.array(take(self.domain), pa.int64()),
            pa.array(take(self.sequence), pa.int64()),
            pa.array(take(self.units), pa.int64()),
            pa.array([e if e >= 0 else None for e in export], TS),
            pa.array([u if u >= 0 else None for u in uptime], pa.int64()),
        ], schema=SEQUENCE_SCHEMA)


#: Columns not every kind of record has, and their value for those that do not (NetFlow v5 and
#: sFlow always say their packets; only NSEL and biflow records have events and directions).
_DEFAULTS = {"has_packets": (True, bool), "directional": (False, bool), "reverse": (False, bool),
             "tracked": (False, bool), "event": (-1, np.int64), "conn": (-1, np.int64)}


def _default(name: str, n: int) -> np.ndarray:
    if name in ("src6", "dst6"):
        return np.zeros((n, 16), np.uint8)
    value, dtype = _DEFAULTS[name]
    return np.full(n, value, dtype)


def _per_packet_bounds(column: dict) -> None:
    """Reject (in ``problem``) a count no packets could carry, and the other direction of its record with it.

    A record with a packet counter that says 0 while it has bytes, or more bytes per packet than
    an IP packet can carry: IPv4 ``MAX_BYTES_V4_GSO`` (524,280: what the data checks fail on;
    65,535 < x only flags), IPv6 ``MAX_BYTES_V6`` (the largest jumbogram).
    """
    problem, octets, packets = column["problem"], column["bytes"], column["packets"]
    said = column["has_packets"] & (problem == 0)
    problem[said & (packets == 0) & (octets > 0)] = P_NO_PACKETS
    limit = np.where(column["family"] == 4, MAX_BYTES_V4_GSO, MAX_BYTES_V6)
    problem[said & (packets > 0) & ((octets - 1) // limit >= packets)] = P_PER_PACKET
    bad = column["order"][(problem != 0) & column["directional"]]
    if len(bad):
        problem[(problem == 0) & np.isin(column["order"], bad)] = P_SIBLING


def _iso(us: int) -> str:
    return str(np.datetime64(us, "us")) + "Z"


def _reject_row(reason: str, record: str, source: str, input_file: str) -> dict:
    row = dict.fromkeys(PARSED_SCHEMA.names)
    reason = reason if len(reason) <= MAX_REASON_CHARS else reason[: MAX_REASON_CHARS - 1] + "…"
    row.update(kind=REJECT, source=source, input_file=input_file, reason=reason, record=clip_record(record))
    return row


def _rows_table(rows: list[dict]) -> pa.Table:
    if not rows:
        return PARSED_SCHEMA.empty_table()
    return pa.Table.from_pylist(rows, schema=PARSED_SCHEMA)
