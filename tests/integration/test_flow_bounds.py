"""§7a "Bounds" through the real ingest: one record costs at most itself, and no sum wraps.

Before: one IPFIX record ending in 2106 became 8.3 M raw rows; 2**62 bytes × rate 4 was counted
as 0; two records of 2**62 bytes made an hourly row of −9.2 EB. Now each is one reject (the rest
of the datagram counts): the records of a pair whose sum would pass 2**63 − 1 too.
"""

from __future__ import annotations

from datetime import datetime, timedelta, timezone

import pyarrow as pa
import pytest

from tests.support import flow_encoder as fe
from tests.support.harness import Harness
from traffic.accounting.bills import account_series, final_panes
from traffic.accounting.panes import Mapping, pane_totals
from traffic.accounting.parts import SumOverflow
from traffic.core.billing import BillingPeriod

UTC = timezone.utc
T0 = datetime(2026, 11, 1, 10, tzinfo=UTC)
US = 1_000_000
ROUTER = "192.0.2.7"
LOCAL = "10.1.0.0/16"
TEMPLATE = [(8, 4), (12, 4), (7, 2), (11, 2), (4, 1), (1, 8), (2, 8), (152, 8), (153, 8)]


def _us(ts: datetime) -> int:
    return int(ts.timestamp()) * US + ts.microsecond


