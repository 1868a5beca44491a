"""The Delta layer's contract, run against every engine available here, on local disk and on object storage
(a real S3 server: SeaweedFS on 127.0.0.1, issue 38).

The ``spark`` engine needs Delta Lake's jars on Spark's classpath (and, on S3, Hadoop's S3A connector beside
them): ``make setup`` fetches them from Maven Central into the default ``spark_jars_dir``. Without them its
run fails (it is not skipped).
"""

from __future__ import annotations

import uuid
from datetime import datetime, timezone

import pyarrow as pa
import pytest

from traffic.storage.table import StorageError

from traffic.runtime.connect import delta_classpath
from traffic.storage.engine import choose_engine
from traffic.storage.warehouse import Warehouse
from traffic.core.settings import load_settings

UTC = timezone.utc
JARS = load_settings(environ={}).spark_jars_dir


def _rows(hour: int, size: int) -> pa.Table:
    return pa.table({"hour": [datetime(2026, 11, 1, hour, tzinfo=UTC)], "local_ip": ["10.0.0.1"],
                     "remote_ip": ["192.0.2.1"], "bytes": [size], "packets": [1], "status": ["open"]})


@pytest.fixture(params=["rs", "spark", "rs on s3", "spark on s3"])
def warehouse(request, spark, tmp_path, monkeypatch):
    engine, _, on_s3 = request.param.partition(" on ")
    if engine == "spark" and not delta_classpath(JARS):
        pytest.fail(f"spark engine: Delta Lake's jars are not in {JARS}: run `make setup` where Maven Central "
                    "is reachable")
    root = tmp_path
    if on_s3:
        seaweed = request.getfixturevalue("seaweed")
        seaweed.export(monkeypatch)
        root = seaweed.url(f"contract-{uuid.uuid4().hex[:8]}")
    settings = load_settings(environ={}, overrides={"warehouse": root, "engine": engine, "spark_jars_dir": JARS})
    warehouse = Warehouse(settings, spark=spark)
    warehouse.create_all()
    return warehouse


#: The file-rewriting tests (compaction, merged days and months) with delta-spark on S3 cost 150 s of one worker
#: and test nothing the store changes: what the store changes is how a commit lands (the other tests here, and
#: ``test_object_storage.py``'s killed writer), not which files a rewrite reads and writes.
REWRITES = pytest.mark.parametrize("warehouse", ["rs", "spark", "rs on s3"], indirect=True)


def test_create_pins_protocol_without_features(warehouse):
    from deltalake import DeltaTable

    protocol = DeltaTable((warehouse.root / "hourly").uri, storage_options=warehouse.root.delta_options()).protocol()
    assert (protocol.min_reader_version, protocol.min_writer_version) == (1, 2)
    assert not protocol.reader_features and not protocol.writer_features


def test_empty_table_reads_empty(warehouse):
    assert warehouse.table("hourly").read_arrow().num_rows == 0
    assert warehouse.table("hourly").read().count() == 0


def test_append_is_idempotent_per_batch_id(warehouse):
    table = warehouse.table("hourly")
    assert table.append(_rows(10, 100), txn=("ingest", 1)) is True
    assert table.append(_rows(10, 100), txn=("ingest", 1)) is False
    assert table.append(_rows(11, 5), txn=("ingest", 2)) is True
    assert sorted(table.read_arrow().column("bytes").to_pylist()) == [5, 100]
    assert table.txn_version("ingest") == 2


def test_replace_swaps_exactly_those_partitions_atomically(warehouse):
    table = warehouse.table("hourly")
    table.append(pa.concat_tables([_rows(10, 100), _rows(11, 5)]))
    version = table.version()
    table.replace(_rows(10, 999), keys=["2026-11-01T10"])
    assert table.version() == version + 1
    assert sorted(table.read_arrow().column("bytes").to_pylist()) == [5, 999]
    with pytest.raises(StorageError, match="outside the keys"):
        table.replace(_rows(12, 1), keys=["2026-11-01T10"])
    assert sorted(table.read_arrow().column("bytes").to_pylist()) == [5, 999]


def test_delete_keys_and_pruned_reads(warehouse):
    table = warehouse.table("hourly")
    table.append(pa.concat_tables([_rows(h, h) for h in range(8, 14)]))
    table.delete_keys(["2026-11-01T08", "2026-11-01T09"])
    assert sorted(table.read_arrow().column("bytes").to_pylist()) == [10, 11, 12, 13]
    assert sorted(table.read_arrow(key_min="2026-11-01T12").column("bytes").to_pylist()) == [12, 13]
    assert table.read(keys=["2026-11-01T11"]).count() == 1


