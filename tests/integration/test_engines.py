"""Both Delta engines on one table (DESIGN §8): a table either engine created is written by the other and
read alike by both, and by delta-spark's and delta-rs's own readers; two writers at once lose and double
nothing.

The spark engine needs Delta Lake's jars; ``make setup`` fetches them from Maven Central. Without them
these tests fail (they are not skipped): the suite is to run on both engines.
"""

from __future__ import annotations

import threading
from datetime import date, datetime, timedelta, timezone

import pyarrow as pa
import pytest

from traffic.core.settings import load_settings
from traffic.storage import schemas
from traffic.storage.engine import choose_engine
from traffic.storage.warehouse import Warehouse

UTC = timezone.utc
HOURS = [datetime(2026, 11, 1, 10, tzinfo=UTC), datetime(2026, 11, 1, 11, tzinfo=UTC)]


@pytest.fixture(scope="module")
def jars_dir():
    settings = load_settings(environ={})
    if choose_engine(settings.replace(engine="auto")) != "spark":
        pytest.fail(f"Delta Lake's jars are not in {settings.spark_jars_dir}: run `make setup` where Maven Central "
                    "is reachable (the spark engine's tests need them)")
    return settings.spark_jars_dir


def _warehouse(root, engine: str, spark) -> Warehouse:
    return Warehouse(load_settings(environ={}, overrides={"warehouse": root, "engine": engine}), spark=spark)


def _value(field: pa.Field, n: int, when: datetime):
    kind = field.type
    if pa.types.is_timestamp(kind):
        return when + timedelta(minutes=n)
    if pa.types.is_date(kind):
        return when.date()
    if pa.types.is_boolean(kind):
        return n % 2 == 0
    if pa.types.is_integer(kind):
        return 1000 + n
    if pa.types.is_floating(kind):
        return 0.5 + n
    if pa.types.is_decimal(kind):
        from decimal import Decimal

        return Decimal(n)
    if pa.types.is_string(kind) or pa.types.is_large_string(kind):
        return f"{field.name}-{n}"
    if pa.types.is_list(kind) or pa.types.is_large_list(kind):
        return []
    if pa.types.is_map(kind):
        return []
    if pa.types.is_struct(kind):
        return None if field.nullable else {f.name: _value(f, n, when) for f in kind}
    raise AssertionError(f"no sample value for {field}")


def _rows(table: str, when: datetime, first: int, count: int = 2) -> pa.Table:
    """``count`` rows of ``table`` whose cluster column falls in ``when``'s hour (its day, its month)."""
    schema = schemas.arrow_schema(table)
    cluster = schemas.cluster(table)
    rows = []
    for n in range(first, first + count):
        row = {f.name: _value(f, n, when) for f in schema}
        if cluster:
            kind = schema.field(cluster.column).type
            start = when if cluster.grain == "hour" else when.replace(hour=0) if cluster.grain == "day" \
                else when.replace(day=1, hour=0)
            row[cluster.column] = start.date() if pa.types.is_date(kind) else start
        rows.append(row)
    return pa.Table.from_pylist(rows, schema=schema)


def _sorted(table: pa.Table) -> list:
    columns = sorted(table.column_names)
    return sorted((tuple(repr(row[c]) for c in columns) for row in table.select(columns).to_pylist()))


def _read_everywhere(root, table: str, spark) -> dict[str, list]:
    """The table's rows as each reader sees them: the layer's own reads, delta-spark's, delta-rs's."""
    from deltalake import DeltaTable

    path = str(root / table)
    schema = schemas.arrow_schema(table)
    ours = Warehouse.reader(load_settings(environ={}, overrides={"warehouse": root})).table(table).read_arrow()
    delta_spark = spark.read.format("delta").load(path).toArrow()
    delta_rs = DeltaTable(path).to_pyarrow_table()
    return {name: _sorted(_conform(rows, schema)) for name, rows in
            (("layer", ours), ("delta-spark", delta_spark), ("delta-rs", delta_rs))}


def _conform(rows: pa.Table, schema: pa.Schema) -> pa.Table:
    arrays = []
    for field in schema:
        column = rows.column(field.name)
        if pa.types.is_timestamp(field.type) and pa.types.is_timestamp(column.type) and column.type.tz is None:
            column = column.cast(pa.timestamp("us")).cast(pa.timestamp("us", tz="UTC"))
        arrays.append(column.cast(field.type))
    return pa.Table.from_arrays(arrays, schema=schema)


@pytest.mark.parametrize("creator,writer", [("rs", "spark"), ("spark", "rs")])
@pytest.mark.parametrize("table", schemas.TABLES)
def test_a_table_created_by_one_engine_is_written_by_the_other_and_read_alike(spark, jars_dir, tmp_path, table,
                                                                              creator, writer):
    first = _warehouse(tmp_path, creator, spark).table(table)
    first.create()
    first.append(_rows(table, HOURS[0], 0), txn=("mixed", 1))
    second = _warehouse(tmp_path, writer, spark).table(table)
    second.create()  # already there: nothing happens
    assert second.append(_rows(table, HOURS[0], 0), txn=("mixed", 1)) is False  # the other engine's batch 1
    assert second.append(_rows(table, HOURS[1], 10), txn=("mixed", 2)) is True
    expected = [_rows(table, HOURS[0], 0), _rows(table, HOURS[1], 10)]
    if schemas.cluster(table) and schemas.cluster(table).grain == "hour":
        second.replace(_rows(table, HOURS[0], 20, 3), keys=[HOURS[0]])
        expected = [_rows(table, HOURS[0], 20, 3), _rows(table, HOURS[1], 10)]
    want = _sorted(pa.concat_tables(expected))
    seen = _read_everywhere(tmp_path, table, spark)
    assert seen == {"layer": want, "delta-spark": want, "delta-rs": want}
    engines = {commit.get("engineInfo", "") for commit in first.history()}
    assert any("Delta-Lake" in e for e in engines) and any("delta-rs" in e for e in engines), engines


