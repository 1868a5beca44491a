"""The Delta layer's contract, run against every engine available here.

The ``spark`` engine needs Delta Lake's jars on Spark's classpath, which cannot be had on
this machine (no Maven access): its run is skipped with that reason unless
``TRAFFIC_SPARK_JARS_DIR`` names a folder holding them.
"""

from __future__ import annotations

import os
from datetime import datetime, timezone

import pyarrow as pa
import pytest

from traffic.delta import StorageError, Warehouse, choose_engine
from traffic.settings import load_settings

UTC = timezone.utc
JARS = os.environ.get("TRAFFIC_SPARK_JARS_DIR")


def _rows(hour: int, size: int) -> pa.Table:
    return pa.table({"hour": [datetime(2026, 11, 1, hour, tzinfo=UTC)], "local_ip": ["10.0.0.1"],
                     "remote_ip": ["192.0.2.1"], "bytes": [size], "packets": [1], "status": ["open"]})


@pytest.fixture(params=["rs", "spark"])
def warehouse(request, spark, tmp_path):
    if request.param == "spark" and not JARS:
        pytest.skip("spark engine: Delta Lake jars are not on this machine (no Maven access); "
                    "set TRAFFIC_SPARK_JARS_DIR where they are")
    settings = load_settings(environ={}, overrides={"warehouse": tmp_path, "engine": request.param,
                                                    "spark_jars_dir": JARS})
    warehouse = Warehouse(settings, spark=spark)
    warehouse.create_all()
    return warehouse


def test_create_pins_protocol_without_features(warehouse):
    from deltalake import DeltaTable

    protocol = DeltaTable(str(warehouse.root / "hourly")).protocol()
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


def test_compaction_keeps_rows_and_bounds_files(warehouse):
    if warehouse.engine != "rs":
        pytest.skip("file counts are the rs engine's to manage")
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
    assert choose_engine(load_settings(environ={}, overrides={"engine": "auto"})) == "rs"
    jars = tmp_path / "jars"
    jars.mkdir()
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

    from traffic.close import maintain
    from traffic.delta import CHECKPOINT_EVERY

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
