"""The shared flow-export corpus (``../shared/flowcaps/``) as sources to ingest, and tshark's reading of them.

The corpus holds real NetFlow v5/v9, IPFIX and sFlow v5 export traffic from public projects' test data
(its ``SOURCES.md`` names each file, its origin and its quirks). Nothing of it is copied into the
project: the tests read it where it lies.

* ``sources()`` groups the corpus into sources, each a list of files in the order an exporter sent
  them: a pcap on its own, or the files of one export split over several pcaps
  (``x-template.pcap`` before ``x-data.pcap``; ``multiplesamplingrates-{template, options-template,
  options-data, data}``), or bare datagrams of ``payloads/`` wrapped into pcaps, templates first
  (``*_tpl*``/``*_opttpl*`` before the matching ``*_data*``).
* ``tshark_totals`` is the reference: tshark decodes the concatenation of a source's files (it
  decodes data only with templates seen in the same file; in that copy each NetFlow v9 header's count
  says the flowsets that follow, as Wireshark stops at the count and we walk the lengths), and the counts of every flow record are
  multiplied by the sampling rate the records themselves carry, read from tshark's own decode in
  DESIGN §7a's order (record fields 34/50, 305/306, 309/310, 311; the sampler/selector's rate from
  options data, 48/302; the last options-data rate of the exporter and domain; the NetFlow v5
  header; sFlow's per-sample rate). Directions are counted as each side's own pair: an RFC 5103
  biflow's reverse counters and a Cisco ASA NSEL record's responder counters belong to (dst, src);
  an NSEL teardown whose flow sent updates is not counted again (the updates already counted its
  bytes), an NSEL record of any other event with no counters adds nothing. sFlow bytes are the
  sampled packet's IP length (tshark's ``ip.len`` / ``ipv6.plen`` + 40 of the sampled header).
"""

from __future__ import annotations

import json
import re
import struct
import subprocess
from collections import defaultdict
from dataclasses import dataclass, field
from pathlib import Path

from tests.support import flow_tools as ft
from traffic.io.capture import udp_datagrams
from traffic.io.datagrams import PCAP_HEADER, datagram_record

CORPUS = Path(__file__).resolve().parents[3] / "shared" / "flowcaps"
PAYLOADS = CORPUS / "payloads"

#: The address and time the wrapped payloads are "received" from/at (their header's export time when
#: it has one: the time an exporter would have sent them).
PAYLOAD_EXPORTER = "198.18.0.9"
#: The role order of a multi-file pcap source: templates before options before data.
_ROLES = ["template", "templates", "options-template", "options-data", "data"]
_SPLIT = re.compile(r"^(?P<base>.+?)[-_](?P<role>templates?|options-template|options-data|data)\.pcap$")
_PAYLOAD = re.compile(r"^(?P<base>.+?)_(?P<role>opttpl|tplopt|tpl|data)(?P<rest>.*)\.dat$")

Totals = dict[tuple[str, str], tuple[int, int]]


@dataclass
class Source:
    """One exporter's files, in the order they were sent (``files`` are pcaps; payloads are wrapped)."""

    name: str
    files: list[Path] = field(default_factory=list)
    payloads: list[Path] = field(default_factory=list)  # payloads/*.dat, one datagram each, in order

    def pcaps(self, folder: Path) -> list[Path]:
        """The source's pcaps, in order: the corpus files as they are, or its payloads wrapped into one pcap each."""
        if self.files:
            return list(self.files)
        folder.mkdir(parents=True, exist_ok=True)
        out = []
        for number, payload in enumerate(self.payloads):
            path = folder / f"{number:02d}-{payload.stem}.pcap"
            data = payload.read_bytes()
            path.write_bytes(PCAP_HEADER + datagram_record(_export_us(data) + number, PAYLOAD_EXPORTER, 40000,
                                                           "198.18.0.1", _port(data), data))
            out.append(path)
        return out


