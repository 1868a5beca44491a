"""Cross-check the test encoder and the flow decoder against tshark (Wireshark's cflow and sflow dissectors).

The encoder writes one collector file with NetFlow v5, NetFlow v9, IPFIX and sFlow v5 datagrams on
their usual ports (2055, 4739, 6343), with IPv4 and IPv6 flows, a variable-length field (IPFIX
interfaceName, one short and one over 255 bytes) and an enterprise-specific field; each datagram's
flows as tshark reads them must be what the encoder meant, and what ``traffic.io.flows`` decodes
from the same file must be the same. tshark finding a malformed packet fails the test.

Per datagram, each field is compared as a multiset (tshark lists IPv4 and IPv6 addresses in separate
fields, so their pairing is checked by the decoder comparison, not here). For sFlow, tshark also
dissects the sampled packet headers: their IP addresses and lengths (after the collector's own outer
IP header) are compared with the decoder's rows.

tshark is required: install it with ``apt-get install tshark`` (Debian package).
"""

from __future__ import annotations

import datetime as dt
import shutil
import subprocess
from collections import Counter

import pytest

from tests.support import flow_encoder as fe
from traffic.io.capture import udp_datagrams
from traffic.io.flows import FlowState, decode

pytestmark = pytest.mark.slow

T = 1_800_000_000_000_000
EXPORT_S = T // 1_000_000
UPTIME_MS = 7_200_000

V4_FLOWS = [fe.Flow("10.0.0.1", "192.0.2.1", 1234, 443, 6, 1500, 3, T - 5_000_000, T - 1_000_000),
            fe.Flow("10.0.0.2", "198.51.100.7", 5353, 53, 17, 80, 1, T - 2_000_000, T - 2_000_000)]
V6_FLOWS = [fe.Flow("2001:db8::1", "2001:db8:0:1::2", 40000, 80, 6, 9000, 7, T - 60_000_000, T - 30_000_000),
            fe.Flow("2001:db8::3", "2001:db8::4", 546, 547, 17, 300, 2, T - 3_000_000, T - 1_000_000)]

V9_V4 = [(8, 4), (12, 4), (7, 2), (11, 2), (4, 1), (1, 4), (2, 4), (22, 4), (21, 4)]
V9_V6 = [(27, 16), (28, 16), (7, 2), (11, 2), (4, 1), (1, 8), (2, 8), (22, 4), (21, 4)]
IPFIX_V4 = [(8, 4), (12, 4), (7, 2), (11, 2), (4, 1), (1, 4), (2, 2), (152, 8), (153, 8), (82, fe.VARIABLE)]
IPFIX_V6 = [(27, 16), (28, 16), (100, 4, 9), (7, 2), (11, 2), (4, 1), (1, 8), (2, 8), (150, 4), (151, 4)]


