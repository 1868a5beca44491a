"""The rs engine: Spark (or Arrow, for small driver-side tables) writes parquet files into a fresh
folder under the table root, then ``deltalake`` (delta-rs) commits them to the log.

It needs no jars, so it runs wherever the Delta jars cannot be had (DESIGN §8). Ingest's parse tasks
write raw detail themselves, on the executors, into a folder the table hands out (``Table.staging``);
committing the handle adds those files where they are, without a copy.
"""

from __future__ import annotations

import json
import time
import uuid
from datetime import datetime, timezone
from typing import Any, Iterable

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

from traffic.storage import schemas
from traffic.storage.journal import check_lease
from traffic.storage.keys import KEY_SEGMENT, NULL_KEY, SPAN_GRAIN, SPARK_KEY_FORMATS, KEY_LENGTH, cluster_key
from traffic.storage.place import Place
from traffic.storage.staging import DRIVER_THREADS, RAW_TABLES, Staged, statistics, write_file, write_keyed
from traffic.storage.table import (TABLE_CONFIGURATION, WIDE, DataFile, StorageError,
                                   Table, arrow_predicate)


def _now_ms() -> int:
    """The time a commit stamps on the files it removes (their retention counts from it)."""
    return int(time.time() * 1000)


def _fresh_folder(table_path: Place, prefix: str) -> Place:
    """A new folder under the table root for one write's files (not ``_``-prefixed: vacuum cleans it)."""
    return table_path / f"{prefix}{datetime.now(timezone.utc):%Y%m%dT%H%M%S}-{uuid.uuid4().hex[:12]}"


def write_in_tasks(df, table: str, dest: Place) -> None:
    """Write a DataFrame (already in the table's schema) as its keyed parquet files under ``dest`` on object
    storage, from Spark's Python tasks through Arrow's S3 filesystem: the rs engine needs no Hadoop S3
    connector. A task's files are named by its partition, so a retried task replaces its own files."""
    from pyspark import TaskContext
    from pyspark.sql import functions as F

    cluster = schemas.cluster(table)
    if cluster is not None and table not in RAW_TABLES:  # each key's rows to one task, as the local write does
        df = df.repartition(F.date_format(F.col(cluster.column), SPARK_KEY_FORMATS[cluster.grain]))

    def write(batches):
        batches = list(batches)
        written = write_keyed(pa.Table.from_batches(batches), table, dest,
                              f"part-{TaskContext.get().partitionId():05d}") if batches else 0
        yield pa.RecordBatch.from_pydict({"rows": pa.array([written], pa.int64())})

    df.mapInArrow(write, "rows long").collect()


