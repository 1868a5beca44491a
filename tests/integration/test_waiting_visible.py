"""Data waiting for its template (DESIGN §7a, issue 34 item 9): it expires by the watermark, not only by newer
datagrams of its own source, and it is visible in ``traffic status`` and the metrics meanwhile."""

from __future__ import annotations

import json
from datetime import datetime, timedelta, timezone

from tests.support import flow_encoder as fe
from tests.support.harness import Harness, tick_line
from traffic.io.telemetry import TelemetryState
from traffic.reporting import metrics
from traffic.reporting.report import status

UTC = timezone.utc
US = 1_000_000
T0 = datetime(2026, 11, 3, 10, tzinfo=UTC)
LOCAL = "10.1.0.0/16,2001:db8:1::/48"
V6 = [(27, 16), (28, 16), (7, 2), (11, 2), (4, 1), (1, 8), (2, 8), (152, 8), (153, 8)]


def _us(ts: datetime) -> int:
    return int(ts.timestamp()) * US


def _waiting_file(harness: Harness, at: datetime) -> int:
    """A collector file of source ``quiet``: one IPFIX data set whose template never comes; returns its size."""
    flow = fe.flow_values(fe.Flow("2001:db8:ffff::1", "2001:db8:1::5", 53, 5353, 17, 600, 3, _us(at), _us(at)))
    data = fe.data_set(300, [fe.record(V6, flow)])
    folder = harness.settings.inbox / "quiet"
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "q.flows.pcap").write_bytes(fe.collector_file(
        [(_us(at), "192.0.2.8", 4739, fe.ipfix([data], export_s=_us(at) // US, domain=1))]))
    return len(data) - 4  # the set's records, after its header


def _samples(warehouse) -> dict:
    return {(s.name, tuple(sorted(s.labels.items()))): s.value for family in metrics.collect(warehouse)
            for s in family.samples}


def test_waiting_data_expires_by_the_watermark_once_when_its_source_sends_nothing_more(spark, tmp_path):
    harness = Harness(tmp_path, spark, local_networks=LOCAL)
    at = T0 + timedelta(minutes=1)
    size = _waiting_file(harness, at)
    harness.deliver("r1", tick_line(at) + "\n")
    first = harness.ingest()
    assert first.records_rejected == 0
    # Visible while it waits: count, bytes and age per source, in `traffic status` and the metrics.
    info = status(harness.settings)
    assert info["waiting"] == {"quiet": {"sets": 1, "bytes": size, "oldest": at}}
    samples = _samples(harness.warehouse())
    assert samples[("traffic_flow_waiting_sets", (("source", "quiet"),))] == 1
    assert samples[("traffic_flow_waiting_bytes", (("source", "quiet"),))] == size
    assert samples[("traffic_flow_waiting_oldest_timestamp_seconds", (("source", "quiet"),))] == at.timestamp()

    # `quiet` sends nothing more; r1's clock moves 3 hours on, so the watermark passes its wait (1 h).
    harness.deliver("r1", tick_line(T0 + timedelta(hours=3)) + "\n")
    second = harness.ingest()
    assert harness.watermark > at + harness.settings.template_wait
    assert second.records_rejected == 1
    (reject,) = harness.table("rejects")
    assert (reject["source"], reject["input_file"], reject["batch_id"]) == ("quiet", "quiet/q.flows.pcap", 2)
    assert "its template never arrived" in reject["reason"]
    (row,) = [r for r in harness.table("flow_state") if r["source"] == "quiet"]
    assert len(TelemetryState.from_json(json.loads(row["state"])).waiting) == 0
    assert status(harness.settings)["waiting"] == {}
    samples = _samples(harness.warehouse())
    assert samples[("traffic_flow_waiting_sets", (("source", "quiet"),))] == 0  # still listed: a flow source
    assert ("traffic_flow_waiting_oldest_timestamp_seconds", (("source", "quiet"),)) not in samples

    # Counted once: a later batch rejects nothing more.
    harness.deliver("r1", tick_line(T0 + timedelta(hours=4)) + "\n")
    assert harness.ingest().records_rejected == 0
    assert len(harness.table("rejects")) == 1
    assert sum(b["records_rejected"] for b in harness.table("batches")) == 1
