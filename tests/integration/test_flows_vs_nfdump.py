"""Our flow ingest against nfdump and tshark, on real exports of the shared captures (DESIGN §7a).

softflowd and pmacctd turn the captures into NetFlow v5/v9/IPFIX and sFlow datagrams on loopback
(``tests/support/flow_tools.py``); the same datagrams are sent to ``traffic collect`` (whose files
our ingest reads) and to nfdump's collector. Over the whole run, our per-(src, dst) bytes and packets must equal
nfdump's, and equal the packet totals tshark reads in the original captures for unsampled exports.
Flow times are not compared (``softflowd -r`` dates flows by its own clock, docs/flow-tools.md): the
history and future bounds are widened as far as the settings allow (100 years) so every flow counts,
whenever it is stamped.

sFlow is compared on what each side counts: we count the sampled packet's IP length, nfdump the
sample's frame length, so our bytes equal tshark's IP totals of the capture and our packet counts
equal nfdump's; sampled at 1 in 10 both sides multiply by the rate.
"""

from __future__ import annotations

import socket
import time
from collections import Counter

import pytest

from tests.support import flow_encoder as fe
from tests.support import flow_tools as ft
from tests.support.flow_captures import (NFPROBE_ETHERNET, SFPROBE_ETHERNET, SHARED_CAPTURES, SOFTFLOWD_ETHERNET,
                                         differences, merger)
from tests.support.harness import Harness
from tests.support.requirements import folder_fixture
from traffic.app.collect import Collector, build_options
from traffic.core.settings import MAX_DURATION

pytestmark = [pytest.mark.slow]
#: The tests of the shared captures fail without them, with the reason (tests/support/requirements.py); the
#: encoder's test below needs none and runs either way.
shared_captures = folder_fixture(SHARED_CAPTURES, "shared_captures")

#: Every address is local, so each row's local_ip is the sender (internal traffic): (local, remote) = (src, dst).
EVERYTHING_LOCAL = "0.0.0.0/0,::/0"
#: The widest history and future bounds the settings take.
WIDEST = f"{MAX_DURATION.days}d"


@pytest.fixture(scope="module")
def merged(tmp_path_factory, shared_captures):
    """Per exporter, its captures merged into one file (built once, on first use)."""
    return merger(tmp_path_factory.mktemp("merged"))


def collect(inbox, datagrams, restart_after: int | None = None) -> None:
    """Send ``datagrams`` over UDP on 127.0.0.1 to a ``traffic collect`` (run in-process) writing into
    ``inbox``, as a router would; with ``restart_after`` the collector is stopped after that many and a
    new one takes the rest (templates must survive it)."""
    batches = [datagrams] if restart_after is None else [datagrams[:restart_after], datagrams[restart_after:]]
    for part in batches:
        port = ft.free_udp_port()
        collector = Collector(inbox, {"127.0.0.1": "exporter"}, build_options(listen=[f"127.0.0.1:{port}"],
                                                                              log_every=0), log=lambda _l: None)
        collector.start()
        try:
            with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as sender:
                for number, d in enumerate(part, start=1):
                    sender.sendto(d.payload, ("127.0.0.1", port))
                    deadline = time.monotonic() + 10
                    while collector.drain() < number:  # paced: one at a time, nothing dropped
                        assert time.monotonic() < deadline, f"the collector received {collector.totals()[0]} of {number}"
            collector.complete()
        finally:
            collector.close()


def ours(spark, tmp_path, datagrams, restart_after: int | None = None, **settings) -> tuple[dict, object]:
    """Our per-(src, dst) totals of the datagrams, sent to ``traffic collect`` and ingested in one batch."""
    harness = Harness(tmp_path / "ours", spark, local_networks=EVERYTHING_LOCAL, max_history=WIDEST,
                      max_future_skew=WIDEST, **settings)
    collect(harness.settings.inbox, datagrams, restart_after)
    assert len(list((harness.settings.inbox / "exporter").glob("*.flows.pcap"))) == (1 if restart_after is None else 2)
    result = harness.ingest()
    octets: Counter = Counter()
    packets: Counter = Counter()
    for row in harness.table("packets"):
        assert row["direction"] == "internal"
        octets[(row["local_ip"], row["remote_ip"])] += row["bytes"]
        packets[(row["local_ip"], row["remote_ip"])] += row["packets"]
    return {key: (octets[key], packets[key]) for key in octets}, result


