"""Captures go through the same ingest path as text: same tables, same exactly-once rules, directions."""

from __future__ import annotations

from datetime import datetime, timedelta, timezone

from tests.support import capture_factory as cf
from tests.support.harness import Harness

UTC = timezone.utc
T0 = datetime(2026, 11, 1, 10, tzinfo=UTC)


def _ns(ts: datetime) -> int:
    return int(ts.timestamp()) * 1_000_000_000 + ts.microsecond * 1000


def _frames():
    """Out, in, internal, neither-local and non-IP frames, over two hours."""
    payload = b"x" * 100
    return [
        cf.Packet(cf.ethernet(cf.ipv4("10.1.0.5", "192.0.2.80", 6, cf.tcp(40000, 443, payload))), _ns(T0)),
        cf.Packet(cf.ethernet(cf.ipv4("192.0.2.80", "10.1.0.5", 6, cf.tcp(443, 40000, payload * 3))),
                  _ns(T0 + timedelta(minutes=1))),
        cf.Packet(cf.ethernet(cf.ipv4("10.1.0.5", "10.1.0.6", 17, cf.udp(53, 5353, payload))),
                  _ns(T0 + timedelta(minutes=2))),
        cf.Packet(cf.ethernet(cf.ipv4("198.51.100.1", "203.0.113.9", 17, cf.udp(1, 2, payload))),
                  _ns(T0 + timedelta(minutes=3))),
        cf.Packet(cf.ethernet(b"\x00" * 46, ethertype=0x0806), _ns(T0 + timedelta(minutes=4))),
        cf.Packet(cf.ethernet(cf.ipv6("2001:db8:1::5", "2001:db8:ffff::1", 17, cf.udp(1000, 53, payload)),
                              ethertype=0x86DD), _ns(T0 + timedelta(hours=2, minutes=1))),
    ]


def test_pcap_is_ingested_with_directions_and_counted_once(spark, tmp_path):
    harness = Harness(tmp_path, spark, local_networks="10.1.0.0/16,2001:db8:1::/48")
    capture = cf.pcap(_frames(), snaplen=96)  # cut frames still count their full IP length
    _write(harness, "tap1", "morning.pcap", capture)
    result = harness.ingest()
    assert (result.packets_on_time, result.records_rejected, result.ticks) == (4, 2, 0)
    packets = sorted(harness.table("packets"), key=lambda r: r["ts"])
    assert [(r["local_ip"], r["remote_ip"], r["direction"], r["bytes"], r["source"]) for r in packets] == [
        ("10.1.0.5", "192.0.2.80", "out", 140, "tap1"),
        ("10.1.0.5", "192.0.2.80", "in", 340, "tap1"),
        ("10.1.0.5", "10.1.0.6", "internal", 128, "tap1"),
        ("2001:db8:1::5", "2001:db8:ffff::1", "out", 148, "tap1"),
    ]
    reasons = sorted(r["reason"] for r in harness.table("rejects"))
    assert reasons[0].startswith("neither address is in local_networks") and "not an IP packet" in reasons[1]
    harness.close()
    hourly = {r["local_ip"] + ">" + r["remote_ip"]: r for r in harness.table("hourly") if r["hour"] == T0}
    row = hourly["10.1.0.5>192.0.2.80"]
    assert (row["bytes"], row["bytes_in"], row["bytes_out"], row["status"]) == (480, 340, 140, "final")
    # The same capture delivered again under another name is a recorded duplicate.
    _write(harness, "tap1", "copy-of-morning.pcap", capture)
    again = harness.ingest()
    assert (again.packets_on_time, again.duplicate_files) == (0, 1)


