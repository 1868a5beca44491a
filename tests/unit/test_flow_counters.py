"""Counters as exporters send them (DESIGN §7a): NSEL initiator/responder counters and events, RFC 5103
biflow reverse counters, sFlow sampled IPv4/IPv6 records, bytes without packets, and per-packet bounds.

Real export datagrams come from ``../shared/flowcaps`` (read, never copied): each is wrapped into a
pcap in a temporary folder, read with ``udp_datagrams`` and decoded; what tshark reads in the same
pcap is the reference for every count.
"""

from __future__ import annotations

import ipaddress
import shutil
import subprocess
import xml.etree.ElementTree as ET
from collections import Counter
from pathlib import Path

import pytest

from tests.support import capture_factory as cf
from tests.support import flow_encoder as fe
from tests.support.requirements import folder_fixture, tool_fixture
from traffic.io.capture import Datagrams, udp_datagrams
from traffic.io.flows import NSEL_MAX_CONNECTIONS, FlowState, decode

FLOWCAPS = Path(__file__).resolve().parents[3] / "shared" / "flowcaps"
# Missing corpus or tshark fails the tests that need them, with the reason (tests/support/requirements.py).
flowcaps_corpus = folder_fixture(FLOWCAPS, "flowcaps_corpus")
tshark_tool = tool_fixture("tshark", "tshark_tool")
needs_corpus = pytest.mark.usefixtures("flowcaps_corpus")
needs_tshark = pytest.mark.usefixtures("tshark_tool")

T = 1_800_000_000_000_000  # µs
EXPORT_S = T // 1_000_000


# --- reading the corpus, and tshark's reading of it ------------------------------------------


def _wrap(names: list[str], path: Path, port: int) -> Path:
    """Payload files as UDP datagrams to ``port``, one a second, in the order given (templates first)."""
    packets = [cf.Packet(cf.ethernet(cf.ipv4("192.0.2.9", "192.0.2.1", 17,
                                             cf.udp(40000, port, (FLOWCAPS / "payloads" / name).read_bytes()))),
                         1_700_000_000_000_000_000 + k * 1_000_000_000)
               for k, name in enumerate(names)]
    path.write_bytes(cf.pcap(packets))
    return path


def _concatenated(names: list[str], path: Path) -> Path:
    """Corpus pcaps (Ethernet, classic pcap) as one capture, in order."""
    out = [(FLOWCAPS / names[0]).read_bytes()]
    out += [(FLOWCAPS / name).read_bytes()[24:] for name in names[1:]]
    path.write_bytes(b"".join(out))
    return path


def _decode(path: Path, state: FlowState | None = None):
    datagrams, rejects = udp_datagrams(path.read_bytes(), input_file=path.name, source="fw")
    assert rejects.num_rows == 0
    return decode(datagrams, state or FlowState(), source="fw", input_file=path.name)


def _tshark_records(path: Path, dissector: str, port: int) -> list[dict]:
    """Every flow record tshark reads, in order: field name → text; reverse (RFC 5103) fields get ``.reverse``."""
    done = subprocess.run(["tshark", "-n", "-r", str(path), "-o", "cflow.max_template_fields:0", "-T", "pdml",
                           "-d", f"udp.port=={port},{dissector}"], capture_output=True, text=True, check=True)
    records = []
    for element in ET.fromstring(done.stdout).iter("field"):
        if element.get("name") == "" and (element.get("show") or "").startswith("Flow ") \
                and element.get("show")[5:].isdigit():
            fields = {}
            for child in element.iter("field"):
                name = child.get("name")
                if name:
                    name += ".reverse" if "(Reverse" in (child.get("showname") or "") else ""
                    fields.setdefault(name, child.get("show"))
            records.append(fields)
    return records


def _ours(flows) -> dict:
    """(src, dst) → [bytes, packets] of decoded rows."""
    got: dict = {}
    for row in flows.to_pylist():
        entry = got.setdefault((row["src_ip"], row["dst_ip"]), [0, 0])
        entry[0] += row["bytes"]
        entry[1] += row["packets"]
    return got