class RsTable(Table):
    """Spark/Arrow writes parquet, delta-rs commits it."""

    def create(self) -> None:
        """Create the table from its schema with pinned protocol and no optional features."""
        if self.exists():
            return
        from deltalake import DeltaTable, Schema

        DeltaTable.create(
            self.path.uri,
            schema=Schema.from_arrow(self.arrow_schema),
            mode="ignore",
            name=self.name,
            configuration=TABLE_CONFIGURATION,
            storage_options=self.path.delta_options(),
        )
        self._check_protocol(self._delta())

    # -- writes -------------------------------------------------------------------------
    def append(self, data, txn: tuple[str, int] | None = None, op: str = "append") -> bool:
        """Append rows; with ``txn=(app_id, version)`` a version already committed is skipped."""
        return self._commit(data, remove_keys=None, txn=txn, op=op)

    def replace(self, data, keys: Iterable[str | None], txn: tuple[str, int] | None = None,
                op: str = "replace") -> bool:
        """Atomically replace the files of these cluster keys with ``data`` (which must fall inside them)."""
        return self._commit(data, remove_keys=set(self._check_keys(keys)), txn=txn, op=op)

    def overwrite(self, data, txn: tuple[str, int] | None = None, op: str = "overwrite") -> bool:
        """Atomically replace the whole table."""
        return self._commit(data, remove_keys="all", txn=txn, op=op)

    def delete_keys(self, keys: Iterable[str | None], txn: tuple[str, int] | None = None, op: str = "delete") -> bool:
        """Remove every row of these cluster keys in one commit."""
        return self._commit(None, remove_keys=set(self._check_keys(keys)), txn=txn, op=op)

    def delete_where(self, conditions: list[tuple[str, str, Any]], keys=None, txn=None, op: str = "delete") -> int:
        """Delete rows matching every ``(column, op, value)`` condition (ops: ``< <= = != >= >``).

        Only files that hold matching rows are rewritten (under the same cluster key), in one
        commit; returns the number of rows deleted.
        """
        from deltalake import CommitProperties, Transaction
        from deltalake._internal import RemoveAction

        dt = self._delta()
        if txn is not None:
            done = dt.transaction_version(txn[0])
            if done is not None and done >= txn[1]:
                return 0
        predicate = arrow_predicate(conditions)
        folder = _fresh_folder(self.path, "d")
        removes, deleted, now_ms = [], 0, _now_ms()
        keys = self._key_list(keys)
        for f in self.files(keys=keys, dt=dt):
            rows = self._read_file(f)
            if keys is not None and self._is_span(f.key):
                # A merged file: only its rows of ``keys`` are candidates.
                numbered = rows.append_column("__row", pa.array(np.arange(rows.num_rows)))
                kept = np.zeros(rows.num_rows, dtype=bool)
                kept[numbered.filter(~predicate).column("__row").to_numpy()] = True
                keep = rows.filter(pa.array(kept | ~self._key_mask(rows.column(self.cluster.column), keys=keys)))
            else:
                keep = rows.filter(~predicate)
            if keep.num_rows == rows.num_rows:
                continue
            deleted += rows.num_rows - keep.num_rows
            removes.append(RemoveAction(f.path, True, now_ms, f.size, {}))
            if keep.num_rows:
                self._write_rows(keep, f.key, folder, f"part-{len(removes):05d}")
        if not removes:
            return 0
        adds = [a for a, _ in self._add_actions(folder)]
        self.step(f"{self.name}.{op}.files_written")
        self._transaction(dt, adds + removes, CommitProperties(
            app_transactions=[Transaction(txn[0], txn[1])] if txn else None, custom_metadata={"traffic.op": op}))
        self.step(f"{self.name}.{op}.committed")
        return deleted

    def _commit(self, data, remove_keys, txn, op) -> bool:
        from deltalake import CommitProperties, Transaction
        from deltalake._internal import RemoveAction

        dt = self._delta()
        if txn is not None:
            done = dt.transaction_version(txn[0])
            if done is not None and done >= txn[1]:
                return False
        self._add_new_columns(dt)
        adds = self._stage(data) if data is not None else []
        new_keys = {a_key for _, a_key in adds}
        if isinstance(remove_keys, set) and not new_keys <= remove_keys:
            raise StorageError(
                f"{self.name}: rows for {sorted(map(str, new_keys - remove_keys))} fall outside the keys being replaced"
            )
        now_ms = _now_ms()
        removes = []
        if remove_keys:
            old = self.files(dt=dt) if remove_keys == "all" else self.files(keys=remove_keys, dt=dt)
            removes = [RemoveAction(f.path, True, now_ms, f.size, {}) for f in old]
            if remove_keys != "all":
                # A merged day or month keeps its other keys: its rows outside ``remove_keys``, rewritten.
                adds += self._rewrite_spans([f for f in old if self._is_span(f.key) and f.key not in remove_keys],
                                            remove_keys)
        self.warehouse.step(f"{self.name}.{op}.files_written")
        if not adds and not removes and txn is None:
            return False
        properties = CommitProperties(
            app_transactions=[Transaction(txn[0], txn[1])] if txn else None,
            custom_metadata={"traffic.op": op},
        )
        self._transaction(dt, [a for a, _ in adds] + removes, properties)
        self.warehouse.step(f"{self.name}.{op}.committed")
        return True

    def _transaction(self, dt, actions: list, properties) -> None:
        """Commit these add and remove actions; on object storage only while this job holds the lease."""
        check_lease(self.warehouse.root)
        dt.create_write_transaction(actions, mode="append", schema=self.arrow_schema, commit_properties=properties)

    def _read_file(self, f: DataFile) -> pa.Table:
        place = self.path / f.path
        return pq.read_table(place.fs_path, filesystem=place.fs, schema=self.arrow_schema)

    def _add_new_columns(self, dt) -> None:
        """Columns added to ``schemas/<table>.json`` after the table was created join its Delta schema before a
        write (nullable: rows written before read as null). Its own commit, so a rerun finds it done."""
        from deltalake import Schema

        have = {f.name for f in dt.schema().fields}
        missing = [f for f in Schema.from_arrow(self.arrow_schema).fields if f.name not in have]
        if missing:
            dt.alter.add_columns(missing)
            dt.update_incremental()

    def _rewrite_spans(self, spans: list[DataFile], keys: set) -> list[tuple[Any, str | None]]:
        """Write each merged file's rows outside ``keys`` to a new file of the same span; their add actions."""
        if not spans:
            return []
        folder = _fresh_folder(self.path, "s")
        for number, f in enumerate(spans):
            rows = self._read_file(f)
            keep = rows.filter(pa.array(~self._key_mask(rows.column(self.cluster.column), keys=keys)))
            if keep.num_rows:
                self._write_rows(keep, f.key, folder, f"part-{number:05d}")
        return self._add_actions(folder)

    def _write_rows(self, rows: pa.Table, key: str | None, folder: Place, part: str) -> None:
        """Write rows that came from one file of ``key`` back under that key; a WIDE file's, one file per key."""
        if key == WIDE:
            write_keyed(rows, self.name, folder, part)
            return
        target = folder / (f"k={key if key is not None else NULL_KEY}" if self.cluster else "")
        target.mkdir()
        write_file(rows, target / f"{part}.parquet", statistics(self.name))

    def staging(self) -> Staged:
        return Staged(self.name, self._staging_folder())

    def _staging_folder(self) -> Place:
        # Inside the table root: committing staged files adds them where they are, no copy.
        return _fresh_folder(self.path, "w")

    def _stage(self, data) -> list[tuple[Any, str | None]]:
        """Write ``data`` as parquet into a fresh folder; return (AddAction, key) per non-empty file."""
        if isinstance(data, Staged):
            if data.table != self.name or data.folder.parent != self.path:
                raise StorageError(f"{self.name}: staged files of {data.table} at {data.folder} cannot be committed here")
            return self._add_actions(data.folder)
        dest = self._staging_folder()
        if isinstance(data, pa.Table):
            write_keyed(data, self.name, dest, "part-00000", threads=DRIVER_THREADS)
        else:
            self._write_spark(data, dest)
        return self._add_actions(dest)

    def _write_spark(self, df, dest: Place) -> None:
        from pyspark.sql import functions as F

        schema = schemas.spark_schema(self.name)
        present = set(df.columns)
        df = df.select(*[
            (F.col(f.name) if f.name in present else F.lit(None)).cast(f.dataType).alias(f.name)
            for f in schema.fields
        ])
        if not dest.is_local:
            write_in_tasks(df, self.name, dest)
        elif self.cluster is None:
            df.write.parquet(str(dest))
        else:
            # Each key's rows to one task: one file per key and task-local writers. A task writing many
            # keys sorts its rows and opens a file per key; 240 hours of aggregates wrote 3.5x slower so.
            # Raw detail (large, few keys per batch) is written where it lies: shuffling it costs more.
            key = F.date_format(F.col(self.cluster.column), SPARK_KEY_FORMATS[self.cluster.grain])
            df = df.withColumn("k", key)
            if self.name not in RAW_TABLES:
                df = df.repartition("k")
            df.write.partitionBy("k").parquet(str(dest))

    def _add_actions(self, dest: Place) -> list[tuple[Any, str | None]]:
        from deltalake.transaction import AddAction

        actions = []
        for entry in list(dest.files()):
            place = entry.place
            if place.name.startswith((".", "_")) or place.suffix == ".crc":
                place.unlink()  # Spark's _SUCCESS and .crc side files are not table data
                continue
            if place.suffix != ".parquet":
                continue
            with place.open_input() as source:
                meta = pq.read_metadata(source)
            relative = place.relative_to(self.path)
            if meta.num_rows == 0:
                place.unlink()
                continue
            match = KEY_SEGMENT.search(relative)
            key = match.group(1) if match else None
            key = None if key == NULL_KEY else key
            stats = json.dumps({"numRecords": meta.num_rows})
            actions.append((AddAction(relative, entry.size, {}, entry.mtime_ms, True, stats), key))
        return actions

    # -- maintenance --------------------------------------------------------------------
    def compact(self, min_files: int | None = None) -> int:
        """Rewrite each cluster key with more than one small file into one file; returns files removed.

        A rewrite is ``dataChange=false``: readers and idempotent writers see the same rows.
        """
        dt = self._delta()
        files = self.files(dt=dt)
        threshold = min_files or self.warehouse.settings.compact_min_files
        if len(files) < threshold:
            return 0
        by_key: dict[str | None, list[DataFile]] = {}
        for f in files:
            if f.key != WIDE:  # another writer's files across keys: their rows' keys are not known here
                by_key.setdefault(f.key, []).append(f)
        return self._combine(dt, by_key, "compact")

    def merge(self, before: datetime) -> int:
        """Merge each whole day before ``before`` of a table keyed by hour into one file keyed by the
        day (a table keyed by day: each month); returns files removed.

        Compaction keeps a file per key, so a table keyed by hour would gain a file an hour forever;
        merged, it gains one a day. Reads by hour still return only that hour's rows, and replacing or
        deleting an hour of a merged day rewrites the day's other hours (``_rewrite_spans``). A merge
        is ``dataChange=false``, like a compaction.
        """
        if self.cluster is None or self.cluster.grain not in SPAN_GRAIN:
            return 0
        dt = self._delta()
        index = self._file_index(dt)
        grain = SPAN_GRAIN[self.cluster.grain]
        bound, width = cluster_key(before, grain), KEY_LENGTH[grain]
        by_span: dict[str, list[DataFile]] = {}
        for key in sorted(index.keys + index.spans):  # a span sorts before the keys it holds
            if key[:width] < bound:
                by_span.setdefault(key[:width], []).extend(f for _, f in index.by_key[key])
        return self._combine(dt, by_span, "merge")

    def _combine(self, dt, groups: dict[str | None, list[DataFile]], op: str) -> int:
        """Rewrite each group of two or more files as one file under the group's key, in one commit."""
        from deltalake import CommitProperties
        from deltalake._internal import RemoveAction
        from deltalake.transaction import AddAction

        folder = _fresh_folder(self.path, "c")
        actions, removed, now_ms = [], 0, _now_ms()
        for key, group in groups.items():
            if len(group) < 2:
                continue
            rows = self._dataset(group).to_table()
            target = (folder / f"k={key if key is not None else NULL_KEY}" if self.cluster else folder) / "part-00000.parquet"
            target.parent.mkdir()
            write_file(rows, target, statistics(self.name))
            actions.append(AddAction(target.relative_to(self.path), target.size(), {}, _now_ms(), False,
                                     json.dumps({"numRecords": rows.num_rows})))
            actions += [RemoveAction(f.path, False, now_ms, f.size, {}) for f in group]
            removed += len(group)
        if not removed:
            return 0
        self.warehouse.step(f"{self.name}.{op}.files_written")
        self._transaction(dt, actions, CommitProperties(custom_metadata={"traffic.op": op}))
        self.warehouse.step(f"{self.name}.{op}.committed")
        return removed

    def checkpoint(self) -> None:
        self._delta().create_checkpoint()

    def vacuum(self, retention_hours: int | None = None) -> list[str]:
        """Delete the files no current row is in: removed from the log, or never committed (a crashed
        write's), more than ``retention_hours`` ago (default: the table's ``deletedFileRetentionDuration``)."""
        deleted = self._delta().vacuum(retention_hours=retention_hours, dry_run=False,
                                       enforce_retention_duration=False, full=True)
        if not self.path.is_local:
            return deleted  # a store has no folders to leave empty
        root = self.path.local
        for folder in sorted({(root / name).parent for name in deleted}, key=lambda p: -len(p.parts)):
            while folder != root:  # the folders the deleted files leave empty (a write's own folder)
                try:
                    folder.rmdir()
                except OSError:
                    break
                folder = folder.parent
        return deleted

    def configure(self) -> bool:
        """Give a table made by an older version today's ``TABLE_CONFIGURATION``; whether it changed."""
        current = self._delta().metadata().configuration
        if all(current.get(name) == value for name, value in TABLE_CONFIGURATION.items()):
            return False
        self._delta().alter.set_table_properties(TABLE_CONFIGURATION)
        return True

    def cleanup_log(self) -> None:
        self._delta().cleanup_metadata()
