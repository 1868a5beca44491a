"""Decode flow telemetry (sFlow v5, NetFlow v5, NetFlow v9, IPFIX) from UDP datagrams into flow rows.

``decode`` takes the datagrams a collector file (or any capture of export traffic) holds, from
``traffic.io.captures.udp_datagrams``, and the template state of earlier batches, and gives:

* ``flows``: one row of ``FLOW_SCHEMA`` per flow record (per direction of a two-way record), or per
  packet an sFlow agent sampled. ``bytes`` and ``packets`` are as the exporter reported them, *not*
  multiplied by the sampling rate: ``sampling_rate`` says the rate (0 = the exporter said nothing),
  ingest applies it.
* ``sequences``: one row per datagram whose header could be read, for loss accounting.
* ``rejects``: ``PARSED_SCHEMA`` reject rows, each with a reason a person can read. Nothing raises
  on bad input: a datagram that cannot be read, a template that makes no sense, a record that
  cannot be accounted each become one reject; the good parts beside them are kept.
* ``skipped``: what is not traffic, counted by kind (sFlow counter samples, options data, sFlow
  records other than raw packet headers, reserved set ids, ...).
* ``waiting``: data sets whose template has not arrived, to decode in a later batch.
* ``state``: the templates and sampling rates learned so far (a new value; the old is unchanged).

How it is fast: one Python loop walks datagram, set and template headers (each says where the next
one starts, and a datagram holds about thirty records); the records themselves are read with numpy
gathers over all records of one template (NetFlow v5: over all records of all datagrams) at once,
and addresses become text once per distinct address. Only templates with variable-length fields
are walked record by record, and sFlow samples one by one (their packet headers are then read in
bulk, by the capture reader's own rules: VLANs, MPLS, IPv4-mapped addresses, ...).

Decisions, for an operator:

* The protocol is told by the version at the start of the datagram (5, 9, 10; sFlow: a 32-bit 5),
  not by the port, so exporters on non-standard ports work. Any other version is a reject.
* ``exporter`` is the datagram's sender address (the agent address inside an sFlow datagram is not
  used). Templates are scoped by (exporter address, format, domain, template id): not by port, so
  an exporter that changes its source port keeps its templates.
* ``domain``: v9 source id, IPFIX observation domain, sFlow sub-agent id, NetFlow v5
  ``engine_type << 8 | engine_id``.
* Time. sFlow: start = end = receive time. NetFlow v5/v9: the header's wall-clock time minus
  (sysUptime − FIRST/LAST_SWITCHED), the difference taken as a signed 32-bit number of ms (so a
  sysUptime that wrapped after 49.7 days still gives the right answer, and a flow stamped a few ms
  after its header is not pushed 49 days back). IPFIX, the first present of: flowStart/End
  Nanoseconds (156/157), Microseconds (154/155; both NTP-format, 8 bytes), Milliseconds
  (152/153), Seconds (150/151); flowStart/EndSysUpTime (22/21) after systemInitTimeMilliseconds
  (160, from the record, else from options data of the same exporter and domain; unknown: the
  export time); flowStart/EndDeltaMicroseconds (158/159) before the export time. v9 templates may
  carry the IPFIX absolute fields too and are read the same way. A record with a start and no end
  (or the reverse) lasts no time; one with neither gets the header's export time for both. A flow
  that ends before it starts, or whose time is outside 1970..9999, is a reject.
* Counts, as exporters send them: ``bytes`` from field 1 (IN_BYTES / octetDeltaCount), else 85
  (octetTotalCount), else Cisco ASA NSEL 231 (initiatorOctets); ``packets`` from 2, else 86, else
  NSEL 298 (initiatorPackets). A record's other direction is its own row, turned round (addresses
  and ports swapped, so it is given its own local/remote orientation): NSEL 232/299
  (responderOctets/Packets), RFC 5103 reverse counters (PEN 29305, ids 1/2/85/86; other enterprise
  fields are skipped over). A direction of such a two-way (or NSEL) record with 0 bytes and 0
  packets gives no row (counted in ``skipped``). A record with bytes and no packet field counts its
  bytes with 0 packets (§7a); one without any byte field is a reject, as is a count above 2**63 − 1.
  Unsigned fields may use reduced-size encoding (1..8 bytes).
* Per-packet bounds (every format): a record whose packet count says 0 while it has bytes, or that
  claims more bytes per packet than an IP packet can carry, is a reject with its reason: IPv4
  524,280 (``MAX_BYTES_V4_GSO``, a GSO/BIG TCP super-packet: above it the data checks fail the hour;
  between 65,535 and it they only flag it, as for captures), IPv6 4,294,967,335 (``MAX_BYTES_V6``,
  the largest jumbogram). A record with no packet field is not held to it (its ratio is unknown).
  When one direction of a two-way record is rejected, the record is one reject and neither counts.
* NSEL events (NF_F_FW_EVENT 233; 40005 on older ASAs; NF_F_FW_EXT_EVENT 33002 is detail only): a
  flow-update (5) carries the bytes since the last update, a flow-teardown (2) the flow's totals,
  which its updates already reported. Each byte counts once: updates (and creates, 1) count what
  they say and are remembered per (exporter, format, domain, NF_F_CONN_ID 148), per direction; a
  teardown counts its totals minus what was remembered (not below 0) and forgets the connection.
  Time: a record without an end field ends at its observationTimeMilliseconds (323) if it has one
  (NSEL records do: flow start and observation time), and what
  an update or teardown counts starts at the previous update of its connection (else at the flow's
  start), so a long flow's updates land in the panes they happened in. The memory is part of
  ``state`` (``FlowState.nsel``, kept across batches), holds only integers in 0 .. 2**63 − 1, and is
  bounded: at most ``NSEL_MAX_CONNECTIONS`` (the most recently updated), none more than
  ``NSEL_MAX_AGE_US`` (a day) older than the newest update. A record without a connection
  id, a teardown of a connection nothing remembers (its updates were never sent, or forgotten), and
  other events count what they say. Create and deny records without counters are no traffic: counted
  in ``skipped``, not rejected; so are NAT event records (natEvent 230: a NAT session made or ended)
  without counters.
* Addresses: fields 8/12 (IPv4), else 27/28 (IPv6); a template with both uses IPv6 for a record
  whose IPv4 pair is 0.0.0.0. IPv4-mapped IPv6 is stored as IPv4. A record without a source and a
  destination address is a reject. Ports only for TCP, UDP and SCTP (6, 17, 132); no protocol
  field: protocol and ports null.
* Sampling (``sampling_rate``, 1 in N; §7a's order, the per-source setting being ingest's). NetFlow
  v5: the header's 14-bit sampling interval. sFlow: the sample's rate. v9/IPFIX, the first that says
  a rate (``_rate_by_precedence``): the record's own sampling fields; else the rate of the sampler or
  selector the record names (v9 48 FLOW_SAMPLER_ID, IPFIX 302 selectorId or 48 samplerId) from the
  options data that gave that id a rate; else the rate the exporter's options data said last for the
  (exporter, format, domain). Sampling fields, in options and data records alike (``_rate_said``):
  the PSAMP fields selectorAlgorithm 304 names (1 count-based: 305/306 samplingPacketInterval/Space →
  (interval + space) / interval; 3 random n-out-of-N: 309/310 samplingSize/Population → population /
  size; 4 probabilistic: 311 samplingProbability → 1 / p), without 304 the first present of those
  three; then 34 SAMPLING_INTERVAL / samplingInterval (35, the algorithm, changes nothing; Huawei
  sends 34 in every record), then 50 FLOW_SAMPLER_RANDOM_INTERVAL / samplerRandomInterval. Rates are
  rounded to whole numbers. A data set takes the rates known when it is read (or, for one that
  waited, when it is decoded); up to ``MAX_SAMPLERS`` sampler ids are remembered per domain.
* Bounds on rates. A rate above ``MAX_RATE`` (2**31 − 1), or sampling fields that give a rate and no
  usable one (interval 0, population below size, probability not in 0 < p ≤ 1, NaN) make their
  record a reject: a data record alone; an options record, which then teaches nothing (neither its
  rate nor its system init time, nor one past 9999); an sFlow flow sample with such a rate, that
  sample alone. 34/50 of 0 say nothing. ``FlowState.from_json`` drops stored values later code could
  not use (states written before these bounds), so no state can block a source's later datagrams.
* Options data records update the state and are counted in ``skipped`` ("netflow9 options data",
  "ipfix options data"), not returned as flows. They are read for their sampling fields, the sampler
  or selector id they give a rate to, and systemInitTimeMilliseconds (160), nothing else. Scope
  fields are not data: a NetFlow v9 scope is a scope *type* (RFC 3954 §6.1: 1 System, 2 Interface,
  3 Line card, 4 Cache, 5 Template) with a length that may be 0, never an element; of IPFIX scope
  fields (real elements) only the sampler/selector id is read. An options record whose sampling field
  has an impossible length is a reject.
* Templates: a template replaces any earlier one with its key at once; IPFIX withdrawal (field
  count 0) removes it, template id 2 / 3 with field count 0 removes all templates / options
  templates of the domain. A template that makes no sense (no fields, records of 0 bytes, ids
  below 256, more fields than its set holds, scope count 0 or above the field count) is a reject
  and not kept. One with a field this module reads at an impossible length (an IPv4 address of 3
  bytes, a variable-length counter) is kept, and each of its records is a reject saying why.
  Enterprise-specific fields (IPFIX bit 0x8000, then a 4-byte PEN) are skipped over, except RFC
  5103's reverse counters (PEN 29305, see Counts).
* Data sets whose template is unknown: within one ``decode`` call, read at the end with the
  templates of the whole call; otherwise they go to ``waiting`` (``decode_waiting`` reads them
  later; ``expire_waiting`` turns the old ones into rejects: how long to wait is ingest's call).
* A set length below 4 or past the end of its datagram, a message length that is not the datagram
  length (IPFIX), a NetFlow v5 count of 0, above 30 or longer than the datagram: the datagram (or
  the rest of it, after the sets already read) is a reject. Bytes after the last set that cannot
  hold another record are padding. NetFlow v5 and sFlow datagrams longer than their contents are
  accepted (the rest is ignored); NetFlow v9's record count is not checked (exporters disagree on
  what it counts).
* Sequences (``SEQUENCE_SCHEMA``): one row per datagram whose header is valid. ``units`` is how far
  the next sequence number should advance: v5 the record count, v9 1 (it counts datagrams), sFlow
  1, IPFIX the data records in the message (options data included) — null when some of them could
  not be counted (a set waiting for its template, or the rest of a datagram that was rejected), so
  ingest knows not to judge that gap. Sets decoded by ``decode_waiting`` add no sequence rows.
* sFlow: flow samples (format 1) and expanded flow samples (3); in them, raw packet header records
  (format 1) with header protocol 1 (Ethernet, VLAN tags and all), 11 (IPv4) or 12 (IPv6), and
  sampled IPv4 / IPv6 records (formats 3 / 4: IP length, protocol, addresses, ports). A sample with
  a raw header is counted from it; its sampled IPv4/IPv6 records describe the same packet and are
  only counted in ``skipped``. Other samples (counters: 2, 4) and flow records (extended
  switch/router data, ...) are skipped and counted; so is a sampled frame that is no IP packet.
  ``bytes`` is the IP packet length (from the sampled header, or the record's length field),
  ``packets`` 1. Per-sample sequence numbers and drop counters are not used.
* A reject's ``record``: "datagram N at µs T from EXPORTER: <hex of its first 64 bytes>" (N is the
  frame number in the file), with ", byte B" when it is about one set, template or record in it
  (B counts from the start of the datagram).
"""

