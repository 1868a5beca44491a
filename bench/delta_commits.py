"""What one delta-spark commit costs, by kind, and the Spark jobs it runs (issue 35).

    .venv/bin/python bench/delta_commits.py [--rounds N] [spark.conf=value ...]

Appends 100 rows to a small Delta table in four ways — plain, idempotent (``txnAppId``/``txnVersion``),
``replaceWhere`` and ``DELETE`` — and prints each kind's median seconds and the Spark jobs it started.
Settings given on the command line go to the session, to try Delta's own knobs against the same work.
Needs Delta's jars in ``jars/delta`` (``make setup``).
"""

from __future__ import annotations

import argparse
import shutil
import statistics
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
KINDS = ("plain", "txn", "replace_where", "delete")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=8)
    parser.add_argument("conf", nargs="*", help="spark.some.setting=value")
    args = parser.parse_args()
    from pyspark.sql import SparkSession

    jars = sorted(str(p) for p in (ROOT / "jars" / "delta").glob("*.jar"))
    if not jars:
        raise SystemExit("no Delta jars in jars/delta: run make setup")
    builder = (SparkSession.builder.master("local[2]").config("spark.jars", ",".join(jars))
               .config("spark.sql.extensions", "io.delta.sql.DeltaSparkSessionExtension")
               .config("spark.sql.catalog.spark_catalog", "org.apache.spark.sql.delta.catalog.DeltaCatalog")
               .config("spark.databricks.delta.snapshotPartitions", "1").config("spark.ui.enabled", "false")
               .config("spark.ui.showConsoleProgress", "false"))
    for item in args.conf:
        key, _, value = item.partition("=")
        builder = builder.config(key, value)
    spark = builder.getOrCreate()
    spark.sparkContext.setLogLevel("ERROR")
    tracker = spark.sparkContext.statusTracker()
    folder = Path(tempfile.mkdtemp(prefix="delta-commits-"))
    path = str(folder / "t")
    try:
        spark.range(10).selectExpr("id", "cast(id % 3 as int) as k").write.format("delta").save(path)
        seconds = {kind: [] for kind in KINDS}
        jobs = {kind: [] for kind in KINDS}
        for round_ in range(args.rounds):
            for kind in KINDS:
                before = set(tracker.getJobIdsForGroup(None))
                rows = spark.range(100).selectExpr("id", "1 as k")
                start = time.perf_counter()
                if kind == "plain":
                    rows.write.format("delta").mode("append").save(path)
                elif kind == "txn":
                    rows.write.format("delta").mode("append").option("txnAppId", "bench") \
                        .option("txnVersion", round_).save(path)
                elif kind == "replace_where":
                    rows.write.format("delta").mode("overwrite").option("replaceWhere", "k = 1").save(path)
                else:
                    spark.sql(f"DELETE FROM delta.`{path}` WHERE k = 2")
                seconds[kind].append(time.perf_counter() - start)
                jobs[kind].append(len(set(tracker.getJobIdsForGroup(None)) - before))
        print(f"{'commit':<14} {'median s':>9} {'Spark jobs':>10}   (rounds after the first two; {', '.join(args.conf) or 'defaults'})")
        for kind in KINDS:
            kept = seconds[kind][2:] or seconds[kind]
            print(f"{kind:<14} {statistics.median(kept):>9.3f} {statistics.median(jobs[kind][2:] or jobs[kind]):>10.0f}", flush=True)
    finally:
        spark.stop()
        shutil.rmtree(folder, ignore_errors=True)


if __name__ == "__main__":
    main()
