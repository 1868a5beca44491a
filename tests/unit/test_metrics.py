"""The metrics module on small warehouses written row by row with Arrow (no Spark): arithmetic, windows, the
state file, and that writing metrics never fails a job."""

from __future__ import annotations

import json
import shutil
from datetime import datetime, timedelta, timezone

import pyarrow as pa
import pytest
from prometheus_client.parser import text_string_to_metric_families

from traffic.core.clock import ClockState
from traffic.core.settings import load_settings
from traffic.reporting import metrics
from traffic.storage import state as st
from traffic.storage.warehouse import Warehouse
from traffic.storage.journal import Journal

UTC = timezone.utc
T0 = datetime(2026, 11, 3, 10, tzinfo=UTC)


def _samples(families) -> dict:
    out = {}
    for family in text_string_to_metric_families(metrics.exposition(families)):
        for sample in family.samples:
            out[(sample.name, tuple(sorted(sample.labels.items())))] = sample.value
    return out


def _get(samples, name, **labels):
    return samples[(name, tuple(sorted(labels.items())))]


@pytest.fixture()
def warehouse(tmp_path) -> Warehouse:
    settings = load_settings(environ={}, overrides={"warehouse": tmp_path / "warehouse", "inbox": tmp_path / "inbox",
                                                    "allowed_lateness": "60", "source_timeout": "1h"})
    warehouse = Warehouse(settings, engine="rs")
    warehouse.create_all()
    return warehouse


def _append(warehouse: Warehouse, name: str, rows: list[dict]) -> None:
    table = warehouse.table(name)
    table.append(pa.Table.from_pylist(rows, schema=table.arrow_schema))


def _batch(batch_id: int, committed: datetime, seconds: float, **counts) -> dict:
    row = {"batch_id": batch_id, "started_at": committed - timedelta(seconds=seconds), "committed_at": committed,
           "files": [], "mode": "ingest"}
    for column in ("records_read", "packets_on_time", "packets_late", "records_rejected", "ticks", "bytes_on_time",
                   "bytes_late", "duplicate_files"):
        row[column] = counts.get(column, 0)
    return row


def test_steps_label():
    assert metrics.steps_label(None) == "all"
    assert metrics.steps_label(()) == "all"
    assert metrics.steps_label(("freeze",)) == "freeze"
    assert metrics.steps_label(["months", "freeze", "days"]) == "days,freeze,months"


def test_an_empty_warehouse_has_counts_of_zero_and_no_watermark(warehouse):
    samples = _samples(metrics.collect(warehouse, now=T0))
    assert not [k for k in samples if k[0] in ("traffic_watermark_timestamp_seconds", "traffic_last_batch_id")]
    assert _get(samples, "traffic_hours_frozen") == 0
    assert _get(samples, "traffic_batches_total") == 0
    assert _get(samples, "traffic_periods", grain="day", dq_status="failed") == 0
    assert _get(samples, "traffic_metrics_generated_timestamp_seconds") == T0.timestamp()


def test_clock_figures_per_source(warehouse):
    """a and b deliver; c's clock is 30 minutes behind and it was last seen 70 minutes of event time ago."""
    state = ClockState(clocks={"a": T0, "b": T0 - timedelta(minutes=5), "c": T0 - timedelta(minutes=30)},
                       last_batch={"a": 3, "b": 3, "c": 1}, watermark=T0 - timedelta(minutes=6),
                       first_hour=T0 - timedelta(hours=2), seen_at={"a": T0, "b": T0, "c": T0 - timedelta(minutes=70)})
    warehouse.table("clocks").overwrite(st.clock_table(state))
    _append(warehouse, "batches", [_batch(1, T0 - timedelta(hours=1), 4.5, records_read=10, bytes_late=7,
                                          packets_late=2, records_rejected=1),
                                   _batch(3, T0, 2.25, records_read=5, bytes_on_time=900, packets_on_time=3),
                                   _batch(2, T0 - timedelta(minutes=30), 3.0, ticks=4, duplicate_files=1)])
    samples = _samples(metrics.collect(warehouse))
    assert _get(samples, "traffic_watermark_timestamp_seconds") == (T0 - timedelta(minutes=6)).timestamp()
    assert {s: _get(samples, "traffic_watermark_lag_seconds", source=s) for s in "abc"} == \
        {"a": 360, "b": 60, "c": -1440}
    assert {s: _get(samples, "traffic_source_behind_seconds", source=s) for s in "abc"} == {"a": 0, "b": 300, "c": 1800}
    assert {s: _get(samples, "traffic_source_silent_seconds", source=s) for s in "abc"} == {"a": 0, "b": 0, "c": 4200}
    assert {s: _get(samples, "traffic_source_live", source=s) for s in "abc"} == {"a": 1, "b": 1, "c": 0}
    assert _get(samples, "traffic_source_last_batch_timestamp_seconds", source="c") == \
        (T0 - timedelta(hours=1)).timestamp()
    assert _get(samples, "traffic_source_last_batch_timestamp_seconds", source="a") == T0.timestamp()
    # The last batch is the largest id, whatever the row order; the totals are sums over every batch.
    assert _get(samples, "traffic_last_batch_id") == 3
    assert _get(samples, "traffic_last_batch_duration_seconds") == 2.25
    assert _get(samples, "traffic_batches_total") == 3
    assert _get(samples, "traffic_records_read_total") == 15
    assert (_get(samples, "traffic_late_bytes_total"), _get(samples, "traffic_late_packets_total")) == (7, 2)
    assert _get(samples, "traffic_rejected_records_total") == 1
    assert (_get(samples, "traffic_ticks_total"), _get(samples, "traffic_duplicate_files_total")) == (4, 1)
    assert _get(samples, "traffic_source_timeout_seconds") == 3600
    # Hours the watermark closed that no close froze yet: 08:00 (09:00 ends after W = 09:54).
    assert _get(samples, "traffic_hours_awaiting_freeze") == 1