def _port(payload: bytes) -> int:
    """The port the payload's protocol is usually sent to (tshark decodes them there without being told)."""
    if payload[:2] == b"\x00\x0a":
        return 4739
    if payload[:4] == b"\x00\x00\x00\x05":
        return 6343
    return 2055


def _export_us(payload: bytes) -> int:
    """The export time the header says (µs), or 2017-01-01 when it says none."""
    fallback = 1_483_228_800
    if len(payload) >= 12 and payload[:2] in (b"\x00\x05", b"\x00\x09"):
        secs = struct.unpack(">I", payload[8:12])[0]
    elif len(payload) >= 8 and payload[:2] == b"\x00\x0a":
        secs = struct.unpack(">I", payload[4:8])[0]
    else:
        secs = fallback
    return (secs if 946_684_800 <= secs <= 1_893_456_000 else fallback) * 1_000_000


def sources(corpus: Path = CORPUS) -> list[Source]:
    """Every source of the corpus, in name order (see the module docstring)."""
    grouped: dict[str, list[tuple[int, Path]]] = defaultdict(list)
    for path in sorted(corpus.glob("*.pcap")):
        match = _SPLIT.match(path.name)
        if match:
            grouped[match["base"]].append((_ROLES.index(match["role"]), path))
        else:
            grouped[path.stem].append((0, path))
    out = [Source(name, files=[p for _, p in sorted(parts)]) for name, parts in grouped.items()]
    payloads: dict[str, list[tuple[int, str, Path]]] = defaultdict(list)
    for path in sorted((corpus / "payloads").glob("*.dat")):
        match = _PAYLOAD.match(path.name)
        if match:
            data_only = match["role"] == "data"  # templates (opttpl, tpl, tpl_data, tplopt) first
            payloads[match["base"]].append((int(data_only), path.name, path))
        else:
            payloads[path.stem].append((0, path.name, path))
    out += [Source(name, payloads=[p for _, _, p in sorted(parts)]) for name, parts in payloads.items()]
    return sorted(out, key=lambda s: s.name)


# -- tshark's reading ------------------------------------------------------------------------------

_STANDARD = {2055: "cflow", 4739: "cflow", 6343: "sflow"}


def _tshark_json(path: Path, decode_as: dict[int, str]) -> list[dict]:
    # -2: two passes, so data that arrived before its template is decoded, as ours decodes data that waited
    command = [ft.require("tshark"), "-n", "-2", "-o", "cflow.max_template_fields:0", "--no-duplicate-keys", "-r", str(path),
               "-T", "json"]
    for port, protocol in sorted(decode_as.items()):
        command += ["-d", f"udp.port=={port},{protocol}"]
    done = subprocess.run(command, capture_output=True, text=True, timeout=300)
    if done.returncode != 0:
        raise ft.ToolError(f"tshark failed: {' '.join(command)}\n{done.stderr[-2000:]}")
    return json.loads(done.stdout or "[]")


def _ports(path: Path) -> set[int]:
    command = [ft.require("tshark"), "-n", "-r", str(path), "-T", "fields", "-E", "occurrence=f", "-e", "udp.dstport"]
    done = subprocess.run(command, capture_output=True, text=True, timeout=120)
    return {int(p) for line in done.stdout.split() for p in line.split(",") if p.isdigit()}


def merged(source: Source, folder: Path) -> Path:
    """One pcap of the source's files, file after file (tshark decodes data only with templates seen in
    the same file), with every NetFlow v9 header's count made to say the flowsets that follow
    (``honest_v9_counts``). A copy: the corpus files are never written."""
    pcaps = source.pcaps(folder / "wrapped" / source.name)
    folder.mkdir(parents=True, exist_ok=True)
    path = pcaps[0] if len(pcaps) == 1 else ft.merge_captures(pcaps, folder / f"{source.name}.merged.pcap",
                                                              concatenate=True)
    out = folder / f"{source.name}.tshark.pcap"
    out.write_bytes(honest_v9_counts(path.read_bytes()))
    return out