@REWRITES
def test_compaction_keeps_rows_and_bounds_files(warehouse):
    table = warehouse.table("hourly")
    for n in range(6):
        table.append(_rows(10, n))
    assert len(table.files()) == 6
    assert table.compact(min_files=2) == 6
    assert len(table.files()) == 1
    assert sorted(table.read_arrow().column("bytes").to_pylist()) == [0, 1, 2, 3, 4, 5]
    table.checkpoint()
    table.vacuum(retention_hours=0)
    assert sorted(table.read_arrow().column("bytes").to_pylist()) == [0, 1, 2, 3, 4, 5]
    assert len(table.history()) >= 7


def test_engine_choice(tmp_path):
    jars = tmp_path / "jars"
    jars.mkdir()
    assert choose_engine(load_settings(environ={}, overrides={"engine": "auto", "spark_jars_dir": jars})) == "rs"
    (jars / "delta-spark_2.13-4.0.0.jar").write_bytes(b"")
    assert choose_engine(load_settings(environ={}, overrides={"engine": "auto", "spark_jars_dir": jars})) == "spark"
    assert choose_engine(load_settings(environ={}, overrides={"engine": "rs", "spark_jars_dir": jars})) == "rs"


def test_delete_where_rewrites_only_matching_files(warehouse):
    table = warehouse.table("hourly")
    table.append(pa.concat_tables([_rows(10, 5), _rows(10, 500), _rows(11, 7)]))
    deleted = table.delete_where([("bytes", ">", 100)])
    assert deleted == 1
    assert sorted(table.read_arrow().column("bytes").to_pylist()) == [5, 7]
    if warehouse.engine == "rs":
        assert {f.key for f in table.files()} == {"2026-11-01T10", "2026-11-01T11"}


def test_rs_engine_refuses_a_table_with_delta_features_it_does_not_support(tmp_path):
    """A table another writer upgraded (deletion vectors) is refused when a job first opens it, with the
    features named; ``create_all`` leaves existing tables unopened (a job opens only what it uses)."""
    from deltalake import DeltaTable, Schema

    settings = load_settings(environ={}, overrides={"warehouse": tmp_path / "w", "inbox": tmp_path / "in"})
    warehouse = Warehouse(settings, engine="rs")
    warehouse.create_all()
    DeltaTable.create(str(tmp_path / "w" / "dv"), schema=Schema.from_arrow(warehouse.table("hourly").arrow_schema),
                      configuration={"delta.enableDeletionVectors": "true"})
    import shutil

    shutil.rmtree(tmp_path / "w" / "hourly")
    (tmp_path / "w" / "dv").rename(tmp_path / "w" / "hourly")
    fresh = Warehouse(settings, engine="rs")
    fresh.create_all()
    with pytest.raises(StorageError, match="deletionVectors"):
        fresh.table("hourly").read_arrow()
    assert fresh.table("clocks").read_arrow().num_rows == 0


def _last_checkpoint(table) -> int:
    import json

    return json.loads((table.path / "_delta_log" / "_last_checkpoint").read_text())["version"]


def test_rs_tables_checkpoint_every_few_commits_and_close_catches_up_older_ones(tmp_path):
    """Opening a table replays every commit since its last checkpoint, so the tail is kept short: new
    tables checkpoint every ``CHECKPOINT_EVERY`` commits, and the close's maintenance checkpoints a table
    made with a longer interval (an older warehouse) once its tail is longer than that."""
    import shutil

    from deltalake import DeltaTable, Schema

    from traffic.accounting.close import maintain
    from traffic.storage.table import CHECKPOINT_EVERY

    settings = load_settings(environ={}, overrides={"warehouse": tmp_path / "w", "inbox": tmp_path / "in"})
    warehouse = Warehouse(settings, engine="rs")
    warehouse.create_all()
    hourly = warehouse.table("hourly")
    for n in range(CHECKPOINT_EVERY + 2):
        hourly.append(_rows(n % 24, n))
    assert hourly.version() - _last_checkpoint(hourly) < CHECKPOINT_EVERY
    assert not hourly.checkpoint_due()

    DeltaTable.create(str(tmp_path / "old"), schema=Schema.from_arrow(hourly.arrow_schema),
                      configuration={"delta.checkpointInterval": "50"})
    shutil.rmtree(hourly.path)
    (tmp_path / "old").rename(hourly.path)
    older = Warehouse(settings, engine="rs")
    table = older.table("hourly")
    for n in range(CHECKPOINT_EVERY + 2):
        table.append(_rows(n % 24, n))
    assert not (table.path / "_delta_log" / "_last_checkpoint").exists()
    assert table.checkpoint_due()
    maintain(older)
    assert _last_checkpoint(table) == table.version()
    assert not table.checkpoint_due()
    assert table.read_arrow().num_rows == CHECKPOINT_EVERY + 2


