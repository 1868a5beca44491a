"""A simulated month of 5-minute micro-batches at the Delta layer (no Spark): bounded files, bounded log, flat reads.

Each batch appends one file per hour it touches to ``packets`` (idempotent by batch id);
every 12 batches a "close" does what the pipeline's close does: expire hours older than
``keep_hours``, compact when the table has many small files, checkpoint, and clean log
entries older than the log retention. Time is simulated: log files are aged to the moment
their commit would have happened, so the 1-day log retention applies as it would over a month,
and the files a commit removes are stamped with that moment, so their one-day retention does too
(stamped with the real clock, every removal of the month would stay in the table's snapshot).

The test holds the counts (live files, files on disk, log entries) to their bounds; what reading the
newest hour costs along the month is timed by ``bench/timings.py --only month-reads`` (target: the
last week's median within 1.5× + 5 ms of the first week's), not on busy test workers.
"""

from __future__ import annotations

import os
import time
from pathlib import Path
from datetime import datetime, timedelta, timezone

import pyarrow as pa
import pytest

from traffic.storage.engines import rs as rs_engine
from traffic.storage.warehouse import Warehouse
from traffic.storage.keys import cluster_key
from traffic.core.settings import load_settings

UTC = timezone.utc
T0 = datetime(2026, 10, 1, tzinfo=UTC)
BATCHES = 30 * 288  # 8,640 five-minute micro-batches
KEEP_HOURS = 24


def _batch(i: int) -> pa.Table:
    ts = T0 + timedelta(minutes=5 * i)
    n = 40
    return pa.table({"ts": [ts + timedelta(seconds=s) for s in range(n)], "source": ["r1"] * n,
                     "local_ip": ["10.0.0.1"] * n, "remote_ip": ["192.0.2.1"] * n, "bytes": [100] * n,
                     "hour": [ts.replace(minute=0, second=0)] * n, "batch_id": [i + 1] * n})


def read_latency(table, key: str) -> float:
    """The cost of opening the table and reading one hour: the fastest of 9 tries (load on a busy machine only adds)."""
    samples = []
    for _ in range(9):
        start = time.perf_counter()
        table.read_arrow(keys=[key])
        samples.append(time.perf_counter() - start)
    return min(samples)


def _age_log(log_dir: str, commit_times: dict[int, datetime], simulated_now: datetime) -> None:
    """Give each log file the age its commit would have at ``simulated_now``."""
    real_now = time.time()
    for name in os.listdir(log_dir):
        stem = name.split(".")[0]
        if stem.isdigit() and int(stem) in commit_times:
            age = (simulated_now - commit_times[int(stem)]).total_seconds()
            os.utime(os.path.join(log_dir, name), (real_now - age, real_now - age))


def simulate_month(root, setattr, measure_reads: bool = False):
    """Run the month into a warehouse under ``root``: (settings, table, curve). ``setattr`` sets the
    simulated clock on the Delta layer (``monkeypatch.setattr``, or one the caller undoes). Each day's
    row of ``curve``: (day, live files, log json files, read latency of the newest hour or None, files
    on disk); latencies only with ``measure_reads`` (the benchmark's)."""
    settings = load_settings(environ={}, overrides={"warehouse": root, "compact_min_files": 32})
    table = Warehouse(settings, engine="rs").table("packets")
    table.create()
    log_dir = str(table.path / "_delta_log")
    commit_times: dict[int, datetime] = {0: T0}
    simulated = {"now": T0}
    setattr(rs_engine, "_now_ms", lambda: int(simulated["now"].timestamp() * 1000))
    curve = []
    version = table.version()
    for i in range(BATCHES):
        now = T0 + timedelta(minutes=5 * (i + 1))
        simulated["now"] = now
        table.append(_batch(i), txn=("ingest", i + 1))
        version += 1
        commit_times[version] = now
        if (i + 1) % 12 == 0:  # hourly close
            cutoff = cluster_key(now.replace(minute=0) - timedelta(hours=KEEP_HOURS), "hour")
            expired = [k for k in table.keys() if k < cutoff]
            if expired:
                table.delete_keys(expired, op="expire")
            table.compact()
            latest = table.version()
            for made in range(version + 1, latest + 1):  # expiry and compaction commits
                commit_times[made] = now
            version = latest
            table.checkpoint()
            _age_log(log_dir, commit_times, now)
            table.cleanup_log()
        if (i + 1) % 288 == 0:
            day = (i + 1) // 288
            # Daily vacuum; simulated time again: every removed file is past its retention.
            table.vacuum(retention_hours=0)
            newest = cluster_key((now - timedelta(minutes=5)).replace(minute=0), "hour")
            logs = sum(1 for name in os.listdir(log_dir) if name.endswith(".json"))
            on_disk = sum(1 for p in Path(table.path).rglob("*.parquet") if "_delta_log" not in p.parts)
            curve.append((day, len(table.files()), logs, read_latency(table, newest) if measure_reads else None,
                          on_disk))
    return settings, table, curve


@pytest.mark.slow
def test_a_month_of_micro_batches_keeps_files_and_log_bounded(tmp_path, monkeypatch):
    settings, table, curve = simulate_month(tmp_path, monkeypatch.setattr)
    print("\nday  live files  files on disk  log entries")
    for day, files, logs, _, on_disk in curve:
        print(f"{day:>3}  {files:>10}  {on_disk:>13}  {logs:>11}")
    # Live files: at most KEEP_HOURS hours of data plus what waits for the next compaction.
    assert max(files for _, files, _, _, _ in curve) <= KEEP_HOURS + 1 + settings.compact_min_files
    # Vacuum keeps what is on disk bounded too (live files plus checkpoints' worth of nothing else).
    assert max(on_disk for *_, on_disk in curve[1:]) <= 2 * (KEEP_HOURS + 1 + settings.compact_min_files) + 12
    # The log stops growing once the 1-day retention applies.
    logs_by_day = {day: logs for day, _, logs, _, _ in curve}
    assert logs_by_day[30] <= logs_by_day[4] * 1.05, logs_by_day
    assert table.read_arrow().num_rows == 40 * 12 * KEEP_HOURS  # the last close ran at midnight