from __future__ import annotations

import functools
import ipaddress
import logging
import struct
from collections import Counter
from dataclasses import dataclass, field

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from traffic.core.records import MAX_BYTES_V4_GSO, MAX_BYTES_V6, MAX_REASON_CHARS, PARSED_SCHEMA, REJECT, clip_record
from traffic.io.captures import Datagrams, ip_headers

log = logging.getLogger(__name__)

__all__ = [
    "FLOW_SCHEMA", "SEQUENCE_SCHEMA", "FORMATS", "Decoded", "FlowState", "Template", "Waiting",
    "WaitingSet", "decode", "decode_waiting", "expire_waiting",
]

_TS = pa.timestamp("us", tz="UTC")

FLOW_SCHEMA = pa.schema([
    ("receive_ts", _TS), ("exporter", pa.string()), ("format", pa.string()), ("domain", pa.int64()),
    ("start_ts", _TS), ("end_ts", _TS),
    ("src_ip", pa.string()), ("dst_ip", pa.string()),
    ("src_port", pa.int32()), ("dst_port", pa.int32()), ("protocol", pa.int32()),
    ("bytes", pa.int64()), ("packets", pa.int64()),
    ("sampling_rate", pa.int64()),
])

SEQUENCE_SCHEMA = pa.schema([
    ("receive_ts", _TS), ("exporter", pa.string()), ("format", pa.string()), ("domain", pa.int64()),
    ("sequence", pa.int64()), ("units", pa.int64()), ("export_ts", _TS),
    # The exporter's uptime in ms (NetFlow v5/v9 sysUptime, sFlow's uptime; null for IPFIX, which has
    # none): an uptime that went back says the exporter restarted (``telemetry.judge_sequence``).
    ("uptime_ms", pa.int64()),
])

SFLOW5, NETFLOW5, NETFLOW9, IPFIX = "sflow5", "netflow5", "netflow9", "ipfix"
FORMATS = (SFLOW5, NETFLOW5, NETFLOW9, IPFIX)
_FORMAT_CODE = {name: code for code, name in enumerate(FORMATS)}

#: Largest timestamp Spark and Delta can hold: 9999-12-31T23:59:59.999999Z, in µs.
_MAX_TS_US = 253_402_300_799_999_999
_NTP_TO_UNIX = 2_208_988_800
_EXCERPT = 64
_PORT_PROTOCOLS = (6, 17, 132)
_INT64_MAX = (1 << 63) - 1

# --- state ----------------------------------------------------------------------------------


@dataclass(frozen=True)
class Template:
    """A template as the exporter sent it: (element id, length, enterprise number) per field."""

    fields: tuple[tuple[int, int, int], ...]
    options: bool = False  # an options template: its data records describe the exporter, not flows
    scope: int = 0  # scope fields (options templates)

    @functools.cached_property
    def layout(self) -> _Layout:
        """Where its records hold the fields this module reads (worked out once per template)."""
        return _layout(self)

    @functools.cached_property
    def read_as(self) -> tuple[int, ...]:
        """Per field, the key this module reads it under, or -1 for a field it does not read.

        Scope fields are not data: a NetFlow v9 scope is a scope *type* (RFC 3954 §6.1: 1 System,
        2 Interface, ...; length 0 allowed), not an element, and of an IPFIX scope only the sampler or
        selector id is read (the id an options record gives a rate to). Options records are read for
        their sampling fields and system init time only.
        """
        wanted = _OPTION_FIELDS if self.options else _WANTED
        keys = []
        for k, (ie, _, pen) in enumerate(self.fields):
            key = _read_as(ie, pen)
            if k < self.scope and key not in _SAMPLER_IDS:
                key = -1
            keys.append(key if key in wanted else -1)
        return tuple(keys)


