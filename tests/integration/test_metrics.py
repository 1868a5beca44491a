"""Prometheus metrics through the real pipeline: ``metrics.prom`` after every job, equal to the warehouse.

One stream (a router feed ``r1`` for acme and an unassigned host, JSON lines ``r2`` with directions for
globex; 2026-10-31 21:00 → 2026-11-01 02:30) goes in two batches, each followed by a close; the second
carries late records and bad lines. After each job the file is parsed with ``prometheus_client``'s own
parser and compared with figures the test computes from what it delivered (and from the tables).
A second stream breaks a source (it stops while the other's clock moves on) and watches its lag
grow batch after batch until it is stalled; a third fails a check; a fourth cannot write
``_reports/metrics.prom``. Everything runs in-process on the shared Spark session.
"""

from __future__ import annotations

import ipaddress
import json
import os
import shutil
import time
from datetime import datetime, timedelta, timezone
from pathlib import Path

import pyarrow as pa
import pytest
from prometheus_client.parser import text_string_to_metric_families

from tests.support.accounts import V1
from tests.support.harness import Harness, feed_line, tick_line
from traffic.accounting.close import CheckFailed
from traffic.app import cli, runs
from traffic.reporting.metrics import STATE_FILE
from traffic.storage.warehouse import Warehouse
from traffic.storage.journal import state_folder

UTC = timezone.utc
PANE = timedelta(minutes=5)
START = datetime(2026, 10, 31, 21, tzinfo=UTC)
SPLIT = datetime(2026, 11, 1, 1, tzinfo=UTC)
END = datetime(2026, 11, 1, 2, 30, tzinfo=UTC)
NOVEMBER = datetime(2026, 11, 1, tzinfo=UTC)
ACCOUNTS = {"acme": ipaddress.ip_network("10.0.0.0/24"), "globex": ipaddress.ip_network("10.0.1.0/24")}
#: Late records of the second batch (hour 22:00 was frozen by the first close): r1's, 41 bytes.
LATE = [(datetime(2026, 10, 31, 22, 7, tzinfo=UTC), 11), (datetime(2026, 10, 31, 22, 8, tzinfo=UTC), 13),
        (datetime(2026, 10, 31, 22, 9, tzinfo=UTC), 17)]
BAD_FEED = ["new,OP_DELETE,1793494800000000,10.0.0.5,192.0.2.1,1,2,3", "new,OP_INSERT,not-a-time,10.0.0.5"]
BAD_JSON = ["{this is not json"]


def _quiet(*_args, **_kwargs):
    return None


def _records(start: datetime, end: datetime) -> list[dict]:
    """On-time records of both sources in ``[start, end)``: (source, ts, local_ip, bytes, direction)."""
    out, t, i = [], start, 0
    while t < end:
        out += [{"source": "r1", "ts": t + timedelta(minutes=1), "local_ip": "10.0.0.5", "bytes": 100 + i,
                 "direction": None},
                {"source": "r1", "ts": t + timedelta(minutes=4), "local_ip": "10.9.9.9", "bytes": 7,
                 "direction": None},
                {"source": "r2", "ts": t + timedelta(minutes=2), "local_ip": "10.0.1.7", "bytes": 200 + i,
                 "direction": "in"},
                {"source": "r2", "ts": t + timedelta(minutes=3), "local_ip": "10.0.1.7", "bytes": 50 + i,
                 "direction": "out"}]
        t += PANE
        i += 1
    return out


def _deliver(harness: Harness, records: list[dict], tick: datetime, tag: str, late=(), bad_feed=(), bad_json=()):
    feed = [feed_line(r["ts"], r["local_ip"], "192.0.2.1", 40000, 443, r["bytes"]) for r in records
            if r["source"] == "r1"]
    feed += [feed_line(ts, "10.0.0.5", "192.0.2.1", 40000, 443, size) for ts, size in late]
    harness.deliver("r1", "\n".join(feed + list(bad_feed) + [tick_line(tick)]) + "\n", f"feed-{tag}.csv")
    lines = [json.dumps({"ts": r["ts"].isoformat(), "local_ip": r["local_ip"], "remote_ip": "192.0.2.2",
                         "local_port": 40000, "remote_port": 443, "protocol": 6, "bytes": r["bytes"],
                         "direction": r["direction"]}) for r in records if r["source"] == "r2"]
    lines += list(bad_json) + [json.dumps({"ts": tick.isoformat()})]
    harness.deliver("r2", "\n".join(lines) + "\n", f"flows-{tag}.jsonl")


