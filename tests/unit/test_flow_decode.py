"""Flow telemetry decoding (DESIGN §7a): datagrams of each protocol in, whole flow rows out.

Datagrams are written by ``tests.support.flow_encoder`` (from the specifications); each test compares
the decoded rows with what the encoder was told, field by field.
"""

from __future__ import annotations

import datetime as dt

import pytest

from tests.support import capture_factory as cf
from tests.support import flow_encoder as fe
from traffic.io.capture import Datagrams, udp_datagrams
from traffic.io.flows import FlowState, Waiting, decode, decode_waiting, expire_waiting

T = 1_800_000_000_000_000  # µs; a whole second
EXPORT_S = T // 1_000_000
A = fe.Flow("10.0.0.1", "192.0.2.1", 1234, 443, 6, 1500, 3, T - 5_000_000, T - 1_000_000)
B = fe.Flow("10.0.0.2", "198.51.100.7", 5353, 53, 17, 80, 1, T - 2_000_000, T - 2_000_000)
C = fe.Flow("2001:db8::1", "2001:db8:0:1::2", 40000, 80, 6, 9000, 7, T - 60_000_000, T - 30_000_000)
ICMP = fe.Flow("10.0.0.3", "192.0.2.9", 0, 2048, 1, 84, 1, T - 1_000_000, T - 1_000_000)

V4 = [(8, 4), (12, 4), (7, 2), (11, 2), (4, 1), (1, 8), (2, 8), (152, 8), (153, 8)]
V6 = [(27, 16), (28, 16), (7, 2), (11, 2), (4, 1), (1, 8), (2, 8), (152, 8), (153, 8)]


def _ts(us: int) -> dt.datetime:
    return dt.datetime.fromtimestamp(us / 1_000_000, dt.timezone.utc).replace(microsecond=us % 1_000_000)


def _row(f: fe.Flow, fmt: str, *, exporter="192.0.2.250", domain=0, receive=T, rate=0, start=None, end=None,
         packets=None, bytes_=None) -> dict:
    ported = f.protocol in (6, 17, 132)
    return {"receive_ts": _ts(receive), "exporter": exporter, "format": fmt, "domain": domain,
            "start_ts": _ts(f.start_us if start is None else start), "end_ts": _ts(f.end_us if end is None else end),
            "src_ip": f.src, "dst_ip": f.dst, "src_port": f.sport if ported else None,
            "dst_port": f.dport if ported else None, "protocol": f.protocol,
            "bytes": f.bytes if bytes_ is None else bytes_, "packets": f.packets if packets is None else packets,
            "sampling_rate": rate}


def _decode(*payloads, exporter="192.0.2.250", state=None):
    datagrams = Datagrams.from_payloads([(T + i * 0, exporter, 5000, 2055, p) for i, p in enumerate(payloads)])
    return decode(datagrams, state or FlowState(), source="edge", input_file="f.pcap")


def _reasons(decoded) -> list[str]:
    return decoded.rejects.column("reason").to_pylist()


# --- NetFlow v5 ---------------------------------------------------------------------------


def test_netflow5_records_times_sampling_and_sequence():
    payload = fe.netflow5([A, B, ICMP], export_us=T, uptime_ms=3_600_000, sequence=41, engine_type=1, engine_id=2,
                          sampling_interval=512, sampling_mode=1)
    out = _decode(payload)
    assert out.flows.to_pylist() == [_row(f, "netflow5", domain=0x102, rate=512) for f in (A, B, ICMP)]
    assert out.sequences.to_pylist() == [{"receive_ts": _ts(T), "exporter": "192.0.2.250", "format": "netflow5",
                                          "domain": 0x102, "sequence": 41, "units": 3, "export_ts": _ts(T),
                                          "uptime_ms": 3_600_000}]
    assert out.rejects.num_rows == 0 and out.skipped == {}