def test_two_engines_replacing_one_hour_at_once_leave_one_of_them_whole(spark, jars_dir, tmp_path):
    """Optimistic concurrency on one table: each writer replaces the same hour (and appends its own
    batch) at the same time; whichever loses is retried (delta-spark) or refused (delta-rs), and the hour
    holds exactly one writer's rows, never both, never neither; both batches are in once."""
    _warehouse(tmp_path, "rs", spark).create_all()
    writers = {"spark": _warehouse(tmp_path, "spark", spark).table("hourly"),
               "rs": _warehouse(tmp_path, "rs", spark).table("hourly")}
    rows = {"spark": _rows("hourly", HOURS[0], 100, 3), "rs": _rows("hourly", HOURS[0], 200, 4)}
    refused, start = {}, threading.Barrier(2)

    def work(name: str) -> None:
        table = writers[name]
        start.wait()
        for round_ in range(3):
            for write in (lambda: table.replace(rows[name], keys=[HOURS[0]], op="freeze"),
                          lambda: table.append(_rows("hourly", HOURS[1], 1000 * (round_ + 1) + (500 if name == "spark"
                                                                                               else 0)),
                                               txn=(f"batch-{name}", round_ + 1))):
                try:
                    write()
                except Exception as error:  # noqa: BLE001 - a refused commit is an outcome here, said below
                    refused.setdefault(name, []).append(type(error).__name__)

    threads = [threading.Thread(target=work, args=(name,)) for name in writers]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout=600)
    hour = Warehouse.reader(load_settings(environ={}, overrides={"warehouse": tmp_path})).table("hourly")
    replaced = _sorted(hour.read_arrow(keys=[HOURS[0]]))
    assert replaced in (_sorted(rows["spark"]), _sorted(rows["rs"])), replaced
    appended = hour.read_arrow(keys=[HOURS[1]]).column("bytes").to_pylist()
    assert len(appended) == len(set(appended)), sorted(appended)  # no batch's rows twice
    want = []
    for name in writers:
        done = hour.txn_version(f"batch-{name}")
        assert done is not None and 1 <= done <= 3, (name, done, refused)
        for round_ in range(1, done + 1):
            want += _rows("hourly", HOURS[1], 1000 * round_ + (500 if name == "spark" else 0)).column("bytes").to_pylist()
    assert sorted(appended) == sorted(want), refused  # each committed batch whole, once
    assert set(refused) <= {"rs"}, refused  # delta-spark retries a lost race; delta-rs refuses it


PLAIN_READER = """
import glob, json, sys
from pyspark.sql import SparkSession
jars, root, tables = sys.argv[1], sys.argv[2], sys.argv[3].split(",")
spark = (SparkSession.builder.master("local[1]").config("spark.ui.enabled", "false")
         .config("spark.jars", ",".join(sorted(glob.glob(jars + "/*.jar"))))
         .config("spark.sql.extensions", "io.delta.sql.DeltaSparkSessionExtension")
         .config("spark.sql.catalog.spark_catalog", "org.apache.spark.sql.delta.catalog.DeltaCatalog").getOrCreate())
out = {}
for name in tables:
    path = f"{root}/{name}"
    history = spark.sql(f"DESCRIBE HISTORY delta.`{path}`").collect()
    out[name] = {"rows": spark.read.format("delta").load(path).count(), "commits": len(history),
                 "engines": sorted({r["engineInfo"] or "" for r in history})}
print(json.dumps(out))
"""


def test_the_pipeline_on_delta_spark_commits_every_table_with_it(spark, jars_dir, tmp_path):
    """The seed-like run (three batches, closes, a day rolled up, raw detail expired) on the spark engine:
    every commit of every table is delta-spark's; a plain pyspark given only the fetched jars reads each
    table and its history, delta-rs reads the same rows."""
    import json
    import subprocess
    import sys

    from deltalake import DeltaTable

    from tests.support.harness import Harness, feed_line, tick_line

    harness = Harness(tmp_path, spark, engine="spark", keep_hours=2)
    start = datetime(2026, 10, 31, 21, tzinfo=UTC)
    for batch in range(3):
        at = start + timedelta(hours=2 * batch)
        harness.deliver("r1", "\n".join([feed_line(at + timedelta(minutes=m), f"10.0.0.{m % 3 + 1}")
                                         for m in range(0, 50, 7)] + [tick_line(at + timedelta(hours=2))]) + "\n")
        harness.ingest()
        harness.close()
    root = harness.settings.warehouse
    assert harness.table("daily"), "the day 2026-10-31 was to be rolled up"
    reader = Warehouse.reader(harness.settings)
    for name in schemas.TABLES:
        engines = {commit.get("engineInfo", "") for commit in reader.table(name).history()}
        assert engines and all("Delta-Lake" in e for e in engines), (name, engines)
    plain = subprocess.run([sys.executable, "-c", PLAIN_READER, str(jars_dir), str(root), ",".join(schemas.TABLES)],
                           capture_output=True, text=True, timeout=600)
    assert plain.returncode == 0, plain.stderr[-3000:]
    seen = json.loads(plain.stdout.strip().splitlines()[-1])
    for name in schemas.TABLES:
        assert seen[name]["rows"] == DeltaTable(str(root / name)).to_pyarrow_table().num_rows \
            == reader.table(name).read_arrow().num_rows, (name, seen[name])
        assert all("Delta-Lake" in e for e in seen[name]["engines"]), (name, seen[name])
    assert seen["hourly"]["rows"] > 0 and seen["packets"]["commits"] > 1