@dataclass(frozen=True)
class FlowState:
    """What earlier datagrams taught: templates and sampling facts, per exporter and domain.

    ``templates`` is keyed (exporter, format, domain, template id); ``sampling`` (the last rate options
    data said) and ``system_init`` (IPFIX systemInitTimeMilliseconds from options data) by (exporter,
    format, domain); ``samplers`` (each sampler's or selector's rate) by (exporter, format, domain, id).
    Only values later code can use are kept. Treat it as a value: ``decode`` returns a new one.
    """

    templates: dict = field(default_factory=dict)
    sampling: dict = field(default_factory=dict)
    system_init: dict = field(default_factory=dict)
    samplers: dict = field(default_factory=dict)  # (exporter, format, domain, sampler/selector id) → rate
    #: NSEL: bytes and packets flow updates reported, per (exporter, format, domain, connection id):
    #: [initiator bytes, packets, responder bytes, packets, last update's time µs], oldest first (``_nsel_once``)
    nsel: dict = field(default_factory=dict)

    def to_json(self) -> dict:
        """A JSON-able form (``from_json`` reads it back)."""
        return {
            "templates": [
                {"exporter": e, "format": f, "domain": d, "id": t, "options": tpl.options, "scope": tpl.scope,
                 "fields": [list(x) for x in tpl.fields]}
                for (e, f, d, t), tpl in sorted(self.templates.items())
            ],
            "sampling": [{"exporter": e, "format": f, "domain": d, "rate": r}
                         for (e, f, d), r in sorted(self.sampling.items())],
            "system_init": [{"exporter": e, "format": f, "domain": d, "ms": v}
                            for (e, f, d), v in sorted(self.system_init.items())],
            "samplers": [{"exporter": e, "format": f, "domain": d, "sampler": i, "rate": r}
                         for (e, f, d, i), r in sorted(self.samplers.items())],
            "nsel": [{"exporter": e, "format": f, "domain": d, "conn": c, "reported": v}
                     for (e, f, d, c), v in self.nsel.items()],
        }

    @staticmethod
    def from_json(data: dict) -> FlowState:
        """The state ``to_json`` wrote, without the values later code could not use (``_usable_state``)."""
        return FlowState(
            templates={
                (t["exporter"], t["format"], int(t["domain"]), int(t["id"])): Template(
                    tuple(tuple(int(v) for v in x) for x in t["fields"]), bool(t["options"]), int(t["scope"]))
                for t in data.get("templates", [])
            },
            sampling=_usable_state(data, "sampling", "rate", _usable_rate),
            system_init=_usable_state(data, "system_init", "ms", lambda ms: 0 <= ms <= _MAX_TS_US // 1000),
            samplers=_usable_state(data, "samplers", "rate", _usable_rate, "sampler"),
            nsel=_nsel_entries(data.get("nsel", [])),
        )


#: NSEL connections remembered at most, and for how long after their last update (an ASA sends
#: one per active flow at least every refresh interval, at most an hour): oldest dropped first.
NSEL_MAX_CONNECTIONS = 100_000
NSEL_MAX_AGE_US = 24 * 3600 * 1_000_000


def _nsel_bounded(nsel: dict) -> dict:
    """The remembered NSEL connections: none older than ``NSEL_MAX_AGE_US`` before the newest, at most
    ``NSEL_MAX_CONNECTIONS`` (the most recently updated), oldest first."""
    if not nsel:
        return {}
    newest = max(v[4] for v in nsel.values())
    kept = sorted(((k, v) for k, v in nsel.items() if v[4] >= newest - NSEL_MAX_AGE_US), key=lambda kv: kv[1][4])
    return dict(kept[-NSEL_MAX_CONNECTIONS:])


def _nsel_entries(items: list) -> dict:
    """NSEL state read back, keeping only entries later code can use (five integers in 0 .. 2**63 - 1)."""
    nsel = {}
    for item in items:
        try:
            key = (str(item["exporter"]), str(item["format"]), int(item["domain"]), int(item["conn"]))
            value = [int(v) for v in item["reported"]]
        except (KeyError, TypeError, ValueError):
            continue
        if len(value) == 5 and all(0 <= v <= _INT64_MAX for v in value):
            nsel[key] = value
    return _nsel_bounded(nsel)


def _usable_state(data: dict, name: str, what: str, usable, *more: str) -> dict:
    """One of the state's (exporter, format, domain[, more]) → value maps, read back without the values later
    code could not use: states stored before rates were bounded may hold a rate of 2**63 or a system init
    time past 9999. Such a value is dropped (and logged) as if the exporter had never said it, so the
    source decodes again; its next options data says it anew."""
    kept = {}
    for item in data.get(name, []):
        try:
            key = (str(item["exporter"]), str(item["format"]), int(item["domain"]), *(int(item[m]) for m in more))
            value = int(item[what])
        except (KeyError, TypeError, ValueError):
            log.warning("flow state: %s entry %r dropped (cannot be read)", name, item)
            continue
        if usable(value) and all(0 <= k < 1 << 64 for k in key[3:]):
            kept[key] = value
        else:
            log.warning("flow state: %s %s of %s dropped (cannot be used)", name, value, key)
    return kept


@dataclass(frozen=True)
class WaitingSet:
    """A data set whose template had not arrived, with what decoding it later needs."""

    receive_ts: int  # µs
    exporter: str
    format: str
    domain: int
    template_id: int
    body: bytes  # the set's records (after its 4-byte header)
    export_ts: int  # µs, the message header's export time
    uptime_ms: int  # NetFlow v9 sysUptime; -1 for IPFIX
    number: int  # the datagram's frame number in its file
    offset: int  # the set's byte offset in its datagram
    input_file: str = ""


@dataclass(frozen=True)
class Waiting:
    """Data sets waiting for their templates, oldest first."""

    sets: tuple[WaitingSet, ...] = ()

    def __len__(self) -> int:
        return len(self.sets)

    def to_json(self) -> list:
        return [{**{k: getattr(s, k) for k in WaitingSet.__dataclass_fields__ if k != "body"},
                 "body": s.body.hex()} for s in self.sets]

    @staticmethod
    def from_json(data: list) -> Waiting:
        return Waiting(tuple(WaitingSet(**{**item, "body": bytes.fromhex(item["body"])}) for item in data))


@dataclass(frozen=True)
class Decoded:
    """What one ``decode`` (or ``decode_waiting``) call gives; see the module docstring."""

    flows: pa.Table
    sequences: pa.Table
    rejects: pa.Table
    skipped: dict[str, int]
    waiting: Waiting
    state: FlowState


# --- the public calls -----------------------------------------------------------------------


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
        decoder.format[context], decoder.domain[context] = _FORMAT_CODE[s.format], s.domain
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
            + _hex(s.body, 0, len(s.body)),
            source, s.input_file or input_file,
        )
        for s in old
    ]
    kept = Waiting(tuple(s for s in waiting.sets if s.receive_ts >= before_us))
    return _rows_table(rows), kept


# --- decoding -------------------------------------------------------------------------------

#: Element ids this module reads, with the lengths each may have.
_COUNTERS = (1, 2, 85, 86)
#: Sampling fields (``_rate_said``), and the ids of the sampler or selector a record names, 302 first.
_SAMPLING = (34, 35, 49, 50, 304, 305, 306, 309, 310, 311)
_SAMPLER_IDS = (302, 48)
#: What options records are read for: rates, the ids they are for, the exporter's system init time.
_OPTION_FIELDS = frozenset((*_SAMPLING, *_SAMPLER_IDS, 160))
#: RFC 5103 reverse elements (PEN 29305) are read under their id plus this (IPFIX ids are below 2**15).
_REVERSE, _REVERSE_PEN = 1 << 16, 29305
#: Counters per direction, in order of preference: (bytes, packets) of the forward (initiator)
#: direction and of the reverse (responder) one. NSEL: 231/232 initiator/responder octets,
#: 298/299 packets; RFC 5103: the reverse elements.
_FORWARD = ((1, 85, 231), (2, 86, 298))
_BACKWARD = ((_REVERSE | 1, _REVERSE | 85, 232), (_REVERSE | 2, _REVERSE | 86, 299))
#: NSEL: NF_F_CONN_ID (148, flowId) and NF_F_FW_EVENT (233; 40005 on ASAs before 8.4, NetFlow v9 only).
_CONN_ID, _EVENTS = 148, (233, 40005)
_CREATE, _TEARDOWN, _UPDATE = 1, 2, 5
#: natEvent (230): a NAT session's creation or deletion, logged by routers doing NAT (no traffic counted in it).
_NAT_EVENT = 230
#: observationTimeMilliseconds: a record's end when it has no end field (NSEL events carry it).
_OBSERVED = 323
_WANTED = {
    **{ie: range(1, 9) for ie in _COUNTERS + tuple(_REVERSE | c for c in _COUNTERS) + (231, 232, 298, 299)},
    _CONN_ID: range(1, 9), 233: (1,), 40005: (1,), _NAT_EVENT: (1,), _OBSERVED: (8,),
    4: (1,), 7: (1, 2), 11: (1, 2), 8: (4,), 12: (4,), 27: (16,), 28: (16,),
    21: (4,), 22: (4,), 150: (4,), 151: (4,), 152: (8,), 153: (8,), 154: (8,), 155: (8,),
    156: (8,), 157: (8,), 158: (4,), 159: (4,), 160: (8,),
    **{ie: range(1, 9) for ie in (*_SAMPLING, *_SAMPLER_IDS) if ie != 311}, 311: (4, 8),
}
_NAMES = {1: "bytes", 2: "packets", 85: "octetTotalCount", 86: "packetTotalCount", 4: "protocol",
          _REVERSE | 1: "reverse bytes", _REVERSE | 2: "reverse packets", _REVERSE | 85: "reverseOctetTotalCount",
          _REVERSE | 86: "reversePacketTotalCount", 231: "initiator octets", 232: "responder octets",
          298: "initiator packets", 299: "responder packets", 148: "connection id", 233: "firewall event",
          40005: "firewall event", _NAT_EVENT: "NAT event", _OBSERVED: "observationTimeMilliseconds",
          7: "source port", 11: "destination port", 8: "IPv4 source", 12: "IPv4 destination",
          27: "IPv6 source", 28: "IPv6 destination", 21: "end uptime", 22: "start uptime",
          150: "flowStartSeconds", 151: "flowEndSeconds", 152: "flowStartMilliseconds",
          153: "flowEndMilliseconds", 154: "flowStartMicroseconds", 155: "flowEndMicroseconds",
          156: "flowStartNanoseconds", 157: "flowEndNanoseconds", 158: "flowStartDeltaMicroseconds",
          159: "flowEndDeltaMicroseconds", 160: "systemInitTimeMilliseconds", 34: "sampling interval",
          50: "sampler random interval", 305: "samplingPacketInterval", 306: "samplingPacketSpace",
          35: "sampling algorithm", 48: "sampler id", 49: "sampler mode", 302: "selectorId",
          304: "selectorAlgorithm", 309: "samplingSize", 310: "samplingPopulation", 311: "samplingProbability"}
_VARIABLE = 65535


@dataclass(frozen=True)
class _Layout:
    """Where a template puts the fields this module reads."""

    offsets: dict  # element id → byte offset in the record, for fields before any variable-length one
    lengths: dict  # element id → length
    record_length: int  # fixed-length templates; 0 when some field has a variable length
    min_length: int  # the shortest record the template allows
    problem: str | None  # why its records cannot be read, if so