def test_netflow5_uptime_that_wrapped_and_a_stamp_after_the_header():
    # sysUptime wrapped 2 s ago: FIRST/LAST from before the wrap are near 2**32
    wrapped = fe.netflow5([A], export_us=T, uptime_ms=2_000)
    # a flow stamped 3 ms after the header's uptime (exporter clock jitter) stays 3 ms after, not 49 days before
    late = fe.Flow(*A.__dict__.values())
    late = fe.Flow(A.src, A.dst, A.sport, A.dport, A.protocol, A.bytes, A.packets, T - 1000, T + 3000)
    jitter = fe.netflow5([late], export_us=T, uptime_ms=100_000)
    out = _decode(wrapped, jitter)
    assert out.flows.to_pylist() == [_row(A, "netflow5"), _row(late, "netflow5")]


@pytest.mark.parametrize("payload,reason", [
    (fe.netflow5([A], export_us=T, uptime_ms=1)[:-1], "the datagram has 71 bytes"),
    (fe.netflow5([], export_us=T, uptime_ms=1), "record count 0"),
    (fe.netflow5([A], export_us=T, uptime_ms=1)[:20], "header cut off"),
    (b"\x00\x07" + bytes(30), "version field 0x00070000"),
    (b"\x00", "too short"),
])
def test_netflow5_bad_datagrams_are_rejects(payload, reason):
    out = _decode(payload, fe.netflow5([B], export_us=T, uptime_ms=10_000))
    assert out.flows.to_pylist() == [_row(B, "netflow5")]
    [rejected] = out.rejects.to_pylist()
    assert reason in rejected["reason"], rejected
    assert rejected["kind"] == "reject" and rejected["source"] == "edge" and rejected["input_file"] == "f.pcap"
    assert rejected["record"] == f"datagram 1 at µs {T} from 192.0.2.250: " + payload[:64].hex() + (
        "…" if len(payload) > 64 else "")


def test_backwards_flow_is_a_reject_beside_good_ones():
    backwards = fe.Flow(A.src, A.dst, 1, 2, 6, 100, 1, T - 1_000_000, T - 5_000_000)
    out = _decode(fe.netflow5([A, backwards, B], export_us=T, uptime_ms=10_000_000))
    assert out.flows.to_pylist() == [_row(A, "netflow5"), _row(B, "netflow5")]
    [rejected] = out.rejects.to_pylist()
    assert rejected["reason"].startswith("flow ends before it starts")
    assert rejected["record"].startswith(f"datagram 1 at µs {T} from 192.0.2.250, byte 72: ")


# --- NetFlow v9 ---------------------------------------------------------------------------

V9 = [(8, 4), (12, 4), (7, 2), (11, 2), (4, 1), (1, 4), (2, 4), (22, 4), (21, 4)]


def _v9(sets, sequence=0, source_id=7, uptime_ms=900_000):
    return fe.netflow9(sets, export_s=EXPORT_S, uptime_ms=uptime_ms, sequence=sequence, source_id=source_id)


def _v9_data(*flows, tid=256, template=V9, uptime_ms=900_000):
    return fe.data_set(tid, [fe.record(template, fe.flow_values(f, export_us=T, uptime_ms=uptime_ms))
                             for f in flows])


def test_netflow9_template_options_sampling_and_data():
    options = fe.options_template_set(300, [(1, 4)], [(34, 4), (35, 1)], ipfix=False)
    out = _decode(_v9([fe.template_set({256: V9}, ipfix=False), options,
                       fe.data_set(300, [fe.record([(1, 4), (34, 4), (35, 1)], {34: 100, 35: 2})]),
                       _v9_data(A, B, ICMP)], sequence=5))
    assert out.flows.to_pylist() == [_row(f, "netflow9", domain=7, rate=100) for f in (A, B, ICMP)]
    assert out.skipped == {"netflow9 options data": 1}
    assert out.sequences.column("units").to_pylist() == [1]
    assert out.state.sampling == {("192.0.2.250", "netflow9", 7): 100}