def _nsel_expected(records: list[dict]) -> dict:
    """Per (src, dst): tshark's counters, each byte once (an update counts, a teardown counts what updates did not)."""
    reported: dict = {}
    expected: dict = {}
    for r in records:
        if "cflow.initiator_octets" in r:
            counters = [int(r["cflow.initiator_octets"]), int(r["cflow.responder_octets"])]
        elif "cflow.permanent_octets" in r:
            counters = [int(r["cflow.permanent_octets"]), 0]
        else:
            continue  # a create or deny event without counters
        event, conn = int(r["cflow.firewall_event"]), r.get("cflow.flow_id")
        before = reported.get(conn, [0, 0])
        if event == 2:
            counts = [max(0, c - b) for c, b in zip(counters, before)]
            reported.pop(conn, None)
        else:
            counts = counters
            reported[conn] = [b + c for b, c in zip(before, counters)]
        pairs = [(r["cflow.srcaddr"], r["cflow.dstaddr"]), (r["cflow.dstaddr"], r["cflow.srcaddr"])]
        for pair, count in zip(pairs, counts):
            if count:
                expected.setdefault(pair, [0, 0])[0] += count
    return expected


# --- Cisco ASA NSEL -----------------------------------------------------------------------


@needs_corpus
@needs_tshark
def test_asa_initiator_and_responder_octets_count_each_byte_once(tmp_path):
    path = _wrap(["netflow9_test_cisco_asa_2_tpl_26x.dat", "netflow9_test_cisco_asa_2_tpl_27x.dat",
                  "netflow9_test_cisco_asa_2_data.dat"], tmp_path / "asa2.pcap", 2055)
    records = _tshark_records(path, "cflow", 2055)
    assert len(records) == 19
    said = sum(int(r.get("cflow.initiator_octets", 0)) + int(r.get("cflow.responder_octets", 0)) for r in records)
    assert said == 130_362  # what the records say, updates and teardowns alike
    out = _decode(path)
    assert out.rejects.num_rows == 0, out.rejects.column("reason").to_pylist()
    expected = _nsel_expected(records)
    assert sum(b for b, _ in expected.values()) == 65_603
    assert _ours(out.flows) == expected
    # the responder's bytes go from the server back to the client: their own orientation
    assert ("192.168.0.17", "192.168.0.2") in expected
    assert out.skipped["firewall event without counters (NSEL create or deny)"] == 4
    assert out.state.nsel == {}  # every flow was torn down


@needs_corpus
@needs_tshark
def test_asa_teardowns_with_total_octets_and_no_packet_field_count_their_bytes(tmp_path):
    path = _wrap(["netflow9_test_cisco_asa_1_tpl.dat", "netflow9_test_cisco_asa_1_data.dat"],
                 tmp_path / "asa1.pcap", 2055)
    records = _tshark_records(path, "cflow", 2055)
    assert len(records) == 14
    out = _decode(path)
    assert out.rejects.num_rows == 0, out.rejects.column("reason").to_pylist()
    assert out.flows.num_rows == 14
    assert _ours(out.flows) == _nsel_expected(records)
    assert set(out.flows.column("packets").to_pylist()) == {0}  # bytes without a packet field: 0 packets


NSEL = [(148, 4), (8, 4), (7, 2), (12, 4), (11, 2), (4, 1), (233, 1), (231, 4), (232, 4), (298, 4), (299, 4),
        (152, 8), (323, 8)]


def _nsel(conn: int, event: int, counters: tuple, *, sequence: int = 0, src="10.0.0.1", observed_ms: int = T // 1000
          ) -> bytes:
    values = {148: conn, 8: src, 7: 40000, 12: "192.0.2.80", 11: 443, 4: 6, 233: event, 152: T // 1000 - 60_000,
              231: counters[0], 298: counters[1], 232: counters[2], 299: counters[3], 323: observed_ms}
    return fe.netflow9([fe.template_set({260: NSEL}, ipfix=False), fe.data_set(260, [fe.record(NSEL, values)])],
                       export_s=EXPORT_S, uptime_ms=3_600_000, sequence=sequence)


