"""The spark engine: delta-spark writes and commits every change, as a Spark/Delta platform would.

Used wherever Delta Lake's jars are on Spark's classpath (the set-up fetches them, DESIGN §8). Every
change is Delta's own: appends with ``txnAppId``/``txnVersion`` (a batch already committed is
skipped by Delta itself), periods replaced with ``replaceWhere``, deletes as ``DELETE`` (idempotent
through the session's ``txnAppId``/``txnVersion``), compaction and merges as
``replaceWhere`` rewrites of the same rows, ``VACUUM`` and checkpoints by Delta. Statements go through SQL and the DataFrame writer, so
a Spark Connect session (the warm server) works as a classic one does.

The files keep the layout the reads rely on (``traffic.storage.table``): rows reach Delta's writer
one cluster key per task, so each file holds one key, found again from its min/max statistics.

On object storage (``warehouse = "s3://…"``) delta-spark reads and writes through Hadoop's S3A connector
(``s3a://``, its jars pinned beside Delta's), with the store's settings set on the session, and Delta's
``S3SingleDriverLogStore``: safe for one writing driver at a time, which the warehouse's lease ensures.
Each commit is made only while this job still holds the lease (``check_lease``).
"""

from __future__ import annotations

import json
import time
import uuid
import weakref
from datetime import datetime, timedelta
from typing import Any, Iterable

import pyarrow as pa

from traffic.core.settings import s3a_classpath
from traffic.storage import schemas
from traffic.storage.journal import check_lease
from traffic.storage.keys import KEY_FORMATS, KEY_LENGTH, NULL_KEY, SPAN_GRAIN, cluster_key, key_groups
from traffic.storage.place import Place
from traffic.storage.staging import DRIVER_THREADS, Staged, write_keyed
from traffic.storage.table import (PROTOCOL, TABLE_CONFIGURATION, WIDE, DataFile, StorageError, Table,
                                   arrow_predicate)

#: A commit that lost a race with another writer (Delta's optimistic concurrency) is tried again this
#: many times; an idempotent write first checks whether the other writer was this same batch.
RETRIES = 3


def _conflict(error: Exception) -> bool:
    """Whether Delta refused a commit because another writer committed first (a retry may succeed)."""
    text = f"{type(error).__name__} {error}"
    return any(word in text for word in ("ConcurrentAppend", "ConcurrentDelete", "ConcurrentTransaction",
                                         "ConcurrentWrite", "ProtocolChanged", "MetadataChanged",
                                         "DELTA_CONCURRENT"))


def _key_bounds(key: str, column_type: pa.DataType, grain: str) -> tuple[str, str]:
    """The SQL literals bounding one cluster key: ``[start, end)`` of its hour, day or month."""
    start = datetime.strptime(key, KEY_FORMATS[grain])
    if grain == "hour":
        end = start + timedelta(hours=1)
    elif grain == "day":
        end = start + timedelta(days=1)
    else:
        end = (start.replace(day=28) + timedelta(days=4)).replace(day=1)
    if pa.types.is_date(column_type):
        return f"DATE'{start:%Y-%m-%d}'", f"DATE'{end:%Y-%m-%d}'"
    return f"TIMESTAMP'{start:%Y-%m-%d %H:%M:%S}+00:00'", f"TIMESTAMP'{end:%Y-%m-%d %H:%M:%S}+00:00'"