def test_netflow9_data_before_its_template_in_one_call_is_decoded_at_the_end():
    out = _decode(_v9([_v9_data(A)]), _v9([fe.template_set({256: V9}, ipfix=False)]), _v9([_v9_data(B)]))
    assert sorted(out.flows.to_pylist(), key=lambda r: r["bytes"]) == [_row(B, "netflow9", domain=7),
                                                                         _row(A, "netflow9", domain=7)]
    assert len(out.waiting) == 0


def test_unknown_template_waits_then_decodes_with_a_later_state():
    first = _decode(_v9([_v9_data(A, B)], uptime_ms=900_000))
    assert first.flows.num_rows == 0 and len(first.waiting) == 1 and first.rejects.num_rows == 0
    waiting = Waiting.from_json(first.waiting.to_json())  # stored in the warehouse between batches
    second = _decode(_v9([fe.template_set({256: V9}, ipfix=False)]), state=first.state)
    state = FlowState.from_json(second.state.to_json())
    decoded, still = decode_waiting(waiting, state, source="edge", input_file="f.pcap")
    assert decoded.flows.to_pylist() == [_row(A, "netflow9", domain=7), _row(B, "netflow9", domain=7)]
    assert len(still) == 0 and decoded.rejects.num_rows == 0
    rejects, kept = expire_waiting(waiting, before_us=T + 1, source="edge", input_file="f.pcap")
    assert len(kept) == 0 and "template never arrived" in rejects.column("reason")[0].as_py()


def test_templates_are_scoped_by_exporter_and_domain():
    other = [(12, 4), (8, 4), (7, 2), (11, 2), (4, 1), (1, 4), (2, 4), (22, 4), (21, 4)]  # addresses swapped
    state = _decode(_v9([fe.template_set({256: V9}, ipfix=False)])).state
    state = _decode(_v9([fe.template_set({256: other}, ipfix=False)]), exporter="192.0.2.251", state=state).state
    state = _decode(_v9([fe.template_set({256: other}, ipfix=False)], source_id=8), state=state).state
    out = _decode(_v9([_v9_data(A)]), state=state)
    assert out.flows.to_pylist() == [_row(A, "netflow9", domain=7)]


@pytest.mark.parametrize("sets,reason", [
    ([b"\x00\x00\x00\x02"], "less than its own 4-byte header"),
    ([b"\x00\x00\x00\x40" + bytes(4)], "claims 64 bytes"),
    ([fe.template_set({256: []}, ipfix=False)], "template 256 has no fields"),
    ([fe.template_set({256: [(1, 0)]}, ipfix=False)], "records of 0 bytes"),
    ([fe.template_set({200: V9}, ipfix=False)], "is reserved"),
    ([b"\x00\x00\x00\x0c\x01\x00\xff\xff\x00\x01\x00\x04"], "declares 65535 fields, its set ends after 1"),
    ([fe.template_set({256: [(8, 3), (12, 4), (1, 4), (2, 4)]}, ipfix=False),
      fe.data_set(256, [bytes(15)])], "field 8 (IPv4 source) has length 3"),
    ([fe.template_set({256: [(8, 4), (12, 4), (2, 4)]}, ipfix=False),
      fe.data_set(256, [bytes(12)])], "no byte count"),
    # bytes and no packet field count their bytes (DESIGN §7a); a packet field that says 0 is a reject
    ([fe.template_set({256: [(8, 4), (12, 4), (1, 4), (2, 4)]}, ipfix=False),
      fe.data_set(256, [bytes(8) + (100).to_bytes(4, "big") + bytes(4)])], "100 bytes in 0 packets"),
])
def test_netflow9_bad_sets_and_templates_are_rejects(sets, reason):
    out = _decode(_v9(sets), _v9([fe.template_set({257: V9}, ipfix=False), _v9_data(A, tid=257)]))
    assert out.flows.to_pylist() == [_row(A, "netflow9", domain=7)]
    assert any(reason in r for r in _reasons(out)), _reasons(out)


# --- IPFIX --------------------------------------------------------------------------------