def _datagrams() -> list[tuple[int, str, int, bytes, dict]]:
    """(receive µs, exporter, port, payload, what it means) for each datagram of the file."""
    v9 = fe.netflow9([
        fe.template_set({256: V9_V4, 257: V9_V6}, ipfix=False),
        fe.options_template_set(300, [(1, 4)], [(34, 4)], ipfix=False),
        fe.data_set(300, [fe.record([(1, 4), (34, 4)], {1: 0, 34: 64})]),
        fe.data_set(256, [fe.record(V9_V4, fe.flow_values(f, export_us=T, uptime_ms=UPTIME_MS)) for f in V4_FLOWS]),
        fe.data_set(257, [fe.record(V9_V6, fe.flow_values(f, export_us=T, uptime_ms=UPTIME_MS)) for f in V6_FLOWS]),
    ], export_s=EXPORT_S, uptime_ms=UPTIME_MS, sequence=10, source_id=3, count=8)
    ipfix = fe.ipfix([
        fe.template_set({256: IPFIX_V4, 257: IPFIX_V6}),
        fe.options_template_set(300, [(149, 4)], [(305, 4), (306, 4)]),
        fe.data_set(300, [fe.record([(149, 4), (305, 4), (306, 4)], {149: 5, 305: 1, 306: 99})]),
        fe.data_set(256, [fe.record(IPFIX_V4, {**fe.flow_values(f), 82: name})
                          for f, name in zip(V4_FLOWS, (b"ge-0/0/1", b"x" * 300))]),
        fe.data_set(257, [fe.record(IPFIX_V6, {**fe.flow_values(f), (100, 9): 0xDEADBEEF}) for f in V6_FLOWS]),
    ], export_s=EXPORT_S, sequence=20, domain=5)
    sflow = fe.sflow([
        fe.flow_sample([fe.raw_header(fe.sampled_frame(V4_FLOWS[0], vlans=[(0x8100, 10)])), fe.extended_switch()],
                       sampling_rate=2048),
        fe.counter_sample(),
        fe.flow_sample([fe.raw_header(fe.sampled_frame(V6_FLOWS[0]))], sampling_rate=2048, expanded=True),
    ], agent="192.0.2.30", sub_agent=1, sequence=30)
    return [
        (T + 1, "192.0.2.10", 5000, fe.netflow5(V4_FLOWS, export_us=T, uptime_ms=UPTIME_MS, sequence=1,
                                                 sampling_interval=100, sampling_mode=1),
         {"flows": V4_FLOWS, "rate": 100, "format": "netflow5"}),
        (T + 2, "2001:db8::10", 5001, v9, {"flows": V4_FLOWS + V6_FLOWS, "rate": 64, "format": "netflow9"}),
        (T + 3, "192.0.2.20", 5002, ipfix, {"flows": V4_FLOWS + V6_FLOWS, "rate": 100, "format": "ipfix"}),
        (T + 4, "192.0.2.30", 5003, sflow, {"flows": [V4_FLOWS[0], V6_FLOWS[0]], "rate": 2048, "format": "sflow5"}),
    ]


CFLOW = ["cflow.srcaddr", "cflow.srcaddrv6", "cflow.dstaddr", "cflow.dstaddrv6", "cflow.octets", "cflow.packets",
         "cflow.srcport", "cflow.dstport", "cflow.protocol", "cflow.samplerate", "cflow.sampling_interval",
         "cflow.sampling_packet_interval", "cflow.sampling_packet_space", "cflow.abstimestart", "cflow.abstimeend",
         "cflow.timestart", "cflow.timeend"]
SFLOW = ["sflow.flow_sample.sampling_rate", "ip.src", "ip.dst", "ipv6.src", "ipv6.dst", "ip.len", "ipv6.plen"]


def _tshark(path, fields: list[str]) -> list[dict[str, list[str]]]:
    if shutil.which("tshark") is None:
        pytest.fail("tshark is not installed (apt-get install tshark)")
    command = ["tshark", "-r", str(path), "-T", "fields", "-E", "separator=|", "-E", "occurrence=a", "-E", "aggregator=;",
               "-e", "_ws.malformed", "-e", "_ws.expert.severity", *[a for f in fields for a in ("-e", f)]]
    result = subprocess.run(command, capture_output=True, text=True, check=True, timeout=120)
    rows = []
    for line in result.stdout.splitlines():
        values = line.split("|")
        row = {name: [v for v in value.split(";") if v] for name, value in zip(["malformed", "expert", *fields],
                                                                                  values)}
        assert not row["malformed"], f"tshark finds a malformed packet: {line}"
        rows.append(row)
    return rows


def _absolute(text: str) -> int:
    """tshark's absolute time ("Jan 15, 2027 07:59:55.000000000 UTC") in µs."""
    date, fraction = text.removesuffix(" UTC").rsplit(".", 1)
    seconds = dt.datetime.strptime(date, "%b %d, %Y %H:%M:%S").replace(tzinfo=dt.timezone.utc).timestamp()
    return int(seconds) * 1_000_000 + int(fraction[:6])


def _ints(values: list[str]) -> Counter:
    return Counter(int(v) for v in values)