def honest_v9_counts(capture: bytes) -> bytes:
    """The capture with each NetFlow v9 header's count set to the number of flowsets its datagram holds.

    Wireshark stops reading a v9 datagram after as many flowsets as the header's count (it counts a
    flowset as one, whatever it holds), while exporters disagree on what the count counts: softflowd
    says 1 for a datagram of two templates, an options template, its options data and one data record
    (``graylog_netflow9``'s first datagram, whose options data set the rate 100). Our decoder walks the
    flowset lengths and ignores the count, so the reference must see every flowset too. The walk stops
    at a flowset length below 4 or past the datagram, as the decoder does. (The UDP checksum is not
    corrected: tshark does not check it by default.)"""
    data = bytearray(capture)
    datagrams, _ = udp_datagrams(capture, input_file="tshark copy", source="s")
    for i in range(len(datagrams)):
        at, length = int(datagrams.offset[i]), int(datagrams.length[i])
        if length < 20 or data[at:at + 2] != b"\x00\x09":
            continue
        offset, flowsets = 20, 0
        while offset + 4 <= length:
            set_length = int.from_bytes(data[at + offset + 2:at + offset + 4], "big")
            if set_length < 4 or offset + set_length > length:
                break
            flowsets, offset = flowsets + 1, offset + set_length
        data[at + 2:at + 4] = flowsets.to_bytes(2, "big")
    return bytes(data)


def _first(value):
    return value[0] if isinstance(value, list) else value


def _int(record: dict, *names) -> int | None:
    for name in names:
        if name in record:
            text = str(_first(record[name]))
            try:
                return int(text, 0) if text.startswith("0x") else int(float(text))
            except ValueError:
                continue
    return None


def _records(node, out: list, template_frame=None) -> None:
    """The flow records (``Flow i``, ``pdu i/N``) under a cflow layer, in order, each with the frame its
    template came in (``cflow.template_frame``)."""
    if isinstance(node, list):
        for item in node:
            _records(item, out, template_frame)
        return
    if not isinstance(node, dict):
        return
    template_frame = node.get("cflow.template_frame", template_frame)
    for key, value in node.items():
        if key.startswith("Flow ") or key.startswith("pdu "):
            for item in (value if isinstance(value, list) else [value]):
                record = _flatten(item)
                if template_frame is not None:
                    record["cflow.template_frame"] = template_frame
                out.append(record)
        elif isinstance(value, (dict, list)) and not key.startswith("cflow.template") and "Template" not in key:
            _records(value, out, template_frame)


def _flatten(node, out: dict | None = None) -> dict:
    out = {} if out is None else out
    if isinstance(node, dict):
        for key, value in node.items():
            if isinstance(value, (dict, list)) and not key.startswith("cflow.") and not key.startswith("sflow"):
                _flatten(value, out)
            elif isinstance(value, dict):
                _flatten(value, out)
                out.setdefault(key, value)
            else:
                out.setdefault(key, value)
    elif isinstance(node, list):
        for item in node:
            _flatten(item, out)
    return out


@dataclass
class Reading:
    """tshark's reading of one source: the totals and what was seen on the way (for the status report)."""

    totals: Totals
    records: int = 0
    rates: dict = field(default_factory=dict)  # rate -> records counted at it
    notes: list = field(default_factory=list)


def _sampling(record: dict) -> int | None:
    """The rate a record's own fields say (34 or 50, 305/306, 309/310, 311), or None."""
    interval = _int(record, "cflow.sampling_interval")
    if interval and interval > 1:
        return interval
    random = _int(record, "cflow.sampler_random_interval", "cflow.flow_sampler_random_interval")
    if random and random > 1:
        return random
    packet_interval = _int(record, "cflow.sampling_packet_interval")
    packet_space = _int(record, "cflow.sampling_packet_space")
    if packet_interval and packet_space is not None:  # (305 alone, = 1, comes with PSAMP's 309/310)
        return (packet_interval + packet_space) // packet_interval
    size, population = _int(record, "cflow.sampling_size"), _int(record, "cflow.sampling_population")
    if size and population:
        return population // size
    if "cflow.sampling_probability" in record:
        probability = float(_first(record["cflow.sampling_probability"]))
        if probability > 0:
            return round(1 / probability)
    if interval is not None or random is not None:
        return 1
    return None