class SparkTable(Table):
    """delta-spark writes; reads are the shared ones (``Table``)."""

    def __init__(self, warehouse, name: str):
        super().__init__(warehouse, name)
        if not self.path.is_local and not s3a_classpath(warehouse.settings.spark_jars_dir):
            raise StorageError(f"the spark engine writes {warehouse.root} through Hadoop's S3A connector, whose jars "
                               f"are not in {warehouse.settings.spark_jars_dir}: run `make setup`, or set engine = rs")
        self.uri = self.path.spark_uri

    def _spark(self):
        spark = self.warehouse.spark
        if spark is None:
            raise StorageError("the spark engine needs a SparkSession")
        if not self.path.is_local:
            _reach_store(spark, self.path.location)
        return spark

    def _guard(self) -> None:
        """Just before a commit: on object storage, ``LeaseLost`` unless this job still holds the lease."""
        check_lease(self.warehouse.root)

    @property
    def _sql_name(self) -> str:
        return f"delta.`{self.uri}`"

    def create(self) -> None:
        """Create the table from its schema with pinned protocol and no optional features."""
        if self.exists():
            return
        columns = ", ".join(f"`{f.name}` {f.dataType.simpleString()}{'' if f.nullable else ' NOT NULL'}"
                            for f in schemas.spark_schema(self.name).fields)
        properties = {**TABLE_CONFIGURATION, "delta.minReaderVersion": str(PROTOCOL[0]),
                      "delta.minWriterVersion": str(PROTOCOL[1])}
        listed = ", ".join(f"'{k}' = '{v}'" for k, v in properties.items())
        spark = self._spark()
        self._guard()
        try:
            spark.sql(f"CREATE TABLE IF NOT EXISTS {self._sql_name} ({columns}) USING delta "
                              f"TBLPROPERTIES ({listed})")
        except Exception as error:  # noqa: BLE001 - a racing creator made it first: fine if it exists now
            if not self.exists():
                raise StorageError(f"table {self.name} cannot be created: {error}") from None
        self._check_protocol(self._delta())

    # -- writes -------------------------------------------------------------------------
    def append(self, data, txn: tuple[str, int] | None = None, op: str = "append") -> bool:
        """Append rows; with ``txn=(app_id, version)`` a version already committed is skipped."""
        return self._write(data, "append", None, txn, op)

    def replace(self, data, keys: Iterable[str | None], txn: tuple[str, int] | None = None,
                op: str = "replace") -> bool:
        """Atomically replace the rows of these cluster keys with ``data`` (which must fall inside them)."""
        keys = self._check_keys(keys)
        return self._write(data, "overwrite", set(keys), txn, op)

    def overwrite(self, data, txn: tuple[str, int] | None = None, op: str = "overwrite") -> bool:
        """Atomically replace the whole table."""
        return self._write(data, "overwrite", None, txn, op)

    def delete_keys(self, keys: Iterable[str | None], txn: tuple[str, int] | None = None, op: str = "delete") -> bool:
        """Remove every row of these cluster keys in one commit."""
        keys = self._check_keys(keys)
        if not keys:
            return False
        return self._write(None, "overwrite", set(keys), txn, op)

    def delete_where(self, conditions: list[tuple[str, str, Any]], keys=None, txn=None, op: str = "delete") -> int:
        """Delete rows matching every ``(column, op, value)`` condition, in one ``DELETE`` commit; returns
        the number of rows deleted."""
        if self._done(txn):
            return 0
        condition = _sql_predicate(conditions)
        if keys is not None:
            scope = self._key_predicate(set(self._check_keys(keys)))
            condition = f"({condition}) AND ({scope})"
        self.step(f"{self.name}.{op}.files_written")
        spark = self._spark()
        self._guard()
        if txn is not None:
            spark.conf.set("spark.databricks.delta.write.txnAppId", txn[0])
            spark.conf.set("spark.databricks.delta.write.txnVersion", str(txn[1]))
        spark.conf.set("spark.databricks.delta.commitInfo.userMetadata", json.dumps({"traffic.op": op}))
        try:
            result = spark.sql(f"DELETE FROM {self._sql_name} WHERE {condition}").collect()
        finally:
            for name in ("spark.databricks.delta.write.txnAppId", "spark.databricks.delta.write.txnVersion",
                         "spark.databricks.delta.commitInfo.userMetadata"):
                spark.conf.unset(name)
        self.step(f"{self.name}.{op}.committed")
        return int(result[0][0]) if result and result[0][0] is not None else 0

    def _done(self, txn) -> bool:
        if txn is None or not self.exists():
            return False
        done = self.txn_version(txn[0])
        return done is not None and done >= txn[1]

    def _write(self, data, mode: str, keys: set | None, txn, op: str) -> bool:
        """One Delta write: ``data`` appended, or replacing ``keys`` (``replaceWhere``), or the whole table."""
        if self._done(txn):
            return False
        frame, folder, written = self._frame(data, keys)
        if keys is not None and not written and not keys:
            self._drop(folder)
            return False
        writer = frame.write.format("delta").mode(mode).option("mergeSchema", "true") \
            .option("userMetadata", json.dumps({"traffic.op": op}))
        if keys is not None:
            writer = writer.option("replaceWhere", self._key_predicate(keys))
        if txn is not None:
            writer = writer.option("txnAppId", txn[0]).option("txnVersion", txn[1])
        self.step(f"{self.name}.{op}.files_written")
        for attempt in range(RETRIES + 1):
            self._guard()
            try:
                writer.save(self.uri)
                break
            except Exception as error:  # noqa: BLE001 - Py4J and Spark Connect raise different kinds
                if "DELTA_REPLACE_WHERE_MISMATCH" in str(error):
                    raise StorageError(f"{self.name}: rows fall outside the keys being replaced") from None
                if not _conflict(error) or attempt == RETRIES:
                    raise
                if self._done(txn):  # the other writer was this same batch: it is in
                    break
        self.step(f"{self.name}.{op}.committed")
        self._drop(folder)
        return True

    def _frame(self, data, keys: set | None):
        """``data`` as a DataFrame whose tasks each hold one cluster key (so each file Delta writes does),
        the folder it was staged in (removed after the commit), and whether it has rows. Rows outside
        ``keys`` are refused here when their keys are known without Spark (Delta checks the rest)."""
        spark = self._spark()
        schema = schemas.spark_schema(self.name)
        folder = None
        if data is None:
            return spark.createDataFrame([], schema), None, False
        if isinstance(data, pa.Table):
            folder = self._staging_folder()
            write_keyed(data, self.name, folder, "part-00000", threads=DRIVER_THREADS)
            data = Staged(self.name, folder)
        if not isinstance(data, Staged):
            return data.select(*schema.fieldNames()), None, True
        if data.table != self.name:
            raise StorageError(f"{self.name}: staged files of {data.table} at {data.folder} cannot be committed here")
        folder = data.folder
        staged = [entry.place.relative_to(folder) for entry in folder.files("*.parquet")]  # one listing
        parts = sorted({name.split("/")[0] for name in staged if name.startswith("k=") and "/" in name}) \
            if self.cluster else []
        found = {None if part[2:] == NULL_KEY else part[2:] for part in parts}
        if keys is not None and not found <= keys:
            raise StorageError(f"{self.name}: rows for {sorted(map(str, found - keys))} fall outside the keys "
                               "being replaced")
        if self.cluster and parts:
            # One read per key: Spark packs small files of one read into a task, never across reads.
            frames = [spark.read.schema(schema).parquet((folder / part).spark_uri) for part in parts]
            frame = frames[0]
            for other in frames[1:]:
                frame = frame.unionByName(other)
            return frame, folder, True
        if not self.cluster and staged:
            return spark.read.schema(schema).parquet(folder.spark_uri), folder, True
        return spark.createDataFrame([], schema), folder, False

    def _key_predicate(self, keys: set) -> str:
        """A SQL condition selecting exactly the rows of ``keys``: consecutive keys as one range, so
        Delta skips files by their min/max statistics."""
        column = self.cluster.column
        kind = self.arrow_schema.field(column).type
        clauses, run = [], None
        for key in sorted(k for k in keys if k is not None):
            lo, hi = _key_bounds(key, kind, self.cluster.grain)
            if run is not None and run[1] == lo:
                run = (run[0], hi)
                continue
            if run is not None:
                clauses.append(run)
            run = (lo, hi)
        if run is not None:
            clauses.append(run)
        terms = [f"(`{column}` >= {lo} AND `{column}` < {hi})" for lo, hi in clauses]
        if None in keys:
            terms.append(f"`{column}` IS NULL")
        return " OR ".join(terms) if terms else "false"

    def staging(self) -> Staged:
        return Staged(self.name, self._staging_folder())

    def _staging_folder(self) -> Place:
        return self.warehouse.state_dir() / "staging" / self.name / uuid.uuid4().hex

    def _drop(self, folder: Place | None) -> None:
        if folder is not None:
            folder.rmtree()

    # -- maintenance --------------------------------------------------------------------
    def compact(self, min_files: int | None = None) -> int:
        """Rewrite each cluster key with more than one file into one file, in one commit; returns files
        removed. Delta's OPTIMIZE would pack small files across keys (a table
        here is not partitioned), losing the one-key-per-file layout that reads prune by."""
        files = self.files()
        threshold = min_files or self.warehouse.settings.compact_min_files
        if len(files) < threshold:
            return 0
        groups: dict[str | None, list[DataFile]] = {}
        for f in files:
            if f.key != WIDE:
                groups.setdefault(f.key, []).append(f)
        return self._rewrite(groups, "compact")

    def merge(self, before: datetime) -> int:
        """Merge each whole day before ``before`` of a table keyed by hour into one file (a table keyed
        by day: each month), in one commit; returns files removed."""
        if self.cluster is None or self.cluster.grain not in SPAN_GRAIN:
            return 0
        index = self._file_index(self._delta())
        grain = SPAN_GRAIN[self.cluster.grain]
        bound, width = cluster_key(before, grain), KEY_LENGTH[grain]
        groups: dict[str | None, list[DataFile]] = {}
        for key in sorted(index.keys + index.spans):
            if key[:width] < bound:
                groups.setdefault(key[:width], []).extend(f for _, f in index.by_key[key])
        return self._rewrite(groups, "merge")

    def _rewrite(self, groups: dict[str | None, list[DataFile]], op: str) -> int:
        """Rewrite each group of two or more files as one file, all in one commit that changes no row."""
        groups = {key: group for key, group in groups.items() if len(group) > 1}
        if not groups:
            return 0
        spark = self._spark()
        schema = schemas.spark_schema(self.name)
        frames = [spark.read.schema(schema).parquet(*[(self.path / f.path).spark_uri for f in group]).coalesce(1)
                  for group in groups.values()]
        frame = frames[0]
        for other in frames[1:]:
            frame = frame.unionByName(other)
        keys = self._group_keys(groups)
        # Delta refuses ``dataChange=false`` with a ``replaceWhere`` on data columns (the tables are not
        # partitioned), so the rewrite is a data change to Delta, with the same rows.
        writer = frame.write.format("delta").mode("overwrite") \
            .option("userMetadata", json.dumps({"traffic.op": op}))
        if self.cluster:
            writer = writer.option("replaceWhere", self._key_predicate(keys))
        self.step(f"{self.name}.{op}.files_written")
        self._guard()
        writer.save(self.uri)
        self.step(f"{self.name}.{op}.committed")
        return sum(len(group) for group in groups.values())

    def _group_keys(self, groups: dict) -> set:
        """The keys of the table's grain that a rewrite of these groups (keys or spans) replaces: a span's
        are read from its files' rows."""
        keys: set = set()
        for key, group in groups.items():
            if key is None or not self._is_span(key):
                keys.add(key)
                continue
            column = self._dataset(group).to_table(columns=[self.cluster.column]).column(0)
            keys |= {None if k == NULL_KEY else k for k in key_groups(column, self.cluster.grain)[1]}
        return keys

    def checkpoint(self) -> None:
        """A checkpoint now (delta-spark also writes one every ``delta.checkpointInterval`` commits)."""
        spark = self._spark()
        jvm = getattr(getattr(spark, "sparkContext", None), "_jvm", None) if not _is_connect(spark) else None
        if jvm is None:
            return  # a Spark Connect client cannot reach Delta's checkpoint call; the interval's still apply
        self._guard()
        jvm.org.apache.spark.sql.delta.DeltaLog.forTable(spark._jsparkSession, self.uri).checkpoint()

    def vacuum(self, retention_hours: int | None = None) -> list[str]:
        """Delete the files no current row is in, removed more than ``retention_hours`` ago (default: the
        table's ``deletedFileRetentionDuration``), with Delta's VACUUM; returns those deleted."""
        before = self._files_on_disk()
        spark = self._spark()
        retain = f" RETAIN {retention_hours} HOURS" if retention_hours is not None else ""
        spark.conf.set("spark.databricks.delta.retentionDurationCheck.enabled", "false")
        self._guard()
        try:
            spark.sql(f"VACUUM {self._sql_name}{retain}").collect()
        finally:
            spark.conf.unset("spark.databricks.delta.retentionDurationCheck.enabled")
        gone = sorted(before - self._files_on_disk())
        self._drop_stale_staging(retention_hours)
        if self.path.is_local:  # a store has no folders to leave behind
            disk = self.path.local
            for folder in sorted({(disk / name).parent for name in gone}, key=lambda p: -len(p.parts)):
                while folder != disk:  # the folders the deleted files leave empty (an rs write's own folder)
                    try:
                        folder.rmdir()
                    except OSError:
                        break
                    folder = folder.parent
        return gone

    def _drop_stale_staging(self, retention_hours: int | None) -> None:
        """Remove staged folders a crashed write left (a finished write removes its own) once their newest
        file is older than the retention: a rerun of that write stages its rows afresh."""
        hours = 24 if retention_hours is None else retention_hours
        cutoff_ms = (time.time() - hours * 3600) * 1000
        newest: dict[str, int] = {}
        staging = self.warehouse.state_dir() / "staging" / self.name
        for entry in staging.files():  # one listing, on disk or on a store
            folder = entry.place.relative_to(staging).split("/")[0]
            newest[folder] = max(newest.get(folder, 0), entry.mtime_ms)
        if staging.is_local:  # a folder left empty on disk is one too (a store has no empty folders)
            for child in staging.children():
                if child.name not in newest and child.local.is_dir():
                    newest[child.name] = int(child.local.stat().st_mtime * 1000)
        for folder, mtime_ms in newest.items():
            if mtime_ms < cutoff_ms:
                (staging / folder).rmtree()

    def _files_on_disk(self) -> set[str]:
        names = (entry.place.relative_to(self.path) for entry in self.path.files("*.parquet"))
        return {name for name in names if not name.startswith("_delta_log/")}

    def configure(self) -> bool:
        """Give a table made by an older version today's ``TABLE_CONFIGURATION``; whether it changed."""
        current = self._delta().metadata().configuration
        if all(current.get(name) == value for name, value in TABLE_CONFIGURATION.items()):
            return False
        listed = ", ".join(f"'{k}' = '{v}'" for k, v in TABLE_CONFIGURATION.items())
        spark = self._spark()
        self._guard()
        spark.sql(f"ALTER TABLE {self._sql_name} SET TBLPROPERTIES ({listed})")
        return True

    def cleanup_log(self) -> None:
        """delta-spark removes log entries past ``delta.logRetentionDuration`` at each checkpoint itself."""