def _account(ip: str) -> str:
    address = ipaddress.ip_address(ip)
    return next((name for name, net in ACCOUNTS.items() if address in net), "unassigned")


def read_metrics(path: Path) -> dict[tuple, float]:
    """Every sample of a metrics file, parsed by prometheus_client: {(name, ((label, value), ...)): value}."""
    return parse(path.read_text())


def parse(text: str) -> dict[tuple, float]:
    samples = {}
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            samples[(sample.name, tuple(sorted(sample.labels.items())))] = sample.value
    return samples


def value(samples: dict, name: str, **labels) -> float:
    key = (name, tuple(sorted(labels.items())))
    assert key in samples, f"{name}{labels} missing; got {sorted(k for k in samples if k[0] == name)}"
    return samples[key]


def _metrics_file(harness: Harness) -> Path:
    return harness.settings.warehouse / "_reports" / "metrics.prom"


@pytest.fixture(scope="module")
def stream(spark, tmp_path_factory):
    """The two-batch stream, with a copy of ``metrics.prom`` taken after each of its four jobs."""
    base = tmp_path_factory.mktemp("metrics")
    accounts = base / "accounts.toml"
    accounts.write_text(V1)
    harness = Harness(base / "run", spark, accounts_file=str(accounts))
    first, second = _records(START, SPLIT), _records(SPLIT, END)
    seen = {}
    _deliver(harness, first, SPLIT, "1")
    started = time.time()
    harness.ingest()
    seen["ingest1"] = (read_metrics(_metrics_file(harness)), started)
    started = time.time()
    harness.close()
    seen["close1"] = (read_metrics(_metrics_file(harness)), started)
    _deliver(harness, second, END, "2", late=LATE, bad_feed=BAD_FEED, bad_json=BAD_JSON)
    started = time.time()
    harness.ingest()
    seen["ingest2"] = (read_metrics(_metrics_file(harness)), started)
    started = time.time()
    harness.close()
    seen["close2"] = (read_metrics(_metrics_file(harness)), started)
    return harness, first + second, seen


def test_written_after_each_ingest_and_close(stream):
    harness, _, seen = stream
    for job, (samples, started) in seen.items():
        assert value(samples, "traffic_metrics_generated_timestamp_seconds") >= started, job
    after_ingest, _ = seen["ingest1"]
    assert value(after_ingest, "traffic_last_batch_id") == 1
    assert value(after_ingest, "traffic_hours_frozen") == 0
    assert value(after_ingest, "traffic_hours_open") == 4  # 21:00 … 00:00, all closed by W = 01:00, none frozen
    assert value(after_ingest, "traffic_hours_awaiting_freeze") == 4
    assert not [k for k in after_ingest if k[0] == "traffic_last_close_duration_seconds"]  # no close has run yet
    after_close, _ = seen["close1"]
    assert value(after_close, "traffic_hours_frozen") == 4
    assert value(after_close, "traffic_hours_awaiting_freeze") == 0
    assert value(after_close, "traffic_last_close_duration_seconds", steps="all") > 0
    assert value(after_close, "traffic_last_close_failed_checks", steps="all") == 0
    # The second ingest keeps the close's figures (the state file), and reports its own batch.
    after_second, _ = seen["ingest2"]
    assert value(after_second, "traffic_last_batch_id") == 2
    assert value(after_second, "traffic_last_close_duration_seconds", steps="all") == \
        value(after_close, "traffic_last_close_duration_seconds", steps="all")
    assert value(seen["close2"][0], "traffic_last_close_timestamp_seconds", steps="all") > \
        value(after_close, "traffic_last_close_timestamp_seconds", steps="all")
    reports = harness.settings.warehouse / "_reports"
    assert [p.name for p in reports.iterdir() if p.name.startswith("metrics")] == ["metrics.prom"]  # no temp file left