def _ipfix(sets, sequence=0, domain=3):
    return fe.ipfix(sets, export_s=EXPORT_S, sequence=sequence, domain=domain)


@pytest.mark.parametrize("start,end", [(150, 151), (152, 153), (154, 155), (156, 157), (22, 21), (158, 159),
                                       (None, None)])
def test_ipfix_every_way_to_say_time(start, end):
    fields = [(8, 4), (12, 4), (7, 2), (11, 2), (4, 1), (1, 4), (2, 4)]
    if start is not None:
        fields += [(start, 8 if start in range(152, 158) else 4), (end, 8 if end in range(152, 158) else 4)]
    if start == 22:
        fields.append((160, 8))
    f = fe.Flow(A.src, A.dst, A.sport, A.dport, A.protocol, A.bytes, A.packets, T - 5_000_000, T - 1_000_000)
    values = fe.flow_values(f, export_us=T, system_init_ms=T // 1000 - 86_400_000)
    out = _decode(_ipfix([fe.template_set({256: fields}), fe.data_set(256, [fe.record(fields, values)])]))
    expected = (T, T) if start is None else (f.start_us, f.end_us)
    assert out.flows.to_pylist() == [_row(f, "ipfix", domain=3, start=expected[0], end=expected[1])]


def test_ipfix_sub_second_times_keep_their_microseconds():
    f = fe.Flow(A.src, A.dst, 1, 2, 6, 10, 1, T - 1_234_567, T - 7)
    fields = [(8, 4), (12, 4), (7, 2), (11, 2), (4, 1), (1, 4), (2, 4), (154, 8), (155, 8)]
    out = _decode(_ipfix([fe.template_set({256: fields}), fe.data_set(256, [fe.record(fields, fe.flow_values(f))])]))
    assert out.flows.to_pylist() == [_row(f, "ipfix", domain=3)]


def test_ipfix_reduced_size_variable_length_enterprise_fields_and_ipv6():
    fields = [(100, fe.VARIABLE, 9), (27, 16), (28, 16), (82, fe.VARIABLE), (7, 2), (11, 2), (4, 1), (1, 2), (2, 1),
              (12345, 6, 2636), (152, 8), (153, 8), (85, 8)]
    records = [fe.record(fields, {**fe.flow_values(C), (100, 9): b"x" * n, 82: b"ge-0/0/%d" % n,
                                  (12345, 2636): b"abcdef"}) for n in (0, 254, 255, 300)]
    out = _decode(_ipfix([fe.template_set({256: fields}), fe.data_set(256, records)], sequence=10))
    assert out.flows.to_pylist() == [_row(C, "ipfix", domain=3)] * 4
    assert out.sequences.column("units").to_pylist() == [4]


def test_ipfix_total_counts_stand_in_and_mapped_addresses_are_ipv4():
    fields = [(27, 16), (28, 16), (4, 1), (85, 8), (86, 8), (152, 8), (153, 8)]
    values = {**fe.flow_values(ICMP), 27: "::ffff:10.0.0.3", 28: "::ffff:192.0.2.9"}
    out = _decode(_ipfix([fe.template_set({256: fields}), fe.data_set(256, [fe.record(fields, values)])]))
    assert out.flows.to_pylist() == [_row(ICMP, "ipfix", domain=3)]


def test_ipfix_options_sampling_withdrawal_and_units():
    options = fe.options_template_set(400, [(149, 4)], [(305, 4), (306, 4)])
    rate = fe.data_set(400, [fe.record([(149, 4), (305, 4), (306, 4)], {149: 3, 305: 1, 306: 999})])
    first = _decode(_ipfix([fe.template_set({256: V4}), options, rate,
                            fe.data_set(256, [fe.record(V4, fe.flow_values(f)) for f in (A, B)])], sequence=100))
    assert first.flows.to_pylist() == [_row(f, "ipfix", domain=3, rate=1000) for f in (A, B)]
    assert first.sequences.column("units").to_pylist() == [3]
    assert first.skipped == {"ipfix options data": 1}
    withdrawn = _decode(_ipfix([fe.template_set({256: []}), fe.data_set(256, [fe.record(V4, fe.flow_values(A))])]),
                        state=first.state)
    assert withdrawn.flows.num_rows == 0 and len(withdrawn.waiting) == 1
    assert withdrawn.sequences.column("units").to_pylist() == [None]  # a set it could not count


def test_ipfix_record_sampling_fields_beat_options():
    fields = [*V4, (34, 4)]
    out = _decode(_ipfix([fe.template_set({256: fields}), fe.data_set(256, [fe.record(fields, {
        **fe.flow_values(A), 34: 64})])]), state=FlowState(sampling={("192.0.2.250", "ipfix", 3): 10}))
    assert out.flows.column("sampling_rate").to_pylist() == [64]


@pytest.mark.parametrize("message,reason", [
    (fe.ipfix([], export_s=EXPORT_S)[:-1] + b"", "header cut off"),
    (fe.ipfix([fe.data_set(256, [b"x" * 8])], export_s=EXPORT_S) + b"\0", "is not the datagram's length"),
    (_ipfix([b"\x00\x02\x00\x0c\x01\x00\x00\x09\x00\x08\x00\x04"]), "declares 9 fields, its set ends after 1"),
    (_ipfix([fe.options_template_set(400, [], [(34, 4)])]), "scope fields"),
])
def test_ipfix_bad_messages_are_rejects(message, reason):
    out = _decode(message, _ipfix([fe.template_set({256: V4}), fe.data_set(256, [fe.record(V4, fe.flow_values(B))])]))
    assert out.flows.to_pylist() == [_row(B, "ipfix", domain=3)]
    assert any(reason in r for r in _reasons(out)), _reasons(out)


# --- sFlow --------------------------------------------------------------------------------


def test_sflow_samples_vlans_counters_and_skips():
    plain = fe.flow_sample([fe.raw_header(fe.sampled_frame(A, vlans=[(0x88A8, 100), (0x8100, 10)])),
                            fe.extended_switch()], sampling_rate=2048)
    expanded = fe.flow_sample([fe.raw_header(fe.sampled_frame(C))], sampling_rate=512, expanded=True)
    raw_ip = fe.flow_sample([fe.raw_header(fe.sampled_frame(B)[14:], protocol=11)], sampling_rate=64)
    arp = fe.flow_sample([fe.raw_header(cf.ethernet(bytes(28), 0x0806))], sampling_rate=64)
    out = _decode(fe.sflow([plain, fe.counter_sample(), expanded, raw_ip, arp, fe.counter_sample(expanded=True)],
                           agent="2001:db8::10", sub_agent=4, sequence=77))
    assert out.flows.to_pylist() == [
        _row(A, "sflow5", domain=4, rate=2048, start=T, end=T, packets=1),
        _row(C, "sflow5", domain=4, rate=512, start=T, end=T, packets=1),
        _row(B, "sflow5", domain=4, rate=64, start=T, end=T, packets=1),
    ]
    assert out.skipped == {"sflow counter sample": 2, "sflow flow record format 1001": 1,
                           "sflow sampled frame that is not IP": 1}
    assert out.sequences.to_pylist() == [{"receive_ts": _ts(T), "exporter": "192.0.2.250", "format": "sflow5",
                                          "domain": 4, "sequence": 77, "units": 1, "export_ts": None,
                                          "uptime_ms": 0}]


def test_sflow_lying_lengths_are_rejects():
    good = fe.flow_sample([fe.raw_header(fe.sampled_frame(A))], sampling_rate=10)
    lying = fe.sflow([good])[:-8] + bytes(4)
    many = fe.sflow([good])
    many = many[:24] + (9).to_bytes(4, "big") + many[28:]
    out = _decode(lying, many)
    reasons = _reasons(out)
    assert any("remain" in r for r in reasons) and any("ends after 1" in r for r in reasons), reasons
    assert out.flows.to_pylist() == [_row(A, "sflow5", rate=10, start=T, end=T, packets=1)]


# --- reading captures of export traffic ---------------------------------------------------


def test_udp_datagrams_from_a_collector_file_and_from_another_tools_capture():
    v5 = fe.netflow5([A], export_us=T, uptime_ms=10_000)
    collector = fe.collector_file([(T, "192.0.2.250", 5000, v5), (T + 5, "::ffff:192.0.2.251", 5001, v5)])
    datagrams, rejects = udp_datagrams(collector, input_file="c.pcap", source="edge")
    assert rejects.num_rows == 0 and datagrams.exporter == ["192.0.2.250", "192.0.2.251"]
    assert [datagrams.payload(i) for i in range(2)] == [v5, v5]
    assert datagrams.receive_ts.tolist() == [T, T + 5] and datagrams.dst_port.tolist() == [2055, 2055]

    def frame(packet):
        return cf.ethernet(packet, 0x86DD if packet[0] >> 4 == 6 else 0x0800, vlans=[(0x8100, 5)])

    frames = [
        frame(cf.ipv4("192.0.2.250", "192.0.2.1", 17, cf.udp(5000, 2055, v5))) + bytes(6),  # Ethernet padding
        cf.ethernet(bytes(28), 0x0806),  # ARP: skipped
        frame(cf.ipv4("192.0.2.250", "192.0.2.1", 6, cf.tcp(22, 2055, b"ssh"))),  # not UDP: skipped
        frame(cf.ipv4("192.0.2.250", "192.0.2.1", 17, cf.udp(5000, 2055, v5[:40]), more_fragments=True)),
        frame(cf.ipv4("192.0.2.250", "192.0.2.1", 17, v5[40:], fragment_offset=48)),
        frame(cf.ipv6("2001:db8::5", "2001:db8::1", 17, cf.udp(5000, 2055, v5), extensions=[cf.fragment(0, True)])),
        frame(cf.ipv6("2001:db8::5", "2001:db8::1", 17, cf.udp(5000, 2055, v5))),
    ]
    capture = cf.pcapng(cf.Section([cf.Interface(1)], [cf.Enhanced(0, cf.Packet(f, T * 1000 + i * 1000))
                                                      for i, f in enumerate(frames)]))
    datagrams, rejects = udp_datagrams(capture, input_file="c.pcapng", source="edge")
    assert datagrams.exporter == ["192.0.2.250", "2001:db8::5"] and datagrams.number.tolist() == [1, 7]
    assert [datagrams.payload(i) for i in range(2)] == [v5, v5]
    assert datagrams.skipped == {"not an IP packet": 1, "IP packet that is not UDP": 1}
    assert rejects.column("reason").to_pylist() == ["fragmented datagram: reassembly not supported"] * 3
    assert rejects.column("record").to_pylist()[0].startswith("frame 4 at byte offset ")
    out = decode(datagrams, FlowState(), source="edge", input_file="c.pcapng")
    assert out.flows.column("bytes").to_pylist() == [1500, 1500]


def test_udp_datagrams_cut_by_the_snapshot_length_and_broken_files():
    v5 = fe.netflow5([A], export_us=T, uptime_ms=10_000)
    frame = cf.ethernet(cf.ipv4("192.0.2.250", "192.0.2.1", 17, cf.udp(5000, 2055, v5)))
    capture = cf.pcap([cf.Packet(frame, T * 1000), cf.Packet(frame, T * 1000 + 1)], snaplen=60)
    datagrams, rejects = udp_datagrams(capture, input_file="c.pcap", source="edge")
    assert len(datagrams) == 0
    assert rejects.column("reason").to_pylist() == ["datagram cut off by the capture (18 of 72 bytes captured)"] * 2
    datagrams, rejects = udp_datagrams(b"not a capture", input_file="c.pcap", source="edge")
    assert len(datagrams) == 0 and "not a pcap or pcapng file" in rejects.column("reason")[0].as_py()