def _record(start: datetime, end: datetime, size: int, packets: int, src: str = "10.1.0.5") -> bytes:
    return fe.record(TEMPLATE, {8: src, 12: "198.51.100.9", 7: 40000, 11: 443, 4: 6, 1: size, 2: packets,
                                152: _us(start) // 1000, 153: _us(end) // 1000})


def _deliver(harness: Harness, records: list[bytes], at: datetime, name: str = "a.flows.pcap") -> None:
    folder = harness.settings.inbox / "edge"
    folder.mkdir(parents=True, exist_ok=True)
    message = fe.ipfix([fe.template_set({256: TEMPLATE}), fe.data_set(256, records)], export_s=_us(at) // US)
    (folder / name).write_bytes(fe.collector_file([(_us(at), ROUTER, 40000, message)]))


def test_out_of_bounds_records_are_one_reject_each_and_the_rest_counts(spark, tmp_path):
    harness = Harness(tmp_path, spark, local_networks=LOCAL, sampling_rates="edge=4")
    at = T0 + timedelta(minutes=20)
    _deliver(harness, [
        _record(at - timedelta(minutes=1), datetime(2106, 2, 7, tzinfo=UTC), 1000, 10),  # 80 years
        _record(at - timedelta(minutes=1), at, 2**62, 2**52),  # × 4 would wrap to 0
        _record(at - timedelta(minutes=1), at, 1500, 1, src="10.1.0.6"),
    ], at)
    result = harness.ingest()
    assert (result.packets_on_time, result.bytes_on_time, result.records_rejected) == (4, 6000, 2)
    reasons = sorted(r["reason"] for r in harness.table("rejects"))
    assert reasons[0] == "bytes × sampling rate 4 would overflow 63 bits"
    assert reasons[1].startswith("the flow lasts ") and "longer than max_flow_duration (192.0 hours)" in reasons[1]
    assert [(r["local_ip"], r["bytes"], r["packets"]) for r in harness.table("packets")] == [("10.1.0.6", 6000, 4)]


def test_a_pair_whose_hourly_sum_would_pass_63_bits_costs_only_its_records(spark, tmp_path):
    """250 five-minute records of one pair, each at the fastest link the settings allow (1 Pb/s: 3.75e16 bytes
    in 300 s, so each passes every per-record bound), add up past 2**63 − 1 for the pair's hour. Before: an
    hourly row of −9.2 EB; then the sum raised ``SumOverflow`` and stopped the batch, and every later batch,
    since the file stayed in the inbox. Now those records are rejects with the reason; the rest counts."""
    harness = Harness(tmp_path, spark, local_networks=LOCAL, max_flow_bps="1P")
    at = T0 + timedelta(minutes=20)
    full = 10**15 // 8 * 300  # bytes a 1 Pb/s link carries in 300 s
    packets = 2**37  # within the bytes-per-packet bound (524,280) and the minimum-frame packet rate
    assert full * 250 > 2**63 - 1
    _deliver(harness, [_record(at - timedelta(minutes=5), at, full, packets) for _ in range(250)]
             + [_record(at - timedelta(minutes=1), at, 1500, 1, src="10.1.0.6")], at)
    result = harness.ingest()
    assert (result.packets_on_time, result.bytes_on_time, result.records_rejected) == (1, 1500, 250)
    rejects = harness.table("rejects")
    assert {r["reason"] for r in rejects} == {"the pair's total for the hour would pass 2**63 − 1 bytes: a 64-bit "
                                              "sum cannot hold it, so this record is not counted"}
    assert all("10.1.0.5" in r["record"] for r in rejects)
    assert [(r["local_ip"], r["bytes"], r["packets"]) for r in harness.table("hourly")] == [("10.1.0.6", 1500, 1)]
    # The file is counted, not retried: the next batch reads only what is new.
    later = at + timedelta(minutes=5)
    _deliver(harness, [_record(later - timedelta(minutes=1), later, 700, 2)], later, name="b.flows.pcap")
    second = harness.ingest()
    assert (second.packets_on_time, second.bytes_on_time, second.records_rejected) == (2, 700, 0)


def test_bill_sums_that_would_pass_63_bits_fail_with_one_line_never_wrap():
    """Two final panes of 2**62 bytes for one account and pane (two sources): Arrow's sum wrapped them to
    −9.2 EB, a negative bill. Now the bill stops with one line (``SumOverflow``); nothing wraps."""
    start = datetime(2026, 11, 1, tzinfo=UTC)
    period = BillingPeriod("2026-11", start, start + timedelta(hours=1))
    rows = pa.table({"pane_start": pa.array([start, start], pa.timestamp("us", tz="UTC")),
                     "source": ["edge", "core"], "account": ["acme"] * 2, "direction": ["in"] * 2,
                     "mapping_version": ["v1"] * 2, "bytes": pa.array([2**62, 2**62], pa.int64())})
    with pytest.raises(SumOverflow, match=r"^the sum of bytes for pane_start 2026-11-01 00:00:00\+00:00, account acme"):
        final_panes(None, period, rows)
    with pytest.raises(SumOverflow, match=r"^the sum of bytes for account acme, direction in, index 0 is "
                                          r"9223372036854775808, past 2\*\*63 − 1"):
        account_series(rows.drop_columns(["source", "mapping_version"]), period)
    # Sums that fit are what they were.
    fits = rows.set_column(rows.schema.get_field_index("bytes"), "bytes", pa.array([2**61, 2**61], pa.int64()))
    assert final_panes(None, period, fits).column("bytes").to_pylist() == [2**62]


def test_spark_sums_of_panes_raise_on_overflow_because_ansi_is_on(spark):
    """The freeze sums packets into panes with Spark (``panes.pane_totals``). Spark's sum of longs
    wraps unless ANSI mode is on: the session the project builds (``runtime.spark.build_spark``,
    Spark 4's default, not overridden) has it on, so an overflowing pane fails the job loudly."""
    from pyspark.errors import ArithmeticException

    assert spark.conf.get("spark.sql.ansi.enabled") == "true"
    at = datetime(2026, 11, 1, 10, tzinfo=UTC)
    packets = spark.createDataFrame([(at, "edge", "10.1.0.5", "out", 2**62, 1), (at, "edge", "10.1.0.5", "out", 2**62, 1)],
                                    "ts timestamp, source string, local_ip string, direction string, bytes long, "
                                    "packets long")
    with pytest.raises(ArithmeticException, match="ARITHMETIC_OVERFLOW"):
        pane_totals(packets, Mapping(), "final").collect()
    # The evidence that ANSI is what does it: without it, the same sum wraps to −9.2 EB.
    spark.conf.set("spark.sql.ansi.enabled", "false")
    try:
        (row,) = pane_totals(packets, Mapping(), "final").collect()
        assert row["bytes"] == -(2**63)
    finally:
        spark.conf.set("spark.sql.ansi.enabled", "true")


def test_the_flow_bound_settings_reach_the_ingest_tasks(spark, tmp_path):
    """``max_flow_duration`` and ``max_flow_bps`` as set, not their defaults, judge the records in the Spark tasks
    (they were missing from what the driver hands the executors: every warehouse ran with the defaults)."""
    harness = Harness(tmp_path, spark, local_networks=LOCAL, max_flow_duration="1h", max_flow_bps="1G")
    at = T0 + timedelta(minutes=20)
    _deliver(harness, [
        _record(at - timedelta(hours=2), at, 1000, 10),  # 2 h: past 1 h, far within the 8-day default
        _record(at - timedelta(minutes=1), at, 10**11, 10**8),  # 100 GB in 300 s: past 1 Gb/s, within 1.6 Tb/s
        _record(at - timedelta(minutes=1), at, 1500, 1, src="10.1.0.6"),
    ], at)
    result = harness.ingest()
    assert (result.packets_on_time, result.bytes_on_time, result.records_rejected) == (1, 1500, 2)
    reasons = sorted(r["reason"] for r in harness.table("rejects"))
    assert reasons[0].startswith("100,000,000,000 bytes in ") and "max_flow_bps (1 Gb/s" in reasons[0], reasons
    assert reasons[1].startswith("the flow lasts ") and "longer than max_flow_duration (1.0 hours)" in reasons[1]
