"""What writing ``metrics.prom`` costs on a warehouse with history (issue 24): no Spark, a few seconds.

    .venv/bin/python bench/metrics.py [--days 30] [--batches-per-hour 12] [--repeat 7]

Builds, with Arrow and delta-rs only, a warehouse shaped like ``days`` of 5-minute micro-batches:
``batches`` (one row per batch: compacted into one file, plus the last hour's batches since the last
close), the ledger (a row per hour and day), ``panes`` of 20 accounts × 2 directions × 3 sources per
5-minute pane (frozen days merged into a file per day, as the close's maintenance leaves them),
``source_panes`` (a file per hour), final ``hourly`` rows (200 pairs an hour, merged per day) and the
open hour's rows. Then it times, ``repeat`` times each, computing and writing the metrics the way a
job does (its warehouse handle has the tables open already) and the way ``traffic metrics`` does
(a fresh handle opens every table), and prints the medians beside the same figures for a warehouse
of one day. The tables' contents are synthetic; their sizes and file layout are what matters.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
import time
from datetime import datetime, timedelta, timezone
from pathlib import Path

import pyarrow as pa

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from traffic.core.clock import ClockState  # noqa: E402
from traffic.core.periods import HOUR, PANE, day_start  # noqa: E402
from traffic.core.settings import load_settings  # noqa: E402
from traffic.reporting import metrics  # noqa: E402
from traffic.storage import state as st  # noqa: E402
from traffic.storage.warehouse import Warehouse  # noqa: E402

UTC = timezone.utc
START = datetime(2026, 10, 1, tzinfo=UTC)
SOURCES = ("edge-a", "edge-b", "router")
ACCOUNTS = tuple(f"acct-{i:02d}" for i in range(20))


def _append(warehouse: Warehouse, name: str, columns: dict) -> None:
    """Append columns of plain values to a table (columns not given are null)."""
    table = warehouse.table(name)
    schema = table.arrow_schema
    data = pa.Table.from_pydict(columns, schema=pa.schema([schema.field(c) for c in columns]))
    for f in schema:
        if f.name not in columns:
            data = data.append_column(f, pa.nulls(data.num_rows, f.type))
    table.append(data.select(schema.names))


def build(root: Path, days: int, per_hour: int) -> Warehouse:
    """A warehouse with ``days`` of history at ``per_hour`` batches an hour (see the module docstring)."""
    settings = load_settings(environ={}, overrides={"warehouse": root / "warehouse", "inbox": root / "inbox"})
    warehouse = Warehouse(settings, engine="rs")  # synthesized history: delta-rs commits it without Spark
    warehouse.create_all()
    end = START + timedelta(days=days)
    watermark = end + timedelta(minutes=25)
    hours = [START + HOUR * i for i in range(days * 24)]

    n = days * 24 * per_hour
    step = HOUR / per_hour
    committed = [START + step * (i + 1) for i in range(n)]
    batch = {"batch_id": list(range(1, n + 1)), "started_at": [t - timedelta(seconds=9) for t in committed],
             "committed_at": committed, "records_read": [100_000] * n, "packets_on_time": [99_000] * n,
             "packets_late": [900] * n, "records_rejected": [100] * n, "ticks": [12] * n,
             "bytes_on_time": [60_000_000] * n, "bytes_late": [500_000] * n, "duplicate_files": [0] * n,
             "mode": ["ingest"] * n}
    recent = per_hour  # the batches since the last close's compaction: one file each
    _append(warehouse, "batches", {k: v[:-recent] for k, v in batch.items()})
    for i in range(n - recent, n):
        _append(warehouse, "batches", {k: v[i:i + 1] for k, v in batch.items()})

    ledger = [{"grain": "hour", "period_start": h, "bytes": 10**9, "packets": 10**6, "late_bytes": 0, "late_packets": 0,
               "dq_status": "passed", "estimated_bytes": 10**7, "lost": 3} for h in hours]
    ledger += [{"grain": "day", "period_start": START + timedelta(days=d), "bytes": 24 * 10**9, "packets": 24 * 10**6,
                "late_bytes": 0, "late_packets": 0, "dq_status": "passed"} for d in range(days)]
    st.write_ledger_rows(warehouse, ledger)

    panes = [START + PANE * i for i in range(days * 288)]
    keys = [(a, d, s) for a in ACCOUNTS for d in ("in", "out") for s in SOURCES]
    _append(warehouse, "panes", {
        "pane_start": [p for p in panes for _ in keys], "hour": [p.replace(minute=0) for p in panes for _ in keys],
        "source": [k[2] for _ in panes for k in keys], "account": [k[0] for _ in panes for k in keys],
        "direction": [k[1] for _ in panes for k in keys], "bytes": [1_000_000] * (len(panes) * len(keys)),
        "packets": [1_000] * (len(panes) * len(keys)), "status": ["final"] * (len(panes) * len(keys)),
        "mapping_version": ["v1@0"] * (len(panes) * len(keys))})
    _append(warehouse, "source_panes", {
        "source": [s for _ in panes for s in SOURCES], "pane_start": [p for p in panes for _ in SOURCES],
        "packets": [1] * (len(panes) * 3), "bytes": [1] * (len(panes) * 3), "ticks": [0] * (len(panes) * 3),
        "lost": [0] * (len(panes) * 3)})
    pairs = 200
    rows = [(h, i) for h in hours for i in range(pairs)]
    _append(warehouse, "hourly", {
        "hour": [h for h, _ in rows], "day": [h.date() for h, _ in rows],
        "local_ip": [f"10.0.{i // 250}.{i % 250}" for _, i in rows], "remote_ip": ["192.0.2.1"] * len(rows),
        "bytes": [1] * len(rows), "packets": [1] * len(rows), "status": ["final"] * len(rows)})
    _append(warehouse, "hourly", {
        "hour": [end] * pairs, "day": [end.date()] * pairs,
        "local_ip": [f"10.0.{i // 250}.{i % 250}" for i in range(pairs)],
        "remote_ip": ["192.0.2.1"] * pairs, "bytes": [1] * pairs, "packets": [1] * pairs, "status": ["open"] * pairs})
    for name in ("panes", "hourly"):
        warehouse.table(name).merge(day_start(end.date()))
    for name in ("batches", "periods", "panes", "hourly", "source_panes"):
        warehouse.table(name).checkpoint()
    state = ClockState(clocks={s: watermark for s in SOURCES}, last_batch={s: n for s in SOURCES},
                       watermark=watermark, first_hour=START, seen_at={s: watermark for s in SOURCES})
    warehouse.table("clocks").overwrite(st.clock_table(state))
    metrics.record_close(warehouse, "all", 12.0, 0)
    return warehouse


def measure(warehouse: Warehouse, repeat: int) -> dict:
    """Median seconds: a job's write (tables already open), and a fresh handle's compute + write (the CLI's)."""
    warm, cold = [], []
    metrics.write_metrics(warehouse)  # opens the tables, as the job itself has by then
    for _ in range(repeat):
        clock = time.perf_counter()
        metrics.write_metrics(warehouse)
        warm.append(time.perf_counter() - clock)
        fresh = Warehouse.reader(warehouse.settings)
        clock = time.perf_counter()
        metrics.write_metrics(fresh)
        cold.append(time.perf_counter() - clock)
    return {"warm": statistics.median(warm), "cold": statistics.median(cold), "warm_max": max(warm)}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--days", type=int, default=30)
    parser.add_argument("--batches-per-hour", type=int, default=12)
    parser.add_argument("--repeat", type=int, default=7)
    args = parser.parse_args(argv)
    with tempfile.TemporaryDirectory(prefix="metrics-bench-") as tmp:
        for days in (1, args.days):
            clock = time.perf_counter()
            warehouse = build(Path(tmp) / f"d{days}", days, args.batches_per_hour)
            built = time.perf_counter() - clock
            result = measure(warehouse, args.repeat)
            samples = metrics.metrics_path(warehouse).read_text().count("\n")
            batches = warehouse.table("batches").read_arrow(columns=["batch_id"]).num_rows
            print(f"{days:>3} day(s): {batches:,} batches, {days * 24:,} ledger hours; metrics.prom {samples} lines; "
                  f"write in a job {result['warm'] * 1000:.0f} ms (max {result['warm_max'] * 1000:.0f}), "
                  f"fresh handle {result['cold'] * 1000:.0f} ms (median of {args.repeat}; built in {built:.1f} s)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