def test_values_equal_the_warehouse(stream):
    harness, records, seen = stream
    samples, _ = seen["close2"]
    assert samples == read_metrics(_metrics_file(harness))  # the file is the last job's
    # The watermark: both sources' clocks end at END (ticks), lateness 0.
    assert value(samples, "traffic_watermark_timestamp_seconds") == END.timestamp() == harness.watermark.timestamp()
    for source in ("r1", "r2"):
        assert value(samples, "traffic_source_clock_timestamp_seconds", source=source) == END.timestamp()
        assert value(samples, "traffic_watermark_lag_seconds", source=source) == 0
        assert value(samples, "traffic_source_behind_seconds", source=source) == 0
        assert value(samples, "traffic_source_live", source=source) == 1
        assert value(samples, "traffic_flow_export_lost", source=source) == 0
    # Counts from the ledger and the hourly rows, read here on their own.
    ledger = harness.table("periods")
    for grain in ("hour", "day", "month"):
        for status in ("passed", "warning", "failed", "accepted"):
            expected = sum(1 for r in ledger if r["grain"] == grain and r["dq_status"] == status)
            assert value(samples, "traffic_periods", grain=grain, dq_status=status) == expected, (grain, status)
    assert value(samples, "traffic_periods", grain="hour", dq_status="passed") == 5  # 21:00 … 01:00
    assert value(samples, "traffic_periods", grain="day", dq_status="passed") == 1  # 2026-10-31
    assert value(samples, "traffic_periods", grain="month", dq_status="passed") == 1  # October
    assert value(samples, "traffic_hours_frozen") == 5
    open_hours = {r["hour"] for r in harness.table("hourly") if r["status"] == "open"}
    assert value(samples, "traffic_hours_open") == len(open_hours) == 1  # 02:00
    assert value(samples, "traffic_freeze_frontier_timestamp_seconds") == \
        datetime(2026, 11, 1, 2, tzinfo=UTC).timestamp()
    # Totals: what was delivered, and what the batches table says.
    batches = harness.table("batches")
    assert value(samples, "traffic_batches_total") == len(batches) == 2
    assert value(samples, "traffic_on_time_bytes_total") == sum(r["bytes"] for r in records) == \
        sum(b["bytes_on_time"] for b in batches)
    assert value(samples, "traffic_on_time_packets_total") == len(records)
    assert value(samples, "traffic_late_packets_total") == len(LATE) == len(harness.table("late_packets"))
    assert value(samples, "traffic_late_bytes_total") == sum(size for _, size in LATE) == 41
    assert value(samples, "traffic_rejected_records_total") == len(BAD_FEED) + len(BAD_JSON) == \
        len(harness.table("rejects"))
    assert value(samples, "traffic_ticks_total") == 4  # one per source and file
    assert value(samples, "traffic_pending_batch") == 0
    last = max(batches, key=lambda b: b["batch_id"])
    assert value(samples, "traffic_last_batch_duration_seconds") == \
        pytest.approx((last["committed_at"] - last["started_at"]).total_seconds(), abs=1e-6)
    assert value(samples, "traffic_source_last_batch_timestamp_seconds", source="r1") == \
        pytest.approx(last["committed_at"].timestamp(), abs=1e-6)
    # Per account and direction, November so far (hours 00:00 and 01:00 are final), from the records.
    expected: dict[tuple, int] = {}
    for r in records:
        if NOVEMBER <= r["ts"] < datetime(2026, 11, 1, 2, tzinfo=UTC):
            key = (_account(r["local_ip"]), r["direction"] or "unknown")
            expected[key] = expected.get(key, 0) + r["bytes"]
    got = {(dict(labels)["account"], dict(labels)["direction"]): v for (name, labels), v in samples.items()
           if name == "traffic_account_bytes"}
    assert got == expected, (got, expected)
    assert {dict(labels)["period"] for (name, labels) in samples if name == "traffic_account_bytes"} == {"2026-11"}
    final = [r for r in harness.table("hourly") if r["status"] == "final" and r["hour"] >= NOVEMBER]
    assert sum(got.values()) == sum(r["bytes"] for r in final)
    assert not [k for k in samples if "local_ip" in dict(k[1]) or "remote_ip" in dict(k[1])]  # never per address