def _batch(*payloads, state=None):
    datagrams = Datagrams.from_payloads([(T, "192.0.2.250", 5000, 2055, p) for p in payloads])
    return decode(datagrams, state or FlowState(), source="fw", input_file="f.pcap")


def test_nsel_update_then_teardown_in_a_later_batch_counts_the_rest_once():
    first = _batch(_nsel(7, 5, (1000, 10, 50_000, 40)))
    assert _ours(first.flows) == {("10.0.0.1", "192.0.2.80"): [1000, 10], ("192.0.2.80", "10.0.0.1"): [50_000, 40]}
    state = FlowState.from_json(first.state.to_json())  # as the warehouse keeps it
    second = _batch(_nsel(7, 5, (500, 5, 0, 0), sequence=1), _nsel(7, 2, (1600, 16, 70_000, 50), sequence=2),
                    state=state)
    assert _ours(second.flows) == {("10.0.0.1", "192.0.2.80"): [600, 6], ("192.0.2.80", "10.0.0.1"): [20_000, 10]}
    assert second.state.nsel == {}  # the teardown forgets the flow
    again = _batch(_nsel(7, 2, (1600, 16, 70_000, 50), sequence=3), state=second.state)
    assert _ours(again.flows) == {("10.0.0.1", "192.0.2.80"): [1600, 16], ("192.0.2.80", "10.0.0.1"): [70_000, 50]}


def test_nsel_update_counts_from_the_previous_update_to_its_observation_time():
    ms = T // 1000
    out = _batch(_nsel(9, 5, (100, 1, 200, 2), observed_ms=ms - 40_000),
                 _nsel(9, 5, (300, 3, 0, 0), observed_ms=ms - 10_000, sequence=1),
                 _nsel(9, 2, (500, 5, 200, 2), observed_ms=ms, sequence=2))
    times = [(r["start_ts"].timestamp() * 1000 - ms, r["end_ts"].timestamp() * 1000 - ms, r["bytes"])
             for r in out.flows.to_pylist()]
    assert times == [(-60_000, -40_000, 100), (-60_000, -40_000, 200), (-40_000, -10_000, 300), (-10_000, 0, 100)]


def test_nsel_memory_is_bounded_and_keeps_the_newest():
    payloads = [_nsel(conn, 5, (100, 1, 0, 0), sequence=conn) for conn in range(NSEL_MAX_CONNECTIONS + 5)]
    out = _batch(*payloads)
    assert len(out.state.nsel) == NSEL_MAX_CONNECTIONS
    kept = {key[3] for key in out.state.nsel}
    assert 0 not in kept and NSEL_MAX_CONNECTIONS + 4 in kept
    assert FlowState.from_json(out.state.to_json()).nsel == out.state.nsel


def test_nsel_state_read_back_keeps_only_usable_entries():
    data = {"nsel": [{"exporter": "e", "format": "netflow9", "domain": 0, "conn": 1, "reported": [1, 1, 1, 1, 1]},
                     {"exporter": "e", "format": "netflow9", "domain": 0, "conn": 2, "reported": [2**63, 1, 1, 1, 1]},
                     {"exporter": "e", "format": "netflow9", "domain": 0, "conn": 3, "reported": [-1, 1, 1, 1, 1]},
                     {"exporter": "e", "format": "netflow9", "domain": 0, "conn": 4, "reported": "x"}]}
    assert list(FlowState.from_json(data).nsel) == [("e", "netflow9", 0, 1)]


# --- RFC 5103 biflows ---------------------------------------------------------------------


