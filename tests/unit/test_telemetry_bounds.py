"""§7a "Bounds" in ``read_telemetry``: one record costs at most itself.

A flow longer than ``max_flow_duration`` is rejected before it is split into pane shares (one IPFIX
record ending in 2106 became 8.3 M shares, 915 MB); bytes or packets whose value × sampling rate
would pass 63 bits are rejected, never wrapped (2**62 × 4 was counted as 0); the other records of
the same datagram count. Data waiting for its template expires by the watermark too.
"""

from __future__ import annotations

import resource
from datetime import datetime, timezone

import pyarrow.compute as pc

from tests.support import flow_encoder as fe
from traffic.io.telemetry import TelemetryRules, TelemetryState, expire_waiting_by, read_telemetry

US = 1_000_000
HOUR = 3600 * US
T0 = int(datetime(2026, 11, 1, 10, tzinfo=timezone.utc).timestamp()) * US
ROUTER = "192.0.2.7"
TEMPLATE = [(8, 4), (12, 4), (7, 2), (11, 2), (4, 1), (1, 8), (2, 8), (152, 8), (153, 8)]
RULES = TelemetryRules(local_networks=("10.1.0.0/16",))


def _record(start_us: int, end_us: int, size: int = 1000, packets: int = 10, src: str = "10.1.0.5") -> bytes:
    return fe.record(TEMPLATE, {8: src, 12: "198.51.100.9", 7: 40000, 11: 443, 4: 6, 1: size, 2: packets,
                                152: start_us // 1000, 153: end_us // 1000})


def _file(records: list[bytes], *, at: int = T0, template: bool = True, sequence: int = 0) -> bytes:
    sets = ([fe.template_set({256: TEMPLATE})] if template else []) + [fe.data_set(256, records)]
    return fe.collector_file([(at, ROUTER, 40000, fe.ipfix(sets, export_s=at // US, sequence=sequence))])


def _read(content: bytes, rules: TelemetryRules = RULES, state: TelemetryState = TelemetryState()):
    return read_telemetry([(content, "a.flows.pcap", 0)], state, source="edge", rules=rules)


def _kinds(parsed, kind: str):
    return parsed.filter(pc.equal(parsed.column("kind"), kind))


def test_a_flow_ending_in_2106_is_one_reject_not_millions_of_shares():
    """Before: 8.3 M pane shares (915 MB, 1.1 GB resident). Now one reject, and the datagram's other
    record counts; memory stays where it was."""
    year_2106 = int(datetime(2106, 2, 7, tzinfo=timezone.utc).timestamp()) * US
    before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    out = _read(_file([_record(T0 - HOUR, year_2106), _record(T0 - 60 * US, T0)]))
    grown_mb = (resource.getrusage(resource.RUSAGE_SELF).ru_maxrss - before) / 1024
    assert out.parsed.num_rows <= 3, out.parsed.num_rows  # one share, one reject (and a tick)
    rejects = _kinds(out.parsed, "reject").to_pylist()
    assert len(rejects) == 1 and "longer than max_flow_duration (192.0 hours)" in rejects[0]["reason"], rejects
    assert "2106-02-07" in rejects[0]["record"]
    packets = _kinds(out.parsed, "packet").to_pylist()
    assert [(r["bytes"], r["packets"]) for r in packets] == [(1000, 10)]
    assert grown_mb < 100, grown_mb


def test_max_flow_duration_is_a_setting_and_a_flow_within_it_is_split():
    """A 7-day flow (softflowd's default maximum life) is 2,016 exact shares under the default;
    with ``max_flow_duration`` = 1 day it is one reject."""
    week = 7 * 24 * HOUR
    out = _read(_file([_record(T0 - week, T0, size=10**9, packets=10**6)]))
    packets = _kinds(out.parsed, "packet")
    assert packets.num_rows == 2016 and pc.sum(packets.column("bytes")).as_py() == 10**9
    strict = TelemetryRules(local_networks=RULES.local_networks, max_flow_duration_us=24 * HOUR)
    out = _read(_file([_record(T0 - week, T0, size=10**9, packets=10**6)]), strict)
    assert _kinds(out.parsed, "packet").num_rows == 0
    assert "the flow lasts 168.0 hours, longer than max_flow_duration (24.0 hours)" in \
        _kinds(out.parsed, "reject").column("reason")[0].as_py()


def test_bytes_times_rate_that_would_wrap_is_one_reject():
    """Before: 2**62 bytes × rate 4 wrapped to 0 and was counted silently."""
    rules = TelemetryRules(local_networks=RULES.local_networks, sampling_rate=4)
    # (1,024 bytes a packet: plausible packets, only the weighted value is out of bounds)
    out = _read(_file([_record(T0 - 60 * US, T0, size=2**62, packets=2**52),
                       _record(T0 - 60 * US, T0, size=2**61, packets=2**61),
                       _record(T0 - 60 * US, T0, size=1500, packets=1)]), rules)
    reasons = _kinds(out.parsed, "reject").column("reason").to_pylist()
    assert reasons == ["bytes × sampling rate 4 would overflow 63 bits"] * 2, reasons
    packets = _kinds(out.parsed, "packet").to_pylist()
    assert [(r["bytes"], r["packets"], r["sampling_rate"]) for r in packets] == [(6000, 4, 4)]


def test_the_largest_weighted_value_that_fits_is_counted():
    """Where a link could carry it (600 days at 1.6 Tb/s is 1.04 × 10**19 bytes, with a max_flow_duration of
    10 years), the largest value × rate that fits 63 bits counts, exactly, over its pane shares."""
    days = 86_400 * US
    rules = TelemetryRules(local_networks=RULES.local_networks, sampling_rate=2, max_flow_duration_us=3650 * days)
    out = _read(_file([_record(T0 - 600 * days, T0, size=(2**63 - 1) // 2, packets=2**52)]), rules)
    assert pc.sum(_kinds(out.parsed, "packet").column("bytes")).as_py() == 2**63 - 2


def test_a_rate_above_2_31_is_one_reject_not_a_failed_read():
    """Before: the int32 cast of the rate raised, and the whole read failed."""
    rules = TelemetryRules(local_networks=RULES.local_networks, sampling_rate=2**31)
    out = _read(_file([_record(T0 - 60 * US, T0, size=1, packets=1)]), rules)
    assert _kinds(out.parsed, "reject").column("reason").to_pylist() == ["sampling rate 2147483648 is above 2**31 − 1"]


def test_waiting_data_expires_by_the_watermark_even_when_its_source_sends_nothing_newer():
    """Data without its template waits; before, it waited until its own source sent something newer.
    Now the watermark passed in (the batch's clock) expires it ``template_wait`` later."""
    first = _read(_file([_record(T0 - 60 * US, T0)], template=False))
    assert len(first.state.waiting) == 1
    rules = TelemetryRules(local_networks=RULES.local_networks, template_wait_us=HOUR, watermark_us=T0 + HOUR - 1)
    kept = read_telemetry([], first.state, source="edge", rules=rules)
    assert len(kept.state.waiting) == 1 and kept.parsed.num_rows == 0  # not yet: less than template_wait
    rules = TelemetryRules(local_networks=RULES.local_networks, template_wait_us=HOUR, watermark_us=T0 + HOUR + 1)
    gone = read_telemetry([], first.state, source="edge", rules=rules)
    assert len(gone.state.waiting) == 0
    assert [r["reason"] for r in _kinds(gone.parsed, "reject").to_pylist()] == \
        ["ipfix data set for template 256 (domain 0): its template never arrived"]


def test_expire_waiting_by_takes_the_later_of_the_newest_datagram_and_the_watermark():
    waiting = _read(_file([_record(T0 - 60 * US, T0)], template=False)).state.waiting
    for newest, watermark, expired in [(None, None, 0), (T0 + 2 * HOUR, None, 1), (None, T0 + 2 * HOUR, 1),
                                       (T0, T0 + 2 * HOUR, 1), (T0 + 2 * HOUR, T0, 1), (T0, T0 + HOUR // 2, 0)]:
        rejects, kept = expire_waiting_by(waiting, newest_us=newest, watermark_us=watermark, template_wait_us=HOUR,
                                          source="edge")
        assert (rejects.num_rows, len(kept)) == (expired, 1 - expired), (newest, watermark)


def test_sums_of_parts_are_checked_never_wrapped():
    """Arrow's sum wraps (2**62 + 2**62 is −2**63); ``group_sums`` raises ``SumOverflow`` instead, and a sum
    that fits exactly is exact, even past the cheap bound's guess."""
    import pyarrow as pa
    import pytest

    from traffic.accounting.parts import SumOverflow, group_sums

    table = pa.table({"k": ["a", "a", "b", "b"], "v": pa.array([2**62, 2**62 - 1, 2**62, -(2**62)], pa.int64())})
    sums = group_sums(table, ["k"], {"v": ("v", "sum"), "n": ([], "count_all")})
    assert sums.to_pylist() == [{"k": "a", "v": 2**63 - 1, "n": 2}, {"k": "b", "v": 0, "n": 2}]
    assert sums.schema.field("v").type == pa.int64()
    over = pa.table({"k": ["a", "a", "b"], "v": pa.array([2**62, 2**62, 1], pa.int64())})
    with pytest.raises(SumOverflow, match=r"^the sum of v for k a is 9223372036854775808, past 2\*\*63 − 1"):
        group_sums(over, ["k"], {"v": ("v", "sum")})


def test_more_than_the_fastest_link_carries_is_one_reject_and_the_bound_itself_counts():
    """Before: 10**15 bytes in 1 s passed (it fits 63 bits) and its sums with other such records stopped
    the batch's commit. §7a: no record carries more than ``max_flow_bps`` (1.6 Tb/s, 1.6TbE) over
    the longer of its duration and one 5-minute pane: 2 * 10**11 bytes a second, 6 * 10**13 in a pane."""
    pane_bytes = 1_600_000_000_000 * 300 // 8
    out = _read(_file([_record(T0 - US, T0, size=10**15, packets=10**12),
                       _record(T0 - US, T0, size=pane_bytes, packets=10**9),
                       _record(T0 - US, T0, size=pane_bytes + 1, packets=10**9),
                       _record(T0 - 600 * US, T0, size=2 * pane_bytes, packets=10**9)]))
    reasons = _kinds(out.parsed, "reject").column("reason").to_pylist()
    assert reasons == ["1,000,000,000,000,000 bytes in 1 s is more than max_flow_bps (1.6 Tb/s, the fastest "
                       "link) carries in 300 s",
                       "60,000,000,000,001 bytes in 1 s is more than max_flow_bps (1.6 Tb/s, the fastest "
                       "link) carries in 300 s"], reasons
    kept = _kinds(out.parsed, "packet")
    assert pc.sum(kept.column("bytes")).as_py() == 3 * pane_bytes  # the bound itself counts (and twice it in 600 s)


def test_more_packets_than_minimum_frames_at_the_fastest_link_is_one_reject():
    """Packets: at most ``max_flow_bps`` / (84 bytes × 8) a second (minimum Ethernet frames with
    preamble and gap): 1.6 Tb/s is 2,380,952,380 a second, 714,285,714,285 in a pane. The weighted
    count (× sampling rate) is what is bounded, and the setting moves the bound."""
    pane_packets = 1_600_000_000_000 * 300 // (84 * 8)
    rules = TelemetryRules(local_networks=RULES.local_networks, sampling_rate=1000)
    out = _read(_file([_record(T0 - US, T0, size=pane_packets * 64 // 1000, packets=pane_packets // 1000),
                       _record(T0 - US, T0, size=10**9, packets=pane_packets // 1000 + 1)]), rules)
    assert _kinds(out.parsed, "reject").column("reason").to_pylist() == [
        "714,285,715,000 packets in 1 s is more than max_flow_bps (1.6 Tb/s, the fastest link) carries in 300 s "
        "(at 84 bytes a packet)"]
    assert _kinds(out.parsed, "packet").column("packets").to_pylist() == [pane_packets // 1000 * 1000]
    slow = TelemetryRules(local_networks=RULES.local_networks, max_flow_bps=10_000_000_000)
    out = _read(_file([_record(T0 - US, T0, size=375_000_000_001, packets=10**9)]), slow)
    assert _kinds(out.parsed, "reject").column("reason").to_pylist() == [
        "375,000,000,001 bytes in 1 s is more than max_flow_bps (10 Gb/s) carries in 300 s"]


def test_max_flow_bps_is_a_setting_in_bits_per_second_within_its_range():
    import pytest

    from traffic.core.settings import SettingsError, build_settings

    assert build_settings({}).max_flow_bps == 1_600_000_000_000
    assert [build_settings({"max_flow_bps": v}).max_flow_bps for v in ("400G", "1.6T", "100 Mb/s", 10**9)] == \
        [400 * 10**9, 1_600_000_000_000, 10**8, 10**9]
    for bad in ("2P", "999k", "fast", True):
        with pytest.raises(SettingsError, match=r"^max_flow_bps: "):
            build_settings({"max_flow_bps": bad})


def test_a_batch_whose_totals_pass_64_bits_stops_with_one_line_naming_the_batch_and_its_largest_source():
    """Records within the bound can still add up past 2**63 − 1 when a source claims more than its links carry
    (67 full-rate 8-day records). Before: ``_commit`` raised OverflowError converting the ``batches`` row, after
    every other write, on every retry. Now one line, before anything is written; totals that fit pass."""
    import pytest

    from traffic.accounting import batch_tasks as B
    from traffic.accounting.ingest.batch import BatchTally
    from traffic.accounting.ingest.tally import totals_fit
    from traffic.accounting.parts import SumOverflow

    record = 200_000_000_000 * 8 * 86_400  # one 8-day record at 1.6 Tb/s: 1.4 × 10**17 bytes
    summary = [{"fate": B.ON_TIME, "source": "edge-a", "packets": 10**6, "bytes": 60 * record},
               {"fate": B.ON_TIME, "source": "edge-b", "packets": 10**6, "bytes": 7 * record},
               {"fate": B.LATE, "source": "edge-b", "packets": 1, "bytes": 1}]

    def tally(rows):
        total = {fate: {what: sum(r[what] for r in rows if r["fate"] == fate) for what in ("packets", "bytes")}
                 for fate in (B.ON_TIME, B.LATE)}
        return BatchTally({}, {f: t["packets"] for f, t in total.items()}, {f: t["bytes"] for f, t in total.items()},
                      [], None, None, rows)

    with pytest.raises(SumOverflow) as raised:
        totals_fit(12, tally(summary))
    message = str(raised.value)
    assert "\n" not in message and message.startswith(
        f"batch 12: its bytes on time add up to {67 * record:,}, past 2**63 − 1"), message
    assert f"source edge-a has the most ({60 * record:,})" in message and "max_flow_bps" in message
    totals_fit(12, tally(summary[1:]))  # 7 such records fit