_SRC = ("cflow.srcaddr", "cflow.srcaddrv6")
_DST = ("cflow.dstaddr", "cflow.dstaddrv6")
_OCTETS = ("cflow.octets", "cflow.permanent_octets")  # 1, else 85
_PACKETS = ("cflow.packets", "cflow.permanent_packets")  # 2, else 86


def _address(record: dict, names) -> str | None:
    """The record's address; of a template with both an IPv4 and an IPv6 address, the one that is set."""
    found = [str(_first(record[name])) for name in names if name in record]
    given = [a for a in found if a not in ("0.0.0.0", "::")]
    return (given or found or [None])[0]


def _cflow(frames: list[dict], reading: Reading, add) -> None:
    rates: dict = {}  # (exporter, domain, id) -> rate; (exporter, domain, None) -> the last options rate
    torn: set = set()  # NSEL flows whose updates were counted: (exporter, domain, conn id or 5-tuple)
    pending: list = []
    for frame in frames:
        layers = frame["_source"]["layers"]
        flow = layers.get("cflow")
        if not flow:
            continue
        for layer in (flow if isinstance(flow, list) else [flow]):
            version = _int(layer, "cflow.version")
            exporter = str(_first(layers.get("ip", {}).get("ip.src") or layers.get("ipv6", {}).get("ipv6.src")))
            domain = _int(layer, "cflow.source_id", "cflow.od_id") or 0
            header_rate = None
            if version == 5:
                interval = (_int(layer, "cflow.samplerate") or 0) & 0x3FFF
                header_rate = interval if interval > 1 else None
            records: list = []
            _records(layer, records)
            # Options data of a datagram apply to all its records (data may precede it in the datagram, as it may
            # precede its template); data decoded with a later frame's template is read when that frame arrives.
            number = int(frame["_source"]["layers"]["frame"]["frame.number"])
            for record in records:
                when = max(number, _int(record, "cflow.template_frame") or number)
                pending.append((when, _address(record, _SRC) is not None, len(pending), record,
                                (exporter, domain), header_rate))
    for _, _, _, record, scope, header_rate in sorted(pending, key=lambda p: p[:3]):
        _cflow_record(record, scope, header_rate, rates, torn, reading, add)


def _cflow_record(record, scope, header_rate, rates, torn, reading: Reading, add) -> None:
    src, dst = _address(record, _SRC), _address(record, _DST)
    own = _sampling(record)
    sampler = _int(record, "cflow.sampler_id", "cflow.flow_sampler_id", "cflow.selector_id")
    if src is None or dst is None:
        # options data: a sampler/selector's rate, or the exporter's rate for its domain
        if own is not None:
            rates[(*scope, sampler)] = own
            rates[(*scope, None)] = own
        return
    rate = own or rates.get((*scope, sampler)) if sampler is not None else own
    rate = rate or rates.get((*scope, None)) or header_rate or 1
    forward = _counters(record, _OCTETS, _PACKETS, 0)
    # RFC 5103 biflow: the reverse counters (PEN 29305) are tshark's second value of the same field
    reverse = _counters(record, _OCTETS, _PACKETS, 1)
    initiator = _counters(record, ("cflow.initiator_octets",), ("cflow.initiator_packets",), 0)
    responder = _counters(record, ("cflow.responder_octets",), ("cflow.responder_packets",), 0)
    forward = forward if forward is not None else initiator
    reverse = reverse if reverse is not None else responder
    event = _int(record, "cflow.firewall_event")
    if event is not None:  # Cisco ASA NSEL: 5 update (bytes since the last one), 2 teardown (the flow's totals)
        key = (*scope, _int(record, "cflow.flow_id") or (src, dst, _int(record, "cflow.srcport"),
                                                          _int(record, "cflow.dstport")))
        if event == 5:
            torn.add(key)
        elif event == 2 and key in torn:
            reading.notes.append(f"NSEL teardown after updates not counted again: {src} → {dst}")
            forward = reverse = None
    reading.records += 1
    reading.rates[rate] = reading.rates.get(rate, 0) + 1
    if forward is not None and forward != (0, 0):
        add((src, dst), forward[0] * rate, forward[1] * rate)
    if reverse is not None and reverse != (0, 0):
        add((dst, src), reverse[0] * rate, reverse[1] * rate)