@needs_corpus
@needs_tshark
def test_biflow_reverse_counters_are_their_own_rows_turned_round(tmp_path):
    path = _concatenated(["akvorado_nf_ipfixprobe-templates.pcap", "akvorado_nf_ipfixprobe-data.pcap"],
                         tmp_path / "probe.pcap")
    records = _tshark_records(path, "cflow", 4739)
    expected: dict = {}
    reverse = [0, 0]
    for r in records:
        for pair, suffix in (((r["cflow.srcaddr"], r["cflow.dstaddr"]), ""),
                             ((r["cflow.dstaddr"], r["cflow.srcaddr"]), ".reverse")):
            octets, packets = int(r["cflow.octets" + suffix]), int(r["cflow.packets" + suffix])
            if octets or packets:
                entry = expected.setdefault(pair, [0, 0])
                entry[0] += octets
                entry[1] += packets
        reverse[0] += int(r["cflow.octets.reverse"])
        reverse[1] += int(r["cflow.packets.reverse"])
    assert reverse == [1674, 26]
    out = _decode(path)
    assert out.rejects.num_rows == 0, out.rejects.column("reason").to_pylist()
    assert _ours(out.flows) == expected
    turned = [row for row in out.flows.to_pylist() if row["src_ip"] == "74.53.140.153"]
    # tshark's flow 3: 10.10.1.4:1470 → 74.53.140.153:25, reverse 1,546 bytes in 25 packets
    assert [(r["src_port"], r["dst_port"], r["bytes"], r["packets"]) for r in turned] == [(25, 1470, 1546, 25)]


def test_biflow_record_with_one_bad_direction_is_one_reject():
    fields = [(8, 4), (12, 4), (1, 4), (2, 4), (1, 4, 29305), (2, 4, 29305)]
    good = fe.record(fields, {8: "10.0.0.1", 12: "192.0.2.1", 1: 100, 2: 1, (1, 29305): 80, (2, 29305): 1})
    bad = fe.record(fields, {8: "10.0.0.2", 12: "192.0.2.1", 1: 100, 2: 1, (1, 29305): 80, (2, 29305): 0})
    out = _batch(fe.ipfix([fe.template_set({256: fields}), fe.data_set(256, [good, bad])], export_s=EXPORT_S))
    assert _ours(out.flows) == {("10.0.0.1", "192.0.2.1"): [100, 1], ("192.0.2.1", "10.0.0.1"): [80, 1]}
    assert out.rejects.column("reason").to_pylist() == ["record says 80 bytes in 0 packets"]


# --- sFlow sampled IPv4 / IPv6 records ------------------------------------------------------


def _sampled_ip(version: int, src: str, dst: str, length: int, protocol: int, sport: int, dport: int) -> bytes:
    """An sFlow sampled IPv4 (format 3) or IPv6 (4) flow record."""
    body = (length.to_bytes(4, "big") + protocol.to_bytes(4, "big") + ipaddress.ip_address(src).packed
            + ipaddress.ip_address(dst).packed + sport.to_bytes(4, "big") + dport.to_bytes(4, "big") + bytes(8))
    return (3 if version == 4 else 4).to_bytes(4, "big") + len(body).to_bytes(4, "big") + body


def test_sflow_sampled_ipv4_and_ipv6_records_count_one_packet_times_the_rate():
    samples = [fe.flow_sample([_sampled_ip(4, "10.0.0.1", "192.0.2.1", 1500, 6, 1234, 443)], sampling_rate=512),
               fe.flow_sample([_sampled_ip(6, "2001:db8::1", "2001:db8::2", 9000, 17, 53, 5353)], sampling_rate=64,
                              expanded=True)]
    out = _batch(fe.sflow(samples))
    rows = [(r["src_ip"], r["dst_ip"], r["src_port"], r["dst_port"], r["protocol"], r["bytes"], r["packets"],
             r["sampling_rate"]) for r in out.flows.to_pylist()]
    assert rows == [("10.0.0.1", "192.0.2.1", 1234, 443, 6, 1500, 1, 512),
                    ("2001:db8::1", "2001:db8::2", 53, 5353, 17, 9000, 1, 64)]
    assert out.rejects.num_rows == 0


@needs_corpus
@needs_tshark
def test_sflow_sample_with_a_raw_header_and_a_sampled_ipv4_record_counts_once(tmp_path):
    path = tmp_path / "s.pcap"
    shutil.copy(FLOWCAPS / "akvorado_sflow_data-sflow-ipv4-data.pcap", path)
    done = subprocess.run(["tshark", "-n", "-r", str(path), "-d", "udp.port==6343,sflow", "-T", "fields",
                           "-e", "sflow_245.ip.length", "-e", "ip.len"], capture_output=True, text=True, check=True)
    sampled_record, lengths = done.stdout.split()
    assert int(sampled_record) == int(lengths.split(",")[-1]) == 1344  # the same packet, said twice
    out = _decode(path)
    assert out.flows.column("bytes").to_pylist() == [1344]  # counted once
    assert out.skipped.get("sflow sampled IPv4/IPv6 record beside a raw packet header") == 1


