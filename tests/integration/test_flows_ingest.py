"""Flow telemetry through ingest (DESIGN §7a): collector files → weighted, sampled, apportioned rows.

The datagrams come from the project's encoder (``tests/support/flow_encoder.py``, itself checked
against tshark in ``test_flow_encoder_tshark.py``); what lands in the tables is checked to the byte.
"""

from __future__ import annotations

import json
from datetime import datetime, timedelta, timezone

from tests.support import flow_encoder as fe
from tests.support.harness import Harness
from traffic.io.telemetry import TelemetryState

UTC = timezone.utc
T0 = datetime(2026, 11, 1, 10, tzinfo=UTC)
US = 1_000_000
ROUTER = "192.0.2.7"
LOCAL = "10.1.0.0/16,2001:db8:1::/48"


def _us(ts: datetime) -> int:
    return int(ts.timestamp()) * US + ts.microsecond


def _write(harness: Harness, source: str, name: str, datagrams: list[tuple[int, bytes]]) -> None:
    folder = harness.settings.inbox / source
    folder.mkdir(parents=True, exist_ok=True)
    (folder / name).write_bytes(fe.collector_file([(ts, ROUTER, 40000, payload) for ts, payload in datagrams]))


def _flow(src, dst, size, packets, start: datetime, end: datetime, sport=40000, dport=443, protocol=6) -> fe.Flow:
    return fe.Flow(src, dst, sport, dport, protocol, size, packets, _us(start), _us(end))


def _tick(at: datetime, sequence: int = 0) -> bytes:
    """A NetFlow v5 datagram exported at ``at`` with one small flow (a v5 datagram cannot be empty)."""
    return fe.netflow5([_flow("10.1.0.200", "198.51.100.200", 40, 1, at, at)], export_us=_us(at), uptime_ms=50_000,
                       sequence=sequence)


def _pairs(rows) -> dict:
    out: dict = {}
    for r in rows:
        key = (r["local_ip"], r["remote_ip"], r["direction"])
        bytes_, packets = out.get(key, (0, 0))
        out[key] = (bytes_ + r["bytes"], packets + (r["packets"] if r["packets"] is not None else 1))
    return out


def test_netflow_v5_flows_are_apportioned_to_panes_exactly(spark, tmp_path):
    harness = Harness(tmp_path, spark, local_networks=LOCAL)
    export = T0 + timedelta(minutes=16)
    flows = [
        # 10:02:30 → 10:12:30 spans panes 10:00, 10:05, 10:10 (2.5 + 5 + 2.5 minutes)
        _flow("10.1.0.5", "198.51.100.9", 10_000, 10, T0 + timedelta(minutes=2, seconds=30),
              T0 + timedelta(minutes=12, seconds=30)),
        # inbound, inside one pane
        _flow("198.51.100.9", "10.1.0.5", 1500, 1, T0 + timedelta(minutes=14), T0 + timedelta(minutes=14)),
    ]
    _write(harness, "edge", "a.flows.pcap",
           [(_us(export), fe.netflow5(flows, export_us=_us(export), uptime_ms=3_600_000, sequence=0))])
    result = harness.ingest()
    assert (result.packets_on_time, result.bytes_on_time, result.records_rejected) == (11, 11_500, 0)
    rows = sorted(harness.table("packets"), key=lambda r: r["ts"])
    out = [(r["ts"], r["bytes"], r["packets"], r["direction"]) for r in rows]
    assert out == [
        (T0 + timedelta(minutes=2, seconds=30), 2500, 3, "out"),  # 2.5 packets each side: earlier pane rounds up
        (T0 + timedelta(minutes=5), 5000, 5, "out"),
        (T0 + timedelta(minutes=10), 2500, 2, "out"),
        (T0 + timedelta(minutes=14), 1500, 1, "in"),
    ]
    assert {r["sampling_rate"] for r in rows} == {1}
    # The export time ticked the source's clock: the hour is not closed yet, nothing is late.
    harness.close()
    hourly = {(r["local_ip"], r["remote_ip"]): r for r in harness.table("hourly")}
    row = hourly[("10.1.0.5", "198.51.100.9")]
    assert (row["bytes"], row["packets"], row["bytes_out"], row["bytes_in"]) == (11_500, 11, 10_000, 1500)


