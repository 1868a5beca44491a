"""One Delta table: what every engine shares — the file index, reads, and the names of periods.

Reads are engine-neutral: the table's current snapshot is read from its Delta log (delta-rs), its
data files are grouped by cluster key (``traffic.storage.keys``), and Arrow or Spark reads exactly
the files of the keys asked for. Writes are each engine's own (``traffic.storage.engines``); a
table opened for reading only (``Warehouse.reader``) refuses them.
"""

from __future__ import annotations

import bisect
import json
from dataclasses import dataclass
from datetime import datetime, timezone
from typing import Any, Iterable

import numpy as np
import pyarrow as pa
import pyarrow.dataset as pads
import pyarrow.parquet as pq

from traffic.storage import schemas
from traffic.storage.keys import (KEY_LENGTH, KEY_SEGMENT, NULL_KEY, SPAN_FIRST, SPAN_GRAIN, SPARK_KEY_FORMATS,
                                  cluster_key, key_groups)
from traffic.storage.staging import Staged

PROTOCOL = (1, 2)
#: A checkpoint every this many commits. Opening a table reads its last checkpoint and replays every
#: commit since as JSON; after a month of micro-batches a 40-commit tail made each open ~25 ms against
#: ~4 ms from a fresh checkpoint, and a job opens a dozen tables. A checkpoint costs a few ms.
CHECKPOINT_EVERY = 10
#: Every table's settings. Files a commit removed stay on disk a day (a reader of an older snapshot
#: still finds them), then ``vacuum`` deletes them; the log keeps a day of commits too (an older
#: version's files are gone anyway). delta-rs lists the whole ``_delta_log`` folder to bring a
#: snapshot up to date, several times a commit, so a shorter log is a cheaper commit: with 7 days,
#: a table committed every 5 minutes held ~2,400 log files; with one, ~400.
TABLE_CONFIGURATION = {
    "delta.checkpointInterval": str(CHECKPOINT_EVERY),
    "delta.logRetentionDuration": "interval 1 days",
    "delta.deletedFileRetentionDuration": "interval 1 days",
}
#: The key of a file whose rows may fall in several spans (a file another writer made, e.g. a
#: compaction across days): every read that could want its rows reads it and filters them.
WIDE = "*"


class StorageError(RuntimeError):
    """A table cannot be read or written as asked; the message says which and why."""


@dataclass(frozen=True)
class DataFile:
    """One data file of a table's current snapshot."""

    path: str  # relative to the table root
    size: int
    key: str | None  # its cluster key, a span's key, WIDE, or None (rows whose cluster column is null)
    rows: int | None


@dataclass(frozen=True)
class FileIndex:
    """One snapshot's data files grouped by cluster key, each with its position in the snapshot."""

    version: tuple[int, int]  # (id of the snapshot object, table version)
    by_key: dict[str | None, list[tuple[int, DataFile]]]
    keys: list[str]  # the non-null keys of the table's grain, sorted
    spans: list[str]  # the keys of merged files (whole days or months), sorted