#: The stores each live session was given the settings of (told once; forgotten with the session).
_REACHED: "weakref.WeakKeyDictionary" = weakref.WeakKeyDictionary()


def _reach_store(spark, location) -> None:
    """Give the session Hadoop's S3A settings for this store as its own (``fs.s3a.*``): every Spark read and
    Delta commit of the session builds its Hadoop configuration from them, on the driver and in its tasks; a
    warm Spark Connect server's session takes them the same way."""
    reached = _REACHED.setdefault(spark, set())
    if location in reached:
        return
    for name, value in location.s3a_conf().items():
        spark.conf.set(name, value)
    reached.add(location)


def _is_connect(spark) -> bool:
    return type(spark).__module__.startswith("pyspark.sql.connect")


def _sql_predicate(conditions: list[tuple[str, str, Any]]) -> str:
    """``delete_where``'s conditions as one SQL condition (all of them must hold)."""


    arrow_predicate(conditions)  # the same checks of operators and emptiness as the rs engine's

    def literal(value):
        if isinstance(value, datetime):
            return f"TIMESTAMP'{value.isoformat()}'"
        if hasattr(value, "isoformat"):
            return f"DATE'{value.isoformat()}'"
        if isinstance(value, str):
            return "'" + value.replace("\\", "\\\\").replace("'", "\\'") + "'"
        return repr(value)

    return " AND ".join(f"`{c}` {op} {literal(v)}" for c, op, v in conditions)