# -- merged days (Table.merge) ---------------------------------------------------------------------
def _hour_rows(start: datetime, hours: range, tag: int = 0) -> pa.Table:
    """Two rows an hour; ``bytes`` names the row (hour index, tag), so any lost or extra row shows."""
    from datetime import timedelta

    stamps = [start + timedelta(hours=h) for h in hours for _ in range(2)]
    return pa.table({"hour": stamps, "local_ip": [f"10.0.0.{i % 2 + 1}" for i in range(len(stamps))],
                     "remote_ip": ["192.0.2.1"] * len(stamps),
                     "bytes": [h * 10 + i + tag * 1000 for h in hours for i in range(2)],
                     "packets": [1] * len(stamps), "status": ["final"] * len(stamps)})


def _by_key(table: pa.Table) -> dict[str, list[int]]:
    out: dict[str, list[int]] = {}
    for hour, size in zip(table.column("hour").to_pylist(), table.column("bytes").to_pylist()):
        out.setdefault(hour.strftime("%Y-%m-%dT%H"), []).append(size)
    return {k: sorted(v) for k, v in sorted(out.items())}


_RANGES = [(None, None), ("2026-10-01T05", None), (None, "2026-10-02T00"), ("2026-10-01T23", "2026-10-02T01"),
           ("2026-10-02T00", "2026-10-03T00"), ("2026-10-02T00", "2026-10-02T00"), (None, "2026-10-01T00"),
           ("2026-10-02T23", "2026-10-03T02"), ("2026-10-03T02", None), ("2026-10-01T00", "2026-10-01T01")]


def _assert_reads(table, model: dict[str, list[int]]) -> None:
    """Every read (by keys, by range, Arrow and Spark) returns exactly the model's rows, and the keys listed are
    the model's (a merged day lists its hours)."""
    assert _by_key(table.read_arrow()) == model
    assert table.keys() == sorted(model)
    for key in ["2026-10-01T00", "2026-10-01T05", "2026-10-01T23", "2026-10-02T00", "2026-10-02T11",
                "2026-10-03T01", "2026-10-04T00"]:
        assert _by_key(table.read_arrow(keys=[key], columns=["hour", "bytes"])) == \
            ({key: model[key]} if key in model else {}), key
    pair = ["2026-10-01T03", "2026-10-02T20"]
    assert _by_key(table.read_arrow(keys=iter(pair))) == {k: model[k] for k in pair if k in model}
    for key_min, key_max in _RANGES:
        expected = {k: v for k, v in model.items() if (key_min is None or k >= key_min) and (key_max is None or k < key_max)}
        assert _by_key(table.read_arrow(key_min=key_min, key_max=key_max)) == expected, (key_min, key_max)
        assert _by_key(table.read(key_min=key_min, key_max=key_max).toArrow()) == expected, (key_min, key_max)
    assert _by_key(table.read(keys=["2026-10-01T07", "2026-10-03T00"]).toArrow()) == \
        {k: model[k] for k in ["2026-10-01T07", "2026-10-03T00"] if k in model}


@REWRITES
def test_merged_days_read_and_write_exactly_like_hours(warehouse):
    """Merging finished days into one file each changes no read; replacing or deleting an hour of a merged
    day keeps the day's other hours; a day merged again after such a write is one file again."""
    from datetime import timedelta

    table = warehouse.table("hourly")
    t0 = datetime(2026, 10, 1, tzinfo=UTC)
    # Two whole days and three hours of the third, a file per hour: an hour per commit with delta-rs on disk;
    # six hours per commit (each hour still its own file) on a store and with delta-spark, whose 51 commits
    # took 100 s of the suite on disk alone (~1 s a commit).
    step = 1 if warehouse.root.is_local and warehouse.engine == "rs" else 6
    for h in range(0, 51, step):
        hours = range(h, min(h + step, 51))
        table.replace(_hour_rows(t0, hours), keys=[f"{t0 + timedelta(hours=n):%Y-%m-%dT%H}" for n in hours])
    assert len(table.files()) == 51
    model = _by_key(table.read_arrow())
    assert len(model) == 51
    _assert_reads(table, model)

    removed = table.merge(t0 + timedelta(days=2, hours=5))  # the third day is not finished: not merged
    if warehouse.engine == "rs":
        assert removed == 48
        assert sorted(f.key for f in table.files()) == ["2026-10-01", "2026-10-02", "2026-10-03T00",
                                                         "2026-10-03T01", "2026-10-03T02"]
        assert table.merge(t0 + timedelta(days=2)) == 0  # nothing left to merge
    _assert_reads(table, model)

    table.replace(_hour_rows(t0, range(5, 6), tag=7), keys=["2026-10-01T05"])
    model["2026-10-01T05"] = [7050, 7051]
    _assert_reads(table, model)
    table.delete_keys(["2026-10-01T06", "2026-10-02T00", "2026-10-03T01"])
    for key in ("2026-10-01T06", "2026-10-02T00", "2026-10-03T01"):
        del model[key]
    _assert_reads(table, model)
    # A row-level delete confined to some hours leaves the same values in the day's other hours alone.
    assert table.delete_where([("local_ip", "=", "10.0.0.1")], keys=["2026-10-01T07", "2026-10-02T07"]) == 2
    model["2026-10-01T07"], model["2026-10-02T07"] = [71], [311]
    _assert_reads(table, model)
    with pytest.raises(StorageError, match="outside the keys"):
        table.replace(_hour_rows(t0, range(9, 11)), keys=["2026-10-01T09"])
    _assert_reads(table, model)

    table.merge(t0 + timedelta(days=3))
    if warehouse.engine == "rs":
        assert sorted(f.key for f in table.files()) == ["2026-10-01", "2026-10-02", "2026-10-03"]
    _assert_reads(table, model)
    table.compact(min_files=2)
    _assert_reads(table, model)


