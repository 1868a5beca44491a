"""Flow data waiting for its template in ``traffic status`` and the metrics (issue 34 item 9), on a warehouse
written with Arrow (no Spark)."""

from __future__ import annotations

import json
from datetime import datetime, timezone

import pyarrow as pa
from prometheus_client.parser import text_string_to_metric_families

from traffic.app.cli import main
from traffic.core.settings import load_settings
from traffic.reporting import metrics
from traffic.storage import state as st
from traffic.storage.warehouse import Warehouse

UTC = timezone.utc
T0 = datetime(2026, 11, 3, 10, tzinfo=UTC)


def _set(receive: datetime, size: int) -> dict:
    """A waiting set as ``TelemetryState.to_json`` writes it."""
    return {"receive_ts": int(receive.timestamp()) * 1_000_000, "exporter": "192.0.2.8", "format": "ipfix",
            "domain": 1, "template_id": 300, "body": "ab" * size, "export_ts": 0, "uptime_ms": -1, "number": 1,
            "offset": 16, "input_file": "quiet/q.flows.pcap"}


def _warehouse(tmp_path) -> Warehouse:
    settings = load_settings(environ={}, overrides={"warehouse": tmp_path / "warehouse", "inbox": tmp_path / "inbox",
                                                    "now": "2026-11-03T12:30:00+00:00"})
    warehouse = Warehouse(settings, engine="rs")
    warehouse.create_all()
    states = {"quiet": {"flows": {}, "waiting": [_set(T0, 40), _set(T0.replace(minute=20), 60)], "streams": []},
              "edge": {"flows": {}, "waiting": [], "streams": []}}
    table = warehouse.table("flow_state")
    table.append(pa.Table.from_pylist([{"source": s, "state": json.dumps(doc), "batch_id": 1}
                                       for s, doc in states.items()], schema=table.arrow_schema))
    return warehouse


def test_waiting_by_source_counts_sets_bytes_and_the_oldest(tmp_path):
    warehouse = _warehouse(tmp_path)
    assert st.waiting_by_source(warehouse) == {"quiet": {"sets": 2, "bytes": 100, "oldest": T0}}
    assert st.waiting_by_source(warehouse, every_source=True)["edge"] == {"sets": 0, "bytes": 0, "oldest": None}


def test_metrics_list_waiting_data_per_flow_source(tmp_path):
    samples = {(s.name, tuple(sorted(s.labels.items()))): s.value
               for family in text_string_to_metric_families(metrics.exposition(metrics.collect(_warehouse(tmp_path))))
               for s in family.samples}
    assert samples[("traffic_flow_waiting_sets", (("source", "quiet"),))] == 2
    assert samples[("traffic_flow_waiting_bytes", (("source", "quiet"),))] == 100
    assert samples[("traffic_flow_waiting_oldest_timestamp_seconds", (("source", "quiet"),))] == T0.timestamp()
    assert samples[("traffic_flow_waiting_sets", (("source", "edge"),))] == 0
    assert ("traffic_flow_waiting_oldest_timestamp_seconds", (("source", "edge"),)) not in samples


def test_status_prints_count_bytes_and_age_of_waiting_data(tmp_path, capsys):
    _warehouse(tmp_path)
    code = main(["status", "--warehouse", str(tmp_path / "warehouse"), "--set", "now=2026-11-03T12:30:00+00:00"])
    out = capsys.readouterr().out
    assert code == 0
    (line,) = [line for line in out.splitlines() if "waiting" in line]
    assert "quiet" in line and "2 flow data set(s), 100 bytes" in line
    assert "2 h 30 min ago" in line and "11:00" in line  # the age, and when the watermark rejects it
    assert "edge" not in out