@pytest.mark.parametrize("version", [5, 9, 10], ids=["v5", "v9", "ipfix"])
def test_softflowd_exports_count_as_nfdump_counts_them(version, spark, merged, tmp_path):
    capture = merged("softflowd", SOFTFLOWD_ETHERNET)
    datagrams = ft.export_capture(capture.path, "softflowd", version, tmp_path / "export")
    got, result = ours(spark, tmp_path, datagrams)
    assert result.records_rejected == 0 and result.packets_late == 0
    nfdump = ft.nfdump_totals(datagrams, "netflow", tmp_path)
    assert got == nfdump, f"(pair, ours, nfdump) that differ: {differences(got, nfdump)[:10]}"
    expected = capture.expected(ipv4_only=version == 5)
    assert got == expected, f"(pair, ours, tshark) that differ: {differences(got, expected)[:10]}"


def test_pmacct_ipfix_exports_count_as_nfdump_counts_them(spark, merged, tmp_path):
    capture = merged("nfprobe", NFPROBE_ETHERNET)
    datagrams = ft.export_capture(capture.path, "pmacct", 10, tmp_path / "export")
    got, result = ours(spark, tmp_path, datagrams)
    assert result.records_rejected == 0
    nfdump = ft.nfdump_totals(datagrams, "netflow", tmp_path)
    assert got == nfdump, f"(pair, ours, nfdump) that differ: {differences(got, nfdump)[:10]}"
    assert got == capture.expected(), differences(got, capture.expected())[:10]


@pytest.mark.parametrize("rate", [1, 10])
def test_pmacct_sflow_counts_ip_bytes_and_nfdumps_packets(rate, spark, merged, tmp_path):
    capture = merged("sfprobe", SFPROBE_ETHERNET)
    datagrams = ft.export_capture(capture.path, "pmacct", "sflow", tmp_path / "export", sampling_rate=rate)
    got, _ = ours(spark, tmp_path, datagrams)
    nfdump = ft.nfdump_totals(datagrams, "sflow", tmp_path)
    for totals in (got, nfdump):
        totals.pop(ft.SFLOW_FLUSH_PAIR, None)  # the harness's packets that push the last samples out
    assert {k: p for k, (_, p) in got.items()} == {k: p for k, (_, p) in nfdump.items()}
    if rate == 1:
        ip_totals = capture.ip_totals()
        assert got == ip_totals, f"(pair, ours, tshark) that differ: {differences(got, ip_totals)[:10]}"
    else:
        # Sampled: every count is a multiple of the rate, and the packets estimate the capture's.
        assert all(b % rate == 0 and p % rate == 0 for b, p in got.values())