def test_cli_prints_what_the_file_holds_and_rebuilds_it_from_the_tables(stream, spark, tmp_path, capsys):
    harness, _, seen = stream
    copy = tmp_path / "w"
    shutil.copytree(harness.settings.warehouse, copy)
    args = ["--warehouse", str(copy), "--inbox", str(harness.settings.inbox),
            "--set", f"accounts_file={harness.settings.accounts_file}"]
    assert cli.main(["metrics", *args], spark=spark) == 0
    printed = parse(capsys.readouterr().out)
    stored = read_metrics(copy / "_reports" / "metrics.prom")
    moving = {"traffic_metrics_generated_timestamp_seconds", "traffic_metrics_generation_seconds"}
    assert {k: v for k, v in printed.items() if k[0] not in moving} == \
        {k: v for k, v in stored.items() if k[0] not in moving}
    # As after an upgrade: no file, no recorded close. --write recomputes everything the tables hold.
    (copy / "_reports" / "metrics.prom").unlink()
    (state_folder(copy) / STATE_FILE).unlink()
    assert cli.main(["metrics", "--write", *args], spark=spark) == 0
    rebuilt = read_metrics(copy / "_reports" / "metrics.prom")
    closes = {"traffic_last_close_duration_seconds", "traffic_last_close_timestamp_seconds",
              "traffic_last_close_failed_checks"}
    assert not [k for k in rebuilt if k[0] in closes]
    assert {k: v for k, v in rebuilt.items() if k[0] not in moving | closes} == \
        {k: v for k, v in stored.items() if k[0] not in moving | closes}
    assert cli.main(["metrics", "--warehouse", str(tmp_path / "none"), "--inbox", str(tmp_path)], spark=spark) == 2


def test_a_broken_source_shows_its_lag_growing_batch_after_batch(spark, tmp_path):
    """Two sources feed; then ``b`` stops while ``a``'s clock moves on 20 minutes a batch."""
    harness = Harness(tmp_path, spark, source_timeout="1h")
    t0 = datetime(2026, 11, 1, 10, tzinfo=UTC)
    harness.deliver("a", "\n".join([feed_line(t0 + timedelta(minutes=m), "10.0.0.1") for m in (1, 7)]) + "\n")
    harness.deliver("b", "\n".join([feed_line(t0 + timedelta(minutes=m), "10.0.0.2") for m in (2, 7)]) + "\n")
    harness.ingest()
    path = _metrics_file(harness)
    history = [read_metrics(path)]
    for step in range(1, 6):
        clock = t0 + timedelta(minutes=7 + 20 * step)
        harness.deliver("a", feed_line(clock, "10.0.0.1") + "\n")
        harness.ingest()
        history.append(read_metrics(path))
    behind = [value(s, "traffic_source_behind_seconds", source="b") for s in history]
    silent = [value(s, "traffic_source_silent_seconds", source="b") for s in history]
    assert behind == [0, 1200, 2400, 3600, 4800, 6000], behind
    assert silent == [0, 1200, 2400, 3600, 4800, 6000], silent
    assert [value(s, "traffic_source_behind_seconds", source="a") for s in history] == [0] * 6
    # While b is live (silent for at most source_timeout) it holds the watermark: a's lag grows with it.
    lag_a = [value(s, "traffic_watermark_lag_seconds", source="a") for s in history]
    live_b = [value(s, "traffic_source_live", source="b") for s in history]
    assert live_b == [1, 1, 1, 1, 0, 0], live_b
    assert lag_a[:4] == [0, 1200, 2400, 3600], lag_a
    # Once stalled it no longer holds anyone back: W follows a, and b's clock is behind W.
    assert lag_a[4:] == [0, 0], lag_a
    assert [value(s, "traffic_watermark_lag_seconds", source="b") for s in history[4:]] == [-4800, -6000]
    assert value(history[-1], "traffic_watermark_timestamp_seconds") == (t0 + timedelta(minutes=107)).timestamp()