def test_sampling_rates_multiply_and_the_ledger_says_how_much_is_estimated(spark, tmp_path):
    """sFlow samples ×rate, v5 ×its header interval; a per-source setting overrides what the exporter says."""
    harness = Harness(tmp_path, spark, local_networks=LOCAL, allowed_lateness="0s")
    at = T0 + timedelta(minutes=1)
    frame = fe.sampled_frame(_flow("10.1.0.5", "198.51.100.9", 0, 1, at, at), payload=100)
    samples = [fe.flow_sample([fe.raw_header(frame)], sampling_rate=512), fe.counter_sample()]
    v5 = fe.netflow5([_flow("10.1.0.6", "198.51.100.9", 1000, 2, at, at)], export_us=_us(at), uptime_ms=10_000,
                     sampling_interval=100)
    _write(harness, "switch", "s.flows.pcap", [(_us(at), fe.sflow(samples, sequence=1))])
    _write(harness, "edge", "e.flows.pcap", [(_us(at), v5)])
    first = harness.ingest()
    assert first.skipped == {"sflow counter sample": 1}  # not traffic: skipped and counted, not rejected
    assert json.loads(harness.table("batches")[0]["skipped"]) == {"sflow counter sample": 1}
    rows = {r["source"]: r for r in harness.table("packets")}
    sampled_bytes = rows["switch"]["bytes"]
    assert (rows["switch"]["packets"], rows["switch"]["sampling_rate"]) == (512, 512)
    assert sampled_bytes == 100 * 512  # the sampled packet's IP length × the rate
    assert (rows["edge"]["bytes"], rows["edge"]["packets"], rows["edge"]["sampling_rate"]) == (100_000, 200, 100)
    # Later hours close the first; its ledger row says how many of its bytes are estimates.
    later = T0 + timedelta(hours=2)
    _write(harness, "edge", "f.flows.pcap", [(_us(later), _tick(later, sequence=1))])
    _write(harness, "switch", "t.flows.pcap", [(_us(later), fe.sflow([], sequence=2))])
    harness.ingest()
    harness.close()
    ledger = {r["period_start"]: r for r in harness.table("periods") if r["grain"] == "hour"}
    assert (ledger[T0]["bytes"], ledger[T0]["estimated_bytes"]) == (sampled_bytes + 100_000,) * 2
    assert ledger[T0]["dq_status"] != "failed"  # (one datagram per source: completeness warns)


def test_a_per_source_sampling_rate_overrides_the_exporter(spark, tmp_path):
    harness = Harness(tmp_path, spark, local_networks=LOCAL, sampling_rates="edge=10")
    at = T0 + timedelta(minutes=1)
    v5 = fe.netflow5([_flow("10.1.0.6", "198.51.100.9", 1000, 2, at, at)], export_us=_us(at), uptime_ms=10_000,
                     sampling_interval=100)
    _write(harness, "edge", "e.flows.pcap", [(_us(at), v5)])
    harness.ingest()
    (row,) = harness.table("packets")
    assert (row["bytes"], row["packets"], row["sampling_rate"]) == (10_000, 20, 10)


