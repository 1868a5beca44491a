"""Peer baseline: the same batch job as our Spark pipeline, done by one single-machine engine.

    .venv-bench/bin/python bench/peers.py --input FEED.csv --out-dir DIR --engine duckdb|polars \
        [--threads 2] [--json RESULT.json] [--check] [--expect-bytes N] [--expect-packets N]

What it measures. For one engine (DuckDB or Polars) and one router-feed CSV (no header; lines
``new,OP_INSERT,<ts_us>,<local_ip>,<remote_ip>,<local_port>,<remote_port>,<bytes>``, ts_us in
microseconds since 1970 UTC; a line of only ``new,OP_INSERT,<ts_us>`` is a clock tick, not a packet):

1. read the file (all 8 columns typed and nullable, so tick lines read as rows with nulls, which are
   then dropped: a packet is a row whose local_ip is not null);
2. write the packets as parquet partitioned by hour, hive style (``DIR/packets/hour=2026-03-10T05/``),
   columns ts (timestamp µs UTC), local_ip, remote_ip, local_port, remote_port, bytes, hour;
3. write the hourly aggregate as one parquet file (``DIR/hourly.parquet``): per (hour, local_ip,
   remote_ip) the sum of bytes as ``bytes`` and the row count as ``packets``.

``seconds`` is the in-process wall clock of steps 1-3 (engine already imported and configured);
``process_seconds`` runs from the top of this script (after its few stdlib imports) to the end of
step 3, so it includes importing the engine but not the interpreter's own start-up nor ``--check``;
time the command from outside for the full process. Both engines get ``--threads`` threads
(DuckDB's ``threads`` setting, Polars' ``POLARS_MAX_THREADS``) and write snappy parquet (Spark's
default codec) with their default row groups.

How each engine does it, the fastest plain way found on this 2-core machine:

* DuckDB: one ``COPY (SELECT … FROM read_csv(…)) TO 'DIR/packets' (PARTITION_BY (hour))`` streams
  the CSV into the partitioned parquet; a second ``COPY`` aggregates that parquet into
  ``hourly.parquet`` (quicker than first loading the CSV into an in-memory table and copying it
  out twice). Σ bytes is a last ``sum(bytes)`` over the written packets.
* Polars: one lazy ``scan_csv`` plan with three outputs (partitioned ``sink_parquet``, the
  aggregate's ``sink_parquet``, and a count/sum), run by ``collect_all``, which parses the CSV
  once for all three (quicker than an eager ``read_csv`` + ``write_parquet(partition_by=…)``).

``--check`` then reads the output back with pyarrow (untimed) and verifies that Σ bytes and the
packet count of ``hourly.parquet`` and of the partitioned packets equal what the engine reported
(and ``--expect-bytes`` / ``--expect-packets`` when given, e.g. the generator's true Σ bytes), that
the hourly row count matches, that ts is timestamp[us, UTC] and that every packet sits in the
partition of its own hour. Exit status 1 on any mismatch.

Why a separate script and virtualenv. DuckDB and Polars are only yardsticks, never runtime
dependencies of the project: they live in ``.venv-bench/`` (made by ``bench/setup_peers.sh`` from
``bench/requirements-peers.txt``), and this script imports nothing from the project, so it runs
there alone and its numbers are not mixed with the JVM's in one process.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import sys
import time
from pathlib import Path

PROCESS_START = time.perf_counter()  # before the engine (and pyarrow) is imported: see process_seconds

HOUR_FORMAT = "%Y-%m-%dT%H"  # the pipeline's hour key (traffic/storage/keys.py), e.g. 2026-03-10T05
# The feed's 8 columns in file order, with the type each is read as.
FEED_COLUMNS = {
    "new": "VARCHAR",
    "op": "VARCHAR",
    "ts_us": "BIGINT",
    "local_ip": "VARCHAR",
    "remote_ip": "VARCHAR",
    "local_port": "INTEGER",
    "remote_port": "INTEGER",
    "bytes": "BIGINT",
}


# -- DuckDB --------------------------------------------------------------------------------------


def run_duckdb(feed: Path, out: Path, threads: int) -> dict:
    """Stream the CSV into the partitioned parquet, then aggregate the parquet just written."""
    import duckdb

    con = duckdb.connect(config={"threads": threads})
    con.execute("SET TimeZone = 'UTC'")  # ts is TIMESTAMPTZ: keep the session zone out of it
    columns = "{" + ", ".join(f"'{name}': '{kind}'" for name, kind in FEED_COLUMNS.items()) + "}"
    written = sql_string(f"{out / 'packets'}/*/*.parquet")
    read_written = f"read_parquet({written}, hive_partitioning = true, hive_types = {{'hour': 'VARCHAR'}})"

    clock = time.perf_counter()
    packets = con.execute(f"""
        COPY (
            SELECT make_timestamp(ts_us)::TIMESTAMPTZ AS ts,
                   local_ip, remote_ip, local_port, remote_port, bytes,
                   strftime(make_timestamp(ts_us), '{HOUR_FORMAT}') AS hour
            FROM read_csv({sql_string(feed)}, header = false, auto_detect = false,
                          null_padding = true, columns = {columns})
            WHERE local_ip IS NOT NULL
        ) TO {sql_string(out / 'packets')} (FORMAT parquet, COMPRESSION snappy, PARTITION_BY (hour))
    """).fetchone()[0]
    hourly_rows = con.execute(f"""
        COPY (
            SELECT hour, local_ip, remote_ip, sum(bytes)::BIGINT AS bytes, count(*) AS packets
            FROM {read_written}
            GROUP BY hour, local_ip, remote_ip
        ) TO {sql_string(out / 'hourly.parquet')} (FORMAT parquet, COMPRESSION snappy)
    """).fetchone()[0]
    total_bytes = con.execute(f"SELECT sum(bytes)::BIGINT FROM {read_written}").fetchone()[0]
    seconds = time.perf_counter() - clock

    return {
        "engine": "duckdb",
        "version": duckdb.__version__,
        "threads": int(con.execute("SELECT current_setting('threads')").fetchone()[0]),
        "seconds": seconds,
        "packets": int(packets),
        "bytes": int(total_bytes or 0),
        "hourly_rows": int(hourly_rows),
    }


def sql_string(value: object) -> str:
    """A SQL string literal (paths are interpolated into DuckDB statements)."""
    return "'" + str(value).replace("'", "''") + "'"


# -- Polars --------------------------------------------------------------------------------------


def run_polars(feed: Path, out: Path, threads: int) -> dict:
    """One lazy plan with three outputs (packets, hourly, totals), run together by collect_all."""
    os.environ["POLARS_MAX_THREADS"] = str(threads)  # read once, when polars is first imported
    import polars as pl

    types = {"VARCHAR": pl.String, "BIGINT": pl.Int64, "INTEGER": pl.Int32}
    schema = {name: types[kind] for name, kind in FEED_COLUMNS.items()}
    naive_ts = pl.from_epoch("ts_us", time_unit="us")
    hourly_file = out / "hourly.parquet"

    clock = time.perf_counter()
    packets = (
        pl.scan_csv(feed, has_header=False, schema=schema)
        .filter(pl.col("local_ip").is_not_null())
        .select(
            ts=naive_ts.dt.replace_time_zone("UTC"),
            local_ip="local_ip",
            remote_ip="remote_ip",
            local_port="local_port",
            remote_port="remote_port",
            bytes="bytes",
            hour=naive_ts.dt.strftime(HOUR_FORMAT),
        )
    )
    write_packets = packets.sink_parquet(
        pl.PartitionBy(out / "packets", key="hour", include_key=False),
        compression="snappy", mkdir=True, lazy=True)
    write_hourly = (
        packets.group_by("hour", "local_ip", "remote_ip")
        .agg(bytes=pl.col("bytes").sum(), packets=pl.len().cast(pl.Int64))
        .sink_parquet(hourly_file, compression="snappy", lazy=True)
    )
    totals = packets.select(packets=pl.len(), bytes=pl.col("bytes").sum())
    # collect_all runs the three as one plan, so the CSV is parsed once (common subplan).
    total_packets, total_bytes = pl.collect_all([write_packets, write_hourly, totals])[2].row(0)
    hourly_rows = pl.scan_parquet(hourly_file).select(pl.len()).collect().item()  # from the footer
    seconds = time.perf_counter() - clock

    return {
        "engine": "polars",
        "version": pl.__version__,
        "threads": pl.thread_pool_size(),
        "seconds": seconds,
        "packets": int(total_packets),
        "bytes": int(total_bytes or 0),
        "hourly_rows": int(hourly_rows),
    }


ENGINES = {"duckdb": run_duckdb, "polars": run_polars}


# -- check ---------------------------------------------------------------------------------------


def check(out: Path, result: dict, expect_bytes: int | None, expect_packets: int | None) -> list[str]:
    """Read the output back with pyarrow; return the list of mismatches (empty when all is well)."""
    import pyarrow.compute as pc
    import pyarrow.parquet as pq

    hourly = pq.read_table(out / "hourly.parquet", columns=["bytes", "packets"])
    partitions = [read_partition(directory) for directory in sorted((out / "packets").iterdir())]
    found = {
        "hourly bytes": int(pc.sum(hourly["bytes"]).as_py() or 0),
        "hourly packets": int(pc.sum(hourly["packets"]).as_py() or 0),
        "hourly rows": hourly.num_rows,
        "partitioned bytes": sum(part["bytes"] for part in partitions),
        "partitioned packets": sum(part["packets"] for part in partitions),
    }
    wanted = {
        "hourly bytes": result["bytes"],
        "hourly packets": result["packets"],
        "hourly rows": result["hourly_rows"],
        "partitioned bytes": result["bytes"],
        "partitioned packets": result["packets"],
    }
    problems = [f"{name}: read back {found[name]}, engine reported {wanted[name]}"
                for name in found if found[name] != wanted[name]]
    if expect_bytes is not None and result["bytes"] != expect_bytes:
        problems.append(f"bytes: engine reported {result['bytes']}, expected {expect_bytes}")
    if expect_packets is not None and result["packets"] != expect_packets:
        problems.append(f"packets: engine reported {result['packets']}, expected {expect_packets}")
    for part in partitions:
        problems += part["problems"]
    return problems


def read_partition(directory: Path) -> dict:
    """Σ bytes and rows of one ``hour=KEY`` directory, and whether its ts really fall in hour KEY."""
    import pyarrow as pa
    import pyarrow.compute as pc
    import pyarrow.parquet as pq

    problems = []
    key = directory.name.removeprefix("hour=")
    if not directory.name.startswith("hour="):
        problems.append(f"{directory.name}: not a hive-style hour=KEY directory")
    files = sorted(directory.glob("*.parquet"))
    if not files:
        return {"bytes": 0, "packets": 0, "problems": [f"{directory.name}: no parquet file"]}
    table = pa.concat_tables(pq.read_table(file, columns=["ts", "bytes"]) for file in files)
    if table.schema.field("ts").type != pa.timestamp("us", tz="UTC"):
        problems.append(f"{directory.name}: ts is {table.schema.field('ts').type}, not timestamp[us, tz=UTC]")
    elif table.num_rows:  # all ts lie in hour KEY iff the earliest and the latest do
        span = pc.min_max(table["ts"])
        hours = {span["min"].as_py().strftime(HOUR_FORMAT), span["max"].as_py().strftime(HOUR_FORMAT)}
        if hours != {key}:
            problems.append(f"{directory.name}: holds packets of hour(s) {sorted(hours)}")
    return {"bytes": int(pc.sum(table["bytes"]).as_py() or 0), "packets": table.num_rows, "problems": problems}


# -- main ----------------------------------------------------------------------------------------


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--input", type=Path, required=True, help="router-feed CSV file")
    parser.add_argument("--out-dir", type=Path, required=True,
                        help="output directory: packets/ and hourly.parquet are replaced")
    parser.add_argument("--engine", choices=sorted(ENGINES), required=True)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--json", type=Path, help="write the result here (it is always printed)")
    parser.add_argument("--check", action="store_true", help="verify the output with pyarrow (untimed)")
    parser.add_argument("--expect-bytes", type=int, help="with --check: the true Σ bytes of the feed")
    parser.add_argument("--expect-packets", type=int, help="with --check: the true packet count")
    return parser.parse_args(argv)


def clear_outputs(out: Path) -> None:
    """Remove what an earlier run wrote here (only our own two outputs)."""
    out.mkdir(parents=True, exist_ok=True)
    shutil.rmtree(out / "packets", ignore_errors=True)
    (out / "hourly.parquet").unlink(missing_ok=True)


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    clear_outputs(args.out_dir)

    result = ENGINES[args.engine](args.input, args.out_dir, args.threads)
    result["process_seconds"] = time.perf_counter() - PROCESS_START
    result["process_note"] = "from the top of peers.py: engine import included; interpreter start-up and --check not"
    result["input"] = str(args.input)
    result["rows_per_second"] = result["packets"] / result["seconds"] if result["seconds"] else None

    status = 0
    if args.check:
        problems = check(args.out_dir, result, args.expect_bytes, args.expect_packets)
        result["check"] = {"ok": not problems, "problems": problems}
        status = 1 if problems else 0

    text = json.dumps(result, indent=2)
    print(text)
    if args.json:
        args.json.write_text(text + "\n")
    return status


if __name__ == "__main__":
    sys.exit(main())