def test_lost_datagrams_are_summed_over_the_last_24_hours_per_source(warehouse):
    state = ClockState(clocks={"router": T0, "feed": T0}, last_batch={"router": 1, "feed": 1}, watermark=T0,
                       first_hour=T0 - timedelta(days=3))
    warehouse.table("clocks").overwrite(st.clock_table(state))
    rows = [{"source": "router", "pane_start": T0 - timedelta(hours=h), "packets": 1, "bytes": 1, "ticks": 0,
             "lost": lost} for h, lost in ((0, 3), (5, 4), (23, 5), (24, 1000), (48, 1000))]
    rows.append({"source": "router", "pane_start": T0 - timedelta(hours=1), "packets": 1, "bytes": 1, "ticks": 0,
                 "lost": None})
    _append(warehouse, "source_panes", rows)
    samples = _samples(metrics.collect(warehouse))
    # The window is the 24 hours ending with the newest clock's hour (10:00): from 11:00 the day before on.
    assert _get(samples, "traffic_flow_export_lost", source="router") == 3 + 4 + 5
    assert _get(samples, "traffic_flow_export_lost", source="feed") == 0


def test_ledger_counts_and_estimated_share(warehouse):
    hours = [{"grain": "hour", "period_start": T0 - timedelta(hours=h), "bytes": 1000, "packets": 1,
              "late_bytes": 0, "late_packets": 0, "dq_status": status, "estimated_bytes": estimated, "lost": 0}
             for h, status, estimated in ((1, "passed", 500), (2, "warning", 0), (3, "failed", 0), (4, "accepted", 0),
                                          *((h, "passed", 1000 if h > 24 else 0) for h in range(5, 27)))]
    day = {"grain": "day", "period_start": datetime(2026, 11, 1, tzinfo=UTC), "bytes": 0, "packets": 0,
           "late_bytes": 0, "late_packets": 0, "dq_status": "passed"}
    st.write_ledger_rows(warehouse, hours + [day])
    samples = _samples(metrics.collect(warehouse))
    assert [_get(samples, "traffic_periods", grain="hour", dq_status=s)
            for s in ("passed", "warning", "failed", "accepted")] == [23, 1, 1, 1]
    assert _get(samples, "traffic_periods", grain="day", dq_status="passed") == 1
    assert _get(samples, "traffic_periods", grain="month", dq_status="passed") == 0
    assert _get(samples, "traffic_hours_frozen") == 26
    assert _get(samples, "traffic_freeze_frontier_timestamp_seconds") == T0.timestamp()
    # The 24 last closed hours: the two before them (all estimated) are not among them.
    assert _get(samples, "traffic_estimated_bytes_ratio") == pytest.approx(500 / 24000)


def test_close_durations_are_kept_per_set_of_steps_and_a_damaged_file_is_ignored(warehouse):
    metrics.record_close(warehouse, "freeze", 12.5, 0, T0)
    metrics.record_close(warehouse, "expire", 0.5, 0, T0 + timedelta(seconds=20))
    metrics.record_close(warehouse, "freeze", 14.0, 2, T0 + timedelta(hours=1))
    samples = _samples(metrics.collect(warehouse))
    assert _get(samples, "traffic_last_close_duration_seconds", steps="freeze") == 14.0
    assert _get(samples, "traffic_last_close_failed_checks", steps="freeze") == 2
    assert _get(samples, "traffic_last_close_timestamp_seconds", steps="freeze") == \
        (T0 + timedelta(hours=1)).timestamp()
    assert _get(samples, "traffic_last_close_duration_seconds", steps="expire") == 0.5
    path = warehouse.state_dir() / metrics.STATE_FILE
    path.write_text("{not json")
    samples = _samples(metrics.collect(warehouse))
    assert not [k for k in samples if k[0] == "traffic_last_close_duration_seconds"]
    metrics.record_close(warehouse, "all", 3.0, 0, T0)  # a damaged file is replaced, not a reason to fail
    assert json.loads(path.read_text())["close"]["all"]["seconds"] == 3.0