class Table:
    """A table's reads; the engines (``traffic.storage.engines``) add its writes."""

    def __init__(self, warehouse, name: str):
        self.warehouse = warehouse
        self.name = name
        self.path = warehouse.root / name
        self.cluster = schemas.cluster(name)
        self.arrow_schema = schemas.arrow_schema(name)

    def step(self, name: str) -> None:
        self.warehouse.step(name)

    # -- keys ---------------------------------------------------------------------------
    # Callers name periods (a datetime or date); the table turns them into its own file keys, so no
    # caller knows how files are keyed. A key the table itself listed (``keys()``) passes as it is.
    def key_of(self, value) -> str | None:
        if value is None or isinstance(value, str):
            return value
        return cluster_key(value, self.cluster.grain) if self.cluster else None

    def _key_list(self, periods) -> list[str | None] | None:
        return None if periods is None else [self.key_of(p) for p in periods]

    def _check_keys(self, keys: Iterable) -> list[str | None]:
        keys = self._key_list(keys)
        if keys and not self.cluster:
            raise StorageError(f"table {self.name} has no cluster key to replace or delete by")
        return keys

    def files_by_span(self, start=None) -> dict | None:
        """The data files from ``start`` on, grouped by the span that holds them (the day of an hour,
        the month of a day; DESIGN §8's merged files), as {span start: [relative path, ...]}.
        None when a file has no key or may hold several spans (its rows could belong to any span)."""
        spans: dict = {}
        width = KEY_LENGTH[SPAN_GRAIN[self.cluster.grain]]
        for f in self.files(key_min=start):
            if f.key is None or f.key == WIDE:
                return None
            spans.setdefault(f.key[:width], []).append(f.path)
        parse = {10: "%Y-%m-%d", 7: "%Y-%m"}[width]
        return {datetime.strptime(k, parse).replace(tzinfo=timezone.utc): paths for k, paths in sorted(spans.items())}

    def keys_before(self, period) -> list[str]:
        """The cluster keys present of periods before ``period`` (what expiring up to it removes)."""
        if period is None:
            raise StorageError(f"no bound given for expiring {self.name}")
        bound = self.key_of(period)
        return [k for k in self.keys() if k < bound]

    def periods_with_files(self, periods) -> list:
        """Those of ``periods`` this table holds files of. A merged file (a span) may hold any of the
        periods it covers, so when one is found every period asked for is returned."""
        periods = list(periods)
        wanted = {self.key_of(p): p for p in periods}
        found = set()
        for f in self.files(keys=periods):
            if f.key not in wanted:
                return periods
            found.add(f.key)
        return [p for k, p in wanted.items() if k in found]

    def paths_by_period(self, periods) -> dict | None:
        """Each period's data files, as (``Place``, size) pairs in commit order; files of a merged
        span, keyed by the span, are not listed (freezing reads hours not merged yet). None when a file
        that may hold one of the periods holds other spans too (a file another writer made): the
        periods' rows are then to be read by key (``read``), not file by file."""
        wanted = {self.key_of(p): p for p in periods}
        paths: dict = {}
        for f in self.files(keys=list(wanted.values())):
            if f.key == WIDE or (self._is_span(f.key) and not KEY_SEGMENT.search(f.path)):
                return None  # rows of several periods in a file another writer made (its statistics say so)
            if f.key in wanted:
                paths.setdefault(wanted[f.key], []).append((self.path / f.path, f.size))
        return paths

    def staging(self) -> Staged:
        """A fresh folder for files to be committed later (``append``/``replace`` the returned handle); each
        engine stages where its commits want the files."""
        raise self._read_only()

    def _read_only(self) -> StorageError:
        return StorageError(f"table {self.name} was opened for reading only (Warehouse.reader)")

    # Writes: each engine's own; a table opened for reading only refuses them.
    def append(self, data, txn: tuple[str, int] | None = None, op: str = "append") -> bool:
        raise self._read_only()

    def replace(self, data, keys, txn: tuple[str, int] | None = None, op: str = "replace") -> bool:
        raise self._read_only()

    def overwrite(self, data, txn: tuple[str, int] | None = None, op: str = "overwrite") -> bool:
        raise self._read_only()

    def delete_keys(self, keys, txn: tuple[str, int] | None = None, op: str = "delete") -> bool:
        raise self._read_only()

    def delete_where(self, conditions, keys=None, txn=None, op: str = "delete") -> int:
        raise self._read_only()

    def _where(self, keys=None, key_min=None, key_max=None) -> str | None:
        """A Spark SQL condition on the rows' own cluster keys."""
        if not self.cluster:
            return None
        keys, key_min, key_max = self._key_list(keys), self.key_of(key_min), self.key_of(key_max)
        fmt = SPARK_KEY_FORMATS[self.cluster.grain]
        expr = f"date_format(`{self.cluster.column}`, \"{fmt}\")"
        parts = []
        if keys is not None:
            listed = [k for k in keys if k is not None]
            clause = f"{expr} IN ({', '.join(repr(k) for k in listed)})" if listed else "false"
            if None in set(keys):
                clause = f"({clause} OR `{self.cluster.column}` IS NULL)"
            parts.append(clause)
        if key_min is not None:
            parts.append(f"{expr} >= '{key_min}'")
        if key_max is not None:
            parts.append(f"{expr} < '{key_max}'")
        return " AND ".join(parts) if parts else None

    # -- snapshot ---------------------------------------------------------------------
    def _delta(self):
        """The table's current snapshot; reused within a job and brought up to date incrementally.

        Re-opening a table reads its last checkpoint and the commits since; bringing a loaded
        snapshot up to date reads only the new commits, which keeps a micro-batch's many small
        reads and commits cheap whatever the table's history.
        """
        from deltalake import DeltaTable  # deferred: a heavy import the executors never need

        cached = self.warehouse.snapshots.get(self.name)
        if cached is not None:
            cached.update_incremental()
            return cached
        try:
            snapshot = DeltaTable(self.path.uri, storage_options=self.path.delta_options())
        except Exception as error:  # noqa: BLE001 - delta-rs raises several kinds here
            if not (self.path / "_delta_log").is_dir():
                raise StorageError(
                    f"table {self.name} does not exist under {self.warehouse.root} (run `traffic ingest` first)"
                ) from None
            raise StorageError(f"table {self.name} cannot be opened: {error}") from None
        # Checked when a job first opens the table, not by ``create_all`` (which would open all of them).
        self._check_protocol(snapshot)
        self.warehouse.snapshots[self.name] = snapshot
        return snapshot

    def exists(self) -> bool:
        return (self.path / "_delta_log").is_dir()

    def create(self) -> None:
        raise self._read_only()

    def _check_protocol(self, dt) -> None:
        protocol = dt.protocol()
        features = set(protocol.reader_features or []) | set(protocol.writer_features or [])
        if (protocol.min_reader_version, protocol.min_writer_version) > PROTOCOL and features - {"appendOnly", "invariants"}:
            raise StorageError(
                f"table {self.name} needs Delta features {sorted(features)} (protocol "
                f"{protocol.min_reader_version}/{protocol.min_writer_version}); this layer supports "
                f"protocol {PROTOCOL[0]}/{PROTOCOL[1]} without optional features"
            )
        if protocol.min_reader_version > 3 or protocol.min_writer_version > 7:
            raise StorageError(f"table {self.name} uses an unsupported Delta protocol")

    def version(self) -> int:
        return self._delta().version()

    def txn_version(self, app_id: str) -> int | None:
        """The last version committed by ``app_id`` (an idempotent writer), or None."""
        return self._delta().transaction_version(app_id)

    def checkpoint_due(self) -> bool:
        """More than ``CHECKPOINT_EVERY`` commits since the last checkpoint (a table created with a longer
        interval, or commits made without the writer's own post-commit checkpoint)."""
        try:
            last = json.loads((self.path / "_delta_log" / "_last_checkpoint").read_text())["version"]
        except (OSError, ValueError, KeyError):
            last = -1
        return self.version() - last > CHECKPOINT_EVERY

    def history(self, limit: int | None = None) -> list[dict]:
        """The table's commits, newest first; the pipeline's own tags (``traffic.op``) at the top level
        whichever engine wrote them (delta-spark keeps them in ``userMetadata``)."""
        commits = self._delta().history(limit)
        for commit in commits:
            tags = commit.get("userMetadata")
            if isinstance(tags, str) and tags.startswith("{"):
                try:
                    commit.update({k: v for k, v in json.loads(tags).items() if k not in commit})
                except ValueError:
                    pass
        return commits

    # -- files --------------------------------------------------------------------------
    def files(self, keys: Iterable[str | None] | None = None, key_min: str | None = None,
              key_max: str | None = None, dt=None) -> list[DataFile]:
        """Data files of the current snapshot, pruned to cluster keys (``key_min <= key < key_max``).

        A merged file (a span: a whole day or month, see ``merge``) is listed when it holds any of the
        keys asked for, a WIDE file always; their other rows are filtered out by the reads.
        """
        keys, key_min, key_max = self._key_list(keys), self.key_of(key_min), self.key_of(key_max)
        index = self._file_index(dt or self._delta())
        wide = index.by_key.get(WIDE, [])
        if keys is not None:
            wanted = set(keys)
            if index.spans:
                width = KEY_LENGTH[SPAN_GRAIN[self.cluster.grain]]
                wanted |= {k[:width] for k in wanted if k is not None} & set(index.spans)
            picked = [entry for key in wanted for entry in index.by_key.get(key, ())]
            picked += wide if keys else []
        elif key_min is not None or key_max is not None:
            lo = bisect.bisect_left(index.keys, key_min) if key_min is not None else 0
            hi = bisect.bisect_left(index.keys, key_max) if key_max is not None else len(index.keys)
            picked = [entry for key in index.keys[lo:hi] for entry in index.by_key[key]]
            picked += [entry for span in index.spans if self._in_range(span, key_min, key_max)
                       for entry in index.by_key[span]]
            picked += wide
        else:
            picked = [entry for entries in index.by_key.values() for entry in entries]
        return [f for _, f in sorted(picked, key=lambda entry: entry[0]) if self._in_range(f.key, key_min, key_max)]

    def _is_span(self, key: str | None) -> bool:
        """Whether a file of ``key`` may hold several keys (a merged span, or a WIDE file)."""
        return key is not None and self.cluster is not None and len(key) < KEY_LENGTH[self.cluster.grain]

    def _in_range(self, key: str | None, key_min: str | None, key_max: str | None) -> bool:
        """``key_min <= key < key_max`` for a key; for a span, whether any key it holds is in that range."""
        if key_min is None and key_max is None or key == WIDE:
            return True
        if key is None:
            return False
        if self._is_span(key):
            # "~" sorts after every character of a key: span + "~" is above every key the span holds.
            return (key_min is None or key + "~" > key_min) and (
                key_max is None or key + SPAN_FIRST[self.cluster.grain] < key_max)
        return (key_min is None or key >= key_min) and (key_max is None or key < key_max)

    def _key_mask(self, column, keys=None, key_min=None, key_max=None) -> np.ndarray:
        """Per row of a cluster column, whether its key is one of ``keys`` and within ``[key_min, key_max)``."""
        index, names = key_groups(column, self.cluster.grain)
        wanted = set(keys) if keys is not None else None
        ok = np.array([(wanted is None or name in wanted) and self._in_range(name, key_min, key_max)
                       for name in (None if n == NULL_KEY else n for n in names)], dtype=bool)
        return ok[index] if len(names) else np.zeros(len(index), dtype=bool)

    def _span_read(self, files: list[DataFile], keys, key_min, key_max) -> bool:
        """Whether a read of these files must filter rows by key (a merged or WIDE file holds other keys too)."""
        return (keys is not None or key_min is not None or key_max is not None) and any(
            self._is_span(f.key) for f in files)

    def _file_index(self, dt) -> FileIndex:
        """The snapshot's data files by cluster key, parsed once per snapshot version (not once per read:
        a table's file list grows with its history, a micro-batch's reads must not)."""
        version = (id(dt), dt.version())
        cached = self.warehouse.file_indexes.get(self.name)
        if cached is not None and cached.version == version:
            return cached
        actions = pa.table(dt.get_add_actions(flatten=True))
        paths = actions.column("path").to_pylist()
        sizes = actions.column("size_bytes").to_pylist()
        rows = actions.column("num_records").to_pylist() if "num_records" in actions.column_names else [None] * len(paths)
        stat_keys = self._stat_keys(actions)
        by_key: dict[str | None, list[tuple[int, DataFile]]] = {}
        for position, (path, size, count) in enumerate(zip(paths, sizes, rows)):
            match = KEY_SEGMENT.search(path)
            if match:
                key = None if match.group(1) == NULL_KEY else match.group(1)
            else:
                key = stat_keys[position] if self.cluster else None
            by_key.setdefault(key, []).append((position, DataFile(path, size, key, count)))
        named = [k for k in by_key if k is not None and k != WIDE]
        index = FileIndex(version, by_key, sorted(k for k in named if not self._is_span(k)),
                          sorted(k for k in named if self._is_span(k)))
        self.warehouse.file_indexes[self.name] = index
        return index

    def _stat_keys(self, actions: pa.Table) -> list[str | None]:
        """Per file, the key its min/max statistics of the cluster column give (files another writer
        made, e.g. delta-spark's, carry no key in their path): one key, the span of both, None for a
        file of null cluster values only, WIDE when the statistics say nothing narrower."""
        n = actions.num_rows
        if not self.cluster or f"min.{self.cluster.column}" not in actions.column_names:
            return [WIDE] * n
        column = self.cluster.column
        lo = key_groups(actions.column(f"min.{column}"), self.cluster.grain)
        hi = key_groups(actions.column(f"max.{column}"), self.cluster.grain)
        nulls = actions.column(f"null_count.{column}").to_pylist() if f"null_count.{column}" in actions.column_names \
            else [None] * n
        records = actions.column("num_records").to_pylist() if "num_records" in actions.column_names else [None] * n
        width = KEY_LENGTH[SPAN_GRAIN.get(self.cluster.grain, self.cluster.grain)]
        keys: list[str | None] = []
        for i in range(n):
            low, high = lo[1][lo[0][i]], hi[1][hi[0][i]]
            if nulls[i] is not None and records[i] is not None and nulls[i] == records[i] and records[i] > 0:
                keys.append(None)
            elif nulls[i] is None or nulls[i] > 0 or NULL_KEY in (low, high):
                keys.append(WIDE)
            elif low == high:
                keys.append(low)
            elif self.cluster.grain in SPAN_GRAIN and low[:width] == high[:width]:
                keys.append(low[:width])
            else:
                keys.append(WIDE)
        return keys

    def keys(self) -> list[str]:
        """Distinct cluster keys present (sorted); a merged or WIDE file's are read from its rows."""
        files = self.files()
        keys = {f.key for f in files if f.key is not None and not self._is_span(f.key) and f.key != WIDE}
        spans = [f for f in files if self._is_span(f.key) or f.key == WIDE]
        if spans:
            column = self._dataset(spans).to_table(columns=[self.cluster.column]).column(0)
            keys |= {k for k in key_groups(column, self.cluster.grain)[1] if k != NULL_KEY}
        return sorted(keys)

    # -- reads --------------------------------------------------------------------------
    def _dataset(self, files: list[DataFile]) -> pads.Dataset:
        """An Arrow dataset of these data files, wherever the table lives."""
        return pads.dataset([(self.path / f.path).fs_path for f in files], schema=self.arrow_schema,
                            format="parquet", filesystem=self.path.fs)

    def read_arrow(self, keys=None, key_min=None, key_max=None, columns=None, filter=None) -> pa.Table:
        """Read without Spark (driver-side, for small tables and checks)."""
        keys, key_min, key_max = self._key_list(keys), self.key_of(key_min), self.key_of(key_max)
        files = self.files(keys, key_min, key_max)
        if not files:
            table = self.arrow_schema.empty_table()
            return table.select(columns) if columns else table
        dataset = self._dataset(files)
        if not self._span_read(files, keys, key_min, key_max):
            return dataset.to_table(columns=columns, filter=filter)
        column = self.cluster.column
        wide = columns if columns is None or column in columns else [*columns, column]
        table = dataset.to_table(columns=wide, filter=filter)
        table = table.filter(pa.array(self._key_mask(table.column(column), keys, key_min, key_max)))
        return table.select(columns) if columns else table

    def read(self, keys=None, key_min=None, key_max=None):
        """A Spark DataFrame of the table (pruned to keys); an empty table reads as empty."""
        spark = self.warehouse.spark
        if spark is None:
            raise StorageError("reading with Spark needs a SparkSession")
        keys, key_min, key_max = self._key_list(keys), self.key_of(key_min), self.key_of(key_max)
        files = self.files(keys, key_min, key_max)
        schema = schemas.spark_schema(self.name)
        if not files:
            return spark.createDataFrame([], schema)
        if self.path.is_local:
            df = spark.read.schema(schema).parquet(*[str(self.path / f.path) for f in files])
        else:
            df = read_in_tasks(spark, self.name, [self.path / f.path for f in files])
        return df.where(self._where(keys, key_min, key_max)) if self._span_read(files, keys, key_min, key_max) else df