def test_ipfix_templates_are_kept_across_batches_and_data_before_its_template_waits(spark, tmp_path):
    harness = Harness(tmp_path, spark, local_networks=LOCAL)
    template = [(8, 4), (12, 4), (7, 2), (11, 2), (4, 1), (1, 8), (2, 8), (152, 8), (153, 8)]
    v6_template = [(27, 16), (28, 16), (7, 2), (11, 2), (4, 1), (1, 4), (2, 4), (152, 8), (153, 8)]
    at = T0 + timedelta(minutes=3)
    f4 = _flow("10.1.0.5", "198.51.100.9", 4000, 4, at, at)
    f6 = _flow("2001:db8:ffff::1", "2001:db8:1::5", 600, 3, at, at, sport=53, dport=5353, protocol=17)

    def message(sets, sequence):
        return fe.ipfix(sets, export_s=_us(at) // US, sequence=sequence, domain=7)

    def data(tid, spec, flow):
        return fe.data_set(tid, [fe.record(spec, fe.flow_values(flow))])

    # Batch 1: data for template 300 arrives before its template (it waits); template 256 and its data.
    _write(harness, "edge", "1.flows.pcap", [
        (_us(at), message([data(300, v6_template, f6)], 0)),
        (_us(at) + 1, message([fe.template_set({256: template}), data(256, template, f4)], 1)),
    ])
    first = harness.ingest()
    assert (first.packets_on_time, first.records_rejected) == (4, 0)
    state = TelemetryState.from_json(json.loads(harness.table("flow_state")[0]["state"]))
    assert len(state.waiting) == 1 and (ROUTER, "ipfix", 7, 256) in state.flows.templates
    # Batch 2 (a new file, as after a collector restart): template 300 arrives, the waiting data is read;
    # template 256, learned a batch ago, decodes new data without being sent again.
    _write(harness, "edge", "2.flows.pcap", [
        (_us(at) + 2, message([fe.template_set({300: v6_template}), data(256, template, f4)], 3)),
    ])
    second = harness.ingest()
    assert (second.packets_on_time, second.records_rejected) == (4 + 3, 0)
    pairs = _pairs(harness.table("packets"))
    assert pairs == {("10.1.0.5", "198.51.100.9", "out"): (8000, 8),
                     ("2001:db8:1::5", "2001:db8:ffff::1", "in"): (600, 3)}
    assert len(TelemetryState.from_json(json.loads(harness.table("flow_state")[0]["state"])).waiting) == 0


def _lost(harness: Harness) -> dict:
    return {(r["source"], r["pane_start"]): r["lost"] for r in harness.table("source_panes") if r["lost"]}


def test_sequence_gaps_are_counted_and_flag_the_hour(spark, tmp_path):
    harness = Harness(tmp_path, spark, local_networks=LOCAL)
    at = T0 + timedelta(minutes=20)
    one = [_flow("10.1.0.5", "198.51.100.9", 100, 1, at, at)]
    datagrams = [(_us(at), fe.netflow5(one, export_us=_us(at), uptime_ms=10_000, sequence=0)),
                 # 5 records missing: the next datagram's sequence says 6, not 1
                 (_us(at) + 10, fe.netflow5(one, export_us=_us(at), uptime_ms=10_000, sequence=6))]
    _write(harness, "edge", "a.flows.pcap", datagrams)
    harness.ingest()
    # Not decided yet (DESIGN §7a: reordering is not loss): a late datagram may still fill the gap
    # within a minute, and neither a later datagram nor the watermark is a minute past it.
    assert _lost(harness) == {}
    later = T0 + timedelta(hours=2)
    _write(harness, "edge", "b.flows.pcap", [(_us(later), _tick(later, sequence=7))])
    harness.ingest()
    # The next datagram, two hours on, decides it: lost in the pane of the datagram that revealed it.
    assert _lost(harness) == {("edge", T0 + timedelta(minutes=20)): 5}
    harness.close()
    ledger = {r["period_start"]: r for r in harness.table("periods") if r["grain"] == "hour"}
    assert ledger[T0]["lost"] == 5 and ledger[T0]["dq_status"] == "warning"
    assert ledger[T0 + timedelta(hours=1)]["lost"] == 0


def test_the_freeze_after_the_batch_that_revealed_a_gap_flags_its_hour(spark, tmp_path):
    """A gap revealed 30 s before the hour ends, by the batch whose watermark then passes the hour: no
    datagram is yet a minute past it, but the freeze that follows this very batch must know the hour's
    losses. The batch decides the gaps of the hours its watermark closes. (Before, the hour froze with
    nothing lost; the 5 records came into a frozen hour's pane a batch later.)"""
    harness = Harness(tmp_path, spark, local_networks=LOCAL)
    gap_at, then = T0 + timedelta(minutes=59, seconds=30), T0 + timedelta(hours=1, seconds=5)
    one = [_flow("10.1.0.5", "198.51.100.9", 100, 1, gap_at, gap_at)]
    _write(harness, "edge", "a.flows.pcap", [
        (_us(gap_at) - 10 * US, fe.netflow5(one, export_us=_us(gap_at) - 10 * US, uptime_ms=10_000, sequence=0)),
        (_us(gap_at), fe.netflow5(one, export_us=_us(gap_at), uptime_ms=20_000, sequence=6)),  # 1-5 missing
        (_us(then), _tick(then, sequence=7)),
    ])
    result = harness.ingest()
    assert result.watermark_after == then  # past the hour: the next freeze freezes it
    assert _lost(harness) == {("edge", T0 + timedelta(minutes=55)): 5}
    harness.close()
    ledger = {r["period_start"]: r for r in harness.table("periods") if r["grain"] == "hour"}
    assert (ledger[T0]["lost"], ledger[T0]["dq_status"]) == (5, "warning")


def test_the_gap_of_a_source_that_stopped_is_decided_by_the_watermark_before_its_hour_freezes(spark, tmp_path):
    """``edge`` reveals a gap and sends nothing more; ``core`` goes on until ``edge`` is stalled and the
    watermark passes edge's hour. That batch has no file of edge, yet it decides edge's gap from its
    journaled state (and writes edge's state without it): the freeze after it flags the hour, once."""
    harness = Harness(tmp_path, spark, local_networks=LOCAL)
    at = T0 + timedelta(minutes=20)
    one = [_flow("10.1.0.5", "198.51.100.9", 100, 1, at, at)]
    _write(harness, "edge", "a.flows.pcap", [
        (_us(at), fe.netflow5(one, export_us=_us(at), uptime_ms=10_000, sequence=0)),
        (_us(at) + 10, fe.netflow5(one, export_us=_us(at), uptime_ms=10_000, sequence=6))])
    _write(harness, "core", "c1.flows.pcap", [(_us(at), _tick(at))])
    harness.ingest()
    assert _lost(harness) == {}
    for n, minutes in enumerate((40, 80, 150), start=1):  # core alone: edge stalls after an hour
        when = at + timedelta(minutes=minutes)
        _write(harness, "core", f"c{n + 1}.flows.pcap", [(_us(when), _tick(when, sequence=n))])
        harness.ingest()
    assert harness.watermark >= T0 + timedelta(hours=2)
    assert _lost(harness) == {("edge", T0 + timedelta(minutes=20)): 5}
    (row,) = [r for r in harness.table("flow_state") if r["source"] == "edge"]
    assert all(not s.gaps for s in TelemetryState.from_json(json.loads(row["state"])).streams.values())
    harness.close()
    ledger = {r["period_start"]: r for r in harness.table("periods") if r["grain"] == "hour"}
    assert (ledger[T0]["lost"], ledger[T0]["dq_status"]) == (5, "warning")
    when = at + timedelta(minutes=160)
    _write(harness, "core", "c5.flows.pcap", [(_us(when), _tick(when, sequence=4))])
    harness.ingest()
    assert _lost(harness) == {("edge", T0 + timedelta(minutes=20)): 5}  # once


def test_a_flow_over_an_hour_boundary_is_late_only_in_its_closed_share(spark, tmp_path):
    """Lateness is judged per share: the shares in a closed hour are late, the others on time."""
    harness = Harness(tmp_path, spark, local_networks=LOCAL)
    first = T0 + timedelta(hours=1, minutes=30)
    _write(harness, "edge", "a.flows.pcap", [(_us(first), _tick(first))])
    harness.ingest()  # the export time moves the clock to 11:30: hour 10 is closed
    start, end = T0 + timedelta(minutes=55), T0 + timedelta(hours=1, minutes=5)
    flow = [_flow("10.1.0.5", "198.51.100.9", 1200, 12, start, end)]
    _write(harness, "edge", "b.flows.pcap", [(_us(first) + 1, fe.netflow5(flow, export_us=_us(first),
                                                                           uptime_ms=5_000, sequence=1))])
    result = harness.ingest()
    assert (result.packets_on_time, result.packets_late, result.bytes_on_time, result.bytes_late) == (6, 6, 600, 600)
    late = harness.table("late_packets")
    assert [(r["ts"], r["bytes"], r["packets"]) for r in late] == [(start, 600, 6)]


def test_a_neither_local_flow_is_one_reject_and_garbage_is_rejected_with_a_reason(spark, tmp_path):
    harness = Harness(tmp_path, spark, local_networks=LOCAL)
    at = T0 + timedelta(minutes=1)
    outside = [_flow("198.51.100.1", "203.0.113.9", 5000, 5, at, at + timedelta(minutes=20))]
    _write(harness, "edge", "a.flows.pcap", [
        (_us(at), fe.netflow5(outside, export_us=_us(at), uptime_ms=9_000_000)),
        (_us(at) + 1, b"\x00\x05garbage"),
    ])
    result = harness.ingest()
    assert (result.packets_on_time, result.records_rejected) == (0, 2)
    reasons = sorted(r["reason"] for r in harness.table("rejects"))
    assert reasons[1].startswith("neither address is in local_networks (198.51.100.1 → 203.0.113.9)")
    assert "netflow" in reasons[0].lower() or "datagram" in reasons[0].lower()