def test_pending_batch(warehouse):
    assert _get(_samples(metrics.collect(warehouse)), "traffic_pending_batch") == 0
    Journal(warehouse.state_dir()).save({"batch_id": 7})
    assert _get(_samples(metrics.collect(warehouse)), "traffic_pending_batch") == 1


def test_written_after_writes_when_the_block_fails_and_warns_instead_of_failing(warehouse):
    said: list[str] = []
    with pytest.raises(RuntimeError, match="the step broke"):
        with metrics.written_after(warehouse, said.append) as job:
            job.closed(("freeze",), 1)
            raise RuntimeError("the step broke")
    path = metrics.metrics_path(warehouse)
    samples = {(s.name, tuple(sorted(s.labels.items()))): s.value
               for f in text_string_to_metric_families(path.read_text()) for s in f.samples}
    assert _get(samples, "traffic_last_close_failed_checks", steps="freeze") == 1
    assert said == []
    path.unlink()
    path.mkdir()  # the file cannot be replaced: a warning, and the block's own outcome stands
    with metrics.written_after(warehouse, said.append):
        pass
    assert len(said) == 1 and said[0].startswith(f"warning: metrics not written to {path}: "), said
    assert not list(path.parent.glob("metrics.prom.*"))


def _panes(warehouse: Warehouse, rows: list[tuple]) -> None:
    """Final pane rows: (pane_start, account, direction, bytes)."""
    _append(warehouse, "panes", [{"pane_start": p, "hour": p.replace(minute=0), "source": "s", "account": a,
                                  "direction": d, "bytes": b, "packets": 1, "status": "final",
                                  "mapping_version": "v1@x"} for p, a, d, b in rows])


def test_account_bytes_of_a_period_starting_mid_day_and_the_cache_of_rolled_up_days(tmp_path):
    """Billing in Asia/Kolkata: November starts 2026-10-31 18:30 UTC, inside a day that is rolled up (cached)."""
    settings = load_settings(environ={}, overrides={"warehouse": tmp_path / "w", "inbox": tmp_path / "inbox",
                                                    "billing_timezone": "Asia/Kolkata"})
    warehouse = Warehouse(settings, engine="rs")
    warehouse.create_all()
    oct31, nov1, nov2 = (datetime(2026, 10, 31, tzinfo=UTC), datetime(2026, 11, 1, tzinfo=UTC),
                         datetime(2026, 11, 2, tzinfo=UTC))
    watermark = nov2 + timedelta(hours=3)
    warehouse.table("clocks").overwrite(st.clock_table(ClockState(
        clocks={"s": watermark}, last_batch={"s": 1}, watermark=watermark, first_hour=oct31)))
    _panes(warehouse, [(oct31 + timedelta(hours=18, minutes=25), "acme", "in", 1),  # October's period
                       (oct31 + timedelta(hours=18, minutes=30), "acme", "in", 10),
                       (oct31 + timedelta(hours=23, minutes=55), "acme", None, 20),
                       (nov1 + timedelta(hours=5), "acme", "out", 300),
                       (nov1 + timedelta(hours=6), "globex", "in", 4000),
                       (nov2 + timedelta(hours=1), "acme", "in", 50000)])  # today: not rolled up yet
    day = {"grain": "day", "bytes": 0, "packets": 0, "late_bytes": 0, "late_packets": 0, "dq_status": "passed"}
    st.write_ledger_rows(warehouse, [{**day, "period_start": oct31}, {**day, "period_start": nov1}])

    def totals():
        samples = _samples(metrics.collect(warehouse))
        return {(dict(k[1])["account"], dict(k[1])["direction"], dict(k[1])["period"]): v
                for k, v in samples.items() if k[0] == "traffic_account_bytes"}

    assert totals() == {("acme", "in", "2026-11"): 50010, ("acme", "unknown", "2026-11"): 20,
                        ("acme", "out", "2026-11"): 300, ("globex", "in", "2026-11"): 4000}
    cache = warehouse.state_dir() / metrics.CACHE_FOLDER
    assert sorted(p.name for p in cache.iterdir()) == ["account-bytes-2026-11-2026-10-31.arrow",
                                                       "account-bytes-2026-11-2026-11-01.arrow"]
    # A rolled-up day is summed once: rows added under an unchanged ledger row are not read again …
    _panes(warehouse, [(nov1 + timedelta(hours=7), "globex", "in", 600000),
                       (nov2 + timedelta(hours=2), "acme", "in", 7)])
    assert totals()[("globex", "in", "2026-11")] == 4000
    assert totals()[("acme", "in", "2026-11")] == 50017  # today's hours are read every time
    # … and a day rolled up again (its ledger row changes: a restatement) is summed again.
    st.write_ledger_rows(warehouse, [{**day, "period_start": nov1, "restated": "exporter bug"}])
    assert totals()[("globex", "in", "2026-11")] == 604000
    # Without a writable cache the figures are the same, only read every time.
    shutil.rmtree(cache)
    cache.write_text("not a folder")
    assert totals()[("globex", "in", "2026-11")] == 604000