def _encoded() -> tuple[list, list]:
    """The project encoder's NetFlow v5, v9 (IPv6) and IPFIX datagrams, and its sampled sFlow datagrams.

    IPFIX sends its template once, then data in a later datagram (nfcapd, like our collector, keeps it); v5
    says 1 in 10 in its header; a long v9 flow crosses an hour boundary; the sFlow agent samples 1 in 16; a
    garbage and a truncated datagram and a sequence gap follow the data."""
    t = 1_793_527_200 * 1_000_000  # 2026-11-01T10:00Z

    def flow(src, dst, size, packets, start_min, minutes, protocol=6) -> fe.Flow:
        return fe.Flow(src, dst, 40000, 443, protocol, size, packets, t + start_min * 60_000_000,
                       t + (start_min + minutes) * 60_000_000)

    v4 = [(8, 4), (12, 4), (7, 2), (11, 2), (4, 1), (1, 8), (2, 8), (152, 8), (153, 8)]
    v6 = [(27, 16), (28, 16), (7, 2), (11, 2), (4, 1), (1, 8), (2, 8), (21, 4), (22, 4)]
    export = t + 90 * 60_000_000
    netflow = [
        fe.netflow5([flow("10.1.0.5", "198.51.100.9", 15_000, 10, 1, 3), flow("198.51.100.9", "10.1.0.5", 900, 3, 2, 0)],
                    export_us=export, uptime_ms=7_200_000, sequence=0, sampling_interval=10),
        fe.netflow9([fe.template_set({260: v6}, ipfix=False), fe.data_set(260, [fe.record(v6, fe.flow_values(
            flow("2001:db8:1::5", "2001:db8:ffff::1", 123_456, 100, 50, 20), export_us=export, uptime_ms=7_200_000))])],
                    export_s=export // 1_000_000, uptime_ms=7_200_000, sequence=0, source_id=3),
        fe.ipfix([fe.template_set({256: v4})], export_s=export // 1_000_000, sequence=0),
        fe.ipfix([fe.data_set(256, [fe.record(v4, fe.flow_values(flow("10.1.0.6", "203.0.113.7", 4242, 7, 5, 1)))])],
                 export_s=export // 1_000_000, sequence=0),
    ]
    frames = [fe.sampled_frame(flow("10.1.0.7", "198.51.100.20", 0, 1, 0, 0), payload=size) for size in (60, 1500, 576)]
    sflow = [fe.sflow([fe.flow_sample([fe.raw_header(frame)], sampling_rate=16) for frame in frames], sequence=1)]
    # After the data: a garbage datagram, a truncated one, and IPFIX whose sequence skips 3 records.
    netflow += [b"\x00\x0agarbage!", netflow[0][:30],
                fe.ipfix([fe.data_set(256, [fe.record(v4, fe.flow_values(flow("10.1.0.6", "203.0.113.7", 100, 1, 7,
                                                                                    0)))])],
                         export_s=export // 1_000_000, sequence=4)]
    datagrams = [ft.Datagram(export + i, "127.0.0.1", 40000 + i, payload) for i, payload in enumerate(netflow)]
    return datagrams, [ft.Datagram(export + 10, "127.0.0.1", 41000, payload) for payload in sflow]


def test_the_project_encoders_datagrams_count_as_nfdump_counts_them(spark, tmp_path):
    """Our encoder is checked against an independent decoder too, not only against ours (tshark: test_flow_encoder_tshark)."""
    netflow, sflow = _encoded()
    # The collector is restarted between the IPFIX template and its data: the template outlives it.
    got, result = ours(spark, tmp_path / "netflow", netflow, restart_after=3)
    assert result.records_rejected == 2  # the garbage and the truncated datagram, each with its reason
    assert got == ft.nfdump_totals(netflow, "netflow", tmp_path)
    harness = Harness(tmp_path / "netflow" / "ours", spark, local_networks=EVERYTHING_LOCAL, max_history=WIDEST,
                      max_future_skew=WIDEST)
    # The IPFIX gap (3 records) waits for a late datagram to fill it (DESIGN §7a: reordering is not
    # loss): nothing is a minute past it yet, so nothing is lost after this batch ...
    assert sum(r["lost"] or 0 for r in harness.table("source_panes")) == 0
    # ... until the exporter's clock (its next datagram, exported two minutes after the gap was
    # received) moves the watermark a minute past it: the next batch decides the 3 records lost.
    later = int(time.time() * 1_000_000) + 120_000_000
    tick = fe.netflow5([fe.Flow("10.1.0.5", "198.51.100.9", 40000, 443, 6, 40, 1, later, later)], export_us=later,
                       uptime_ms=7_400_000, sequence=2)
    collect(harness.settings.inbox, [ft.Datagram(later, "127.0.0.1", 40100, tick)])
    harness.ingest()
    assert sum(r["lost"] or 0 for r in harness.table("source_panes")) == 3
    assert got[("10.1.0.5", "198.51.100.9")] == (150_000, 100)  # × the v5 header's 1 in 10
    got, _ = ours(spark, tmp_path / "sflow", sflow)
    theirs = ft.nfdump_totals(sflow, "sflow", tmp_path)
    assert {k: p for k, (_, p) in got.items()} == {k: p for k, (_, p) in theirs.items()} == {
        ("10.1.0.7", "198.51.100.20"): 3 * 16}
    assert got[("10.1.0.7", "198.51.100.20")][0] == (60 + 1500 + 576) * 16  # IP lengths × rate