def test_pcapng_with_two_interfaces_is_ingested(spark, tmp_path):
    harness = Harness(tmp_path, spark, local_networks="10.1.0.0/16")
    frame = cf.ethernet(cf.ipv4("10.1.0.5", "192.0.2.80", 6, cf.tcp(1, 2, b"y" * 60)))
    raw = cf.ipv4("192.0.2.80", "10.1.0.5", 6, cf.tcp(2, 1, b"z" * 10))
    capture = cf.pcapng(cf.Section([cf.Interface(1), cf.Interface(101, tsresol=9)], [
        cf.Enhanced(0, cf.Packet(frame, _ns(T0))), cf.Enhanced(1, cf.Packet(raw, _ns(T0 + timedelta(seconds=5))))]))
    _write(harness, "tap2", "two.pcapng", capture)
    result = harness.ingest()
    assert (result.packets_on_time, result.records_rejected) == (2, 0)
    assert sorted((r["direction"], r["bytes"]) for r in harness.table("packets")) == [("in", 50), ("out", 100)]


def _write(harness: Harness, source: str, name: str, data: bytes) -> None:
    folder = harness.root / "inbox" / source
    folder.mkdir(parents=True, exist_ok=True)
    (folder / name).write_bytes(data)


def test_a_big_capture_is_split_between_tasks_and_counts_every_frame_once(spark, tmp_path):
    """A capture of two split pieces or more is decoded by one task per core; the tables hold exactly what
    one whole-file parse gives: every frame once, and the file's own problem (a cut last record) once."""
    from traffic.io.inbox import MIN_SPLIT_BYTES
    from traffic.app.runs import ingest
    from traffic.io.capture import parse_capture

    harness = Harness(tmp_path, spark, local_networks="10.1.0.0/16,2001:db8:1::/48")
    pattern = _frames()
    frames = [cf.Packet(pattern[i % len(pattern)].frame, _ns(T0) + i * 40_000_000) for i in range(80_000)]
    capture = cf.pcap(frames, snaplen=96)[:-5]
    assert len(capture) >= 2 * MIN_SPLIT_BYTES
    _write(harness, "tap1", "big.pcap", capture)
    said = []
    result = ingest(harness.settings, lambda: spark, said.append)
    assert any("2 parse task(s) over 1 file(s)" in line for line in said), said
    whole = parse_capture(capture, source="tap1", input_file="tap1/big.pcap",
                          local_networks=["10.1.0.0/16", "2001:db8:1::/48"]).to_pylist()
    packets = [r for r in whole if r["kind"] == "packet"]
    assert (result.packets_on_time, result.records_rejected) == (len(packets), len(whole) - len(packets))
    assert sum(r["reason"].startswith("capture truncated") for r in harness.table("rejects")) == 1

    def totals(rows):
        sums = {}
        for r in rows:
            key = (r["local_ip"], r["remote_ip"], r["direction"])
            sums[key] = sums.get(key, 0) + r["bytes"]
        return sums

    assert totals(harness.table("packets")) == totals(packets)


def test_records_appended_to_a_counted_capture_are_counted_once(spark, tmp_path):
    """A capture that grows after it was counted (a capture box still writing it): the next batch counts
    only the records after the counted end, read from the file header on; nothing is rejected."""
    harness = Harness(tmp_path, spark, local_networks="10.1.0.0/16,2001:db8:1::/48")
    out, inbound, internal, _neither, _arp, v6 = _frames()
    frames = [out, inbound, internal, v6]  # every one a packet: nothing is rejected by design
    first = cf.pcap(frames[:2], snaplen=96)
    _write(harness, "tap1", "growing.pcap", first)
    assert harness.ingest().packets_on_time == 2
    grown = cf.pcap(frames, snaplen=96)
    assert grown.startswith(first)
    _write(harness, "tap1", "growing.pcap", grown)
    again = harness.ingest()
    assert (again.packets_on_time, again.records_rejected) == (2, 0)
    counted = sorted((r["local_ip"], r["remote_ip"], r["direction"]) for r in harness.table("packets"))
    assert counted == [("10.1.0.5", "10.1.0.6", "internal"), ("10.1.0.5", "192.0.2.80", "in"),
                       ("10.1.0.5", "192.0.2.80", "out"), ("2001:db8:1::5", "2001:db8:ffff::1", "out")]