# --- bytes and packets ----------------------------------------------------------------------

V4 = [(8, 4), (12, 4), (1, 8), (2, 8)]
V6 = [(27, 16), (28, 16), (1, 8), (2, 8)]


def test_bytes_without_a_packet_field_count_with_zero_packets():
    fields = [(8, 4), (12, 4), (1, 4)]
    out = _batch(fe.ipfix([fe.template_set({256: fields}),
                           fe.data_set(256, [fe.record(fields, {8: "10.0.0.1", 12: "192.0.2.1", 1: 1234})])],
                          export_s=EXPORT_S))
    assert _ours(out.flows) == {("10.0.0.1", "192.0.2.1"): [1234, 0]}
    assert out.rejects.num_rows == 0


@pytest.mark.parametrize("fields,src,dst,octets,packets,kept", [
    (V4, "10.0.0.1", "192.0.2.1", 524_280 * 3, 3, True),  # a GSO/BIG TCP super-packet each
    (V4, "10.0.0.1", "192.0.2.1", 524_280 * 3 + 1, 3, False),
    (V4, "10.0.0.1", "192.0.2.1", 2**62, 1, False),
    (V6, "2001:db8::1", "2001:db8::2", 4_294_967_335 * 2, 2, True),  # the largest jumbogram each
    (V6, "2001:db8::1", "2001:db8::2", 4_294_967_335 * 2 + 1, 2, False),
    (V4, "10.0.0.1", "192.0.2.1", 1, 0, False),
    (V4, "10.0.0.1", "192.0.2.1", 0, 0, True),
])
def test_more_bytes_per_packet_than_an_ip_packet_carries_is_a_reject(fields, src, dst, octets, packets, kept):
    src_ie, dst_ie = fields[0][0], fields[1][0]
    good = fe.record(fields, {src_ie: src, dst_ie: dst, 1: 100, 2: 1})
    record = fe.record(fields, {src_ie: src, dst_ie: dst, 1: octets, 2: packets})
    out = _batch(fe.ipfix([fe.template_set({256: fields}), fe.data_set(256, [good, record])], export_s=EXPORT_S))
    assert out.flows.num_rows == (2 if kept else 1)
    assert out.rejects.num_rows == (0 if kept else 1)
    if not kept:
        reason = out.rejects.column("reason")[0].as_py()
        assert f"record says {octets} bytes in {packets} packets" in reason


def test_netflow5_record_with_bytes_and_no_packets_is_a_reject():
    flows = [fe.Flow("10.0.0.1", "192.0.2.1", 1, 2, 6, 1500, 0, T - 1_000_000, T),
             fe.Flow("10.0.0.2", "192.0.2.1", 1, 2, 6, 1500, 1, T - 1_000_000, T)]
    out = _batch(fe.netflow5(flows, export_us=T, uptime_ms=3_600_000))
    assert Counter(out.flows.column("src_ip").to_pylist()) == Counter({"10.0.0.2": 1})
    assert out.rejects.column("reason").to_pylist() == ["record says 1500 bytes in 0 packets"]


@needs_corpus
@needs_tshark
def test_nat_event_records_without_counters_are_skipped_not_rejected(tmp_path):
    """NAT event logging (natEvent 230) tells of sessions made and ended, not traffic: skipped and counted, no reject."""
    path = _concatenated(["akvorado_nf_nat.pcap"], tmp_path / "nat.pcap")
    theirs = _tshark_records(path, "cflow", 2055)
    events = [r for r in theirs if "cflow.nat_event" in r]
    assert len(events) == 9 and not any("cflow.octets" in r or "cflow.packets" in r for r in events), theirs
    out = _decode(path)
    assert (out.flows.num_rows, out.rejects.num_rows) == (0, 0), out.rejects.column("reason").to_pylist()
    assert out.skipped == {"NAT event without counters": len(events)}