#: At most this many Spark tasks read one table's files from object storage (each reads its share in turn).
READ_TASKS = 16


def read_in_tasks(spark, table: str, files: list):
    """A Spark DataFrame of data files on object storage, read by Spark's Python tasks through Arrow's S3
    filesystem (the rs engine needs no Hadoop S3 connector on the cluster): one task per few files."""
    arrow_schema = schemas.arrow_schema(table)
    chosen = list(files)

    def read(batches):
        for batch in batches:
            for position in batch.column(0).to_pylist():
                place = chosen[position]
                yield from pq.read_table(place.fs_path, filesystem=place.fs, schema=arrow_schema).to_batches()

    return spark.range(0, len(chosen), 1, max(1, min(len(chosen), READ_TASKS))).mapInArrow(read, schemas.spark_schema(table))


_OPS = {"<": "__lt__", "<=": "__le__", "=": "__eq__", "!=": "__ne__", ">=": "__ge__", ">": "__gt__"}


def arrow_predicate(conditions: list[tuple[str, str, Any]]):
    """``delete_where``'s conditions as one Arrow expression (all of them must hold)."""
    if not conditions:
        raise StorageError("delete_where needs at least one condition (use delete_keys to drop partitions)")
    expression = None
    for column, op, value in conditions:
        if op not in _OPS:
            raise StorageError(f"unsupported condition operator {op!r}")
        term = getattr(pads.field(column), _OPS[op])(value)
        expression = term if expression is None else expression & term
    return expression
