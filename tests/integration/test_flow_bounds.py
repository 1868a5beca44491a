"""§7a "Bounds" through the real ingest: one record costs at most itself, and no sum wraps.

Before: one IPFIX record ending in 2106 became 8.3 M raw rows; 2**62 bytes × rate 4 was counted
as 0; two records of 2**62 bytes made an hourly row of −9.2 EB. Now the first two are one reject
each (the rest of the datagram counts), and a sum that would pass 2**63 − 1 stops the batch with
one line saying which, committing nothing.
"""

from __future__ import annotations

from datetime import datetime, timedelta, timezone

import pytest

from tests.support import flow_encoder as fe
from tests.support.harness import Harness

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


def test_a_sum_that_would_pass_63_bits_stops_the_batch_with_one_line_and_commits_nothing(spark, tmp_path):
    """Two records of 2**62 bytes each fit; their hourly sum does not. Before: an hourly row of −9.2 EB."""
    harness = Harness(tmp_path, spark, local_networks=LOCAL)
    at = T0 + timedelta(minutes=20)
    _deliver(harness, [_record(at - timedelta(minutes=1), at, 2**62, 2**52),
                       _record(at - timedelta(minutes=2), at, 2**62, 2**52)], at)
    with pytest.raises(Exception) as failure:
        harness.ingest()
    # The first sum of the task that passes 63 bits says so, in one line (Spark wraps it in its trace).
    (line,) = [x for x in str(failure.value).splitlines() if x.startswith("traffic.accounting.parts.SumOverflow: ")]
    assert line.endswith("is 9223372036854775808, past 2**63 − 1: a 64-bit total would wrap, so nothing was summed "
                         "(records too large to add up)"), line
    assert line.startswith("traffic.accounting.parts.SumOverflow: the sum of bytes for "), line
    assert harness.table("hourly") == [] and harness.table("packets") == []
