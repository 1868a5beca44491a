"""Decode flow telemetry (sFlow v5, NetFlow v5, NetFlow v9, IPFIX) from UDP datagrams into flow rows.

``decode`` takes the datagrams a collector file (or any capture of export traffic) holds, from
``traffic.io.capture.udp_datagrams``, and the template state of earlier batches, and gives:

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
  a rate (``sampling.rate_by_precedence``): the record's own sampling fields; else the rate of the sampler or
  selector the record names (v9 48 FLOW_SAMPLER_ID, IPFIX 302 selectorId or 48 samplerId) from the
  options data that gave that id a rate; else the rate the exporter's options data said last for the
  (exporter, format, domain). Sampling fields, in options and data records alike (``sampling.rate_said``):
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
  and not kept. One with a field the decoder reads at an impossible length (an IPv4 address of 3
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

from traffic.io.flows.decoder import decode, decode_waiting, expire_waiting
from traffic.io.flows.fields import Template
from traffic.io.flows.nsel import NSEL_MAX_AGE_US, NSEL_MAX_CONNECTIONS
from traffic.io.flows.records import FLOW_SCHEMA, FORMATS, SEQUENCE_SCHEMA
from traffic.io.flows.sampling import MAX_RATE, MAX_SAMPLERS
from traffic.io.flows.state import Decoded, FlowState, Waiting, WaitingSet

__all__ = [
    "FLOW_SCHEMA", "SEQUENCE_SCHEMA", "FORMATS", "MAX_RATE", "MAX_SAMPLERS", "NSEL_MAX_AGE_US",
    "NSEL_MAX_CONNECTIONS", "Decoded", "FlowState", "Template", "Waiting", "WaitingSet", "decode",
    "decode_waiting", "expire_waiting",
]