def _layout(template: Template) -> _Layout:
    offsets, lengths, at, variable, shortest = {}, {}, 0, False, 0
    problem = None
    for (_, length, _), ie in zip(template.fields, template.read_as):
        if ie >= 0 and ie not in lengths:
            if length not in _WANTED[ie]:
                what = "a variable length" if length == _VARIABLE else f"length {length}"
                problem = problem or f"field {ie} ({_NAMES[ie]}) has {what}, which it cannot have"
            lengths[ie] = length
            if not variable:
                offsets[ie] = at
        if length == _VARIABLE:
            variable = True
            shortest += 1
        else:
            at += length
            shortest += length
    return _Layout(offsets, lengths, 0 if variable else at, shortest, problem)


def _read_as(ie: int, pen: int) -> int:
    """The key a field is read under: its id; RFC 5103 reverse elements apart; other enterprises' never."""
    if pen == 0:
        return ie
    return _REVERSE | ie if pen == _REVERSE_PEN else -1


class _Decoder:
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

    def netflow5_in_bulk(self, contexts: np.ndarray, offset: np.ndarray, length: np.ndarray) -> np.ndarray:
        """Read every valid NetFlow v5 header at once (they need no state); the other contexts, to walk one by one."""
        head = _gather(self.buf, offset, 24)
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
                self.format[context], self.domain[context], self.sequence[context] = _FORMAT_CODE[NETFLOW5], d, sequence
                self.export[context], self.uptime[context], self.units[context] = e, uptime, units
            self.v5.append((offset[rows] + 24, count[rows], contexts[rows], halves[rows, 11] & 0x3FFF))
        return contexts[~good]

    def reject(self, context: int, at: int, reason: str) -> None:
        """A reject about the datagram of ``context``, or about what starts at byte ``at`` of the buffer."""
        base = self.base[context]
        where = f", byte {at - base}" if at != base else ""
        excerpt = _hex(self.data, at, self.end[context] - at)
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

    def _key(self, context: int) -> tuple[str, str, int]:
        return self.exporter[context], FORMATS[self.format[context]], self.domain[context]

    # -- datagrams --

    def datagram(self, context: int, start: int, size: int) -> None:
        if size < 4:
            self.reject(context, start, f"datagram of {size} bytes is too short to say its protocol")
            return
        version = int.from_bytes(self.data[start : start + 2], "big")
        if version == 5:
            self._netflow5(context, start, size)
        elif version == 9:
            self._netflow9(context, start, size)
        elif version == 10:
            self._ipfix(context, start, size)
        elif version == 0 and int.from_bytes(self.data[start : start + 4], "big") == 5:
            self._sflow(context, start, size)
        else:
            first = int.from_bytes(self.data[start : start + 4], "big")
            self.reject(context, start, f"not sFlow v5, NetFlow v5/v9 or IPFIX (version field 0x{first:08x})")

    def _header(self, context: int, fmt: str, domain: int, sequence: int, export_ts: int, uptime_ms: int = -1):
        self.format[context] = _FORMAT_CODE[fmt]
        self.domain[context] = domain
        self.sequence[context] = sequence
        self.export[context] = export_ts
        self.uptime[context] = uptime_ms

    def _netflow5(self, context: int, start: int, size: int) -> None:
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
        self._header(context, NETFLOW5, engine_type << 8 | engine_id, sequence, secs * 1_000_000 + nsecs // 1000,
                     uptime)
        self.units[context] = count
        self.v5.append(tuple(np.array([v], np.int64) for v in (start + 24, count, context, sampling & 0x3FFF)))

    def _netflow9(self, context: int, start: int, size: int) -> None:
        if size < 20:
            self.reject(context, start, f"NetFlow v9 header cut off ({size} of 20 bytes)")
            return
        _, _, uptime, secs, sequence, source_id = struct.unpack_from(">HHIIII", self.data, start)
        self._header(context, NETFLOW9, source_id, sequence, secs * 1_000_000, uptime)
        self.units[context] = 1
        self._sets(context, start + 20, start + size)

    def _ipfix(self, context: int, start: int, size: int) -> None:
        if size < 16:
            self.reject(context, start, f"IPFIX message header cut off ({size} of 16 bytes)")
            return
        _, length, export, sequence, domain = struct.unpack_from(">HHIII", self.data, start)
        if length != size:
            self.reject(context, start, f"IPFIX message length {length} is not the datagram's length {size}")
            return
        self._header(context, IPFIX, domain, sequence, export * 1_000_000)
        self.units[context] = 0
        self._sets(context, start + 16, start + size)

    def _sets(self, context: int, at: int, end: int) -> None:
        """Walk the sets (flowsets) of a v9 or IPFIX message."""
        ipfix = self.format[context] == _FORMAT_CODE[IPFIX]
        template_id, options_id = (2, 3) if ipfix else (0, 1)
        while at < end:
            if end - at < 4:
                if any(self.data[at:end]):
                    self.reject(context, at, f"set header cut off ({end - at} of 4 bytes)")
                    self._units_unknown(context)
                return
            set_id, length = struct.unpack_from(">HH", self.data, at)
            if length < 4:
                self.reject(context, at, f"set {set_id} has length {length}, less than its own 4-byte header")
                self._units_unknown(context)
                return
            if at + length > end:
                self.reject(context, at, f"set {set_id} claims {length} bytes, only {end - at} remain in the datagram")
                self._units_unknown(context)
                return
            if set_id == template_id:
                self._templates(context, at + 4, at + length, ipfix, options=False)
            elif set_id == options_id:
                self._templates(context, at + 4, at + length, ipfix, options=True)
            elif set_id >= 256:
                self.data_set(context, set_id, at + 4, at + length)
            else:
                self.skipped[f"{FORMATS[self.format[context]]} set with reserved id {set_id}"] += 1
            at += length

    def _units_unknown(self, context: int) -> None:
        if self.format[context] == _FORMAT_CODE[IPFIX]:
            self.units[context] = None

    # -- templates --

    def _templates(self, context: int, at: int, end: int, ipfix: bool, options: bool) -> None:
        exporter, fmt, domain = self._key(context)
        kind = "options template" if options else "template"
        while end - at >= 4 and any(self.data[at:end]):
            record = at
            if options and not ipfix:
                if end - at < 6:
                    self.reject(context, record, f"options template header cut off ({end - at} of 6 bytes)")
                    return
                tid, scope_length, option_length = struct.unpack_from(">HHH", self.data, at)
                at += 6
                if scope_length % 4 or option_length % 4:
                    self.reject(context, record, f"options template {tid}: scope length {scope_length} and option "
                                                 f"length {option_length} must be multiples of 4")
                    return
                count, scope = (scope_length + option_length) // 4, scope_length // 4
            else:
                tid, count = struct.unpack_from(">HH", self.data, at)
                at += 4
                scope = 0
                if count == 0 and ipfix:
                    self._withdraw(exporter, fmt, domain, tid, options, ipfix)
                    continue
                if options:
                    if end - at < 2:
                        self.reject(context, record, f"options template {tid}: scope field count cut off")
                        return
                    (scope,) = struct.unpack_from(">H", self.data, at)
                    at += 2
            fields = []
            for k in range(count):
                if end - at < 4:
                    self.reject(context, record, f"{kind} {tid} declares {count} fields, its set ends after {k}")
                    return
                ie, length = struct.unpack_from(">HH", self.data, at)
                at += 4
                pen = 0
                if ipfix and ie & 0x8000:
                    if end - at < 4:
                        self.reject(context, record, f"{kind} {tid} declares {count} fields, its set ends after {k}")
                        return
                    (pen,) = struct.unpack_from(">I", self.data, at)
                    at += 4
                    ie &= 0x7FFF
                if length == _VARIABLE and not ipfix:
                    self.reject(context, record, f"{kind} {tid}: field {ie} has length 65535 (variable-length "
                                                 "fields are IPFIX only)")
                    break
                fields.append((ie, length, pen))
            else:
                problem = None
                if tid < 256:
                    problem = f"{kind} id {tid} is reserved (data templates are numbered from 256)"
                elif count == 0:
                    problem = f"{kind} {tid} has no fields"
                elif options and not 0 < scope <= count:
                    problem = f"options template {tid} has {scope} scope fields of {count} (must be 1 to {count})"
                elif sum(1 if n == _VARIABLE else n for _, n, _ in fields) == 0:
                    problem = f"{kind} {tid} describes records of 0 bytes"
                if problem:
                    self.reject(context, record, problem)
                else:
                    template = Template(tuple(fields), options, scope)
                    # one object per distinct template, so re-sent ones are read together, in one gather
                    self.templates[(exporter, fmt, domain, tid)] = self.interned.setdefault(template, template)
                continue
            return

    def _withdraw(self, exporter: str, fmt: str, domain: int, tid: int, options: bool, ipfix: bool) -> None:
        if tid in (2, 3):  # all (options) templates of the domain
            for key in [k for k, t in self.templates.items() if k[:3] == (exporter, fmt, domain)
                        and t.options == (tid == 3)]:
                del self.templates[key]
        else:
            self.templates.pop((exporter, fmt, domain, tid), None)

    # -- data sets --

    def data_set(self, context: int, tid: int, start: int, end: int) -> None:
        """Read (options) or queue (flows) one data set, or keep it for when its template is known."""
        template = self.templates.get((*self._key(context), tid))
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
        if self.units[context] is not None and self.format[context] == _FORMAT_CODE[IPFIX]:
            self.units[context] += count
        if template.options:
            self._options_data(context, template, start, end, records)
            return
        key = self._key(context)
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
                if length == _VARIABLE:
                    if at >= end:
                        at = end + 1
                        break
                    length = data[at]
                    at += 1
                    if length == 255:
                        length = int.from_bytes(data[at : at + 2], "big") if at + 2 <= end else _VARIABLE
                        at += 2
                at += length
            if at > end:
                self.reject(context, record, f"a record of template with {len(template.fields)} fields runs past "
                                             "the end of its data set")
                break
            starts.append(record)
        return starts

    def _record_fields(self, template: Template, record: int) -> dict:
        """Offsets of the wanted fields of one record (variable-length templates)."""
        found, at, data = {}, record, self.data
        for (_, length, _), ie in zip(template.fields, template.read_as):
            if length == _VARIABLE:
                length = data[at]
                at += 1
                if length == 255:
                    length = int.from_bytes(data[at : at + 2], "big")
                    at += 2
            if ie >= 0 and ie not in found:
                found[ie] = at
            at += length
        return found

    def _options_data(self, context: int, template: Template, start: int, end: int, records) -> None:
        """Options data: learn sampling rates (the domain's last one, and the rate of the sampler or selector
        id the record names) and the system init time; count the records.

        A record saying what later code could not use (a rate above 2**31 - 1, sampling fields that give no
        rate, a system init time past 9999) is a reject and teaches nothing: the state keeps only usable values.
        """
        layout = template.layout
        if records is None:
            records = range(start, start + (end - start) // layout.record_length * layout.record_length,
                            layout.record_length)
        key = self._key(context)
        for record in records:
            if layout.problem:
                self.reject(context, record, f"{key[1]} options data: {layout.problem}")
                continue
            offsets = {ie: record + off for ie, off in layout.offsets.items()} if layout.record_length \
                else self._record_fields(template, record)
            value = {ie: np.array([int.from_bytes(self.data[at : at + layout.lengths[ie]], "big")], np.uint64)
                     for ie, at in offsets.items()}
            rate, problem = _rate_said(value, 1, layout.lengths)
            system_init = int(value[160][0]) if 160 in value else 0
            if problem[0]:
                self.reject(context, record, f"{key[1]} options data: {_PROBLEMS[int(problem[0])]}")
                continue
            if system_init > _MAX_TS_US // 1000:
                self.reject(context, record, f"{key[1]} options data: systemInitTimeMilliseconds {system_init} is "
                                             "after 9999-12-31")
                continue
            self.skipped[f"{key[1]} options data"] += 1
            if rate[0]:
                self.sampling[key] = int(rate[0])
                sampler = next((int(value[ie][0]) for ie in _SAMPLER_IDS if ie in value), None)
                if sampler is not None:
                    self._learn_sampler(key, sampler, int(rate[0]))
            if system_init:
                self.system_init[key] = system_init

    def _learn_sampler(self, key: tuple, sampler: int, rate: int) -> None:
        """A sampler's (or selector's) rate, in a new map for the domain: sets queued earlier keep the old one.

        At most ``MAX_SAMPLERS`` per domain (the least recently said dropped first): an exporter naming
        ever new ids cannot grow the state without bound.
        """
        samplers = dict(self.samplers.get(key, {}))
        samplers.pop(sampler, None)
        samplers[sampler] = rate
        while len(samplers) > MAX_SAMPLERS:
            del samplers[next(iter(samplers))]
        self.samplers[key] = samplers

    # -- sFlow --

    def _sflow(self, context: int, start: int, size: int) -> None:
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
        self._header(context, SFLOW5, sub_agent, sequence, -1, uptime)
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
        fixed = 44 if expanded else 32
        if end - at < fixed:
            self.reject(context, at - 8, f"sFlow flow sample cut off ({end - at} of {fixed} bytes)")
            return
        rate = struct.unpack_from(">I", self.data, at + (12 if expanded else 8))[0]
        if not _usable_rate(rate) and rate:  # 0: the agent says nothing (ingest's setting, or 1)
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

    # -- the end: deferred sets, bulk reads, tables --

    def finish(self, sequences: bool = True) -> Decoded:
        pending, self.pending = self.pending, []
        for context, tid, start, end in pending:  # with the templates of the whole call
            self.data_set(context, tid, start, end)
        waiting = []
        for context, tid, start, end in self.pending:
            self._units_unknown(context)
            waiting.append(WaitingSet(
                receive_ts=self.receive[context], exporter=self.exporter[context],
                format=FORMATS[self.format[context]], domain=self.domain[context], template_id=tid,
                body=bytes(self.data[start:end]), export_ts=self.export[context], uptime_ms=self.uptime[context],
                number=self.number[context], offset=start - 4 - self.base[context], input_file=self.input_file,
            ))
        if self.v5:
            self._read_netflow5()
        for template, sets in self.data_sets.values():
            self._read_sets(template, sets)
        if self.sflow:
            self._read_sflow()
        if self.sflow_ip:
            self._read_sflow_ip()
        flows = self._flow_table()
        return Decoded(
            flows=flows,
            sequences=self._sequence_table() if sequences else SEQUENCE_SCHEMA.empty_table(),
            rejects=_rows_table(self.rejects),
            skipped=dict(self.skipped),
            waiting=Waiting(tuple(waiting)),
            state=FlowState(self.templates, self.sampling, self.system_init, nsel=_nsel_bounded(self.nsel),
                            samplers={(*key, sampler): rate for key, samplers in self.samplers.items()
                                      for sampler, rate in samplers.items()}),
        )

    def _read_netflow5(self) -> None:
        first, count, context, sampling = (_concatenate(list(c)) for c in zip(*self.v5))
        pos = _record_starts(first, count, 48)
        context = np.repeat(context, count)
        rows = _gather(self.buf, pos, 48)
        words = rows.view(">u4")  # (n, 12)
        halves = rows.view(">u2")
        export = self.column("export")[context]
        uptime = self.column("uptime")[context]
        n = len(pos)
        self.parts.append(dict(
            order=pos, context=context,
            start=export - _uptime_before(uptime, words[:, 6].astype(np.int64)) * 1000,
            end=export - _uptime_before(uptime, words[:, 7].astype(np.int64)) * 1000,
            family=np.full(n, 4, np.int8), src4=words[:, 0].astype(np.uint32), dst4=words[:, 1].astype(np.uint32),
            protocol=rows[:, 38].astype(np.int64),
            src_port=halves[:, 16].astype(np.int64), dst_port=halves[:, 17].astype(np.int64),
            bytes=words[:, 5].astype(np.int64), packets=words[:, 4].astype(np.int64), rate=np.repeat(sampling, count),
            problem=np.zeros(n, np.int8),
        ))

    def _read_sets(self, template: Template, sets: list) -> None:
        """All queued data sets of one template, in one gather per field."""
        layout = template.layout
        start, end, context, rate, system_init = (np.array(c, np.int64) for c in list(zip(*sets))[:5])
        if layout.record_length:
            count = (end - start) // layout.record_length
            pos = _record_starts(start, count, layout.record_length)
            at = None  # fields are strided views of the gathered records; IPv6 addresses are gathered apart
        else:
            records, found, counts = [], [], []
            for *_, starts in sets:
                records += starts
                counts.append(len(starts))
                found += [self._record_fields(template, r) for r in starts]
            count, pos = np.array(counts, np.int64), np.array(records, np.int64)
            at = {ie: np.array([f[ie] for f in found], np.int64) for ie in layout.lengths}
        n = len(pos)
        if n == 0:
            return
        context, rate, system_init = (np.repeat(c, count) for c in (context, rate, system_init))
        problem = np.zeros(n, np.int8)
        if layout.problem:
            problem[:] = _P_TEMPLATE
            self.told.append((pos, layout.problem))
        if layout.problem:
            value = {}
        elif layout.record_length:  # one gather of whole records, then each field is a strided view
            records = _gather(self.buf, pos, layout.record_length)
            value = {ie: _field(records, offset, layout.lengths[ie]) for ie, offset in layout.offsets.items()}
        else:
            value = {ie: _uint(self.buf, at[ie], layout.lengths[ie]) for ie in at}
        export = self.column("export")[context]
        uptime = self.column("uptime")[context]
        netflow9 = self.column("format")[context] == _FORMAT_CODE[NETFLOW9]

        has_v4, has_v6 = 8 in value and 12 in value, 27 in value and 28 in value
        addresses = dict(family=np.full(n, 4, np.int8), src4=np.zeros(n, np.uint32), dst4=np.zeros(n, np.uint32))
        if has_v4:
            addresses.update(src4=value[8].astype(np.uint32), dst4=value[12].astype(np.uint32))
        if has_v6:  # beside IPv4 fields, for the records whose IPv4 pair is 0.0.0.0
            v6 = (value[8] == 0) & (value[12] == 0) if has_v4 else np.ones(n, bool)
            addresses["family"][v6] = 6
            addresses.update(src6=np.zeros((n, 16), np.uint8), dst6=np.zeros((n, 16), np.uint8))
            where = at if at is not None else {ie: pos + layout.offsets[ie] for ie in (27, 28)}
            addresses["src6"][v6] = _gather(self.buf, where[27][v6], 16)
            addresses["dst6"][v6] = _gather(self.buf, where[28][v6], 16)
            _v4_mapped(addresses, problem)
        if not (has_v4 or has_v6):
            problem[problem == 0] = _P_NO_ADDRESS

        directions = [_counts_of(value, ies) for ies in (_FORWARD, _BACKWARD)]
        event = next((value[ie].astype(np.int64) for ie in _EVENTS if ie in value), None)
        if directions == [None, None]:
            if event is not None and not layout.problem:  # an NSEL create or deny: no traffic in it
                self.skipped["firewall event without counters (NSEL create or deny)"] += n
                return
            if _NAT_EVENT in value and not layout.problem:  # NAT event logging: a session made or ended, no traffic
                self.skipped["NAT event without counters"] += n
                return
            problem[problem == 0] = _P_NO_COUNT
            directions[0] = (np.zeros(n, np.int64), np.zeros(n, np.int64), np.ones(n, bool), np.zeros(n, bool))
        for counted in directions:
            if counted is not None:
                problem[(problem == 0) & counted[3]] = _P_COUNT_RANGE
        nsel = dict(event=np.full(n, -1, np.int64) if event is None else event,
                    conn=value[_CONN_ID].view(np.int64) if _CONN_ID in value else np.full(n, -1, np.int64),
                    tracked=np.zeros(n, bool) if event is None or _CONN_ID not in value
                    else np.isin(event, (_CREATE, _TEARDOWN, _UPDATE)),
                    directional=np.full(n, directions[1] is not None or event is not None))

        if 160 in value:
            said = np.minimum(value[160], np.uint64(_INT64_MAX)).astype(np.int64)
            system_init = np.where(said > 0, said, system_init)
        start_ts, start_bad = _flow_time(value, "start", export, uptime, system_init, netflow9)
        end_ts, end_bad = _flow_time(value, "end", export, uptime, system_init, netflow9)
        if end_ts is None and _OBSERVED in value:  # NSEL: no end, but when the event was observed
            end_bad = value[_OBSERVED] > np.uint64(_MAX_TS_US // 1000)
            end_ts = np.where(end_bad, 0, value[_OBSERVED]).astype(np.int64) * 1000
        if start_ts is None and end_ts is None:
            start_ts = end_ts = export
            start_bad = end_bad = np.zeros(n, bool)
        elif start_ts is None:
            start_ts, start_bad = end_ts, end_bad
        elif end_ts is None:
            end_ts, end_bad = start_ts, start_bad
        problem[(problem == 0) & (start_bad | end_bad)] = _P_TIME_RANGE

        said, rate_problem = _rate_said(value, n, layout.lengths)
        problem[(problem == 0) & (rate_problem > 0)] = rate_problem[(problem == 0) & (rate_problem > 0)]
        sampler = next((ie for ie in _SAMPLER_IDS if ie in value), None)
        samplers = [s[5] for s in sets]
        if sampler is not None and any(samplers):
            by_sampler = _samplers_rate(value[sampler], np.repeat(np.arange(len(sets)), count), samplers)
        else:
            by_sampler = np.zeros(n, np.int64)
        rate = _rate_by_precedence(said, by_sampler, rate)
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

    def _read_sflow(self) -> None:
        header, captured, wire, linktype, context, rate = (np.array(c, np.int64) for c in zip(*self.sflow))
        seen = ip_headers(self.data, header, captured, wire, linktype)
        n = len(header)
        if seen.not_ip.any():
            self.skipped["sflow sampled frame that is not IP"] += int(seen.not_ip.sum())
        problem = np.zeros(n, np.int8)
        for k, text in enumerate(seen.problem):
            if text is not None:
                problem[k] = _P_TEMPLATE
                self.told.append((header[k : k + 1], f"sampled packet header: {text}"))
        keep = np.flatnonzero(~seen.not_ip)
        receive = self.column("receive")[context]
        part = dict(order=header, context=context, start=receive, end=receive, protocol=seen.protocol,
                    src_port=seen.src_port, dst_port=seen.dst_port, bytes=seen.length,
                    packets=np.ones(n, np.int64), rate=rate, problem=problem)
        keys = seen.addresses  # captures' form: family byte, then the address (IPv4 in the last four)
        part.update(family=keys[:n, 0].astype(np.int8), src4=_be_u32(keys[:n, 13:]), dst4=_be_u32(keys[n:, 13:]),
                    src6=keys[:n, 1:], dst6=keys[n:, 1:])
        self.parts.append({name: column[keep] for name, column in part.items()})

    def _read_sflow_ip(self) -> None:
        """sFlow sampled IPv4 (format 3) and IPv6 (4) records: one packet of the IP length they say."""
        body, kind, context, rate = (np.array(c, np.int64) for c in zip(*self.sflow_ip))
        n = len(body)
        v6 = kind == 4
        width = np.where(v6, 16, 4)
        after = body + 8 + 2 * width  # the ports follow the two addresses
        problem = np.zeros(n, np.int8)
        protocol, src_port, dst_port = (_uint(self.buf, p, 4).astype(np.int64) for p in (body + 4, after, after + 4))
        problem[(protocol > 255) | (src_port > 65535) | (dst_port > 65535)] = _P_SFLOW_FIELDS
        receive = self.column("receive")[context]
        addresses = dict(family=np.where(v6, 6, 4).astype(np.int8),
                         src4=_uint(self.buf, body + 8, 4).astype(np.uint32),
                         dst4=_uint(self.buf, body + 12, 4).astype(np.uint32),
                         src6=_gather(self.buf, body + 8, 16).copy(), dst6=_gather(self.buf, body + 24, 16).copy())
        addresses["src6"][~v6] = 0
        addresses["dst6"][~v6] = 0
        _v4_mapped(addresses, problem)
        self.parts.append(dict(order=body, context=context, start=receive, end=receive, **addresses,
                               protocol=np.where(problem == 0, protocol, -1), src_port=src_port, dst_port=dst_port,
                               bytes=_uint(self.buf, body, 4).astype(np.int64), packets=np.ones(n, np.int64),
                               rate=rate, problem=problem))

    def _flow_table(self) -> pa.Table:
        if not self.parts:
            return FLOW_SCHEMA.empty_table()
        names = dict.fromkeys([*(name for p in self.parts for name in p), *_DEFAULTS])
        column = {name: _concatenate([p[name] if name in p else _default(name, len(p["order"])) for p in self.parts])
                  for name in names}
        context, problem = column["context"], column["problem"]
        order = column["order"]
        problem[(problem == 0) & (column["end"] < column["start"])] = _P_BACKWARDS
        out_of_range = (column["start"] < 0) | (column["end"] > _MAX_TS_US) | (column["start"] > _MAX_TS_US)
        problem[(problem == 0) & out_of_range] = _P_TIME_RANGE
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
            self._nsel_once(column)
        empty = column["directional"] & (column["bytes"] == 0) & (column["packets"] == 0)
        if empty.any():
            self.skipped["flow direction without traffic (biflow or NSEL record)"] += int(empty.sum())
            column = {name: values[~empty] for name, values in column.items()}
        context = column["context"]
        src, dst, texts = _address_texts(column)
        protocol = column["protocol"]
        ported = np.isin(protocol, _PORT_PROTOCOLS)
        exporters = sorted(set(self.exporter))
        where = {name: i for i, name in enumerate(exporters)}
        exporter_index = np.array([where[name] for name in self.exporter], np.int64)
        columns = {
            "receive_ts": pa.array(self.column("receive")[context], _TS),
            "exporter": pa.array(exporters, pa.string()).take(pa.array(exporter_index[context])),
            "format": pa.array(FORMATS, pa.string()).take(pa.array(self.column("format")[context])),
            "domain": pa.array(self.column("domain")[context], pa.int64()),
            "start_ts": pa.array(column["start"], _TS),
            "end_ts": pa.array(column["end"], _TS),
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
            if code == _P_SIBLING or at in said:
                continue
            said.add(at)
            if code == _P_TEMPLATE:
                reason = told.get(at, "record cannot be read")
            elif code == _P_BACKWARDS:
                reason = (f"flow ends before it starts ({_iso(int(column['end'][k]))} < "
                          f"{_iso(int(column['start'][k]))})")
            elif code in (_P_NO_PACKETS, _P_PER_PACKET):
                packets, octets = int(column["packets"][k]), int(column["bytes"][k])
                reason = _PROBLEMS[code].format(bytes=octets, packets=packets,
                                                limit=MAX_BYTES_V4_GSO if column["family"][k] == 4 else MAX_BYTES_V6)
            else:
                reason = _PROBLEMS[code]
            self.reject(context, at, reason)

    def _nsel_once(self, column: dict) -> None:
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
            if event == _TEARDOWN:
                if entry is None:
                    continue
                column["bytes"][k] = max(0, octets - entry[d])
                column["packets"][k] = max(0, packets - entry[d + 1])
                entry[d] = entry[d + 1] = 0
                if not any(entry[:4]):
                    del self.nsel[key]
            else:
                entry = self.nsel.pop(key, None) or [0, 0, 0, 0, 0]  # popped: re-inserted as the newest
                entry[d] = min(entry[d] + octets, _INT64_MAX)
                entry[d + 1] = min(entry[d + 1] + packets, _INT64_MAX)
                entry[4] = max(entry[4], int(end[k]))
                self.nsel[key] = entry

    def _sequence_table(self) -> pa.Table:
        rows = [i for i, s in enumerate(self.sequence) if s is not None]
        take = lambda values: [values[i] for i in rows]  # noqa: E731
        export, uptime = take(self.export), take(self.uptime)
        return pa.Table.from_arrays([
            pa.array(take(self.receive), _TS),
            pa.array(take(self.exporter), pa.string()),
            pa.array([FORMATS[f] for f in take(self.format)], pa.string()),
            pa.array(take(self.domain), pa.int64()),
            pa.array(take(self.sequence), pa.int64()),
            pa.array(take(self.units), pa.int64()),
            pa.array([e if e >= 0 else None for e in export], _TS),
            pa.array([u if u >= 0 else None for u in uptime], pa.int64()),
        ], schema=SEQUENCE_SCHEMA)


# Why a record is a reject (``problem`` codes in the bulk columns).
_P_TEMPLATE, _P_NO_ADDRESS, _P_NO_COUNT, _P_COUNT_RANGE, _P_TIME_RANGE, _P_BACKWARDS, _P_MIXED = 1, 2, 3, 4, 5, 6, 7
_P_NO_PACKETS, _P_PER_PACKET, _P_SIBLING, _P_SFLOW_FIELDS = 8, 9, 10, 11
_PROBLEMS = {
    _P_SFLOW_FIELDS: "sFlow sampled IP record with a protocol above 255 or a port above 65535",
    _P_NO_ADDRESS: "record has no source and destination address (fields 8/12 or 27/28)",
    _P_NO_COUNT: "record has no byte count (fields 1 or 85, NSEL 231/232, RFC 5103 reverse 1 or 85)",
    _P_COUNT_RANGE: "byte or packet count above 2**63 - 1",
    _P_NO_PACKETS: "record says {bytes} bytes in 0 packets",
    _P_PER_PACKET: ("record says {bytes} bytes in {packets} packets: more per packet than an IP packet can carry "
                    "({limit})"),
    _P_TIME_RANGE: "flow time outside 1970-01-01 .. 9999-12-31",
    _P_MIXED: ("record between an IPv4-mapped address and a plain IPv6 one: stored as IPv4 and IPv6, the two "
               "ends would be of different families"),
}


# --- helpers --------------------------------------------------------------------------------

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
    problem[said & (packets == 0) & (octets > 0)] = _P_NO_PACKETS
    limit = np.where(column["family"] == 4, MAX_BYTES_V4_GSO, MAX_BYTES_V6)
    problem[said & (packets > 0) & ((octets - 1) // limit >= packets)] = _P_PER_PACKET
    bad = column["order"][(problem != 0) & column["directional"]]
    if len(bad):
        problem[(problem == 0) & np.isin(column["order"], bad)] = _P_SIBLING


def _counts_of(value: dict, ies: tuple) -> tuple | None:
    """(bytes, packets, has a packet counter, above 2**63 - 1) of one direction; None without a byte counter.

    A record that says its bytes and no packet count counts its bytes with 0 packets (§7a).
    """
    octets, packets = (next((value[i] for i in choices if i in value), None) for choices in ies)
    if octets is None:
        return None
    n = len(octets)
    big = octets > np.uint64(_INT64_MAX)
    if packets is not None:
        big |= packets > np.uint64(_INT64_MAX)
        packets = np.minimum(packets, np.uint64(_INT64_MAX)).astype(np.int64)
    return (np.minimum(octets, np.uint64(_INT64_MAX)).astype(np.int64),
            np.zeros(n, np.int64) if packets is None else packets, np.full(n, packets is not None), big)


def _turned(row: dict) -> dict:
    """The row seen from the other end: sources and destinations swapped."""
    turned = dict(row)
    for a, b in (("src4", "dst4"), ("src6", "dst6"), ("src_port", "dst_port")):
        if a in row:
            turned[a], turned[b] = row[b], row[a]
    return turned


#: sFlow flow records of sampled IP packets: format → least length (IPv4: 8 words; IPv6: 14).
_SFLOW_SAMPLED_IP = {3: 32, 4: 56}


def _sflow_format(enterprise: int, kind: int) -> str:
    return str(kind) if enterprise == 0 else f"{enterprise}:{kind}"


#: Why a record's own sampling fields cannot be used (``problem`` codes, beside those above).
_P_RATE_RANGE, _P_RATE_UNUSABLE = 20, 21
_PROBLEMS.update({
    _P_RATE_RANGE: "sampling rate above 2**31 - 1",
    _P_RATE_UNUSABLE: ("sampling fields give no usable rate (a packet interval of 0, a population below its sample "
                       "size, a probability outside 0 < p <= 1)"),
})
#: The largest rate kept or applied: ingest stores rates as 32-bit integers.
MAX_RATE = (1 << 31) - 1
#: Sampler and selector ids remembered per (exporter, format, domain), the least recently said dropped first.
MAX_SAMPLERS = 1024


def _usable_rate(rate: int) -> bool:
    return 1 <= rate <= MAX_RATE


def _rate_said(value: dict, n: int, lengths: dict | None = None) -> tuple[np.ndarray, np.ndarray]:
    """(rate, problem) of each record from its own sampling fields: the rate is 1 in N, 0 where they say nothing.

    The first of these that says something is used: the PSAMP fields the selectorAlgorithm (304) names, or,
    without 304, whichever are present in this order: samplingSize/Population (309/310, n out of N:
    N / n), samplingPacketInterval/Space (305/306, count-based: (interval + space) / interval),
    samplingProbability (311, a float: 1 / p); then samplingInterval (34, with or without the algorithm 35)
    and samplerRandomInterval (50). A rate is rounded to a whole number. ``problem`` is ``_P_RATE_RANGE``
    for a rate above ``MAX_RATE`` and ``_P_RATE_UNUSABLE`` for fields that give a rate and no usable one;
    the rate is then 0. 34 or 50 of 0, and 305/306 or 309/310 both 0, say nothing.
    """
    lengths = lengths or {}
    algorithm = value.get(304)

    def named(*algorithms: int) -> np.ndarray:
        return np.ones(n, bool) if algorithm is None else np.isin(algorithm, np.array(algorithms, np.uint64))

    candidates = []  # (says something, rate as float, unusable)
    if 309 in value and 310 in value:
        size, population = value[309].astype(np.float64), value[310].astype(np.float64)
        candidates.append((named(3) & ((size > 0) | (population > 0)),
                           population / np.where(size > 0, size, 1), (size == 0) | (population < size)))
    if 305 in value and 306 in value:
        interval, space = value[305].astype(np.float64), value[306].astype(np.float64)
        candidates.append((named(1) & ((interval > 0) | (space > 0)),
                           (interval + space) / np.where(interval > 0, interval, 1), interval == 0))
    if 311 in value:
        bits = value[311]
        p = (bits.astype(np.uint32).view(np.float32).astype(np.float64) if lengths.get(311) == 4
             else bits.view(np.float64))
        usable = (p > 0) & (p <= 1)  # NaN is neither
        candidates.append((named(4), 1 / np.where(usable, p, 1), ~usable))
    for ie in (34, 50):
        if ie in value:
            said = value[ie].astype(np.float64)
            candidates.append((said > 0, said, np.zeros(n, bool)))
    rate = np.zeros(n, np.float64)
    unusable, chosen = np.zeros(n, bool), np.zeros(n, bool)
    for says, ratio, bad in candidates:
        take = says & ~chosen
        rate[take], unusable[take] = ratio[take], bad[take]
        chosen |= take
    rate = np.rint(rate)
    problem = np.where(unusable, _P_RATE_UNUSABLE, np.where(rate > MAX_RATE, _P_RATE_RANGE, 0)).astype(np.int8)
    return np.where(chosen & (problem == 0), rate, 0).astype(np.int64), problem


def _rate_by_precedence(own: np.ndarray, sampler: np.ndarray, last_options: np.ndarray) -> np.ndarray:
    """The rate a v9/IPFIX record is sampled at, from what says it, first first (§7a): the record's own
    sampling fields, else the rate of the sampler or selector it names, else the last rate its exporter's
    options data said for the domain; 0 if none (ingest: the source's setting, else 1). The per-source
    setting, which comes before all of these, is ingest's; NetFlow v5 and sFlow say theirs per datagram
    or sample."""
    return np.where(own > 0, own, np.where(sampler > 0, sampler, last_options))


def _samplers_rate(ids: np.ndarray, set_index: np.ndarray, samplers: list) -> np.ndarray:
    """The rate of the sampler or selector each record names, from the map its set was queued with (0: not
    known). One look-up per distinct (set, id)."""
    pairs = np.stack([set_index.astype(np.uint64), ids.astype(np.uint64)], axis=1)
    distinct, inverse = np.unique(pairs, axis=0, return_inverse=True)
    rates = np.array([(samplers[s] or {}).get(i, 0) for s, i in distinct.tolist()], np.int64)
    return rates[inverse.reshape(-1)]


def _uptime_before(uptime: np.ndarray, stamp: np.ndarray) -> np.ndarray:
    """How many ms before the header's sysUptime a stamp is, as a signed 32-bit difference."""
    return ((uptime - stamp + (1 << 31)) & 0xFFFFFFFF) - (1 << 31)


_TIME_FIELDS = {"start": (156, 154, 152, 150, 22, 158), "end": (157, 155, 153, 151, 21, 159)}


def _flow_time(value: dict, which: str, export, uptime, system_init, netflow9):
    """(µs, out of range) for one end of the flows, from the most precise field the template has; None if none."""
    ns, us, ms, s, up, delta = _TIME_FIELDS[which]
    if ns in value or us in value:
        v = value[ns] if ns in value else value[us]
        seconds = (v >> np.uint64(32)).astype(np.int64) - _NTP_TO_UNIX
        fraction = ((v & np.uint64(0xFFFFFFFF)) * np.uint64(1_000_000)) >> np.uint64(32)
        bad = (seconds < 0) | (seconds > _MAX_TS_US // 1_000_000)
        return np.where(bad, 0, seconds) * 1_000_000 + fraction.astype(np.int64), bad
    if ms in value:
        bad = value[ms] > np.uint64(_MAX_TS_US // 1000)
        return np.where(bad, 0, value[ms]).astype(np.int64) * 1000, bad
    if s in value:
        return value[s].astype(np.int64) * 1_000_000, np.zeros(len(export), bool)
    if up in value:
        stamp = value[up].astype(np.int64)
        relative = export - _uptime_before(uptime, stamp) * 1000
        absolute = (system_init + stamp) * 1000
        return np.where(netflow9, relative, np.where(system_init >= 0, absolute, export)), system_init > _MAX_TS_US // 1000
    if delta in value:
        return export - value[delta].astype(np.int64), np.zeros(len(export), bool)
    return None, None


def _record_starts(first: np.ndarray, count: np.ndarray, length: int) -> np.ndarray:
    """Start of every record of sets starting at ``first`` with ``count`` records of ``length`` bytes."""
    total = int(count.sum())
    before = np.repeat(np.cumsum(count) - count, count)
    return np.repeat(first, count) + (np.arange(total, dtype=np.int64) - before) * length


def _gather(buf: np.ndarray, pos: np.ndarray, width: int) -> np.ndarray:
    """``width`` bytes at each position, as a C-contiguous (n, width) uint8 array (zeros past the end)."""
    if len(buf) < width or len(pos) and int(pos.max()) > len(buf) - width:
        buf = np.concatenate([buf, np.zeros(width, np.uint8)])
    return np.lib.stride_tricks.sliding_window_view(buf, width)[pos]


def _uint(buf: np.ndarray, pos: np.ndarray, length: int) -> np.ndarray:
    """The big-endian unsigned integer of ``length`` (1..16) bytes at each position, as uint64."""
    length = min(length, 8)
    raw = _gather(buf, pos, length)
    if length in (1, 2, 4, 8):
        return raw.view(f">u{length}").reshape(-1).astype(np.uint64)
    value = np.zeros(len(pos), np.uint64)
    for k in range(length):
        value = (value << np.uint64(8)) | raw[:, k].astype(np.uint64)
    return value


def _concatenate(arrays: list[np.ndarray]) -> np.ndarray:
    return arrays[0] if len(arrays) == 1 else np.concatenate(arrays)


def _be_u32(octets: np.ndarray) -> np.ndarray:
    """(n, 4) bytes as big-endian uint32 values."""
    return np.ascontiguousarray(octets).view(">u4").reshape(-1).astype(np.uint32)


def _mapped(address: np.ndarray) -> np.ndarray:
    return ~address[:, :10].any(axis=1) & (address[:, 10] == 0xFF) & (address[:, 11] == 0xFF)


def _field(records: np.ndarray, offset: int, length: int) -> np.ndarray:
    """The big-endian unsigned field at ``offset`` of each (contiguous) record, as uint64."""
    n, width = records.shape
    if length in (1, 2, 4, 8):
        view = np.ndarray((n,), f">u{length}", records, offset, (width,)) if n else np.zeros(0, np.uint64)
        return view.astype(np.uint64)
    value = np.zeros(n, np.uint64)
    for k in range(min(length, 8)):
        value = (value << np.uint64(8)) | records[:, offset + k].astype(np.uint64)
    return value


def _v4_mapped(addresses: dict, problem: np.ndarray) -> None:
    """Records between IPv4-mapped IPv6 addresses (``::ffff:a.b.c.d``) become IPv4 records, in place.

    One mapped end and one plain IPv6 end would be stored as IPv4 and IPv6: the record is a reject.
    """
    v6 = addresses["family"] == 6
    src, dst = v6 & _mapped(addresses["src6"]), v6 & _mapped(addresses["dst6"])
    both = src & dst
    addresses["family"][both] = 4
    addresses["src4"][both] = _be_u32(addresses["src6"][both, 12:])
    addresses["dst4"][both] = _be_u32(addresses["dst6"][both, 12:])
    problem[(problem == 0) & (src != dst)] = _P_MIXED


_OCTETS = pa.array([str(k) for k in range(256)], pa.string())


def _address_texts(column: dict) -> tuple[np.ndarray, np.ndarray, pa.Array]:
    """(index of each source, of each destination, text of each distinct address): each address is made text once."""
    n = len(column["family"])
    v4 = column["family"] == 4
    index = np.zeros(2 * n, np.int64)
    values = np.concatenate([column["src4"], column["dst4"]])
    rows = np.flatnonzero(np.concatenate([v4, v4]))
    texts = []
    if len(rows):
        encoded = pa.array(values[rows]).dictionary_encode()
        index[rows] = encoded.indices.to_numpy(zero_copy_only=False)
        distinct = encoded.dictionary.to_numpy(zero_copy_only=False)
        texts.append(pc.binary_join_element_wise(
            *(_OCTETS.take(pa.array((distinct >> np.uint32(shift)) & np.uint32(255))) for shift in (24, 16, 8, 0)),
            "."))
    rows = np.flatnonzero(np.concatenate([~v4, ~v4]))
    if len(rows):
        keys = np.ascontiguousarray(np.concatenate([column["src6"], column["dst6"]])[rows])
        encoded = pa.FixedSizeBinaryArray.from_buffers(pa.binary(16), len(rows), [None, pa.py_buffer(keys)]
                                                       ).dictionary_encode()
        index[rows] = encoded.indices.to_numpy(zero_copy_only=False) + (len(texts[0]) if texts else 0)
        texts.append(pa.array([str(ipaddress.IPv6Address(b)) for b in encoded.dictionary.to_pylist()], pa.string()))
    texts = pa.concat_arrays(texts) if texts else pa.array([], pa.string())
    return index[:n], index[n:], texts


def _iso(us: int) -> str:
    return str(np.datetime64(us, "us")) + "Z"


def _hex(data: bytes, offset: int, available: int) -> str:
    """Hex of up to the first 64 of ``available`` bytes at ``offset``, '…' when cut."""
    available = max(0, min(available, len(data) - offset))
    excerpt = bytes(data[offset : offset + min(available, _EXCERPT)]).hex()
    return excerpt + ("…" if available > _EXCERPT else "")


def _reject_row(reason: str, record: str, source: str, input_file: str) -> dict:
    row = dict.fromkeys(PARSED_SCHEMA.names)
    reason = reason if len(reason) <= MAX_REASON_CHARS else reason[: MAX_REASON_CHARS - 1] + "…"
    row.update(kind=REJECT, source=source, input_file=input_file, reason=reason, record=clip_record(record))
    return row


def _rows_table(rows: list[dict]) -> pa.Table:
    if not rows:
        return PARSED_SCHEMA.empty_table()
    return pa.Table.from_pylist(rows, schema=PARSED_SCHEMA)