def test_written_after_a_failed_check(spark, tmp_path):
    harness = Harness(tmp_path, spark)
    t0 = datetime(2026, 11, 1, 10, tzinfo=UTC)
    harness.deliver("r1", "\n".join(feed_line(t0 + timedelta(minutes=m), "10.0.0.1") for m in range(0, 125, 5))
                    + "\n")
    harness.ingest()
    Warehouse(harness.settings).table("packets").append(pa.Table.from_pylist([{
        "ts": t0 + timedelta(minutes=33), "source": "r1", "local_ip": "10.0.0.9", "remote_ip": "192.0.2.9",
        "local_port": 1, "remote_port": 2, "protocol": 6, "bytes": -40, "hour": t0, "batch_id": 1,
        "input_file": "part-00001.csv"}]))
    started = time.time()
    with pytest.raises(CheckFailed) as caught:
        harness.close()
    samples = read_metrics(_metrics_file(harness))
    assert value(samples, "traffic_metrics_generated_timestamp_seconds") >= started
    assert value(samples, "traffic_periods", grain="hour", dq_status="failed") == 1  # 10:00
    assert value(samples, "traffic_periods", grain="hour", dq_status="passed") == 1  # 11:00
    assert value(samples, "traffic_last_close_failed_checks", steps="all") == len(caught.value.result.failed) >= 1
    assert value(samples, "traffic_last_close_duration_seconds", steps="all") > 0
    # `traffic accept` is no job, but it changes a period's status: the file says so at once.
    assert cli.main(["accept", "--warehouse", str(harness.settings.warehouse), "--set", "now=2026-12-01T00:00:00Z",
                     "--period", "2026-11-01T10:00Z", "--reason", "checked by hand", "--by", "ops"]) == 0
    samples = read_metrics(_metrics_file(harness))
    assert value(samples, "traffic_periods", grain="hour", dq_status="failed") == 0
    assert value(samples, "traffic_periods", grain="hour", dq_status="accepted") == 1


def test_a_job_succeeds_when_metrics_cannot_be_written(spark, tmp_path):
    harness = Harness(tmp_path, spark)
    blocked = _metrics_file(harness)
    blocked.mkdir(parents=True)  # a folder where the file should be: the rename onto it fails
    t0 = datetime(2026, 11, 1, 10, tzinfo=UTC)
    harness.deliver("r1", "\n".join(feed_line(t0 + timedelta(minutes=m), "10.0.0.1") for m in range(0, 70, 5))
                    + "\n")
    said: list[str] = []
    result = runs.ingest(harness.settings, lambda: spark, said.append)
    assert result.batch_id == 1 and result.packets_on_time == 14
    assert [line for line in said if line.startswith("warning: metrics not written to ")
            and str(blocked) in line], said
    said.clear()
    closed = runs.close(harness.settings, lambda: spark, None, said.append)
    assert [h.hour for h in closed.hours_frozen] == [10] and not closed.failed
    assert [line for line in said if line.startswith("warning: metrics not written to ")], said
    assert blocked.is_dir() and not list(blocked.parent.glob("metrics.prom.*"))  # no temp file left behind
    # The close's duration was still recorded: the next job that can write the file shows it.
    blocked.rmdir()
    harness.ingest()
    samples = read_metrics(blocked)
    assert value(samples, "traffic_last_close_duration_seconds", steps="all") > 0
    assert value(samples, "traffic_hours_frozen") == 1


def test_a_job_with_nothing_to_do_leaves_the_file_as_it_is_but_writes_a_missing_one(spark, tmp_path):
    harness = Harness(tmp_path, spark)
    harness.deliver("r1", feed_line(START, size=100) + "\n" + tick_line(START + timedelta(hours=2)) + "\n",
                    name="a.csv")
    harness.ingest()
    harness.close()
    path = _metrics_file(harness)
    written = path.read_text()
    os.utime(path, ns=(1_000_000_000, 1_000_000_000))  # a marker: any rewrite changes it
    assert harness.ingest().nothing_to_do and runs.close(harness.settings, lambda: spark, None, _quiet)
    assert path.stat().st_mtime_ns == 1_000_000_000 and path.read_text() == written
    path.unlink()
    assert harness.ingest().nothing_to_do
    samples = read_metrics(path)
    assert value(samples, "traffic_last_batch_id") == 1 and value(samples, "traffic_hours_frozen") == 2