def _sflow(frames: list[dict], reading: Reading, add) -> None:
    for frame in frames:
        layers = frame["_source"]["layers"]
        if "sflow" not in layers:
            continue
        samples = _sflow_samples(layers["sflow"])
        for rate, ip in samples:
            reading.records += 1
            reading.rates[rate] = reading.rates.get(rate, 0) + 1
            add(ip[:2], ip[2] * rate, rate)


def _sflow_samples(layer) -> list:
    """(rate, (src, dst, IP length)) of each flow sample's sampled header: its outermost IP header (an ICMP
    error's or a tunnel's inner header is not another packet)."""
    out: list = []

    def walk(node, rate):
        if isinstance(node, list):
            for item in node:
                walk(item, rate)
            return
        if not isinstance(node, dict):
            return
        rate = _int(node, "sflow.flow_sample.sampling_rate") or rate
        for key, value in node.items():
            if key in ("ip", "ipv6") and rate:
                value = _first(value)
                if key == "ip":
                    out.append((rate, (value["ip.src"], value["ip.dst"], int(value["ip.len"]))))
                else:
                    out.append((rate, (value["ipv6.src"], value["ipv6.dst"], int(value["ipv6.plen"]) + 40)))
                return
            if isinstance(value, (dict, list)):
                walk(value, rate)

    walk(layer, None)
    return out


def _counters(record: dict, octets: tuple, packets: tuple, index: int) -> tuple[int, int] | None:
    """(octets, packets) of a record's ``index``-th occurrence of the fields, or None when it has none."""
    for o_name in octets:
        if o_name in record:
            values = record[o_name] if isinstance(record[o_name], list) else [record[o_name]]
            if index >= len(values):
                return None
            count = 0
            for p_name in packets:
                if p_name in record:
                    p_values = record[p_name] if isinstance(record[p_name], list) else [record[p_name]]
                    count = int(p_values[index]) if index < len(p_values) else 0
                    break
            return int(values[index]), count
    return None


def tshark_totals(source: Source, folder: Path) -> Reading:
    """tshark's (src, dst) -> (bytes, packets) of a source, times the rates its records carry."""
    path = merged(source, folder)
    ports = _ports(path)
    decode_as = {port: "cflow" for port in ports if port not in _STANDARD and port not in (9996,)}
    totals: dict = defaultdict(lambda: [0, 0])
    reading = Reading({})

    def add(pair, octets, packets):
        totals[pair][0] += octets
        totals[pair][1] += packets

    frames = _tshark_json(path, decode_as)
    _cflow(frames, reading, add)
    _sflow(frames, reading, add)
    if 6343 in ports:  # NetFlow sent to the sFlow port (tcpdump's multi-agent capture): read those frames as cflow
        again = [f for f in _tshark_json(path, {**decode_as, 6343: "cflow"})
                 if _int(f["_source"]["layers"].get("cflow", {}) if isinstance(
                     f["_source"]["layers"].get("cflow"), dict) else {}, "cflow.version") in (5, 9, 10)]
        _cflow(again, reading, add)
    reading.totals = {pair: (b, p) for pair, (b, p) in totals.items()}
    return reading


def differences(ours: Totals, theirs: Totals) -> list[tuple]:
    """(pair, ours, tshark's) for every pair where they differ."""
    zero = (0, 0)  # a record of 0 bytes and 0 packets: a row of nothing on our side, no pair on tshark's
    return [(pair, ours.get(pair), theirs.get(pair)) for pair in sorted(set(ours) | set(theirs), key=str)
            if ours.get(pair, zero) != theirs.get(pair, zero)]