@REWRITES
def test_daily_merges_finished_months(warehouse):
    from datetime import date

    table = warehouse.table("daily")
    days = [date(2026, 9, 29), date(2026, 9, 30), date(2026, 10, 1), date(2026, 10, 2)]
    for n, day in enumerate(days):
        table.replace(pa.table({"day": [day], "month": [day.replace(day=1)], "local_ip": ["10.0.0.1"],
                                "remote_ip": ["192.0.2.1"], "bytes": [n], "packets": [1]}), keys=[f"{day:%Y-%m-%d}"])
    removed = table.merge(datetime(2026, 10, 2, tzinfo=UTC))
    if warehouse.engine == "rs":
        assert removed == 2
        assert sorted(f.key for f in table.files()) == ["2026-09", "2026-10-01", "2026-10-02"]
    assert table.read_arrow(keys=["2026-09-30"]).column("bytes").to_pylist() == [1]
    assert sorted(table.read_arrow(key_min="2026-09-30", key_max="2026-10-02").column("bytes").to_pylist()) == [1, 2]
    assert table.read(keys=["2026-09-29"]).count() == 1


def test_maintenance_gives_older_tables_todays_settings(tmp_path):
    """A table made by an older version (7 days of log, checkpoints every 50 commits) is given today's
    ``TABLE_CONFIGURATION`` by the close's periodic maintenance, once."""
    import shutil

    from deltalake import DeltaTable, Schema

    from traffic.storage.table import TABLE_CONFIGURATION

    settings = load_settings(environ={}, overrides={"warehouse": tmp_path / "w", "inbox": tmp_path / "in"})
    warehouse = Warehouse(settings, engine="rs")
    warehouse.create_all()
    table = warehouse.table("hourly")
    assert table.configure() is False
    DeltaTable.create(str(tmp_path / "old"), schema=Schema.from_arrow(table.arrow_schema),
                      configuration={"delta.checkpointInterval": "50", "delta.logRetentionDuration": "interval 7 days"})
    shutil.rmtree(table.path)
    (tmp_path / "old").rename(table.path)
    older = Warehouse(settings, engine="rs").table("hourly")
    assert older.configure() is True
    assert Warehouse(settings, engine="rs").table("hourly")._delta().metadata().configuration == TABLE_CONFIGURATION
    assert older.configure() is False


@pytest.mark.parametrize("warehouse", ["spark", "spark on s3"], indirect=True)
def test_delta_spark_vacuum_drops_the_staged_folders_a_crashed_write_left(warehouse):
    """delta-spark stages a write's rows under ``_traffic/staging/<table>/<id>/`` and removes them after the
    commit; a crashed write's folder (with files, or left empty on disk) goes at the table's next vacuum once
    older than the retention, on disk and on a store; a write's fresh folder stays. (The rs engine stages inside
    the table's own folder, where Delta's vacuum finds what a crash left.)"""
    import os
    import time

    table = warehouse.table("hourly")
    table.append(_rows(10, 1))
    staging = warehouse.state_dir() / "staging" / "hourly"
    crashed, fresh = staging / "crashed", staging / "fresh"
    for folder in (crashed, fresh):
        (folder / "k=2026-11-01T10").mkdir()
        (folder / "k=2026-11-01T10" / "part-00000.parquet").write_atomic(b"rows of a write that never committed")
    if warehouse.root.is_local:
        (staging / "empty").local.mkdir()
        old = time.time() - 3 * 3600
        for path in [(staging / "empty").local, *crashed.local.rglob("*")]:
            os.utime(path, (old, old))
        table.vacuum(retention_hours=2)
        assert sorted(p.name for p in staging.children()) == ["fresh"]
    else:  # a store stamps an object when it is put: a retention of 0 takes every staged folder
        table.vacuum(retention_hours=0)
        assert list(staging.files()) == []
    assert table.read_arrow().column("bytes").to_pylist() == [1]