def test_tshark_reads_what_the_encoder_meant_and_so_does_the_decoder(tmp_path):
    datagrams = _datagrams()
    path = tmp_path / "collector.pcap"
    data = fe.collector_file([(ts, exporter, port, payload) for ts, exporter, port, payload, _ in datagrams])
    path.write_bytes(data)
    cflow = _tshark(path, CFLOW)
    sflow = _tshark(path, SFLOW)

    for (_, _, _, _, meant), row, sampled in zip(datagrams, cflow, sflow):
        flows = meant["flows"]
        if meant["format"] == "sflow5":
            assert _ints(sampled["sflow.flow_sample.sampling_rate"]) == Counter({2048: 2})
            inner_v4 = Counter(sampled["ip.src"][1:])  # the first is the collector file's own header
            assert inner_v4 + Counter(sampled["ipv6.src"]) == Counter(f.src for f in flows)
            lengths = Counter(int(v) for v in sampled["ip.len"][1:]) + Counter(int(v) + 40 for v in sampled["ipv6.plen"])
            assert lengths == Counter(f.bytes for f in flows)
            continue
        assert Counter(row["cflow.srcaddr"] + row["cflow.srcaddrv6"]) == Counter(f.src for f in flows)
        assert Counter(row["cflow.dstaddr"] + row["cflow.dstaddrv6"]) == Counter(f.dst for f in flows)
        assert _ints(row["cflow.octets"]) == Counter(f.bytes for f in flows)
        assert _ints(row["cflow.packets"]) == Counter(f.packets for f in flows)
        assert _ints(row["cflow.srcport"]) == Counter(f.sport for f in flows)
        assert _ints(row["cflow.dstport"]) == Counter(f.dport for f in flows)
        assert _ints(row["cflow.protocol"]) == Counter(f.protocol for f in flows)
        if meant["format"] == "netflow5":
            assert row["cflow.samplerate"] == ["100"]
        if meant["format"] == "netflow9":
            assert row["cflow.sampling_interval"] == ["64"]
        if meant["format"] == "ipfix":
            assert (row["cflow.sampling_packet_interval"], row["cflow.sampling_packet_space"]) == (["1"], ["99"])
            starts = Counter(_absolute(v) for v in row["cflow.abstimestart"])
            # the IPv6 template says seconds, the IPv4 one milliseconds: both are whole seconds here
            assert starts == Counter(f.start_us for f in flows)
        else:  # sysUptime-relative: tshark prints FIRST/LAST in seconds of uptime
            starts = Counter(round(float(v) * 1000) for v in row["cflow.timestart"])
            assert starts == Counter(UPTIME_MS - (T - f.start_us) // 1000 for f in flows)

    found, rejects = udp_datagrams(data, input_file="collector.pcap", source="edge")
    assert rejects.num_rows == 0 and len(found) == len(datagrams)
    decoded = decode(found, FlowState(), source="edge", input_file="collector.pcap")
    assert decoded.rejects.num_rows == 0
    assert decoded.skipped == {"netflow9 options data": 1, "ipfix options data": 1, "sflow counter sample": 1,
                               "sflow flow record format 1001": 1}
    rows = decoded.flows.to_pylist()
    for ts, exporter, _, _, meant in datagrams:
        mine = [r for r in rows if r["exporter"] == exporter.replace("::ffff:", "")]
        sampled = meant["format"] == "sflow5"
        got = Counter((r["src_ip"], r["dst_ip"], r["src_port"], r["dst_port"], r["protocol"], r["bytes"],
                       r["packets"], r["start_ts"], r["end_ts"], r["sampling_rate"], r["format"]) for r in mine)
        receive = dt.datetime.fromtimestamp(ts / 1e6, dt.timezone.utc).replace(microsecond=ts % 1_000_000)
        expected = Counter(
            (f.src, f.dst, f.sport, f.dport, f.protocol, f.bytes, 1 if sampled else f.packets,
             receive if sampled else _utc(f.start_us), receive if sampled else _utc(f.end_us), meant["rate"],
             meant["format"])
            for f in meant["flows"])
        assert got == expected, (meant["format"], got, expected)


def _utc(us: int) -> dt.datetime:
    return dt.datetime.fromtimestamp(us // 1_000_000, dt.timezone.utc).replace(microsecond=us % 1_000_000)
